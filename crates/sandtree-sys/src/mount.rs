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

/// `struct mnt_id_req` (`MNT_ID_REQ_SIZE_VER0`).
#[repr(C)]
struct MntIdReq {
    size: u32,
    spare: u32,
    mnt_id: u64,
    param: u64,
}

/// `LSMT_ROOT`: the root mount of the caller's mount namespace.
const LSMT_ROOT: u64 = u64::MAX;
const SYS_STATMOUNT: libc::c_long = 457;
const SYS_LISTMOUNT: libc::c_long = 458;
/// `STATMOUNT_MNT_BASIC` | `STATMOUNT_MNT_POINT`.
const STATMOUNT_MNT_BASIC: u64 = 0x2;
const STATMOUNT_MNT_POINT: u64 = 0x10;
/// Offsets in `struct statmount` (linux/mount.h, stable ABI): `size` (u32)
/// at 0, `mask` (u64) at 8, `mnt_id` (u64) at 40, `mnt_point` (u32
/// offset into `str`) at 108, `str` at 512.
const SM_MASK: usize = 8;
const SM_MNT_ID: usize = 40;
const SM_MNT_POINT: usize = 108;
const SM_STR: usize = 512;

/// The unique (64-bit) ids of every mount of the caller's mount namespace
/// (`listmount(2)`, Linux 6.8; recursive from its root). Needs
/// `CAP_SYS_ADMIN` over the namespace for mounts outside the caller's root.
pub fn list_mounts() -> io::Result<Vec<u64>> {
    let mut out: Vec<u64> = Vec::new();
    let mut buf = vec![0u64; 256];
    loop {
        let req = MntIdReq {
            size: std::mem::size_of::<MntIdReq>() as u32,
            spare: 0,
            mnt_id: LSMT_ROOT,
            param: out.last().copied().unwrap_or(0),
        };
        // SAFETY: `req` is a valid `struct mnt_id_req` of the size it
        // states; `buf` has room for `buf.len()` u64s, which is what we
        // tell the kernel; both outlive the call.
        let n = unsafe {
            libc::syscall(SYS_LISTMOUNT, &req as *const MntIdReq, buf.as_mut_ptr(), buf.len(), 0 as libc::c_ulong)
        };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        let n = n as usize;
        out.extend_from_slice(&buf[..n]);
        if n < buf.len() {
            return Ok(out);
        }
    }
}

/// The mount point of mount `id` (a unique id from [`list_mounts`]),
/// relative to the caller's root (`statmount(2)`, Linux 6.8).
pub fn mount_point(id: u64) -> io::Result<std::path::PathBuf> {
    use std::os::unix::ffi::OsStrExt;
    let mut buf = vec![0u8; 4096 + SM_STR];
    let req = MntIdReq {
        size: std::mem::size_of::<MntIdReq>() as u32,
        spare: 0,
        mnt_id: id,
        param: STATMOUNT_MNT_BASIC | STATMOUNT_MNT_POINT,
    };
    // SAFETY: `req` is a valid `struct mnt_id_req`; `buf` is writable for
    // the length passed and outlives the call.
    let rc = unsafe {
        libc::syscall(SYS_STATMOUNT, &req as *const MntIdReq, buf.as_mut_ptr(), buf.len(), 0 as libc::c_ulong)
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    let word = |at: usize, n: usize| -> u64 {
        let mut v = [0u8; 8];
        v[..n].copy_from_slice(&buf[at..at + n]);
        u64::from_ne_bytes(v)
    };
    let size = (word(0, 4) as usize).min(buf.len());
    if word(SM_MASK, 8) & STATMOUNT_MNT_POINT == 0 || word(SM_MNT_ID, 8) != id {
        return Err(io::Error::other(format!("statmount of mount {id}: no mount point returned")));
    }
    let start = SM_STR + word(SM_MNT_POINT, 4) as usize;
    let text = buf.get(start..size).unwrap_or_default();
    let end = text.iter().position(|&b| b == 0).unwrap_or(text.len());
    Ok(std::path::PathBuf::from(std::ffi::OsStr::from_bytes(&text[..end])))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listmount_and_statmount_name_the_mounts() {
        let ids = list_mounts().expect("listmount (Linux 6.8)");
        let points: Vec<std::path::PathBuf> = ids.iter().filter_map(|&id| mount_point(id).ok()).collect();
        assert!(points.iter().any(|p| p == std::path::Path::new("/")), "{points:?}");
        assert!(points.iter().any(|p| p == std::path::Path::new("/proc")), "{points:?}");
        assert!(mount_point(1).is_err(), "no mount has unique id 1");
    }
}
