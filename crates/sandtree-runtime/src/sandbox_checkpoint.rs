//! `checkpoint`: remember a sandbox's state — its filesystem and its live
//! processes, taken at one instant.
//!
//! Three ways (`Config::layered`, the default, tries them in order):
//! - init runs alone: a *layered* checkpoint (`checkpoint_restack`): the
//!   writable subvolume becomes the checkpoint's layer;
//! - processes run: the same, with the processes stopped, their templates
//!   made and the processes moved to the new stack (`checkpoint_live.rs`);
//! - otherwise (what cannot move, a deep stack, `layered` off): a btrfs
//!   snapshot, below.
//!
//! Order of operations of a snapshot checkpoint:
//! 1. `syncfs` the writable layer while the sandbox still runs, so dirty data
//!    is on disk before anything is frozen (a btrfs snapshot must otherwise
//!    write it inside its transaction commit, i.e. inside the frozen window);
//! 2. stop every process, init last, with ptrace (`sandtree_proc::Tracer::stop`,
//!    which gives a `Stopped`: each state of the checkpoint lets the
//!    processes go if it is dropped before the next step): the consistency
//!    point. A process the engine cannot restore fails the
//!    checkpoint here (nothing changed), or, with `best_effort`, is left
//!    running and marked not restorable. (Tasks that joined the cgroup from
//!    outside the sandbox's pid namespace are held by a cgroup freeze
//!    instead, around the snapshot only.)
//! 3. copy `/dev/shm` into the writable subvolume (`dev_shm.rs`), then
//!    on other threads at once, read-only snapshot `sandboxes/<subvol>` →
//!    `checkpoints/<ck-id>` and writable snapshot → `sandboxes/<id>/<new>`
//!    (the spare-to-be, `spares.rs`; the two usually share a commit), while
//!    `Stopped::capture` captures each process and makes its template;
//! 4. let every process go (`Captured::release`): the pause is steps 2-4
//!    (`frozen_ms`);
//! 5. the rest of each process image and its checks
//!    (`Released::set_up`; the templates' own set-up follows on
//!    the tracer thread after the reply);
//! 6. commit the checkpoint row (with what was captured) and re-base the
//!    sandbox on it (one transaction);
//! 7. in the background: the spare's overlays, eviction of templates over
//!    the pool's budget, and what the checkpoint adds over its parent
//!    (btrfs tree search bounded by the parent's transid).

use std::path::PathBuf;
use std::time::Instant;

use sandtree_api::{
    CheckpointInfo, CheckpointList, CheckpointRequest, CheckpointResponse, ProcessState, UnrestorableProcess,
};
use sandtree_meta::{CheckpointRecord, SandboxRecord};
use sandtree_proc::{CaptureReport, HostPid, Unrestorable};

use crate::{Engine, Error, Result, util};

/// What a checkpoint of a stopped sandbox holds of the processes, in words.
pub(crate) const FS_ONLY_NOTE: &str = "filesystem captured; the sandbox was not running, so no process state was captured: a rollback to this checkpoint starts it with only its init";

impl Engine {
    pub async fn checkpoint(&self, id: &str, req: CheckpointRequest) -> Result<CheckpointResponse> {
        let wait = req.wait_durable;
        let mut done = self.checkpoint_now(id, req).await?;
        if wait && done.checkpoint.process_image.is_some() {
            done.checkpoint.process_image = Some(self.image_settled(&done.checkpoint.id).await);
        }
        Ok(done)
    }

    /// [`Engine::checkpoint`] but for the wait for its process image.
    async fn checkpoint_now(&self, id: &str, req: CheckpointRequest) -> Result<CheckpointResponse> {
        let t0 = Instant::now();
        let _busy = self.flusher.busy();
        let _lock = self.lock_sandbox(id).await;
        let rec = self.record(id)?;
        let _store = self.store_lock.read().await;
        let ck_id = util::new_id("ck");
        let src = self.subvol_path(&rec.subvol);
        let dst = self.checkpoint_path(&ck_id);
        let live = self.live_get(id).filter(|s| s.is_alive());
        let best_effort = req.best_effort;

        // Layered: when init runs alone, its writable subvolume becomes the
        // checkpoint's layer (no snapshot, no commit); else a snapshot.
        let depth = self.compact(&rec.lowers).len();
        if let (Some(sb), true) = (&live, self.cfg.layered && depth < self.cfg.max_layers) {
            // Templates of earlier checkpoints may stay (no tracer: none).
            let tracer = self.tracer_get(id);
            let _op = tracer.as_ref().map(|t| t.begin());
            let (keep, pool) = match &tracer {
                Some(t) => crate::engine::block(|| t.pool()).unwrap_or_default(),
                None => Default::default(),
            };
            // (Read once: the checkpoint's stop lists them again.)
            let procs = sb.cgroup().procs().ok();
            if init_alone(sb, procs.as_deref(), &pool) {
                if let Some(done) = self.checkpoint_restack(&rec, sb, util::raw_pids(keep), &ck_id, &req, t0).await? {
                    return Ok(done);
                }
            } else if self.cfg.layered_processes
                && let Some(done) =
                    self.checkpoint_live_layered(&rec, sb, (procs.as_deref(), &pool), &ck_id, &req, t0).await?
            {
                return Ok(done);
            }
        }
        let tracer = live.as_ref().map(|_| self.tracer(id)).transpose()?;
        // No standby forks on the tracer thread while this runs.
        let _op = tracer.as_ref().map(|t| t.begin());

        // Where the checkpoint's writable copy goes, made in its commit.
        let spare = match (self.cfg.spare_layers > 0, &live) {
            (true, Some(_)) => self.new_layer_name(id).ok().map(|name| {
                let path = self.subvol_path(&name);
                (name, path)
            }),
            _ => None,
        };
        let mut spare_made = false;
        let taken = tokio::task::block_in_place(|| -> Result<(f64, Option<CaptureReport>)> {
            if self.cfg.pre_sync {
                sandtree_fs::sync_fs(&src).map_err(|e| Error::fs("checkpoint", e))?;
            }
            let paused_at = Instant::now();
            let t_sync = t0.elapsed();
            let (Some(sb), Some(t)) = (&live, &tracer) else {
                // Not running: nothing to stop or capture, no `/dev/shm`.
                crate::dev_shm::discard(&src)?;
                crate::sysv_ipc::discard(&src)?;
                sandtree_fs::snapshot(&src, &dst, true).map_err(|e| Error::fs("checkpoint", e))?;
                return Ok((0.0, None));
            };
            let cg = sb.cgroup().clone();
            let list = Box::new(move || {
                cg.procs().map(|pids| pids.into_iter().map(HostPid).collect()).map_err(std::io::Error::other)
            });
            let stopped = t
                .stop(list, HostPid(sb.init_pid()), best_effort, self.freeze_timeout(), true)
                .map_err(|e| self.process_error(id, e))?;
            let skipped = stopped.report().skipped.clone();
            // (Dropped on error: the processes go.)
            self.save_namespace_state(id, sb.init_pid(), &src)?;
            // When the processes run again: the templates' set-up comes after.
            let mut resumed_at = None;
            // (Each state of the checkpoint lets the processes go when
            // dropped: an early return undoes the stop.)
            let captured = if stopped.report().foreign {
                // Tasks from outside the sandbox's pid namespace joined its
                // cgroup: only a freeze holds them (and init is running).
                let frozen_at = Instant::now();
                if let Err(e) = sb.freeze(self.freeze_timeout()) {
                    return Err(self.freeze_error(id, e));
                }
                let snap = sandtree_fs::snapshot(&src, &dst, true);
                let thawed = sb.thaw();
                tracing::debug!(sandbox = id, cgroup_ms = util::ms_since(frozen_at), "frozen for foreign tasks");
                if let Err(e) = snap.map_err(|e| Error::fs("checkpoint", e)).and(thawed.map_err(Error::from)) {
                    drop(stopped);
                    let _ = sandtree_fs::delete_subvolume(&dst);
                    return Err(e);
                }
                stopped.capture(best_effort).and_then(|c| c.release()).and_then(|r| {
                    resumed_at = Some(r.at());
                    r.set_up(&ck_id, best_effort)
                })
            } else {
                // Everything in the sandbox, init included, is stopped: the
                // snapshot runs on another thread while the templates are
                // cloned, and the processes go once both are done.
                let (src2, dst2) = (src.clone(), dst.clone());
                let snap = std::thread::spawn(move || sandtree_fs::snapshot(&src2, &dst2, true));
                // The likeliest rollback target's writable copy, from the
                // same frozen state, at once (they usually share a commit: none
                // of its own later, in the agent's next burst).
                let spare = spare.as_ref().map(|(_, path)| {
                    let (src3, path) = (src.clone(), path.clone());
                    std::thread::spawn(move || sandtree_fs::snapshot(&src3, &path, false))
                });
                let cloned = stopped.capture(best_effort);
                let snap = snap
                    .join()
                    .map_err(|_| Error::Internal("the snapshot thread panicked".into()))
                    .and_then(|r| r.map_err(|e| Error::fs("checkpoint", e)));
                spare_made = spare.is_some_and(|h| matches!(h.join(), Ok(Ok(()))));
                match (cloned, snap) {
                    (Ok(captured), Ok(())) => captured.release().and_then(|r| {
                        resumed_at = Some(r.at());
                        r.set_up(&ck_id, best_effort)
                    }),
                    (cloned, snap) => {
                        // (A capture made is dropped here: the processes go.)
                        let cloned = cloned.map(drop);
                        if snap.is_ok() {
                            let _ = sandtree_fs::delete_subvolume(&dst);
                        }
                        cloned.map_err(|e| self.process_error(id, e))?;
                        return Err(snap.err().unwrap_or_else(|| Error::Internal("checkpoint failed".into())));
                    }
                }
            };
            let captured = match captured {
                Ok(mut c) => {
                    c.unrestorable.extend(skipped);
                    c
                }
                Err(e) => {
                    let _ = sandtree_fs::delete_subvolume(&dst);
                    return Err(self.process_error(id, e));
                }
            };
            let frozen_ms = resumed_at.unwrap_or_else(Instant::now).duration_since(paused_at).as_secs_f64() * 1e3;
            tracing::debug!(sandbox = id, pre_sync = ?t_sync, frozen_ms, "checkpoint taken");
            Ok((frozen_ms, Some(captured)))
        });
        let discard_spare = |spare: &Option<(String, PathBuf)>| {
            if let (Some((name, _)), true) = (spare, spare_made) {
                self.discard_subvol_later(name);
            }
        };
        let (frozen_ms, captured) = match taken {
            Ok(t) => t,
            Err(e) => {
                discard_spare(&spare);
                return Err(e);
            }
        };

        let made = spare.filter(|_| spare_made).map(|(name, _)| name);
        self.commit_snapshot(&rec, &req, &ck_id, frozen_ms, captured, t0, tracer.as_deref(), made)
    }

    /// The end of a snapshot checkpoint (`checkpoints/<ck_id>` taken): its
    /// row, then in the background the spare, the pool's eviction and the
    /// size. `made`: the spare's writable copy, made with the snapshot. On
    /// error nothing of the checkpoint stays.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn commit_snapshot(
        &self,
        rec: &SandboxRecord,
        req: &CheckpointRequest,
        ck_id: &str,
        frozen_ms: f64,
        captured: Option<CaptureReport>,
        t0: Instant,
        tracer: Option<&sandtree_proc::Tracer>,
        made: Option<String>,
    ) -> Result<CheckpointResponse> {
        let id = rec.id.as_str();
        let dst = self.checkpoint_path(ck_id);
        tracing::debug!(sandbox = id, at = ?t0.elapsed(), "checkpoint captured");
        let committed = (|| -> Result<CheckpointRecord> {
            let info = sandtree_fs::subvolume_info(&dst).map_err(|e| Error::fs("checkpoint", e))?;
            let ck = CheckpointRecord {
                transid: info.otransid,
                frozen_ms,
                duration_ms: util::ms_since(t0),
                processes: match &captured {
                    Some(c) => serde_json::to_value(c).map_err(|e| Error::Internal(e.to_string()))?,
                    None => serde_json::Value::Null,
                },
                layer: format!("checkpoints/{ck_id}"),
                ..new_record(rec, req, ck_id)
            };
            self.meta.insert_checkpoint(&ck, Some(id), None)?;
            Ok(ck)
        })();
        let ck = match committed {
            Ok(ck) => ck,
            Err(e) => {
                if let Some(t) = tracer {
                    let _ = t.drop_checkpoint(ck_id);
                }
                let _ = tokio::task::block_in_place(|| sandtree_fs::delete_subvolume(&dst));
                if let Some(name) = made {
                    self.discard_subvol_later(&name);
                }
                return Err(e);
            }
        };

        // The likeliest rollback target: prepare it while the agent thinks.
        let processes = captured.as_ref().is_some_and(|c| !c.captured.is_empty());
        match made {
            Some(name) => self.spares.want_made(id, ck_id, name, processes),
            // Not made (tasks from outside the pid namespace took the freeze
            // path, or the snapshot failed): the maker snapshots it later.
            None => self.spares.want(id, ck_id, processes),
        }

        // Keep the template pool within its budget, off the hot path.
        if tracer.is_some() {
            self.evict_templates_later(id);
        }

        // What this checkpoint adds over its base, measured off the hot path.
        self.measure_later(ck_id, dst, rec.base_transid);
        if processes {
            self.write_image_later(id, ck_id, ck.parent.clone(), req.wait_durable);
        }

        // Its templates were just made (asking the tracer would wait for
        // their set-up, which follows the reply).
        let info = self.checkpoint_info_known(&ck, true);
        let note = process_note(&info);
        tracing::debug!(sandbox = id, at = ?t0.elapsed(), "checkpoint done");
        Ok(CheckpointResponse { checkpoint: info, note })
    }

    /// A layered checkpoint (`Config::layered`): a new empty writable
    /// subvolume is stacked over the current one, which init's restack
    /// (see `sandtree_sandbox::reroot`) freezes as the checkpoint's layer.
    /// `None` when init is not alone (nothing changed: take a snapshot).
    async fn checkpoint_restack(
        &self,
        rec: &SandboxRecord,
        sb: &std::sync::Arc<sandtree_sandbox::Sandbox>,
        keep: Vec<i32>,
        ck_id: &str,
        req: &CheckpointRequest,
        t0: Instant,
    ) -> Result<Option<CheckpointResponse>> {
        let id = rec.id.as_str();
        let t_fresh = Instant::now();
        let targets: Vec<PathBuf> = self.image_layers(&rec.image)?.iter().map(|l| PathBuf::from(&l.target)).collect();
        let (top, fds) = self.take_next(rec).await?;
        let (fresh, lowers) = (top.subvol, top.lowers);
        let fresh_ms = util::ms_since(t_fresh);
        let t_swap = Instant::now();
        // Init alone, and no spawn until the tree is swapped: `/dev/shm`
        // cannot change between its copy and the swap.
        let spawns = sb.hold_spawns().await;
        let saved = self.save_namespace_state(id, sb.init_pid(), &self.subvol_path(&rec.subvol));
        if let Err(e) = saved {
            drop(spawns);
            self.discard_subvol_later(&fresh);
            return Err(e);
        }
        let restacked = sb.restack(targets, fds, keep).await;
        drop(spawns);
        match restacked {
            Ok(()) => {}
            Err(sandtree_sandbox::Error::Busy(why)) => {
                tracing::debug!(sandbox = id, "no layered checkpoint: {why}");
                self.discard_subvol_later(&fresh);
                return Ok(None);
            }
            Err(e) => {
                // The tree is unknown: boot again on the recorded layer.
                tracing::warn!(sandbox = id, "restack failed, restarting the sandbox: {e}");
                self.discard_subvol_later(&fresh);
                let _ = self.restart(rec).await;
                return Err(e.into());
            }
        }
        let frozen_ms = util::ms_since(t_swap);
        let t_commit = Instant::now();
        let done = self.commit_layered(rec, req, ck_id, (fresh, lowers), frozen_ms, CaptureReport::default(), t0, None);
        let done = done.await?;
        let commit_ms = util::ms_since(t_commit);
        tracing::debug!(sandbox = id, before = ?t_fresh.duration_since(t0), fresh_ms, frozen_ms, commit_ms, at = ?t0.elapsed(), "layered checkpoint done");
        Ok(Some(done))
    }

    /// The end of a layered checkpoint (the tree swapped onto `fresh`, over
    /// `lowers`, the frozen layer first): its row and the sandbox's new
    /// stack in one transaction, then in the background the next layer, a
    /// squash, a spare, the pool's eviction and the size. A failed commit
    /// restarts the sandbox on its recorded layer (init writes to `fresh`,
    /// which metadata does not know).
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn commit_layered(
        &self,
        rec: &SandboxRecord,
        req: &CheckpointRequest,
        ck_id: &str,
        (fresh, lowers): (String, Vec<String>),
        frozen_ms: f64,
        captured: CaptureReport,
        t0: Instant,
        tracer: Option<&sandtree_proc::Tracer>,
    ) -> Result<CheckpointResponse> {
        let id = rec.id.as_str();
        let has_processes = !captured.captured.is_empty();
        let layer = Engine::subvol_layer(&rec.subvol);
        let ck = CheckpointRecord {
            frozen_ms,
            duration_ms: util::ms_since(t0),
            processes: serde_json::to_value(&captured).map_err(|e| Error::Internal(e.to_string()))?,
            layer: layer.clone(),
            // What the new stack has under the frozen layer (a squashed run
            // instead of its layers, when there is one).
            lowers: lowers[1..].to_vec(),
            ..new_record(rec, req, ck_id)
        };
        if let Err(e) = self.meta.insert_checkpoint(&ck, Some(id), Some((&fresh, &lowers))) {
            tracing::warn!(sandbox = id, "checkpoint not committed, restarting the sandbox on its layer: {e}");
            if let Some(t) = tracer {
                let _ = crate::engine::block(|| t.drop_checkpoint(ck_id));
            }
            let _ = self.restart(rec).await;
            self.discard_subvol_later(&fresh);
            return Err(e.into());
        }
        // Committed to disk soon (a host crash before that loses the
        // checkpoint's layer files newer than btrfs's last commit).
        self.flusher.poke();
        // Layers the sandbox stood on that a squashed one replaced.
        self.discard_layers_if_unused(rec.lowers.iter().filter(|l| !lowers.contains(l)).cloned().collect());
        self.spares.want(id, ck_id, has_processes);
        self.squash_later(id, &lowers);
        self.want_next(id);
        if tracer.is_some() {
            self.evict_templates_later(id);
        }
        self.measure_later(ck_id, self.volume.root().join(&layer), rec.base_transid);
        if has_processes {
            self.write_image_later(id, ck_id, ck.parent.clone(), req.wait_durable);
        }
        // (Its templates, if any, were just made.)
        let info = self.checkpoint_info_known(&ck, true);
        let note = process_note(&info);
        Ok(CheckpointResponse { checkpoint: info, note })
    }

    /// What a checkpoint adds over its base (`bytes_written_since`), measured
    /// off the hot path and stored, once the flusher has written the layer's
    /// data (a layered checkpoint commits nothing: its newest files may
    /// still be in the page cache, which the count does not see).
    pub(crate) fn measure_later(&self, ck_id: &str, layer: PathBuf, base_transid: u64) {
        let meta = self.meta.clone();
        let ck_id = ck_id.to_string();
        let measure = move || match sandtree_fs::bytes_written_since(&layer, base_transid) {
            Ok(size) => {
                if let Err(e) = meta.set_checkpoint_size(&ck_id, size) {
                    tracing::warn!(checkpoint = ck_id, "cannot store size: {e}");
                }
            }
            Err(e) => tracing::warn!(checkpoint = ck_id, "cannot measure size: {e}"),
        };
        // (Handing a job to the blocking pool took up to 0.4 ms, a thread
        // started: not on the checkpoint's path.)
        let flusher = self.flusher.clone();
        self.spawn_settled(async move {
            let _ = tokio::time::timeout(std::time::Duration::from_secs(30), flusher.flushed()).await;
            let _ = tokio::task::spawn_blocking(measure).await;
        });
    }

    /// Evicts process templates over the pool's budget once the engine has
    /// been idle for a moment (measuring their memory walks page tables:
    /// not in a burst of checkpoints). One run per sandbox at a time: a
    /// checkpoint made while one waits joins it, one made while it measures
    /// asks for one more run after it. (Runs started per checkpoint piled
    /// up: with a 1 GB process and a checkpoint every few hundred
    /// milliseconds, a dozen walks of seconds each ran at once, and the
    /// checkpoints beside them took 20-70 ms to stop the processes.)
    /// Drop the templates of checkpoint `ck` of sandbox `sandbox` now, as
    /// an eviction would (its next rollback restores from its durable
    /// image): for tests of that path, and for operators freeing memory.
    pub fn drop_templates(&self, sandbox: &str, ck: &str) -> Result<()> {
        if let Some(t) = self.tracer_get(sandbox) {
            tokio::task::block_in_place(|| t.drop_checkpoint(ck))
                .map_err(|e| Error::Internal(format!("dropping the templates of {ck}: {e}")))?;
        }
        Ok(())
    }

    pub(crate) fn evict_templates_later(&self, id: &str) {
        {
            let mut evicting = self.evicting.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(again) = evicting.get_mut(id) {
                *again = true;
                return;
            }
            evicting.insert(id.to_string(), false);
        }
        let Some(engine) = self.this.upgrade() else { return };
        let id = id.to_string();
        tokio::spawn(async move {
            loop {
                let deadline = Instant::now() + std::time::Duration::from_secs(5);
                while engine.flusher.idle_for() < std::time::Duration::from_millis(50) && Instant::now() < deadline {
                    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                }
                // (What a checkpoint from here on makes is not measured.)
                if let Some(again) = engine.evicting.lock().unwrap_or_else(|p| p.into_inner()).get_mut(&id) {
                    *again = false;
                }
                engine.evict_templates(&id).await;
                let mut evicting = engine.evicting.lock().unwrap_or_else(|p| p.into_inner());
                if evicting.get(&id) != Some(&true) {
                    evicting.remove(&id);
                    return;
                }
            }
        });
    }

    /// One eviction run of `id`'s templates (see [`Engine::evict_templates_later`]).
    async fn evict_templates(&self, id: &str) {
        let Some(t) = self.tracer_get(id) else { return };
        let (budget, max) = (self.cfg.template_memory_bytes, self.cfg.template_checkpoints);
        // Never the sandbox's base, nor a checkpoint whose image is still to
        // be written from its templates.
        let mut keep = self.images_pending();
        keep.extend(self.record(id).ok().and_then(|r| r.base_checkpoint));
        match tokio::task::spawn_blocking(move || t.evict_to(budget, max, &keep)).await {
            Ok(Ok(evicted)) if !evicted.is_empty() => {
                tracing::info!(sandbox = id, ?evicted, "process templates evicted")
            }
            Ok(Ok(_)) => {}
            Ok(Err(e)) => tracing::warn!(sandbox = id, "template eviction: {e}"),
            Err(e) => tracing::warn!(sandbox = id, "template eviction: {e}"),
        }
    }

    /// A process-engine failure of a checkpoint: an unsupported process is
    /// the caller's to fix (409), anything else is internal.
    pub(crate) fn process_error(&self, id: &str, e: sandtree_proc::Error) -> Error {
        match e {
            sandtree_proc::Error::Unsupported(u) => {
                Error::ProcessNotRestorable { sandbox: id.to_string(), detail: u.to_string() }
            }
            sandtree_proc::Error::StopTimeout { timeout_ms, stuck } => {
                Error::FreezeTimeout { sandbox: id.to_string(), timeout_ms, stuck }
            }
            other => Error::Process(other),
        }
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
        Ok(self.checkpoint_info(&self.checkpoint_record(id)?))
    }

    /// All checkpoints, or those of one sandbox's tree, parents first.
    pub async fn list_checkpoints(&self, sandbox: Option<&str>) -> Result<CheckpointList> {
        let tree = match sandbox {
            Some(id) => Some(self.record(id)?.tree_id),
            None => None,
        };
        let checkpoints = self.meta.checkpoints(tree.as_deref())?.iter().map(|c| self.checkpoint_info(c)).collect();
        Ok(CheckpointList { checkpoints })
    }
}

/// A checkpoint of sandbox `rec` as `req` asks for it, taken now; the
/// caller fills in its layers, timings and what it captured.
fn new_record(rec: &SandboxRecord, req: &CheckpointRequest, ck_id: &str) -> CheckpointRecord {
    CheckpointRecord {
        id: ck_id.to_string(),
        sandbox_id: rec.id.clone(),
        tree_id: rec.tree_id.clone(),
        parent: rec.base_checkpoint.clone(),
        image: rec.image.clone(),
        label: req.label.clone(),
        labels: req.labels.clone(),
        created_at: util::now_rfc3339(),
        transid: 0,
        size_bytes: None,
        frozen_ms: 0.0,
        duration_ms: 0.0,
        processes: serde_json::Value::Null,
        layer: String::new(),
        lowers: rec.lowers.clone(),
    }
}

/// Whether init may be alone in the sandbox but for the tracer's pool
/// (`pool`: their host pids; init's restack check decides; this only spares it the work when it is
/// clearly not), and every task of the cgroup lives in the sandbox's pid
/// namespace: a task that joined from outside is invisible to init's check
/// and is held only by a freeze (the snapshot path).
fn init_alone(sb: &sandtree_sandbox::Sandbox, procs: Option<&[i32]>, pool: &[HostPid]) -> bool {
    procs.is_some_and(|pids| {
        let others: Vec<i32> = pids.iter().copied().filter(|p| !pool.contains(&HostPid(*p))).collect();
        others.len() <= 1 && one_pid_namespace(sb, &others)
    })
}

/// Whether every task of `pids` (the sandbox's cgroup) lives in its pid
/// namespace (a task that joined from outside is held only by a freeze).
pub(crate) fn one_pid_namespace(sb: &sandtree_sandbox::Sandbox, pids: &[i32]) -> bool {
    let ns = |pid: i32| std::fs::read_link(format!("/proc/{pid}/ns/pid")).ok();
    let Some(own) = ns(sb.init_pid()) else { return false };
    pids.iter().all(|&p| ns(p).is_none_or(|n| n == own))
}

/// What a checkpoint record says it captured of the processes.
pub(crate) fn captured_of(c: &CheckpointRecord) -> Option<CaptureReport> {
    serde_json::from_value(c.processes.clone()).ok()
}

fn unrestorable_api(u: &Unrestorable) -> UnrestorableProcess {
    UnrestorableProcess {
        pid: u.pid.raw(),
        comm: u.comm.clone(),
        resource: u.resource.clone(),
        reason: u.reason.clone(),
    }
}

/// `process_state` explained in words, for responses.
pub(crate) fn process_note(info: &CheckpointInfo) -> String {
    let list = |v: &[UnrestorableProcess]| {
        v.iter()
            .map(|u| format!("pid {} ({}): {}: {}", u.pid, u.comm, u.resource, u.reason))
            .collect::<Vec<_>>()
            .join("; ")
    };
    match info.process_state {
        ProcessState::NotCaptured => FS_ONLY_NOTE.to_string(),
        ProcessState::Captured => format!(
            "filesystem and {} live process(es) captured: a rollback in place restores them exactly",
            info.processes.len()
        ),
        ProcessState::Partial => {
            let mut note = format!("filesystem and {} live process(es) captured", info.processes.len());
            if !info.unrestorable.is_empty() {
                note.push_str(&format!(
                    "; not restorable, so a rollback will not bring them back: {}",
                    list(&info.unrestorable)
                ));
            }
            if !info.reparented.is_empty() {
                note.push_str(&format!("; restored with a change: {}", list(&info.reparented)));
            }
            note
        }
        ProcessState::Evicted => format!(
            "filesystem captured; the process templates were evicted (pool budget or daemon restart): a rollback to it fails with processes_lost unless it passes {} (then it restores the files and restarts the sandbox with only its init)",
            sandtree_api::ALLOW_RESTART.http
        ),
    }
}

impl Engine {
    /// A checkpoint as the API shows it; `process_state` says whether the
    /// templates are still in the pool.
    pub(crate) fn checkpoint_info(&self, c: &CheckpointRecord) -> CheckpointInfo {
        // (Asked of the tracer only when there are templates to look for.)
        let in_pool =
            captured_of(c).is_some_and(|c| c.captured.is_empty()) || self.templates_of(&c.sandbox_id, &c.id).is_some();
        self.checkpoint_info_known(c, in_pool)
    }

    /// [`Engine::checkpoint_info`] when the caller knows whether the
    /// checkpoint's templates are in the pool.
    pub(crate) fn checkpoint_info_known(&self, c: &CheckpointRecord, in_pool: bool) -> CheckpointInfo {
        let captured = captured_of(c);
        let process_state = match &captured {
            None => ProcessState::NotCaptured,
            Some(cap) if !in_pool && !cap.captured.is_empty() => ProcessState::Evicted,
            Some(cap) if !cap.unrestorable.is_empty() || !cap.reparented.is_empty() => ProcessState::Partial,
            Some(_) => ProcessState::Captured,
        };
        let (processes, unrestorable, reparented) = match captured {
            Some(cap) => (
                util::raw_pids(cap.captured),
                cap.unrestorable.iter().map(unrestorable_api).collect(),
                cap.reparented.iter().map(unrestorable_api).collect(),
            ),
            None => (Vec::new(), Vec::new(), Vec::new()),
        };
        CheckpointInfo {
            id: c.id.clone(),
            sandbox_id: c.sandbox_id.clone(),
            parent: c.parent.clone(),
            label: c.label.clone(),
            labels: c.labels.clone(),
            image: c.image.clone(),
            created_at: c.created_at.clone(),
            size_bytes: c.size_bytes,
            process_state,
            processes,
            unrestorable,
            reparented,
            frozen_ms: c.frozen_ms,
            duration_ms: c.duration_ms,
            process_image: self.process_image_info(&c.id),
        }
    }
}
