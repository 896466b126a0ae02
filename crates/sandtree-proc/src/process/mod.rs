//! The state of a process itself, one module per part (the state of what
//! its descriptors name is `kinds/`): `threads`, `signals`, `timers`,
//! `session` (session, group, terminal, child subreaper), `memory`,
//! `shared_memory`, `tree` (children made again by their parent),
//! `zombies` (children that exited, not waited for). Each
//! has the part's capture (pass 1, the process stopped), check and
//! restore (the fix-up, in the restored process), which `checkpoint/` and
//! `restore.rs` call. What a fork copies by itself (memory, registers of
//! the calling thread, FPU state, handlers, mask, credentials, limits,
//! umask) needs nothing here but its checks.

pub(crate) mod access;
pub(crate) mod credentials;
pub(crate) mod memory;
pub(crate) mod session;
pub(crate) mod shared_memory;
pub(crate) mod signals;
pub(crate) mod threads;
pub(crate) mod timers;
pub(crate) mod tree;
pub(crate) mod zombies;

use crate::batch::Backoff;
use crate::inject::{CLONE_ARGS_SIZE, ERESTARTNOINTR, Outcome, Tracee};
use crate::{Error, Result, SandboxPid};

/// `clone3`'s error when the pid (or tid) asked for is taken.
const EEXIST: i64 = -(libc::EEXIST as i64);

/// How long a restore waits for the killed original to release its pid.
const PID_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// Inject `clone3` with the `clone_args` at `args` into `src` until the
/// pid (or tid) it asks for is free: the killed original's is busy until
/// init reaps it (or the thread is gone). A retry is one injected syscall
/// (~10 µs): poll finely. `busy` counts the retries.
pub(crate) fn clone3_when_free(src: &mut Tracee, args: u64, busy: &mut u32, wait: bool) -> Result<Outcome> {
    let mut backoff = Backoff::new(20, 100, PID_WAIT);
    let mut out = src.syscall(libc::SYS_clone3, &[args, CLONE_ARGS_SIZE])?;
    for _ in 0..100_000 {
        match out.ret {
            ERESTARTNOINTR => {}
            EEXIST if wait && backoff.snooze() => *busy += 1,
            _ => break,
        }
        out = src.syscall(libc::SYS_clone3, &[args, CLONE_ARGS_SIZE])?;
    }
    Ok(out)
}

/// The `clone3` whose `clone_args` are at `args` in `src` (written with
/// `want` as their `set_tid`, [`crate::inject::write_clone_args`]), until
/// the child gets `want`: by `set_tid` ([`clone3_when_free`]), or, given
/// `last_pid` (a process that may not choose its pid), through the
/// sandbox's `ns_last_pid` ([`clone3_at_last_pid`]).
pub(crate) fn clone3_as(
    src: &mut Tracee,
    args: u64,
    want: SandboxPid,
    last_pid: Option<&mut crate::LastPid>,
    busy: &mut u32,
    wait: bool,
) -> Result<Outcome> {
    match last_pid {
        None => clone3_when_free(src, args, busy, wait),
        Some(set) => clone3_at_last_pid(src, args, want, set, busy, wait),
    }
}

/// How a clone injected into `src` (named `call` in errors) gets the pid
/// it asks for: with `set_tid` when the process may choose it
/// (`may_choose_pid`: `CAP_SYS_ADMIN` in the sandbox), else through
/// `last_pid` ([`clone3_as`]); an error when it has neither.
pub(crate) fn pid_source<'a>(
    may_choose_pid: bool,
    last_pid: Option<&'a mut crate::LastPid>,
    (src, call): (crate::HostPid, &'static str),
) -> Result<Option<&'a mut crate::LastPid>> {
    match (may_choose_pid, last_pid) {
        (true, _) => Ok(None),
        (false, Some(set)) => Ok(Some(set)),
        (false, None) => Err(Error::Remote {
            pid: src,
            call,
            errno: std::io::Error::other("no CAP_SYS_ADMIN to choose its pid, and no ns_last_pid to set"),
        }),
    }
}

/// After a clone at `ns_last_pid`: `ns_last_pid` moved up to the middle
/// of the pid range (or to `want`, above it), where no restored process
/// is likely to be. Else the next plain `clone` in the sandbox (a restored
/// process's holder, made right after it; a standby of a template that may
/// not choose its pid) gets the pid right after `want`: often the very pid
/// its first child, made next, must have back. (Failing, it is left.)
fn park(last_pid: &mut crate::LastPid, want: SandboxPid) {
    if let Err(e) = last_pid(SandboxPid((SandboxPid::max() / 2).max(want.raw()))) {
        tracing::debug!("ns_last_pid not moved up: {e}");
    }
}

/// Whether process `pid` has a `SIGCHLD` pending.
fn sigchld_pending(pid: crate::HostPid) -> bool {
    crate::procfs::status(pid).is_ok_and(|s| s.signals.pending & (1 << (libc::SIGCHLD - 1)) != 0)
}

/// [`clone3_when_free`] for a process that may not choose its pid (no
/// `CAP_SYS_ADMIN` in the sandbox, which `set_tid` needs): the `set_tid`
/// array is taken out of the `clone_args` at `args`, `last_pid` sets the
/// sandbox's `ns_last_pid` to the one before `want`, and `clone3` takes the
/// next free pid, once no process has `want` any more (its killed
/// original not reaped yet). A child that got another (`want` still held
/// as a group or session id) is killed and reaped (it would stay a zombie
/// of the stopped `src`, and enough of them reach the sandbox's limit of
/// tasks) and the clone tried again, as long as `wait` allows; else
/// `EEXIST`, as `set_tid` gives. Nothing else makes
/// processes in the sandbox meanwhile: the restored ones wait stopped
/// until all are back.
fn clone3_at_last_pid(
    src: &mut Tracee,
    args: u64,
    want: SandboxPid,
    last_pid: &mut crate::LastPid,
    busy: &mut u32,
    wait: bool,
) -> Result<Outcome> {
    // struct clone_args: set_tid and set_tid_size are its 9th and 10th
    // fields (one without the other is EINVAL).
    sandtree_sys::ptrace::write_mem(src.tid.raw(), args + 64, &[0u8; 16])
        .map_err(Error::ptrace(src.tid, "write clone_args"))?;
    let mut backoff = Backoff::new(20, 100, PID_WAIT);
    // (Seen from the sandbox's `/proc`: a pid that still names a process,
    // a zombie not reaped yet.)
    let taken = std::path::PathBuf::from(format!("/proc/{}/root/proc/{}", src.tid, want.raw()));
    for _ in 0..100_000 {
        if taken.exists() {
            if !(wait && backoff.snooze()) {
                return Ok(Outcome { ret: EEXIST, child: None });
            }
            *busy += 1;
            continue;
        }
        last_pid(SandboxPid(want.raw() - 1)).map_err(|e| Error::Proc {
            pid: src.tid,
            what: "the sandbox's ns_last_pid",
            source: e,
        })?;
        let out = src.syscall(libc::SYS_clone3, &[args, CLONE_ARGS_SIZE])?;
        match out.ret {
            ERESTARTNOINTR => continue,
            r if r <= 0 || r == i64::from(want.raw()) => {
                park(last_pid, want);
                return Ok(out);
            }
            _ => {}
        }
        // (Another pid: `want` is held otherwise, as a group or session
        // id. The child is killed and reaped, and the `SIGCHLD` its end
        // sent `src`, blocked while injected into, taken back: a zombie of
        // the stopped `src` per try would fill the sandbox's limit of
        // tasks.)
        if let Some(child) = out.child {
            let sigchld_before = sigchld_pending(src.tid);
            crate::inject::kill_tracee(child);
            // (`ECHILD` for a sibling, `CLONE_PARENT`'s: init reaps it.)
            let reaped = src.syscall(libc::SYS_wait4, &[out.ret as u64, 0, libc::__WALL as u64, 0])?.ret > 0;
            if reaped && !sigchld_before && sigchld_pending(src.tid) {
                signals::take_pending(src, 1 << (libc::SIGCHLD - 1), args + 1024)?;
            }
        }
        if !(wait && backoff.snooze()) {
            return Ok(Outcome { ret: EEXIST, child: None });
        }
        *busy += 1;
    }
    Ok(Outcome { ret: EEXIST, child: None })
}
