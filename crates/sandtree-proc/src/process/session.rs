//! A process's place in the process tree: its session, process group and
//! controlling terminal, and its child-subreaper flag. A template left the
//! original's session and group at its set-up (their ids, the original's
//! pid, would otherwise stay taken); the restored process joins them again
//! as their leader, and takes its terminal back. A fork does not copy the
//! child-subreaper flag: it is set again.

use crate::batch::{Arg, Batch};
use crate::model::{FdKind, ProcessImage};
use crate::pid::SandboxPid;

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
    } else if by_parent {
        // Its parent's group, or another's of the session whose leader is
        // back already (`kinds::restore_order`): joining the group it is
        // in changes nothing.
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
    image.fds.iter().find(|f| match &f.kind {
        FdKind::KeptFile { path, .. } => path.starts_with("/dev/pts/") || path == "/dev/console",
        _ => false,
    })
}
