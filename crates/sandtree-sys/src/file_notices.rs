//! The signal a file's asynchronous notices are sent with (`F_GETSIG`):
//! I/O readiness of an `O_ASYNC` file, and the break of a lease (0:
//! `SIGIO`), and the process they go to (`F_GETOWN`: a lease's holder). A
//! restore sets the signal again with `fcntl(F_SETSIG)`.

use std::io;
use std::os::fd::{AsFd, AsRawFd};

/// `F_GETSIG` (`<asm-generic/fcntl.h>`).
const F_GETSIG: i32 = 11;

/// The process the notices of the open file behind `fd` go to
/// (`F_GETOWN`, in the caller's pid namespace; 0: none; negative: a
/// process group).
pub fn owner(fd: impl AsFd) -> io::Result<i32> {
    let fd = fd.as_fd();
    // SAFETY: `fd` is a valid open descriptor for the duration of the call
    // (borrowed); F_GETOWN takes no argument and reads no memory.
    let r = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETOWN) };
    // (A process group's id comes back negative: no error then.)
    if r == -1 { Err(io::Error::last_os_error()) } else { Ok(r) }
}

/// The notice signal of the open file behind `fd` (0: `SIGIO`).
pub fn signal(fd: impl AsFd) -> io::Result<i32> {
    let fd = fd.as_fd();
    // SAFETY: `fd` is a valid open descriptor for the duration of the call
    // (borrowed); F_GETSIG takes no argument and reads no memory.
    let r = unsafe { libc::fcntl(fd.as_raw_fd(), F_GETSIG) };
    if r < 0 { Err(io::Error::last_os_error()) } else { Ok(r) }
}
