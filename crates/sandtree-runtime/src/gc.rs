//! `gc`: reclaim whatever no metadata row references.
//!
//! Runs with the store lock held exclusively, so no operation is between
//! "subvolume created" and "row committed" while it looks. It removes:
//! - subvolumes under `sandboxes/`, `checkpoints/`, `images/` that no row names
//!   as a writable subvolume, a checkpoint's layer or a lower layer (left by
//!   a crash, or by a delete whose subvolume removal failed);
//! - runtime leftovers of sandboxes that no row names: their init (if still
//!   alive after a crash), cgroup and run directory.
//!
//! It never deletes a checkpoint (a row): the report counts those whose
//! sandbox was deleted, with their sizes, for the user to decide.
//!
//! What it frees is measured, not estimated: the volume's used bytes before
//! the deletions and after btrfs's cleaner dropped them (deleting a
//! subvolume only frees the data no other subvolume shares, which no
//! per-subvolume count can tell). That wait (about a second: the kernel
//! checks once a second) runs after the store lock is released, bounded by
//! [`SETTLE`]; the GC of a starting daemon skips it.

use std::collections::HashSet;
use std::path::Path;
use std::time::Instant;

use sandtree_api::GcReport;

use crate::engine::block;
use crate::{Engine, Result, util};

/// How long `gc` waits for btrfs to drop the deleted subvolumes before it
/// measures what it freed.
pub const SETTLE: std::time::Duration = std::time::Duration::from_secs(10);

impl Engine {
    /// GC, reporting the bytes it freed (see the module docs).
    pub async fn gc(&self) -> Result<GcReport> {
        self.collect(true).await
    }

    /// GC; with `measure`, waits for btrfs's cleaner to measure the bytes
    /// freed (start-up recovery does not wait).
    pub(crate) async fn collect(&self, measure: bool) -> Result<GcReport> {
        let t0 = Instant::now();
        let store = self.store_lock.write().await;
        let mut report = GcReport::default();
        let used_before = measure.then(|| block(|| self.volume.usage()).ok()).flatten().map(|u| u.used_bytes);

        let sandboxes = self.meta.sandboxes()?;
        let known_ids: HashSet<String> = sandboxes.iter().map(|s| s.id.clone()).collect();
        // Every layer a row names: writable subvolumes, checkpoints' layers
        // and the lower layers stacked under either.
        self.prune_squashed();
        let mut used = self.meta.layers_in_use()?;
        used.extend(self.layers_held());
        let under = |dir: &str| -> HashSet<String> {
            used.iter().filter_map(|l| l.strip_prefix(dir).map(str::to_string)).collect()
        };
        let mut subvols = under("sandboxes/");
        subvols.extend(self.spares.subvols());
        subvols.extend(self.nexts.subvols());
        let checkpoints = under("checkpoints/");
        let mut images = HashSet::new();
        for img in self.meta.images()? {
            for layer in self.image_layers(&img.name)? {
                if layer.kind == "image" {
                    images.insert(layer.path);
                }
            }
        }

        let mut removed = Removed::default();
        tokio::task::block_in_place(|| -> Result<()> {
            sweep_sandboxes(&self.volume.sandboxes_dir(), &subvols, &known_ids, &mut removed)?;
            sweep(&self.volume.checkpoints_dir(), &checkpoints, "checkpoints", &mut removed)?;
            sweep(&self.volume.images_dir(), &images, "images", &mut removed)?;
            Ok(())
        })?;
        report.orphans_removed = removed.names;

        // Runtime leftovers: run dirs (and the inits/cgroups behind them) of unknown sandboxes.
        let run = self.cfg.run_dir().join("sandboxes");
        if let Ok(entries) = std::fs::read_dir(&run) {
            for entry in entries.flatten() {
                let id = entry.file_name().to_string_lossy().into_owned();
                if known_ids.contains(&id) || !util::is_valid_id("sb", &id) {
                    continue;
                }
                match sandtree_sandbox::Sandbox::adopt(&self.cfg.host_config(), &id).await {
                    Ok(Some(sb)) => {
                        if let Err(e) = sb.kill().await {
                            tracing::warn!(sandbox = id, "gc: cannot kill stale sandbox: {e}");
                            continue;
                        }
                    }
                    Ok(None) => {}
                    Err(e) => {
                        tracing::warn!(sandbox = id, "gc: stale sandbox does not answer ({e}): killing it");
                        if let Err(e) = sandtree_sandbox::Sandbox::destroy_stale(&self.cfg.host_config(), &id) {
                            tracing::warn!(sandbox = id, "gc: cannot clean up: {e}");
                            continue;
                        }
                    }
                }
                let _ = std::fs::remove_dir_all(entry.path());
                report.stale_runtime_removed.push(id);
            }
        }
        for ck in self.meta.checkpoints(None)? {
            if !known_ids.contains(&ck.sandbox_id) {
                report.checkpoints_of_deleted_sandboxes_bytes += ck.size_bytes.unwrap_or(0);
                report.checkpoints_of_deleted_sandboxes.push(ck.id);
            }
        }
        drop(store);
        if let Some(before) = used_before.filter(|_| !report.orphans_removed.is_empty()) {
            let (root, ids) = (self.volume.root().to_path_buf(), removed.ids);
            let settled = tokio::task::spawn_blocking(move || sandtree_fs::settle_deletions(&root, &ids, SETTLE)).await;
            match settled {
                Ok(Ok(true)) => {}
                Ok(Ok(false)) => tracing::warn!(
                    "gc: btrfs is still dropping the deleted subvolumes after {SETTLE:?}: the bytes freed count only what it dropped so far"
                ),
                Ok(Err(e)) => tracing::warn!("gc: {e}: the bytes freed count only what btrfs dropped so far"),
                Err(e) => tracing::warn!("gc: {e}"),
            }
            let after = block(|| self.volume.usage()).map(|u| u.used_bytes).unwrap_or(before);
            report.bytes_freed = before.saturating_sub(after);
        }
        report.duration_ms = util::ms_since(t0);
        Ok(report)
    }
}

/// What the sweeps deleted.
#[derive(Default)]
struct Removed {
    /// Paths under the volume root (`checkpoints/<name>`, ...).
    names: Vec<String>,
    /// Ids of the deleted subvolumes (to wait for btrfs to drop them).
    ids: Vec<u64>,
}

/// `sandboxes/<id>/<gen>`: deletes unreferenced generations, and the
/// directories of sandboxes that no longer exist.
fn sweep_sandboxes(dir: &Path, keep: &HashSet<String>, ids: &HashSet<String>, removed: &mut Removed) -> Result<()> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Ok(()) };
    for entry in entries.flatten() {
        let id = entry.file_name().to_string_lossy().into_owned();
        let path = entry.path();
        if !path.is_dir() {
            continue;
        }
        let keep_here: HashSet<String> =
            keep.iter().filter_map(|s| s.strip_prefix(&format!("{id}/")).map(str::to_string)).collect();
        sweep(&path, &keep_here, &format!("sandboxes/{id}"), removed)?;
        if !ids.contains(&id) && std::fs::remove_dir(&path).is_ok() {
            removed.names.push(format!("sandboxes/{id}"));
        }
    }
    Ok(())
}

/// Deletes every subvolume directly under `dir` whose name is not in `keep`.
fn sweep(dir: &Path, keep: &HashSet<String>, kind: &str, removed: &mut Removed) -> Result<()> {
    let names = sandtree_fs::list_subvolumes(dir).map_err(|e| crate::Error::fs("gc", e))?;
    for name in names {
        if keep.contains(&name) {
            continue;
        }
        let id = sandtree_fs::subvolume_info(&dir.join(&name)).map(|i| i.id);
        match sandtree_fs::delete_subvolume(&dir.join(&name)) {
            Ok(()) => {
                removed.names.push(format!("{kind}/{name}"));
                removed.ids.extend(id.ok());
            }
            Err(e) => tracing::warn!("gc: cannot delete {kind}/{name}: {e}"),
        }
    }
    Ok(())
}
