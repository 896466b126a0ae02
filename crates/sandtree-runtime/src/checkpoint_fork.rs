//! `fork`: N independent sandboxes from one checkpoint, in one call.
//!
//! Order of operations:
//! 1. each fork's writable subvolume `sandboxes/<new-id>/1` (one directory
//!    per sandbox, so the kernel does not serialise them on a directory
//!    lock): layered (`Config::layered`), a new empty subvolume over the
//!    checkpoint's layers, which all forks share read-only (no commit);
//!    else writable snapshots of the checkpoint's layer over the layers
//!    under it, issued concurrently so btrfs folds them into few commits;
//! 2. spawn every sandbox's init at once (the zygote has a worker process
//!    per CPU, so the namespace work runs in parallel);
//! 3. commit every sandbox that came up in one transaction; the ones that
//!    failed are reported per item and their subvolumes deleted.
//!
//! Forks share the checkpoint's tree (`tree_id`): each may later roll back to
//! any checkpoint of that tree. Each fork gets fresh processes, so random
//! state (`/dev/urandom`, Python's hash seed, uuid4) diverges naturally.

use std::path::PathBuf;
use std::time::Instant;

use sandtree_api::{ForkRequest, ForkResponse, ForkResult, Limits, ProcessOutcome};
use sandtree_meta::{DesiredState, SandboxRecord};

use crate::{Engine, Error, Result, util};

/// Upper bound on `count` per call.
pub const MAX_FORK: u32 = 256;

/// What a fork response says about processes until they are captured.
const FORK_NOTE: &str = "filesystem copied exactly; the checkpoint's processes are not copied (processes cannot move between sandboxes yet): each fork runs only its init";
const FORK_NOTE_NO_PROCESSES: &str =
    "filesystem copied exactly; the checkpoint held no process to copy, and each fork runs its init";

impl Engine {
    pub async fn fork(&self, checkpoint: &str, req: ForkRequest) -> Result<ForkResponse> {
        let t0 = Instant::now();
        if req.count == 0 || req.count > MAX_FORK {
            return Err(Error::InvalidArgument(format!("count must be between 1 and {MAX_FORK}, got {}", req.count)));
        }
        let ck = self.checkpoint_record(checkpoint)?;
        let _busy = self.flusher.busy();
        let limits = match &req.limits {
            Some(l) => self.effective_limits(l),
            None => match self.meta.sandbox(&ck.sandbox_id)? {
                Some(src) => serde_json::from_value(src.limits).unwrap_or_default(),
                None => self.effective_limits(&Limits::default()),
            },
        };
        let limits = serde_json::to_value(limits).map_err(|e| Error::Internal(e.to_string()))?;
        let _store = self.store_lock.read().await;
        // Its layers stay until the forks' rows name them, even if the
        // checkpoint is deleted meanwhile (read again once pinned).
        let _pinned = self.pin_layers(ck.stack());
        let ck = self.checkpoint_record(&ck.id)?;

        let records: Vec<SandboxRecord> = (0..req.count)
            .map(|_| {
                let id = util::new_id("sb");
                SandboxRecord {
                    subvol: format!("{id}/1"),
                    tree_id: ck.tree_id.clone(),
                    image: ck.image.clone(),
                    created_at: util::now_rfc3339(),
                    labels: req.labels.clone(),
                    limits: limits.clone(),
                    base_checkpoint: Some(ck.id.clone()),
                    base_transid: if self.cfg.layered { 0 } else { ck.transid },
                    state: DesiredState::Running,
                    status_reason: None,
                    lowers: if self.cfg.layered { ck.stack() } else { ck.lowers.clone() },
                    id,
                }
            })
            .collect();
        for r in &records {
            self.subvol_parent(&r.id)?;
        }
        let snaps = if self.cfg.layered {
            let paths: Vec<PathBuf> = records.iter().map(|r| self.subvol_path(&r.subvol)).collect();
            tokio::task::spawn_blocking(move || paths.iter().map(|p| sandtree_fs::create_subvolume(p)).collect())
                .await?
        } else {
            let src = self.volume.root().join(&ck.layer);
            let pairs: Vec<(PathBuf, PathBuf)> =
                records.iter().map(|r| (src.clone(), self.subvol_path(&r.subvol))).collect();
            tokio::task::spawn_blocking(move || sandtree_fs::snapshot_many(&pairs, false)).await?
        };

        let ck_layer = self.volume.root().join(&ck.layer);
        let ck_layer = &ck_layer;
        let boots = records.iter().zip(snaps).map(|(rec, snap)| async move {
            match snap {
                Err(e) => Err(Error::fs("fork", e)),
                Ok(()) => {
                    let sb = self.boot(rec).await?;
                    // (A failed copy fails this fork: its sandbox is discarded.)
                    crate::dev_shm::load(sb.init_pid(), ck_layer)?;
                    if crate::sysv_ipc::saved_in(ck_layer) {
                        crate::sysv_ipc::load(sb.init_pid(), self.sandbox_root_ids(), ck_layer)?;
                    }
                    Ok(())
                }
            }
        });
        let outcomes: Vec<Result<()>> = futures_util::future::join_all(boots).await;
        let ok: Vec<SandboxRecord> =
            records.iter().zip(&outcomes).filter(|(_, o)| o.is_ok()).map(|(r, _)| r.clone()).collect();
        if let Err(e) = self.meta.insert_sandboxes(&ok) {
            for rec in &records {
                self.discard(&rec.id, &rec.subvol).await;
            }
            return Err(e.into());
        }
        if let Some(first) = ok.first() {
            // (All forks stand on the same layers.)
            self.squash_later(&first.id, &first.lowers);
        }
        let mut results = Vec::with_capacity(records.len());
        for (rec, outcome) in records.iter().zip(outcomes) {
            match outcome {
                Ok(()) => results.push(ForkResult { sandbox: Some(self.sandbox_info(rec, false)?), error: None }),
                Err(e) => {
                    self.discard(&rec.id, &rec.subvol).await;
                    results.push(ForkResult { sandbox: None, error: Some(e.to_api()) });
                }
            }
        }
        let held_processes = crate::sandbox_checkpoint::captured_of(&ck)
            .is_some_and(|c| !c.captured.is_empty() || !c.unrestorable.is_empty());
        let (processes, note) = if held_processes {
            (ProcessOutcome::NotCopied, FORK_NOTE)
        } else {
            (ProcessOutcome::NoneCaptured, FORK_NOTE_NO_PROCESSES)
        };
        Ok(ForkResponse {
            checkpoint: ck.id,
            results,
            processes,
            processes_restarted: false,
            note: note.into(),
            duration_ms: util::ms_since(t0),
        })
    }
}
