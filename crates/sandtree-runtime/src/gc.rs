//! `gc`: reclaim whatever no metadata row references.
//!
//! Runs with the store lock held exclusively, so no operation is between
//! "subvolume created" and "row committed" while it looks. It removes:
//! - subvolumes under `sandboxes/`, `checkpoints/`, `images/` that no row names
//!   as a writable subvolume, a checkpoint's layer or a lower layer (left by
//!   a crash, or by a delete whose subvolume removal failed);
//! - runtime leftovers of sandboxes that no row names: their init (if still
//!   alive after a crash), cgroup and run directory.

use std::collections::HashSet;
use std::path::Path;
use std::time::Instant;

use sandtree_api::GcReport;

use crate::{Engine, Result, util};

impl Engine {
    pub async fn gc(&self) -> Result<GcReport> {
        let t0 = Instant::now();
        let _store = self.store_lock.write().await;
        let mut report = GcReport::default();

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

        tokio::task::block_in_place(|| -> Result<()> {
            sweep_sandboxes(&self.volume.sandboxes_dir(), &subvols, &known_ids, &mut report.orphans_removed)?;
            sweep(&self.volume.checkpoints_dir(), &checkpoints, "checkpoints", &mut report.orphans_removed)?;
            sweep(&self.volume.images_dir(), &images, "images", &mut report.orphans_removed)?;
            Ok(())
        })?;

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
        report.duration_ms = util::ms_since(t0);
        Ok(report)
    }
}

/// `sandboxes/<id>/<gen>`: deletes unreferenced generations, and the
/// directories of sandboxes that no longer exist.
fn sweep_sandboxes(dir: &Path, keep: &HashSet<String>, ids: &HashSet<String>, removed: &mut Vec<String>) -> Result<()> {
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
            removed.push(format!("sandboxes/{id}"));
        }
    }
    Ok(())
}

/// Deletes every subvolume directly under `dir` whose name is not in `keep`.
fn sweep(dir: &Path, keep: &HashSet<String>, kind: &str, removed: &mut Vec<String>) -> Result<()> {
    let names = sandtree_fs::list_subvolumes(dir).map_err(|e| crate::Error::fs("gc", e))?;
    for name in names {
        if keep.contains(&name) {
            continue;
        }
        match sandtree_fs::delete_subvolume(&dir.join(&name)) {
            Ok(()) => removed.push(format!("{kind}/{name}")),
            Err(e) => tracing::warn!("gc: cannot delete {kind}/{name}: {e}"),
        }
    }
    Ok(())
}
