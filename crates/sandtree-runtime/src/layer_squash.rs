//! `squash`: keeps the layer stacks of layered sandboxes shallow.
//!
//! Every layered checkpoint stacks one more read-only layer under a
//! sandbox's writable one (`sandbox_checkpoint.rs`). Lookups of names found
//! in no layer cost a step per layer, and overlayfs stacks at most 500, so
//! once a sandbox stands on [`Config::squash_at`] layers or more, a
//! background task merges a run of them into one new layer
//! (`sandtree_fs::squash`: a new subvolume, the run's entries applied onto
//! it bottom to top, file data reflinked; a few milliseconds for the few
//! files an agent's steps change, and no btrfs commit):
//!
//! 1. wait until the engine is idle for [`IDLE`] (at most
//!    [`MAX_WAIT`]: a long burst of checkpoints must not stack up to the
//!    limit meanwhile) and no other squash runs (one at a time: they
//!    compete with the sandboxes for CPU), then, under the store lock
//!    (read side), read the
//!    sandbox's lowers again: the run is `lowers[1..len-1]` (the top layer
//!    is its base checkpoint's own, whose lowers then hold the run, and the
//!    bottom one holds the sandbox's first, usually many, files), down to
//!    above the first layer that is over twice the size of the run above
//!    it (size-tiered, as in an LSM tree: each entry is copied a
//!    logarithmic number of times), holds a renamed lower directory (an
//!    overlay redirect) or has over [`BIG_LAYER`] entries;
//! 2. squash the run into `sandboxes/<id>/<gen>`;
//! 3. commit: every checkpoint whose lowers hold the run now holds the
//!    squashed layer instead (one transaction; at least the sandbox's
//!    base checkpoint, whose rollback targets are then that much shallower).
//!    Nothing took it (the rows changed meanwhile): it is deleted;
//! 4. remember `run → squashed layer`: the sandbox's next checkpoint stacks
//!    its new layer over the squashed one instead of the run. The sandbox's
//!    own row keeps naming the run until then, since its overlays are
//!    mounted on it.
//!
//! The squashed layers and the runs they replace are all read-only, and the
//! old layers stay as long as a row names them (each is some checkpoint's
//! own layer), so a crash at any step leaves a correct state (and at worst
//! an orphan, which GC removes). The map of step 4 is held in memory;
//! its layers count as in use, so a forced delete of the checkpoint that
//! named one last does not remove it under the next checkpoint.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::layers::overlay_layers;
use crate::{Config, Engine, Error, Result};

/// A layer with more entries than this stays out of squashed runs (it
/// would be copied again by every later squash over it).
pub const BIG_LAYER: u64 = 2000;

/// Quiet time before a squash starts (longer than a spare's: a squash
/// copies files for milliseconds).
const IDLE: Duration = Duration::from_millis(20);

/// The longest a squash waits for the engine to become idle.
pub const MAX_WAIT: Duration = Duration::from_millis(20);

impl Config {
    /// How many read-only layers make a sandbox's stack worth squashing.
    pub fn squash_at(&self) -> usize {
        (self.max_layers / 4).max(3)
    }
}

impl Engine {
    /// Squashes the lowers of sandbox `id` in the background when they are
    /// [`Config::squash_at`] or more.
    pub(crate) fn squash_later(&self, id: &str, lowers: &[String]) {
        if !self.cfg.layered || lowers.len() < self.cfg.squash_at() || self.compact(lowers).len() < lowers.len() {
            return;
        }
        // One task per run (forks of one checkpoint share theirs).
        let run = lowers[1..].to_vec();
        if !self.squashing.lock().unwrap_or_else(|p| p.into_inner()).insert(run.clone()) {
            return;
        }
        let Some(engine) = self.this.upgrade() else { return };
        let id = id.to_string();
        tokio::spawn(async move {
            let deadline = Instant::now() + MAX_WAIT;
            while engine.flusher.idle_for() < IDLE && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            let gate = engine.squash_gate.clone().acquire_owned().await;
            let t0 = Instant::now();
            match engine.squash(&id).await {
                Ok(Some((run, layer))) => {
                    tracing::debug!(sandbox = id, layers = run.len(), layer, took = ?t0.elapsed(), "layers squashed")
                }
                Ok(None) => {}
                Err(e) => tracing::warn!(sandbox = id, "cannot squash its layers: {e}"),
            }
            drop(gate);
            engine.squashing.lock().unwrap_or_else(|p| p.into_inner()).remove(&run);
        });
    }

    /// Steps 1-4; the run and the squashed layer.
    async fn squash(&self, id: &str) -> Result<Option<(Vec<String>, String)>> {
        let _store = self.store_lock.read().await;
        let Some(rec) = self.meta.sandbox(id)? else { return Ok(None) };
        if rec.lowers.len() < self.cfg.squash_at() || self.compact(&rec.lowers).len() < rec.lowers.len() {
            return Ok(None);
        }
        // All but the top layer and the bottom one (the sandbox's first,
        // usually many, files), from the top down while layers stay small
        // next to what lies above them: a layer over twice the size of the
        // run above it stays (as the base of later runs), so an entry is
        // copied a logarithmic number of times, not once per squash. Also
        // not: a layer with a renamed lower directory (an overlay redirect)
        // or over [`BIG_LAYER`] entries.
        let cand = &rec.lowers[1..rec.lowers.len() - 1];
        let (mut end, mut above) = (0, 0u64);
        for (i, layer) in cand.iter().enumerate() {
            let scan = self.scan_layer(layer);
            if scan.redirect || scan.entries > BIG_LAYER || (i >= 2 && scan.entries > 2 * above.max(32)) {
                break;
            }
            above += scan.entries;
            end = i + 1;
        }
        if end < 2 {
            return Ok(None);
        }
        let run = cand[..end].to_vec();
        // What lies under the run, per overlay: every layer left (the
        // bottom one included), the image. A redirect among those layers
        // can make a directory merge with another path: then every
        // whiteout stays.
        let under = &rec.lowers[1 + end..];
        let below = if under.iter().any(|l| self.scan_layer(l).redirect) {
            sandtree_fs::Below::Unknown(self.image_layers(&rec.image)?.len())
        } else {
            sandtree_fs::Below::Dirs(
                overlay_layers(
                    &self.image_layers(&rec.image)?,
                    &self.volume.images_dir(),
                    &PathBuf::new(),
                    &self.layer_paths(under),
                )
                .into_iter()
                .map(|l| l.lower.into_iter().map(|d| d.path).collect())
                .collect(),
            )
        };
        let name = self.new_layer_name(id)?;
        let (paths, dst) = (self.layer_paths(&run), self.subvol_path(&name));
        let t0 = Instant::now();
        // Committed to disk before rows name it (a host crash must not
        // leave rows naming a layer btrfs never wrote).
        tokio::task::spawn_blocking(move || {
            sandtree_fs::squash(&paths, &below, &dst).and_then(|()| sandtree_fs::sync_fs(&dst))
        })
        .await?
        .map_err(|e| Error::fs("squash layers", e))?;
        tracing::debug!(sandbox = id, copied = ?t0.elapsed(), "squash copied");
        let layer = Engine::subvol_layer(&name);
        match self.meta.squash_lowers(&run, &layer) {
            Ok(n) if n > 0 => {
                self.squashed.lock().unwrap_or_else(|p| p.into_inner()).insert(run.clone(), layer.clone());
                // Layers only the rewritten lowers named.
                self.discard_layers_if_unused(run.clone());
                Ok(Some((run, layer)))
            }
            Ok(_) => {
                self.discard_subvol_later(&name);
                Ok(None)
            }
            Err(e) => {
                self.discard_subvol_later(&name);
                Err(e.into())
            }
        }
    }

    /// A read-only layer's size in entries and whether it holds a renamed
    /// lower directory (an overlay redirect); remembered, since layers do
    /// not change.
    fn scan_layer(&self, layer: &str) -> sandtree_fs::squash::LayerScan {
        if let Some(&known) = self.layer_scans.lock().unwrap_or_else(|p| p.into_inner()).get(layer) {
            return known;
        }
        let found = sandtree_fs::squash::scan(&self.volume.root().join(layer));
        self.layer_scans.lock().unwrap_or_else(|p| p.into_inner()).insert(layer.to_string(), found);
        found
    }

    /// Keeps `layers` from deletion until the guard drops: a rollback or
    /// fork read them from a checkpoint row that may be deleted before its
    /// own row names them. The caller reads the checkpoint row again after
    /// pinning (a delete committed before the pin may have queued them).
    pub(crate) fn pin_layers(&self, layers: Vec<String>) -> Pinned<'_> {
        let mut pinned = self.pinned.lock().unwrap_or_else(|p| p.into_inner());
        for l in &layers {
            *pinned.entry(l.clone()).or_default() += 1;
        }
        Pinned { engine: self, layers }
    }

    /// `lowers` with a squashed run replaced by its layer.
    pub(crate) fn compact(&self, lowers: &[String]) -> Vec<String> {
        let map = self.squashed.lock().unwrap_or_else(|p| p.into_inner());
        map.iter()
            .filter_map(|(run, layer)| sandtree_meta::squash_run(lowers, run, layer))
            .min_by_key(Vec::len)
            .unwrap_or_else(|| lowers.to_vec())
    }

    /// Layers no row may name that must stay: those under prepared spares'
    /// and next layers' overlays, squashed layers a next checkpoint may
    /// stack on, and those an operation in flight is about to commit
    /// ([`Engine::pin_layers`]).
    pub(crate) fn layers_held(&self) -> std::collections::HashSet<String> {
        let mut held = self.spares.lowers();
        held.extend(self.nexts.lowers());
        held.extend(self.pinned.lock().unwrap_or_else(|p| p.into_inner()).keys().cloned());
        held.extend(self.squashed.lock().unwrap_or_else(|p| p.into_inner()).values().cloned());
        held
    }

    /// Forgets squashed runs that no sandbox stands on any more (its next
    /// checkpoint was the only user of the entry); their layers then go
    /// with the last row that names them.
    pub(crate) fn prune_squashed(&self) {
        let Ok(sandboxes) = self.meta.sandboxes() else { return };
        let mut map = self.squashed.lock().unwrap_or_else(|p| p.into_inner());
        map.retain(|run, _| sandboxes.iter().any(|s| sandtree_meta::squash_run(&s.lowers, run, "").is_some()));
    }
}

/// Layers kept from deletion (see [`Engine::pin_layers`]).
pub(crate) struct Pinned<'a> {
    engine: &'a Engine,
    layers: Vec<String>,
}

impl Drop for Pinned<'_> {
    fn drop(&mut self) {
        let mut pinned = self.engine.pinned.lock().unwrap_or_else(|p| p.into_inner());
        for l in &self.layers {
            if let Some(n) = pinned.get_mut(l) {
                *n -= 1;
                if *n == 0 {
                    pinned.remove(l);
                }
            }
        }
    }
}
