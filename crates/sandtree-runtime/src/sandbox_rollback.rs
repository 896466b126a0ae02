//! `rollback`: bring a sandbox back to any checkpoint of its tree.
//!
//! Order of operations:
//! 1. the checkpoint's prepared spare (`spares.rs`), or the writable copy
//!    the checkpoint made with itself, or a new empty writable subvolume
//!    `sandboxes/<id>/<new>` stacked over the checkpoint's layers
//!    (`Config::layered`; else a writable snapshot of its layer over the
//!    layers under it). The sandbox keeps running; a failure here changes
//!    nothing. Meanwhile the tracer answers the plan (the templates, the
//!    pids to spare, templates found killed): when the checkpoint captured
//!    processes but this sandbox has no templates of them (killed from
//!    inside, evicted, lost with a stop or a daemon restart, or the
//!    checkpoint taken of another sandbox of the tree), they come from the
//!    checkpoint's durable image (step 4); when that cannot bring them
//!    back either, the rollback fails here with `ProcessesLost`, naming
//!    them, unless the request allows a restart (`allow_restart`); nothing
//!    was committed;
//! 2. commit: the sandbox row now names the new subvolume and the checkpoint
//!    as its base (a crash before this leaves the old state, after it the
//!    new one; re-adoption checks which layer a surviving init runs on);
//! 3. in place (`sandtree_sandbox::reroot`): the zygote builds the overlays
//!    of the new subvolume, init kills every other process but the process
//!    templates and swaps its root for them, keeping its namespaces, cgroup,
//!    `/proc` and `/dev`;
//!    then copy the checkpoint's `/dev/shm` files into the fresh one
//!    (`dev_shm.rs`; also after a boot instead);
//! 4. when the checkpoint has templates, bring its processes back from them
//!    (`sandtree_proc::Tracer::restore`: same pids, memory, registers, open
//!    files reopened in the new tree, cwd, session);
//!    when the sandbox is not running, or the swap or the restore fails, it
//!    is stopped and booted on the new subvolume instead; if that lost
//!    processes the checkpoint held, the rollback fails with
//!    `RollbackIncomplete` (the files are rolled back, only init runs),
//!    unless a restart was allowed (`processes: restarted`);
//! 5. delete the old writable subvolume in the background (its unsaved
//!    dirty data is dropped, never written).
//!
//! The filesystem is byte-identical to the checkpoint: the new writable layer
//! is empty over the checkpoint's layers (or is a copy of its top one), and
//! no layer is written once a checkpoint names it.

use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::time::Instant;

use sandtree_api::{ProcessOutcome, RollbackRequest, RollbackResponse};
use sandtree_meta::{DesiredState, SandboxRecord};
use sandtree_sandbox::Sandbox;

use crate::{Engine, Error, Result, util};

pub(crate) const RESTART_NOTE: &str = "filesystem restored exactly; every process but the sandbox init was killed";

impl Engine {
    pub async fn rollback(&self, id: &str, req: RollbackRequest) -> Result<RollbackResponse> {
        let t0 = Instant::now();
        let _busy = self.flusher.busy();
        let _lock = self.lock_sandbox(id).await;
        let mut tracer = self.tracer_get(id);
        // No standby forks while init's kill list and the restore are in
        // flight (a standby made after the list was taken would be killed).
        let _op = tracer.as_ref().map(|t| t.begin());
        // The checkpoint's templates, and the pids init spares: asked of
        // the tracer thread first, answered while the rows are read and the
        // layer is taken (the rows took ~0.1 ms). Asked for
        // an id that is then refused, it only did the tracer's housekeeping.
        let plan = tracer
            .as_ref()
            .filter(|_| util::is_valid_id("ck", &req.checkpoint))
            .map(|t| t.rollback_plan(&req.checkpoint));
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
        // Its layers stay until the sandbox's row names them, even if the
        // checkpoint is deleted meanwhile (read again once pinned).
        let _pinned = self.pin_layers(ck.stack());
        let ck = self.checkpoint_record(&ck.id)?;
        let spare_taken = self.spares.take(id, &ck.id);
        let spare = spare_taken.is_some();
        let (new, prepared) = match spare_taken {
            Some(spare) => (spare.top, Some(spare.layers)),
            None => (self.rollback_layer(id, &ck).await?, None),
        };
        let t_snap = t0.elapsed();
        let captured = crate::sandbox_checkpoint::captured_of(&ck);
        // (A tracer gone means no templates.)
        let sandtree_proc::RollbackPlan { templates, keep, killed } = match plan {
            Some(Ok(started)) => crate::engine::block(|| started.wait()).unwrap_or_default(),
            _ => Default::default(),
        };
        let t_plan = t0.elapsed();
        // The processes this rollback must bring back: those the checkpoint
        // captured of this sandbox. Without their templates it could only
        // restart the sandbox: refused, before anything is committed,
        // unless the request allows it.
        let wanted = wanted_processes(captured.as_ref());
        // Without templates, from the checkpoint's durable image: once the
        // sandbox runs on the checkpoint's tree, the templates are made
        // again from it (`sandtree_proc::durable`), then restored as usual.
        let image = match !wanted.is_empty() && templates.is_none() {
            true => Some(self.image_restorable(&ck.id)),
            false => None,
        };
        let from_image = matches!(image, Some(Ok(_)));
        // (A sandbox re-adopted or booted by this daemon has no tracer
        // until its first checkpoint: the restore from the image needs one.)
        // (Assigned, not shadowed: this handle must drop after `_op`, whose
        // guard holds a sender of the thread's channel; the last handle's
        // drop joins the thread, which waits for every sender to go.)
        if tracer.is_none() && from_image {
            tracer = self.tracer(id).ok();
        }
        if let Some(Err(why)) = &image
            && !req.allow_restart
        {
            drop(prepared);
            self.discard_subvol_later(&new.subvol);
            return Err(Error::ProcessesLost {
                sandbox: id.to_string(),
                checkpoint: ck.id,
                processes: wanted.join(", "),
                reason: format!("{}; {why}", lost_reason(&killed, tracer.is_some())),
            });
        }
        let res = self.meta.set_sandbox_subvol(id, &new.subvol, &new.lowers, Some(&ck.id), new.base_transid);
        if let Err(e) = res {
            drop(prepared);
            self.discard_subvol_later(&new.subvol);
            return Err(e.into());
        }
        let t_meta = t0.elapsed();
        // From here on nothing may fail before the sandbox runs on the new
        // layer (the daemon runs lifecycle verbs detached from the request,
        // so a client that goes away does not stop it half-way either).
        let mut rec2 = rec.clone();
        rec2.subvol = new.subvol;
        rec2.lowers = new.lowers;
        rec2.base_checkpoint = Some(ck.id.clone());
        rec2.base_transid = new.base_transid;
        let ck_layer = self.volume.root().join(&ck.layer);
        let mut restored: Option<sandtree_proc::RestoreReport> = None;
        let mut restart_reason: Option<String> = None;
        let booted = match self.live_get(id).filter(|s| s.is_alive()) {
            Some(sb) => {
                // (The pids the restore brings back: their sessions and
                // background entries stay. From the image, every captured
                // process's.)
                let restore: Vec<i32> = match (&templates, &captured) {
                    (Some(s), _) => s.pids.iter().map(|p| p.raw()).collect(),
                    (None, Some(c)) if from_image => c.captured.iter().map(|p| p.raw()).collect(),
                    _ => Vec::new(),
                };
                let in_place = async {
                    let t_reroot = Instant::now();
                    self.reroot(&sb, &rec2, prepared, util::raw_pids(keep), restore).await?;
                    // The checkpoint's `/dev/shm` before any process runs.
                    crate::dev_shm::load(sb.init_pid(), &ck_layer)?;
                    let t_restore = Instant::now();
                    // The killed processes die in the background of the swap
                    // and the restore; none may show once the rollback
                    // returns. Init waits for them while the restore runs.
                    let waiting = {
                        let sb = sb.clone();
                        tokio::spawn(async move { sb.wait_gone().await })
                    };
                    // The checkpoint's SysV IPC objects, once the killed
                    // processes are gone (an exit undoes its `SEM_UNDO`
                    // operations, and detaches its segments), when it has
                    // any or the sandbox has.
                    let mut waiting = Some(waiting);
                    if crate::sysv_ipc::in_use(&*self.ipc_probe(id, sb.init_pid())?, &ck_layer)? {
                        if let Some(w) = waiting.take() {
                            w.await
                                .map_err(|e| Error::Internal(format!("waiting for the killed processes: {e}")))??;
                        }
                        crate::sysv_ipc::load(sb.init_pid(), self.sandbox_root_ids(), &ck_layer)?;
                    }
                    if from_image && tracer.is_none() {
                        return Err(Error::Internal("no tracer to restore the processes from the image".into()));
                    }
                    if let (Some(t), true) = (&tracer, templates.is_some() || from_image) {
                        restored = Some(self.restore_processes(&sb, t, &ck.id, from_image)?);
                    } else if captured.as_ref().is_some_and(|c| c.captured.is_empty() && c.reparented.is_empty()) {
                        // Only init ran at the checkpoint (of any sandbox of
                        // the tree): with the others killed, that is exact.
                        restored = Some(sandtree_proc::RestoreReport::default());
                    }
                    let t_wait = Instant::now();
                    if let Some(w) = waiting {
                        w.await.map_err(|e| Error::Internal(format!("waiting for the killed processes: {e}")))??;
                    }
                    tracing::debug!(sandbox = id, waited = ?t_wait.elapsed(), "killed processes gone");
                    // Init detaches the old tree at its next request: this
                    // one, not awaited (during the restore, the detach's
                    // teardown slowed the first restored process by 0.1-0.3
                    // ms; alternating in one run, rollback p50 2.50 / 2.64,
                    // 2.55 / 2.62 and 2.92 / 3.03 ms with / without).
                    {
                        let sb = sb.clone();
                        tokio::spawn(async move { sb.ping().await });
                    }
                    // The killed processes' memory, kept by their holders so
                    // that they died at once, is torn down from now on (the
                    // tracer does it after the reply; not waited for).
                    if let Some(t) = &tracer {
                        let _ = t.retire_holders();
                    }
                    tracing::debug!(
                        sandbox = id,
                        reroot = ?t_restore.duration_since(t_reroot),
                        restore = ?t_restore.elapsed(),
                        "in place"
                    );
                    Ok::<(), Error>(())
                };
                match in_place.await {
                    Ok(()) => Ok(()),
                    Err(e) => {
                        tracing::warn!(sandbox = id, "rollback in place failed, restarting the sandbox: {e}");
                        restored = None;
                        restart_reason =
                            Some(format!("the rollback in place failed ({e}), so the sandbox was restarted"));
                        self.restart_onto(&rec2, &ck_layer).await
                    }
                }
            }
            None => {
                drop(prepared); // its mounts must be gone before boot mounts the same directories
                let booted = self.restart_onto(&rec2, &ck_layer).await;
                // (A stopped sandbox's processes, from the image once it
                // runs again with only its init.)
                if booted.is_ok() && from_image {
                    let restore = || -> Result<sandtree_proc::RestoreReport> {
                        let sb =
                            self.live_get(id).ok_or_else(|| Error::Internal(format!("sandbox {id} is not running")))?;
                        self.restore_processes(&sb, &*self.tracer(id)?, &ck.id, true)
                    };
                    match restore() {
                        Ok(r) => restored = Some(r),
                        Err(e) => {
                            tracing::warn!(sandbox = id, "restore from the image after a boot failed: {e}");
                            restart_reason = Some(format!("the restore from its image failed ({e})"));
                            self.restart_onto(&rec2, &ck_layer).await?;
                        }
                    }
                }
                booted
            }
        };
        tracing::debug!(sandbox = id, layer = ?t_snap, committed = ?t_meta, planned = ?t_plan, done = ?t0.elapsed(), spare, "rolled back");
        match &booted {
            // Unreferenced from here on; deleting it soon also drops its
            // dirty page cache before the background flusher would write it.
            Ok(()) => {
                self.discard_subvol_later(&rec.subvol);
                self.discard_layers_if_unused(
                    rec.lowers.iter().filter(|l| !rec2.lowers.contains(l)).cloned().collect(),
                );
                // (Deep only if the checkpoint was: its own squash, or the
                // next checkpoint's, catches up.)
                if rec2.lowers.len() >= self.cfg.max_layers / 2 {
                    self.squash_later(id, &rec2.lowers);
                }
                self.want_next(id);
            }
            // Tasks that would not die may still use it: GC removes it later.
            Err(e) => tracing::warn!(sandbox = id, layer = rec.subvol, "old layer left for gc: {e}"),
        }
        let reason = match &booted {
            Ok(()) => None,
            Err(e) => Some(format!("rolled back, but its processes failed to start: {e}")),
        };
        // Usually unchanged (running, no reason): no write then.
        if rec.state != DesiredState::Running || rec.status_reason != reason {
            self.meta.set_sandbox_state(id, DesiredState::Running, reason.as_deref())?;
        }
        rec2.status_reason = reason;
        booted?;
        if let Some(reason) = &restart_reason
            && !wanted.is_empty()
            && !req.allow_restart
        {
            return Err(Error::RollbackIncomplete {
                sandbox: id.to_string(),
                checkpoint: ck.id,
                processes: wanted.join(", "),
                reason: reason.clone(),
            });
        }
        // Templates made from an image are whole copies (not shared with
        // their originals): the pool is brought back within its budget.
        if from_image && restored.is_some() {
            self.evict_templates_later(id);
        }
        // Rolled back once, likely again (tree search): prepare the next one.
        self.spares.want(id, &ck.id, restored.as_ref().is_some_and(|r| !r.restored.is_empty()));
        let processes = match (&restored, &restart_reason) {
            (Some(r), _) if !r.restored.is_empty() => ProcessOutcome::Restored,
            _ if wanted.is_empty() => ProcessOutcome::NoneCaptured,
            _ => ProcessOutcome::Restarted,
        };
        let note = match (&restored, &restart_reason) {
            (Some(r), _) => {
                let mut note = format!(
                    "filesystem and {} process(es) restored exactly in place (pids {:?})",
                    r.restored.len(),
                    r.restored
                );
                if from_image && ck.sandbox_id != id {
                    note.push_str(&format!(
                        "; from the checkpoint's durable process image (it was taken of sandbox {})",
                        ck.sandbox_id
                    ));
                } else if from_image {
                    note.push_str(&format!(
                        "; from the checkpoint's durable process image, its templates being gone ({})",
                        lost_reason(&killed, true)
                    ));
                }
                if let Some(cap) = &captured
                    && !cap.unrestorable.is_empty()
                {
                    let names: Vec<String> =
                        cap.unrestorable.iter().map(|u| format!("{} ({})", u.pid, u.comm)).collect();
                    note.push_str(&format!("; not restorable, so not running: {}", names.join(", ")));
                }
                if let Some(cap) = &captured
                    && !cap.reparented.is_empty()
                {
                    let names: Vec<String> = cap.reparented.iter().map(|u| format!("{} ({})", u.pid, u.comm)).collect();
                    note.push_str(&format!(
                        "; restored as children of init in sessions of their own: {}",
                        names.join(", ")
                    ));
                }
                if !r.evicted.is_empty() {
                    note.push_str(&format!(
                        "; the templates of checkpoint(s) {} held needed pids and were evicted",
                        r.evicted.join(", ")
                    ));
                }
                note
            }
            (None, Some(reason)) => format!("{RESTART_NOTE}: {reason}"),
            (None, None) if captured.is_none() => {
                format!(
                    "{RESTART_NOTE}: this checkpoint holds no process state (the sandbox was not running when it was taken)"
                )
            }
            (None, None) => format!("{RESTART_NOTE}, as allowed: {}", lost_reason(&killed, tracer.is_some())),
        };
        tracing::debug!(sandbox = id, returned = ?t0.elapsed(), "rollback returns");
        Ok(RollbackResponse {
            sandbox: self.sandbox_info(&rec2, false)?,
            checkpoint: ck.id,
            processes,
            processes_restarted: processes == ProcessOutcome::Restarted,
            restored_from: restored.as_ref().filter(|r| !r.restored.is_empty()).map(|_| match from_image {
                true => sandtree_api::RestoreSource::Image,
                false => sandtree_api::RestoreSource::Templates,
            }),
            connections_reset: restored.as_ref().map(|r| r.connections_reset.clone()).unwrap_or_default(),
            restored_pids: restored.map(|r| util::raw_pids(r.restored)).unwrap_or_default(),
            note,
            duration_ms: util::ms_since(t0),
        })
    }

    /// Whether `ck`'s processes can come back from its durable image
    /// (`Ok`: the memory they hold, in bytes), or why not (checked before
    /// anything is killed: the image and those it reads from open and
    /// check, and nothing in it is refused). An image still being written
    /// is not waited for: with the templates gone, its writer fails too.
    pub(crate) fn image_restorable(&self, ck: &str) -> std::result::Result<u64, String> {
        use sandtree_api::ImageState;
        match self.process_image_info(ck) {
            None => return Err("it has no durable process image".into()),
            Some(i) if i.state == ImageState::Writing => {
                return Err("its durable process image was still being written".into());
            }
            Some(i) if i.state == ImageState::Failed => {
                let error = i.error.unwrap_or_default();
                return Err(format!("its durable process image could not be written ({error})"));
            }
            Some(_) => {}
        }
        let dir = self.process_images_dir();
        tokio::task::block_in_place(|| sandtree_proc::durable::restorable(&dir, ck))
            .map_err(|e| format!("its durable process image cannot bring them back: {e}"))
    }

    /// The processes of `ck` brought back in sandbox `sb` (`t`, its
    /// tracer), which runs on the checkpoint's tree: from its templates,
    /// made again first from its durable image when `from_image`.
    pub(crate) fn restore_processes(
        &self,
        sb: &Arc<Sandbox>,
        t: &sandtree_proc::Tracer,
        ck: &str,
        from_image: bool,
    ) -> Result<sandtree_proc::RestoreReport> {
        if from_image {
            self.templates_from_image(sb, t, ck)?;
            // A sandbox just booted (a fork, a stopped one) gives its next
            // pids from 2 up: a process the restore makes by a plain clone
            // (a restored process's memory holder) would take a pid it is
            // to bring back (a process's, or one of its threads'). They
            // are given from the middle of the range up, where the engine
            // parks `ns_last_pid` after a clone at a chosen pid
            // (`process::park`), or above the highest pid captured.
            let top = crate::sandbox_checkpoint::captured_of(&self.checkpoint_record(ck)?)
                .and_then(|c| c.captured.iter().map(|p| p.raw()).max())
                .unwrap_or(0);
            let park = (sandtree_proc::SandboxPid::max() / 2).max(top);
            let handle = tokio::runtime::Handle::current();
            tokio::task::block_in_place(|| handle.block_on(sb.set_last_pid(park)))?;
        }
        let last_pid = last_pid_of(sb);
        let r = tokio::task::block_in_place(|| t.restore(ck, Some(last_pid)))?;
        sb.resume_restored_io();
        Ok(r)
    }

    /// The templates of `ck` made again from its durable image in sandbox
    /// `sb` (`t`, its tracer), which runs on the checkpoint's tree: the
    /// output pipes the sandbox handle reads given to the processes that
    /// had them, and the pipes made anew whose reader was the daemon read
    /// from now on.
    fn templates_from_image(&self, sb: &Arc<Sandbox>, t: &sandtree_proc::Tracer, ck: &str) -> Result<()> {
        let images = self.process_images_dir();
        let init = sandtree_proc::HostPid(sb.init_pid());
        let known = sb.output_pipes();
        let outputs = tokio::task::block_in_place(|| t.templates_from_image(ck, (&images, init), known))
            .map_err(|e| image_error(ck, e))?;
        sb.adopt_outputs(outputs);
        Ok(())
    }

    /// Steps 3 of the rollback, in place: overlays from the zygote, then init
    /// swaps its root.
    async fn reroot(
        &self,
        sb: &Arc<Sandbox>,
        rec: &SandboxRecord,
        prepared: Option<Vec<OwnedFd>>,
        keep: Vec<i32>,
        restore: Vec<i32>,
    ) -> Result<()> {
        let spec = self.spec(rec)?;
        let t0 = Instant::now();
        // Connections to the outside end with a reset their peers see, not
        // with the close of a killed process.
        let init = sandtree_proc::HostPid(sb.init_pid());
        match tokio::task::block_in_place(|| sandtree_proc::reset_outside_connections(init)) {
            Ok(reset) if !reset.is_empty() => tracing::debug!(sandbox = rec.id, ?reset, "outside connections reset"),
            Ok(_) => {}
            Err(e) => tracing::warn!(sandbox = rec.id, "cannot reset the connections to the outside: {e}"),
        }
        let t_outside = t0.elapsed();
        let (fds, t_kill, t_layers) = match prepared {
            // Layers ready: one request kills and swaps.
            Some(fds) => (fds, Default::default(), Default::default()),
            None => {
                // The old processes die (a large one takes milliseconds to
                // tear down) while the zygote builds the new layers.
                let kill = async {
                    let r = sb.kill_all(keep.clone(), restore.clone()).await;
                    (r, t0.elapsed())
                };
                let layers = async {
                    let r = self.build_layers(spec.layers.clone()).await;
                    (r, t0.elapsed())
                };
                let ((killed, t_kill), (fds, t_layers)) = tokio::join!(kill, layers);
                let fds = fds?;
                killed?;
                (fds, t_kill, t_layers)
            }
        };
        sb.reroot(spec.layers.into_iter().map(|l| l.target).collect(), fds, keep, restore).await?;
        tracing::debug!(sandbox = rec.id, ?t_outside, ?t_kill, ?t_layers, swapped = ?t0.elapsed(), "reroot");
        Ok(())
    }

    /// Stop (if running) and boot again on the sandbox's current subvolume.
    pub(crate) async fn restart(&self, rec: &SandboxRecord) -> Result<()> {
        self.halt(&rec.id).await?;
        self.boot(rec).await.map(|_| ())
    }

    /// Stop (if running) and boot again on the sandbox's current subvolume,
    /// with the `/dev/shm` of the checkpoint whose layer is `layer`.
    async fn restart_onto(&self, rec: &SandboxRecord, layer: &std::path::Path) -> Result<()> {
        self.halt(&rec.id).await?;
        let sb = self.boot(rec).await?;
        crate::dev_shm::load(sb.init_pid(), layer)?;
        if crate::sysv_ipc::saved_in(layer) {
            crate::sysv_ipc::load(sb.init_pid(), self.sandbox_root_ids(), layer)?;
        }
        Ok(())
    }

    /// Deletes an unreferenced writable subvolume later, when the engine is
    /// idle (see `reaper.rs`).
    pub(crate) fn discard_subvol_later(&self, subvol: &str) {
        self.reaper.discard(self.subvol_path(subvol), false);
    }
}

/// `pid (comm)` of each process a rollback to (or a fork of) the checkpoint
/// must bring back: those it captured (of whichever sandbox of the tree:
/// from another sandbox, they come from the checkpoint's image).
pub(crate) fn wanted_processes(captured: Option<&sandtree_proc::CaptureReport>) -> Vec<String> {
    match captured {
        Some(c) => c
            .captured
            .iter()
            .map(|pid| match c.comms.get(pid) {
                Some(comm) => format!("{pid} ({comm})"),
                None => format!("pid {pid}"),
            })
            .collect(),
        _ => Vec::new(),
    }
}

/// Why a checkpoint's templates are gone (`running`: the sandbox has a
/// tracer, so they were not lost with its processes).
fn lost_reason(killed: &[sandtree_proc::Unrestorable], running: bool) -> String {
    if !running {
        "their copies lived in the sandbox's processes, which were stopped (or lost when the daemon restarted)"
            .to_string()
    } else if killed.is_empty() {
        "their copies are gone (evicted from the process pool by its memory budget, or lost when the daemon restarted)"
            .to_string()
    } else {
        let each: Vec<String> = killed.iter().map(|k| format!("pid {} ({}): {}", k.pid, k.comm, k.reason)).collect();
        each.join("; ")
    }
}

/// How the restore sets sandbox `sb`'s `ns_last_pid` (for a process that
/// may not choose its pid): a request to its init, made from the tracer's
/// thread, which is not one of the runtime's.
fn last_pid_of(sb: &Arc<Sandbox>) -> sandtree_proc::LastPid {
    let (sb, handle) = (sb.clone(), tokio::runtime::Handle::current());
    Box::new(move |pid| handle.block_on(sb.set_last_pid(pid.raw())).map_err(std::io::Error::other))
}

/// A failure to make `ck`'s templates again from its image, naming the
/// checkpoint (the rollback then fails with `rollback_incomplete`, or
/// restarts the sandbox as allowed).
fn image_error(ck: &str, e: sandtree_proc::Error) -> Error {
    Error::Internal(format!("restoring checkpoint {ck} from its durable process image: {e}"))
}
