//! Pseudo-terminal pairs.
//!
//! [`open_pair`] opens `/dev/ptmx` of the *current* mount namespace (inside
//! a sandbox that is its private devpts instance), unlocks it and opens the
//! slave by the name `TIOCGPTN` reports. The slave is opened `O_NOCTTY`; a
//! child makes it its controlling terminal with [`make_controlling`] after
//! `setsid()`.

use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};

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

/// The device number (`dev_t`, as `stat` gives) of the terminal that
/// descriptor `fd` of a terminal reaches (`TIOCGDEV`): for `/dev/tty`, the
/// process's controlling terminal it was opened on.
pub fn device_of(fd: impl AsFd) -> io::Result<u64> {
    let mut dev: libc::c_uint = 0;
    // SAFETY: TIOCGDEV writes one unsigned int into `dev`, which outlives the call.
    let rc = unsafe { libc::ioctl(fd.as_fd().as_raw_fd(), libc::TIOCGDEV, &mut dev as *mut libc::c_uint) };
    if rc < 0 { Err(io::Error::last_os_error()) } else { Ok(u64::from(dev)) }
}

/// The state of a pty that its master holds, read and set through any
/// descriptor of the master (for a checkpoint of a pty made inside a
/// sandbox, and its restore).
///
/// - `TIOCGPTN`: its index (the slave is `/dev/pts/<index>`);
/// - `TCGETS2` / `TCSETS2`: the terminal's settings, a raw `struct
///   termios2` (44 bytes on x86_64; on a master they are the slave's);
/// - `TIOCGPTLCK` / `TIOCSPTLCK`: the slave locked (`unlockpt` not done);
/// - `TIOCGPKT` / `TIOCPKT`: packet mode.
pub mod master {
    use std::io;
    use std::os::fd::{AsFd, AsRawFd, OwnedFd};

    /// Size of `struct termios2`.
    pub const TERMIOS2_SIZE: usize = std::mem::size_of::<libc::termios2>();

    fn get_int(fd: impl AsFd, req: libc::c_ulong) -> io::Result<i32> {
        let mut v: libc::c_int = 0;
        // SAFETY: the request writes one int into `v`, which outlives the call.
        let rc = unsafe { libc::ioctl(fd.as_fd().as_raw_fd(), req, &mut v as *mut libc::c_int) };
        if rc < 0 { Err(io::Error::last_os_error()) } else { Ok(v) }
    }

    fn set_int(fd: impl AsFd, req: libc::c_ulong, v: i32) -> io::Result<()> {
        let v: libc::c_int = v;
        // SAFETY: the request reads one int from `v`, which outlives the call.
        let rc = unsafe { libc::ioctl(fd.as_fd().as_raw_fd(), req, &v as *const libc::c_int) };
        if rc < 0 { Err(io::Error::last_os_error()) } else { Ok(()) }
    }

    /// Its index.
    pub fn index(fd: impl AsFd) -> io::Result<u32> {
        Ok(get_int(fd, libc::TIOCGPTN)? as u32)
    }

    /// Whether its slave is locked.
    pub fn locked(fd: impl AsFd) -> io::Result<bool> {
        Ok(get_int(fd, libc::TIOCGPTLCK)? != 0)
    }

    /// Lock or unlock its slave.
    pub fn set_locked(fd: impl AsFd, locked: bool) -> io::Result<()> {
        set_int(fd, libc::TIOCSPTLCK, i32::from(locked))
    }

    /// Whether it is in packet mode.
    pub fn packet_mode(fd: impl AsFd) -> io::Result<bool> {
        Ok(get_int(fd, libc::TIOCGPKT)? != 0)
    }

    /// Packet mode on or off.
    pub fn set_packet_mode(fd: impl AsFd, on: bool) -> io::Result<()> {
        set_int(fd, libc::TIOCPKT, i32::from(on))
    }

    /// The terminal's settings, raw.
    pub fn termios(fd: impl AsFd) -> io::Result<Vec<u8>> {
        let mut t = std::mem::MaybeUninit::<libc::termios2>::zeroed();
        // SAFETY: TCGETS2 writes one `struct termios2` into `t`.
        let rc = unsafe { libc::ioctl(fd.as_fd().as_raw_fd(), libc::TCGETS2, t.as_mut_ptr()) };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: zeroed, then filled by the kernel: every byte is initialised.
        let bytes = unsafe { std::slice::from_raw_parts(t.as_ptr() as *const u8, TERMIOS2_SIZE) };
        Ok(bytes.to_vec())
    }

    /// Set the terminal's settings from raw `bytes` (as [`termios`] gave).
    pub fn set_termios(fd: impl AsFd, bytes: &[u8]) -> io::Result<()> {
        if bytes.len() != TERMIOS2_SIZE {
            return Err(io::Error::other(format!("terminal settings of {} bytes, not {TERMIOS2_SIZE}", bytes.len())));
        }
        let mut t = std::mem::MaybeUninit::<libc::termios2>::zeroed();
        // SAFETY: `bytes` has exactly the size of `t`; termios2 is plain data.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), t.as_mut_ptr() as *mut u8, TERMIOS2_SIZE) };
        // SAFETY: TCSETS2 reads one `struct termios2` from `t`.
        let rc = unsafe { libc::ioctl(fd.as_fd().as_raw_fd(), libc::TCSETS2, t.as_ptr()) };
        if rc < 0 { Err(io::Error::last_os_error()) } else { Ok(()) }
    }

    /// Queue `bytes` for the master to read, as output of the terminal
    /// written as they are ([`with_raw_slave`]).
    pub fn queue_output(fd: impl AsFd, bytes: &[u8]) -> io::Result<()> {
        with_raw_slave(&fd, |slave| write_all(slave, bytes))
    }

    /// The output waiting for the master to read (not in packet mode),
    /// read and queued again as it was ([`with_raw_slave`]; the slave is
    /// opened first: if it cannot be, nothing was read). Every process
    /// that holds the terminal must be stopped.
    pub fn take_output(fd: impl AsFd) -> io::Result<Vec<u8>> {
        with_raw_slave(&fd, |slave| {
            let mut out = Vec::new();
            let mut buf = vec![0u8; 64 * 1024];
            // (Blocking or not, the master's open file is its process's:
            // read only what is there.)
            loop {
                let mut ready = [rustix::event::PollFd::new(&fd, rustix::event::PollFlags::IN)];
                let zero = rustix::time::Timespec { tv_sec: 0, tv_nsec: 0 };
                if rustix::event::poll(&mut ready, Some(&zero))? == 0 || rustix::io::ioctl_fionread(&fd)? == 0 {
                    break;
                }
                match rustix::io::read(&fd, &mut buf) {
                    Ok(0) => break,
                    Ok(n) => out.extend_from_slice(&buf[..n]),
                    Err(rustix::io::Errno::INTR) => {}
                    Err(e) => return Err(e.into()),
                }
            }
            write_all(slave, &out)?;
            Ok(out)
        })
    }

    /// A slave of the pty whose master is `fd`, opened through the master
    /// (`TIOCGPTPEER`: that pty's, whatever devpts node has its index;
    /// read-write, not a controlling terminal, close-on-exec).
    pub fn open_slave(fd: impl AsFd) -> io::Result<OwnedFd> {
        use rustix::pty::OpenptFlags;
        Ok(rustix::pty::ioctl_tiocgptpeer(fd, OpenptFlags::RDWR | OpenptFlags::NOCTTY | OpenptFlags::CLOEXEC)?)
    }

    /// `f` with a slave of the pty whose master is `fd` ([`open_slave`],
    /// non-blocking, closed after), its output processing (`OPOST`) off
    /// meanwhile: what `f` writes there is queued for the master as it is.
    fn with_raw_slave<T>(fd: impl AsFd, f: impl FnOnce(&OwnedFd) -> io::Result<T>) -> io::Result<T> {
        let slave = open_slave(&fd)?;
        rustix::fs::fcntl_setfl(&slave, rustix::fs::OFlags::NONBLOCK)?;
        let settings = termios(&slave)?;
        let mut raw = settings.clone();
        // (`c_oflag`, the second field of `struct termios2`.)
        let oflag = u32::from_ne_bytes(raw[4..8].try_into().map_err(|_| io::Error::other("short termios"))?);
        raw[4..8].copy_from_slice(&(oflag & !libc::OPOST).to_ne_bytes());
        set_termios(&slave, &raw)?;
        let done = f(&slave);
        set_termios(&slave, &settings)?;
        done
    }

    fn write_all(slave: &OwnedFd, mut left: &[u8]) -> io::Result<()> {
        while !left.is_empty() {
            match rustix::io::write(slave, left) {
                Ok(0) => return Err(io::Error::other("the terminal takes no more output")),
                Ok(n) => left = &left[n..],
                Err(rustix::io::Errno::INTR) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }
}
