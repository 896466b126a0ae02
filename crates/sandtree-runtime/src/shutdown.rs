//! `shutdown`: the engine's part of a daemon's clean exit (SIGTERM, SIGINT).
//!
//! By default nothing of the data directory stays on the host:
//! 0. the checkpoints' process images still being written are waited for
//!    (up to [`SHUTDOWN_STEP`]): they are read from the templates that
//!    step 2 ends;
//! 1. the store lock is taken for writing and never given back: no verb and
//!    no background task (spare and next layers, squashes, deletions of
//!    layers) touches the store afterwards;
//! 2. every running sandbox is stopped (its processes, and the process
//!    templates of its checkpoints, end) and its cgroup and run directory
//!    are removed. Its row still says it should run: the next start boots
//!    it again from its filesystem, as after a host reboot (`recover.rs`:
//!    processes from before are lost, and its status says so);
//! 3. the removals of deleted sandboxes' cgroups and the measurements of
//!    new checkpoints' sizes are waited for;
//! 4. the prepared rollback targets and next layers are closed (their
//!    overlay mounts); their subvolumes stay in the image for the next
//!    start's GC;
//! 5. the zygote is stopped (its pre-cloned init holds a copy of the host's
//!    mounts, the store's included), and the idmapped host directories
//!    under `<data-dir>/run/lower` are unmounted (the next start's zygote
//!    mounts them again);
//! 6. the parent cgroup (`cgroup_name`) is removed where it is empty (it
//!    stays where another daemon's sandboxes share the name);
//! 7. the btrfs image is unmounted and its loop device waited for (the next
//!    start attaches and mounts it again, ~10 ms).
//!
//! What no daemon can remove: a process that made a mount namespace while
//! the store was mounted holds a copy of that mount, and where its
//! namespace belongs to another user namespace (a rootless container, or
//! another Sandtree daemon's pre-cloned init, which waits for its next
//! spawn with a copy of the host's mounts) the copy is locked and the
//! host's umount does not reach it. The loop device then stays bound
//! until that process lets go; the log names it, and the next start on
//! this data directory mounts the same device again.
//!
//! With `keep_sandboxes` only 1, 3 and 4 run: sandboxes keep running, and
//! with them the store's mount, its loop device, their cgroups and the
//! idmapped mounts, for the next daemon on the same data directory to
//! re-adopt with their processes (as after a SIGKILL, which cleans up
//! nothing).

use std::time::Duration;

use crate::Engine;

/// How long each waiting step of a shutdown may take.
pub const SHUTDOWN_STEP: Duration = Duration::from_secs(10);
/// How long the unmount of the store may wait for it to be free, and then
/// for its loop device to go. Our own holders are gone by then within
/// milliseconds; what holds it longer is another process's mount namespace
/// (see [`Engine::shutdown`]), which no wait here would end.
const RELEASE_WAIT: Duration = Duration::from_secs(3);

/// What a shutdown did, and what it had to leave behind.
#[derive(Debug, Default)]
pub struct ShutdownReport {
    /// Running sandboxes stopped (0 with `keep_sandboxes`).
    pub sandboxes_stopped: usize,
    /// What stays on the host, each with why and what to do.
    pub left_behind: Vec<String>,
}

impl Engine {
    /// Closes the engine for a daemon's clean exit (see the module docs).
    /// Verbs called afterwards wait forever: call it once requests have
    /// drained.
    pub async fn shutdown(&self, keep_sandboxes: bool) -> ShutdownReport {
        let mut report = ShutdownReport::default();
        // The images still being written, from the templates about to end
        // (the writers use the store: before its lock is taken).
        if !keep_sandboxes {
            self.settle_images_of(None, SHUTDOWN_STEP).await;
        }
        let Ok(store) = tokio::time::timeout(SHUTDOWN_STEP, self.store_lock.write()).await else {
            report.left_behind.push(format!(
                "an operation on the store was still running after {SHUTDOWN_STEP:?}: the store stays mounted, \
                 and the next start on this data directory reuses it"
            ));
            return report;
        };
        std::mem::forget(store);

        if !keep_sandboxes {
            let live: Vec<_> = self.live.lock().unwrap_or_else(|p| p.into_inner()).keys().cloned().collect();
            // All at once, under one bound: the exit takes as long as the
            // slowest sandbox, not the sum of them.
            let kills = live.into_iter().filter_map(|id| {
                // (Also shuts its tracer down: templates live in its pid namespace.)
                let sb = self.live_set(&id, None)?;
                Some(async move { (tokio::time::timeout(SHUTDOWN_STEP, sb.kill()).await, id) })
            });
            for (killed, id) in futures_util::future::join_all(kills).await {
                match killed {
                    Ok(Ok(())) => report.sandboxes_stopped += 1,
                    Ok(Err(e)) => {
                        report.left_behind.push(format!("sandbox {id}: {e}: gc removes it at the next start"))
                    }
                    Err(_) => report.left_behind.push(format!(
                        "sandbox {id} did not stop within {SHUTDOWN_STEP:?}: the next start kills what is left of it"
                    )),
                }
            }
        }
        let cut = self.settle(SHUTDOWN_STEP).await;
        if cut > 0 {
            report.left_behind.push(format!(
                "{cut} deleted sandboxes' cgroups were still being removed after {SHUTDOWN_STEP:?}: gc removes them at the next start"
            ));
        }
        let closed = self.spares.clear().len() + self.nexts.clear().len();
        tracing::debug!(closed, "prepared layers closed; the next start's gc deletes their subvolumes");
        if keep_sandboxes {
            // Their routers too, for the next daemon to adopt.
            let kept = std::mem::take(&mut *self.networks.lock().unwrap_or_else(|p| p.into_inner()));
            kept.values().for_each(|a| a.keep());
            return report;
        }
        if let Some(net) = &self.network {
            // (The sandboxes' routers went with their inits above.)
            tokio::task::block_in_place(|| net.shutdown());
        }

        let zygote = &self.zygote;
        tokio::task::block_in_place(|| zygote.stop());
        let host = self.cfg.host_config();
        let lower = host.lower_dir();
        if let Ok(entries) = std::fs::read_dir(&lower) {
            for e in entries.flatten() {
                let path = e.path();
                if sandtree_sandbox::overlay::is_mount_point(&path)
                    && let Err(e) = rustix::mount::unmount(&path, rustix::mount::UnmountFlags::DETACH)
                {
                    report.left_behind.push(format!("{} stays mounted: {e}", path.display()));
                }
            }
        }
        let backend = sandtree_sandbox::Backend::detect();
        for dir in sandtree_sandbox::cgroup::remove_parent(&backend, &host.cgroup_name, false) {
            report.left_behind.push(format!(
                "cgroup {} is not empty (another daemon with the same --cgroup-name?): left in place",
                dir.display()
            ));
        }
        let volume = &self.volume;
        if let Err(e) = tokio::task::block_in_place(|| volume.release(RELEASE_WAIT)) {
            report.left_behind.push(e.to_string());
        }
        report
    }
}
