//! What the pool does for its templates between operations, and first
//! thing in a rollback: their set-up, the pages still to write into
//! templates made from standbys, and standbys taken while still forking.

use std::os::fd::OwnedFd;

use crate::closer::drop_later;
use crate::inject::Tracee;
use crate::memory_holder::Holder;
use crate::track::Trackings;

use super::Pool;

impl Pool {
    /// The templates' own set-up (see `checkpoint::set_up_all`), run by the tracer
    /// thread once the checkpoint is over (not beside its last steps), one
    /// template a call (a job waits for one at most), and before a rollback
    /// uses the pool. A checkpoint one of whose templates cannot be set up
    /// loses all of them (it then shows as evicted: a partial set would bring
    /// back only some of its processes). Returns whether there was one.
    pub(crate) fn prepare_pending(&mut self, holders: &mut [Holder]) -> bool {
        let st = self;
        let Some(ck) = st.unprepared.first().cloned() else { return false };
        // (A template made from a standby has its scratch page already.)
        let next = st.checkpoints.get_mut(&ck).and_then(|set| set.templates.iter_mut().find(|t| t.scratch == 0));
        let Some(t) = next else {
            st.unprepared.remove(0);
            return true;
        };
        let t0 = std::time::Instant::now();
        // The template's working directory, held across its `chdir`: the last
        // reference to the checkpoint's tree (detached by the swap) then goes
        // on a thread of ours, with the tree's teardown (an overlay's: up to
        // milliseconds), not in an injected call the tracer waits for.
        let cwd = open_path(&format!("/proc/{}/cwd", t.host)).ok();
        let res = t.prepare();
        drop_later(cwd.into_iter().map(OwnedFd::from).collect());
        tracing::debug!(checkpoint = ck, pid = t.image.pid.raw(), took = ?t0.elapsed(), "template prepared");
        if let Err(e) = res {
            tracing::warn!(checkpoint = ck, "template set-up failed, its templates are dropped: {e}");
            st.unprepared.remove(0);
            st.drop_checkpoint(&ck, true, holders);
        }
        true
    }

    /// Every template of the pool set up and written, now: what a rollback
    /// needs before it uses the pool.
    pub(crate) fn finish_pending(&mut self, tracking: &mut Trackings, holders: &mut [Holder]) {
        self.resolve_later(tracking, holders);
        self.settle_anonymous();
        while self.prepare_pending(holders) {}
        self.write_pending(true, holders);
    }

    /// Templates made from standbys get the pages their originals wrote
    /// (`incremental.rs`): started once the checkpoint is over, on threads of
    /// their own; finished by the tracer between operations (those
    /// written, or with `wait` all of them: before a rollback uses the pool).
    /// One that reads pages from another template first
    /// (`incremental::OlderStandby`) starts once that one is finished. A checkpoint
    /// one of whose templates cannot be written loses all of them, as in
    /// [`Pool::prepare_pending`]. Returns whether one was finished.
    pub(crate) fn write_pending(&mut self, wait: bool, holders: &mut [Holder]) -> bool {
        let st = self;
        let mut any = false;
        loop {
            let unwritten: std::collections::HashSet<crate::HostPid> = st
                .checkpoints
                .values()
                .flat_map(|c| &c.templates)
                .filter(|t| t.to_write.is_some())
                .map(|t| t.host)
                .collect();
            let mut failed = Vec::new();
            let mut finished = false;
            for (ck, set) in st.checkpoints.iter_mut() {
                for t in set.templates.iter_mut() {
                    match t.to_write.as_mut() {
                        // (Its standby first: `resolve_later`.)
                        Some(p) if p.is_later() => continue,
                        Some(p) if p.depends_on().is_some_and(|h| unwritten.contains(&h)) => continue,
                        Some(p) if wait || p.written() => {}
                        Some(p) => {
                            p.start();
                            continue;
                        }
                        None => continue,
                    }
                    let Some(p) = t.to_write.take() else { continue };
                    finished = true;
                    if let Err(e) = p.finish(holders) {
                        tracing::warn!(
                            checkpoint = ck,
                            pid = t.image.pid.raw(),
                            "template not written, its checkpoint's templates are dropped: {e}"
                        );
                        failed.push(ck.clone());
                    }
                }
            }
            for ck in failed {
                st.drop_checkpoint(&ck, true, holders);
            }
            any |= finished;
            // (Waiting: until none is left, the ones that read from others
            // after those.)
            if !wait || !finished {
                return any;
            }
        }
    }

    /// The templates whose standby was still being forked when their
    /// checkpoint took it (`incremental::ForkingStandby`) get it: run by the tracer
    /// thread right after the job that made them, once its reply is out, and
    /// before any other job (no job sees such a template). Each takes the
    /// standby's host pid where its stand-in's was (its own, its checkpoint's
    /// pipes and socket data, its process's tracking). A fork that failed
    /// drops the checkpoint's templates, as a failed write of pages does
    /// ([`Pool::write_pending`]).
    pub(crate) fn resolve_later(&mut self, tracking: &mut Trackings, holders: &mut [Holder]) {
        let st = self;
        for (ck, from) in std::mem::take(&mut st.later) {
            let Some(set) = st.checkpoints.get_mut(&ck) else { continue };
            let Some(i) = set.templates.iter().position(|t| t.host == from && t.deferred()) else { continue };
            let t0 = std::time::Instant::now();
            let t = &mut set.templates[i];
            let resolved = t.to_write.as_mut().map(|p| p.resolve());
            let made = if let Some(Ok((host, ns_pid))) = resolved {
                t.host = host;
                t.ns_pid = ns_pid;
                t.tracee = Tracee::new(host, t.tracee.saved, t.tracee.insn);
                for p in set.pipes.iter_mut().filter(|p| p.1 == from) {
                    p.1 = host;
                }
                for s in set.sockets.iter_mut().filter(|s| s.1 == from) {
                    s.1 = host;
                }
                for m in set.shared_memory.iter_mut().filter(|m| m.1 == from) {
                    m.1 = host;
                }
                tracing::debug!(checkpoint = ck, pid = ns_pid.raw(), waited = ?t0.elapsed(), "standby of a template taken once forked");
                Some(host)
            } else {
                tracing::warn!(
                    checkpoint = ck,
                    pid = t.image.pid.raw(),
                    "no standby for the template, its checkpoint's templates are dropped: {:?}",
                    resolved.and_then(|r| r.err())
                );
                // (Not the template forking it: this one's standby died with
                // its fork.)
                set.templates.remove(i);
                st.drop_checkpoint(&ck, true, holders);
                None
            };
            // The process's tracking counts from the standby; with none, its
            // next checkpoint forks it (its base is gone, and the stand-in's
            // pid is not its base's).
            for tr in tracking.values_mut().filter(|tr| tr.base.as_ref().is_some_and(|(c, h)| *c == ck && *h == from)) {
                tr.base = made.map(|host| (ck.clone(), host));
                if made.is_none() {
                    tr.prev = None;
                }
            }
        }
    }
}

/// `path` opened `O_PATH` (a reference to its mount, nothing read).
fn open_path(path: &str) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new().read(true).custom_flags(libc::O_PATH | libc::O_CLOEXEC).open(path)
}
