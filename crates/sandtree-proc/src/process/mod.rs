//! The state of a process itself, one module per part (the state of what
//! its descriptors name is `kinds/`): `threads`, `signals`, `timers`,
//! `session` (session, group, terminal, child subreaper), `memory`. Each
//! has the part's capture (pass 1, the process stopped), check and
//! restore (the fix-up, in the restored process), which `checkpoint/` and
//! `restore.rs` call. What a fork copies by itself (memory, registers of
//! the calling thread, FPU state, handlers, mask, credentials, limits,
//! umask) needs nothing here but its checks.

pub(crate) mod memory;
pub(crate) mod session;
pub(crate) mod signals;
pub(crate) mod threads;
pub(crate) mod timers;

use crate::Result;
use crate::batch::Backoff;
use crate::inject::{CLONE_ARGS_SIZE, ERESTARTNOINTR, Outcome, Tracee};

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
