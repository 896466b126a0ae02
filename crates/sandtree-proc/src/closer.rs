//! The closer thread (`sandtree:closer`, `SCHED_IDLE`): descriptors whose
//! last close does work the tracer must not wait for (a detached tree's
//! teardown, a userfaultfd's walk of its pages) close there.

use std::os::fd::OwnedFd;

/// Close `files` on a low-priority thread of its own: descriptors whose
/// last close does work the tracer must not wait for (a detached tree's
/// teardown, see `Pool::prepare_pending`; a userfaultfd's unprotecting walk,
/// see `track.rs`).
pub(crate) fn drop_later(files: Vec<OwnedFd>) {
    static CLOSER: std::sync::OnceLock<std::sync::Mutex<std::sync::mpsc::Sender<Vec<OwnedFd>>>> =
        std::sync::OnceLock::new();
    if files.is_empty() {
        return;
    }
    let tx = CLOSER.get_or_init(|| {
        let (tx, rx) = std::sync::mpsc::channel::<Vec<OwnedFd>>();
        let spawned = std::thread::Builder::new().name("sandtree:closer".into()).spawn(move || {
            // Idle, not nice 19: at nice 19 its wake-up still preempted
            // the tracer thread on their CPU (4 ms once in a bench run).
            let _ = sandtree_sys::process::set_policy(0, sandtree_sys::process::Policy::Idle);
            for files in rx {
                drop(files);
            }
        });
        if let Err(e) = spawned {
            tracing::warn!("no thread to close old trees on: {e}");
        }
        std::sync::Mutex::new(tx)
    });
    // (No thread: they close here.)
    let _ = tx.lock().unwrap_or_else(|e| e.into_inner()).send(files);
}
