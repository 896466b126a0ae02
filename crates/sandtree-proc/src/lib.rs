//! `sandtree-proc`: live process state of a sandbox — capture at a
//! checkpoint, templates, and restore in place at a rollback.
//!
//! # The template path (DeltaBox's DeltaCR, on ptrace)
//!
//! A *template* of process P is a frozen copy-on-write copy of P made at the
//! checkpoint by a `clone(CLONE_PARENT | SIGCHLD)` injected into P: same
//! memory (shared copy-on-write, so it costs only the pages P changes
//! afterwards), same registers and FPU state, same signal handlers, mask,
//! credentials, rlimits, umask, and the same open file descriptions (pipes,
//! ptys, sockets, eventfds... are the very same kernel objects). Templates
//! stay ptrace-stopped by this crate's tracer thread (they never run; with
//! `PTRACE_O_EXITKILL` they die with the tracer), as children of the
//! sandbox init.
//!
//! Order at a checkpoint (`stop.rs`, then `checkpoint/`), as a typed
//! transaction: each state lets the processes go when dropped before its
//! next step, so a caller never undoes a step by hand.
//! 1. [`Tracer::stop`] gives a [`Stopped`]: `PTRACE_SEIZE` +
//!    `PTRACE_INTERRUPT` every process of the sandbox but the pool
//!    (templates, standbys, holders), again until no new one appears (a
//!    stopped process cannot fork), then init: the consistency point;
//!    nothing in the sandbox runs from here;
//! 2. the caller snapshots the filesystem on another thread while
//!    [`Stopped::capture`] (pass 1) reads, per process, what must be read
//!    while it is stopped (descriptors and offsets, pipe bytes, deleted
//!    files, queued signals, mask, itimers) and injects the `clone` that
//!    makes its template (no cgroup freeze: a syscall injected into a
//!    frozen task would never complete), giving a [`Captured`];
//!    (A layered checkpoint, with init running, moves the stopped
//!    processes to the new tree here: `checkpoint/repoint.rs`. It takes
//!    steps 1 and 2, the check of whether they can move and the reopening
//!    of their files in one tracer job, [`Tracer::stop_and_clone`] and
//!    [`Cloning::finish`], which give a [`Copied`]; and the files' move,
//!    step 3 and step 4 in another, [`Copied::finish_and_go`].)
//! 3. [`Captured::release`]: every process gets its registers and mask
//!    back in signal context (see `inject.rs`) and runs again, giving a
//!    [`Released`];
//! 4. [`Released::set_up`] (pass 2): per template, the rest of the
//!    [`model::ProcessImage`] from its `/proc` and the checks ([`check`],
//!    and each descriptor's kind, `kinds/`); the templates join the pool
//!    (`pool/`). Once the checkpoint is over (between operations, or first
//!    thing in a rollback), the tracer thread does the templates' set-up:
//!    a scratch page, `chdir("/")`, close what the restore reopens or
//!    makes anew (files on the sandbox's layers, bound sockets), leave the
//!    original's session.
//!
//! Order at a rollback in place (`restore.rs`), after init swapped the root
//! and killed everything but the pool:
//! 1. put back the state of objects the templates share with the killed
//!    originals (pipe bytes, eventfd counters, timerfd settings);
//! 2. into each template inject `clone3(CLONE_PARENT, set_tid = [old pid],
//!    exit_signal = 0)`, or into its standby with `CLONE_VM` when it has one
//!    (the standby stays as the process's holder, the template as it is):
//!    the copy has the old pid and is a child of init again;
//! 3. into the copy: `chdir(cwd)`, reopen the layer files by path in the
//!    new tree at their flags and offsets (`dup3` onto their numbers),
//!    re-create deleted files and bound sockets, epoll watch lists and
//!    signalfd masks (each descriptor by its kind, `kinds/`), `setsid` +
//!    `TIOCSCTTY` for a session leader with a terminal (or `setpgid`),
//!    itimers, queued signals, unmap the scratch page; give it a holder
//!    (`memory_holder.rs`);
//! 4. set the checkpoint's registers and signal mask in signal context and
//!    detach: an interrupted syscall restarts as the kernel decides (the
//!    restart block of `-ERESTART_RESTARTBLOCK` is copied by fork), and
//!    signals pending since are delivered then.
//!
//! What the template path cannot do yet is refused at capture with the
//! process, the resource and the reason ([`Error::Unsupported`]).
//!
//! The modules form levels with no import cycle (`tests/module_graph.rs`);
//! `docs/architecture/process-engine.md` draws them, and the glossary
//! explains every module and type name.

#![forbid(unsafe_code)]

mod batch;
pub mod cgroup;
pub mod check;
mod checkpoint;
mod cloned;
pub mod durable;
mod helper_thread;
pub use checkpoint::repoint;
mod closer;
pub mod fdstate;
mod fork_state;
mod incremental;
pub mod inject;
mod kinds;
mod memory_holder;
pub mod model;
pub mod pid;
mod pool;
mod process;
pub mod procfs;
mod reap;
mod restore;
mod sockdiag;
mod standby;
mod stats;
mod stop;
mod template;
mod tracer;
mod track;
mod transplant;

use std::io;

pub use check::Unrestorable;
pub use checkpoint::CaptureReport;
pub use kinds::{SANDBOX_ADDRESS, reset_outside_connections};
pub use pid::{HostPid, SandboxPid};
pub use pool::TemplateStatus;
pub use restore::RestoreReport;
pub use stats::{Instruments, ProcessStats, TestSwitches};
pub use stop::StopReport;
pub use tracer::{
    Captured, Cloning, Copied, LayeredEnd, OpGuard, Released, RollbackPlan, Started, StopAndClone, Stopped, Tracer,
};

/// Errors of the process engine.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A ptrace request failed.
    #[error("ptrace {op} of pid {pid}: {source}")]
    Ptrace {
        /// Host pid.
        pid: HostPid,
        /// Request.
        op: &'static str,
        /// Error.
        source: io::Error,
    },
    /// A syscall run inside a process failed.
    #[error("{call} inside pid {pid} failed: {errno}")]
    Remote {
        /// Host pid.
        pid: HostPid,
        /// Syscall.
        call: &'static str,
        /// Its error.
        errno: io::Error,
    },
    /// Reading `/proc` failed.
    #[error("read {what} of pid {pid}: {source}")]
    Proc {
        /// Host pid.
        pid: HostPid,
        /// File.
        what: &'static str,
        /// Error.
        source: io::Error,
    },
    /// The process died under us.
    #[error("pid {pid} {how}")]
    Died {
        /// Host pid.
        pid: HostPid,
        /// Exit description.
        how: String,
    },
    /// The process holds state the engine cannot capture yet.
    #[error("{0}")]
    Unsupported(Unrestorable),
    /// Tasks that did not stop in time (uninterruptible waits).
    #[error("processes did not stop within {timeout_ms} ms: {stuck}")]
    StopTimeout {
        /// The bound.
        timeout_ms: u64,
        /// `pid N (comm) in state S`, comma separated.
        stuck: String,
    },
    /// The checkpoint has no templates (never captured, or evicted).
    /// A durable process image could not be read (missing, damaged, of a
    /// newer format), named by its path.
    #[error("{0}")]
    Image(Box<durable::Error>),
    #[error("checkpoint {0} has no process templates")]
    NoTemplates(String),
    /// The tracer thread is gone.
    #[error("the tracer thread of this sandbox is gone")]
    TracerGone,
    /// A fork (of a template, `pid`) ran across a swap of the sandbox's
    /// root: the child copied the old root before the swap and was not on
    /// the task list `pivot_root` moves, so it kept the detached tree.
    #[error("the sandbox's root moved while pid {pid} forked: its child kept the old tree")]
    RootMoved {
        /// Host pid of the process that forked.
        pid: HostPid,
    },
}

impl Error {
    fn unsupported(pid: SandboxPid, comm: &str, resource: impl Into<String>, reason: impl Into<String>) -> Error {
        Error::Unsupported(Unrestorable {
            pid,
            comm: comm.to_string(),
            resource: resource.into(),
            reason: reason.into(),
        })
    }

    /// A failed ptrace request `op` of `pid`, from its `io::Error`: for
    /// `map_err`.
    pub(crate) fn ptrace(pid: HostPid, op: &'static str) -> impl FnOnce(io::Error) -> Error {
        move |source| Error::Ptrace { pid, op, source }
    }

    /// [`Error::unsupported`] of a process known here by its host pid
    /// only (the vDSO lookup, a batch, the restore's fix-up): the host pid
    /// stands in for its pid in the sandbox in the report, as it always
    /// did.
    fn unsupported_by_host(host: HostPid, comm: &str, resource: impl Into<String>, reason: impl Into<String>) -> Error {
        Error::unsupported(SandboxPid(host.raw()), comm, resource, reason)
    }
}

/// Result alias of this crate.
pub type Result<T> = std::result::Result<T, Error>;

/// Sets the sandbox's `ns_last_pid` (its init writes
/// `/proc/sys/kernel/ns_last_pid`): the next process made in the sandbox
/// gets the pid after the one given, if that one is free. A restore brings
/// a process that may not choose its pid (`clone3`'s `set_tid` needs
/// `CAP_SYS_ADMIN` in the sandbox: a process of a user other than root)
/// back on its pid this way ([`Tracer::restore`]).
pub type LastPid = Box<dyn FnMut(SandboxPid) -> std::io::Result<()> + Send>;

#[cfg(test)]
mod tests {
    use crate::{CaptureReport, Error, HostPid, RestoreReport, SandboxPid, StopReport, TemplateStatus, Unrestorable};

    fn refused(pid: SandboxPid) -> Unrestorable {
        Unrestorable { pid, comm: "sleep".into(), resource: "parent".into(), reason: "its parent is pid 5".into() }
    }

    /// The reports the metadata DB and the API keep have the JSON they had
    /// with bare `i32` pids (saved ones read back the same), and an
    /// unrestorable process prints as it did.
    #[test]
    fn reports_keep_their_json() {
        let capture = CaptureReport {
            captured: vec![SandboxPid(2), SandboxPid(7)],
            unrestorable: vec![refused(SandboxPid(9))],
            reparented: Vec::new(),
            comms: [(SandboxPid(2), "sh".to_string()), (SandboxPid(7), "python3".to_string())].into(),
        };
        let unrestorable = r#"{"pid":9,"comm":"sleep","resource":"parent","reason":"its parent is pid 5"}"#;
        let json = format!(
            r#"{{"captured":[2,7],"unrestorable":[{unrestorable}],"reparented":[],"comms":{{"2":"sh","7":"python3"}}}}"#
        );
        assert_eq!(serde_json::to_string(&capture).expect("capture report"), json);
        let back: CaptureReport = serde_json::from_str(&json).expect("saved capture report");
        assert_eq!((back.captured, back.comms), (capture.captured, capture.comms));
        let restore = RestoreReport {
            restored: vec![SandboxPid(2)],
            evicted: vec!["ck-1".into()],
            connections_reset: Vec::new(),
        };
        assert_eq!(serde_json::to_string(&restore).expect("restore report"), r#"{"restored":[2],"evicted":["ck-1"]}"#);
        let status = TemplateStatus { pids: vec![SandboxPid(7)], unrestorable: vec![refused(SandboxPid(9))] };
        let json = format!(r#"{{"pids":[7],"unrestorable":[{unrestorable}]}}"#);
        assert_eq!(serde_json::to_string(&status).expect("template status"), json);
        assert_eq!(serde_json::from_str::<TemplateStatus>(&json).expect("saved template status"), status);
        let stop = StopReport { stopped: 1, skipped: vec![refused(SandboxPid(9))], foreign: false };
        let json = format!(r#"{{"stopped":1,"skipped":[{unrestorable}],"foreign":false}}"#);
        assert_eq!(serde_json::to_string(&stop).expect("stop report"), json);
        assert_eq!(refused(SandboxPid(9)).to_string(), "pid 9 (sleep) cannot be restored: parent: its parent is pid 5");
    }

    /// The errors print a host pid as the number, as they did.
    #[test]
    fn errors_print_the_host_pid() {
        let gone = || std::io::Error::from_raw_os_error(libc::ESRCH);
        let e = Error::Ptrace { pid: HostPid(4021), op: "seize", source: gone() };
        assert_eq!(e.to_string(), format!("ptrace seize of pid 4021: {}", gone()));
        let e = Error::Died { pid: HostPid(4021), how: "exited with 0".into() };
        assert_eq!(e.to_string(), "pid 4021 exited with 0");
        let e = Error::RootMoved { pid: HostPid(4021) };
        assert_eq!(e.to_string(), "the sandbox's root moved while pid 4021 forked: its child kept the old tree");
    }
}
