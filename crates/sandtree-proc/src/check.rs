//! What the template path can restore exactly, and what it must refuse.
//!
//! A checkpoint never pretends: a process holding state that a template
//! would not bring back exactly is named here with the resource and the
//! reason. The checkpoint then fails, or, when the caller asked for best
//! effort, succeeds with the process marked not restorable.

use serde::{Deserialize, Serialize};

use crate::SandboxPid;
use crate::model::ProcessImage;

/// Whether process `p` may choose the pid of the process it makes (and
/// the tid of a thread): `clone3`'s `set_tid` needs `CAP_SYS_ADMIN` in the
/// sandbox's user namespace. One that may not is restored through the
/// sandbox's `ns_last_pid` ([`crate::LastPid`]).
pub(crate) fn may_choose_pid(p: &ProcessImage) -> bool {
    p.cap_eff & CAP_SYS_ADMIN != 0
}

/// `CAP_SYS_ADMIN`: `clone3` with `set_tid` needs it in the sandbox's user
/// namespace to give a restored process its old pid.
const CAP_SYS_ADMIN: u64 = 1 << 21;

/// Highest inotify watch descriptor captured: each watch's inode is
/// located while the process is stopped (one `open_by_handle_at` each),
/// and a restore adds a watch (or a spacer) per number up to the highest.
pub const INOTIFY_MAX_WD: i32 = 1024;

/// What changes for a process whose parent is not captured (left running
/// by a best-effort checkpoint) when best effort restores it anyway.
pub fn reparent_note(p: &ProcessImage) -> Unrestorable {
    Unrestorable {
        pid: p.pid,
        comm: p.comm.clone(),
        resource: "parent".into(),
        reason: format!(
            "restored as a child of the sandbox init in a session of its own (its parent was pid {}, which will not see it as a child)",
            p.ppid
        ),
    }
}

/// A process the engine cannot restore, and why.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Unrestorable {
    /// Pid in the sandbox.
    pub pid: SandboxPid,
    /// Its `comm`.
    pub comm: String,
    /// The resource in question (`threads`, `fd 5`, `parent`, ...).
    pub resource: String,
    /// Why it cannot be restored.
    pub reason: String,
}

impl std::fmt::Display for Unrestorable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "pid {} ({}) cannot be restored: {}: {}", self.pid, self.comm, self.resource, self.reason)
    }
}

/// The checks of a captured image's process state (its descriptors' are
/// their kinds', `kinds/`; its memory's `process::memory::check`).
pub fn check_process(p: &ProcessImage) -> Result<(), Unrestorable> {
    let no = |resource: String, reason: String| Unrestorable { pid: p.pid, comm: p.comm.clone(), resource, reason };
    // (A child of init in another's group joins it again at a restore,
    // made anew by a surrogate if its leader is gone, `restore.rs`: not
    // a group of outside the sandbox.)
    if p.ppid == SandboxPid::INIT && p.pgid.raw() == 0 {
        return Err(no(
            "process group".into(),
            "member of a process group of outside the sandbox (a restore cannot join it again)".into(),
        ));
    }
    if p.root != "/" {
        return Err(no("root".into(), format!("chroot to {}", p.root)));
    }
    if p.cwd_denied {
        return Err(no(
            "cwd".into(),
            format!(
                "working directory {} is not searchable by its user: a restore, done as that user, could not enter it",
                p.cwd
            ),
        ));
    }
    // (Made again at its path, entered and removed at a restore, where it
    // can be.)
    if p.cwd.ends_with(" (deleted)") && p.cwd_remade.is_none() {
        return Err(no(
            "cwd".into(),
            format!(
                "working directory {} was deleted, and its path is taken again in the tree or its parent cannot be written by its user (a restore makes it again there)",
                p.cwd
            ),
        ));
    }
    Ok(())
}
