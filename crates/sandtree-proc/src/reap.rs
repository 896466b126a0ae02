//! Killing pool processes without waiting for their exit, and collecting
//! their exits later (the dying list the tracer thread keeps).

use sandtree_sys::ptrace;

use crate::{HostPid, SandboxPid};

thread_local! {
    /// Tracees [`kill_later`] killed, for the tracer thread's dying list.
    static KILLED: std::cell::RefCell<Vec<Dying>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// The tracees [`kill_later`] killed on this thread since the last call.
pub(crate) fn take_killed() -> Vec<Dying> {
    KILLED.with(|k| k.take())
}

/// SIGKILL tracee `host` (pid `ns_pid` in the sandbox) without waiting for
/// its exit, which follows the teardown of its address space
/// (milliseconds for a large one): the tracer thread, whose tracee it is,
/// collects it between jobs ([`reap_dying`]).
pub(crate) fn kill_later(host: HostPid, ns_pid: SandboxPid) {
    let dying = let_die(host, ns_pid);
    KILLED.with(|k| k.borrow_mut().push(dying));
}

/// SIGKILL a pool process whose exit nobody waits for, after moving it off
/// the tracer's CPU and giving it the `SCHED_IDLE` policy: its teardown
/// (milliseconds for a large address space) then runs on CPU time nothing
/// else wants. At nice 19 only, the wake-up of the kill preempted whatever
/// ran on that CPU, since nice orders tasks within one cpu group and the
/// sandbox's group competes with the daemon's as an equal: a rollback's
/// last 50 µs, on the daemon's thread that returns it, waited 3.5 ms for
/// two holders' teardowns while the other CPU was idle (`perf sched`
/// trace of the bench). Returns its entry for the dying list.
pub(crate) fn let_die(host: HostPid, ns_pid: SandboxPid) -> Dying {
    crate::inject::move_off_tracer(host);
    let _ = sandtree_sys::process::set_policy(host.raw(), sandtree_sys::process::Policy::Idle);
    let _ = sandtree_sys::ptrace::kill(host.raw());
    Dying { host, ns_pid, idle_since: Some(std::time::Instant::now()) }
}

/// A killed pool process not reaped yet ([`crate::reap::let_die`]).
pub(crate) struct Dying {
    /// Host pid.
    pub host: HostPid,
    /// Pid in the sandbox.
    pub ns_pid: SandboxPid,
    /// When it was killed, while it tears its memory down under
    /// `SCHED_IDLE` (`None`: back at nice 19, see [`reap_dying`]).
    pub idle_since: Option<std::time::Instant>,
}

/// Collect the exit of killed tracees that are done dying. Until then
/// init cannot reap them either. One still tearing its memory down 20 ms
/// after its kill goes back from `SCHED_IDLE` to the normal policy at
/// nice 19, between operations (`promote`; a policy change may preempt
/// the task on its CPU): on a CPU the sandbox keeps busy, an idle task's
/// teardown could hold its memory, charged to the sandbox, for seconds.
pub(crate) fn reap_dying(dying: &mut Vec<Dying>, promote: bool) {
    const IDLE_FOR: std::time::Duration = std::time::Duration::from_millis(20);
    dying.retain(|d| match ptrace::try_wait(d.host.raw()) {
        Ok(Some(ptrace::Stop::Exited(_) | ptrace::Stop::Killed(_))) | Err(_) => false,
        Ok(Some(_)) => {
            let _ = ptrace::resume(d.host.raw(), 0);
            true
        }
        Ok(None) => true,
    });
    if !promote {
        return;
    }
    for d in dying.iter_mut().filter(|d| d.idle_since.is_some_and(|t| t.elapsed() >= IDLE_FOR)) {
        let _ = sandtree_sys::process::set_policy(d.host.raw(), sandtree_sys::process::Policy::Normal);
        crate::inject::set_nice(d.host, crate::inject::BACKGROUND_NICE);
        d.idle_since = None;
    }
}
