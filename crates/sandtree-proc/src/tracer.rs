//! The tracer thread of one sandbox, the state it owns, and the
//! checkpoint's states.
//!
//! ptrace is per thread: every request for a tracee must come from the
//! thread that attached it, and templates stay attached for as long as they
//! live. So each sandbox gets one OS thread (`sandtree:tracer`) that owns
//! all of its tracees; callers send it closures over a channel and block on
//! the answer (from `block_in_place` in async code). When the [`Tracer`] is
//! dropped the thread ends and `PTRACE_O_EXITKILL` kills the templates.
//!
//! Everything the thread owns is its [`State`], whose fields are private
//! to this file: the stop (`stop.rs`), the template pool (`pool/`), the
//! holders of live processes, their trackings, the dying list, the pool's
//! cgroup. The passes take the parts they use ([`crate::checkpoint::Parts`],
//! [`crate::restore::Parts`]).
//!
//! A checkpoint is a typed transaction: [`Tracer::stop`] gives a
//! [`Stopped`], whose [`Stopped::capture`] gives a [`Captured`], whose
//! [`Captured::release`] gives a [`Released`], whose [`Released::set_up`]
//! ends it; a layered one goes through [`Tracer::stop_and_clone`],
//! [`Cloning::finish`] and a [`Copied`]. Each state lets the processes go
//! (and drops the templates not yet in the pool) when dropped before its
//! next step (`Resumes`).
//!
//! Between jobs, while no operation is in flight ([`Tracer::begin`]), the
//! thread does the pool's work: pages to write, set-ups, standbys (one
//! fork at a time).

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::mpsc;
use std::thread::JoinHandle;

use crate::check::Unrestorable;
use crate::checkpoint::CaptureReport;
use crate::inject::kill_tracee;
use crate::pool::TemplateStatus;
use crate::restore::RestoreReport;
use crate::stop::StopReport;
use crate::{Error, HostPid, Result, SandboxPid};

/// Everything the tracer thread owns.
#[derive(Default)]
pub(crate) struct State {
    /// What a checkpoint's stop holds.
    stops: crate::stop::Stops,
    /// Templates cloned by [`Tracer::clone_all`], not set up yet.
    cloned: Vec<crate::checkpoint::Cloned>,
    /// Processes refused in the first pass (best effort).
    refused: Vec<Unrestorable>,
    /// Holders of live processes' address spaces (`memory_holder.rs`).
    holders: Vec<crate::memory_holder::Holder>,
    /// Operations in flight ([`Tracer::begin`]), shared with the handle:
    /// no standby is made during one (init's kill list was taken, or
    /// processes are stopped).
    ops: Arc<AtomicU32>,
    /// Killed pool processes not reaped yet.
    dying: Vec<crate::reap::Dying>,
    /// The templates of every checkpoint (`pool/`).
    pool: crate::pool::Pool,
    /// Descriptors opened in stopped processes for a new tree
    /// (`repoint.rs`), until they are put in place or closed.
    repointed: Vec<crate::repoint::Reopened>,
    /// Written-page tracking of live processes, by host pid (`track.rs`).
    tracking: crate::track::Trackings,
    /// Processes this large (resident bytes) or more are tracked, and get
    /// incremental templates; `None`: none is.
    incremental_min_rss: Option<u64>,
    /// The sandbox's init (host pid), once a checkpoint named it.
    init_host: HostPid,
    /// Its mount table.
    mounts: crate::procfs::MountCache,
    /// The pool's cgroup (`cgroup.rs`), if it has one, and what was moved
    /// there.
    placement: crate::cgroup::PoolPlacement,
    /// The engine's counters and test switches (`stats.rs`).
    instruments: Arc<crate::stats::Instruments>,
}

/// A job's result to come from the tracer thread.
pub struct Started<R>(mpsc::Receiver<R>);

/// What [`Tracer::stop_and_clone`] returns: the processes are stopped.
pub struct StopAndClone<'t> {
    pub report: StopReport,
    /// The templates' copy, under way (`None`: not started, the report is
    /// `foreign`; dropping this lets the processes go).
    pub cloning: Option<Cloning<'t>>,
    /// (Lets the processes go when no copy was started.)
    _stopped: Option<Resumes<'t>>,
}

/// The copy of [`Tracer::stop_and_clone`], under way. Dropped, it lets
/// the processes go.
pub struct Cloning<'t> {
    done: Started<Result<CopyEnd>>,
    checked: mpsc::Receiver<std::result::Result<(), String>>,
    stage: mpsc::Sender<Option<String>>,
    stopped: Resumes<'t>,
}

impl<'t> Cloning<'t> {
    /// Wait for the check of whether the processes can move to a new tree
    /// (not for the end): its verdict, or `None` when there was none (no
    /// tree given, a process let go, or the copy failed: [`Cloning::finish`]
    /// tells).
    pub fn checked(&self) -> Option<std::result::Result<(), String>> {
        self.checked.recv().ok()
    }

    /// Tell the copy where init staged the new tree (`None`: it did not)
    /// and wait for its end. When the processes can move, the copy's job
    /// opens their files and cwd again through `stage` at once
    /// ([`crate::repoint`]'s step 2), with no round trip to the caller.
    pub fn finish(self, stage: Option<&str>) -> Result<Copied<'t>> {
        // (No receiver: the job ended already, and says why.)
        let _ = self.stage.send(stage.map(str::to_string));
        let CopyEnd { kept, movable } = self.done.wait()??;
        let mut stopped = self.stopped;
        stopped.reopened = true;
        Ok(Copied { kept, movable, captured: Captured { kept, stopped } })
    }
}

/// What the copy's job of [`Tracer::stop_and_clone`] sends at its end.
struct CopyEnd {
    kept: bool,
    movable: Option<std::result::Result<(), String>>,
}

/// The end of the copy of [`Tracer::stop_and_clone`]: every process kept
/// stopped has its template. Next: [`Copied::finish_and_go`] once the
/// staged tree is swapped in, [`Copied::abort`] when it was not, or
/// [`Copied::into_captured`] for a snapshot checkpoint; dropped, it closes
/// what the processes opened through the staged tree and lets them go.
pub struct Copied<'t> {
    /// Whether every process stopped kept its template (in best effort,
    /// one that cannot be restored, or whose template died, was let go).
    pub kept: bool,
    /// When a [`crate::repoint::Tree`] was given and every process kept
    /// its template: whether they can move to a new tree, or why not
    /// ([`crate::repoint`]'s step 1); once the tree was staged, whether
    /// they opened their files there (step 2; on error nothing stays
    /// open).
    pub movable: Option<std::result::Result<(), String>>,
    captured: Captured<'t>,
}

impl<'t> Copied<'t> {
    /// The end of a layered checkpoint, in one job, once init moved the
    /// staged tree to `/`: each process puts its files opened again in
    /// place (`repoint.rs`'s step 3), every process runs again, and pass 2
    /// follows. An error is the first step's (every process was let go
    /// then).
    pub fn finish_and_go(self, ck: &str, best_effort: bool) -> Result<LayeredEnd> {
        let tracer = self.captured.stopped.disarm();
        tracer.finish_and_go(ck, best_effort)
    }

    /// The staged tree was not swapped in: what the processes opened
    /// through it is closed, they go, and their templates are dropped.
    pub fn abort(self) -> Result<()> {
        let tracer = self.captured.stopped.disarm();
        tracer.repoint_abort()?;
        tracer.resume_stopped()
    }

    /// The processes do not move to a new tree (a snapshot checkpoint
    /// instead): they stay stopped with their templates. (Nothing of
    /// theirs is open through the staged tree then: the copy's job opens
    /// their files there only when they can move and the tree was staged,
    /// and closes them again when they cannot.)
    pub fn into_captured(self) -> Captured<'t> {
        let mut captured = self.captured;
        captured.stopped.reopened = false;
        captured
    }
}

/// What [`Copied::finish_and_go`] did.
pub struct LayeredEnd {
    /// When the processes were let go.
    pub at: std::time::Instant,
    /// Pass 2 ([`Released::set_up`]).
    pub set_up: Result<CaptureReport>,
}

// The checkpoint as a typed transaction: stop -> capture -> release ->
// set up. Each state holds the processes as the engine left them, and
// lets them go when dropped before the next step: no caller undoes a
// step by hand.

/// Lets the stopped processes go (and drops the templates not yet in the
/// pool) when dropped armed: the undo of every state of a checkpoint.
struct Resumes<'t> {
    tracer: &'t Tracer,
    armed: bool,
    /// The processes may hold descriptors opened through a staged tree
    /// (`repoint.rs`'s step 2): closed first.
    reopened: bool,
}

impl<'t> Resumes<'t> {
    fn new(tracer: &'t Tracer) -> Resumes<'t> {
        Resumes { tracer, armed: true, reopened: false }
    }

    /// The next step took over: nothing to undo here.
    fn disarm(mut self) -> &'t Tracer {
        self.armed = false;
        self.tracer
    }
}

impl Drop for Resumes<'_> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        if self.reopened
            && let Err(e) = self.tracer.repoint_abort()
        {
            tracing::warn!("what the stopped processes opened through the staged tree could not be closed: {e}");
        }
        if let Err(e) = self.tracer.resume_stopped() {
            tracing::warn!("the stopped processes could not be let go: {e}");
        }
    }
}

/// Step 1 done ([`Tracer::stop`]): every process of the sandbox is
/// stopped (init too, when asked). Next: [`Stopped::capture`]; dropped,
/// the processes go.
#[must_use = "dropping it lets the processes go"]
pub struct Stopped<'t> {
    report: StopReport,
    stopped: Resumes<'t>,
}

impl<'t> Stopped<'t> {
    /// What the stop did.
    pub fn report(&self) -> &StopReport {
        &self.report
    }

    /// Pass 1 of the capture, while every process stays stopped (the
    /// caller snapshots the filesystem meanwhile). On error every process
    /// runs again and the templates made are dropped.
    pub fn capture(self, best_effort: bool) -> Result<Captured<'t>> {
        let kept = self.stopped.tracer.clone_all(best_effort)?;
        Ok(Captured { kept, stopped: self.stopped })
    }

    /// Let every process go now (dropping it does too, without the error).
    pub fn resume(self) -> Result<()> {
        self.stopped.disarm().resume_stopped()
    }
}

/// Pass 1 done: every process is still stopped, with its template.
/// Next: [`Captured::release`]; dropped, the processes go and the
/// templates are dropped.
#[must_use = "dropping it lets the processes go and drops their templates"]
pub struct Captured<'t> {
    kept: bool,
    stopped: Resumes<'t>,
}

impl<'t> Captured<'t> {
    /// Whether every process stopped is still stopped with its template
    /// (in best effort, one that cannot be restored, or whose template
    /// died, was let go).
    pub fn kept(&self) -> bool {
        self.kept
    }

    /// Let every process (and init) run again, templates kept: the end of
    /// the frozen window. Next: [`Released::set_up`].
    pub fn release(self) -> Result<Released<'t>> {
        self.stopped.tracer.release()?;
        let at = std::time::Instant::now();
        Ok(Released { at, templates: self.stopped })
    }

    /// Let every process go and drop the templates now (dropping it does
    /// too, without the error).
    pub fn resume(self) -> Result<()> {
        self.stopped.disarm().resume_stopped()
    }
}

/// The processes run again; their templates wait for pass 2. Next:
/// [`Released::set_up`]; dropped, the templates are dropped.
#[must_use = "dropping it drops the templates"]
pub struct Released<'t> {
    at: std::time::Instant,
    templates: Resumes<'t>,
}

impl Released<'_> {
    /// When the processes were let go.
    pub fn at(&self) -> std::time::Instant {
        self.at
    }

    /// Pass 2 of the capture: checks and template set-up; the templates
    /// join the pool as checkpoint `ck`.
    pub fn set_up(self, ck: &str, best_effort: bool) -> Result<CaptureReport> {
        self.templates.disarm().set_up(ck, best_effort)
    }
}

impl<R> Started<R> {
    /// Wait for the job's result.
    pub fn wait(self) -> Result<R> {
        self.0.recv().map_err(|_| Error::TracerGone)
    }
}

/// `checkpoint::clone_all`, and whether every process stopped kept its
/// template.
fn clone_all_kept(
    st: &mut crate::checkpoint::Parts<'_>,
    best_effort: bool,
    others_done: Option<crate::checkpoint::OthersDone<'_>>,
) -> Result<bool> {
    let stopped = st.stops.len();
    crate::checkpoint::clone_all(st, best_effort, others_done).map(|()| st.cloned.len() == stopped)
}

impl State {
    /// The parts of the state a checkpoint reads and changes.
    fn parts(&mut self) -> crate::checkpoint::Parts<'_> {
        crate::checkpoint::Parts {
            stops: &mut self.stops,
            cloned: &mut self.cloned,
            refused: &mut self.refused,
            repointed: &mut self.repointed,
            pool: &mut self.pool,
            holders: &mut self.holders,
            tracking: &mut self.tracking,
            init_host: self.init_host,
            mounts: &self.mounts,
            incremental_min_rss: self.incremental_min_rss,
            instruments: &self.instruments,
        }
    }

    /// Step 1 of a checkpoint ([`crate::stop::Stops::stop`]), the pool's
    /// processes spared and its standby forks under way sent to the
    /// background.
    fn stop(
        &mut self,
        list: &dyn Fn() -> std::io::Result<Vec<HostPid>>,
        init_host: HostPid,
        best_effort: bool,
        timeout: std::time::Duration,
        with_init: bool,
    ) -> Result<StopReport> {
        self.stops.settle_lingering();
        self.pool.forks_to_background(&self.tracking, &self.instruments.switches, true);
        self.init_host = init_host;
        let kept: std::collections::HashSet<HostPid> = self.kept_hosts().into_iter().collect();
        self.stops.stop(list, (init_host, &kept), best_effort, timeout, with_init)
    }

    /// Pool processes not moved to the pool's cgroup yet go there
    /// ([`crate::cgroup::PoolPlacement::sweep`]).
    fn sweep(&mut self) -> bool {
        let (pool, holders) = (&self.pool, &self.holders);
        self.placement.sweep(|| pool.hosts().chain(holders.iter().map(|h| h.host)))
    }

    /// Host pids of every process this tracer keeps (templates, holders,
    /// killed holders still tearing down): none of them is a sandbox
    /// process to capture.
    pub(crate) fn kept_hosts(&self) -> Vec<HostPid> {
        let mut v: Vec<HostPid> = self.pool.hosts().collect();
        v.extend(self.holders.iter().map(|h| h.host));
        v.extend(self.dying.iter().map(|d| d.host));
        v
    }

    /// In-sandbox pids of the pool's processes: templates, standbys,
    /// holders, and killed holders still tearing down.
    pub(crate) fn pool_pids(&self) -> Vec<SandboxPid> {
        let mut v: Vec<SandboxPid> = self.pool.ns_pids().collect();
        v.extend(self.holders.iter().map(|h| h.ns_pid));
        v.extend(self.dying.iter().map(|d| d.ns_pid));
        v
    }
}

/// What a rollback needs first ([`Tracer::rollback_plan`]).
#[derive(Clone, Debug, Default)]
pub struct RollbackPlan {
    /// The checkpoint's templates (`None`: it has none).
    pub templates: Option<TemplateStatus>,
    /// In-sandbox pids init must spare (the pool's processes).
    pub keep: Vec<SandboxPid>,
    /// The checkpoint's processes whose templates were found dead (killed
    /// from inside the sandbox, or by the OOM killer): its templates were
    /// dropped, so `templates` is `None`.
    pub killed: Vec<Unrestorable>,
}

type Job = Box<dyn FnOnce(&mut State) + Send>;

/// An operation in flight on a tracer ([`Tracer::begin`]).
pub struct OpGuard {
    ops: Arc<AtomicU32>,
    /// Wakes the thread when the last operation ends: the work kept for
    /// between operations (pages to write, standbys) starts then, not at
    /// its next job.
    wake: Option<mpsc::Sender<Job>>,
}

impl Drop for OpGuard {
    fn drop(&mut self) {
        if self.ops.fetch_sub(1, Ordering::SeqCst) == 1
            && let Some(tx) = &self.wake
        {
            // (Standby forks an operation sent to the background get their
            // priority back.)
            let _ = tx.send(Box::new(|st: &mut State| {
                if st.ops.load(Ordering::SeqCst) == 0 {
                    st.pool.forks_to_foreground();
                }
            }));
        }
    }
}

/// Handle of a sandbox's tracer thread.
pub struct Tracer {
    tx: Mutex<Option<mpsc::Sender<Job>>>,
    thread: Mutex<Option<JoinHandle<()>>>,
    ops: Arc<AtomicU32>,
    /// Whether the last check of [`Tracer::stop_and_clone`] found that
    /// the processes could move to a new tree (none yet: `false`).
    moved: Arc<AtomicBool>,
    /// The pool's pids ([`Tracer::pool`]), published by the thread.
    pool: Arc<Mutex<(Vec<SandboxPid>, Vec<HostPid>)>>,
}

impl std::fmt::Debug for Tracer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Tracer")
    }
}

impl Drop for Tracer {
    fn drop(&mut self) {
        self.tx.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(t) = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take() {
            let _ = t.join();
        }
    }
}

impl Tracer {
    /// Start the thread. Processes with `incremental_min_rss` resident
    /// bytes or more get their pages written tracked and incremental
    /// templates (`None`: no process does). `instruments` counts what it
    /// does and holds the switches tests set (shared by an engine's tracers).
    pub fn start(
        incremental_min_rss: Option<u64>,
        cgroup: Option<crate::cgroup::PoolCgroup>,
        instruments: Arc<crate::stats::Instruments>,
    ) -> std::io::Result<Tracer> {
        let (tx, rx) = mpsc::channel::<Job>();
        let ops = Arc::new(AtomicU32::new(0));
        let thread_ops = ops.clone();
        let pool: Arc<Mutex<(Vec<SandboxPid>, Vec<HostPid>)>> = Default::default();
        let thread_pool = pool.clone();
        let thread = std::thread::Builder::new().name("sandtree:tracer".into()).spawn(move || {
            let placement = crate::cgroup::PoolPlacement::new(cgroup);
            let mut st = State { ops: thread_ops, incremental_min_rss, placement, instruments, ..Default::default() };
            crate::inject::pin_tracer_thread();
            // Whether a job ran since the mount table was last looked at
            // (a swap changes it), and when holders were last looked at.
            let (mut mounts_stale, mut holders_seen) = (true, std::time::Instant::now());
            loop {
                st.dying.extend(crate::reap::take_killed());
                // Jobs first. Between operations, a standby at a time (so
                // that a job waits for one fork at most), then the ticks.
                let job = match rx.try_recv() {
                    Ok(job) => Some(job),
                    Err(mpsc::TryRecvError::Disconnected) => break,
                    Err(mpsc::TryRecvError::Empty) => {
                        // (Not while a job waits: it would wait for this.)
                        let now = (st.pool_pids(), st.kept_hosts());
                        let mut published = thread_pool.lock().unwrap_or_else(|e| e.into_inner());
                        if *published != now {
                            *published = now;
                        }
                        drop(published);
                        let idle = st.ops.load(Ordering::SeqCst) == 0;
                        let mut forking = false;
                        if idle && st.sweep() {
                            continue;
                        }
                        if idle
                            && (st.pool.write_pending(false, &mut st.holders)
                                || st.pool.prepare_pending(&mut st.holders)
                                || crate::memory_holder::equip_next(&mut st.holders, &st.tracking))
                        {
                            continue;
                        }
                        // The mount table, if a swap changed it (~0.1 ms,
                        // which the next checkpoint saves).
                        // (Only after a job: looking costs two calls, at
                        // every turn. A table changed meanwhile by the
                        // sandbox is read by the checkpoint itself.)
                        if idle && mounts_stale && st.init_host.raw() > 0 {
                            mounts_stale = false;
                            if st.mounts.refresh(st.init_host) {
                                continue;
                            }
                        }
                        // (Not while a checkpoint holds processes stopped.)
                        if idle && st.stops.is_empty() && st.cloned.is_empty() {
                            let others: Vec<SandboxPid> =
                                st.holders.iter().map(|h| h.ns_pid).chain(st.dying.iter().map(|d| d.ns_pid)).collect();
                            match st.pool.tend_standbys(&st.tracking, &others, &st.instruments.switches) {
                                crate::pool::StandbyWork::Worked => continue,
                                crate::pool::StandbyWork::Forking => forking = true,
                                crate::pool::StandbyWork::Idle => {}
                            }
                        }
                        // (Pages being written, or a fork under way: back
                        // as soon as they are done.)
                        let writing = st.pool.templates().any(|t| t.to_write.as_ref().is_some_and(|p| p.writing()));
                        let wait = match writing || forking {
                            true => std::time::Duration::from_micros(500),
                            false => std::time::Duration::from_millis(100),
                        };
                        match rx.recv_timeout(wait) {
                            Ok(job) => Some(job),
                            Err(mpsc::RecvTimeoutError::Timeout) => None,
                            Err(mpsc::RecvTimeoutError::Disconnected) => break,
                        }
                    }
                };
                let ran = job.is_some();
                if let Some(job) = job {
                    mounts_stale = true;
                    job(&mut st);
                    // (Its reply is out: what it left for after.)
                    st.pool.resolve_later(&mut st.tracking, &mut st.holders);
                    // (A restore steps aside to let its processes go.)
                    crate::inject::step_back();
                    // A rollback's adopted holders drop their descriptors.
                    // (A checkpoint's templates are set up between
                    // operations.)
                    crate::memory_holder::drop_pending(&mut st.holders, &mut st.dying);
                }
                // A task that was stuck when a checkpoint stopped it reaches
                // its stop later: let it go as soon as it does.
                st.stops.settle_lingering();
                // (During a rollback the killed originals' holders stay
                // until its end: their teardown must not compete with it.)
                // (Right after a job, else every few milliseconds: each
                // holder costs a `poll` and a `kcmp`, at every turn.)
                if st.ops.load(Ordering::SeqCst) == 0
                    && (ran || holders_seen.elapsed() >= std::time::Duration::from_millis(5))
                {
                    holders_seen = std::time::Instant::now();
                    crate::memory_holder::retire(&mut st.holders, &mut st.dying);
                }
                crate::reap::reap_dying(&mut st.dying, st.ops.load(Ordering::SeqCst) == 0);
                let (holders, dying) = (&st.holders, &st.dying);
                st.tracking.close_parked(|h| holders.iter().any(|x| x.host == h) || dying.iter().any(|d| d.host == h));
            }
            // Dropping the state ends the thread; EXITKILL kills the
            // templates, and we collect their notifications first.
            for host in st.kept_hosts() {
                kill_tracee(host);
            }
        })?;
        Ok(Tracer { tx: Mutex::new(Some(tx)), thread: Mutex::new(Some(thread)), ops, moved: Default::default(), pool })
    }

    /// Marks an operation (a checkpoint, a rollback) in flight until the
    /// guard drops: the thread makes no standby meanwhile, so the pids it
    /// gave out as templates' stay the whole truth, and no fork competes
    /// with the operation for the CPU.
    pub fn begin(&self) -> OpGuard {
        self.ops.fetch_add(1, Ordering::SeqCst);
        let wake = self.tx.lock().unwrap_or_else(|e| e.into_inner()).clone();
        OpGuard { ops: self.ops.clone(), wake }
    }

    fn call<R: Send + 'static>(&self, f: impl FnOnce(&mut State) -> R + Send + 'static) -> Result<R> {
        self.queue(f)?.wait()
    }

    /// Queue `f` for the tracer thread without waiting for it.
    fn queue<R: Send + 'static>(&self, f: impl FnOnce(&mut State) -> R + Send + 'static) -> Result<Started<R>> {
        let (rtx, rrx) = mpsc::channel();
        let job: Job = Box::new(move |st| {
            let _ = rtx.send(f(st));
        });
        let tx = self.tx.lock().unwrap_or_else(|e| e.into_inner()).clone().ok_or(Error::TracerGone)?;
        tx.send(job).map_err(|_| Error::TracerGone)?;
        Ok(Started(rrx))
    }

    /// Step 1 of a checkpoint: stop every process the sandbox runs but
    /// `init_host` and the templates (`list` gives the host pids of the
    /// sandbox's cgroup). In best effort, processes that cannot be restored
    /// are left running and reported; otherwise the first one is an error
    /// and nothing stays stopped.
    pub fn stop(
        &self,
        list: Box<dyn Fn() -> std::io::Result<Vec<HostPid>> + Send>,
        init_host: HostPid,
        best_effort: bool,
        timeout: std::time::Duration,
        with_init: bool,
    ) -> Result<Stopped<'_>> {
        let report = self.call(move |st| st.stop(&*list, init_host, best_effort, timeout, with_init))??;
        Ok(Stopped { report, stopped: Resumes::new(self) })
    }

    /// Pass 1 of the capture, while every process stays stopped (the
    /// caller snapshots the filesystem meanwhile); then [`Tracer::release`]
    /// and [`Tracer::set_up`]. On error everything runs again. Returns
    /// whether every process stopped is still stopped with its template (in
    /// best effort, one that cannot be restored, or whose template died, was
    /// let go).
    fn clone_all(&self, best_effort: bool) -> Result<bool> {
        self.call(move |st| clone_all_kept(&mut st.parts(), best_effort, None))?
    }

    /// [`Tracer::stop`] (init left running), then at once, in the same job,
    /// the capture (`Stopped::capture`) — unless the stop failed or found tasks from
    /// outside the sandbox's pid namespace — then, given a `tree`, the
    /// check of whether the processes can move to a new one and, once the
    /// caller says where init staged it ([`Cloning::finish`]), the reopening
    /// of their files there (`repoint.rs`'s steps 1 and 2) — for every
    /// process but the largest already while the largest one is copied,
    /// when the tree is staged by then (they move back if the checkpoint
    /// cannot be layered after all). Returns once
    /// the processes are stopped: the report and the copy under way, which
    /// the caller finishes after its own steps (a layered checkpoint stages
    /// the new tree meanwhile). No round trip to the caller between the
    /// steps, nor a thread hop (a blocking task took 0.05-0.4 ms to start;
    /// a call to the tracer thread costs 0.07-0.2 ms here).
    pub fn stop_and_clone(
        &self,
        list: Box<dyn Fn() -> std::io::Result<Vec<HostPid>> + Send>,
        init_host: HostPid,
        (best_effort, timeout): (bool, std::time::Duration),
        tree: Option<crate::repoint::Tree>,
    ) -> Result<StopAndClone<'_>> {
        let (stop_tx, stop_rx) = mpsc::channel();
        let (clone_tx, clone_rx) = mpsc::channel();
        let (stage_tx, stage_rx) = mpsc::channel::<Option<String>>();
        let (checked_tx, checked_rx) = mpsc::channel();
        let moved = self.moved.clone();
        let started = self.queue(move |st| {
            let stopped = st.stop(&*list, init_host, best_effort, timeout, false);
            let go = matches!(&stopped, Ok(r) if !r.foreign);
            let _ = stop_tx.send(stopped);
            let st = &mut st.parts();
            if go {
                // The tree staged already when every process but the
                // largest has its template (the largest one's copy runs on
                // the other CPU): those move now, while it runs. (`None`:
                // the caller has not said yet.)
                let mut staged: Option<Option<String>> = None;
                let mut early = |st: &mut crate::checkpoint::Parts<'_>, largest: HostPid| {
                    let Some(tree) = &tree else { return };
                    // (The largest one's descriptors and cwd are read after
                    // this: not if it shares them with another process.)
                    let shared = |c: &crate::checkpoint::Cloned| {
                        sandtree_sys::process::shares_files_or_fs(largest.raw(), c.stopped.host.raw()).unwrap_or(true)
                    };
                    if st.cloned.iter().any(shared) || crate::repoint::check(st, tree).is_err() {
                        return;
                    }
                    if let Ok(stage) = stage_rx.try_recv() {
                        // (A failure is the final step's too: it opens
                        // them again, or says why not.)
                        if let Some(at) = &stage {
                            match crate::repoint::open(st, at) {
                                Ok(()) => {
                                    st.instruments.count(crate::stats::Counter::MovedEarly, 1);
                                    tracing::debug!(moved = st.repointed.len(), "moved while the copy runs");
                                }
                                Err(e) => {
                                    tracing::debug!("not moved while the copy runs: {e}");
                                    crate::repoint::abort(st);
                                }
                            }
                        }
                        staged = Some(stage);
                    }
                };
                let with_tree = tree.is_some();
                // (Left by a job that failed part-way: never moved back.)
                if !st.repointed.is_empty() {
                    tracing::warn!(left = st.repointed.len(), "processes reopened by an earlier checkpoint");
                    st.repointed.clear();
                }
                let copied = clone_all_kept(st, best_effort, with_tree.then_some(&mut early as _)).map(|kept| {
                    let mut movable = tree.filter(|_| kept).map(|tree| crate::repoint::check(st, &tree));
                    if let Some(m) = &movable {
                        moved.store(m.is_ok(), Ordering::SeqCst);
                        let _ = checked_tx.send(m.clone());
                    }
                    // (A caller gone, or no tree staged: nothing opened.)
                    match movable {
                        Some(Ok(())) => {
                            let stage = staged.take().or_else(|| stage_rx.recv().ok()).flatten();
                            if let Some(stage) = stage {
                                movable = Some(
                                    crate::repoint::open(st, &stage)
                                        .map_err(|e| format!("a process cannot reopen its files: {e}")),
                                );
                            }
                        }
                        // (Moved early: back to the old tree.)
                        _ => crate::repoint::abort(st),
                    }
                    CopyEnd { kept, movable }
                });
                let _ = clone_tx.send(copied);
            }
        })?;
        // (The job's end, once the copy is done too, is not waited for.)
        drop(started);
        let report = stop_rx.recv().map_err(|_| Error::TracerGone)??;
        if report.foreign {
            return Ok(StopAndClone { report, cloning: None, _stopped: Some(Resumes::new(self)) });
        }
        let stopped = Resumes::new(self);
        let cloning = Cloning { done: Started(clone_rx), checked: checked_rx, stage: stage_tx, stopped };
        Ok(StopAndClone { report, cloning: Some(cloning), _stopped: None })
    }

    /// Whether the last check of whether the processes can move to a new
    /// tree ([`Tracer::stop_and_clone`]) found that they could: a layered
    /// checkpoint then stages the new tree while the copy runs, betting
    /// that they still can (a lost bet costs the staged tree).
    pub fn moved_last(&self) -> bool {
        self.moved.load(Ordering::SeqCst)
    }

    /// The end of a layered checkpoint with processes, in one job, once
    /// init moved the staged tree to `/`: each process puts its files
    /// opened again in place (`repoint.rs`'s step 3), every process runs
    /// again, and pass 2 ([`Tracer::set_up`]) follows. An error is the
    /// first step's (every process was let go then).
    fn finish_and_go(&self, ck: &str, best_effort: bool) -> Result<LayeredEnd> {
        let ck = ck.to_string();
        self.call(move |st| {
            let st = &mut st.parts();
            if let Err(e) = crate::repoint::finish(st) {
                crate::checkpoint::abort(st);
                return Err(e);
            }
            crate::checkpoint::release_all(st);
            let at = std::time::Instant::now();
            Ok(LayeredEnd { at, set_up: crate::checkpoint::set_up_all(st, &ck, best_effort) })
        })?
    }

    /// Let every stopped process (and init) run again, templates kept.
    fn release(&self) -> Result<()> {
        self.call(|st| crate::checkpoint::release_all(&mut st.parts()))
    }

    /// Pass 2 of the capture: checks and template set-up; the templates
    /// join the pool as checkpoint `ck`.
    fn set_up(&self, ck: &str, best_effort: bool) -> Result<CaptureReport> {
        let ck = ck.to_string();
        self.call(move |st| crate::checkpoint::set_up_all(&mut st.parts(), &ck, best_effort))?
    }

    /// Close what the copy's job opened through the staged tree
    /// ([`Cloning::finish`]): the tree was not swapped.
    fn repoint_abort(&self) -> Result<()> {
        self.call(|st| crate::repoint::abort(&mut st.parts()))
    }

    /// Let every stopped process run again and drop templates not yet in
    /// the pool (a checkpoint that failed part-way).
    fn resume_stopped(&self) -> Result<()> {
        self.call(|st| crate::checkpoint::abort(&mut st.parts()))
    }

    /// The pool's processes (templates, standbys, holders, dying holders):
    /// their pids in the sandbox and on the host. As the tracer thread last
    /// published them (at each turn of its loop with no job waiting), with no round
    /// trip to it: a call waited for the work under way, up to 1.4 ms
    /// before a checkpoint's stop. One that became a pool process since is
    /// taken for a sandbox process: the stop skips it (its tracer is ours),
    /// and init's own check refuses a restack it would spoil.
    pub fn pool(&self) -> Result<(Vec<SandboxPid>, Vec<HostPid>)> {
        Ok(self.pool.lock().unwrap_or_else(|e| e.into_inner()).clone())
    }

    /// What a rollback to `ck` needs first, in one round trip: the
    /// templates `ck` has (`None`: none) and the pids init must spare.
    /// Queued: the caller makes its layer and commits meanwhile (call it
    /// after [`Tracer::begin`]: no standby may be forked after the pids
    /// are listed).
    ///
    /// A standby fork of one of `ck`'s templates under way ends here,
    /// before the sandbox's root moves: a fork that the move overtakes
    /// gives a child on the old tree, which is dropped (`memory_holder.rs`), and
    /// the restore would wait for it and then fork the template on its
    /// path (seen: 6 ms waited, then 3 ms of forks, for a 100 MB REPL).
    ///
    /// Templates are processes of the sandbox (`ps` lists them, `kill -9
    /// -1` reaches them): one found dead here loses the checkpoint's
    /// processes, whose templates are then dropped and named in
    /// [`RollbackPlan::killed`]; a dead standby is dropped (the restore
    /// forks its template instead).
    pub fn rollback_plan(&self, ck: &str) -> Result<Started<RollbackPlan>> {
        let ck = ck.to_string();
        self.queue(move |st| {
            st.pool.finish_pending(&mut st.tracking, &mut st.holders);
            st.pool.forks_to_background(&st.tracking, &st.instruments.switches, false);
            // Before init lists the sandbox's cgroup to kill.
            st.sweep();
            if let Some(set) = st.pool.get_mut(&ck) {
                for t in set.templates.iter_mut().filter(|t| t.forking.is_some()) {
                    let t0 = std::time::Instant::now();
                    t.settle_standby();
                    tracing::debug!(pid = t.image.pid.raw(), took = ?t0.elapsed(), standby = t.standby.is_some(), "rollback: the target's standby fork ended first");
                }
            }
            let killed = st.pool.drop_dead_templates(&ck, &mut st.holders);
            RollbackPlan { templates: st.pool.status(&ck), keep: st.pool_pids(), killed }
        })
    }

    /// Kill the holders of processes that are gone (after a rollback:
    /// their memory is torn down in the background). Queued: the caller
    /// does not wait for it.
    pub fn retire_holders(&self) -> Result<()> {
        let job: Job = Box::new(|st| crate::memory_holder::retire(&mut st.holders, &mut st.dying));
        let tx = self.tx.lock().unwrap_or_else(|e| e.into_inner()).clone().ok_or(Error::TracerGone)?;
        tx.send(job).map_err(|_| Error::TracerGone)
    }

    /// What the durable image of `ck` is written from
    /// (`durable::collect`): its templates' images and fork state, a pidfd
    /// of each, and those of its parent checkpoint `parent` still in the
    /// pool (they spare reading the pages they share). `None` while the
    /// pool has yet to finish one of `ck`'s templates: ask again later. The
    /// memory is read after, by the caller.
    pub fn durable_sources(&self, ck: &str, parent: Option<&str>) -> Result<Option<crate::durable::Sources>> {
        let (ck, parent) = (ck.to_string(), parent.map(str::to_string));
        self.call(move |st| crate::durable::collect::collect(&mut st.pool, (ck.as_str(), parent.as_deref())))?
    }

    /// Fill in the fork state of each process of `sources`: what only the
    /// tracer can read, one job per template (a checkpoint queued meanwhile
    /// waits for one at most), the rest from `/proc` on this thread.
    /// `pause` is called before each. A template busy with a standby fork
    /// is asked again (for up to a minute); one gone is an error.
    pub fn complete_fork_states(&self, sources: &mut crate::durable::Sources, pause: &dyn Fn()) -> Result<()> {
        use crate::durable::collect::TemplateFork;
        for p in sources.processes.iter_mut() {
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
            let mut state = loop {
                pause();
                let (ck, host) = (sources.checkpoint.clone(), p.host);
                match self.call(move |st| crate::durable::collect::fork_state(&mut st.pool, &ck, host))?? {
                    TemplateFork::Read(state) => break *state,
                    TemplateFork::Busy if std::time::Instant::now() < deadline => {
                        std::thread::sleep(std::time::Duration::from_millis(2));
                    }
                    TemplateFork::Busy => {
                        return Err(Error::Died {
                            pid: p.host,
                            how: "stayed busy forking standbys for a minute".into(),
                        });
                    }
                    TemplateFork::Gone => {
                        return Err(Error::Died { pid: p.host, how: "went away before its image was written".into() });
                    }
                }
            };
            crate::fork_state::read_proc(p.host, &mut state)?;
            p.fork = state;
            crate::transplant::with_advice(&crate::transplant::read_advice(p.host)?, &mut p.image.maps);
        }
        Ok(())
    }

    /// Make the templates of `ck` again from its durable image in `dir`
    /// (`durable::templates`), children of init (`init`, host pid), into
    /// the pool: for a rollback to a checkpoint whose templates are gone,
    /// once the sandbox runs on the checkpoint's tree (then
    /// [`Tracer::restore`] as usual). `known_pipes` are pipes the caller
    /// holds (`O_PATH`s: its readers of background processes' output),
    /// given to the processes where the image names them (by inode).
    /// Returns the `O_PATH`s of the pipes made anew whose reader was
    /// outside the captured processes, for the caller to read. Refused by name for what an image cannot restore yet; a
    /// damaged image is an error naming it.
    pub fn templates_from_image(
        &self,
        ck: &str,
        (dir, init): (&std::path::Path, HostPid),
        known_pipes: Vec<std::os::fd::OwnedFd>,
    ) -> Result<Vec<std::os::fd::OwnedFd>> {
        let (ck, dir) = (ck.to_string(), dir.to_path_buf());
        self.call(move |st| {
            if st.pool.get(&ck).is_some() {
                return Ok(Vec::new());
            }
            let (set, outputs) =
                crate::durable::templates::make_templates(&dir, (&ck, init), known_pipes, &mut st.stops)?;
            st.pool.add(&ck, set);
            st.sweep();
            Ok(outputs)
        })?
    }

    /// What the pool holds for `ck` (`None`: no templates).
    pub fn status(&self, ck: &str) -> Result<Option<TemplateStatus>> {
        let ck = ck.to_string();
        self.call(move |st| st.pool.status(&ck))
    }

    /// Rollback step: bring back the processes of `ck` (init has already
    /// killed the others and swapped the root).
    pub fn restore(&self, ck: &str, last_pid: Option<crate::LastPid>) -> Result<RestoreReport> {
        let ck = ck.to_string();
        self.call(move |st| {
            let t0 = std::time::Instant::now();
            st.pool.finish_pending(&mut st.tracking, &mut st.holders);
            tracing::debug!(took = ?t0.elapsed(), "restore: pending work finished");
            let parts = crate::restore::Parts {
                pool: &mut st.pool,
                holders: &mut st.holders,
                dying: &mut st.dying,
                tracking: &mut st.tracking,
                cgroup: st.placement.cgroup(),
                last_pid,
            };
            crate::restore::restore(parts, &ck)
        })?
    }

    /// Kill every template now and refuse further work: for a sandbox whose
    /// init is about to go (a dying init waits for its traced children, so
    /// this must not wait for the last handle to drop).
    pub fn shutdown(&self) {
        let _ = self.call(|st| {
            for host in st.kept_hosts() {
                kill_tracee(host);
            }
            st.holders.clear();
            st.pool.clear();
            crate::checkpoint::abort(&mut st.parts());
            // (Its open file would keep the old init's mounts alive.)
            st.init_host = HostPid(0);
            st.mounts.clear();
        });
        self.tx.lock().unwrap_or_else(|e| e.into_inner()).take();
    }

    /// Kill the templates of `ck` (they are collected later).
    pub fn drop_checkpoint(&self, ck: &str) -> Result<()> {
        let ck = ck.to_string();
        self.call(move |st| st.pool.drop_checkpoint(&ck, false, &mut st.holders))
    }

    /// How many checkpoints have templates in the pool.
    pub fn checkpoints(&self) -> Result<usize> {
        self.call(|st| st.pool.len())
    }

    /// Memory only the templates hold: physical pages they map and no live
    /// process does (the pages their originals changed since). Measured
    /// outside the tracer thread (reading page maps takes a while).
    pub fn memory(&self) -> Result<u64> {
        Ok(self.measured("info")?.total)
    }

    /// The pool measured off the tracer thread (`Sizing::measure_aside`),
    /// for `why`.
    fn measured(&self, why: &str) -> Result<crate::pool::PoolMemory> {
        let t0 = std::time::Instant::now();
        let sized = self
            .call(|st| st.pool.sizing(st.holders.iter().map(|h| h.host).collect(), st.ops.clone()))?
            .measure_aside();
        tracing::debug!(why, took = ?t0.elapsed(), "pool measured");
        Ok(sized)
    }

    /// Evict least recently used checkpoints' templates until the pool
    /// holds at most `budget` bytes and `max_checkpoints` checkpoints
    /// (those of `keep` are never evicted). Returns the evicted checkpoint
    /// ids. The memory is measured outside the tracer thread.
    pub fn evict_to(&self, budget: u64, max_checkpoints: usize, keep: &[String]) -> Result<Vec<String>> {
        let measured = self.measured("eviction")?;
        tracing::debug!(total = measured.total, own = ?measured.own, "pool's memory (checkpoint, last used, bytes)");
        let mut sized = measured.own;
        sized.sort_by_key(|(_, used, _)| *used);
        let mut total = measured.total;
        let mut count = sized.len();
        let mut evicted = Vec::new();
        for (k, _, bytes) in sized {
            if total <= budget && count <= max_checkpoints {
                break;
            }
            if keep.contains(&k) {
                continue;
            }
            self.drop_checkpoint(&k)?;
            total = total.saturating_sub(bytes);
            count -= 1;
            evicted.push(k);
        }
        Ok(evicted)
    }
}
