//! `delete checkpoint`.
//!
//! A checkpoint that has child checkpoints or sandboxes based on it is kept
//! unless `force` is given. A forced delete loses no data of the
//! dependents: they are re-linked to the deleted checkpoint's parent (same
//! transaction as the delete), and its layer stays for as long as a
//! dependent's stack holds it. Layers that no row names any more are
//! destroyed after the commit.

use sandtree_api::DeleteCheckpointResponse;

use crate::{Engine, Error, Result};

impl Engine {
    pub async fn delete_checkpoint(&self, id: &str, force: bool) -> Result<DeleteCheckpointResponse> {
        self.checkpoint_record(id)?;
        let _store = self.store_lock.read().await;
        if !force {
            let (children, sandboxes) = self.meta.checkpoint_dependents(id)?;
            if !children.is_empty() || !sandboxes.is_empty() {
                let mut parts = Vec::new();
                if !children.is_empty() {
                    parts.push(format!("child checkpoint(s) {}", children.join(", ")));
                }
                if !sandboxes.is_empty() {
                    parts.push(format!("sandbox(es) {}", sandboxes.join(", ")));
                }
                return Err(Error::CheckpointInUse { checkpoint: id.to_string(), dependents: parts.join(" and ") });
            }
        }
        self.delete_checkpoint_locked(id)?;
        Ok(DeleteCheckpointResponse { deleted: vec![id.to_string()] })
    }

    /// Deletes the row; the snapshot is queued for deletion. The caller holds
    /// the store lock (read side).
    pub(crate) fn delete_checkpoint_locked(&self, id: &str) -> Result<()> {
        let Some(ck) = self.meta.checkpoint(id)? else { return Ok(()) };
        self.meta.delete_checkpoint(id)?;
        if let Some(t) = self.tracer_get(&ck.sandbox_id) {
            let _ = tokio::task::block_in_place(|| t.drop_checkpoint(id));
        }
        for spare in self.spares.drop_checkpoint(id) {
            self.discard_subvol_later(&spare);
        }
        self.discard_layers_if_unused(ck.stack());
        self.prune_images_later();
        Ok(())
    }
}
