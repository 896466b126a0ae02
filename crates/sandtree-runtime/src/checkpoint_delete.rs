//! `delete checkpoint`.
//!
//! A checkpoint that has child checkpoints or sandboxes based on it is kept
//! unless `force` is given. btrfs snapshots do not depend on each other, so a
//! forced delete loses no data of the dependents: they are re-linked to the
//! deleted checkpoint's parent (same transaction as the delete), and the
//! snapshot is destroyed after the commit.

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
        let sandbox = self.meta.checkpoint(id)?.map(|c| c.sandbox_id);
        self.meta.delete_checkpoint(id)?;
        if let Some(t) = sandbox.and_then(|s| self.tracer_get(&s)) {
            let _ = tokio::task::block_in_place(|| t.drop_checkpoint(id));
        }
        for spare in self.spares.drop_checkpoint(id) {
            self.discard_subvol_later(&spare);
        }
        self.reaper.discard(self.checkpoint_path(id), false);
        Ok(())
    }
}
