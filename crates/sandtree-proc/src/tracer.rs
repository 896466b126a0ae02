//! The tracer thread of one sandbox and its template pool.
//!
//! ptrace is per thread: every request for a tracee must come from the
//! thread that attached it, and templates stay attached for as long as they
//! live. So each sandbox gets one OS thread (`sandtree:tracer`) that owns
//! all of its tracees; callers send it closures over a channel and block on
//! the answer (from `block_in_place` in async code). When the [`Tracer`] is
//! dropped the thread ends and `PTRACE_O_EXITKILL` kills the templates.
//!
//! Pool: templates are grouped by checkpoint. Eviction drops a whole
//! checkpoint's templates, least recently used first
//! ([`Tracer::evict_to`]); its info then says its processes were evicted.
//! Memory is counted in physical pages ([`procfs::frames`]): those of
//! templates that no live process maps.
//!
//! Between jobs, while no operation is in flight ([`Tracer::begin`]), the
//! thread gives templates their standbys, one fork at a time.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::mpsc;
use std::thread::JoinHandle;

use serde::{Deserialize, Serialize};

use crate::check::Unrestorable;
use crate::inject::{Tracee, kill_tracee};
use crate::model::ProcessImage;
use crate::reap::kill_later;
use crate::stop::StopReport;
use crate::{Error, Result, procfs};

/// One template: a stopped copy of a process at a checkpoint.
pub(crate) struct Template {
    pub image: ProcessImage,
    /// Host pid of the template.
    pub host: i32,
    /// Its pid in the sandbox.
    pub ns_pid: i32,
    /// The template itself, in a ptrace stop.
    pub tracee: Tracee,
    /// Address of its scratch mapping (0 until it is set up, once the
    /// checkpoint is over).
    pub scratch: u64,
    /// The scratch mapping is executable (batches run there, `batch.rs`).
    pub scratch_exec: bool,
    /// A fork of the template made between operations (`holder.rs`): a restore
    /// takes it with `CLONE_VM` (no page tables to copy) and it stays as
    /// the restored process's holder.
    pub standby: Option<crate::holder::Standby>,
    /// Its standby's fork, while it runs (`holder.rs`): no other request
    /// may be made of the template meanwhile.
    pub forking: Option<crate::holder::Forking>,
    /// Forking a standby failed once: restores fork the template instead.
    pub no_standby: bool,
    /// A checkpoint took its standby (`incremental.rs`).
    pub standby_taken: bool,
    /// Its standbys cannot be given a pid of ours (`clone3` with `set_tid`
    /// refused): they fork with whatever pid comes.
    pub any_pid: bool,
    /// The original's fingerprint, when it is tracked (`incremental.rs`).
    pub fingerprint: Option<String>,
    /// Made from the previous template's standby (`incremental.rs`).
    pub incremental: bool,
    /// Templates made from a standby since the last fork of the process.
    pub generation: u32,
    /// Its pages written since the previous template and the rest, until
    /// they are written into it after the checkpoint
    /// ([`crate::checkpoint::write_pending`]).
    pub to_write: Option<crate::incremental::Pending>,
}

/// What to measure of the pool (outside the tracer thread): the
/// templates of each checkpoint, and the holders, which share the address
/// spaces of the live processes. Standbys are left out: each maps exactly
/// its template's pages (neither ever writes).
#[derive(Clone)]
pub(crate) struct Sizing {
    checkpoints: Vec<ToSize>,
    live: Vec<i32>,
    /// Operations in flight ([`Tracer::begin`]): the walk waits while
    /// there is one.
    ops: Arc<AtomicU32>,
    frames: Arc<Mutex<FrameCache>>,
}

/// A checkpoint (id, last used) and its templates' host pids, each with
/// whether it is done changing (set up, its pages written).
type ToSize = (String, u64, Vec<(i32, bool)>);

/// The frames of templates done changing, by (checkpoint, host pid), as
/// read when: a template never writes, so its frames stay what they were
/// unless the kernel moves its pages (compaction), but for its scratch
/// page (the arguments of the forks we inject: one page copied on write
/// after a fork); an entry is read again after [`FRAMES_FRESH`]. Without it, each eviction check read every
/// template again: 30 checkpoints of a 1 GB process, 2.3 s a check.
type FrameCache = std::collections::HashMap<(String, i32), (std::time::Instant, Arc<Vec<u64>>)>;

/// How long a template's frames are taken as read.
const FRAMES_FRESH: std::time::Duration = std::time::Duration::from_secs(60);

/// A hasher for page frame numbers (a multiply: they are spread evenly
/// enough, and the default hasher was a third of a walk's time).
#[derive(Default)]
struct FrameHasher(u64);

impl std::hash::Hasher for FrameHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(*b)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = (self.0 ^ v).wrapping_mul(0x9e37_79b9_7f4a_7c15).rotate_left(29);
    }
}

type FrameMap<V> = std::collections::HashMap<u64, V, std::hash::BuildHasherDefault<FrameHasher>>;
type FrameSet = std::collections::HashSet<u64, std::hash::BuildHasherDefault<FrameHasher>>;

/// The frames of the live processes, as a bitmap indexed by frame number
/// (a bit per page of the host's memory: 24 GiB, 768 KiB), with a hash set
/// for frame numbers beyond [`LiveFrames::BITMAP_MAX`]. A walk looks every
/// frame of every template up in it (30 checkpoints of a 1 GB process: ~8
/// million lookups); in a hash set that made a walk take 0.5-1.2 s of CPU,
/// beside the bench's steps and the standby forks they wait for.
#[derive(Default)]
struct LiveFrames {
    bits: Vec<u64>,
    high: FrameSet,
}

impl LiveFrames {
    /// Frame numbers up to here (16 TiB of memory, a 512 MiB bitmap at
    /// most, grown to the highest frame seen) go in the bitmap.
    const BITMAP_MAX: u64 = 1 << 32;

    fn insert(&mut self, f: u64) {
        if f >= Self::BITMAP_MAX {
            self.high.insert(f);
            return;
        }
        let w = (f / 64) as usize;
        if w >= self.bits.len() {
            self.bits.resize(w + 1, 0);
        }
        self.bits[w] |= 1 << (f % 64);
    }

    fn contains(&self, f: u64) -> bool {
        if f >= Self::BITMAP_MAX {
            return self.high.contains(&f);
        }
        self.bits.get((f / 64) as usize).is_some_and(|w| w & (1 << (f % 64)) != 0)
    }
}

/// Memory the pool holds.
struct Sized {
    /// Pages of templates that no live process maps.
    total: u64,
    /// Per checkpoint (id, last used): the pages it is the most recently
    /// used holder of. Evicting least recently used first, that is what
    /// each eviction frees (a page shared with an older checkpoint is
    /// freed with the last of them).
    own: Vec<(String, u64, u64)>,
}

impl Sizing {
    /// [`Sizing::measure`] on a thread of its own at nice 19: it reads the
    /// page map of every template it has not read lately (the first walk
    /// after a bench's 30 checkpoints of a 1 GB Python: ~0.7 s of CPU; the
    /// next ones 35-150 ms, 12-20 at 100 MB) and, at the normal
    /// priority of a runtime thread, it held the tracer thread off its CPU
    /// for milliseconds in the rollbacks it ran beside.
    fn measure_aside(self) -> Sized {
        let here = self.clone();
        let spawned = std::thread::Builder::new().name("sandtree:sizing".into()).spawn(move || {
            let _ = rustix::process::setpriority_process(None, 19);
            self.measure()
        });
        match spawned.map(|h| h.join()) {
            Ok(Ok(sized)) => sized,
            // (No thread, or it panicked: here, at this thread's priority.)
            _ => here.measure(),
        }
    }

    /// Counts physical pages: a page a template shares with a live process
    /// (unchanged since the checkpoint) costs nothing; one the process has
    /// changed since is the pool's. So the figure is proportional to the
    /// pages changed, not to the processes' size.
    ///
    /// The walk steps aside while a checkpoint or a rollback runs (between
    /// reads of 4,096 entries, and between 4,096 frames counted, each well
    /// under a millisecond): the eviction check starts once the engine has
    /// been idle a moment, and it met the first rollback after a burst of
    /// checkpoints, which then took 8-27 ms instead of ~3 (the walk took the
    /// CPU, and each page-map read holds the template's memory map lock,
    /// which a fork of it waits for). Its nice value does not keep it out
    /// of the way: the daemon is one CPU group and the sandbox another, of
    /// equal weight, so while the tracer waits for a call it injected, the
    /// walk and the process share the CPU half and half (counting cached
    /// frames without a pause, it made a 1 GB checkpoint's injected calls
    /// take 10-27 ms instead of ~0.5).
    fn measure(mut self) -> Sized {
        let ops = self.ops.clone();
        let between = move || {
            while ops.load(Ordering::SeqCst) > 0 {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
        };
        let mut live = LiveFrames::default();
        for host in std::mem::take(&mut self.live) {
            for f in procfs::frames(host, &between).unwrap_or_default() {
                live.insert(f);
            }
        }
        // Templates gone since are forgotten.
        let now = std::time::Instant::now();
        let mut cache = std::mem::take(&mut *self.frames.lock().unwrap_or_else(|e| e.into_inner()));
        let keep: std::collections::HashSet<(&str, i32)> = self
            .checkpoints
            .iter()
            .flat_map(|(ck, _, hosts)| hosts.iter().filter(|h| h.1).map(move |h| (ck.as_str(), h.0)))
            .collect();
        cache.retain(|(ck, host), (at, _)| keep.contains(&(ck.as_str(), *host)) && now - *at < FRAMES_FRESH);
        // Oldest first: a page's owner ends up its newest holder.
        self.checkpoints.sort_by_key(|(_, used, _)| *used);
        let mut owner: FrameMap<usize> = FrameMap::default();
        for (i, (ck, _, hosts)) in self.checkpoints.iter().enumerate() {
            for &(host, done) in hosts {
                let key = (ck.clone(), host);
                let frames = match cache.get(&key) {
                    Some((_, f)) => f.clone(),
                    None => {
                        let f = Arc::new(procfs::frames(host, &between).unwrap_or_default());
                        if done {
                            cache.insert(key, (std::time::Instant::now(), f.clone()));
                        }
                        f
                    }
                };
                // (Steps aside here too: at 1 GB a template is 262,144
                // frames, ~5 ms of hashing.)
                for chunk in frames.chunks(4096) {
                    between();
                    for &f in chunk {
                        if !live.contains(f) {
                            owner.insert(f, i);
                        }
                    }
                }
            }
        }
        *self.frames.lock().unwrap_or_else(|e| e.into_inner()) = cache;
        let mut own = vec![0u64; self.checkpoints.len()];
        for &o in owner.values() {
            own[o] += 4096;
        }
        Sized {
            total: owner.len() as u64 * 4096,
            own: self.checkpoints.into_iter().zip(own).map(|((k, used, _), b)| (k, used, b)).collect(),
        }
    }
}

impl State {
    pub(crate) fn sizing(&self) -> Sizing {
        Sizing {
            checkpoints: self
                .pools
                .iter()
                .map(|(k, c)| {
                    let hosts = c.templates.iter().map(|t| (t.host, t.scratch != 0 && t.to_write.is_none()));
                    (k.clone(), c.last_used, hosts.collect())
                })
                .collect(),
            live: self.holders.iter().map(|h| h.host).collect(),
            ops: self.ops.clone(),
            frames: self.frames.clone(),
        }
    }
}

/// The templates of one checkpoint.
pub(crate) struct CheckpointTemplates {
    pub templates: Vec<Template>,
    /// Buffered bytes of each pipe, with a template (host pid) and fd
    /// through which the pipe is reached at restore.
    pub pipes: Vec<(crate::model::PipeBuffer, i32, i32)>,
    /// Data queued on unix sockets, with a template (host pid) and fd of
    /// the peer it is sent from again at restore.
    pub sockets: Vec<(crate::model::SocketBuffer, i32, i32)>,
    pub unrestorable: Vec<Unrestorable>,
    pub last_used: u64,
}

/// Everything the tracer thread owns.
#[derive(Default)]
pub(crate) struct State {
    /// What a checkpoint's stop holds.
    pub stops: crate::stop::Stops,
    /// Templates cloned by [`Tracer::clone_all`], not set up yet.
    pub cloned: Vec<crate::checkpoint::Cloned>,
    /// Processes refused in the first pass (best effort).
    pub refused: Vec<Unrestorable>,
    /// Holders of live processes' address spaces (`holder.rs`).
    pub holders: Vec<crate::holder::Holder>,
    /// Operations in flight ([`Tracer::begin`]), shared with the handle:
    /// no standby is made during one (init's kill list was taken, or
    /// processes are stopped).
    pub ops: Arc<AtomicU32>,
    /// Killed pool processes not reaped yet.
    pub dying: Vec<crate::reap::Dying>,
    pub pools: BTreeMap<String, CheckpointTemplates>,
    pub clock: u64,
    /// Checkpoints whose templates still need their set-up
    /// ([`crate::checkpoint::prepare_pending`], between operations).
    pub unprepared: Vec<String>,
    /// Templates whose standby was still being forked when their
    /// checkpoint took it: (checkpoint, host pid of the template forking
    /// it), until [`crate::checkpoint::resolve_later`] right after the job.
    pub later: Vec<(String, i32)>,
    /// Descriptors opened in stopped processes for a new tree
    /// (`repoint.rs`), until they are put in place or closed.
    pub repointed: Vec<crate::repoint::Reopened>,
    /// The next pid to give a standby, counting down from the top of the
    /// pid range (`holder.rs`); 0 until the first.
    pub next_pool_pid: i32,
    /// Written-page tracking of live processes, by host pid (`track.rs`).
    pub tracking: crate::track::Trackings,
    /// Processes this large (resident bytes) or more are tracked, and get
    /// incremental templates; `None`: none is.
    pub incremental_min_rss: Option<u64>,
    /// The sandbox's init (host pid), once a checkpoint named it.
    pub init_host: i32,
    /// Its mount table.
    pub mounts: crate::procfs::MountCache,
    /// The templates' frames as the last measure read them.
    pub frames: Arc<Mutex<FrameCache>>,
    /// The pool's cgroup (`cgroup.rs`), if it has one, and what was moved
    /// there.
    pub placement: crate::cgroup::PoolPlacement,
}

/// Host pids of the pool's live processes: templates, standbys, holders
/// (what [`crate::cgroup::PoolPlacement::sweep`] moves).
fn pool_hosts<'a>(
    pools: &'a BTreeMap<String, CheckpointTemplates>,
    holders: &'a [crate::holder::Holder],
) -> impl Iterator<Item = i32> + 'a {
    let templates = pools.values().flat_map(|c| &c.templates);
    templates
        .clone()
        .map(|t| t.host)
        .chain(templates.filter_map(|t| t.standby.as_ref()).map(|s| s.host))
        .chain(holders.iter().map(|h| h.host))
}

/// A job's result to come from the tracer thread.
pub struct Started<R>(mpsc::Receiver<R>);

/// What [`Tracer::stop_and_clone`] returns.
pub struct StopAndClone {
    pub report: StopReport,
    /// The templates' copy, under way (`None`: not started, the report is
    /// `foreign`).
    pub cloning: Option<Cloning>,
}

/// The copy of [`Tracer::stop_and_clone`], under way.
pub struct Cloning {
    done: Started<Result<Copied>>,
    checked: mpsc::Receiver<std::result::Result<(), String>>,
    stage: mpsc::Sender<Option<String>>,
}

impl Cloning {
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
    pub fn finish(self, stage: Option<&str>) -> Result<Copied> {
        let _ = self.stage.send(stage.map(str::to_string));
        self.done.wait()?
    }
}

/// The end of the copy of [`Tracer::stop_and_clone`].
#[derive(Debug)]
pub struct Copied {
    /// Whether every process stopped kept its template (in best effort,
    /// one that cannot be restored, or whose template died, was let go).
    pub kept: bool,
    /// When a [`crate::repoint::Tree`] was given and every process kept
    /// its template: whether they can move to a new tree, or why not
    /// ([`crate::repoint`]'s step 1); once the tree was staged, whether
    /// they opened their files there (step 2; on error nothing stays
    /// open).
    pub movable: Option<std::result::Result<(), String>>,
}

/// What [`Tracer::finish_and_go`] did.
pub struct Went {
    /// When the processes were let go.
    pub at: std::time::Instant,
    /// Pass 2 ([`Tracer::set_up`]).
    pub set_up: Result<CaptureReport>,
}

impl<R> Started<R> {
    /// Wait for the job's result.
    pub fn wait(self) -> Result<R> {
        self.0.recv().map_err(|_| Error::TracerGone)
    }
}

/// Checkpoints whose processes but the largest moved to the staged tree
/// while the largest one's copy ran ([`Tracer::stop_and_clone`]).
static MOVED_EARLY: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Checkpoints since the start whose processes but the largest moved to
/// the staged tree while the largest one was copied (the checkpoint is
/// layered, or they moved back when it became a snapshot): for the tests
/// that the path is taken.
pub fn moved_early() -> u64 {
    MOVED_EARLY.load(Ordering::Relaxed)
}

/// `checkpoint::clone_all`, and whether every process stopped kept its
/// template.
fn clone_all_kept(
    st: &mut State,
    best_effort: bool,
    others_done: Option<crate::checkpoint::OthersDone<'_>>,
) -> Result<bool> {
    let stopped = st.stops.len();
    crate::checkpoint::clone_all(st, best_effort, others_done).map(|()| st.cloned.len() == stopped)
}

impl State {
    /// Step 1 of a checkpoint ([`crate::stop::Stops::stop`]), the pool's
    /// processes spared and its standby forks under way sent to the
    /// background.
    fn stop(
        &mut self,
        list: &dyn Fn() -> std::io::Result<Vec<i32>>,
        init_host: i32,
        best_effort: bool,
        timeout: std::time::Duration,
        with_init: bool,
    ) -> Result<StopReport> {
        self.stops.settle_lingering();
        crate::holder::forks_to_background(self, true);
        self.init_host = init_host;
        let kept: std::collections::HashSet<i32> = self.kept_hosts().into_iter().collect();
        self.stops.stop(list, (init_host, &kept), best_effort, timeout, with_init)
    }

    /// Pool processes not moved to the pool's cgroup yet go there
    /// ([`crate::cgroup::PoolPlacement::sweep`]).
    fn sweep(&mut self) -> bool {
        let (pools, holders) = (&self.pools, &self.holders);
        self.placement.sweep(|| pool_hosts(pools, holders))
    }

    pub(crate) fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    /// The template of checkpoint `ck` with host pid `host`, if the pool
    /// still has it.
    pub(crate) fn template(&self, (ck, host): &(String, i32)) -> Option<&Template> {
        self.pools.get(ck)?.templates.iter().find(|t| t.host == *host)
    }

    /// [`State::template`], to change it.
    pub(crate) fn template_mut(&mut self, (ck, host): &(String, i32)) -> Option<&mut Template> {
        self.pools.get_mut(ck)?.templates.iter_mut().find(|t| t.host == *host)
    }

    /// Host pids of every template.
    pub(crate) fn template_hosts(&self) -> Vec<i32> {
        self.pools.values().flat_map(|c| c.templates.iter().map(|t| t.host)).collect()
    }

    /// Host pids of every process this tracer keeps (templates, holders,
    /// killed holders still tearing down): none of them is a sandbox
    /// process to capture.
    pub(crate) fn kept_hosts(&self) -> Vec<i32> {
        let mut v = self.template_hosts();
        v.extend(self.standbys().map(|s| s.host));
        v.extend(self.holders.iter().map(|h| h.host));
        v.extend(self.dying.iter().map(|d| d.host));
        v
    }

    fn standbys(&self) -> impl Iterator<Item = &crate::holder::Standby> {
        self.pools.values().flat_map(|c| c.templates.iter().filter_map(|t| t.standby.as_ref()))
    }

    /// In-sandbox pids of the pool's processes: templates, standbys,
    /// holders, and killed holders still tearing down.
    pub(crate) fn pool_pids(&self) -> Vec<i32> {
        let mut v: Vec<i32> = self.pools.values().flat_map(|c| c.templates.iter().map(|t| t.ns_pid)).collect();
        v.extend(self.standbys().map(|s| s.ns_pid));
        v.extend(self.holders.iter().map(|h| h.ns_pid));
        v.extend(self.dying.iter().map(|d| d.ns_pid));
        // (Standbys being forked with a pid of ours.)
        v.extend(self.pools.values().flat_map(|c| &c.templates).filter_map(|t| t.forking.as_ref()?.ns_pid()));
        v
    }

    /// What the pool holds for `ck`.
    pub(crate) fn status(&self, ck: &str) -> Option<TemplateStatus> {
        self.pools.get(ck).map(|c| TemplateStatus {
            pids: c.templates.iter().map(|t| t.image.pid).collect(),
            unrestorable: c.unrestorable.clone(),
        })
    }

    /// Checks that the templates of `ck` and their standbys still live.
    /// A dead standby is dropped; a dead template drops every template of
    /// `ck` (a partial set cannot be restored exactly) and is returned.
    pub(crate) fn drop_dead_templates(&mut self, ck: &str) -> Vec<Unrestorable> {
        // Between operations templates and standbys sit in a ptrace stop.
        // Dead is told positively: gone, a zombie, or out of its stop with
        // a SIGKILL pending (dying; a frozen task shows `D`, and lives).
        let dead = |host: i32| match crate::procfs::state(host) {
            Some('t' | 'T') => false,
            None | Some('Z' | 'X') => true,
            Some(_) => {
                crate::procfs::status(host).map_or(true, |s| s.signals.pending & (1 << (libc::SIGKILL - 1)) != 0)
            }
        };
        let Some(set) = self.pools.get_mut(ck) else { return Vec::new() };
        let mut killed = Vec::new();
        for t in set.templates.iter_mut() {
            if t.standby.as_ref().is_some_and(|s| dead(s.host))
                && let Some(s) = t.standby.take()
            {
                tracing::warn!(
                    pid = t.image.pid,
                    standby = s.host,
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
            self.drop_checkpoint(ck, true);
        }
        killed
    }

    /// Whether live process `host` has a holder.
    pub(crate) fn has_holder(&self, host: i32) -> bool {
        self.holders.iter().any(|h| h.owner == host && !h.orphaned())
    }

    /// Kill the templates of `ck`. With `wait`, until they are gone (their
    /// pids free: a restore that needs one); otherwise each tears its
    /// memory down in its own time, off the tracer's CPU, and is collected
    /// between jobs. (Waiting took the tracer thread for the teardown of
    /// every template and standby: an eviction run between two
    /// checkpoints, of 100 MB templates, made the next checkpoint's last
    /// step wait 19 ms.)
    pub(crate) fn drop_checkpoint(&mut self, ck: &str, wait: bool) {
        let kill = |host: i32, ns_pid: i32| if wait { kill_tracee(host) } else { kill_later(host, ns_pid) };
        // A later template whose pages are still to be read from one of
        // these (`incremental::Extra`) is written first: it would be lost.
        let hosts: Vec<i32> =
            self.pools.get(ck).map(|c| c.templates.iter().map(|t| t.host).collect()).unwrap_or_default();
        let reads_from_these = self
            .pools
            .values()
            .flat_map(|c| &c.templates)
            .any(|t| t.to_write.as_ref().and_then(|p| p.depends_on()).is_some_and(|h| hosts.contains(&h)));
        if reads_from_these {
            crate::checkpoint::write_pending(self, true);
        }
        if let Some(set) = self.pools.remove(ck) {
            for mut t in set.templates {
                crate::holder::settle(&mut t);
                kill(t.host, t.ns_pid);
                if let Some(s) = t.standby {
                    kill(s.host, s.ns_pid);
                }
            }
        }
    }
}

/// What [`Tracer::set_up`] made.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct CaptureReport {
    /// In-sandbox pids with a template.
    pub captured: Vec<i32>,
    /// Processes marked not restorable (best effort only).
    pub unrestorable: Vec<Unrestorable>,
    /// Processes restored with a change (best effort only): children of
    /// another process come back as children of init.
    #[serde(default)]
    pub reparented: Vec<Unrestorable>,
    /// The `comm` of each captured process, by in-sandbox pid (for
    /// messages that name a process).
    #[serde(default)]
    pub comms: BTreeMap<i32, String>,
}

/// What [`Tracer::restore`] brought back.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct RestoreReport {
    /// In-sandbox pids running again.
    pub restored: Vec<i32>,
    /// Checkpoints whose templates were dropped because one of them held
    /// a pid this restore needed.
    pub evicted: Vec<String>,
}

/// What a rollback needs first ([`Tracer::rollback_plan`]).
#[derive(Clone, Debug, Default)]
pub struct RollbackPlan {
    /// The checkpoint's templates (`None`: it has none).
    pub templates: Option<TemplateStatus>,
    /// In-sandbox pids init must spare (the pool's processes).
    pub keep: Vec<i32>,
    /// The checkpoint's processes whose templates were found dead (killed
    /// from inside the sandbox, or by the OOM killer): its templates were
    /// dropped, so `templates` is `None`.
    pub killed: Vec<Unrestorable>,
}

/// The templates a checkpoint has in the pool.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TemplateStatus {
    /// In-sandbox pids that a rollback brings back.
    pub pids: Vec<i32>,
    /// Processes that were running but are not restorable.
    pub unrestorable: Vec<Unrestorable>,
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
            let _ = tx.send(Box::new(crate::holder::forks_to_foreground));
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
    pool: Arc<Mutex<(Vec<i32>, Vec<i32>)>>,
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
    /// templates (`None`: no process does).
    pub fn start(
        incremental_min_rss: Option<u64>,
        cgroup: Option<crate::cgroup::PoolCgroup>,
    ) -> std::io::Result<Tracer> {
        let (tx, rx) = mpsc::channel::<Job>();
        let ops = Arc::new(AtomicU32::new(0));
        let thread_ops = ops.clone();
        let pool: Arc<Mutex<(Vec<i32>, Vec<i32>)>> = Default::default();
        let thread_pool = pool.clone();
        let thread = std::thread::Builder::new().name("sandtree:tracer".into()).spawn(move || {
            let placement = crate::cgroup::PoolPlacement::new(cgroup);
            let mut st = State { ops: thread_ops, incremental_min_rss, placement, ..Default::default() };
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
                            && (crate::checkpoint::write_pending(&mut st, false)
                                || crate::checkpoint::prepare_pending(&mut st)
                                || crate::holder::equip_next(&mut st))
                        {
                            continue;
                        }
                        // The mount table, if a swap changed it (~0.1 ms,
                        // which the next checkpoint saves).
                        // (Only after a job: looking costs two calls, at
                        // every turn. A table changed meanwhile by the
                        // sandbox is read by the checkpoint itself.)
                        if idle && mounts_stale && st.init_host > 0 {
                            mounts_stale = false;
                            if st.mounts.refresh(st.init_host) {
                                continue;
                            }
                        }
                        if idle {
                            match crate::holder::tend_standbys(&mut st) {
                                crate::holder::Tended::Worked => continue,
                                crate::holder::Tended::Forking => forking = true,
                                crate::holder::Tended::Idle => {}
                            }
                        }
                        // (Pages being written, or a fork under way: back
                        // as soon as they are done.)
                        let writing = st
                            .pools
                            .values()
                            .flat_map(|c| &c.templates)
                            .any(|t| t.to_write.as_ref().is_some_and(|p| p.writing()));
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
                    crate::checkpoint::resolve_later(&mut st);
                    // (A restore steps aside to let its processes go.)
                    crate::inject::step_back();
                    // A rollback's adopted holders drop their descriptors.
                    // (A checkpoint's templates are set up between
                    // operations.)
                    crate::holder::drop_pending(&mut st.holders, &mut st.dying);
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
                    crate::holder::retire(&mut st.holders, &mut st.dying);
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
        list: Box<dyn Fn() -> std::io::Result<Vec<i32>> + Send>,
        init_host: i32,
        best_effort: bool,
        timeout: std::time::Duration,
        with_init: bool,
    ) -> Result<StopReport> {
        self.call(move |st| st.stop(&*list, init_host, best_effort, timeout, with_init))?
    }

    /// Pass 1 of the capture, while every process stays stopped (the
    /// caller snapshots the filesystem meanwhile); then [`Tracer::release`]
    /// and [`Tracer::set_up`]. On error everything runs again. Returns
    /// whether every process stopped is still stopped with its template (in
    /// best effort, one that cannot be restored, or whose template died, was
    /// let go).
    pub fn clone_all(&self, best_effort: bool) -> Result<bool> {
        self.call(move |st| clone_all_kept(st, best_effort, None))?
    }

    /// [`Tracer::stop`] (init left running), then at once, in the same job,
    /// [`Tracer::clone_all`] — unless the stop failed or found tasks from
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
        list: Box<dyn Fn() -> std::io::Result<Vec<i32>> + Send>,
        init_host: i32,
        (best_effort, timeout): (bool, std::time::Duration),
        tree: Option<crate::repoint::Tree>,
    ) -> Result<StopAndClone> {
        let (stop_tx, stop_rx) = mpsc::channel();
        let (clone_tx, clone_rx) = mpsc::channel();
        let (stage_tx, stage_rx) = mpsc::channel::<Option<String>>();
        let (checked_tx, checked_rx) = mpsc::channel();
        let moved = self.moved.clone();
        let started = self.queue(move |st| {
            let stopped = st.stop(&*list, init_host, best_effort, timeout, false);
            let go = matches!(&stopped, Ok(r) if !r.foreign);
            let _ = stop_tx.send(stopped);
            if go {
                // The tree staged already when every process but the
                // largest has its template (the largest one's copy runs on
                // the other CPU): those move now, while it runs. (`None`:
                // the caller has not said yet.)
                let mut staged: Option<Option<String>> = None;
                let mut early = |st: &mut State, largest: i32| {
                    let Some(tree) = &tree else { return };
                    // (The largest one's descriptors and cwd are read after
                    // this: not if it shares them with another process.)
                    let shared = |c: &crate::checkpoint::Cloned| {
                        sandtree_sys::process::shares_files_or_fs(largest, c.stopped.host).unwrap_or(true)
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
                                    MOVED_EARLY.fetch_add(1, Ordering::Relaxed);
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
                    Copied { kept, movable }
                });
                let _ = clone_tx.send(copied);
            }
        })?;
        // (The job's end, once the copy is done too, is not waited for.)
        drop(started);
        let report = stop_rx.recv().map_err(|_| Error::TracerGone)??;
        let cloning =
            (!report.foreign).then_some(Cloning { done: Started(clone_rx), checked: checked_rx, stage: stage_tx });
        Ok(StopAndClone { report, cloning })
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
    pub fn finish_and_go(&self, ck: &str, best_effort: bool) -> Result<Went> {
        let ck = ck.to_string();
        self.call(move |st| {
            if let Err(e) = crate::repoint::finish(st) {
                crate::checkpoint::abort(st);
                return Err(e);
            }
            crate::checkpoint::release_all(st);
            let at = std::time::Instant::now();
            Ok(Went { at, set_up: crate::checkpoint::set_up_all(st, &ck, best_effort) })
        })?
    }

    /// Let every stopped process (and init) run again, templates kept.
    pub fn release(&self) -> Result<()> {
        self.call(crate::checkpoint::release_all)
    }

    /// Pass 2 of the capture: checks and template set-up; the templates
    /// join the pool as checkpoint `ck`.
    pub fn set_up(&self, ck: &str, best_effort: bool) -> Result<CaptureReport> {
        let ck = ck.to_string();
        self.call(move |st| crate::checkpoint::set_up_all(st, &ck, best_effort))?
    }

    /// Close what the copy's job opened through the staged tree
    /// ([`Cloning::finish`]): the tree was not swapped.
    pub fn repoint_abort(&self) -> Result<()> {
        self.call(crate::repoint::abort)
    }

    /// Let every stopped process run again and drop templates not yet in
    /// the pool (a checkpoint that failed part-way).
    pub fn resume_stopped(&self) -> Result<()> {
        self.call(crate::checkpoint::abort)
    }

    /// The pool's processes (templates, standbys, holders, dying holders):
    /// their pids in the sandbox and on the host. As the tracer thread last
    /// published them (at each turn of its loop with no job waiting), with no round
    /// trip to it: a call waited for the work under way, up to 1.4 ms
    /// before a checkpoint's stop. One that became a pool process since is
    /// taken for a sandbox process: the stop skips it (its tracer is ours),
    /// and init's own check refuses a restack it would spoil.
    pub fn pool(&self) -> Result<(Vec<i32>, Vec<i32>)> {
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
    /// gives a child on the old tree, which is dropped (`holder.rs`), and
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
            crate::checkpoint::finish_pending(st);
            crate::holder::forks_to_background(st, false);
            // Before init lists the sandbox's cgroup to kill.
            st.sweep();
            if let Some(set) = st.pools.get_mut(&ck) {
                for t in set.templates.iter_mut().filter(|t| t.forking.is_some()) {
                    let t0 = std::time::Instant::now();
                    crate::holder::settle(t);
                    tracing::debug!(pid = t.image.pid, took = ?t0.elapsed(), standby = t.standby.is_some(), "rollback: the target's standby fork ended first");
                }
            }
            let killed = st.drop_dead_templates(&ck);
            RollbackPlan { templates: st.status(&ck), keep: st.pool_pids(), killed }
        })
    }

    /// Kill the holders of processes that are gone (after a rollback:
    /// their memory is torn down in the background). Queued: the caller
    /// does not wait for it.
    pub fn retire_holders(&self) -> Result<()> {
        let job: Job = Box::new(|st| crate::holder::retire(&mut st.holders, &mut st.dying));
        let tx = self.tx.lock().unwrap_or_else(|e| e.into_inner()).clone().ok_or(Error::TracerGone)?;
        tx.send(job).map_err(|_| Error::TracerGone)
    }

    /// What the pool holds for `ck` (`None`: no templates).
    pub fn status(&self, ck: &str) -> Result<Option<TemplateStatus>> {
        let ck = ck.to_string();
        self.call(move |st| st.status(&ck))
    }

    /// Rollback step: bring back the processes of `ck` (init has already
    /// killed the others and swapped the root).
    pub fn restore(&self, ck: &str) -> Result<RestoreReport> {
        let ck = ck.to_string();
        self.call(move |st| {
            let t0 = std::time::Instant::now();
            crate::checkpoint::finish_pending(st);
            tracing::debug!(took = ?t0.elapsed(), "restore: pending work finished");
            crate::restore::restore(st, &ck)
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
            st.pools.clear();
            crate::checkpoint::abort(st);
            // (Its open file would keep the old init's mounts alive.)
            st.init_host = 0;
            st.mounts.clear();
        });
        self.tx.lock().unwrap_or_else(|e| e.into_inner()).take();
    }

    /// Kill the templates of `ck` (they are collected later).
    pub fn drop_checkpoint(&self, ck: &str) -> Result<()> {
        let ck = ck.to_string();
        self.call(move |st| st.drop_checkpoint(&ck, false))
    }

    /// How many checkpoints have templates in the pool.
    pub fn checkpoints(&self) -> Result<usize> {
        self.call(|st| st.pools.len())
    }

    /// Memory only the templates hold: physical pages they map and no live
    /// process does (the pages their originals changed since). Measured
    /// outside the tracer thread (reading page maps takes a while).
    pub fn memory(&self) -> Result<u64> {
        Ok(self.measured("info")?.total)
    }

    /// The pool measured off the tracer thread ([`Sizing::measure_aside`]),
    /// for `why`.
    fn measured(&self, why: &str) -> Result<Sized> {
        let t0 = std::time::Instant::now();
        let sized = self.call(|st| st.sizing())?.measure_aside();
        tracing::debug!(why, took = ?t0.elapsed(), "pool measured");
        Ok(sized)
    }

    /// Evict least recently used checkpoints' templates until the pool
    /// holds at most `budget` bytes and `max_checkpoints` checkpoints
    /// (`keep` is never evicted). Returns the evicted checkpoint ids. The
    /// memory is measured outside the tracer thread.
    pub fn evict_to(&self, budget: u64, max_checkpoints: usize, keep: &str) -> Result<Vec<String>> {
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
            if k == keep {
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

#[cfg(test)]
mod tests {
    use super::LiveFrames;

    /// Frames in the bitmap and beyond it are found; others are not.
    #[test]
    fn live_frames_hold_what_was_inserted() {
        let mut live = LiveFrames::default();
        let inside = [0, 1, 63, 64, 6_291_455, 1 << 24];
        let beyond = [LiveFrames::BITMAP_MAX, LiveFrames::BITMAP_MAX + 12345];
        for f in inside.iter().chain(&beyond) {
            live.insert(*f);
        }
        for f in inside.iter().chain(&beyond) {
            assert!(live.contains(*f), "{f} inserted but not found");
        }
        for f in [2, 62, 65, 6_291_454, LiveFrames::BITMAP_MAX + 1, u64::MAX] {
            assert!(!live.contains(f), "{f} found but never inserted");
        }
        assert_eq!(live.high.len(), beyond.len());
    }
}
