//! A standby: a stopped fork of a template, made between operations, which
//! a restore takes with `CLONE_VM` (no page tables to copy) and which then
//! stays as the restored process's holder; and its fork while it runs
//! ([`Forking`]). Which template gets one next is the pool's choice
//! (`pool/standbys.rs`).

use crate::inject::Tracee;
use crate::{Error, HostPid, Result, SandboxPid};

/// A stopped fork of a template, waiting to become a restored process's
/// address space.
pub(crate) struct Standby {
    /// It, in a ptrace stop.
    pub tracee: Tracee,
    /// Host pid.
    pub host: HostPid,
    /// Pid in the sandbox.
    pub ns_pid: SandboxPid,
}

/// A standby's fork under way: the template runs the injected `clone`
/// (for a 1 GB process, 10-60 ms of copying page tables) while the tracer
/// serves other jobs; `Pool::tend_standbys` collects it.
pub(crate) struct Forking {
    /// The child (host pid), once the fork event told it.
    child: Option<HostPid>,
    t0: std::time::Instant,
    /// The child's pid in the sandbox, given by us (`clone3` with
    /// `set_tid`): known from the start, so that a rollback's kill list
    /// spares the child without waiting for the fork to end. `None`: a
    /// plain `clone`, whatever pid comes.
    ns_pid: Option<SandboxPid>,
    /// The template's scratch page, which holds the `clone3` arguments.
    scratch: u64,
    /// The call's entry stop is still to come (the call is started
    /// without waiting for it: `Tracee::start_syscall_unwaited`).
    entering: bool,
    /// The template's nice value, given back to it and to the standby
    /// when the fork ends (a rollback runs forks under way at
    /// [`crate::inject::BACKGROUND_NICE`]).
    nice: Option<i32>,
}

impl Forking {
    /// A fork just started by the template, whose scratch page at
    /// `scratch` holds the `clone3` arguments (`ns_pid`: the pid it gives
    /// the child; `None`, a plain `clone`); `nice` is the template's nice
    /// value.
    pub(crate) fn started(ns_pid: Option<SandboxPid>, scratch: u64, nice: Option<i32>) -> Forking {
        Forking { child: None, t0: std::time::Instant::now(), ns_pid, scratch, entering: true, nice }
    }

    /// The template's nice value, to give back when the fork ends (`None`:
    /// unknown).
    pub(crate) fn nice(&self) -> Option<i32> {
        self.nice
    }

    /// The standby, once the fork (run by `tpl`, its template) is done:
    /// `None` while it runs.
    pub(crate) fn poll(&mut self, tpl: &mut Tracee) -> Option<Result<Standby>> {
        match tpl.poll_syscall(&mut self.child, &mut self.entering) {
            Ok(None) => None,
            Ok(Some(out)) => Some(self.collect(tpl, Ok(out))),
            Err(e) => Some(self.collect(tpl, Err(e))),
        }
    }

    /// Wait for the standby.
    pub(crate) fn finish(mut self, tpl: &mut Tracee) -> Result<Standby> {
        if let Some(done) = self.poll(tpl) {
            return done;
        }
        // (Someone waits for it now.)
        if self.nice.is_some() {
            crate::inject::set_nice(tpl.tid, crate::inject::RESTORE_NICE);
        }
        // (The rest of the fork, and its exit stop.)
        let out = tpl.finish_syscall_entering(&mut self.entering).map(|mut o| {
            o.child = o.child.or(self.child);
            o
        });
        self.collect(tpl, out)
    }

    /// The child's pid in the sandbox, if we gave it.
    pub(crate) fn ns_pid(&self) -> Option<SandboxPid> {
        self.ns_pid
    }

    fn collect(&self, tpl: &mut Tracee, out: Result<crate::inject::Outcome>) -> Result<Standby> {
        // Back where the tracer's calls are cheapest, if a rollback moved
        // it (the child was made with the template's affinity).
        crate::inject::pin_to_tracer(tpl.tid);
        let child = out.as_ref().ok().and_then(|o| o.child).or(self.child);
        if let Some(c) = child {
            crate::inject::pin_to_tracer(c);
        }
        // (The child took the template's nice value at some point of the
        // fork: both get the process's back.)
        if let Some(n) = self.nice {
            crate::inject::set_nice(tpl.tid, n);
            if let Some(c) = child {
                crate::inject::set_nice(c, n);
            }
        }
        let out = match out {
            Ok(out) => out,
            Err(e) => {
                // (The template died after the fork event told of a child.)
                if let Some(c) = self.child {
                    crate::inject::kill_tracee(c);
                }
                return Err(e);
            }
        };
        // (The same call again if a signal pending at the fork restarts it.)
        let (clone3, clone) = ([self.scratch, crate::inject::CLONE_ARGS_SIZE], [libc::CLONE_PARENT as u64, 0, 0, 0, 0]);
        let (call, what): ((i64, &[u64]), _) = match self.ns_pid {
            Some(_) => ((libc::SYS_clone3, &clone3), CLONE3_STANDBY),
            None => ((libc::SYS_clone, &clone), "clone (standby)"),
        };
        let (host, ns_pid, regs) = tpl.cloned(out, call, what)?;
        // A fork copies its parent's root early and joins the task list
        // last: a swap of the sandbox's root meanwhile (a rollback's, or a
        // layered checkpoint's, `pivot_root`, which moves the root of every
        // task on that list) missed the child, which would keep the old,
        // detached tree, and so would whatever is restored from it.
        if crate::procfs::root_of(host) != crate::procfs::root_of(tpl.tid) {
            crate::reap::kill_later(host, ns_pid);
            return Err(Error::RootMoved { pid: tpl.tid });
        }
        tracing::debug!(template = tpl.tid.raw(), standby = ns_pid.raw(), took = ?self.t0.elapsed(), "standby made");
        Ok(Standby { tracee: Tracee::new(host, regs, tpl.insn), host, ns_pid })
    }
}

/// Names the `clone3` of a standby with a pid of ours in errors.
pub(crate) const CLONE3_STANDBY: &str = "clone3 (standby)";
