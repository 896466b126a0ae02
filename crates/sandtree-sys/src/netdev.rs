//! Bring a network interface up (`SIOCGIFFLAGS` / `SIOCSIFFLAGS`).
//!
//! A fresh network namespace has only `lo`, and it is down.

use std::io;
use std::os::fd::AsRawFd;

use rustix::net::{AddressFamily, SocketType, socket};

/// Set `IFF_UP` on interface `name` in the caller's network namespace.
pub fn set_up(name: &str) -> io::Result<()> {
    if name.len() >= libc::IFNAMSIZ {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "interface name too long"));
    }
    let sock = socket(AddressFamily::INET, SocketType::DGRAM, None)?;
    // SAFETY: ifreq is plain old data; all-zero is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in req.ifr_name.iter_mut().zip(name.bytes()) {
        *dst = src as libc::c_char;
    }
    // SAFETY: `req` is a valid ifreq with a NUL-terminated name; the ioctl
    // fills `ifru_flags`.
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFFLAGS, &mut req) } == -1 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: SIOCGIFFLAGS initialised the flags member of the union.
    unsafe {
        req.ifr_ifru.ifru_flags |= (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
    }
    // SAFETY: as above; SIOCSIFFLAGS only reads `req`.
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS, &req) } == -1 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}
