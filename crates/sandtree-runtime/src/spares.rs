//! Prepared rollback targets ("spares"): a rollback without a btrfs commit.
//!
//! A rollback needs a writable copy of the checkpoint (a btrfs snapshot: one
//! transaction commit, 2-6 ms here, more while the sandbox has dirty data)
//! and the overlay mounts over it (~1.2 ms for the two layers of the default
//! image). Neither depends on anything that happens after the checkpoint, so
//! both are made ahead of time: a checkpoint (and a rollback, which used one
//! up) asks for a spare, and the maker task prepares it once no lifecycle
//! operation has run for [`IDLE`] — while the agent's command runs, or it
//! reads the result and waits for its LLM (Crab's idea). It never starts
//! while an operation is under way:
//!
//! 1. under the store lock (so GC does not look), check that the sandbox
//!    and checkpoint still exist. The sandbox's lifecycle lock is not taken:
//!    a checkpoint or rollback of it must not wait for a spare. A sandbox or
//!    checkpoint deleted meanwhile drops the key, and the finished spare is
//!    then discarded instead of kept;
//! 2. the rollback's writable top (`Engine::rollback_layer`): an empty
//!    subvolume over the checkpoint's layers, or a writable snapshot;
//! 3. the zygote builds the detached overlay mounts of that layer;
//! 4. keep `(sandbox, checkpoint) → (subvolume, mount fds)`;
//! 5. poke the flusher: mounting an overlay writes to its work directory
//!    (probes, `work/work`), and a checkpoint's pre-sync would otherwise
//!    commit that (6-8 ms measured instead of ~1).
//!
//! A rollback of that sandbox to that checkpoint then takes the spare: it
//! commits the spare's subvolume as the sandbox's layer and hands the mounts
//! to init (see `sandbox_rollback.rs`): no commit and no mount on its path.
//!
//! A checkpoint of a running sandbox (stopped by ptrace) also snapshots the
//! sandbox's layer a second time, writable, at the same frozen instant and
//! at once (the two usually share one btrfs commit; [`Spares::want_made`]): step 2 is then already done, and a
//! rollback that comes before the maker (right after the checkpoint) takes
//! that copy and only builds the overlays on its path.
//!
//! At most `Config::spare_layers` spares exist (least recently wanted ones go
//! first). Spares are not in the metadata: a daemon that dies leaves their
//! subvolumes as orphans that GC removes at the next start, and a running GC
//! is told which subvolumes are spares. Dropping a spare closes its mounts
//! before its subvolume is queued for deletion (see `reaper.rs`).

use std::collections::{HashMap, HashSet, VecDeque};
use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex, Weak};

use tokio::sync::Notify;

use crate::{Engine, Result};

/// Quiet time before the maker starts on a spare. Short: an agent that
/// rolls back right after its next command (~10-20 ms later) finds the
/// spare its last rollback used up made again (measured: every rollback of
/// the bench's 30 back to back had one, against 18-30 of them with 20 ms).
/// A layered checkpoint or rollback has no btrfs commit for a spare's
/// mounts to slow down.
pub const IDLE: std::time::Duration = std::time::Duration::from_millis(5);

/// Spares waiting to be made beyond this many are given up (oldest first),
/// so the background work after a burst stays bounded: in all...
pub const MAX_WANTED: usize = 64;

/// ...and of checkpoints without processes. A tree search rolls back to
/// any node it made, and a spare is ~1.5 ms of background work (an empty
/// subvolume and two overlay mounts, made between operations). Where the
/// checkpoint has processes, a rollback without a spare is ~1 ms slower
/// (the overlays built on its path: 3.0-5.9 ms against 2.3-2.8 ms, 100 MB
/// REPL benchmark), and every checkpoint of a burst waits for one. Without
/// processes a rollback is ~2-2.5 ms either way: those keep the earlier
/// bound, the newest 8, and the maker's work after a burst stays as it was.
pub const MAX_WANTED_FS_ONLY: usize = 8;

/// A sandbox and one of its checkpoints.
type Key = (String, String);

/// A prepared writable copy of a checkpoint with its overlay mounts.
pub(crate) struct Spare {
    /// The writable subvolume and the layers under it.
    pub top: crate::engine::LayerStack,
    /// Detached overlay mounts, one per layer of the sandbox's image.
    pub layers: Vec<OwnedFd>,
}

#[derive(Default)]
struct State {
    ready: HashMap<Key, Spare>,
    /// Writable copies made with their checkpoint (in its commit, see
    /// [`Spares::want_made`]): only their overlays are still to build.
    made: HashMap<Key, String>,
    /// Keys by recency of `want`, oldest first (ready and wanted ones).
    recent: VecDeque<Key>,
    /// Keys to prepare, oldest first (the newest is prepared first), and
    /// whether their checkpoint has processes.
    wanted: VecDeque<(Key, bool)>,
}

/// The spare pool and its maker task.
pub(crate) struct Spares {
    state: Mutex<State>,
    /// Made copies replaced or orphaned, for the maker to delete.
    stale: Mutex<Vec<String>>,
    wake: Notify,
    budget: usize,
}

impl Spares {
    pub(crate) fn new(budget: usize) -> Spares {
        Spares { state: Mutex::new(State::default()), stale: Mutex::new(Vec::new()), wake: Notify::new(), budget }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Asks for a spare of `checkpoint` for `sandbox` (made in the
    /// background); `processes`: whether the checkpoint has processes to
    /// restore.
    pub(crate) fn want(&self, sandbox: &str, checkpoint: &str, processes: bool) {
        if self.budget == 0 {
            return;
        }
        let key = (sandbox.to_string(), checkpoint.to_string());
        let mut st = self.lock();
        st.recent.retain(|k| k != &key);
        st.recent.push_back(key.clone());
        if !st.ready.contains_key(&key) && !st.wanted.iter().any(|(k, _)| k == &key) {
            st.wanted.push_back((key, processes));
            let over = st.wanted.len().saturating_sub(MAX_WANTED);
            st.wanted.drain(..over);
            let mut fs_only = st.wanted.iter().filter(|(_, p)| !p).count();
            st.wanted.retain(|(_, p)| {
                let drop = !p && fs_only > MAX_WANTED_FS_ONLY;
                if drop {
                    fs_only -= 1;
                }
                !drop
            });
        }
        drop(st);
        self.wake.notify_one();
    }

    /// Like [`Spares::want`], with the writable copy already made
    /// (`subvol`, snapshotted from the sandbox's layer with the checkpoint):
    /// the maker only builds its overlays.
    pub(crate) fn want_made(&self, sandbox: &str, checkpoint: &str, subvol: String, processes: bool) {
        let key = (sandbox.to_string(), checkpoint.to_string());
        if let Some(old) = self.lock().made.insert(key, subvol) {
            self.stale.lock().unwrap_or_else(|p| p.into_inner()).push(old);
        }
        self.want(sandbox, checkpoint, processes);
    }

    /// A copy made with its checkpoint, not yet with overlays: taken by the
    /// maker, or by a rollback that came before it (which then only builds
    /// the overlays).
    pub(crate) fn take_made(&self, sandbox: &str, checkpoint: &str) -> Option<String> {
        self.lock().made.remove(&(sandbox.to_string(), checkpoint.to_string()))
    }

    /// Copies made with their checkpoint that nothing will use (their keys
    /// were dropped or evicted): for deletion.
    fn take_stale(&self) -> Vec<String> {
        std::mem::take(&mut *self.stale.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// Takes the spare of `checkpoint` for `sandbox`, if one is ready.
    pub(crate) fn take(&self, sandbox: &str, checkpoint: &str) -> Option<Spare> {
        self.lock().ready.remove(&(sandbox.to_string(), checkpoint.to_string()))
    }

    /// Removes every spare of `sandbox` (deleted); returns their subvolumes,
    /// whose mounts are closed, for deletion.
    pub(crate) fn drop_sandbox(&self, sandbox: &str) -> Vec<String> {
        self.drop_where(|k| k.0 == sandbox)
    }

    /// Removes every spare of `checkpoint` (deleted).
    pub(crate) fn drop_checkpoint(&self, checkpoint: &str) -> Vec<String> {
        self.drop_where(|k| k.1 == checkpoint)
    }

    fn drop_where(&self, f: impl Fn(&Key) -> bool) -> Vec<String> {
        let mut st = self.lock();
        st.wanted.retain(|(k, _)| !f(k));
        st.recent.retain(|k| !f(k));
        let keys: Vec<Key> = st.ready.keys().filter(|k| f(k)).cloned().collect();
        let mut out: Vec<String> = keys.iter().filter_map(|k| st.ready.remove(k)).map(|s| s.top.subvol).collect();
        let made: Vec<Key> = st.made.keys().filter(|k| f(k)).cloned().collect();
        out.extend(made.iter().filter_map(|k| st.made.remove(k)));
        out
    }

    /// Drops every spare (closing their overlay mounts) and every wish:
    /// the engine is shutting down. Returns their subvolumes.
    pub(crate) fn clear(&self) -> Vec<String> {
        self.drop_where(|_| true)
    }

    /// Subvolumes held as spares (GC must keep them).
    pub(crate) fn subvols(&self) -> HashSet<String> {
        let st = self.lock();
        let mut v: HashSet<String> = st.ready.values().map(|s| s.top.subvol.clone()).collect();
        v.extend(st.made.values().cloned());
        v.extend(self.stale.lock().unwrap_or_else(|p| p.into_inner()).iter().cloned());
        v
    }

    /// Read-only layers under the spares' overlays (paths under the volume root).
    pub(crate) fn lowers(&self) -> HashSet<String> {
        self.lock().ready.values().flat_map(|s| s.top.lowers.iter().cloned()).collect()
    }

    /// Number of spares ready.
    pub(crate) fn ready_count(&self) -> usize {
        self.lock().ready.len()
    }

    /// Next key to prepare, and the spares evicted to stay within budget.
    fn next(&self) -> (Option<Key>, Vec<String>) {
        let mut st = self.lock();
        let mut evicted = Vec::new();
        let over = st.recent.len().saturating_sub(self.budget);
        for key in st.recent.drain(..over).collect::<Vec<_>>() {
            st.wanted.retain(|(k, _)| k != &key);
            if let Some(s) = st.ready.remove(&key) {
                evicted.push(s.top.subvol);
            }
            evicted.extend(st.made.remove(&key));
        }
        // (A made copy whose key a burst trimmed from `wanted` stays, within
        // the budget: a rollback to it then only builds the overlays.)
        evicted.extend(self.take_stale());
        (st.wanted.pop_back().map(|(k, _)| k), evicted)
    }

    /// Keeps `spare` if `key` is still wanted and `valid()` (checked under
    /// the pool's lock, so a concurrent `drop_*` either sees the spare or
    /// makes `valid` fail); otherwise returns its subvolume for deletion.
    fn insert(&self, key: Key, spare: Spare, valid: impl FnOnce() -> bool) -> Option<String> {
        let mut st = self.lock();
        if !st.recent.contains(&key) || !valid() {
            // Dropped (sandbox or checkpoint deleted, or evicted) meanwhile.
            return Some(spare.top.subvol);
        }
        st.ready.insert(key, spare).map(|old| old.top.subvol)
    }

    /// Starts the maker task (holds the engine weakly: it ends with it).
    pub(crate) fn start(engine: &Arc<Engine>) {
        let weak: Weak<Engine> = Arc::downgrade(engine);
        let spares = engine.spares.clone();
        tokio::spawn(async move {
            loop {
                let Some(engine) = weak.upgrade() else { return };
                let (key, evicted) = engine.spares.next();
                for subvol in evicted {
                    engine.discard_subvol_later(&subvol);
                }
                match key {
                    Some(key) => {
                        loop {
                            let idle = engine.flusher.idle_for();
                            if idle >= IDLE {
                                break;
                            }
                            tokio::time::sleep(IDLE - idle).await;
                        }
                        if let Err(e) = engine.make_spare(&key).await {
                            tracing::debug!(sandbox = key.0, checkpoint = key.1, "no spare layer: {e}");
                        }
                    }
                    None => {
                        drop(engine);
                        spares.wake.notified().await;
                    }
                }
            }
        });
    }
}

impl Engine {
    /// Steps 1-4 for one key.
    async fn make_spare(&self, key: &Key) -> Result<()> {
        let (id, ck_id) = key;
        let _store = self.store_lock.read().await;
        let Some(mut rec) = self.meta.sandbox(id)? else { return Ok(()) };
        let Some(ck) = self.meta.checkpoint(ck_id)? else { return Ok(()) };
        if ck.tree_id != rec.tree_id {
            return Ok(());
        }
        let top = self.rollback_layer(id, &ck).await?;
        rec.subvol = top.subvol.clone();
        rec.lowers = top.lowers.clone();
        let built = match self.spec(&rec) {
            Ok(spec) => self.build_layers(spec.layers).await,
            Err(e) => Err(e),
        };
        match built {
            Ok(layers) => {
                let valid = || {
                    matches!(self.meta.sandbox(id), Ok(Some(_))) && matches!(self.meta.checkpoint(ck_id), Ok(Some(_)))
                };
                if let Some(stale) = self.spares.insert(key.clone(), Spare { top, layers }, valid) {
                    self.discard_subvol_later(&stale);
                }
                self.flusher.poke();
                Ok(())
            }
            Err(e) => {
                self.discard_subvol_later(&rec.subvol);
                Err(e)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_keeps_every_spare_with_processes_and_the_newest_without() {
        let spares = Spares::new(64);
        for i in 0..20 {
            spares.want("sb", &format!("fs{i}"), false);
        }
        for i in 0..30 {
            spares.want("sb", &format!("proc{i}"), true);
        }
        let wanted: Vec<(String, bool)> = spares.lock().wanted.iter().map(|((_, c), p)| (c.clone(), *p)).collect();
        let fs: Vec<&str> = wanted.iter().filter(|(_, p)| !p).map(|(c, _)| c.as_str()).collect();
        assert_eq!(fs, (12..20).map(|i| format!("fs{i}")).collect::<Vec<_>>(), "the newest 8 without processes");
        assert_eq!(wanted.iter().filter(|(_, p)| *p).count(), 30);
        for i in 30..100 {
            spares.want("sb", &format!("proc{i}"), true);
        }
        let st = spares.lock();
        assert_eq!(st.wanted.len(), MAX_WANTED);
        assert_eq!(st.wanted.back().map(|((_, c), _)| c.as_str()), Some("proc99"));
        assert!(st.wanted.iter().all(|(_, p)| *p), "the oldest went first");
    }
}
