//! `info`: daemon-wide facts for operators.

use sandtree_api::{DaemonInfo, VolumeInfo};

use crate::{Engine, Error, Result};

impl Engine {
    /// Memory the process templates of sandbox `id` hold (pages their
    /// originals changed since their checkpoints).
    pub fn template_memory(&self, id: &str) -> Result<u64> {
        self.record(id)?;
        match self.tracer_get(id) {
            Some(t) => Ok(tokio::task::block_in_place(|| t.memory())?),
            None => Ok(0),
        }
    }

    pub async fn info(&self) -> Result<DaemonInfo> {
        let usage = self.volume.usage().map_err(|e| Error::fs("info", e))?;
        let (sandboxes, checkpoints, images) = self.meta.counts()?;
        let running = self.live.lock().unwrap_or_else(|p| p.into_inner()).values().filter(|s| s.is_alive()).count();
        let tracers: Vec<_> = self.tracers.lock().unwrap_or_else(|p| p.into_inner()).values().cloned().collect();
        Ok(DaemonInfo {
            version: env!("CARGO_PKG_VERSION").to_string(),
            data_dir: self.cfg.data_dir.display().to_string(),
            volume: VolumeInfo {
                path: self.volume.root().display().to_string(),
                backing: if self.cfg.btrfs_mount.is_some() { "mount".into() } else { "image".into() },
                total_bytes: usage.total_bytes,
                used_bytes: usage.used_bytes,
                free_bytes: usage.free_bytes,
            },
            cgroup: match sandtree_sandbox::cgroup::Backend::detect() {
                sandtree_sandbox::cgroup::Backend::V1 { .. } => "v1",
                sandtree_sandbox::cgroup::Backend::V2 { .. } => "v2",
            }
            .into(),
            uid_base: self.cfg.uid_base,
            uid_count: sandtree_sandbox::config::ID_RANGE,
            uid_claim: self.cfg.uid_claim.as_ref().map(|p| p.display().to_string()),
            sandboxes,
            running: running as u64,
            checkpoints,
            images,
            metadata_bytes: self.meta.size_bytes(),
            spare_layers: self.spares.ready_count() as u64,
            process_checkpoints: tracers.iter().map(|t| t.checkpoints().unwrap_or(0) as u64).sum(),
            template_bytes: crate::engine::block(|| tracers.iter().map(|t| t.memory().unwrap_or(0)).sum()),
        })
    }
}
