//! Pidfds (`FdKind::AnonInode`, `pidfd`). The template's refers to the
//! process it was opened on, which for the process itself is the original
//! a rollback kills: a pidfd of the process itself, or of init, is made
//! anew in the restored process (`pidfd_open` of the same pid in the
//! sandbox, its flags kept). One of a process that had exited at the
//! checkpoint is kept as it is (it refers to no process either way).
//! Refused: a pidfd of another process of the sandbox (the processes are
//! restored one at a time: it may not exist yet when this one's is made).

use super::{Kind, Remake, move_fd_setting_cloexec};
use crate::Result;
use crate::model::{AnonState, FdImage, FdKind, ProcessImage};
use crate::pid::SandboxPid;

/// Pidfds.
pub(crate) struct Pidfd;

/// The process a pidfd refers to, when it is made anew.
fn target(f: &FdImage) -> Option<SandboxPid> {
    match &f.kind {
        FdKind::AnonInode { state: Some(AnonState::Pidfd { pid }), .. } if pid.raw() > 0 => Some(*pid),
        _ => None,
    }
}

impl Kind for Pidfd {
    fn check(&self, f: &FdImage, p: &ProcessImage) -> std::result::Result<(), String> {
        match target(f) {
            Some(pid) if pid != p.pid && pid != SandboxPid::INIT => Err(format!(
                "a pidfd of process {pid} (only pidfds of the process itself and of init are captured yet)"
            )),
            _ => Ok(()),
        }
    }

    fn remake(&self, f: &FdImage, cx: &mut Remake<'_>) -> Result<()> {
        let Some(pid) = target(f).filter(|_| f.same_as.is_none()) else { return Ok(()) };
        let nonblock = if f.flags & libc::O_NONBLOCK as u32 != 0 { libc::O_NONBLOCK as u64 } else { 0 };
        let new = cx.p.call("pidfd_open", libc::SYS_pidfd_open, &[pid.raw() as u64, nonblock])?;
        // (pidfd_open sets close-on-exec.)
        move_fd_setting_cloexec(cx.p, new, f.fd, f.flags)
    }
}
