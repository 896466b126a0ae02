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
//! 3. when the checkpoint captured processes (and the request does not ask
//!    for the files alone, `files_only`), each fork runs copies of them:
//!    their templates are made again from the checkpoint's durable process
//!    image in the fork (as a rollback whose templates are gone does,
//!    `sandtree_proc::durable`), then restored from them: same pids in the
//!    fork's own pid namespace, files opened again in the fork's tree. The
//!    image is waited for while it is being written; one that cannot bring
//!    them back refuses the fork before anything is created
//!    (`ForkProcessesLost`, naming the processes and why);
//! 4. commit every sandbox that came up in one transaction; the ones that
//!    failed are reported per item and their subvolumes deleted.
//!
//! Forks share the checkpoint's tree (`tree_id`): each may later roll back to
//! any checkpoint of that tree, with its processes (from its templates, or
//! the checkpoint's image).
//!
//! Randomness: the kernel's is fresh in each fork (`getrandom`,
//! `/dev/urandom`, new sockets' sequence numbers), but what a copied
//! process drew before the checkpoint stays in its memory, as `fork()`
//! keeps it: Python's `random` module state, its hash seed, an OpenSSL
//! pool seeded already, `uuid4` (from `os.urandom`: fresh). A program whose
//! forks must diverge reseeds after the fork, as after `fork()`.

use std::path::PathBuf;
use std::time::Instant;

use sandtree_api::{ForkRequest, ForkResponse, ForkResult, Limits, ProcessOutcome};
use sandtree_meta::{DesiredState, SandboxRecord};

use crate::{Engine, Error, Result, util};

/// Upper bound on `count` per call.
pub const MAX_FORK: u32 = 256;

/// What a fork response says when it was asked for the files alone.
const FORK_NOTE_FILES_ONLY: &str =
    "filesystem copied exactly; the checkpoint's processes were not copied (files_only): each fork runs only its init";
const FORK_NOTE_NO_PROCESSES: &str =
    "filesystem copied exactly; the checkpoint held no process to copy, and each fork runs its init";

impl Engine {
    pub async fn fork(&self, checkpoint: &str, req: ForkRequest) -> Result<ForkResponse> {
        let t0 = Instant::now();
        if req.count == 0 || req.count > MAX_FORK {
            return Err(Error::InvalidArgument(format!("count must be between 1 and {MAX_FORK}, got {}", req.count)));
        }
        let ck = self.checkpoint_record(checkpoint)?;
        // The processes each fork runs copies of, from the checkpoint's
        // image, waited for while it is written (before the engine counts
        // busy: the writer waits for a moment when it is not).
        let captured = crate::sandbox_checkpoint::captured_of(&ck);
        let wanted = match req.files_only {
            true => Vec::new(),
            false => crate::sandbox_rollback::wanted_processes(captured.as_ref()),
        };
        if !wanted.is_empty()
            && self.process_image_info(&ck.id).is_some_and(|i| i.state == sandtree_api::ImageState::Writing)
        {
            self.image_settled(&ck.id).await;
        }
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
        // Refused before anything is made when the image cannot bring them
        // back; or when each fork's copy of their memory, all of them,
        // would not fit in the host's available memory (the kernel would
        // kill processes of any sandbox to make room).
        if !wanted.is_empty() {
            let each = match self.image_restorable(&ck.id) {
                Ok(each) => each,
                Err(reason) => {
                    return Err(Error::ForkProcessesLost { checkpoint: ck.id, processes: wanted.join(", "), reason });
                }
            };
            let need = each.saturating_mul(u64::from(req.count));
            if let Some(available) = util::mem_available()
                && need > available
            {
                return Err(Error::ForkNeedsMemory {
                    checkpoint: ck.id,
                    count: req.count,
                    need_mb: need >> 20,
                    each_mb: each >> 20,
                    available_mb: available >> 20,
                });
            }
        }
        let with_processes = !wanted.is_empty();

        // Each fork has the network its sandbox had (a router of its own).
        let network = match self.meta.sandbox(&ck.sandbox_id) {
            Ok(Some(src)) => src.network,
            _ => serde_json::json!({}),
        };
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
                    network: network.clone(),
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
        let ck_id = ck.id.as_str();
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
                    if !with_processes {
                        return Ok((Vec::new(), Vec::new()));
                    }
                    // Each fork's in a task of its own: they run side by
                    // side (each blocks its thread while its tracer works).
                    let engine = self.this.upgrade().ok_or_else(|| Error::Internal("the engine is gone".into()))?;
                    let (id, ck) = (rec.id.clone(), ck_id.to_string());
                    let restore = tokio::spawn(async move {
                        let tracer = engine.tracer(&id)?;
                        engine.restore_processes(&sb, &tracer, &ck, true)
                    });
                    let restored = restore.await.map_err(|e| Error::Internal(format!("restoring a fork: {e}")))??;
                    Ok((util::raw_pids(restored.restored), restored.connections_reset))
                }
            }
        });
        let outcomes: Vec<Result<(Vec<i32>, Vec<String>)>> = futures_util::future::join_all(boots).await;
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
                Ok((pids, connections_reset)) => {
                    // Templates made from an image are whole copies: the
                    // pool is brought back within its budget.
                    if with_processes {
                        self.evict_templates_later(&rec.id);
                    }
                    results.push(ForkResult {
                        sandbox: Some(self.sandbox_info(rec, false)?),
                        error: None,
                        restored_pids: pids,
                        connections_reset,
                    })
                }
                Err(e) => {
                    self.discard(&rec.id, &rec.subvol).await;
                    let error = match with_processes {
                        true => Error::Internal(format!("copying the processes of checkpoint {}: {e}", ck.id)),
                        false => e,
                    };
                    results.push(ForkResult {
                        sandbox: None,
                        error: Some(error.to_api()),
                        restored_pids: Vec::new(),
                        connections_reset: Vec::new(),
                    });
                }
            }
        }
        let (processes, note) = match (with_processes, req.files_only) {
            (true, _) => (ProcessOutcome::Restored, fork_note(&wanted, captured.as_ref())),
            (false, true) if captured.as_ref().is_some_and(|c| !c.captured.is_empty()) => {
                (ProcessOutcome::NotCopied, FORK_NOTE_FILES_ONLY.to_string())
            }
            (false, _) => (ProcessOutcome::NoneCaptured, FORK_NOTE_NO_PROCESSES.to_string()),
        };
        Ok(ForkResponse {
            checkpoint: ck.id,
            results,
            processes,
            processes_restarted: false,
            note,
            duration_ms: util::ms_since(t0),
        })
    }
}

/// What a fork response says of the processes copied (`wanted`, of the
/// checkpoint's `captured`).
fn fork_note(wanted: &[String], captured: Option<&sandtree_proc::CaptureReport>) -> String {
    let mut note = format!(
        "filesystem copied exactly; each fork runs copies of the checkpoint's {} process(es) ({}), made from its durable process image, with their pids",
        wanted.len(),
        wanted.join(", ")
    );
    if let Some(c) = captured
        && !c.unrestorable.is_empty()
    {
        let names: Vec<String> = c.unrestorable.iter().map(|u| format!("{} ({})", u.pid, u.comm)).collect();
        note.push_str(&format!("; not restorable, so not running: {}", names.join(", ")));
    }
    note
}
