//! Background flushing of sandboxes' dirty data (Crab's idea: hide
//! checkpoint I/O inside the time an agent spends waiting for its LLM).
//!
//! Every command that ran in a sandbox may have left dirty page cache. A
//! checkpoint must get that data to disk; doing it in the checkpoint costs a
//! full btrfs commit (~5 ms here for 10 small files). Instead, when a command
//! finishes the engine pokes the flusher, which waits [`DEBOUNCE`] (so a
//! burst of commands costs one flush) and then `syncfs`es the volume. A
//! checkpoint that arrives after that finds nothing dirty: its own pre-sync
//! and snapshot are then the cheap, clean kind. A checkpoint that arrives
//! sooner simply shares the commit that is under way.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::Notify;

/// How long after the last command the flush starts.
pub const DEBOUNCE: Duration = Duration::from_millis(10);

/// Handle to the flusher task: `poke` after anything may have written.
#[derive(Clone)]
pub struct Flusher {
    notify: Arc<Notify>,
    /// Lifecycle operations (checkpoint, rollback, fork, ...) under way: the
    /// flush waits for them, so its commit never competes with theirs (and a
    /// rollback can drop the dirty data it discards before it is written).
    busy: Arc<AtomicUsize>,
    /// When the last lifecycle operation ended.
    last_done: Arc<std::sync::Mutex<std::time::Instant>>,
    /// Flushes started so far; `flushed` holds the number of the last one
    /// finished (see [`Flusher::flushed`]).
    started: Arc<AtomicU64>,
    flushed: Arc<tokio::sync::watch::Sender<u64>>,
}

/// Marks a lifecycle operation as under way while it lives.
pub struct Busy(Arc<AtomicUsize>, Arc<std::sync::Mutex<std::time::Instant>>);

impl Drop for Busy {
    fn drop(&mut self) {
        *self.1.lock().unwrap_or_else(|p| p.into_inner()) = std::time::Instant::now();
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Flusher {
    /// Starts the flusher for the volume mounted at `root`.
    pub fn start(root: PathBuf) -> Flusher {
        let notify = Arc::new(Notify::new());
        let busy = Arc::new(AtomicUsize::new(0));
        let started = Arc::new(AtomicU64::new(0));
        let flushed = Arc::new(tokio::sync::watch::Sender::new(0));
        let (wake, ops, count, done) = (notify.clone(), busy.clone(), started.clone(), flushed.clone());
        tokio::spawn(async move {
            loop {
                wake.notified().await;
                tokio::time::sleep(DEBOUNCE).await;
                while ops.load(Ordering::SeqCst) > 0 {
                    tokio::time::sleep(DEBOUNCE).await;
                }
                let root = root.clone();
                let n = count.fetch_add(1, Ordering::SeqCst) + 1;
                let synced = tokio::task::spawn_blocking(move || sandtree_fs::sync_fs(&root)).await;
                if let Ok(Err(e)) = synced {
                    tracing::warn!("background flush of the state store failed: {e}");
                }
                done.send_replace(n);
            }
        });
        Flusher {
            notify,
            busy,
            last_done: Arc::new(std::sync::Mutex::new(std::time::Instant::now())),
            started,
            flushed,
        }
    }

    /// Returns once a flush that started after this call has finished
    /// (asking for one): whatever was written before is then on disk.
    pub async fn flushed(&self) {
        let want = self.started.load(Ordering::SeqCst) + 1;
        let mut rx = self.flushed.subscribe();
        self.poke();
        let _ = rx.wait_for(|n| *n >= want).await;
    }

    /// Holds the flush back until the returned guard is dropped.
    pub fn busy(&self) -> Busy {
        self.busy.fetch_add(1, Ordering::SeqCst);
        Busy(self.busy.clone(), self.last_done.clone())
    }

    /// How long no lifecycle operation has been under way (zero while one is).
    pub fn idle_for(&self) -> Duration {
        if self.busy.load(Ordering::SeqCst) > 0 {
            return Duration::ZERO;
        }
        self.last_done.lock().unwrap_or_else(|p| p.into_inner()).elapsed()
    }

    /// Notes that a sandbox may have dirtied data; coalesces with pending pokes.
    pub fn poke(&self) {
        self.notify.notify_one();
    }
}
