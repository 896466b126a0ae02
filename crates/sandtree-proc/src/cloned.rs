//! A restored process cloned from its template, not fixed up yet
//! ([`Cloned`]): what `restore.rs` makes first for each process, and ahead
//! of its turn for one that connects through a listener while another is
//! restored (`kinds/unix.rs`).

use crate::inject::Tracee;

/// A process cloned from its template (or its standby) and stopped in its
/// first event stop, not fixed up yet.
pub(crate) struct Cloned {
    /// It (its signal mask to give back: its image's).
    pub tracee: Tracee,
    /// Its scratch area (its template's address).
    pub scratch: u64,
    /// Its image's descriptor numbers.
    pub fds: Vec<i32>,
    /// The standby whose address space it took: its holder from then on.
    pub standby: Option<crate::standby::Standby>,
    /// Its nice value, given back once it is fixed up.
    pub nice: Option<i32>,
    /// When the clone began.
    pub t_start: std::time::Instant,
    /// Made by its restored parent (`transplant.rs`), not by a clone of
    /// its template: it has no holder.
    pub by_parent: bool,
}

impl Cloned {
    /// Undone (a restore that failed): it dies, with the standby whose
    /// memory it may have written.
    pub(crate) fn kill(self) {
        crate::inject::kill_tracee(self.tracee.tid);
        if let Some(s) = self.standby {
            crate::inject::kill_tracee(s.tracee.tid);
        }
    }
}
