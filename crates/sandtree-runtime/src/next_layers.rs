//! Prepared next layers: a layered checkpoint without a mount on its path.
//!
//! A layered checkpoint (`sandbox_checkpoint.rs`) stacks a new empty
//! writable subvolume over the sandbox's current one; building the two
//! overlay mounts of that stack costs ~1 ms, and far more while btrfs
//! commits (mounting an overlay writes probes to its work directory). None
//! of it depends on what the sandbox does next, so right after a sandbox
//! gets a new writable subvolume (create, checkpoint, rollback) a task
//! prepares the next one: a new empty subvolume and its overlays, stacked
//! over the current writable subvolume and its lowers. The checkpoint then
//! only asks init to swap them in.
//!
//! The prepared overlays name the sandbox's *current* writable directory as
//! a lower layer while the sandbox still writes to it. Nothing looks
//! anything up through them before the checkpoint's swap (they are detached
//! mounts the daemon holds), and from the swap on that directory is never
//! written again: overlayfs' rule that a lower layer must not change while
//! it is used holds where it matters. (overlayfs logs "lowerdir is in-use as
//! upperdir/workdir of another mount" for each such mount: expected.)
//!
//! For any running sandbox (with `Config::layered_processes` off, only for
//! one in which init runs alone: the others get snapshots). One per sandbox, not in the metadata: a checkpoint takes it only if it
//! stacks on the sandbox's writable subvolume of now; otherwise (a rollback
//! came between) it is dropped and its subvolume deleted. GC keeps the
//! subvolumes held here and removes them as orphans after a crash.

use std::collections::{HashMap, HashSet};
use std::os::fd::OwnedFd;
use std::sync::Mutex;

use crate::engine::LayerStack;
use crate::{Engine, Result};

/// Layers made in a row for one sandbox, each over a writable subvolume a
/// rollback or checkpoint then left, before the task gives up (bounds the
/// work of a burst; the next operation asks again).
const MAX_TRIES: usize = 64;

/// A prepared next layer of one sandbox.
pub(crate) struct Next {
    /// The sandbox's writable subvolume it stacks on.
    pub over: String,
    /// The new writable subvolume and the layers under it (`over` first).
    pub top: LayerStack,
    /// Its overlay mounts, one per layer of the image, `/` first.
    pub layers: Vec<OwnedFd>,
}

/// The prepared next layers, by sandbox.
#[derive(Default)]
pub(crate) struct NextLayers {
    ready: Mutex<HashMap<String, Next>>,
    /// Sandboxes whose next layer is being made.
    making: Mutex<HashSet<String>>,
}

impl NextLayers {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Next>> {
        self.ready.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Takes the next layer of `sandbox` if it stacks on `over`; a stale
    /// one is returned as `Err` (its subvolume, for deletion).
    pub(crate) fn take(&self, sandbox: &str, over: &str) -> std::result::Result<Option<Next>, String> {
        match self.lock().remove(sandbox) {
            Some(n) if n.over == over => Ok(Some(n)),
            Some(n) => Err(n.top.subvol),
            None => Ok(None),
        }
    }

    /// Puts back a next layer taken but not used (the checkpoint was a
    /// snapshot: the sandbox still writes to the subvolume it stacks on).
    pub(crate) fn put_back(&self, sandbox: &str, next: Next) -> Option<String> {
        self.lock().insert(sandbox.to_string(), next).map(|old| old.top.subvol)
    }

    /// Drops the next layer of `sandbox` (deleted); its subvolume, for deletion.
    pub(crate) fn drop_sandbox(&self, sandbox: &str) -> Option<String> {
        self.lock().remove(sandbox).map(|n| n.top.subvol)
    }

    /// Drops every next layer (closing their overlay mounts): the engine
    /// is shutting down. Returns their subvolumes.
    pub(crate) fn clear(&self) -> Vec<String> {
        self.lock().drain().map(|(_, n)| n.top.subvol).collect()
    }

    /// Writable subvolumes held here (GC keeps them).
    pub(crate) fn subvols(&self) -> HashSet<String> {
        self.lock().values().map(|n| n.top.subvol.clone()).collect()
    }

    /// Layers under the prepared overlays (they must stay).
    pub(crate) fn lowers(&self) -> HashSet<String> {
        self.lock().values().flat_map(|n| n.top.lowers.iter().cloned()).collect()
    }
}

impl Engine {
    /// The next layer of the sandbox `rec`: a new empty writable subvolume
    /// over its current one and its lowers (a squashed run in place of its
    /// layers, when there is one; `layer_squash.rs`), and its overlays. A
    /// half-made one is queued for deletion on failure.
    pub(crate) async fn build_next(&self, rec: &sandtree_meta::SandboxRecord) -> Result<(LayerStack, Vec<OwnedFd>)> {
        let lowers: Vec<String> =
            std::iter::once(Engine::subvol_layer(&rec.subvol)).chain(self.compact(&rec.lowers)).collect();
        let subvol = self.fresh_layer(&rec.id)?;
        let mut next = rec.clone();
        next.subvol = subvol.clone();
        next.lowers = lowers.clone();
        let built = match self.spec(&next) {
            Ok(spec) => self.build_layers(spec.layers).await,
            Err(e) => Err(e),
        };
        match built {
            Ok(layers) => Ok((LayerStack { subvol, lowers, base_transid: 0 }, layers)),
            Err(e) => {
                self.discard_subvol_later(&subvol);
                Err(e)
            }
        }
    }

    /// The next layer of `rec` for a checkpoint now: the prepared one if it
    /// stacks on the sandbox's writable subvolume (a stale one is
    /// discarded), else one built now.
    pub(crate) async fn take_next(&self, rec: &sandtree_meta::SandboxRecord) -> Result<(LayerStack, Vec<OwnedFd>)> {
        let prepared = match self.nexts.take(&rec.id, &rec.subvol) {
            Ok(next) => next,
            Err(stale) => {
                self.discard_subvol_later(&stale);
                None
            }
        };
        match prepared {
            Some(next) => Ok((next.top, next.layers)),
            None => self.build_next(rec).await,
        }
    }

    /// Prepares the next layer of sandbox `id` in the background (layered
    /// engines only; one at a time per sandbox).
    pub(crate) fn want_next(&self, id: &str) {
        if !self.cfg.layered || !self.nexts.making.lock().unwrap_or_else(|p| p.into_inner()).insert(id.to_string()) {
            return;
        }
        let Some(engine) = self.this.upgrade() else { return };
        let id = id.to_string();
        tokio::spawn(async move {
            let making = || engine.nexts.making.lock().unwrap_or_else(|p| p.into_inner());
            for _ in 0..MAX_TRIES {
                if let Err(e) = engine.make_next(&id).await {
                    tracing::debug!(sandbox = id, "no next layer prepared: {e}");
                }
                making().remove(&id);
                // A rollback or checkpoint meanwhile found this one making
                // and left it to us: the layer just made may stack on a
                // subvolume the sandbox has left (after a burst of
                // rollbacks, none would be ready for the next checkpoint).
                let current = engine.meta.sandbox(&id).ok().flatten().map(|r| r.subvol);
                let ready = engine.nexts.lock().get(&id).map(|n| n.over.clone());
                if current.is_none() || ready == current || !making().insert(id.clone()) {
                    return;
                }
            }
            tracing::debug!(sandbox = id, "next layer: the sandbox kept moving, given up");
            making().remove(&id);
        });
    }

    async fn make_next(&self, id: &str) -> Result<()> {
        let _store = self.store_lock.read().await;
        let Some(rec) = self.meta.sandbox(id)? else { return Ok(()) };
        let current = self.nexts.lock().get(id).map(|n| n.over == rec.subvol);
        if current == Some(true) {
            return Ok(());
        }
        // Over a writable subvolume the sandbox left: useless.
        if let Some(subvol) = current.and_then(|_| self.nexts.drop_sandbox(id)) {
            self.discard_subvol_later(&subvol);
        }
        // Processes run (beyond init) and are checkpointed over snapshots.
        if !self.cfg.layered_processes
            && self.live_get(id).is_some_and(|sb| sb.cgroup().procs().is_ok_and(|p| p.len() > 1))
        {
            return Ok(());
        }
        let (top, layers) = self.build_next(&rec).await?;
        // Still the sandbox's writable subvolume (no rollback or checkpoint
        // came meanwhile)? Checked and inserted under the pool's lock.
        let stale = {
            let mut ready = self.nexts.lock();
            let current = self.meta.sandbox(id).ok().flatten().map(|r| r.subvol);
            if current.as_deref() == Some(rec.subvol.as_str()) {
                ready.insert(id.to_string(), Next { over: rec.subvol, top, layers }).map(|old| old.top.subvol)
            } else {
                Some(top.subvol)
            }
        };
        if let Some(subvol) = stale {
            self.discard_subvol_later(&subvol);
        }
        Ok(())
    }
}
