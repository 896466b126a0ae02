//! `checkpoint`: remember a sandbox's state.
//!
//! Order of operations:
//! 1. `syncfs` the writable layer while the sandbox still runs, so dirty data
//!    is on disk before anything is frozen (a btrfs snapshot must otherwise
//!    write it inside its transaction commit, i.e. inside the frozen window);
//! 2. freeze the sandbox's cgroup (bounded wait; on timeout thaw and fail,
//!    naming the stuck tasks);
//! 3. read-only snapshot `sandboxes/<subvol>` → `checkpoints/<ck-id>`
//!    (BTRFS_IOC_SNAP_CREATE_V2): the filesystem state at this instant;
//! 4. thaw — the frozen window is steps 2–4;
//! 5. commit the checkpoint row and re-base the sandbox on it (one transaction);
//! 6. in the background, measure what the checkpoint adds over its parent
//!    (btrfs tree search bounded by the parent's transid) and store it.
//!
//! Process state joins step 3 in a later version: the capture must happen in
//! the same frozen window as the snapshot.

use std::time::Instant;

use sandtree_api::{CheckpointInfo, CheckpointList, CheckpointRequest, CheckpointResponse, ProcessState};
use sandtree_meta::CheckpointRecord;

use crate::{Engine, Error, Result, util};

/// What a checkpoint holds of the processes, in words, for API responses.
pub(crate) const FS_ONLY_NOTE: &str = "filesystem captured; live process state is not captured yet, so a rollback or fork to this checkpoint restarts the sandbox's processes";

impl Engine {
    pub async fn checkpoint(&self, id: &str, req: CheckpointRequest) -> Result<CheckpointResponse> {
        let t0 = Instant::now();
        let _busy = self.flusher.busy();
        let _lock = self.lock_sandbox(id).await;
        let rec = self.record(id)?;
        let _store = self.store_lock.read().await;
        let ck_id = util::new_id("ck");
        let src = self.subvol_path(&rec.subvol);
        let dst = self.checkpoint_path(&ck_id);
        let live = self.live_get(id).filter(|s| s.is_alive());

        let frozen_ms = tokio::task::block_in_place(|| -> Result<f64> {
            if self.cfg.pre_sync {
                sandtree_fs::sync_fs(&src).map_err(|e| Error::fs("checkpoint", e))?;
            }
            let frozen_at = Instant::now();
            let t_sync = t0.elapsed();
            if let Some(sb) = &live {
                sb.freeze(self.freeze_timeout()).map_err(|e| self.freeze_error(id, e))?;
            }
            let snap = sandtree_fs::snapshot(&src, &dst, true);
            let thawed = live.as_ref().map(|sb| sb.thaw()).unwrap_or(Ok(()));
            let frozen_ms = util::ms_since(frozen_at);
            tracing::debug!(sandbox = id, pre_sync = ?t_sync, frozen_ms, "checkpoint snapshot taken");
            snap.map_err(|e| Error::fs("checkpoint", e))?;
            thawed?;
            Ok(frozen_ms)
        })?;

        let committed = (|| -> Result<CheckpointRecord> {
            let info = sandtree_fs::subvolume_info(&dst).map_err(|e| Error::fs("checkpoint", e))?;
            let ck = CheckpointRecord {
                id: ck_id.clone(),
                sandbox_id: id.to_string(),
                tree_id: rec.tree_id.clone(),
                parent: rec.base_checkpoint.clone(),
                image: rec.image.clone(),
                label: req.label.clone(),
                labels: req.labels.clone(),
                created_at: util::now_rfc3339(),
                transid: info.otransid,
                size_bytes: None,
                frozen_ms,
                duration_ms: util::ms_since(t0),
            };
            self.meta.insert_checkpoint(&ck, Some(id))?;
            Ok(ck)
        })();
        let ck = match committed {
            Ok(ck) => ck,
            Err(e) => {
                let _ = tokio::task::block_in_place(|| sandtree_fs::delete_subvolume(&dst));
                return Err(e);
            }
        };

        // The likeliest rollback target: prepare it while the agent thinks.
        self.spares.want(id, &ck_id);

        // What this checkpoint adds over its base, measured off the hot path.
        let meta = self.meta.clone();
        let base_transid = rec.base_transid;
        let (ck_id2, dst2) = (ck_id.clone(), dst.clone());
        tokio::task::spawn_blocking(move || match sandtree_fs::bytes_written_since(&dst2, base_transid) {
            Ok(size) => {
                if let Err(e) = meta.set_checkpoint_size(&ck_id2, size) {
                    tracing::warn!(checkpoint = ck_id2, "cannot store size: {e}");
                }
            }
            Err(e) => tracing::warn!(checkpoint = ck_id2, "cannot measure size: {e}"),
        });

        Ok(CheckpointResponse { checkpoint: checkpoint_info(&ck), note: FS_ONLY_NOTE.into() })
    }

    pub(crate) fn freeze_error(&self, id: &str, e: sandtree_sandbox::Error) -> Error {
        match e {
            sandtree_sandbox::Error::FreezeTimeout { stuck, .. } => Error::FreezeTimeout {
                sandbox: id.to_string(),
                timeout_ms: self.cfg.freeze_timeout_ms,
                stuck: stuck
                    .iter()
                    .map(|t| format!("pid {} ({}) in state {}", t.pid, t.comm, t.state))
                    .collect::<Vec<_>>()
                    .join(", "),
            },
            other => Error::from(other),
        }
    }

    pub async fn get_checkpoint(&self, id: &str) -> Result<CheckpointInfo> {
        Ok(checkpoint_info(&self.checkpoint_record(id)?))
    }

    /// All checkpoints, or those of one sandbox's tree, parents first.
    pub async fn list_checkpoints(&self, sandbox: Option<&str>) -> Result<CheckpointList> {
        let tree = match sandbox {
            Some(id) => Some(self.record(id)?.tree_id),
            None => None,
        };
        let checkpoints = self.meta.checkpoints(tree.as_deref())?.iter().map(checkpoint_info).collect();
        Ok(CheckpointList { checkpoints })
    }
}

pub(crate) fn checkpoint_info(c: &CheckpointRecord) -> CheckpointInfo {
    CheckpointInfo {
        id: c.id.clone(),
        sandbox_id: c.sandbox_id.clone(),
        parent: c.parent.clone(),
        label: c.label.clone(),
        labels: c.labels.clone(),
        image: c.image.clone(),
        created_at: c.created_at.clone(),
        size_bytes: c.size_bytes,
        process_state: ProcessState::NotCaptured,
        frozen_ms: c.frozen_ms,
        duration_ms: c.duration_ms,
    }
}
