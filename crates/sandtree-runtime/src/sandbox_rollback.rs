//! `rollback`: bring a sandbox back to any checkpoint of its tree.
//!
//! Order of operations:
//! 1. in parallel: kill the sandbox's processes (they cannot be restored yet)
//!    and take a writable snapshot `checkpoints/<ck>` → `sandboxes/<id>/<new>`;
//! 2. commit: the sandbox row now names the new subvolume and the checkpoint
//!    as its base (a crash before this leaves the old state, after it the new);
//! 3. delete the old writable subvolume in the background (its unsaved
//!    dirty data is dropped, never written) and start the sandbox's init on
//!    the new subvolume.
//!
//! The filesystem is byte-identical to the checkpoint: the new writable layer
//! *is* the checkpoint's snapshot and the lower layers are read-only.

use std::time::Instant;

use sandtree_api::{RollbackRequest, RollbackResponse};
use sandtree_meta::DesiredState;

use crate::{Engine, Error, Result, util};

pub(crate) const RESTART_NOTE: &str = "filesystem restored exactly; processes were restarted (live process state is not captured yet): re-run background services and sessions";

impl Engine {
    pub async fn rollback(&self, id: &str, req: RollbackRequest) -> Result<RollbackResponse> {
        let t0 = Instant::now();
        let _busy = self.flusher.busy();
        let _lock = self.lock_sandbox(id).await;
        let rec = self.record(id)?;
        let ck = self.checkpoint_record(&req.checkpoint)?;
        if ck.tree_id != rec.tree_id {
            return Err(Error::CheckpointNotInTree {
                checkpoint: ck.id,
                checkpoint_tree: ck.tree_id,
                sandbox: id.to_string(),
            });
        }
        let _store = self.store_lock.read().await;
        let new_subvol = format!("{id}/{}", &util::new_id("g")[2..]);
        let src = self.checkpoint_path(&ck.id);
        let dst = self.subvol_path(&new_subvol);

        let snapshot = tokio::task::spawn_blocking(move || sandtree_fs::snapshot(&src, &dst, false));
        let halted = self.halt(id).await;
        let snapped = snapshot.await?.map_err(|e| Error::fs("rollback", e));
        if let Err(e) = snapped.and(halted) {
            // Nothing was committed: bring the old state back up.
            self.discard_subvol_later(&new_subvol);
            if rec.state == DesiredState::Running {
                let _ = self.boot(&rec).await;
            }
            return Err(e);
        }
        self.meta.set_sandbox_subvol(id, &new_subvol, Some(&ck.id), ck.transid)?;
        // Unreferenced from here on; deleting it at once also drops its dirty
        // page cache before the background flusher would write it out.
        self.discard_subvol_later(&rec.subvol);
        let mut rec2 = self.record(id)?;
        let booted = self.boot(&rec2).await;
        let reason = match &booted {
            Ok(_) => None,
            Err(e) => Some(format!("rolled back, but its processes failed to start: {e}")),
        };
        self.meta.set_sandbox_state(id, DesiredState::Running, reason.as_deref())?;
        rec2.status_reason = reason;
        booted?;
        Ok(RollbackResponse {
            sandbox: self.sandbox_info(&rec2, false)?,
            checkpoint: ck.id,
            processes_restarted: true,
            note: RESTART_NOTE.into(),
            duration_ms: util::ms_since(t0),
        })
    }

    /// Deletes an unreferenced writable subvolume later, when the engine is
    /// idle (see `reaper.rs`).
    pub(crate) fn discard_subvol_later(&self, subvol: &str) {
        self.reaper.discard(self.subvol_path(subvol), false);
    }
}
