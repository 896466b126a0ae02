//! `delete`: remove a sandbox.
//!
//! Order: wait for its checkpoints' images still being written (they are
//! read from its templates), kill its processes, delete the row (commit),
//! delete the writable subvolume. Its checkpoints stay (they can still seed forks) unless asked.
//!
//! The rule for its checkpoints: kept by default, and the response lists
//! them with their sizes and what needs each. With `with_checkpoints` each
//! is deleted, children first, unless something else still needs it: a
//! sandbox standing on it (a fork's base) or a child checkpoint that is
//! kept (a fork's checkpoint, or one kept for that reason). Those are kept
//! and listed with what needs them; nothing is re-linked, no data of
//! another sandbox is touched.

use std::time::Instant;

use sandtree_api::{DeleteSandboxResponse, KeptCheckpoint};

use crate::{Engine, Result, util};

impl Engine {
    pub async fn delete_sandbox(&self, id: &str, with_checkpoints: bool) -> Result<DeleteSandboxResponse> {
        let t0 = Instant::now();
        self.settle_images_of(Some(id), crate::checkpoint_image::IMAGES_BEFORE_STOP).await;
        let lock = self.lock_sandbox(id).await;
        let rec = self.record(id)?;
        let _store = self.store_lock.read().await;
        self.halt_and_release(id).await?;
        self.meta.delete_sandbox(id)?;
        self.close_ports(id);
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
        let own: Vec<_> =
            self.meta.checkpoints(Some(&rec.tree_id))?.into_iter().filter(|c| c.sandbox_id == id).collect();
        let (mut deleted, mut deleted_bytes) = (Vec::new(), 0);
        let (mut kept, mut kept_bytes) = (Vec::new(), 0);
        // Children first (rows are oldest first), so a deleted child no
        // longer counts as needing its parent.
        for ck in own.iter().rev() {
            let (children, sandboxes) = self.meta.checkpoint_dependents(&ck.id)?;
            let needed_by: Vec<String> = sandboxes.into_iter().chain(children).collect();
            if with_checkpoints && needed_by.is_empty() {
                self.delete_checkpoint_locked(&ck.id)?;
                deleted.push(ck.id.clone());
                deleted_bytes += ck.size_bytes.unwrap_or(0);
            } else {
                kept_bytes += ck.size_bytes.unwrap_or(0);
                kept.push(KeptCheckpoint { id: ck.id.clone(), size_bytes: ck.size_bytes, needed_by });
            }
        }
        let note = delete_note(with_checkpoints, &deleted, deleted_bytes, &kept, kept_bytes);
        Ok(DeleteSandboxResponse {
            id: id.to_string(),
            checkpoints_deleted: deleted,
            checkpoints_deleted_bytes: deleted_bytes,
            checkpoints_kept: kept,
            checkpoints_kept_bytes: kept_bytes,
            note,
            duration_ms: util::ms_since(t0),
        })
    }
}

/// What became of a deleted sandbox's checkpoints, in words.
fn delete_note(
    asked: bool,
    deleted: &[String],
    deleted_bytes: u64,
    kept: &[KeptCheckpoint],
    kept_bytes: u64,
) -> String {
    let mb = |b: u64| format!("{:.1} MB", b as f64 / 1e6);
    let mut parts = Vec::new();
    if !deleted.is_empty() {
        parts.push(format!("deleted its {} checkpoint(s) ({}) with it", deleted.len(), mb(deleted_bytes)));
    }
    if kept.is_empty() {
        if deleted.is_empty() {
            parts.push("it had no checkpoints".to_string());
        }
    } else if asked {
        let why: Vec<String> =
            kept.iter().map(|k| format!("{} (needed by {})", k.id, k.needed_by.join(", "))).collect();
        parts.push(format!(
            "kept {} checkpoint(s) ({}) that others still need: {}; delete those first",
            kept.len(),
            mb(kept_bytes),
            why.join("; ")
        ));
    } else {
        parts.push(format!(
            "its {} checkpoint(s) ({}) are kept: they can still seed forks; delete them with DELETE /v1/checkpoints/{{id}} \
             in the listed order, or delete them with the sandbox by passing checkpoints=true",
            kept.len(),
            mb(kept_bytes)
        ));
    }
    parts.join("; ")
}
