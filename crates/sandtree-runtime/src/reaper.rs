//! Deferred deletion of subvolumes that nothing references any more (the
//! old writable layer after a rollback, a deleted sandbox's layer, a deleted
//! checkpoint).
//!
//! Destroying a btrfs subvolume returns at once, but it hands btrfs's
//! cleaner a tree to drop, and the cleaner's transactions then stall every
//! writer of the volume — a sandbox booting right after a rollback waited
//! 10-15 ms for them here. So deletions queue up and run only when no
//! lifecycle operation has happened for [`IDLE`] (an agent waiting for its
//! LLM), or at once when the backlog is long or the volume is filling up.
//! Metadata no longer names a queued subvolume, so a daemon that dies with a
//! backlog leaves orphans that GC deletes at the next start.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::time::Duration;

use tokio::sync::mpsc;

use crate::flusher::Flusher;

/// Quiet time after which queued deletions run.
pub const IDLE: Duration = Duration::from_millis(500);
/// Queue length beyond which deletions run regardless.
pub const MAX_BACKLOG: usize = 64;
/// Free-space fraction below which deletions run regardless.
const LOW_SPACE: f64 = 0.15;

/// One queued deletion.
struct Job {
    path: PathBuf,
    /// Also remove the (then empty) per-sandbox directory holding it.
    remove_parent: bool,
}

/// Handle to the reaper task.
#[derive(Clone)]
pub struct Reaper {
    tx: mpsc::UnboundedSender<Job>,
    /// Deletions queued or running.
    pending: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl Reaper {
    pub fn start(activity: Flusher, volume_root: PathBuf) -> Reaper {
        let (tx, mut rx) = mpsc::unbounded_channel::<Job>();
        let pending = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let left = pending.clone();
        tokio::spawn(async move {
            let mut queue: VecDeque<Job> = VecDeque::new();
            loop {
                if queue.is_empty() {
                    match rx.recv().await {
                        Some(job) => queue.push_back(job),
                        None => return,
                    }
                }
                while let Ok(job) = rx.try_recv() {
                    queue.push_back(job);
                }
                let idle = activity.idle_for();
                let pressed = queue.len() > MAX_BACKLOG || low_space(&volume_root);
                if idle < IDLE && !pressed {
                    tokio::select! {
                        job = rx.recv() => match job {
                            Some(job) => queue.push_back(job),
                            None => return,
                        },
                        _ = tokio::time::sleep(IDLE - idle) => {}
                    }
                    continue;
                }
                let Some(job) = queue.pop_front() else { continue };
                let done = tokio::task::spawn_blocking(move || {
                    let r = sandtree_fs::delete_subvolume(&job.path);
                    if let Some(parent) = job.path.parent().filter(|_| job.remove_parent) {
                        let _ = std::fs::remove_dir(parent);
                    }
                    r.map_err(|e| format!("{}: {e}", job.path.display()))
                })
                .await;
                left.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
                if let Ok(Err(e)) = done {
                    tracing::warn!("cannot delete {e} (gc will retry)");
                }
            }
        });
        Reaper { tx, pending }
    }

    /// Queues a subvolume for deletion.
    pub fn discard(&self, path: PathBuf, remove_parent: bool) {
        self.pending.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        if self.tx.send(Job { path, remove_parent }).is_err() {
            self.pending.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
        }
    }

    /// Deletions queued or running.
    pub fn pending(&self) -> usize {
        self.pending.load(std::sync::atomic::Ordering::SeqCst)
    }
}

fn low_space(root: &std::path::Path) -> bool {
    match rustix::fs::statvfs(root) {
        Ok(s) if s.f_blocks > 0 => (s.f_bavail as f64) / (s.f_blocks as f64) < LOW_SPACE,
        _ => false,
    }
}
