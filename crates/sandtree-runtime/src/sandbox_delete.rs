//! `delete`: remove a sandbox.
//!
//! Order: kill its processes, delete the row (commit), delete the writable
//! subvolume. Its checkpoints stay (they can still seed forks) unless asked.

use std::time::Instant;

use sandtree_api::DeleteSandboxResponse;

use crate::{Engine, Result, util};

impl Engine {
    pub async fn delete_sandbox(&self, id: &str, with_checkpoints: bool) -> Result<DeleteSandboxResponse> {
        let t0 = Instant::now();
        let lock = self.lock_sandbox(id).await;
        let rec = self.record(id)?;
        let _store = self.store_lock.read().await;
        self.halt_and_release(id).await?;
        self.meta.delete_sandbox(id)?;
        if let Some(next) = self.nexts.drop_sandbox(id) {
            self.discard_subvol_later(&next);
        }
        for spare in self.spares.drop_sandbox(id) {
            self.discard_subvol_later(&spare);
        }
        // The layer goes when the engine is idle (see `reaper.rs`), and with
        // it the sandbox's directory once its checkpoints' layers are gone
        // too; so do lower layers no row names any more.
        self.reaper.discard(self.subvol_path(&rec.subvol), true);
        self.discard_layers_if_unused(rec.lowers.clone());
        drop(lock);
        self.forget_lock(id);
        let mut checkpoints_deleted = Vec::new();
        if with_checkpoints {
            let own: Vec<_> =
                self.meta.checkpoints(Some(&rec.tree_id))?.into_iter().filter(|c| c.sandbox_id == id).collect();
            // Children first, so each deletion only re-links what remains.
            for ck in own.iter().rev() {
                self.delete_checkpoint_locked(&ck.id)?;
                checkpoints_deleted.push(ck.id.clone());
            }
        }
        Ok(DeleteSandboxResponse { id: id.to_string(), checkpoints_deleted, duration_ms: util::ms_since(t0) })
    }
}
