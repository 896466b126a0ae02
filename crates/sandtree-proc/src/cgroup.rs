//! The pool's cgroup: the tracer's processes (templates, standbys, holders)
//! live in a child cgroup of the sandbox's (`sandtree-sandbox`'s
//! `cgroup.rs`, `<id>/pool`), so that the sandbox's own `cgroup.procs`
//! lists only the processes that run. A rollback's kill reads that list
//! instead of the pid namespace's `/proc`, where the pool's hundreds of
//! pids cost 0.3-0.7 ms; a checkpoint's stop reads it too.
//!
//! A template is cloned inside its original, a holder inside its owner:
//! both start in the sandbox's cgroup and are moved to the pool between
//! operations (`PoolPlacement::sweep`, and before a rollback's kill list
//! is taken); a standby forked from a template starts in the pool. A
//! restored process, cloned from a template or standby, is moved back
//! (`PoolCgroup::to_live`) while stopped at birth, before it runs: a
//! process left in the pool would survive the next rollback's kill. Until
//! a pool process is moved it is listed with the others, and spared all
//! the same: init's kill list excludes every pool pid the daemon names,
//! the cgroup only shortens it. [`PoolCgroup`] is the two `cgroup.procs`
//! files; `PoolPlacement`, the tracer's part, holds it and the pids moved.
//!
//! A move writes the host pid to the destination's `cgroup.procs` (one
//! write, the thread group moves; ~10 µs with cgroup2's `favordynmods`,
//! without which every move may wait for an RCU grace period: the engine
//! gives the tracer no cgroup then).

use std::collections::HashSet;
use std::fs::File;
use std::io::{self, Write};
use std::path::Path;

use crate::HostPid;

/// The open `cgroup.procs` files of the pool and of the sandbox.
#[derive(Debug)]
pub struct PoolCgroup {
    pool: File,
    live: File,
}

impl PoolCgroup {
    /// Open `cgroup.procs` of `pool_dir` and `live_dir` for writing.
    pub fn open(pool_dir: &Path, live_dir: &Path) -> io::Result<PoolCgroup> {
        let open = |dir: &Path| {
            std::fs::OpenOptions::new()
                .write(true)
                .open(dir.join("cgroup.procs"))
                .map_err(|e| io::Error::new(e.kind(), format!("{}/cgroup.procs: {e}", dir.display())))
        };
        Ok(PoolCgroup { pool: open(pool_dir)?, live: open(live_dir)? })
    }

    /// Move process `host` (host pid) into the pool.
    pub(crate) fn to_pool(&self, host: HostPid) -> io::Result<()> {
        (&self.pool).write_all(host.to_string().as_bytes())
    }

    /// Move process `host` (host pid) back into the sandbox's cgroup.
    pub(crate) fn to_live(&self, host: HostPid) -> io::Result<()> {
        (&self.live).write_all(host.to_string().as_bytes())
    }
}

/// The pool's cgroup, if it has one, and the pool processes moved there.
#[derive(Default)]
pub(crate) struct PoolPlacement {
    cgroup: Option<PoolCgroup>,
    /// Host pids moved to the pool's cgroup (or that could not be).
    moved: HashSet<HostPid>,
}

impl PoolPlacement {
    /// With `cgroup` (`None`: the pool stays in the sandbox's cgroup).
    pub(crate) fn new(cgroup: Option<PoolCgroup>) -> PoolPlacement {
        PoolPlacement { cgroup, moved: HashSet::new() }
    }

    /// The pool's cgroup.
    pub(crate) fn cgroup(&self) -> Option<&PoolCgroup> {
        self.cgroup.as_ref()
    }

    /// Move every pool process (`hosts` lists their host pids) not moved
    /// yet into the pool; returns whether any was. One that cannot be moved
    /// (gone meanwhile) is not tried again.
    pub(crate) fn sweep<I: Iterator<Item = HostPid>>(&mut self, hosts: impl Fn() -> I) -> bool {
        let Some(cg) = &self.cgroup else { return false };
        // (Called at every turn of the tracer's loop, every 0.5 ms while a
        // standby is forked: a set of the pool's hundreds of pids built each
        // time took a seventh of the tracer thread's CPU time in the bench.)
        let mut count = 0;
        if hosts().all(|h| {
            count += 1;
            self.moved.contains(&h)
        }) && count == self.moved.len()
        {
            return false;
        }
        let kept: HashSet<HostPid> = hosts().collect();
        self.moved.retain(|h| kept.contains(h));
        let mut moved = false;
        for host in kept {
            if self.moved.insert(host) {
                match cg.to_pool(host) {
                    Ok(()) => moved = true,
                    Err(e) => tracing::debug!(host = host.raw(), "pool process not moved to the pool's cgroup: {e}"),
                }
            }
        }
        moved
    }
}
