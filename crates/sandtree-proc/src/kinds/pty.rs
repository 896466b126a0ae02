//! Pty masters (`FdKind::PtyMaster`): pseudo-terminals a process of the
//! sandbox made (`/dev/pts/ptmx` of the sandbox's own devpts: `script`,
//! `tmux`, `pexpect`...).
//!
//! A template holds no end of such a pty (`FdKind::recreated`; its slaves,
//! [`FdKind::terminal`], neither, marked in pass 2): closing the master
//! hangs the terminal up (`SIGHUP` to its session), closing the last slave makes the master
//! read `EIO`, checkpoint or not. Pass 1 reads the pty's state through the
//! master's own open file (`pidfd_getfd`): index, settings (`termios2`),
//! window size, lock, packet mode, the output waiting for the master.
//!
//! At the restore, before any process is cloned, the daemon makes each
//! pty anew in the sandbox's devpts: it opens `ptmx` there until it gets
//! the same index (lower free ones are taken meanwhile and let go; the
//! killed processes' pty may still be closing: waited for a while), and
//! sets the state back. The processes that held the master get that open
//! file (`hand_over.rs`); those that held a slave open `/dev/pts/<index>`
//! again by path (`file.rs`).
//!
//! Output the master had not read yet is read in pass 1 (every process of
//! the sandbox is stopped) and queued again at once through a slave of
//! the daemon's with output processing off, and so again at the restore:
//! `pexpect` leaves output unread between its calls.
//!
//! A slave whose pty was gone at the checkpoint (its master closed, its
//! node deleted: a shell's background job after the session ended) is a
//! hung-up terminal: the restore hands each process that held it the slave
//! of a pty the daemon makes and closes at once, on that index if it is
//! free (reads give the end, writes `EIO`, as before).
//!
//! Refused: input waiting on the slave side (`file.rs`), output waiting in
//! packet mode or behind a locked slave, a state that could not be read.
//! Not kept: the terminal's foreground process group (the restored session
//! leader takes the terminal back, its own group in the foreground), a
//! line being typed in canonical mode and not yet ended.

use std::io;
use std::os::fd::OwnedFd;

use rustix::fs::OFlags;
use sandtree_sys::pty::master;

use super::hand_over::{Handed, Key};
use super::{Kind, Remake};
use crate::fdstate::{open_in, open_proc_fd, tree_root};
use crate::model::{FdImage, FdKind, ProcessImage, PtyState};
use crate::template::CheckpointTemplates;
use crate::{Error, HostPid, Result};

/// Pty masters.
pub(crate) struct PtyMaster;

impl Kind for PtyMaster {
    fn check(&self, f: &FdImage, _p: &ProcessImage) -> std::result::Result<(), String> {
        let FdKind::PtyMaster { state } = &f.kind else { return Ok(()) };
        let Some(st) = state else { return Err("a pty master whose state could not be read".into()) };
        if st.output.len() < st.unread as usize {
            return Err(format!(
                "a pty master with {} bytes of output not read yet (/dev/pts/{}) that could not be taken ({}): checkpoint once it is read",
                st.unread,
                st.index,
                if st.packet {
                    "packet mode"
                } else if st.locked {
                    "its slave is locked"
                } else {
                    "reading them failed"
                }
            ));
        }
        Ok(())
    }

    fn remake(&self, f: &FdImage, cx: &mut Remake<'_>) -> Result<()> {
        let FdKind::PtyMaster { state: Some(st) } = &f.kind else { return Ok(()) };
        cx.wanted.push((Key::Terminal(st.index), f.fd, f.flags));
        Ok(())
    }
}

/// At a restore, before any process is cloned: each pty whose master a
/// process of `set` held, made anew with its index and state, into
/// `handed`.
pub(crate) fn make_all(set: &CheckpointTemplates, handed: &mut Handed) -> Result<()> {
    for t in &set.templates {
        for f in &t.image.fds {
            let FdKind::PtyMaster { state: Some(st) } = &f.kind else { continue };
            if handed.ends.contains_key(&Key::Terminal(st.index)) {
                continue;
            }
            let made = make(t.host, st).map_err(|e| Error::Proc {
                pid: t.host,
                what: "a pty made anew",
                source: io::Error::new(e.kind(), format!("/dev/pts/{}: {e}", st.index)),
            })?;
            handed.ends.insert(Key::Terminal(st.index), made);
        }
    }
    Ok(())
}

/// At a restore, before any process is cloned: for each terminal of a
/// session (its master outside) that `set`'s processes held and that was
/// closed since the checkpoint (opening it again through a template's
/// `O_PATH` of its node fails), a hung-up terminal's slave into `handed`,
/// handed over in its place (`file.rs`): the restored process finds its
/// terminal hung up, as it would have been had it run on. (Before
/// templates held no slave, theirs was that hung-up terminal.)
pub(crate) fn hung_up_in_place_of_gone(set: &CheckpointTemplates, handed: &mut Handed) -> Result<()> {
    for t in &set.templates {
        for f in &t.image.fds {
            let Some(index) = f.kind.terminal() else { continue };
            let FdKind::KeptFile { master_captured: false, hung_up, .. } = &f.kind else { continue };
            if *hung_up {
                // Hung up at the checkpoint already: one for all that held
                // it, on that index if it is free.
                if f.same_as.is_none() && !handed.ends.contains_key(&Key::HungUp(index)) {
                    let hung_up = hung_up_slave(t.host, Some(index)).map_err(|e| Error::Proc {
                        pid: t.host,
                        what: "a hung-up terminal",
                        source: e,
                    })?;
                    handed.ends.insert(Key::HungUp(index), hung_up);
                }
                continue;
            }
            if f.same_as.is_some() || handed.ends.contains_key(&Key::Slave(index)) {
                continue;
            }
            let again = open_proc_fd(t.host, f.fd, OFlags::RDWR | OFlags::NOCTTY | OFlags::NONBLOCK);
            match again {
                Ok(_) => continue,
                Err(e) if e.raw_os_error() == Some(libc::EIO) => {}
                Err(e) => {
                    return Err(Error::Proc { pid: t.host, what: "a session's terminal", source: e });
                }
            }
            let hung_up = hung_up_slave(t.host, None).map_err(|e| Error::Proc {
                pid: t.host,
                what: "a hung-up terminal in place of a closed one",
                source: e,
            })?;
            handed.ends.insert(Key::Slave(index), hung_up);
        }
    }
    Ok(())
}

/// The slave of a new pty of the devpts of `host`'s tree whose master is
/// closed: hung up. On index `want` (its name, deleted, is what the
/// process's descriptor showed) once it is free (the killed processes that
/// held it may still be exiting: [`INDEX_WAIT`]), or any other after that.
fn hung_up_slave(host: HostPid, want: Option<u32>) -> io::Result<OwnedFd> {
    let root = tree_root(host)?;
    let any = || open_in(&root, "/dev/pts/ptmx", OFlags::RDWR | OFlags::NOCTTY);
    let m = match want {
        Some(want) => match new_pty(&root, want, Some(std::time::Instant::now() + INDEX_WAIT)) {
            Ok(m) => m,
            Err(e) => {
                tracing::debug!(want, "a hung-up terminal's index stayed taken ({e}): another one");
                any()?
            }
        },
        None => any()?,
    };
    master::set_locked(&m, false)?;
    let slave = master::open_slave(&m)?;
    drop(m);
    Ok(slave)
}

/// A new pty's master in the devpts of the tree at `root`, on index
/// `want`: the lower free ones are taken meanwhile (and let go once it is
/// made). If `want` is taken, tried again until `deadline` (its holder may
/// still be exiting), or, without one, the next free index it is.
fn new_pty(root: &OwnedFd, want: u32, deadline: Option<std::time::Instant>) -> io::Result<OwnedFd> {
    let mut taken = Vec::new();
    loop {
        let m = open_in(root, "/dev/pts/ptmx", OFlags::RDWR | OFlags::NOCTTY)?;
        let index = master::index(&m)?;
        if index == want {
            return Ok(m);
        }
        if index < want {
            taken.push(m);
            continue;
        }
        let Some(deadline) = deadline else { return Ok(m) };
        // Ours is still taken: every lower one is ours now; try again.
        drop(m);
        taken.clear();
        if std::time::Instant::now() >= deadline {
            return Err(io::Error::other("that index is still taken"));
        }
        std::thread::sleep(std::time::Duration::from_micros(200));
    }
}

/// How long a restore waits for the pty index it needs to be free (the
/// killed processes that held it may still be exiting).
const INDEX_WAIT: std::time::Duration = std::time::Duration::from_millis(500);

/// A new pty in the devpts of `host`'s tree with `st`'s index and state.
fn make(host: HostPid, st: &PtyState) -> io::Result<OwnedFd> {
    let root = tree_root(host)?;
    let made = new_pty(&root, st.index, Some(std::time::Instant::now() + INDEX_WAIT))?;
    // (A new pty's slave is locked: unlocked to be opened, locked again
    // below if it was.)
    master::set_locked(&made, false)?;
    // The slave's node is the daemon's (made by its open): the owner and
    // mode it had. (Through a slave of ours, closed at once: a restored
    // process that held one opens it again, which ends the hang-up that
    // this last close begins.)
    let slave = master::open_slave(&made)?;
    let (uid, gid, mode) = st.slave_owner;
    rustix::fs::fchown(&slave, Some(rustix::process::Uid::from_raw(uid)), Some(rustix::process::Gid::from_raw(gid)))?;
    rustix::fs::fchmod(&slave, rustix::fs::Mode::from_raw_mode(mode))?;
    drop(slave);
    master::set_termios(&made, &st.termios)?;
    let [ws_row, ws_col, ws_xpixel, ws_ypixel] = st.winsize;
    rustix::termios::tcsetwinsize(&made, rustix::termios::Winsize { ws_row, ws_col, ws_xpixel, ws_ypixel })?;
    // (Output the master had not read: queued again, as it was written.)
    if !st.output.is_empty() {
        master::queue_output(&made, &st.output)?;
    }
    master::set_locked(&made, st.locked)?;
    if st.packet {
        master::set_packet_mode(&made, true)?;
    }
    Ok(made)
}
