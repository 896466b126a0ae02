//! A process's place in the process tree: its session, process group and
//! controlling terminal, its child-subreaper flag, and a stop by a signal
//! (a shell's job after Ctrl-Z) with the report its parent had of it. A
//! template left the original's session and group at its set-up (their
//! ids, the original's pid, would otherwise stay taken); the restored
//! process joins them again as their leader, and takes its terminal back.
//! A child of init in a group whose leader is gone (`sh -c 'server &'`
//! once `sh` exited) joins that group made anew by a surrogate
//! (`restore.rs`).
//! A fork does not copy the child-subreaper flag: it is set again. A
//! process stopped by a signal is let go with that signal held for it, so
//! it stops again; its stop is reported to its parent again, which then
//! takes that report if it had taken it at the checkpoint, and the
//! `SIGCHLD` unless one was pending then (`restore.rs`).

use sandtree_sys::ptrace;

/// Whether `image`'s process is made again by its session's *maker*: a
/// child of init, not its session's leader, in a session of the sandbox
/// (not init's, which is outside: id 0 there). Its template leaves that
/// session (`Template::prepare`, `checkpoint::clone_of`): in it, the
/// template would keep the session's id, the leader's pid, taken, and no
/// restore could make the leader again (nor, the leader gone, the group
/// of the session's id, which such a process is often in: what `sh -c
/// 'server &'` leaves in a session of its own, e.g. a notebook's `!cmd &`).
/// The maker is the restored leader, or a surrogate of the gone leader's
/// pid that starts the session again (`restore.rs`); it makes the process
/// by a transplant with `CLONE_PARENT` (`transplant.rs`): a child of init
/// in that session.
pub(crate) fn made_by_session(image: &ProcessImage) -> bool {
    image.ppid == SandboxPid::INIT && image.sid != image.pid && image.sid.raw() != 0
}

use crate::batch::{Arg, Batch};
use crate::inject::Tracee;
use crate::model::{FdKind, ProcessImage};
use crate::pid::SandboxPid;
use crate::{Error, Result};

/// At the restore (in `b`): session, group, terminal, child-subreaper flag.
/// A terminal that `hung_up` (by index: a session's closed since the
/// checkpoint, a hung-up one in its place) is not taken back. `by_parent`:
/// the process was made by its restored parent (`transplant.rs`), in the
/// parent's session and group.
pub(crate) fn restore(b: &mut Batch, image: &ProcessImage, hung_up: &dyn Fn(u32) -> bool, by_parent: bool) {
    if image.ppid != SandboxPid::INIT && !by_parent {
        // Best effort for a child of a process not captured: a child of
        // init now, in a session of its own (the template left the
        // parent's).
        b.call("setsid", libc::SYS_setsid, &[]);
    } else if image.sid == image.pid {
        // The session of the template is the dead original's: start a new
        // one under the same number, and take the terminal back.
        b.call("setsid", libc::SYS_setsid, &[]);
        if image.has_tty
            && let Some(tty) = terminal_fd(image)
            && !tty.kind.terminal().is_some_and(hung_up)
        {
            let args = [Arg::Val(tty.fd as u64), Arg::Val(libc::TIOCSCTTY), Arg::Val(0)];
            b.call("ioctl(TIOCSCTTY)", libc::SYS_ioctl, &args);
        }
    } else if image.pgid == image.pid {
        b.call("setpgid", libc::SYS_setpgid, &[Arg::Val(0), Arg::Val(0)]);
    } else {
        // Its parent's group, or another's of the session whose leader is
        // back already (`kinds::restore_order`): joining the group it is
        // in changes nothing. A child of init in another's group: that
        // group is back (its leader restored before, or the group made
        // anew by a surrogate: `restore.rs`).
        b.call("setpgid", libc::SYS_setpgid, &[Arg::Val(0), Arg::Val(image.pgid.raw() as u64)]);
    }
    // The leader of its terminal's foreground group other than the
    // session's (a shell's foreground job): the terminal's foreground
    // group again (the session leader's `TIOCSCTTY`, before, made it its
    // own). Every signal is blocked meanwhile: no `SIGTTOU`.
    if image.has_tty
        && image.sid != image.pid
        && image.pgid == image.pid
        && image.tpgid == Some(image.pgid)
        && let Some(tty) = terminal_fd(image)
        && !tty.kind.terminal().is_some_and(hung_up)
    {
        let pgid = b.data(&image.pgid.raw().to_ne_bytes());
        b.call("ioctl(TIOCSPGRP)", libc::SYS_ioctl, &[Arg::Val(tty.fd as u64), Arg::Val(libc::TIOCSPGRP), pgid]);
    }
    if image.child_subreaper {
        let set = libc::PR_SET_CHILD_SUBREAPER as u64;
        b.call("prctl(PR_SET_CHILD_SUBREAPER)", libc::SYS_prctl, &[Arg::Val(set), Arg::Val(1)]);
    }
}

/// A descriptor of `image` open on a terminal (its controlling one, for a
/// process of a session with one).
fn terminal_fd(image: &ProcessImage) -> Option<&crate::model::FdImage> {
    // (Not a terminal hung up at the checkpoint: no session's any more.)
    image.fds.iter().find(|f| match &f.kind {
        FdKind::KeptFile { path, hung_up: false, .. } => path.starts_with("/dev/pts/") || path == "/dev/console",
        _ => false,
    })
}

/// Pass 1, in stopped process `s` (its tracee `orig`): each of its
/// children stopped by a signal whose stop it has not waited for yet
/// (`waitid(WSTOPPED | WNOHANG | WNOWAIT)` injected into it, which takes
/// nothing), with the signal that stopped it. A restore stops such a child
/// again, which reports the stop to the parent again: the reports it had
/// taken are taken again (`restore.rs`).
pub(crate) fn stop_reports(orig: &mut Tracee, s: &crate::stop::StoppedProcess) -> Result<Vec<(SandboxPid, i32)>> {
    let stopped = &s.stopped_children;
    if stopped.is_empty() {
        return Ok(Vec::new());
    }
    // A siginfo_t below its stack pointer's red zone.
    let rsp = orig.saved.rsp;
    crate::inject::below_red_zone(orig, rsp, 128, |orig, buf| {
        let host = orig.tid;
        let mut out = Vec::new();
        for &pid in stopped {
            ptrace::write_mem(host.raw(), buf, &[0u8; 128]).map_err(Error::ptrace(host, "write siginfo"))?;
            let how = (libc::WSTOPPED | libc::WNOHANG | libc::WNOWAIT) as u64;
            let args = [libc::P_PID as u64, pid.raw() as u64, buf, how, 0];
            orig.call("waitid (a stopped child's report)", libc::SYS_waitid, &args)?;
            let mut info = [0u8; 128];
            ptrace::read_mem(host.raw(), buf, &mut info).map_err(Error::ptrace(host, "read siginfo"))?;
            // siginfo_t: si_pid at 16, si_status at 24.
            let field = |at: usize| i32::from_ne_bytes(info[at..at + 4].try_into().unwrap_or_default());
            if field(16) != 0 {
                out.push((pid, field(24)));
            }
        }
        Ok(out)
    })
}

/// The signal a restore stops process `image` with (it was stopped by a
/// signal): the one its parent's report pending at the checkpoint names
/// (`reported`), if it stops the process whatever its mask and handlers
/// (`SIGSTOP`), or if it is neither blocked, caught nor ignored; else
/// `SIGSTOP`, as for a report the parent had taken.
pub(crate) fn stop_signal(image: &ProcessImage, reported: Option<i32>) -> i32 {
    match reported {
        Some(sig) if (1..=64).contains(&sig) => {
            let bit = 1u64 << (sig - 1);
            let m = &image.signals;
            match sig == libc::SIGSTOP || (m.blocked | m.caught | m.ignored) & bit == 0 {
                true => sig,
                false => libc::SIGSTOP,
            }
        }
        _ => libc::SIGSTOP,
    }
}
