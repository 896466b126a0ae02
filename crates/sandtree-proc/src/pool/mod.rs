//! The template pool of one sandbox: the templates of each checkpoint
//! ([`CheckpointTemplates`]), with what they need between operations —
//! their set-up and pages to write (`pending.rs`), their standbys
//! (`standbys.rs`) — and the measure of the memory they hold
//! (`sizing.rs`). Eviction drops a whole checkpoint's templates, least
//! recently used first ([`crate::Tracer::evict_to`]).
//!
//! The pool is owned by the tracer thread's state; what it does that
//! involves the live processes' holders or trackings takes them as
//! arguments.

mod pending;
mod sizing;
mod standbys;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};

pub(crate) use sizing::PoolMemory;
pub(crate) use standbys::StandbyWork;

use crate::check::Unrestorable;
use crate::inject::kill_tracee;
use crate::memory_holder::Holder;
use crate::reap::kill_later;
use crate::template::{CheckpointTemplates, Template};
use crate::{HostPid, SandboxPid};

/// The templates a checkpoint has in the pool.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TemplateStatus {
    /// In-sandbox pids that a rollback brings back.
    pub pids: Vec<SandboxPid>,
    /// Processes that were running but are not restorable.
    pub unrestorable: Vec<Unrestorable>,
}

/// The templates of every checkpoint of a sandbox, by checkpoint id.
#[derive(Default)]
pub(crate) struct Pool {
    checkpoints: BTreeMap<String, CheckpointTemplates>,
    /// Ticks at each use of a checkpoint (its `last_used`).
    clock: u64,
    /// Checkpoints whose templates still need their set-up
    /// ([`Pool::prepare_pending`], between operations).
    unprepared: Vec<String>,
    /// Templates whose standby was still being forked when their
    /// checkpoint took it: (checkpoint, host pid of the template forking
    /// it), until [`Pool::resolve_later`] right after the job.
    later: Vec<(String, HostPid)>,
    /// The next pid to give a standby, counting down from the top of the
    /// pid range (`standbys.rs`); 0 until the first.
    next_pool_pid: SandboxPid,
    /// The templates' frames as the last measure read them.
    frames: Arc<Mutex<sizing::FrameCache>>,
}

impl Pool {
    /// The templates of checkpoint `ck`.
    pub(crate) fn get(&self, ck: &str) -> Option<&CheckpointTemplates> {
        self.checkpoints.get(ck)
    }

    /// [`Pool::get`], to change them.
    pub(crate) fn get_mut(&mut self, ck: &str) -> Option<&mut CheckpointTemplates> {
        self.checkpoints.get_mut(ck)
    }

    /// Every checkpoint's templates.
    pub(crate) fn iter_mut(&mut self) -> impl Iterator<Item = (&String, &mut CheckpointTemplates)> {
        self.checkpoints.iter_mut()
    }

    /// How many checkpoints have templates.
    pub(crate) fn len(&self) -> usize {
        self.checkpoints.len()
    }

    /// Every template.
    pub(crate) fn templates(&self) -> impl Iterator<Item = &Template> {
        self.checkpoints.values().flat_map(|c| &c.templates)
    }

    /// Every template, to change.
    pub(crate) fn templates_mut(&mut self) -> impl Iterator<Item = &mut Template> {
        self.checkpoints.values_mut().flat_map(|c| c.templates.iter_mut())
    }

    /// The checkpoints (other than `ck`) one of whose templates has one of
    /// `pids` (in the sandbox).
    pub(crate) fn holding_any(&self, ck: &str, pids: &std::collections::HashSet<SandboxPid>) -> Vec<String> {
        self.checkpoints
            .iter()
            .filter(|(k, c)| k.as_str() != ck && c.templates.iter().any(|t| pids.contains(&t.ns_pid)))
            .map(|(k, _)| k.clone())
            .collect()
    }

    /// Checkpoint `ck` joins the pool with its templates `set` (its
    /// `last_used` is set here); their set-up follows between operations,
    /// and templates whose standby is still being forked get it right
    /// after the job ([`Pool::resolve_later`]).
    pub(crate) fn add(&mut self, ck: &str, mut set: CheckpointTemplates) {
        self.later.extend(set.templates.iter().filter(|t| t.deferred()).map(|t| (ck.to_string(), t.host)));
        set.last_used = self.tick();
        self.unprepared.push(ck.to_string());
        self.checkpoints.insert(ck.to_string(), set);
    }

    /// Host pids of the pool's templates and standbys.
    pub(crate) fn hosts(&self) -> impl Iterator<Item = HostPid> + '_ {
        self.templates().map(|t| t.host).chain(self.standbys().map(|s| s.host))
    }

    /// In-sandbox pids of the pool's templates and standbys, those being
    /// forked with a pid of ours included.
    pub(crate) fn ns_pids(&self) -> impl Iterator<Item = SandboxPid> + '_ {
        self.templates()
            .map(|t| t.ns_pid)
            .chain(self.standbys().map(|s| s.ns_pid))
            .chain(self.templates().filter_map(|t| t.forking.as_ref()?.ns_pid()))
    }

    /// Forget every template (killed already: a sandbox whose init is
    /// about to go).
    pub(crate) fn clear(&mut self) {
        self.checkpoints.clear();
    }

    /// The next tick of the pool's clock (orders checkpoints by last use).
    pub(crate) fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    /// The template of checkpoint `ck` with host pid `host`, if the pool
    /// still has it.
    pub(crate) fn template(&self, (ck, host): &(String, HostPid)) -> Option<&Template> {
        self.checkpoints.get(ck)?.templates.iter().find(|t| t.host == *host)
    }

    /// [`Pool::template`], to change it.
    pub(crate) fn template_mut(&mut self, (ck, host): &(String, HostPid)) -> Option<&mut Template> {
        self.checkpoints.get_mut(ck)?.templates.iter_mut().find(|t| t.host == *host)
    }

    /// Every template's standby.
    pub(crate) fn standbys(&self) -> impl Iterator<Item = &crate::standby::Standby> {
        self.checkpoints.values().flat_map(|c| c.templates.iter().filter_map(|t| t.standby.as_ref()))
    }

    /// What the pool holds for `ck`.
    pub(crate) fn status(&self, ck: &str) -> Option<TemplateStatus> {
        self.checkpoints.get(ck).map(|c| TemplateStatus {
            pids: c.templates.iter().map(|t| t.image.pid).collect(),
            unrestorable: c.unrestorable.clone(),
        })
    }

    /// Checks that the templates of `ck` and their standbys still live.
    /// A dead standby is dropped; a dead template drops every template of
    /// `ck` (a partial set cannot be restored exactly) and is returned.
    pub(crate) fn drop_dead_templates(&mut self, ck: &str, holders: &mut [Holder]) -> Vec<Unrestorable> {
        // Between operations templates and standbys sit in a ptrace stop.
        // Dead is told positively: gone, a zombie, or out of its stop with
        // a SIGKILL pending (dying; a frozen task shows `D`, and lives).
        let dead = |host: HostPid| match crate::procfs::state(host) {
            Some('t' | 'T') => false,
            None | Some('Z' | 'X') => true,
            Some(_) => {
                crate::procfs::status(host).map_or(true, |s| s.signals.pending & (1 << (libc::SIGKILL - 1)) != 0)
            }
        };
        let Some(set) = self.checkpoints.get_mut(ck) else { return Vec::new() };
        let mut killed = Vec::new();
        for t in set.templates.iter_mut() {
            if t.standby.as_ref().is_some_and(|s| dead(s.host))
                && let Some(s) = t.standby.take()
            {
                tracing::warn!(
                    pid = t.image.pid.raw(),
                    standby = s.host.raw(),
                    "a standby was killed: the restore forks its template"
                );
                kill_tracee(s.host);
            }
            if dead(t.host) {
                killed.push(Unrestorable {
                    pid: t.image.pid,
                    comm: t.image.comm.clone(),
                    resource: "checkpoint copy".into(),
                    reason: format!(
                        "its checkpoint copy (pid {} in the sandbox) was killed, from inside the sandbox or by the OOM killer",
                        t.ns_pid
                    ),
                });
            }
        }
        if !killed.is_empty() {
            tracing::warn!(checkpoint = ck, ?killed, "templates killed: the checkpoint's processes are lost");
            self.drop_checkpoint(ck, true, holders);
        }
        killed
    }

    /// Kill the templates of `ck`. With `wait`, until they are gone (their
    /// pids free: a restore that needs one); otherwise each tears its
    /// memory down in its own time, off the tracer's CPU, and is collected
    /// between jobs. (Waiting took the tracer thread for the teardown of
    /// every template and standby: an eviction run between two
    /// checkpoints, of 100 MB templates, made the next checkpoint's last
    /// step wait 19 ms.)
    pub(crate) fn drop_checkpoint(&mut self, ck: &str, wait: bool, holders: &mut [Holder]) {
        let kill = |host: HostPid, ns_pid: SandboxPid| if wait { kill_tracee(host) } else { kill_later(host, ns_pid) };
        // A later template whose pages are still to be read from one of
        // these (`incremental::OlderStandby`) is written first: it would be lost.
        let hosts: Vec<HostPid> =
            self.checkpoints.get(ck).map(|c| c.templates.iter().map(|t| t.host).collect()).unwrap_or_default();
        let reads_from_these = self
            .checkpoints
            .values()
            .flat_map(|c| &c.templates)
            .any(|t| t.to_write.as_ref().and_then(|p| p.depends_on()).is_some_and(|h| hosts.contains(&h)));
        if reads_from_these {
            self.write_pending(true, holders);
        }
        if let Some(set) = self.checkpoints.remove(ck) {
            for mut t in set.templates {
                t.settle_standby();
                kill(t.host, t.ns_pid);
                if let Some(s) = t.standby {
                    kill(s.host, s.ns_pid);
                }
            }
        }
    }
}
