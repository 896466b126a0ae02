//! Loop devices: attach a backing file to a free `/dev/loopN`, find an
//! existing attachment, detach.
//!
//! ```text
//! /dev/loop-control ──LOOP_CTL_GET_FREE──▶ N
//! /dev/loopN (mknod b 7 N if the node is missing)
//!     ──LOOP_CONFIGURE {fd: backing, flags: AUTOCLEAR}──▶ bound
//!     (fallback on EINVAL: LOOP_SET_FD + LOOP_SET_STATUS64)
//! /sys/block/loopN/loop/backing_file  ◀── find_attached() scans these
//! ```
//!
//! Kernel quirks worked around:
//! - With `LO_FLAGS_AUTOCLEAR` the kernel unbinds the device on the *last
//!   close* of the block device. [`attach`] therefore returns an
//!   [`AttachedLoop`] that keeps the device open; hold it until the
//!   filesystem is mounted (the mount then keeps the device busy, and
//!   unmounting frees it).
//! - `LOOP_CTL_GET_FREE` is racy between processes: another attacher can take
//!   the same N first, which shows up as `EBUSY` from `LOOP_CONFIGURE`; we
//!   ask for a new free device and retry.
//! - Containers often have a static `/dev` without the node for N; we create
//!   it with `mknod`.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use rustix::fs::{FileType, Mode, OFlags};

const LOOP_SET_FD: libc::c_ulong = 0x4C00;
const LOOP_CLR_FD: libc::c_ulong = 0x4C01;
const LOOP_SET_STATUS64: libc::c_ulong = 0x4C04;
const LOOP_CONFIGURE: libc::c_ulong = 0x4C0A;
const LOOP_CTL_GET_FREE: libc::c_ulong = 0x4C82;

/// Loop flag: unbind the device when its last user goes away.
pub const LO_FLAGS_AUTOCLEAR: u32 = 4;
const LO_NAME_SIZE: usize = 64;
const LO_KEY_SIZE: usize = 32;
const LOOP_MAJOR: u32 = 7;

#[repr(C)]
struct LoopInfo64 {
    lo_device: u64,
    lo_inode: u64,
    lo_rdevice: u64,
    lo_offset: u64,
    lo_sizelimit: u64,
    lo_number: u32,
    lo_encrypt_type: u32,
    lo_encrypt_key_size: u32,
    lo_flags: u32,
    lo_file_name: [u8; LO_NAME_SIZE],
    lo_crypt_name: [u8; LO_NAME_SIZE],
    lo_encrypt_key: [u8; LO_KEY_SIZE],
    lo_init: [u64; 2],
}

#[repr(C)]
struct LoopConfig {
    fd: u32,
    block_size: u32,
    info: LoopInfo64,
    reserved: [u64; 8],
}

const _: () = assert!(std::mem::size_of::<LoopInfo64>() == 232);
const _: () = assert!(std::mem::size_of::<LoopConfig>() == 304);

/// A loop device bound to a backing file, held open.
///
/// Dropping it closes the device; with autoclear that unbinds it unless a
/// mount (or another opener) still uses it.
#[derive(Debug)]
pub struct AttachedLoop {
    path: PathBuf,
    fd: OwnedFd,
}

impl AttachedLoop {
    /// `/dev/loopN`.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The open device.
    pub fn fd(&self) -> &OwnedFd {
        &self.fd
    }
}

fn ioctl_int(fd: &OwnedFd, req: libc::c_ulong, arg: libc::c_ulong) -> io::Result<libc::c_int> {
    // SAFETY: the loop requests used with this helper (LOOP_CTL_GET_FREE,
    // LOOP_SET_FD, LOOP_CLR_FD) take an integer argument, not a pointer.
    let ret = unsafe { libc::ioctl(fd.as_raw_fd(), req as _, arg) };
    if ret < 0 { Err(io::Error::last_os_error()) } else { Ok(ret) }
}

fn info_for(backing: &Path) -> LoopInfo64 {
    let mut info = LoopInfo64 {
        lo_device: 0,
        lo_inode: 0,
        lo_rdevice: 0,
        lo_offset: 0,
        lo_sizelimit: 0,
        lo_number: 0,
        lo_encrypt_type: 0,
        lo_encrypt_key_size: 0,
        lo_flags: LO_FLAGS_AUTOCLEAR,
        lo_file_name: [0; LO_NAME_SIZE],
        lo_crypt_name: [0; LO_NAME_SIZE],
        lo_encrypt_key: [0; LO_KEY_SIZE],
        lo_init: [0; 2],
    };
    let name = backing.as_os_str().as_encoded_bytes();
    let n = name.len().min(LO_NAME_SIZE - 1);
    info.lo_file_name[..n].copy_from_slice(&name[..n]);
    info
}

fn open_loop_node(n: u32) -> io::Result<(PathBuf, OwnedFd)> {
    let path = PathBuf::from(format!("/dev/loop{n}"));
    if std::fs::symlink_metadata(&path).is_err() {
        match rustix::fs::mknodat(
            rustix::fs::CWD,
            &path,
            FileType::BlockDevice,
            Mode::from_raw_mode(0o660),
            rustix::fs::makedev(LOOP_MAJOR, n),
        ) {
            Ok(()) | Err(rustix::io::Errno::EXIST) => {}
            Err(e) => return Err(e.into()),
        }
    }
    let fd = rustix::fs::open(&path, OFlags::RDWR | OFlags::CLOEXEC, Mode::empty())?;
    Ok((path, fd))
}

fn configure(dev: &OwnedFd, file: &OwnedFd, backing: &Path) -> io::Result<()> {
    let mut cfg = LoopConfig { fd: file.as_raw_fd() as u32, block_size: 0, info: info_for(backing), reserved: [0; 8] };
    // SAFETY: LOOP_CONFIGURE reads a `struct loop_config` (layout asserted
    // above); `cfg` lives on the stack for the whole call and `file` is open.
    let ret = unsafe { libc::ioctl(dev.as_raw_fd(), LOOP_CONFIGURE as _, &mut cfg) };
    if ret >= 0 {
        return Ok(());
    }
    let err = io::Error::last_os_error();
    if err.raw_os_error() != Some(libc::EINVAL) {
        return Err(err);
    }
    // Kernels before 5.8 lack LOOP_CONFIGURE: two-step setup.
    ioctl_int(dev, LOOP_SET_FD, file.as_raw_fd() as libc::c_ulong)?;
    let mut info = info_for(backing);
    // SAFETY: LOOP_SET_STATUS64 reads a `struct loop_info64`; `info` is a
    // fully initialised stack value alive for the call.
    let ret = unsafe { libc::ioctl(dev.as_raw_fd(), LOOP_SET_STATUS64 as _, &mut info) };
    if ret < 0 {
        let err = io::Error::last_os_error();
        let _ = ioctl_int(dev, LOOP_CLR_FD, 0);
        return Err(err);
    }
    Ok(())
}

/// Binds `backing` to a free loop device with `LO_FLAGS_AUTOCLEAR` and
/// returns it, held open (see the module docs for why).
pub fn attach(backing: &Path) -> io::Result<AttachedLoop> {
    let file = rustix::fs::open(backing, OFlags::RDWR | OFlags::CLOEXEC, Mode::empty())?;
    let ctl = rustix::fs::open("/dev/loop-control", OFlags::RDWR | OFlags::CLOEXEC, Mode::empty())?;
    let mut last_err = None;
    for _ in 0..16 {
        let n = ioctl_int(&ctl, LOOP_CTL_GET_FREE, 0)? as u32;
        let (path, dev) = open_loop_node(n)?;
        match configure(&dev, &file, backing) {
            Ok(()) => return Ok(AttachedLoop { path, fd: dev }),
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) => last_err = Some(e),
            Err(e) => return Err(e),
        }
    }
    Err(last_err.unwrap_or_else(|| io::Error::from_raw_os_error(libc::EBUSY)))
}

/// Opens an already bound loop device (e.g. one found by [`find_attached`]).
pub fn open(dev: &Path) -> io::Result<AttachedLoop> {
    let fd = rustix::fs::open(dev, OFlags::RDWR | OFlags::CLOEXEC, Mode::empty())?;
    Ok(AttachedLoop { path: dev.to_path_buf(), fd })
}

/// Finds a loop device whose backing file is `backing`, by scanning
/// `/sys/block/loop*/loop/backing_file`.
pub fn find_attached(backing: &Path) -> Option<PathBuf> {
    let want = std::fs::canonicalize(backing).ok()?;
    let entries = std::fs::read_dir("/sys/block").ok()?;
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if !name.starts_with("loop") {
            continue;
        }
        let Ok(file) = std::fs::read_to_string(entry.path().join("loop/backing_file")) else {
            continue;
        };
        let file = file.trim_end_matches('\n');
        if Path::new(file) == want {
            return Some(PathBuf::from("/dev").join(name));
        }
    }
    None
}

/// Unbinds the loop device `dev` (`LOOP_CLR_FD`). With autoclear set and
/// the device still in use, the kernel defers the unbind to the last close.
pub fn detach(dev: &Path) -> io::Result<()> {
    let fd = rustix::fs::open(dev, OFlags::RDONLY | OFlags::CLOEXEC, Mode::empty())?;
    ioctl_int(&fd, LOOP_CLR_FD, 0)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs::File;

    #[test]
    fn attach_find_detach_roundtrip() {
        if !Path::new("/dev/loop-control").exists() {
            eprintln!("skipping: /dev/loop-control missing (no loop driver)");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let img = dir.path().join("disk.img");
        File::create(&img).unwrap().set_len(8 << 20).unwrap();
        let dev = attach(&img).expect("attach");
        assert!(dev.path().to_str().unwrap().starts_with("/dev/loop"));
        assert_eq!(find_attached(&img).as_deref(), Some(dev.path()));
        detach(dev.path()).expect("detach");
        drop(dev);
        // Unbinding is asynchronous on recent kernels; wait briefly.
        for _ in 0..100 {
            if find_attached(&img).is_none() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        panic!("loop device still attached after detach");
    }

    #[test]
    fn unattached_file_is_not_found() {
        let dir = tempfile::tempdir().unwrap();
        let img = dir.path().join("none.img");
        File::create(&img).unwrap();
        assert_eq!(find_attached(&img), None);
    }
}
