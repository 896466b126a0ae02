//! A layered checkpoint of a sandbox whose processes run: no btrfs
//! snapshot, no commit, no sync on its path.
//!
//! Order (the frozen window is steps 2-7):
//! 1. the next layer (an empty subvolume stacked over the current one, and
//!    its overlay mounts), prepared ahead (`next_layers.rs`) or built now,
//!    before anything stops;
//! 2. stop every process but init with ptrace; init runs: it swaps the
//!    tree;
//! 3. the templates are copied (the largest on the other CPU; the tracer
//!    goes from 2 to 3 in one job, `sandtree_proc::Tracer::stop_and_clone`),
//!    and meanwhile:
//! 4. init checks that the sandbox mounted nothing (every process is held:
//!    stopped, none skipped, no spawn, the templates being made are ours),
//!    and mounts the new tree at a staging point (`Sandbox::stage`) — when
//!    the processes could move last time; otherwise after step 5 passed;
//! 5. at the end of the copy, in the same job, the tracer checks whether
//!    the processes can move to a new tree (`sandtree_proc::repoint`'s
//!    step 1, on what the copy read: no deleted file, named pipe or bound
//!    socket of the tree open, no inotify watch, no file of the writable
//!    layer mapped shared...), then waits for the staging point and
//! 6. each process opens its files of the tree again through it and
//!    `chdir`s there (`Cloning::finish`: no round trip to this thread
//!    between 3 and 6) — every process but the largest already while the
//!    largest one's copy runs, when the tree is staged by then (it is
//!    checked again with the largest at the end);
//! 7. init moves the staged tree to `/` and detaches the old one
//!    (`Sandbox::swap_staged`: the frozen layer is the checkpoint's from
//!    here; a `..` reaching `/` would cross into the old root while it
//!    stays on top of the new one); then in one tracer job
//!    (`Copied::finish_and_go`) each process puts its new descriptors in
//!    place (its cwd moved with the staged tree), every process runs
//!    again, and
//! 8. the templates' images and checks (pass 2; their paths were read in
//!    step 3, before the old tree was detached); the row is committed with
//!    the sandbox's new stack.
//!
//! No process starts from step 2 to 7 (`Sandbox::hold_spawns`): init runs,
//! and a process it started then would live in the old tree.
//!
//! A refusal at 4-6 changes nothing that a process could see: the staged
//! tree is detached, the new descriptors closed, and the checkpoint is the
//! btrfs snapshot of the stopped sandbox (`commit_snapshot`). A failure
//! after 7's swap (which leaves the tree in an unknown state) restarts the
//! sandbox, as a failed rollback does.

use std::time::Instant;

use sandtree_api::{CheckpointRequest, CheckpointResponse};
use sandtree_meta::SandboxRecord;
use sandtree_proc::{HostPid, Tracer};
use sandtree_sandbox::Sandbox;

use crate::engine::block;
use crate::{Engine, Error, Result, util};

impl Engine {
    /// See the module docs. `None`: nothing was stopped (tasks from outside
    /// the sandbox's pid namespace, which only a freeze holds): take the
    /// snapshot path. `procs`: the sandbox cgroup's tasks, as the caller
    /// read them; `pool`: host pids of the tracer's own processes.
    pub(crate) async fn checkpoint_live_layered(
        &self,
        rec: &SandboxRecord,
        sb: &std::sync::Arc<Sandbox>,
        (procs, pool): (Option<&[i32]>, &[HostPid]),
        ck_id: &str,
        req: &CheckpointRequest,
        t0: Instant,
    ) -> Result<Option<CheckpointResponse>> {
        let id = rec.id.as_str();
        // (The pool's processes are the tracer's own: not read again; with
        // a pool of 100 it would take a millisecond.)
        let ours = |p: &i32| !pool.contains(&HostPid(*p));
        let pids = procs.map(|pids| pids.iter().copied().filter(ours).collect::<Vec<_>>());
        if !pids.is_some_and(|pids| crate::sandbox_checkpoint::one_pid_namespace(sb, &pids)) {
            return Ok(None);
        }
        let tracer = self.tracer(id)?;
        let _op = tracer.begin();
        let targets: Vec<std::path::PathBuf> =
            self.image_layers(&rec.image)?.iter().map(|l| std::path::PathBuf::from(&l.target)).collect();
        let t_next = Instant::now();
        let (top, fds) = self.take_next(rec).await?;
        let t_next = t_next.elapsed();
        let best_effort = req.best_effort;

        // Unused (nothing was stopped, or the checkpoint is a snapshot):
        // the sandbox goes on writing to the subvolume it stacks on.
        let put_back = |top: crate::engine::LayerStack, layers| {
            let next = crate::next_layers::Next { over: rec.subvol.clone(), top, layers };
            if let Some(old) = self.nexts.put_back(id, next) {
                self.discard_subvol_later(&old);
            }
        };
        // No process starts while init runs beside the stopped ones (it
        // would start in the old tree, or miss the snapshot).
        let spawns = sb.hold_spawns().await;
        let t_stop = Instant::now();
        let cg = sb.cgroup().clone();
        // The stop's first list is the caller's, read a moment ago (on a
        // sandbox with a large template pool a read takes ~0.5 µs per
        // task); the stop lists again until no process is new.
        let first = std::sync::Mutex::new(procs.map(|p| p.iter().copied().map(HostPid).collect::<Vec<_>>()));
        let list = Box::new(move || match first.lock().unwrap_or_else(|e| e.into_inner()).take() {
            Some(pids) => Ok(pids),
            None => cg.procs().map(|pids| pids.into_iter().map(HostPid).collect()).map_err(std::io::Error::other),
        });
        // Step 5's check runs on the tracer thread at the end of the copy,
        // on what pass 1 read (the layers' upper directories: where a file
        // mapped shared would be the writable layer's).
        let tree = sandtree_proc::repoint::Tree {
            init_host: HostPid(sb.init_pid()),
            uppers: targets
                .iter()
                .enumerate()
                .map(|(i, t)| {
                    let upper = self.subvol_path(&rec.subvol).join("layers").join(i.to_string()).join("upper");
                    (t.to_string_lossy().into_owned(), upper)
                })
                .collect(),
        };
        let stopped = block(|| {
            tracer.stop_and_clone(list, HostPid(sb.init_pid()), (best_effort, self.freeze_timeout()), Some(tree))
        });
        let (stop, cloning) = match stopped {
            Ok(sandtree_proc::StopAndClone { report, cloning: Some(c), .. }) => (report, c),
            Ok(_) => {
                // Tasks from outside the pid namespace: nothing was copied
                // (the processes went when the stop was dropped).
                put_back(top, fds);
                return Ok(None);
            }
            Err(e) => {
                put_back(top, fds);
                return Err(self.process_error(id, e));
            }
        };
        // Nothing writes to `/dev/shm` now: its files into the layer.
        // (Likewise the SysV IPC objects.)
        let shm = self.save_namespace_state(id, sb.init_pid(), &self.subvol_path(&rec.subvol));
        // Steps 3-5: the templates are being copied (the largest on the
        // other CPU) and checked while init stages the new tree (checking
        // only the mounts: every process is held, and the templates
        // appearing meanwhile are ours) — when the processes could move
        // last time; otherwise only once the check passed (a staged tree
        // that is not used costs the next layer).
        let t_stage = Instant::now();
        let mut fds = Some(fds);
        let staged = match stop.skipped.is_empty()
            && (tracer.moved_last() || matches!(block(|| cloning.checked()), Some(Ok(()))))
        {
            true => Some(sb.stage(targets.clone(), fds.take().unwrap_or_default()).await),
            false => None,
        };
        let t_stage = t_stage.elapsed();
        // Step 6 on the tracer thread, in the copy's job, once the tree is
        // staged. (On error the processes were let go.)
        let stage = matches!(staged, Some(Ok(()))).then_some(sandtree_sandbox::reroot::STAGE);
        let cloned = block(|| cloning.finish(stage)).map_err(|e| self.process_error(id, e));
        let t_cloned = Instant::now();
        // Not staged: the next layer is as good as before.
        let unused = |top, fds: Option<Vec<std::os::fd::OwnedFd>>| match fds {
            Some(fds) => put_back(top, fds),
            None => self.discard_subvol_later(&top.subvol),
        };
        let copied = match cloned {
            Ok(copied) => copied,
            Err(e) => {
                if staged.is_some() {
                    let _ = sb.unstage().await;
                }
                unused(top, fds);
                return Err(e);
            }
        };
        if let Err(e) = shm {
            if staged.is_some() {
                let _ = sb.unstage().await;
            }
            if let Err(a) = block(|| copied.abort()) {
                tracing::warn!(sandbox = id, "the stopped processes could not be let go: {a}");
            }
            unused(top, fds);
            return Err(e);
        }
        let movable = match copied.movable.clone() {
            _ if !stop.skipped.is_empty() => Err("a process was left running (best effort)".to_string()),
            Some(m) => m,
            // In best effort, a process that cannot be restored (or whose
            // template died) was let go: it runs on the old tree.
            None => Err("a process was let go (best effort)".to_string()),
        };
        let moved = match (movable, staged) {
            (Ok(()), Some(Ok(()))) => Ok(()),
            (_, Some(Err(sandtree_sandbox::Error::Busy(why)))) => Err(why),
            (Err(why), Some(_)) => {
                let _ = sb.unstage().await;
                Err(why)
            }
            (Ok(()), Some(Err(e))) => {
                let _ = sb.unstage().await;
                Err(format!("staging failed: {e}"))
            }
            (Err(why), None) => Err(why),
            (Ok(()), None) => Err("not staged".to_string()),
        };
        if let Err(why) = moved {
            tracing::debug!(sandbox = id, "no layered checkpoint: {why}");
            unused(top, fds);
            let captured = copied.into_captured();
            return self
                .snapshot_stopped(rec, req, ck_id, (&tracer, captured), (t0, t_stop), stop.skipped)
                .await
                .map(Some);
        }
        let (fresh, lowers) = (top.subvol, top.lowers);

        // Step 7: from the swap on, the tree is the new one. Then, in one
        // tracer job: the descriptors put in place, every process let go,
        // pass 2.
        let t_swap = Instant::now();
        let mut t_swapped = t_swap;
        let went = match sb.swap_staged().await {
            Ok(()) => {
                t_swapped = Instant::now();
                block(|| copied.finish_and_go(ck_id, best_effort)).map_err(Error::from)
            }
            Err(e) => {
                if let Err(a) = block(|| copied.abort()) {
                    tracing::warn!(sandbox = id, "the stopped processes could not be let go: {a}");
                }
                Err(e.into())
            }
        };
        let went = match went {
            Ok(w) => w,
            Err(e) => {
                // (Every process was let go by then.)
                tracing::warn!(sandbox = id, "layered checkpoint failed part-way, restarting the sandbox: {e}");
                self.discard_subvol_later(&fresh);
                let _ = self.restart(rec).await;
                return Err(e);
            }
        };
        drop(spawns);
        let frozen_ms = went.at.duration_since(t_stop).as_secs_f64() * 1e3;
        let captured = match went.set_up {
            Ok(mut c) => {
                c.unrestorable.extend(stop.skipped);
                c
            }
            Err(e) => {
                // No checkpoint, but the sandbox stands on the new layer.
                let (base, transid) = (rec.base_checkpoint.as_deref(), rec.base_transid);
                if let Err(m) = self.meta.set_sandbox_subvol(id, &fresh, &lowers, base, transid) {
                    tracing::warn!(sandbox = id, "new layer not recorded, restarting the sandbox on its layer: {m}");
                    let _ = self.restart(rec).await;
                    self.discard_subvol_later(&fresh);
                }
                self.want_next(id);
                return Err(self.process_error(id, e));
            }
        };

        let t_set_up = went.at.elapsed();
        let t_commit = Instant::now();
        let done =
            self.commit_layered(rec, req, ck_id, (fresh, lowers), frozen_ms, captured, t0, Some(&tracer)).await?;
        tracing::debug!(
            sandbox = id,
            before_stop = ?t_stop.duration_since(t0),
            ?t_next,
            stop_clone = ?t_cloned.duration_since(t_stop),
            ?t_stage,
            open = ?t_swap.duration_since(t_cloned),
            swap_finish = ?went.at.duration_since(t_swap),
            swap = ?t_swapped.duration_since(t_swap),
            frozen_ms,
            set_up = ?t_set_up,
            commit = ?t_commit.elapsed(),
            at = ?t0.elapsed(),
            "layered checkpoint with processes done"
        );
        Ok(Some(done))
    }

    /// The fallback of [`Engine::checkpoint_live_layered`]: every process is
    /// stopped and has its template (init runs, but only does what the
    /// daemon asks): snapshot the layer as it is, let them go, set up.
    async fn snapshot_stopped(
        &self,
        rec: &SandboxRecord,
        req: &CheckpointRequest,
        ck_id: &str,
        (tracer, captured): (&Tracer, sandtree_proc::Captured<'_>),
        (t0, t_stop): (Instant, Instant),
        skipped: Vec<sandtree_proc::Unrestorable>,
    ) -> Result<CheckpointResponse> {
        let id = rec.id.as_str();
        let (src, dst) = (self.subvol_path(&rec.subvol), self.checkpoint_path(ck_id));
        if let Err(e) = block(|| sandtree_fs::snapshot(&src, &dst, true)) {
            // (Dropped: the processes go, their templates are dropped.)
            drop(captured);
            return Err(Error::fs("checkpoint", e));
        }
        let released = block(|| captured.release()).map_err(Error::from);
        let frozen_ms = util::ms_since(t_stop);
        let captured =
            released.and_then(|r| block(|| r.set_up(ck_id, req.best_effort)).map_err(|e| self.process_error(id, e)));
        let captured = match captured {
            Ok(mut c) => {
                c.unrestorable.extend(skipped);
                c
            }
            Err(e) => {
                let _ = block(|| sandtree_fs::delete_subvolume(&dst));
                return Err(e);
            }
        };
        self.commit_snapshot(rec, req, ck_id, frozen_ms, Some(captured), t0, Some(tracer), None)
    }
}
