//! Pseudo-terminal pairs.
//!
//! [`open_pair`] opens `/dev/ptmx` of the *current* mount namespace (inside
//! a sandbox that is its private devpts instance), unlocks it and opens the
//! slave by the name `TIOCGPTN` reports. The slave is opened `O_NOCTTY`; a
//! child makes it its controlling terminal with [`make_controlling`] after
//! `setsid()`.

use std::io;
use std::os::fd::{AsFd, OwnedFd};

use rustix::fs::{Mode, OFlags, open};
use rustix::pty::{OpenptFlags, grantpt, openpt, ptsname, unlockpt};
use rustix::termios::{Winsize, tcsetwinsize};

/// A master/slave pty pair.
#[derive(Debug)]
pub struct PtyPair {
    /// The master side (close-on-exec).
    pub master: OwnedFd,
    /// The slave side (close-on-exec, no controlling tty yet).
    pub slave: OwnedFd,
}

/// Open a new pty pair.
pub fn open_pair() -> io::Result<PtyPair> {
    let master = openpt(OpenptFlags::RDWR | OpenptFlags::NOCTTY | OpenptFlags::CLOEXEC)?;
    grantpt(&master)?;
    unlockpt(&master)?;
    let name = ptsname(&master, Vec::new())?;
    let slave = open(name.as_c_str(), OFlags::RDWR | OFlags::NOCTTY | OFlags::CLOEXEC, Mode::empty())?;
    Ok(PtyPair { master, slave })
}

/// Make `fd` (a pty slave) the controlling terminal of the calling session
/// leader.
pub fn make_controlling(fd: impl AsFd) -> io::Result<()> {
    rustix::process::ioctl_tiocsctty(fd)?;
    Ok(())
}

/// Set the window size of a pty (master or slave).
pub fn set_size(fd: impl AsFd, cols: u16, rows: u16) -> io::Result<()> {
    tcsetwinsize(fd, Winsize { ws_row: rows, ws_col: cols, ws_xpixel: 0, ws_ypixel: 0 })?;
    Ok(())
}
