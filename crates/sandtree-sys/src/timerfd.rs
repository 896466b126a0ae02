//! `TFD_IOC_SET_TICKS`: put back the number of expirations a timerfd has
//! counted but nobody has read (a restore re-arms the timer with
//! `timerfd_settime`, which clears it).

use std::io;
use std::os::fd::{AsFd, AsRawFd};

/// `_IOW('T', 0, u64)`.
const TFD_IOC_SET_TICKS: libc::c_ulong = 0x4008_5400;

/// Set the unread expiration count of timerfd `fd`.
pub fn set_ticks(fd: impl AsFd, ticks: u64) -> io::Result<()> {
    let fd = fd.as_fd();
    // SAFETY: `fd` is a valid open descriptor for the duration of the call
    // (borrowed); TFD_IOC_SET_TICKS reads one u64 through the pointer, which
    // points at a live local of that type.
    let r = unsafe { libc::ioctl(fd.as_raw_fd(), TFD_IOC_SET_TICKS, &ticks as *const u64) };
    if r < 0 { Err(io::Error::last_os_error()) } else { Ok(()) }
}
