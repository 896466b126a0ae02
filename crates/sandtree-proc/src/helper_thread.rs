//! The helper thread: work beside the tracer thread, on the other CPU, on a thread kept
//! between operations.
//!
//! An incremental template's checks, scan and read run on another thread
//! while the tracer thread injects calls (`incremental.rs`). A thread
//! spawned for it at each checkpoint started 0.12-0.2 ms after the spawn
//! (p50; 0.4 ms p90) and, once pinned off the tracer's CPU, reached that
//! CPU 0.2-0.23 ms after the spawn (p50; 0.7-1.5 ms p90, behind whatever
//! ran there), while its checks and scan are on the window's path until
//! the tracer thread is free to help. Each tracer thread keeps a helper
//! instead, a one-thread pool pinned to the CPUs other than the tracer's
//! when it is made; a job wakes it where it sleeps. Measured in one bench
//! run alternating the two per checkpoint: the helper's checks were done
//! 0.49 ms after the start (p50; 100 MB REPL) against 0.63 for a spawned
//! thread, 0.55 against 0.73 at 1 GB. (Unpinned, a spawned thread shared
//! the tracer's CPU: the read then took 5.8 ms instead of 3.3, p50 of 58
//! checkpoints each.)

use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};

use crate::HostPid;

/// A tracer thread's helper: its one-thread pool, and the thread's host
/// tid (0 until it started).
struct Helper {
    pool: rayon_core::ThreadPool,
    tid: std::sync::Arc<AtomicI32>,
}

thread_local! {
    /// This tracer thread's helper (`None`: it could not be made).
    static HELPER: std::cell::OnceCell<Option<Helper>> = const { std::cell::OnceCell::new() };
}

/// The helper of the calling tracer thread, made at its first use (after
/// the tracer pinned itself: it takes the other CPUs).
fn with_helper<R>(f: impl FnOnce(Option<&Helper>) -> R) -> R {
    HELPER.with(|h| {
        let helper = h.get_or_init(|| {
            let cpus = crate::inject::off_tracer_cpus();
            let tid = std::sync::Arc::new(AtomicI32::new(0));
            let its = tid.clone();
            let built = rayon_core::ThreadPoolBuilder::new()
                .num_threads(1)
                .thread_name(|_| "sandtree:beside".into())
                .start_handler(move |_| {
                    crate::inject::pin_self(&cpus);
                    its.store(rustix::thread::gettid().as_raw_nonzero().get(), Ordering::Release);
                })
                .build();
            match built {
                Ok(pool) => Some(Helper { pool, tid }),
                Err(e) => {
                    tracing::warn!("no helper thread (a thread per checkpoint instead): {e}");
                    None
                }
            }
        });
        f(helper.as_ref())
    })
}

/// Whether the helper's jobs run at a real-time priority (see [`beside`]);
/// off for good once the kernel refused it (a cpu cgroup without
/// real-time runtime).
static REAL_TIME: AtomicBool = AtomicBool::new(true);

/// Run `aside` on the helper (pinned off the tracer's CPU) while `here`
/// runs on this thread, which it is given a probe of whether `aside` is
/// done; returns once both are. `aside`'s panic is returned, not raised.
/// Without a helper, `aside` runs on a thread spawned for it and pinned
/// the same way.
pub(crate) fn beside<RA: Send, RH>(
    aside: impl FnOnce() -> RA + Send,
    here: impl FnOnce(&dyn Fn() -> bool) -> RH,
) -> (std::thread::Result<RA>, RH) {
    let out = std::sync::Mutex::new(None);
    let done = AtomicBool::new(false);
    let job = |real_time: bool| {
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(aside));
        if real_time {
            let _ = sandtree_sys::process::set_policy(0, sandtree_sys::process::Policy::Normal);
        }
        *out.lock().unwrap_or_else(|e| e.into_inner()) = Some(r);
        done.store(true, Ordering::Release);
    };
    let probe = || done.load(Ordering::Acquire);
    let rh = with_helper(|helper| match helper {
        Some(Helper { pool, tid }) => {
            let real_time = real_time(HostPid(tid.load(Ordering::Acquire)));
            pool.in_place_scope(|s| {
                s.spawn(move |_| job(real_time));
                here(&probe)
            })
        }
        None => {
            let cpus = crate::inject::off_tracer_cpus();
            std::thread::scope(|s| {
                s.spawn(|| {
                    crate::inject::pin_self(&cpus);
                    job(false)
                });
                here(&probe)
            })
        }
    });
    let ra = out.into_inner().unwrap_or_else(|e| e.into_inner());
    (ra.unwrap_or_else(|| Err(Box::new("the helper's job never ran"))), rh)
}

/// Give the helper `tid` (0: not started yet) the real-time policy for
/// its next job, which puts the normal one back when done; whether it
/// did. A woken helper of the normal policy waited for its CPU while
/// another cpu group's task held it: a template's standby fork (which
/// runs off the tracer's CPU, in the sandbox's group) delayed the start
/// of the scan by 1-2 ms in one checkpoint of ten (100 MB REPL, `perf
/// sched` trace of the bench), while the tracer thread waited for it.
fn real_time(tid: HostPid) -> bool {
    if tid == HostPid(0) || !REAL_TIME.load(Ordering::Relaxed) {
        return false;
    }
    match sandtree_sys::process::set_policy(tid.raw(), sandtree_sys::process::Policy::Fifo) {
        Ok(()) => true,
        Err(e) => {
            tracing::debug!("the helper thread runs at the normal priority: {e}");
            REAL_TIME.store(false, Ordering::Relaxed);
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::beside;

    /// Both halves run, at once (each waits for the other), and a panic
    /// aside is returned.
    #[test]
    fn both_halves_run_together() {
        let met = std::sync::Barrier::new(2);
        let (a, h) = beside(
            || {
                met.wait();
                1
            },
            |done| {
                met.wait();
                while !done() {
                    std::thread::yield_now();
                }
                2
            },
        );
        assert_eq!((a.ok(), h), (Some(1), 2));
        let (a, h) = beside(|| panic!("aside"), |_| 3);
        assert!(a.is_err());
        assert_eq!(h, 3);
    }
}
