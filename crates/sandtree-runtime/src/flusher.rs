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
use std::time::Duration;

use tokio::sync::Notify;

/// How long after the last command the flush starts.
pub const DEBOUNCE: Duration = Duration::from_millis(10);

/// Handle to the flusher task: `poke` after anything may have written.
#[derive(Clone)]
pub struct Flusher {
    notify: Arc<Notify>,
}

impl Flusher {
    /// Starts the flusher for the volume mounted at `root`.
    pub fn start(root: PathBuf) -> Flusher {
        let notify = Arc::new(Notify::new());
        let wake = notify.clone();
        tokio::spawn(async move {
            loop {
                wake.notified().await;
                tokio::time::sleep(DEBOUNCE).await;
                let root = root.clone();
                let flushed = tokio::task::spawn_blocking(move || sandtree_fs::sync_fs(&root)).await;
                if let Ok(Err(e)) = flushed {
                    tracing::warn!("background flush of the state store failed: {e}");
                }
            }
        });
        Flusher { notify }
    }

    /// Notes that a sandbox may have dirtied data; coalesces with pending pokes.
    pub fn poke(&self) {
        self.notify.notify_one();
    }
}
