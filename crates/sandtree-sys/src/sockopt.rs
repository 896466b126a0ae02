//! Socket options the safe crates do not wrap: `SO_PEEK_OFF` (where the
//! next `MSG_PEEK` starts; -1: peeking always starts at the head), and any
//! option read as raw bytes ([`get_raw`]: a checkpoint saves the options of
//! a socket it makes anew at the restore, which sets them by injected
//! `setsockopt` calls).

use std::io;
use std::os::fd::{AsFd, AsRawFd};

/// `SO_PEEK_OFF` of socket `fd`.
pub fn peek_offset(fd: impl AsFd) -> io::Result<i32> {
    let mut v: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: `fd` is borrowed for the call; `v` and `len` are live locals
    // of the types and size the kernel writes for this option.
    let r = unsafe {
        libc::getsockopt(
            fd.as_fd().as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEEK_OFF,
            (&mut v as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    if r < 0 { Err(io::Error::last_os_error()) } else { Ok(v) }
}

/// Set `SO_PEEK_OFF` of socket `fd`.
pub fn set_peek_offset(fd: impl AsFd, off: i32) -> io::Result<()> {
    let v: libc::c_int = off;
    // SAFETY: `fd` is borrowed for the call; the option value points at a
    // live `c_int` and its size is passed.
    let r = unsafe {
        libc::setsockopt(
            fd.as_fd().as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEEK_OFF,
            (&v as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r < 0 { Err(io::Error::last_os_error()) } else { Ok(()) }
}

/// Option `name` of level `level` of socket `fd`, as the bytes the kernel
/// writes (at most `max` of them).
pub fn get_raw(fd: impl AsFd, level: i32, name: i32, max: usize) -> io::Result<Vec<u8>> {
    let mut buf = vec![0u8; max];
    let mut len = max as libc::socklen_t;
    // SAFETY: `fd` is borrowed for the call; `buf` is a live buffer of
    // `len` bytes, and `len` a live local the kernel sets to the bytes it
    // wrote (no more than it was).
    let r = unsafe { libc::getsockopt(fd.as_fd().as_raw_fd(), level, name, buf.as_mut_ptr().cast(), &mut len) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    buf.truncate(len as usize);
    Ok(buf)
}

/// Set option `name` of level `level` of socket `fd` to the raw `value`.
pub fn set_raw(fd: impl AsFd, level: i32, name: i32, value: &[u8]) -> io::Result<()> {
    // SAFETY: `fd` is borrowed for the call; the option value points at
    // `value`, live for the call, and its length is passed.
    let r = unsafe {
        libc::setsockopt(fd.as_fd().as_raw_fd(), level, name, value.as_ptr().cast(), value.len() as libc::socklen_t)
    };
    if r < 0 { Err(io::Error::last_os_error()) } else { Ok(()) }
}
