//! Checkpoint of a sandbox's processes: after the stop (`stop.rs`), pass
//! 1 captures each process and makes its template while it is stopped
//! ([`clone_all`]), [`release_all`] lets them go, pass 2 reads the rest of
//! each image from its template and checks it ([`set_up_all`]); the
//! templates then join the pool. A layered checkpoint moves the stopped
//! processes to the new tree in between (`repoint.rs`). See the crate
//! docs for the order.
//!
//! The passes work on [`Parts`]: the parts of the tracer thread's state a
//! checkpoint reads and changes.

pub mod repoint;

use std::collections::{BTreeMap, HashSet};

use sandtree_sys::ptrace;
use serde::{Deserialize, Serialize};

use crate::check::{self, Unrestorable};
use crate::fdstate::Seen;
use crate::incremental::During;
use crate::inject::{self, Tracee, kill_tracee};
use crate::memory_holder::Holder;
use crate::model::{FdKind, Registers};
use crate::pool::Pool;
use crate::procfs::resident_pages;
use crate::stop::{StoppedProcess, Stops, let_go};
use crate::template::{CheckpointTemplates, Template, is_later, kill_template};
use crate::track::Trackings;
use crate::{Error, HostPid, Result, SandboxPid, procfs};

/// The parts of the tracer thread's state that a checkpoint reads and
/// changes: what the stop holds, the templates being made, the pool they
/// join, the live processes' holders and trackings, and what the tracer
/// knows of the sandbox.
pub(crate) struct Parts<'a> {
    /// What the stop holds.
    pub stops: &'a mut Stops,
    /// Templates cloned by pass 1, not set up yet.
    pub cloned: &'a mut Vec<Cloned>,
    /// Processes refused in pass 1 (best effort).
    pub refused: &'a mut Vec<Unrestorable>,
    /// Descriptors opened in stopped processes for a new tree
    /// (`repoint.rs`), until they are put in place or closed.
    pub repointed: &'a mut Vec<repoint::Reopened>,
    /// The template pool the templates join.
    pub pool: &'a mut Pool,
    /// Holders of the live processes' address spaces.
    pub holders: &'a mut Vec<Holder>,
    /// Written-page tracking of the live processes.
    pub tracking: &'a mut Trackings,
    /// The sandbox's init (host pid).
    pub init_host: HostPid,
    /// Init's mount table, kept between operations.
    pub mounts: &'a procfs::MountCache,
    /// Processes this large (resident bytes) or more are tracked.
    pub incremental_min_rss: Option<u64>,
    /// The engine's counters and test switches.
    pub instruments: &'a std::sync::Arc<crate::stats::Instruments>,
}

impl Parts<'_> {
    /// Whether live process `host` has a holder.
    fn has_holder(&self, host: HostPid) -> bool {
        self.holders.iter().any(|h| h.owner == host && !h.orphaned())
    }
}

/// What pass 2 made ([`crate::Released::set_up`]).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct CaptureReport {
    /// In-sandbox pids with a template.
    pub captured: Vec<SandboxPid>,
    /// Processes marked not restorable (best effort only).
    pub unrestorable: Vec<Unrestorable>,
    /// Processes restored with a change (best effort only): children of
    /// another process come back as children of init.
    #[serde(default)]
    pub reparented: Vec<Unrestorable>,
    /// The `comm` of each captured process, by in-sandbox pid (for
    /// messages that name a process).
    #[serde(default)]
    pub comms: BTreeMap<SandboxPid, String>,
}

/// A template cloned (its original still stopped until [`release_all`]).
pub(crate) struct Cloned {
    /// A new holder of the original's memory.
    holder: Option<crate::memory_holder::Holder>,
    /// The original, still stopped until [`release_all`].
    pub(crate) orig: Option<Tracee>,
    pub(crate) stopped: StoppedProcess,
    pub(crate) fds: Vec<crate::model::FdImage>,
    /// Pending signals of the original (a fork does not inherit them).
    pending: u64,
    /// Its signal mask (the template's is all-blocked).
    blocked: u64,
    /// Their `siginfo_t`s.
    queued: Vec<crate::model::QueuedSignal>,
    /// CPU affinity of the original (the template is pinned to the tracer's CPU).
    affinity: Vec<u32>,
    /// Pipes first seen in this process: (inode, fd, bytes).
    pipes: Vec<crate::model::PipeBuffer>,
    /// Its other threads.
    threads: Vec<crate::model::ThreadImage>,
    /// Their tracees, to let go with their own masks (`release_all`).
    thread_tracees: Vec<(Tracee, ptrace::Regs)>,
    /// The main thread's robust futex list.
    robust_list: Option<(u64, u64)>,
    /// Its registers for the image (an rseq critical section aborted).
    image_regs: ptrace::Regs,
    /// Shared memory objects first seen in this process, copied.
    shared_memory: Vec<crate::process::shared_memory::SharedMemoryCopy>,
    /// Every shared memory object it holds, and where (its template holds
    /// them at the same places).
    shared_memory_held: Vec<(crate::process::shared_memory::ObjectKey, crate::process::shared_memory::Reach)>,
    /// Data queued on its connected unix sockets.
    sockets: Vec<crate::model::SocketBuffer>,
    /// Contents of its deleted-but-open files, by descriptor.
    ghosts: Vec<(i32, std::sync::Arc<crate::fdstate::SparseCopy>)>,
    /// Its armed interval timers.
    itimers: Vec<(i32, Vec<u8>)>,
    /// Its POSIX timers.
    posix_timers: Vec<crate::model::PosixTimer>,
    /// Its alternate signal stack (`stack_t`), if enabled.
    altstack: Option<Vec<u8>>,
    /// It is a child subreaper.
    child_subreaper: bool,
    /// Its rseq registration.
    rseq: Option<(u64, u32, u32, u32)>,
    /// The original's cwd, root and executable, read while it is stopped
    /// (a layered checkpoint detaches the tree the template's point into
    /// before pass 2; paths on a sub-layer then read wrong).
    pub(crate) paths: (String, String, String),
    pub(crate) host: HostPid,
    pub(crate) ns_pid: SandboxPid,
    insn: u64,
    /// Written-page tracking of the original (`track.rs`), back to the
    /// state when the original is kept.
    tracking: Option<crate::track::Tracking>,
    /// The original's fingerprint (`incremental.rs`), when tracked.
    fingerprint: Option<String>,
    /// Made from a standby: its scratch mapping and the memory map.
    patched: Option<((u64, bool), Vec<crate::model::MapImage>, u32)>,
    /// Made from a standby: what is written into it once the checkpoint is
    /// over.
    to_write: Option<crate::incremental::Pending>,
    /// Made from a standby: the process's previous template and what this
    /// one changes over it (`Tracking::prev`, for the next checkpoint).
    prev: Option<crate::track::PreviousTemplate>,
    /// Made from a standby: the original's process group, session and
    /// whether it has a terminal (the standby has left them).
    session: Option<(SandboxPid, SandboxPid, bool)>,
    /// (descriptor, pipe key) of each pipe and FIFO descriptor (a
    /// template made from a standby has closed FIFOs of the tree).
    pipe_keys: Vec<(i32, (u64, u64))>,
    /// The original's memory map size (`VmSize`, kB) in the frozen window:
    /// a forked template's smaller one lacks mappings fork does not copy.
    vm_size_kb: u64,
    /// A forked template: a mapping (start, end) of the original that the
    /// fork left empty although the original had pages there: marked
    /// `MADV_WIPEONFORK` (`process::memory::wiped_by_fork`).
    wiped: Option<(u64, u64)>,
    /// A forked template: the original's mappings marked `MADV_DONTFORK`
    /// (start, end), which the template has as ordinary ones.
    dont_fork: Vec<(u64, u64)>,
    /// The copier its holder lent for the pass, to give back.
    copier: Option<crate::memory_holder::Copier>,
    /// Made from a standby: the original's status and name, read while
    /// it was stopped, which are the template's (the fingerprint, name,
    /// credentials and signal dispositions included, matched the
    /// standby's): pass 2 reads nothing of the template.
    facts: Option<(procfs::Status, String)>,
    /// The signal its parent gets when it ends.
    exit_signal: i32,
    /// The foreground group of its terminal.
    tpgid: Option<SandboxPid>,
    /// Its stopped children whose stop it has not waited for, with the
    /// signal.
    stop_reports: Vec<(SandboxPid, i32)>,
}

impl Cloned {
    fn deferred(&self) -> bool {
        is_later(&self.to_write)
    }

    fn kill(self) {
        kill_template(self.host, self.deferred());
    }
}

/// What [`clone_of`] gets for a process worth tracking.
pub(crate) struct Track {
    pub tracking: Option<crate::track::Tracking>,
    pub base: Option<crate::incremental::Base>,
    /// The copier of the process's holder, lent for the pass when there is
    /// a base (back with the template, `Cloned::copier`).
    pub copier: Option<crate::memory_holder::Copier>,
}

/// After a template was forked from tracked-worthy process `host`: start
/// tracking it, or count its pages as unwritten from here (and cover
/// mappings new since). Returns its fingerprint.
fn track_after_fork(
    host: HostPid,
    orig: &mut Tracee,
    tracking: &mut Option<crate::track::Tracking>,
) -> Result<(String, Vec<crate::model::MapImage>)> {
    let maps = procfs::maps(host).map_err(|e| Error::Proc { pid: host, what: "maps", source: e })?;
    // (A tracking that no longer covers the map, or cannot be read — the
    // process exec'd, or remapped a range — is made anew.)
    if let Some(t) = tracking.as_mut() {
        t.cover(&maps);
    }
    if tracking.as_ref().is_some_and(|t| !t.covers(&maps) || t.take_written(host).is_err())
        && let Some(t) = tracking.take()
    {
        t.end_now();
    }
    if tracking.is_none() {
        *tracking = Some(crate::track::Tracking::arm(orig, host, &maps)?);
    }
    let fingerprint = crate::incremental::fingerprint(host, None).map_err(|e| Error::Proc {
        pid: host,
        what: "fingerprint",
        source: e,
    })?;
    Ok((fingerprint, maps))
}

/// Whether a unix socket of stopped process `host` at a number of `fds`
/// (not a listener) holds data to read.
fn unix_data_queued(host: HostPid, fds: &[crate::model::FdImage]) -> bool {
    fds.iter().any(|f| match &f.kind {
        FdKind::Socket { family, listening: false, .. } if family == "unix" => crate::fdstate::dup_from(host, f.fd)
            .is_ok_and(|sock| rustix::io::ioctl_fionread(&sock).is_ok_and(|n| n > 0)),
        _ => false,
    })
}

/// The tracking of stopped process `s`, and its base if its previous
/// template can give one (prepared, with a standby): taken out of the
/// state for the pass (the tracking comes back with the template, its base
/// when the checkpoint joins the pool). `None` for a process not tracked
/// and too small to be.
fn track_for(st: &mut Parts<'_>, s: &StoppedProcess) -> Option<Track> {
    let min = st.incremental_min_rss?;
    let tracking = st.tracking.remove(&s.host).filter(|t| t.tracks(s.host));
    let resident = resident_pages(s.host);
    if tracking.is_none() && resident * 4096 < min {
        return None;
    }
    crate::memory_holder::note_resident(st.holders, s.host, resident);
    // This checkpoint found the previous template's standby not ready:
    // the next one should not (see `Pool::base_hosts`).
    let behind = std::cell::Cell::new(false);
    let base = tracking.as_ref().and_then(|t| Some((t.base.clone()?, t.prev.clone()))).and_then(|(id, prev)| {
        let ready = |st: &Parts<'_>, id: &(String, HostPid)| {
            st.pool.template(id).map(|t| (t.scratch != 0 && t.standby.is_some(), t.scratch != 0 && t.forking.is_some()))
        };
        // The previous template's standby; if it is not ready (its fork is
        // under way or yet to start), the one before's, if that one is
        // (`incremental::OlderStandby`); else the fork under way's (the previous
        // template's or the one before's), which ends beside the read,
        // sooner than a fork of the process would.
        // (Only for a large process: see `incremental::OLDER_STANDBY_MIN_RSS`.)
        let prefer = st.instruments.switches.preferring_older_standbys();
        let prev = prev.filter(|_| prefer || resident * 4096 >= crate::incremental::OLDER_STANDBY_MIN_RSS);
        let (prev_ready, base_state) = (prev.as_ref().and_then(|(p, _)| ready(st, p)), ready(st, &id));
        let prefer_prev = prefer && prev_ready.is_some_and(|(r, _)| r);
        // (Behind matters only to a process that can take the older standby.)
        let can_older = prev.is_some();
        // (A test's: `TestSwitches::hold_standby_forks`.)
        let hold = st.instruments.switches.holding_standby_forks();
        let (from, extra, waits) = match (base_state, prev) {
            (Some((true, _)), _) if !prefer_prev => (id.clone(), None, false),
            (Some((_, true)), _) if hold => (id.clone(), None, true),
            // (The previous template's pages are read from it: only while
            // it is there. Its checkpoint dropped, that host pid may be
            // another process's, or the one before's own.)
            (Some(_), Some((p, delta))) if prev_ready.is_some_and(|(r, _)| r) => {
                let extra = crate::incremental::OlderStandby { from: id.1, delta, zapped: false };
                (p, Some(extra), false)
            }
            (Some((_, true)), _) => (id.clone(), None, true),
            // (The one before's standby made again first, `Tracking::behind`,
            // and the base's fork not started yet: that fork ends sooner
            // than one of the process would.)
            (Some(_), Some((p, delta))) if prev_ready.is_some_and(|(_, forking)| forking) => {
                let extra = crate::incremental::OlderStandby { from: id.1, delta, zapped: false };
                (p, Some(extra), true)
            }
            _ => {
                tracing::debug!(pid = s.ns_pid.raw(), "the previous template has no standby yet");
                behind.set(can_older);
                return None;
            }
        };
        behind.set(waits && can_older);
        let t = st.pool.template_mut(&from)?;
        // A chain long enough: the process is forked again (see
        // `incremental::max_generation`); the template keeps its standby.
        if t.generation >= crate::incremental::max_generation(resident) {
            tracing::debug!(
                pid = s.ns_pid.raw(),
                generation = t.generation,
                "checkpoint forks: the chain of standbys is long"
            );
            return None;
        }
        // Files in flight are given to a forked template only
        // (`kinds/in_flight.rs`): a process with a unix socket that holds
        // data (as its previous template's image has it: a socket made
        // since fails the standby's check) forks.
        if t.image.fds.iter().any(|f| f.in_flight) || unix_data_queued(s.host, &t.image.fds) {
            tracing::debug!(pid = s.ns_pid.raw(), "checkpoint forks: data queued on a unix socket");
            return None;
        }
        let fingerprint = t.fingerprint.clone()?;
        let forking = t.take_forking();
        t.standby_taken = true;
        // (A process that ran no code since its previous template: the
        // standby of the one before is not it.)
        let quiet = (extra.is_none()
            && t.image.itimers.is_empty()
            && t.image.posix_timers.is_empty()
            && !t.image.child_subreaper
            && t.image.threads == 1)
            .then(|| crate::incremental::Quiet { regs: t.image.regs, altstack: t.image.altstack.clone() });
        if extra.is_some() {
            tracing::debug!(pid = s.ns_pid.raw(), "from the standby of the template before the previous one");
            st.instruments.count(crate::stats::Counter::FromOlderStandbys, 1);
        }
        let fd_flags = extra.is_none().then(|| t.image.fds.iter().map(|f| (f.fd, f.flags)).collect());
        Some(crate::incremental::Base {
            id,
            template: t.host,
            extra,
            standby: t.standby.take(),
            forking,
            scratch: (t.scratch, t.scratch_exec),
            maps: t.image.maps.clone(),
            fd_flags,
            fingerprint,
            rseq: t.image.rseq,
            generation: t.generation,
            quiet,
            instruments: st.instruments.clone(),
        })
    });
    let tracking = tracking.map(|mut t| {
        t.base = None;
        t.prev = None;
        t.behind = behind.get();
        t
    });
    let copier = base.as_ref().and_then(|_| crate::memory_holder::lend_copier(st.holders, s.host));
    Some(Track { tracking, base, copier })
}

// Capture and make templates in two passes, so that the originals are
// stopped only for what must be read while they are:
// 1. [`clone_all`], per original (stopped): its descriptors and file
//    positions (shared with the template, so they must be read before the
//    original moves them), pipe bytes, queued signals, inject the `clone`;
//    then [`release_all`] lets every original (and init) go;
// 2. [`set_up_all`], per template (originals running): the rest of the
//    image from the template's `/proc` (a fork has the same map,
//    credentials, masks, cwd), the checks, and the template's own set-up.
//
// The caller takes the filesystem snapshot while pass 1 runs (everything
// in the sandbox is stopped then, init included), or before it.

/// What runs once every process but the largest has its template (given
/// the largest one's host pid): see [`clone_all`].
pub(crate) type OthersDone<'a> = &'a mut dyn FnMut(&mut Parts<'_>, HostPid);

/// Pass 1 (see above); on error every process is let go and the
/// templates made so far are killed.
///
/// The largest process's copy (page tables: ~4 ms for 100 MB of 4 KiB
/// pages) runs on another CPU while the others are cloned here: the pause
/// is then about the largest copy, not the sum of all of them.
///
/// `others_done` runs on the tracer thread once every process but the
/// largest has its template, while the largest one's copy may still run
/// (a layered checkpoint moves those processes to the new tree then:
/// `repoint.rs`).
pub(crate) fn clone_all(st: &mut Parts<'_>, best_effort: bool, mut others_done: Option<OthersDone<'_>>) -> Result<()> {
    let mut stopped = st.stops.take();
    // Trackings of processes gone (or not stopped this time: refused in
    // best effort, left running) end: a dead one's userfaultfd is parked
    // until its memory is gone; a live one's closes on the closer thread
    // (`Tracking`'s drop: soon, and its mappings are free again for a
    // tracking armed anew).
    let kept: Vec<HostPid> = stopped.iter().map(|s| s.host).collect();
    let holders = &st.holders;
    st.tracking.end_all_but(&kept, |host| holders.iter().find(|h| h.owner == host).map(|h| h.host));
    // (Init's table, kept between operations, when the processes see
    // the tree as init does.)
    let mounts = match stopped.first() {
        Some(s)
            if st.init_host.raw() > 0
                && procfs::root_of(s.host).is_some_and(|r| procfs::root_of(st.init_host) == Some(r)) =>
        {
            st.mounts.of(st.init_host).map_err(|e| Error::Proc { pid: st.init_host, what: "mountinfo", source: e })
        }
        Some(s) => procfs::mounts(s.host).map(std::sync::Arc::new).map_err(|e| Error::Proc {
            pid: s.host,
            what: "mountinfo",
            source: e,
        }),
        // Init alone: its table, for the check below (a mount an exec made
        // outlives it).
        None if st.init_host.raw() > 0 => {
            st.mounts.of(st.init_host).map_err(|e| Error::Proc { pid: st.init_host, what: "mountinfo", source: e })
        }
        None => Ok(Default::default()),
    };
    let mut failure = None;
    // Mounts the sandbox made in its tree: a rollback replaces the tree,
    // and they would be gone (with processes or not).
    if let Ok(m) = &mounts
        && let Some(u) = sandbox_mount(m)
    {
        match best_effort {
            true => st.refused.push(u),
            false => failure = Some(Error::Unsupported(u)),
        }
    }
    let mut seen = Seen::default();
    let big = match (&mounts, stopped.len()) {
        _ if failure.is_some() => None,
        (Ok(_), 2..) => biggest(&stopped).map(|i| stopped.remove(i)),
        _ => None,
    };
    let mut left = stopped.into_iter();
    match mounts {
        _ if failure.is_some() => {}
        Err(e) => failure = Some(e),
        Ok(mounts) => match big {
            None => clone_each(st, &mut left, &mounts, &mut seen, best_effort, &mut failure, &mut || {}),
            Some(b) => {
                let need_holder = !st.has_holder(b.host);
                let track = track_for(st, &b);
                let mut ran = false;
                // (Only when every other process kept its template: else
                // the checkpoint is a snapshot anyway.)
                let (others, before) = (left.len(), st.cloned.len());
                let res = clone_of(
                    &b,
                    &mounts,
                    &mut seen,
                    need_holder,
                    Some(&mut |seen: &mut Seen, between: &mut dyn FnMut()| {
                        ran = true;
                        clone_each(st, &mut left, &mounts, seen, best_effort, &mut failure, between);
                        if failure.is_none()
                            && st.cloned.len() == before + others
                            && let Some(f) = others_done.as_mut()
                        {
                            f(st, b.host);
                        }
                    }),
                    track,
                );
                let hard = keep_clone(st, &b, res, best_effort);
                // (It failed before its copy: the others are cloned now.)
                if !ran && hard.is_none() {
                    clone_each(st, &mut left, &mounts, &mut seen, best_effort, &mut failure, &mut || {});
                }
                if let Some(e) = hard {
                    failure.get_or_insert(e);
                }
            }
        },
    }
    if failure.is_none() {
        // Open files of the layers that several processes share.
        let mut fds: Vec<_> = st
            .cloned
            .iter_mut()
            .map(|c| ((c.stopped.host, c.host), c.stopped.ns_pid, c.stopped.ns_ppid, &mut c.fds))
            .collect();
        crate::kinds::share_open_files(&mut fds);
    }
    if let Some(e) = failure {
        for s in left {
            let_go(&s);
        }
        // Processes moved to the staged tree while the largest was copied
        // go back first (they are still stopped).
        repoint::abort(st);
        abort(st);
        return Err(e);
    }
    Ok(())
}

/// Pass 1 for each of `left` in turn, until a failure (which stops it);
/// `between` runs before each.
fn clone_each(
    st: &mut Parts<'_>,
    left: &mut impl Iterator<Item = StoppedProcess>,
    mounts: &std::collections::HashMap<i32, sandtree_sys::mountinfo::MountEntry>,
    seen: &mut Seen,
    best_effort: bool,
    failure: &mut Option<Error>,
    between: &mut dyn FnMut(),
) {
    if failure.is_some() {
        return;
    }
    for s in left.by_ref() {
        between();
        let need_holder = !st.has_holder(s.host);
        let track = track_for(st, &s);
        let res = clone_of(&s, mounts, seen, need_holder, None, track);
        if let Some(e) = keep_clone(st, &s, res, best_effort) {
            *failure = Some(e);
            return;
        }
    }
}

/// What becomes of one original after its pass 1: its copy joins the
/// others; in best effort a process the engine cannot restore is let go
/// and reported; a process (or template) that died is let go; any other
/// error is returned (the original let go).
fn keep_clone(st: &mut Parts<'_>, s: &StoppedProcess, res: Result<Cloned>, best_effort: bool) -> Option<Error> {
    match res {
        Ok(mut c) => {
            if let Some(h) = c.holder.take() {
                st.holders.push(h);
            }
            if let Some(t) = c.tracking.take() {
                st.tracking.insert(s.host, t);
            }
            if let Some(copier) = c.copier.take() {
                crate::memory_holder::give_back_copier(st.holders, s.host, copier);
            }
            st.cloned.push(c);
            None
        }
        Err(Error::Unsupported(u)) if best_effort => {
            let_go(s);
            st.refused.push(u);
            None
        }
        // The original, or its template, died: either way the original
        // must not stay stopped.
        Err(Error::Died { .. }) => {
            let_go(s);
            None
        }
        Err(e) => {
            let_go(s);
            Some(e)
        }
    }
}

/// The process whose copy costs most (the most resident memory), if it is
/// worth copying apart: 16 MiB or more.
fn biggest(stopped: &[StoppedProcess]) -> Option<usize> {
    let (i, pages) = stopped.iter().enumerate().map(|(i, s)| (i, resident_pages(s.host))).max_by_key(|(_, p)| *p)?;
    (pages * 4096 >= 16 << 20).then_some(i)
}

/// Let every cloned original go (its affinity and registers back), and init.
pub(crate) fn release_all(st: &mut Parts<'_>) {
    for c in st.cloned.iter_mut() {
        release_threads(std::mem::take(&mut c.thread_tracees));
        if let Some(mut orig) = c.orig.take() {
            let host = c.stopped.host;
            if let Some(t) = st.tracking.get(&host) {
                t.protect_own_writes(c.stopped.regs.rsp);
            }
            let _ = ptrace::set_exit_kill(host.raw(), false);
            // (Its own CPUs from the detach: parked on the tracer's.)
            orig.affinity_on_release(&c.affinity);
            if orig.release(&c.stopped.regs).is_err() {
                inject::set_affinity(host, &c.affinity);
                let_go(&c.stopped);
            }
        }
    }
    st.stops.resume_init();
}

/// Let threads that calls were injected into go, with their own masks and
/// registers.
fn release_threads(tracees: Vec<(Tracee, ptrace::Regs)>) {
    for (t, regs) in tracees {
        let tid = t.tid;
        let _ = ptrace::set_exit_kill(tid.raw(), false);
        if t.release(&regs).is_err() {
            let _ = ptrace::set_regs(tid.raw(), &regs);
            let _ = ptrace::detach(tid.raw(), 0);
        }
    }
}

/// Undo a checkpoint under way: originals and init go, templates die.
pub(crate) fn abort(st: &mut Parts<'_>) {
    release_all(st);
    for c in st.cloned.drain(..) {
        c.kill();
    }
    st.refused.clear();
    st.stops.resume_all();
}

/// Pass 2 (see above): after [`release_all`].
pub(crate) fn set_up_all(st: &mut Parts<'_>, ck: &str, best_effort: bool) -> Result<CaptureReport> {
    let mut report = CaptureReport { unrestorable: std::mem::take(st.refused), ..Default::default() };
    let mut failure = None;
    let t_pass2 = std::time::Instant::now();
    let mut made: Vec<Template> = Vec::new();
    let mut captured_pipes: Vec<crate::model::PipeBuffer> = Vec::new();
    // (bytes, the receiving process: template host, pid, comm)
    let mut captured_sockets: Vec<(crate::model::SocketBuffer, HostPid)> = Vec::new();
    let mut cloned = std::mem::take(st.cloned).into_iter();
    // Every pipe or FIFO descriptor of the templates, keyed once.
    let mut reachable: Vec<((u64, u64), HostPid, i32)> = Vec::new();
    // Every shared memory object, copied once, and where each template
    // holds it.
    let mut shared_memory = Vec::new();
    let mut shared_memory_held = Vec::new();
    for mut c in cloned.by_ref() {
        let host = c.host;
        reachable.extend(std::mem::take(&mut c.pipe_keys).into_iter().map(|(fd, key)| (key, host, fd)));
        shared_memory.append(&mut c.shared_memory);
        shared_memory_held.extend(std::mem::take(&mut c.shared_memory_held).into_iter().map(|(k, at)| (k, host, at)));
        let tracked = (c.fingerprint.is_some() && st.tracking.contains_key(&c.stopped.host)).then_some(c.stopped.host);
        let prev = c.prev.take();
        let deferred = c.deferred();
        captured_pipes.extend(std::mem::take(&mut c.pipes));
        captured_sockets.extend(std::mem::take(&mut c.sockets).into_iter().map(|b| (b, host)));
        match set_up(c).and_then(|t| crate::kinds::inotify_shared_with(&t, &made).map(|()| t)) {
            Ok(mut t) => {
                t.changed_since = prev.as_ref().map(|((ck, _), delta)| (ck.clone(), delta.clone()));
                // The tracked original's writes count from this template.
                if let Some(t_orig) = tracked.and_then(|h| st.tracking.get_mut(&h)) {
                    t_orig.base = Some((ck.to_string(), t.host));
                    t_orig.prev = prev;
                }
                report.captured.push(t.image.pid);
                report.comms.insert(t.image.pid, t.image.comm.clone());
                made.push(t);
            }
            Err(Error::Unsupported(u)) if best_effort => {
                kill_template(host, deferred);
                report.unrestorable.push(u);
            }
            Err(e) => {
                kill_template(host, deferred);
                failure = Some(e);
                break;
            }
        }
    }
    if let Some(e) = failure {
        for c in cloned {
            c.kill();
        }
        for t in made {
            t.kill();
        }
        return Err(e);
    }
    // A queue with files in flight goes back with the files its capturer's
    // template holds (`kinds/in_flight.rs`): with that process refused
    // (best effort), so are the other holders of the socket.
    loop {
        let pids: HashSet<SandboxPid> = made.iter().map(|t| t.image.pid).collect();
        let orphans: HashSet<u64> = captured_sockets
            .iter()
            .filter(|(b, _)| b.passed_in.is_some_and(|p| !pids.contains(&p)))
            .map(|(b, _)| b.ino)
            .collect();
        let held = made.iter().enumerate().find_map(|(i, t)| {
            t.image.fds.iter().find_map(|f| match f.kind {
                FdKind::Socket { ino, .. } if orphans.contains(&ino) => Some((i, f.fd)),
                _ => None,
            })
        });
        let Some((i, fd)) = held else { break };
        let reason = "files in flight on this unix socket were captured with a process that is not restorable";
        refuse_template(&mut made, i, (format!("fd {fd}"), reason), best_effort, &mut report)?;
    }
    // An end of a unix socket pair (or connection) is made anew at the
    // restore, with its other end: a captured process must hold that one
    // too.
    loop {
        let held: HashSet<u64> = made
            .iter()
            .flat_map(|t| &t.image.fds)
            .filter_map(|f| match f.kind {
                FdKind::Socket { ino, .. } => Some(ino),
                _ => None,
            })
            .collect();
        // (And whose other end is an end of the same pair.)
        let pairs: HashSet<(u64, u64)> = made
            .iter()
            .flat_map(|t| &t.image.fds)
            .filter_map(|f| match &f.kind {
                FdKind::Socket { ino, pair: Some(p), .. } => Some((*ino, p.peer)),
                _ => None,
            })
            .collect();
        let lone = made.iter().enumerate().find_map(|(i, t)| {
            t.image.fds.iter().find_map(|f| match &f.kind {
                // (A peer released: made anew by the restore, `UnixPair::peer`.)
                FdKind::Socket { ino, pair: Some(p), .. }
                    if p.peer != 0 && (!held.contains(&p.peer) || !pairs.contains(&(p.peer, *ino))) =>
                {
                    Some((i, f.fd))
                }
                _ => None,
            })
        });
        let Some((i, fd)) = lone else {
            // A connection made through a listener is made again by the
            // process that connected, through the listener bound again.
            let images: Vec<&crate::model::ProcessImage> = made.iter().map(|t| &t.image).collect();
            let Some((i, resource, reason)) = crate::kinds::connection_refusal(&images) else { break };
            refuse_template(&mut made, i, (resource, &reason), best_effort, &mut report)?;
            continue;
        };
        let reason = "one end of a unix socket pair whose other end no captured process holds (made anew at a restore, a pair needs both)";
        refuse_template(&mut made, i, (format!("fd {fd}"), reason), best_effort, &mut report)?;
    }
    // A child of a captured process is made again by its parent
    // (`transplant.rs`): what that cannot give is refused.
    loop {
        let images: Vec<(&crate::model::ProcessImage, HostPid)> = made.iter().map(|t| (&t.image, t.host)).collect();
        let Some((i, resource, reason)) = crate::process::tree::refusal(&images) else { break };
        refuse_template(&mut made, i, (resource, &reason), best_effort, &mut report)?;
    }
    // Its children that exited, not waited for, are made again by it too
    // (`process/zombies.rs`): what that cannot give is refused.
    loop {
        let images: Vec<(&crate::model::ProcessImage, HostPid)> = made.iter().map(|t| (&t.image, t.host)).collect();
        let Some((i, resource, reason)) = crate::process::zombies::refusal(&images) else { break };
        refuse_template(&mut made, i, (resource, &reason), best_effort, &mut report)?;
    }
    // One whose parent is not captured (left running in best effort)
    // comes back as a child of init. An open file shared with a process
    // not captured is opened again on its own.
    // A file of the layers a process may not open again itself, that no
    // other opens again for it.
    refuse_denied_reopens(&mut made, best_effort, &mut report)?;
    // (The first captured holder of one then opens it again, and the
    // others take it from that one.)
    let captured: HashSet<SandboxPid> = made.iter().map(|t| t.image.pid).collect();
    let mut new_owner: std::collections::HashMap<(SandboxPid, i32), (SandboxPid, i32)> = Default::default();
    for t in made.iter_mut() {
        let pid = t.image.pid;
        for f in t.image.fds.iter_mut() {
            let Some(by) = f.opened_by.filter(|(owner, _)| !captured.contains(owner)) else { continue };
            f.opened_by = match new_owner.get(&by) {
                Some(&owner) => Some(owner),
                None => {
                    new_owner.insert(by, (pid, f.fd));
                    None
                }
            };
        }
    }
    for t in &made {
        if t.image.ppid != SandboxPid::INIT && !captured.contains(&t.image.ppid) {
            report.reparented.push(check::reparent_note(&t.image));
        }
    }
    // A terminal slave whose pty master a captured process holds: the
    // restore makes the pty anew, the template must not hold the slave.
    let masters: HashSet<u32> = made
        .iter()
        .flat_map(|t| &t.image.fds)
        .filter_map(|f| match &f.kind {
            FdKind::PtyMaster { state: Some(st) } => Some(st.index),
            _ => None,
        })
        .collect();
    for t in made.iter_mut() {
        for f in t.image.fds.iter_mut() {
            let index = f.kind.terminal();
            // (A hung-up one's index may be a live pty's now.)
            if let FdKind::KeptFile { master_captured, hung_up: false, .. } = &mut f.kind {
                *master_captured = index.is_some_and(|i| masters.contains(&i));
            }
        }
    }
    // A datagram socket bound to a path that a captured one is connected
    // to stays the template's: bound again, the connection would be lost.
    let connected_to: HashSet<String> = made
        .iter()
        .flat_map(|t| &t.image.fds)
        .filter_map(|f| match &f.kind {
            FdKind::Socket { peer_path: Some(p), .. } => Some(p.clone()),
            _ => None,
        })
        .collect();
    for t in made.iter_mut() {
        for f in t.image.fds.iter_mut() {
            if let FdKind::Socket { stream: false, bound: Some(path), has_clients, .. } = &mut f.kind {
                *has_clients = connected_to.contains(path.as_str());
            }
        }
    }
    // Data queued on an end of a pair goes into the new pair at the
    // restore.
    let pair_ends: HashSet<u64> = made
        .iter()
        .flat_map(|t| &t.image.fds)
        .filter_map(|f| match f.kind {
            FdKind::Socket { ino, pair: Some(_), .. } => Some(ino),
            _ => None,
        })
        .collect();
    let (pair_data, captured_sockets): (Vec<_>, Vec<_>) =
        captured_sockets.into_iter().partition(|(b, _)| pair_ends.contains(&b.ino));
    let pair_data: Vec<crate::model::SocketBuffer> = pair_data.into_iter().map(|(b, _)| b).collect();
    // Data queued on a unix socket goes back through its peer, which
    // a template must hold (another process's or its own).
    let sockets = loop {
        let holder = |ino: u64, made: &[Template]| {
            made.iter().find_map(|t| {
                t.image.fds.iter().find_map(|f| match f.kind {
                    FdKind::Socket { ino: i, .. } if i == ino => Some((t.host, f.fd)),
                    _ => None,
                })
            })
        };
        let orphan = captured_sockets
            .iter()
            .find(|(b, host)| made.iter().any(|t| t.host == *host) && holder(b.peer, &made).is_none());
        let Some(&(_, host)) = orphan else {
            // (Only for receivers still captured.)
            break captured_sockets
                .into_iter()
                .filter(|(b, _)| holder(b.ino, &made).is_some())
                .filter_map(|(b, _)| holder(b.peer, &made).map(|(h, fd)| (b, h, fd)))
                .collect::<Vec<_>>();
        };
        let Some(i) = made.iter().position(|t| t.host == host) else { continue };
        let reason = "data in flight whose sender is not a captured process of the sandbox";
        refuse_template(&mut made, i, ("unix socket".into(), reason), best_effort, &mut report)?;
    };
    // Each pipe's bytes go back through a template that holds the pipe
    // (not necessarily the process it was first seen in, which may have
    // been refused).
    let mut pipes = Vec::new();
    reachable.retain(|(_, host, _)| made.iter().any(|t| t.host == *host));
    for mut pipe in captured_pipes {
        if let Some(&(_, host, fd)) = reachable.iter().find(|(key, ..)| *key == (pipe.dev, pipe.ino)) {
            pipe.outside = end_outside(&pipe, &made);
            pipes.push((pipe, host, fd));
        }
    }
    // Each object's contents go back through a template that holds it.
    shared_memory_held.retain(|(_, host, _)| made.iter().any(|t| t.host == *host));
    let shared_memory: Vec<_> = shared_memory
        .into_iter()
        .filter_map(|copy| {
            let &(_, host, at) = shared_memory_held.iter().find(|(key, ..)| *key == copy.key)?;
            Some((copy, host, at))
        })
        .collect();
    let shared_bytes: u64 = shared_memory.iter().map(|(c, ..)| c.bytes()).sum();
    tracing::debug!(took = ?t_pass2.elapsed(), shared_bytes, "templates set up");
    st.pool.add(
        ck,
        CheckpointTemplates {
            templates: made,
            pipes,
            shared_memory,
            sockets,
            pair_data,
            unrestorable: report.unrestorable.clone(),
            last_used: 0,
        },
    );
    Ok(report)
}

/// Pass 2 refuses template `made[i]` for `(resource, reason)`: the whole
/// checkpoint (every template killed), or with `best_effort` that one
/// (killed, and reported as not restorable instead of captured).
/// Pass 2: a file of the layers a process's user may not open again
/// (`FdImage::reopen_denied`) that no other captured process opens again
/// for it (`opened_by`) is refused.
fn refuse_denied_reopens(made: &mut Vec<Template>, best_effort: bool, report: &mut CaptureReport) -> Result<()> {
    loop {
        // (One opened again by a process not captured, left running in best
        // effort, would be opened again by this one.)
        let captured: HashSet<SandboxPid> = made.iter().map(|t| t.image.pid).collect();
        let denied = made.iter().enumerate().find_map(|(i, t)| {
            let by_none = |f: &crate::model::FdImage| f.opened_by.is_none_or(|(pid, _)| !captured.contains(&pid));
            let f = t.image.fds.iter().find(|f| f.reopen_denied && by_none(f))?;
            let FdKind::LayerFile { path, .. } = &f.kind else { return None };
            Some((i, f.fd, path.clone()))
        });
        let Some((i, fd, path)) = denied else { return Ok(()) };
        let reason = format!(
            "{path} was opened with rights its user does not have (opened before it changed users?): a restore, done as that user, could not open it again"
        );
        refuse_template(made, i, (format!("fd {fd}"), &reason), best_effort, report)?;
    }
}

fn refuse_template(
    made: &mut Vec<Template>,
    i: usize,
    (resource, reason): (String, &str),
    best_effort: bool,
    report: &mut CaptureReport,
) -> Result<()> {
    let t = &made[i];
    let u = Unrestorable { pid: t.image.pid, comm: t.image.comm.clone(), resource, reason: reason.into() };
    if !best_effort {
        for t in made.drain(..) {
            t.kill();
        }
        return Err(Error::Unsupported(u));
    }
    made.remove(i).kill();
    report.captured.retain(|p| *p != u.pid);
    report.reparented.retain(|r| r.pid != u.pid);
    report.unrestorable.push(u);
    Ok(())
}

/// Whether anonymous pipe `pipe` had an end at the checkpoint that none of
/// the captured processes (`made`) holds: a reader, or a writer, outside.
fn end_outside(pipe: &crate::model::PipeBuffer, made: &[Template]) -> bool {
    let (readers, writers) = pipe.ends;
    let ends =
        made.iter().flat_map(|t| &t.image.fds).filter(|f| matches!(f.kind, FdKind::Pipe { ino } if ino == pipe.ino));
    let (mut read, mut write) = (false, false);
    for f in ends {
        let mode = f.flags & libc::O_ACCMODE as u32;
        read |= mode != libc::O_WRONLY as u32;
        write |= mode != libc::O_RDONLY as u32;
    }
    (readers && !read) || (writers && !write)
}

/// A stopped original's template, forked: a child of init (no exit
/// signal: the parent's plain `wait` never sees it; init reaps with
/// `__WALL`), or, for a child of another process, made init's child in two
/// steps (`process::tree`). With `during`, the copy runs on another CPU
/// while `during` runs. Returns its host pid, pid in the sandbox, and its
/// registers when forked by `clone` here.
fn fork_template(
    orig: &mut Tracee,
    s: &StoppedProcess,
    queued: &[crate::model::QueuedSignal],
    mut during: Option<&mut During<'_>>,
    seen: &mut Seen,
) -> Result<(HostPid, SandboxPid, Option<ptrace::Regs>)> {
    let host = s.host;
    // On another CPU (the copy runs in the process's own context), and
    // back for the calls that follow: the template inherits the pin.
    let apart = during.is_some();
    if apart {
        inject::move_off_tracer(host);
    }
    if s.ns_ppid != SandboxPid::INIT {
        let mut between = || {
            if let Some(during) = during.as_mut() {
                during(seen, &mut || {});
            }
        };
        let made = crate::process::tree::template_of_child(orig, (s.ns_pid, queued), &mut between);
        if apart {
            inject::pin_to_tracer(host);
        }
        let (tpl, ns_pid) = made?;
        if apart {
            inject::pin_to_tracer(tpl);
        }
        return Ok((tpl, ns_pid, None));
    }
    let flags = libc::CLONE_PARENT as u64;
    let started = orig.start_clone(flags);
    if let (Ok(()), Some(during)) = (&started, during.as_mut()) {
        during(seen, &mut || {});
    }
    if apart {
        inject::pin_to_tracer(host);
    }
    started?;
    let (tpl, ns_pid, regs) = orig.finish_clone(flags, "clone (template)")?;
    if apart {
        inject::pin_to_tracer(tpl);
    }
    Ok((tpl, ns_pid, Some(regs)))
}

/// The mappings of original `host` marked `MADV_DONTFORK` (start, end,
/// private and anonymous), if its forked template `tpl` lacks memory it
/// has (`vm_size_kb`; the kernel's `[uprobes]` page is left out too, and
/// made again at the next probe hit): `None` when it lacks none.
fn dont_fork_left_out(host: HostPid, tpl: HostPid, vm_size_kb: u64) -> std::io::Result<Option<Vec<(u64, u64, bool)>>> {
    let statm = std::fs::read_to_string(format!("/proc/{tpl}/statm"))?;
    let pages: u64 = statm.split_whitespace().next().and_then(|v| v.parse().ok()).unwrap_or(0);
    let tpl_kb = pages * (rustix::param::page_size() as u64 / 1024);
    if tpl_kb >= vm_size_kb || vm_size_kb - tpl_kb <= uprobes_kb(host) {
        return Ok(None);
    }
    let ranges = procfs::dont_fork_ranges(host)?;
    Ok((!ranges.is_empty()).then_some(ranges))
}

/// What pass 1 reads of a stopped original's descriptors, through a
/// process that holds them: the original, or, for its files in flight,
/// its template (`kinds/in_flight.rs`).
struct Through {
    /// Deleted files' contents, by descriptor.
    ghosts: Vec<(i32, std::sync::Arc<crate::fdstate::SparseCopy>)>,
    /// Pipe bytes not `seen` yet, and each pipe descriptor's key.
    pipes: Vec<crate::model::PipeBuffer>,
    pipe_keys: Vec<(i32, (u64, u64))>,
    /// Shared memory objects (the template holds the objects, not their
    /// contents): where each is held, and the copies of those not `seen`.
    shared_memory_held: Vec<(crate::process::shared_memory::ObjectKey, crate::process::shared_memory::Reach)>,
    shared_memory: Vec<crate::process::shared_memory::SharedMemoryCopy>,
}

impl Through {
    /// Descriptors `fds` (and mappings `maps`) read through stopped
    /// process `host`: deleted files' contents, TCP and UDP state, pipe
    /// bytes, shared memory, copied while every process is stopped.
    fn capture(
        host: HostPid,
        fds: &mut [crate::model::FdImage],
        maps: &[crate::model::MapImage],
        seen: &mut Seen,
    ) -> Result<Through> {
        let ghosts = crate::kinds::capture_contents(host, fds)?;
        crate::kinds::capture_tcp(host, fds);
        crate::kinds::capture_udp(host, fds);
        let (pipes, pipe_keys) = crate::kinds::capture_pipe(host, fds, seen)?;
        let shared_memory_held = crate::process::shared_memory::held(host, maps, fds).map_err(|e| Error::Proc {
            pid: host,
            what: "shared memory",
            source: e,
        })?;
        let shared_memory = crate::process::shared_memory::capture(host, &shared_memory_held, seen)?;
        Ok(Through { ghosts, pipes, pipe_keys, shared_memory_held, shared_memory })
    }

    /// `more` added.
    fn append(&mut self, more: Through) {
        self.ghosts.extend(more.ghosts);
        self.pipes.extend(more.pipes);
        self.pipe_keys.extend(more.pipe_keys);
        self.shared_memory_held.extend(more.shared_memory_held);
        self.shared_memory.extend(more.shared_memory);
    }
}

/// Pass 1 for one stopped original: its timers and the `clone`, then its
/// descriptors, pipe bytes and queued signals (the fork changed nothing of
/// them). An error after the first injected call lets the original go with
/// its own signal mask back, and kills the template if there is one.
///
/// With `during`, the copy is made on another CPU while `during` runs
/// (see [`clone_all`]).
fn clone_of(
    s: &StoppedProcess,
    mounts: &std::collections::HashMap<i32, sandtree_sys::mountinfo::MountEntry>,
    seen: &mut Seen,
    need_holder: bool,
    mut during: Option<During<'_>>,
    mut track: Option<Track>,
) -> Result<Cloned> {
    let host = s.host;
    let t0 = std::time::Instant::now();
    let comm_now = || std::fs::read_to_string(format!("/proc/{host}/comm")).unwrap_or_default().trim_end().to_string();
    // Before any injected call (they run with every signal blocked).
    let blocked = ptrace::sigmask(host.raw()).map_err(Error::ptrace(host, "GETSIGMASK"))?;
    let insn = inject::find_syscall_insn(host)?;
    let affinity = inject::affinity(host);
    // POSIX timers, listed now (read by injected calls in `before`).
    let listed_timers = match procfs::has_posix_timers(host) {
        false => Vec::new(),
        true if !sandtree_sys::process::timer_ids_restorable() => {
            return Err(Error::unsupported(
                s.ns_pid,
                &comm_now(),
                "timers",
                "POSIX timers (timer_create), whose ids this kernel cannot give back (PR_TIMER_CREATE_RESTORE_IDS: Linux 6.17)",
            ));
        }
        true => procfs::posix_timers(host).map_err(|e| Error::Proc { pid: host, what: "timers", source: e })?,
    };
    let timer_threads: Vec<(HostPid, SandboxPid)> =
        std::iter::once((host, s.ns_pid)).chain(s.threads.iter().map(|&(tid, ns, _)| (tid, ns))).collect();
    // The template inherits the pin (it never runs but to serve us); the
    // original gets its own affinity back before it runs.
    inject::pin_to_tracer(host);
    // Killed rather than left running with injected registers if the
    // daemon dies while we work in it.
    if let Err(e) = ptrace::set_exit_kill(host.raw(), true) {
        inject::set_affinity(host, &affinity);
        return Err(Error::ptrace(host, "SETOPTIONS")(e));
    }
    let mut orig = Tracee::new(host, s.regs, insn);
    let mut child = None;
    // The other threads' tracees (calls were injected into them): let go
    // with their own masks by `release_all`, or below on an error.
    let mut thread_tracees: Vec<(Tracee, ptrace::Regs)> = Vec::new();
    let made = || -> Result<Cloned> {
        let rseq = ptrace::rseq_configuration(host.raw()).ok().flatten();
        let mut image_regs = s.regs;
        crate::process::threads::rseq_abort(host, rseq, &mut image_regs);
        // A tracked process with a base: its template from the previous
        // one's standby, if it can be (`incremental.rs`).
        let incremental =
            track.as_mut().and_then(|tk| Some((tk.tracking.as_ref()?, tk.base.take()?, tk.copier.as_mut())));
        // Registers and FPU state as the previous template's image has
        // them: the process may have run no code since.
        let quiet = incremental
            .as_ref()
            .and_then(|(_, base, _)| Some((base.template, base.quiet.as_ref()?)))
            .filter(|(_, q)| s.threads.is_empty() && q.regs == Registers::from(&image_regs))
            .and_then(|(template, q)| {
                let now = ptrace::xstate(host.raw()).ok()?;
                (ptrace::xstate(template.raw()).ok()? == now).then(|| (now, q.altstack.clone()))
            });
        let (quiet, quiet_altstack) = match quiet {
            Some((xstate, altstack)) => (Some(xstate), Some(altstack)),
            None => (None, None),
        };
        // The tracer's part of pass 1 before the copy (for a tracked
        // process with a base, while another thread checks and reads its
        // pages): returns the caught-signal mask. (`quiet`: the process
        // ran no code since its previous template, whose image has no
        // armed interval timer: none is armed now, and its alternate stack
        // is the one then.)
        let before = |orig: &mut Tracee, quiet: bool| -> Result<crate::incremental::StoppedReads<_>> {
            // Pending signals before the timers are read: a one-shot timer
            // that fires meanwhile then shows in neither rather than in
            // both (a periodic one keeps firing, see below).
            let status = procfs::status(host).map_err(|e| Error::Proc { pid: host, what: "status", source: e })?;
            // (Kept in `status` too: each other thread's credentials are
            // compared with its lines, `process::threads::capture`.)
            let text = status.text.clone();
            let queued = crate::process::signals::capture_pending(host, status.signals.pending)?;
            let itimers = match quiet {
                true => (Vec::new(), quiet_altstack.clone().flatten(), false),
                false => crate::process::timers::capture(s, orig)?,
            };
            let posix_timers = match listed_timers.is_empty() {
                true => Vec::new(),
                false => crate::process::timers::capture_posix(s, orig, &listed_timers, &timer_threads)?,
            };
            Ok(crate::incremental::StoppedReads {
                caught: status.signals.caught,
                status: text,
                rest: (status, queued, itimers, posix_timers),
            })
        };
        let (patched, fds, (status, queued, (mut itimers, altstack, child_subreaper), posix_timers)) = match incremental
        {
            Some((tracking, base, copier)) => {
                let (patched, fds, pre) = crate::incremental::patch(
                    s,
                    &mut orig,
                    tracking,
                    base,
                    (rseq, mounts),
                    copier,
                    quiet,
                    before,
                    &mut during,
                    seen,
                )?;
                (patched, Some(fds), pre)
            }
            _ => (None, None, before(&mut orig, false)?.rest),
        };
        let pending = status.signals.pending;
        let vm_size_kb = status.vm_size_kb;
        // (A standby still being forked: `p.host` is the template forking
        // it, which is not this checkpoint's to kill.)
        let deferred = patched.as_ref().is_some_and(|p| p.pending.is_later());
        let mut dont_fork = Vec::new();
        let (tpl, ns_pid, forked_regs) = match &patched {
            Some(p) => (p.host, p.ns_pid, None),
            None => {
                let first = fork_template(&mut orig, s, &queued, during.as_mut(), seen)?;
                // Memory a fork leaves out (`MADV_DONTFORK`): the mark is
                // lifted for a second fork, then set again.
                match dont_fork_left_out(host, first.0, vm_size_kb) {
                    Ok(None) => first,
                    left_out => {
                        kill_tracee(first.0);
                        let ranges = left_out.map_err(|e| Error::Proc { pid: host, what: "smaps", source: e })?;
                        let ranges = ranges.unwrap_or_default();
                        if let Some(&(start, end, _)) = ranges.iter().find(|r| !r.2) {
                            return Err(Error::unsupported(
                                s.ns_pid,
                                &comm_now(),
                                format!("mapping {start:x}-{end:x}"),
                                "a shared or file mapping marked MADV_DONTFORK, which a copy by fork leaves out (not captured yet)",
                            ));
                        }
                        let madvise = |orig: &mut Tracee, advice: i32, what| -> Result<()> {
                            for &(start, end, _) in &ranges {
                                orig.call(what, libc::SYS_madvise, &[start, end - start, advice as u64])?;
                            }
                            Ok(())
                        };
                        let again = madvise(&mut orig, libc::MADV_DOFORK, "madvise(MADV_DOFORK)")
                            .and_then(|()| fork_template(&mut orig, s, &queued, None, seen));
                        // (Marked again whatever happened.)
                        let marked = madvise(&mut orig, libc::MADV_DONTFORK, "madvise(MADV_DONTFORK)");
                        let again = again?;
                        if let Err(e) = marked {
                            kill_tracee(again.0);
                            return Err(e);
                        }
                        dont_fork = ranges.iter().map(|&(a, b, _)| (a, b)).collect();
                        again
                    }
                }
            }
        };
        child = (!deferred).then_some(tpl);
        let template_regs = forked_regs;
        // A forked template leaves the original's session or group at once
        // (one made from a standby, at its set-up: `Template::prepare`): a
        // group kill right after the checkpoint (`kill -- -PGID`) would
        // reach it, and the group's id would stay taken. (A child of
        // another process's left them as it was made.)
        if let Some(regs) = forked_regs {
            let mut t = Tracee::new(tpl, regs, insn);
            // (A session of the sandbox whatever its leader:
            // `process::session::made_by_session`.)
            if status.ns_sid == s.ns_pid || status.ns_sid.raw() != 0 {
                t.call("setsid (template)", libc::SYS_setsid, &[])?;
            } else {
                t.call("setpgid (template)", libc::SYS_setpgid, &[0, 0])?;
            }
        }
        let t_clone = t0.elapsed();
        // Tracking: armed at a process's first fork; after any fork the
        // pages count as unwritten from here (the fork has them all).
        let mut fingerprint = patched.as_ref().map(|p| p.fingerprint.clone());
        let mut forked_maps = None;
        if patched.is_none()
            && let Some(tk) = track.as_mut()
        {
            match track_after_fork(host, &mut orig, &mut tk.tracking) {
                Ok((fp, maps)) => {
                    fingerprint = Some(fp);
                    forked_maps = Some(maps);
                }
                Err(e @ Error::Died { .. }) => return Err(e),
                Err(e) => {
                    tracing::debug!(pid = s.ns_pid.raw(), "not tracked: {e}");
                    tk.tracking = None;
                }
            }
        }
        // A forked template: memory the fork left empty that the original
        // has pages in (`MADV_WIPEONFORK`), asked while it is stopped.
        let maps = match (&patched, forked_maps) {
            (Some(p), _) => p.maps.clone(),
            (None, Some(maps)) => maps,
            (None, None) => procfs::maps(host).map_err(|e| Error::Proc { pid: host, what: "maps", source: e })?,
        };
        let wiped = match patched.is_none() {
            true => crate::process::memory::wiped_by_fork(host, tpl, &maps).map_err(|e| Error::Proc {
                pid: host,
                what: "memory the fork left out",
                source: e,
            })?,
            false => None,
        };
        // The original's session, group and terminal: a template made for
        // a child of another process left them as it was made
        // (`process::tree`), and one made from a standby has the
        // previous template's.
        let session = Some((
            status.ns_pgid,
            status.ns_sid,
            procfs::tty_nr(host).map_err(|e| Error::Proc { pid: host, what: "stat", source: e })? != 0,
        ));

        let mut fds = match fds {
            Some(fds) => fds,
            None => procfs::fds(host, mounts).map_err(|e| Error::Proc { pid: host, what: "fds", source: e })?,
        };
        // Threads made after the first check (it is stopped now: final).
        let comm = comm_now();
        // Its children stopped by a signal whose stop it has not waited
        // for yet: their stops are reported again at a restore.
        let stop_reports = crate::process::session::stop_reports(&mut orig, s)?;
        // A terminal's foreground group (a job's, given back at the
        // restore), and the signal the parent gets at its end.
        let (tpgid, exit_signal) =
            procfs::tpgid_and_exit_signal(host).map_err(|e| Error::Proc { pid: host, what: "stat", source: e })?;
        let tpgid = procfs::foreground_group(tpgid, (host, s.ns_pid));
        // (A periodic timer expired while stopped is armed for one interval.)
        crate::process::timers::normalize(&mut itimers);
        // Queued on its unix sockets, with the files in flight, which its
        // template is given (`kinds/in_flight.rs`).
        let who = (s.ns_pid, &comm_now as &dyn Fn() -> String);
        let mut queues = crate::kinds::capture_unix_queue(host, &fds, seen, who)?;
        // (And on its unconnected datagram sockets.)
        let datagram_files = crate::kinds::capture_unix_datagrams(host, &mut fds);
        if queues.iter().any(|(b, passed)| b.peer == 0 && !passed.is_empty()) {
            return Err(Error::unsupported(
                s.ns_pid,
                &comm_now(),
                "unix socket",
                "files in flight (SCM_RIGHTS) on an end of a unix socket pair whose other end was closed",
            ));
        }
        let any_in_flight = crate::kinds::in_flight_any(&queues) || !datagram_files.is_empty();
        let mut in_flight = match (any_in_flight, patched.is_none()) {
            (false, _) => Vec::new(),
            (true, true) => {
                // (A child of another process's template, made in two
                // steps, stopped where the second left it.)
                let regs = match template_regs {
                    Some(regs) => regs,
                    None => ptrace::regs(tpl.raw()).map_err(Error::ptrace(tpl, "GETREGS"))?,
                };
                let mut t = Tracee::new(tpl, regs, insn);
                crate::kinds::give_in_flight(&mut t, &mut fds, (&mut queues, datagram_files), mounts, s.ns_pid)?
            }
            (true, false) => {
                return Err(Error::unsupported(
                    s.ns_pid,
                    &comm_now(),
                    "unix socket",
                    "files in flight (SCM_RIGHTS) on a unix socket of a process whose template came from a standby",
                ));
            }
        };
        let mut got = Through::capture(host, &mut fds, &maps, seen)?;
        let mut sockets: Vec<crate::model::SocketBuffer> = queues.into_iter().map(|(b, _)| b).collect();
        // The files in flight, through the template that holds them.
        if !in_flight.is_empty() {
            got.append(Through::capture(tpl, &mut in_flight, &[], seen)?);
            let nested_datagrams = crate::kinds::capture_unix_datagrams(tpl, &mut in_flight);
            let nested = crate::kinds::capture_unix_queue(tpl, &in_flight, seen, who)?;
            if crate::kinds::in_flight_any(&nested) || !nested_datagrams.is_empty() {
                return Err(Error::unsupported(
                    s.ns_pid,
                    &comm_now(),
                    "unix socket",
                    "files in flight on a unix socket that is itself in flight (SCM_RIGHTS)",
                ));
            }
            sockets.extend(nested.into_iter().map(|(b, _)| b));
        }
        fds.append(&mut in_flight);
        let Through { ghosts, pipes, pipe_keys, shared_memory_held, shared_memory } = got;
        let robust_list = ptrace::robust_list(host.raw()).ok();
        let mut threads = Vec::new();
        for &(tid, ns_tid, regs) in &s.threads {
            threads.push(crate::process::threads::capture(
                s,
                &status.text,
                (tid, ns_tid, regs),
                insn,
                &mut thread_tracees,
            )?);
        }
        let link = |what: &str| procfs::readlink(format!("/proc/{host}/{what}"));
        let paths = (link("cwd"), link("root"), link("exe").unwrap_or_default());
        let paths = match paths {
            (Ok(cwd), Ok(root), exe) => (cwd, root, exe),
            (Err(e), ..) | (_, Err(e), _) => return Err(Error::Proc { pid: host, what: "cwd and root", source: e }),
        };
        tracing::debug!(pid = s.ns_pid.raw(), ?t_clone, all = ?t0.elapsed(), "template cloned");
        let from_standby = patched.is_some();
        let (patched, to_write, prev) = match patched {
            Some(p) => (Some((p.scratch, p.maps, p.generation)), Some(p.pending), Some(p.prev)),
            None => (None, None, None),
        };
        let (tracking, copier) = track.map(|t| (t.tracking, t.copier)).unwrap_or_default();
        Ok(Cloned {
            holder: None,
            orig: None,
            stopped: StoppedProcess {
                host,
                ns_pid: s.ns_pid,
                ns_ppid: s.ns_ppid,
                regs: s.regs,
                threads: s.threads.clone(),
                job_stopped: s.job_stopped,
                stopped_children: s.stopped_children.clone(),
                zombies: s.zombies.clone(),
            },
            threads,
            thread_tracees: Vec::new(),
            robust_list,
            image_regs,
            fds,
            pending,
            blocked,
            queued,
            affinity: affinity.clone(),
            pipes,
            shared_memory,
            shared_memory_held,
            sockets,
            ghosts,
            itimers,
            posix_timers,
            altstack,
            child_subreaper,
            rseq,
            paths,
            host: tpl,
            ns_pid,
            insn,
            tracking,
            fingerprint,
            to_write,
            prev,
            patched,
            session,
            pipe_keys,
            vm_size_kb,
            wiped,
            dont_fork,
            copier,
            facts: from_standby.then_some((status, comm)),
            exit_signal,
            tpgid,
            stop_reports,
        })
    };
    let mut c = match made() {
        Ok(c) => c,
        Err(e) => {
            // Let the original go with its own mask and held signals (the
            // caller's `let_go` then finds it running), the template die.
            inject::set_affinity(host, &affinity);
            let _ = ptrace::set_exit_kill(host.raw(), false);
            let _ = orig.release(&s.regs);
            release_threads(std::mem::take(&mut thread_tracees));
            if let Some(tpl) = child {
                kill_tracee(tpl);
            }
            return Err(e);
        }
    };
    c.thread_tracees = thread_tracees;
    // Its first checkpoint: a holder of its memory, so that a rollback's
    // kill of it does not wait for the teardown (`memory_holder.rs`).
    // (Not for a child of another process: the holder, a child of the
    // process it holds, would show to it. Its restore, by its parent, does
    // not need one either: `transplant.rs`.)
    if need_holder && s.ns_ppid == SandboxPid::INIT {
        match crate::memory_holder::make(&mut orig) {
            Ok(h) => c.holder = Some(h),
            Err(e) => tracing::warn!(pid = s.ns_pid.raw(), "no mm holder: {e}"),
        }
    }
    c.orig = Some(orig);
    Ok(c)
}

/// Pass 2 for one template: image and checks (`Template::prepare` follows once
/// the checkpoint is over).
fn set_up(c: Cloned) -> Result<Template> {
    let child = c.host;
    let s = &c.stopped;
    let t0 = std::time::Instant::now();
    // (A template made from a standby has the process's map, read then.)
    let (scratch, maps, generation) = match c.patched {
        Some((scratch, maps, generation)) => (scratch, Some(maps), generation),
        None => ((0, false), None, 0),
    };
    let incremental = maps.is_some();
    let regs = Registers::from(&c.image_regs);
    // (Read of the template: ~50-75 µs a process, after the window but on
    // the checkpoint's path.)
    let forked = c.facts.is_none();
    let facts = match c.facts {
        Some((status, comm)) => {
            let tty_nr = c.session.map_or(0, |(_, _, tty)| i64::from(tty));
            Ok(procfs::TemplateFacts { status, tty_nr, comm, maps: None })
        }
        _ => procfs::template_facts(child, maps.is_none()),
    };
    // A forked template lacks the mappings fork does not copy
    // (`MADV_DONTFORK`): its map is smaller than the original's was.
    if let Ok(f) = &facts
        && forked
        && f.status.vm_size_kb < c.vm_size_kb
        // (The kernel's own `[uprobes]` page is not copied either; it is
        // made again at the next probe hit. Looked for only now, in the
        // original's map.)
        && c.vm_size_kb - f.status.vm_size_kb > uprobes_kb(s.host)
    {
        let missing = c.vm_size_kb - f.status.vm_size_kb;
        return Err(Error::unsupported(
            s.ns_pid,
            &f.comm,
            "memory",
            format!(
                "{missing} kB of its memory is mapped with MADV_DONTFORK, which a copy by fork leaves out (not captured yet)"
            ),
        ));
    }
    if let (Ok(f), Some((start, end))) = (&facts, c.wiped) {
        return Err(Error::unsupported(
            s.ns_pid,
            &f.comm,
            "memory",
            format!(
                "mapping {start:x}-{end:x} is marked MADV_WIPEONFORK: a copy by fork gets it zeroed, and its {} kB would be lost (not captured yet)",
                (end - start) / 1024
            ),
        ));
    }
    let mut image = facts
        .and_then(|f| procfs::capture((s.ns_pid, s.ns_ppid), regs, c.fds, c.paths, f, maps))
        .map_err(|e| Error::Proc { pid: child, what: "state", source: e })?;
    image.signals.pending = c.pending;
    image.ghosts = c.ghosts;
    for m in &mut image.maps {
        m.dont_fork |= c.dont_fork.iter().any(|&(start, end)| m.start >= start && m.end <= end);
    }
    image.itimers = c.itimers;
    image.posix_timers = c.posix_timers;
    image.altstack = c.altstack;
    image.child_subreaper = c.child_subreaper;
    image.exit_signal = c.exit_signal;
    image.tpgid = c.tpgid;
    image.stop_reports = c.stop_reports;
    image.zombies = c.stopped.zombies.clone();
    image.job_stopped = c.stopped.job_stopped;
    image.cwd_denied = crate::process::access::cwd_denied(child, &image);
    image.cwd_remade = crate::process::access::deleted_cwd((child, s.host), &image);
    crate::process::access::deleted_dirs(child, &mut image);
    if let Some((fd, what)) = crate::process::access::fd_denied(s.host, child, &mut image) {
        return Err(Error::unsupported(
            s.ns_pid,
            &image.comm,
            format!("fd {fd}"),
            format!(
                "{what} was opened with rights its user does not have (opened before it changed users?): a restore, done as that user, could not open it again"
            ),
        ));
    }
    image.rseq = c.rseq;
    image.robust_list = c.robust_list;
    image.threads = 1 + c.threads.len() as u32;
    image.other_threads = c.threads;
    image.signals.blocked = c.blocked;
    image.queued_signals = c.queued;
    image.affinity = c.affinity;
    if let Some((pgid, sid, tty)) = c.session {
        image.pgid = pgid;
        image.sid = sid;
        image.has_tty = tty;
    }
    check_image(&image).map_err(Error::Unsupported)?;
    tracing::debug!(pid = s.ns_pid.raw(), took = ?t0.elapsed(), "template image read");
    let tracee = Tracee::new(child, s.regs, c.insn);
    let any_pid = !crate::check::may_choose_pid(&image);
    Ok(Template {
        image,
        host: child,
        ns_pid: c.ns_pid,
        tracee,
        scratch: scratch.0,
        scratch_exec: scratch.1,
        standby: None,
        forking: None,
        no_standby: false,
        standby_taken: false,
        // (A template that may not choose its standby's pid forks it with
        // whatever pid comes: a try with one would fail, and a checkpoint
        // that took that fork under way would lose its templates.)
        any_pid,
        fingerprint: c.fingerprint,
        incremental,
        generation,
        changed_since: None,
        to_write: c.to_write,
        advice: None,
    })
}

/// The size (kB) of the kernel's `[uprobes]` mapping in `host`'s map, if
/// it has one.
fn uprobes_kb(host: HostPid) -> u64 {
    procfs::maps(host)
        .map(|maps| {
            maps.iter().filter(|m| m.path.as_deref() == Some("[uprobes]")).map(|m| (m.end - m.start) / 1024).sum()
        })
        .unwrap_or(0)
}

/// Every check of the template path on a captured image: the process's
/// own state, each descriptor's (`kinds/`), then its memory.
fn check_image(p: &crate::model::ProcessImage) -> std::result::Result<(), Unrestorable> {
    check::check_process(p)?;
    crate::kinds::check(p).map_err(|(resource, reason)| Unrestorable {
        pid: p.pid,
        comm: p.comm.clone(),
        resource,
        reason,
    })?;
    crate::process::memory::check(p)
}

/// Whether a mount on `target` of type `fstype` is one the sandbox's setup
/// makes under the kept `/proc` and `/dev` (`sandtree-sandbox`'s
/// `spawn.rs`; its rollback keeps those alone, `reroot.rs`'s
/// `setup_mount`): `proc`, the `/dev` tmpfs, devpts, `/dev/shm`, and the
/// host's device nodes bound into `/dev`.
fn setup_mount(target: &str, fstype: &str) -> bool {
    const NODES: [&str; 6] = ["null", "zero", "full", "random", "urandom", "tty"];
    match target {
        "/proc" => fstype == "proc",
        "/dev" | "/dev/shm" => fstype == "tmpfs",
        "/dev/pts" => fstype == "devpts",
        t => t.strip_prefix("/dev/").is_some_and(|n| NODES.contains(&n)),
    }
}

/// A mount of the daemon's under the kept `/dev` (`sandtree-sandbox`'s
/// `reroot.rs`, `STAGE` and `OLD`: the next layer's tree staged for a
/// layered checkpoint, the old tree being detached), which may stack.
fn daemons_mount(target: &str) -> bool {
    ["/dev/.sandtree-next", "/dev/.sandtree-old"].iter().any(|d| target == *d || target.starts_with(&format!("{d}/")))
}

/// A mount the sandbox made, as a refusal: in its tree, a filesystem other
/// than the layers' overlays, a second mount of a layer (a bind mount: the
/// same upper directory, mounted later), or a layer remounted read-only;
/// under the kept `/proc` and `/dev`, any but setup's ([`setup_mount`],
/// once each: a rollback detaches the others) and the daemon's
/// ([`daemons_mount`]). Named as init's: mounts are
/// the sandbox's, not a process's. Checked with processes or without (a
/// mount outlives the command that made it).
fn sandbox_mount(mounts: &std::collections::HashMap<i32, sandtree_sys::mountinfo::MountEntry>) -> Option<Unrestorable> {
    let mut ids: Vec<&i32> = mounts.keys().collect();
    ids.sort();
    let mut uppers: Vec<std::path::PathBuf> = Vec::new();
    let mut kept_seen: Vec<&std::path::Path> = Vec::new();
    for m in ids.into_iter().map(|id| &mounts[id]) {
        let target = m.target.to_string_lossy();
        if crate::kinds::kept_path(&target) {
            // Under the kept /proc and /dev, what setup mounted stays; a
            // rollback detaches anything else there (and stacked on those).
            if daemons_mount(&target) || (setup_mount(&target, &m.fstype) && !kept_seen.contains(&m.target.as_path())) {
                kept_seen.push(&m.target);
                continue;
            }
            return Some(Unrestorable {
                pid: SandboxPid::INIT,
                comm: "sandtree:[init]".into(),
                resource: format!("mount {target}"),
                reason: format!(
                    "a {} file system mounted on {target} by the sandbox: a rollback detaches the sandbox's mounts under /proc and /dev and would lose it (mounts are not captured yet; unmount it, or checkpoint with best effort)",
                    m.fstype
                ),
            });
        }
        let what = match m.fstype.as_str() {
            "overlay" => {
                let upper = m.option("upperdir").unwrap_or_default();
                if uppers.contains(&upper) {
                    Some("a bind mount of the sandbox's tree".to_string())
                } else if m.super_options.split(',').any(|o| o == "ro") {
                    Some("a layer of the sandbox's tree remounted read-only".to_string())
                } else {
                    uppers.push(upper);
                    None
                }
            }
            other => Some(format!("a {other} file system")),
        };
        if let Some(what) = what {
            return Some(Unrestorable {
                pid: SandboxPid::INIT,
                comm: "sandtree:[init]".into(),
                resource: format!("mount {}", m.target.display()),
                reason: format!(
                    "{what} mounted on {} by the sandbox: a rollback replaces the tree and would lose it (mounts are not captured yet; unmount it, or checkpoint with best effort)",
                    m.target.display()
                ),
            });
        }
    }
    None
}
