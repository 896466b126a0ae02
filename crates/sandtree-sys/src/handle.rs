//! `open_by_handle_at`: open an inode from a file handle (as `fdinfo`
//! prints for inotify watches), relative to a mount of its filesystem.

use std::io;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};

/// Open the inode that handle (`handle_type`, `bytes`) names on the
/// filesystem of `mount` (any descriptor on it), with `flags` (`O_PATH`
/// is enough to `readlink` its `/proc/self/fd` entry). Needs
/// `CAP_DAC_READ_SEARCH`.
pub fn open_by_handle(mount: impl AsFd, handle_type: i32, bytes: &[u8], flags: i32) -> io::Result<OwnedFd> {
    // struct file_handle { u32 handle_bytes; i32 handle_type; u8 f_handle[]; }
    let mut buf = Vec::with_capacity(8 + bytes.len());
    buf.extend_from_slice(&(bytes.len() as u32).to_ne_bytes());
    buf.extend_from_slice(&handle_type.to_ne_bytes());
    buf.extend_from_slice(bytes);
    // u32-aligned storage for the struct (its fields are u32/i32).
    let mut aligned = vec![0u32; buf.len().div_ceil(4)];
    for (i, chunk) in buf.chunks(4).enumerate() {
        let mut w = [0u8; 4];
        w[..chunk.len()].copy_from_slice(chunk);
        aligned[i] = u32::from_ne_bytes(w);
    }
    let mount = mount.as_fd();
    // SAFETY: `mount` is a valid descriptor borrowed for the call; `aligned`
    // holds a complete, 4-byte-aligned `struct file_handle` whose
    // `handle_bytes` equals the bytes that follow it, and outlives the call.
    let r = unsafe {
        libc::syscall(libc::SYS_open_by_handle_at, mount.as_raw_fd(), aligned.as_mut_ptr(), flags | libc::O_CLOEXEC)
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel returned a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(r as i32) })
}
