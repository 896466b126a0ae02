//! Mount helpers missing from rustix: `mount_setattr(2)` for idmapped mounts.
//!
//! Everything else of the new mount API (`fsopen`, `fsconfig`, `fsmount`,
//! `open_tree`, `move_mount`) is used straight from `rustix::mount`.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

/// `MOUNT_ATTR_RDONLY`.
pub const MOUNT_ATTR_RDONLY: u64 = 0x0000_0001;
/// `MOUNT_ATTR_IDMAP`.
pub const MOUNT_ATTR_IDMAP: u64 = 0x0010_0000;

#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

/// Make the detached mount `mnt` (from `open_tree(OPEN_TREE_CLONE)`)
/// idmapped through the user namespace `userns` and optionally read-only.
/// `AT_RECURSIVE` is not used: callers idmap one mount at a time.
pub fn set_idmap(mnt: BorrowedFd<'_>, userns: BorrowedFd<'_>, read_only: bool) -> io::Result<()> {
    let mut attr = MountAttr {
        attr_set: MOUNT_ATTR_IDMAP | if read_only { MOUNT_ATTR_RDONLY } else { 0 },
        attr_clr: 0,
        propagation: 0,
        userns_fd: userns.as_raw_fd() as u64,
    };
    let empty = c"";
    // SAFETY: `attr` is a valid `struct mount_attr` of the size we pass, both
    // fds are borrowed and open for the duration of the call, and the path is
    // a NUL-terminated empty string used with AT_EMPTY_PATH.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            mnt.as_raw_fd(),
            empty.as_ptr(),
            libc::AT_EMPTY_PATH as libc::c_uint,
            &mut attr as *mut MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    };
    if rc == -1 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}
