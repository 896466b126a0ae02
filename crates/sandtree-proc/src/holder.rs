//! mm holders: keeping a killed process's memory teardown out of a
//! rollback's way.
//!
//! A rollback must kill the running copy of a process before it can give
//! its pid to the restored one, and the pid is free only once the dying
//! process has torn its address space down: for a 100 MB Python whose huge
//! pages were split by copy-on-write writes, 2-4 ms, on the rollback's
//! path. A *holder* is a second process sharing the address space
//! (`clone(CLONE_VM | CLONE_PARENT)` injected into the process, no exit
//! signal), stopped by the tracer forever and never run. With it, the
//! killed process only drops its reference to the memory and is gone at
//! once; the holder is killed after the rollback (its teardown then runs
//! in the background of whatever comes next).
//!
//! A holder of a tracked process also copies the pages it wrote since the
//! last checkpoint in the frozen window ([`Copier`], `incremental.rs`):
//! sharing the address space, a `pwritev` injected into it copies them
//! from inside, into a page file it holds.
//!
//! Every captured process gets a holder at its first checkpoint, every
//! restored process at its restore. A holder whose owner exited is killed
//! on the tracer's next tick. Holders are spared by init's kills (they are
//! in [`crate::Tracer::rollback_plan`]).

use crate::reap::Dying;
use std::os::fd::OwnedFd;

use sandtree_sys::ptrace;

use crate::inject::Tracee;
use crate::{Error, Result};

/// A process sharing its owner's address space.
pub(crate) struct Holder {
    /// Host pid.
    pub host: i32,
    /// Pid in the sandbox.
    pub ns_pid: i32,
    /// Host pid of the owner.
    pub owner: i32,
    /// pidfd of the owner: readable once it exited.
    owner_fd: OwnedFd,
    /// A template adopted as holder still has its copy of the descriptor
    /// table until [`drop_pending`], right after the rollback's reply.
    undropped: bool,
    /// The holder, to inject calls into (until [`equip`] makes it a
    /// [`Copier`]'s).
    tracee: Option<Tracee>,
    /// What copies the owner's written pages in the frozen window
    /// (`incremental.rs`), once made.
    pub copier: Option<Copier>,
    /// Making a copier failed: the owner's pages are read from the daemon
    /// (`process_vm_readv`).
    no_copier: bool,
    /// The page file's descriptor in the holder, once made (a copier lost
    /// with a failed checkpoint is made again around it).
    page_fd: Option<i32>,
    /// The owner's resident pages, as last read (`None`: not yet).
    owner_resident: Option<u64>,
}

/// A holder equipped to copy its owner's pages written since the last
/// checkpoint, in the frozen window (`incremental.rs`): it shares the
/// owner's address space, so an injected `pwritev` of those pages into a
/// page file copies them within that address space, on the CPU the tracer
/// does not use, while the tracer clones the sandbox's other processes (a
/// `process_vm_readv` from the daemon looks every page up in the other
/// process's page tables and pins it: 1,150 pages took 5-10 ms here
/// where the `pwritev` took 1.5-2.3 ms, in one of the VM's slow spells).
pub(crate) struct Copier {
    /// The holder (in a ptrace stop between calls).
    pub tracee: Tracee,
    /// The page file's descriptor in the holder.
    pub fd: i32,
    /// The page file (`None` while it is made or grown, off the tracer
    /// thread, or lent to a template's [`crate::incremental::Pending`]
    /// until its pages are written).
    pub file: Option<sandtree_sys::pagefile::PageFile>,
    /// The page file being made or grown (allocating its pages: ~1 µs a
    /// page here).
    making: Option<std::thread::JoinHandle<std::io::Result<sandtree_sys::pagefile::PageFile>>>,
    /// Bytes the page file should hold: a half more than the pages read
    /// last time.
    pub want: usize,
    /// The page file is lent to a template's pending write while this
    /// lives (one dropped with its template, unwritten, is made again).
    pub lent: Option<std::sync::Weak<()>>,
    /// Making or growing the page file failed: not tried again.
    failed: bool,
}

/// A page file's size at first: an eighth of the process's resident
/// memory, between 1 and 8 MiB (2,048 pages; the bench's steps write
/// ~1,150). One that is too small for a checkpoint's pages grows after it
/// (the pages went through `process_vm_readv` that time).
fn first_page_file(owner: i32) -> usize {
    let resident = crate::procfs::resident_pages(owner) as usize * 4096;
    (resident / 8).clamp(1 << 20, 8 << 20)
}

impl Copier {
    /// The page file, once it is made (`None` while it is being made or
    /// grown, or lent).
    pub(crate) fn ready(&mut self) -> Option<&mut sandtree_sys::pagefile::PageFile> {
        if self.making.as_ref().is_some_and(|m| m.is_finished())
            && let Some(m) = self.making.take()
        {
            match m.join() {
                Ok(Ok(f)) => self.file = Some(f),
                Ok(Err(e)) => {
                    tracing::debug!(holder = self.tracee.tid, "no page file: {e}");
                    self.failed = true;
                }
                Err(_) => {
                    tracing::debug!(holder = self.tracee.tid, "the page file's thread panicked");
                    self.failed = true;
                }
            }
        }
        self.file.as_mut()
    }

    /// Make or grow the page file to `want` bytes on a thread of its own
    /// (`file`: the one to grow; `fd`: a new one).
    fn make(&mut self, file: Option<sandtree_sys::pagefile::PageFile>, fd: Option<OwnedFd>) {
        let want = self.want;
        let spawned = std::thread::Builder::new().name("sandtree:pagefile".into()).spawn(move || {
            let _ = rustix::process::setpriority_process(None, crate::inject::BACKGROUND_NICE);
            match (file, fd) {
                (Some(mut f), _) => f.grow(want).map(|()| f),
                (None, Some(fd)) => sandtree_sys::pagefile::PageFile::new(fd, want),
                (None, None) => Err(std::io::Error::other("no page file to make")),
            }
        });
        match spawned {
            Ok(h) => self.making = Some(h),
            Err(e) => {
                tracing::debug!(holder = self.tracee.tid, "no thread to make the page file: {e}");
                self.failed = true;
            }
        }
    }
}

impl Holder {
    /// Whether the owner has exited, or exec'd (a new address space: the
    /// holder then keeps only the old one alive).
    pub(crate) fn orphaned(&self) -> bool {
        let mut fds = [rustix::event::PollFd::new(&self.owner_fd, rustix::event::PollFlags::IN)];
        let zero = rustix::time::Timespec { tv_sec: 0, tv_nsec: 0 };
        matches!(rustix::event::poll(&mut fds, Some(&zero)), Ok(n) if n > 0) || !ptrace::same_mm(self.owner, self.host)
    }
}

/// A stopped fork of a template, waiting to become a restored process's
/// address space.
pub(crate) struct Standby {
    /// It, in a ptrace stop.
    pub tracee: Tracee,
    /// Host pid.
    pub host: i32,
    /// Pid in the sandbox.
    pub ns_pid: i32,
}

/// A standby's fork under way: the template runs the injected `clone`
/// (for a 1 GB process, 10-60 ms of copying page tables) while the tracer
/// serves other jobs; [`tend_standbys`] collects it.
pub(crate) struct Forking {
    /// The child, once the fork event told it.
    child: Option<i32>,
    t0: std::time::Instant,
    /// The child's pid in the sandbox, given by us (`clone3` with
    /// `set_tid`): known from the start, so that a rollback's kill list
    /// spares the child without waiting for the fork to end. `None`: a
    /// plain `clone`, whatever pid comes.
    ns_pid: Option<i32>,
    /// The template's scratch page, which holds the `clone3` arguments.
    scratch: u64,
    /// The call's entry stop is still to come (the call is started
    /// without waiting for it: `Tracee::start_syscall_unwaited`).
    entering: bool,
    /// The template's nice value, given back to it and to the standby
    /// when the fork ends (a rollback runs forks under way at
    /// [`crate::inject::BACKGROUND_NICE`]).
    nice: Option<i32>,
}

/// What [`tend_standbys`] did.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Tended {
    /// Nothing to do.
    Idle,
    /// A fork is under way (poll again soon).
    Forking,
    /// A fork was started or collected.
    Worked,
}

/// Gives templates without a standby their standby, one fork at a time,
/// without waiting for it: collects the fork under way if it is done, or
/// starts one. Order: the templates tracked processes' next checkpoints
/// start from first (`incremental.rs`), then those of large processes
/// ([`large`]), then by checkpoint, the most recently used first (the
/// likeliest rollback target). While such a base
/// template's pages are being written, no other fork starts (the base's,
/// which the next checkpoint needs, would wait for it). The tracer calls it
/// between operations.
pub(crate) fn tend_standbys(st: &mut crate::tracer::State) -> Tended {
    if !st.stops.is_empty() || !st.cloned.is_empty() {
        return Tended::Idle;
    }
    let mut under_way = false;
    // (A test's: `incremental::hold_standby_forks`.)
    let held: Vec<i32> = match crate::incremental::HOLD.load(std::sync::atomic::Ordering::Relaxed) {
        true => st.tracking.values().filter_map(|t| t.base.as_ref().map(|b| b.1)).collect(),
        false => Vec::new(),
    };
    for t in st.pools.values_mut().flat_map(|c| c.templates.iter_mut()) {
        if t.forking.is_none() {
            continue;
        }
        if held.contains(&t.host) {
            under_way = true;
            continue;
        }
        match poll(t) {
            Some(()) => return Tended::Worked,
            None => under_way = true,
        }
    }
    if under_way {
        return Tended::Forking;
    }
    let bases = base_hosts(st);
    let writing = st.pools.values().flat_map(|c| &c.templates).any(|t| t.to_write.is_some() && bases.contains(&t.host));
    let Some((ck, i)) = st
        .pools
        .iter()
        .flat_map(|(ck, c)| c.templates.iter().enumerate().map(move |(i, t)| (ck, c.last_used, i, t)))
        .filter(|(.., t)| t.standby.is_none() && !t.no_standby && t.to_write.is_none() && t.scratch != 0)
        .filter(|(.., t)| !writing || bases.contains(&t.host))
        .max_by_key(|(_, used, _, t)| (bases.contains(&t.host), large(t), *used))
        .map(|(ck, _, i, _)| (ck.clone(), i))
    else {
        return Tended::Idle;
    };
    let taken: std::collections::HashSet<i32> = st.pool_pids().into_iter().collect();
    let next = &mut st.next_pool_pid;
    let Some(t) = st.pools.get_mut(&ck).and_then(|c| c.templates.get_mut(i)) else { return Tended::Idle };
    let ns_pid = (!t.any_pid).then(|| pool_pid(next, &taken));
    // (Off the tracer's CPU for the fork: see `start`.)
    crate::inject::move_off_tracer(t.host);
    match start(t, ns_pid) {
        Ok(()) => {
            t.forking = Some(Forking {
                child: None,
                t0: std::time::Instant::now(),
                ns_pid,
                scratch: t.scratch,
                entering: true,
                nice: crate::inject::nice_of(t.host),
            })
        }
        Err(e) => failed(t, e),
    }
    Tended::Worked
}

/// The templates tracked processes' next checkpoints start from (host
/// pids), and the ones before them (`incremental::Extra`) whose standby is
/// still to come: their standbys are the ones a checkpoint takes. (The
/// one before whose standby a checkpoint took already is made again only
/// when the last checkpoint was *behind*, `Tracking::behind`: else its
/// fork would double the forks of large processes, and the base's, a
/// 1 GB one's 10-20 ms, would wait for it.)
fn base_hosts(st: &crate::tracer::State) -> Vec<i32> {
    let taken = |id: &(String, i32)| st.template(id).is_none_or(|t| t.standby_taken);
    let prev = |t: &crate::track::Tracking| {
        let always = crate::incremental::PREFER_PREV.load(std::sync::atomic::Ordering::Relaxed);
        t.prev.as_ref().filter(|(id, _)| always || t.behind || !taken(id)).map(|((_, host), _)| *host)
    };
    st.tracking.values().flat_map(|t| [t.base.as_ref().map(|b| b.1), prev(t)]).flatten().collect()
}

/// A pid for a standby: the highest free one below the last given (from
/// the top of the range, where the kernel, counting up from 1, gives pids
/// last), none of the pool's.
fn pool_pid(next: &mut i32, taken: &std::collections::HashSet<i32>) -> i32 {
    static PID_MAX: std::sync::OnceLock<i32> = std::sync::OnceLock::new();
    let max = *PID_MAX.get_or_init(|| {
        std::fs::read_to_string("/proc/sys/kernel/pid_max").ok().and_then(|v| v.trim().parse().ok()).unwrap_or(32768)
    });
    let floor = max / 2;
    let mut pid = if *next <= floor || *next >= max { max - 1 } else { *next };
    // (At most once round the upper half: a pool that held all of it would
    // get a taken pid, and its clone3 EEXIST.)
    for _ in floor..max {
        if !taken.contains(&pid) {
            break;
        }
        pid = if pid - 1 <= floor { max - 1 } else { pid - 1 };
    }
    *next = pid - 1;
    pid
}

/// Whether `t`'s process holds enough private memory that a restore
/// without its standby forks it for milliseconds on the rollback's path (a
/// 100 MB Python: 2.5-4 ms, a rollback of ~7 ms instead of ~3; a shell or a
/// small server: ~0.3 ms). After a burst of checkpoints the standbys lag
/// behind; those of large processes are made first, since their absence is
/// what makes a rollback slow.
fn large(t: &crate::tracer::Template) -> bool {
    const LARGE: u64 = 32 << 20;
    let private: u64 =
        t.image.maps.iter().filter(|m| !m.shared() && m.perms.starts_with("rw")).map(|m| m.end - m.start).sum();
    private >= LARGE
}

/// Start the injected fork of template `t`: `clone3` with `set_tid` when
/// `ns_pid` is given, else `clone`. Parent = the template's parent (init).
///
/// The standby shares the template's root and working directory
/// (`CLONE_FS`; neither ever changes them, and what is restored from it
/// gets a copy): a layered checkpoint's `pivot_root` moves the root of
/// every task on the kernel's list, and a child still being forked is not
/// on it yet; with its own copy it kept the old, detached tree and was
/// dropped. An agent that thinks between steps made the pool fork 1 GB
/// standbys that its next checkpoint overtook: 36 of them dropped in one
/// bench run, each 25-100 ms of CPU beside the checkpoints. Sharing the
/// template's, it is moved with the template.
///
/// The fork runs off the tracer's CPU (the template is moved there first;
/// [`Forking::collect`] pins both back). On that CPU, where the tracer and
/// every call it injects run, a fork held the CPU for milliseconds at
/// their wake-ups, even at nice 19: a task that ran just before (the
/// tracer after a checkpoint, a 1 GB REPL that wrote its pages) wakes
/// with a negative scheduler lag, and the fork keeps the CPU until that
/// is paid (a sched trace: the REPL's injected `brk` took 3 ms instead of
/// 30 µs). Moved off once a checkpoint began, alternating per checkpoint
/// in one bench run: 1 GB checkpoint p50 9.7 against 15.4 ms (with a fork
/// under way 12.8 against 16.2), 100 MB with one 4.1 against 5.2. Off
/// from the start, alternating per fork in another run: 100 MB 4.1
/// against 5.4 ms, 1 GB 13.2 against 15.0 (the time from the
/// checkpoint's start to the stop, p90, 0.1 against 0.7-3 ms).
fn start(t: &mut crate::tracer::Template, ns_pid: Option<i32>) -> Result<()> {
    let flags = (libc::CLONE_PARENT | libc::CLONE_FS) as u64;
    let Some(pid) = ns_pid else { return t.tracee.start_syscall_unwaited(libc::SYS_clone, &[flags, 0, 0, 0, 0]) };
    let args = crate::inject::clone_args(t.scratch + crate::inject::SET_TID_OFFSET, flags);
    crate::inject::write_clone_args(t.host, t.scratch, &args, pid)?;
    t.tracee.start_syscall_unwaited(libc::SYS_clone3, &[t.scratch, crate::inject::CLONE_ARGS_SIZE])
}

impl Forking {
    /// The standby, once the fork (run by `tpl`, its template) is done:
    /// `None` while it runs.
    pub(crate) fn poll(&mut self, tpl: &mut Tracee) -> Option<Result<Standby>> {
        match tpl.poll_syscall(&mut self.child, &mut self.entering) {
            Ok(None) => None,
            Ok(Some(out)) => Some(self.collect(tpl, Ok(out))),
            Err(e) => Some(self.collect(tpl, Err(e))),
        }
    }

    /// Wait for the standby.
    pub(crate) fn finish(mut self, tpl: &mut Tracee) -> Result<Standby> {
        if let Some(done) = self.poll(tpl) {
            return done;
        }
        // (Someone waits for it now.)
        if self.nice.is_some() {
            crate::inject::set_nice(tpl.tid, crate::inject::RESTORE_NICE);
        }
        // (The rest of the fork, and its exit stop.)
        let out = tpl.finish_syscall_entering(&mut self.entering).map(|mut o| {
            o.child = o.child.or(self.child);
            o
        });
        self.collect(tpl, out)
    }

    /// The child's pid in the sandbox, if we gave it.
    pub(crate) fn ns_pid(&self) -> Option<i32> {
        self.ns_pid
    }

    fn collect(&self, tpl: &mut Tracee, out: Result<crate::inject::Outcome>) -> Result<Standby> {
        // Back where the tracer's calls are cheapest, if a rollback moved
        // it (the child was made with the template's affinity).
        crate::inject::pin_to_tracer(tpl.tid);
        let child = out.as_ref().ok().and_then(|o| o.child).or(self.child);
        if let Some(c) = child {
            crate::inject::pin_to_tracer(c);
        }
        // (The child took the template's nice value at some point of the
        // fork: both get the process's back.)
        if let Some(n) = self.nice {
            crate::inject::set_nice(tpl.tid, n);
            if let Some(c) = child {
                crate::inject::set_nice(c, n);
            }
        }
        let out = match out {
            Ok(out) => out,
            Err(e) => {
                // (The template died after the fork event told of a child.)
                if let Some(c) = self.child {
                    crate::inject::kill_tracee(c);
                }
                return Err(e);
            }
        };
        // (The same call again if a signal pending at the fork restarts it.)
        let (clone3, clone) = ([self.scratch, crate::inject::CLONE_ARGS_SIZE], [libc::CLONE_PARENT as u64, 0, 0, 0, 0]);
        let (call, what): ((i64, &[u64]), _) = match self.ns_pid {
            Some(_) => ((libc::SYS_clone3, &clone3), CLONE3_STANDBY),
            None => ((libc::SYS_clone, &clone), "clone (standby)"),
        };
        let (host, ns_pid, regs) = tpl.cloned(out, call, what)?;
        // A fork copies its parent's root early and joins the task list
        // last: a swap of the sandbox's root meanwhile (a rollback's, or a
        // layered checkpoint's, `pivot_root`, which moves the root of every
        // task on that list) missed the child, which would keep the old,
        // detached tree, and so would whatever is restored from it.
        if crate::procfs::root_of(host) != crate::procfs::root_of(tpl.tid) {
            crate::reap::kill_later(host, ns_pid);
            return Err(Error::RootMoved { pid: tpl.tid });
        }
        tracing::debug!(template = tpl.tid, standby = ns_pid, took = ?self.t0.elapsed(), "standby made");
        Ok(Standby { tracee: Tracee::new(host, regs, tpl.insn), host, ns_pid })
    }
}

/// Collect `t`'s standby fork if it is done: `None` while it runs.
fn poll(t: &mut crate::tracer::Template) -> Option<()> {
    let done = t.forking.as_mut()?.poll(&mut t.tracee)?;
    t.forking = None;
    keep(t, done);
    Some(())
}

/// Wait for `t`'s standby fork, if one is under way (a job that uses the
/// template, or kills it, first lets the fork end).
pub(crate) fn settle(t: &mut crate::tracer::Template) {
    if let Some(f) = t.forking.take() {
        let done = f.finish(&mut t.tracee);
        keep(t, done);
    }
}

/// `t`'s standby fork under way, if any, with a handle on `t` to end it
/// by (for a checkpoint that takes the standby as its template,
/// `incremental.rs`): `t` itself must not be asked for anything until then.
pub(crate) fn take_forking(t: &mut crate::tracer::Template) -> Option<(Tracee, Forking)> {
    let f = t.forking.take()?;
    Some((Tracee::new(t.host, t.tracee.saved, t.tracee.insn), f))
}

/// Names the `clone3` of a standby with a pid of ours in errors.
const CLONE3_STANDBY: &str = "clone3 (standby)";

fn keep(t: &mut crate::tracer::Template, made: Result<Standby>) {
    match made {
        Ok(s) => t.standby = Some(s),
        Err(Error::Remote { call: CLONE3_STANDBY, errno, .. }) => match errno.raw_os_error() {
            // The pid was taken meanwhile: another one next time.
            Some(libc::EEXIST) => tracing::debug!(pid = t.image.pid, "standby pid taken"),
            // No pid of ours for it (no CAP_SYS_ADMIN over the sandbox's
            // pid namespace): whatever pid comes, from now on.
            _ => {
                tracing::debug!(pid = t.image.pid, "standby without a pid of ours: {errno}");
                t.any_pid = true;
            }
        },
        // (Made again next time, from the template's root.)
        Err(e @ Error::RootMoved { .. }) => tracing::debug!(pid = t.image.pid, "standby dropped: {e}"),
        Err(e) => failed(t, e),
    }
}

fn failed(t: &mut crate::tracer::Template, e: Error) {
    // Not again for this template (a restore forks it instead).
    t.no_standby = true;
    tracing::debug!(pid = t.image.pid, "no standby: {e}");
}

/// Standby forks under way run at [`crate::inject::BACKGROUND_NICE`] until the operation
/// ends ([`forks_to_foreground`]): at a rollback every one it does not
/// wait for, beside the restore's calls; at a checkpoint (`spare_bases`)
/// all but the standbys of tracked processes' bases, which the checkpoint
/// takes. (They run off the tracer's CPU, where every call of a restore or
/// a capture is injected, from their start: [`start`]. A 1 GB fork there
/// made a 0.3 ms restore take 3-6 ms.)
pub(crate) fn forks_to_background(st: &crate::tracer::State, spare_bases: bool) {
    let bases = if spare_bases { base_hosts(st) } else { Vec::new() };
    for t in st.pools.values().flat_map(|c| &c.templates) {
        if let Some(f) = &t.forking
            && f.nice.is_some()
            && !bases.contains(&t.host)
        {
            crate::inject::set_nice(t.host, crate::inject::BACKGROUND_NICE);
        }
    }
}

/// Standby forks under way get their template's nice value back (the
/// operation that sent them to [`crate::inject::BACKGROUND_NICE`] is over: at that value
/// the sandbox's own processes would starve them, and the forks after
/// them wait).
pub(crate) fn forks_to_foreground(st: &mut crate::tracer::State) {
    if st.ops.load(std::sync::atomic::Ordering::SeqCst) > 0 {
        return;
    }
    for t in st.pools.values().flat_map(|c| &c.templates) {
        if let Some(n) = t.forking.as_ref().and_then(|f| f.nice) {
            crate::inject::set_nice(t.host, n);
        }
    }
}

/// Every standby fork whose child's pid is not known yet ended (see
/// [`settle`]): a rollback's kill list must name every pool process.
pub(crate) fn settle_anonymous(st: &mut crate::tracer::State) {
    for t in st.pools.values_mut().flat_map(|c| c.templates.iter_mut()) {
        if t.forking.as_ref().is_some_and(|f| f.ns_pid.is_none()) {
            settle(t);
        }
    }
}

/// A pidfd of `owner`, the process a holder keeps the memory of.
fn owner_pidfd(owner: i32) -> Result<OwnedFd> {
    let pid = rustix::process::Pid::from_raw(owner).ok_or(Error::Died { pid: owner, how: "has no pid".into() })?;
    rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty()).map_err(|e| Error::Ptrace {
        pid: owner,
        op: "pidfd_open",
        source: e.into(),
    })
}

/// What makes a process sharing the owner's memory a holder: out of the
/// owner's session and group (or their id, the owner's pid, would stay
/// taken after the owner died), and without the copy of its descriptor
/// table (a listener kept there would keep its port taken). A syscall
/// instruction writes no memory: running one in the shared address space
/// is harmless.
fn let_go_of_owner(h: &mut Tracee) -> Result<()> {
    h.call("setsid (holder)", libc::SYS_setsid, &[])?;
    drop_descriptors(h)
}

/// Close every descriptor of holder `h`.
fn drop_descriptors(h: &mut Tracee) -> Result<()> {
    h.call("close_range (holder)", libc::SYS_close_range, &[0, u32::MAX as u64, 0]).map(|_| ())
}

/// A template whose address space a restored process (`owner`) now shares
/// becomes that process's holder (`restore.rs`). Its set-up already took
/// it out of the original's session or group; its copy of the descriptor
/// table goes.
pub(crate) fn adopt((t, ns_pid): (Tracee, i32), owner: i32) -> Result<Holder> {
    let host = t.tid;
    let owner_fd = match owner_pidfd(owner) {
        Ok(fd) => fd,
        Err(e) => {
            crate::inject::kill_tracee(host);
            return Err(e);
        }
    };
    Ok(Holder {
        host,
        ns_pid,
        owner,
        owner_fd,
        undropped: true,
        tracee: Some(t),
        copier: None,
        no_copier: false,
        page_fd: None,
        owner_resident: None,
    })
}

/// Adopted holders drop their copy of the descriptor table (after the
/// rollback's reply: a holder never runs, and the copy only keeps the
/// same files open a moment longer). One that cannot is killed.
pub(crate) fn drop_pending(holders: &mut Vec<Holder>, dying: &mut Vec<Dying>) {
    holders.retain_mut(|h| {
        let Some(t) = h.tracee.as_mut().filter(|_| h.undropped) else { return true };
        if let Err(e) = drop_descriptors(t) {
            tracing::warn!(pid = h.ns_pid, "holder kept descriptors, killed: {e}");
            dying.push(crate::reap::let_die(h.host, h.ns_pid));
            return false;
        }
        h.undropped = false;
        true
    });
}

/// Processes with fewer resident bytes get no page file (see
/// [`equip_next`]).
const COPIER_MIN_RSS: u64 = 32 << 20;

/// The resident pages of `owner`, as a checkpoint just read them: whether
/// its holder gets a page file ([`equip_next`]) follows its size.
pub(crate) fn note_resident(holders: &mut [Holder], owner: i32, pages: u64) {
    for h in holders.iter_mut().filter(|h| h.owner == owner) {
        h.owner_resident = Some(pages);
    }
}

/// Between operations: the next holder of a tracked process that lacks a
/// copier, or whose page file is smaller than the pages read last time,
/// gets one (the page file is made on a thread of its own). Returns
/// whether it did anything.
pub(crate) fn equip_next(st: &mut crate::tracer::State) -> bool {
    // (Read once for a new holder, not at each turn of the tracer's idle
    // loop: checkpoints keep it current, `note_resident`.)
    for h in st.holders.iter_mut().filter(|h| h.owner_resident.is_none() && h.copier.is_none()) {
        h.owner_resident = Some(crate::procfs::resident_pages(h.owner));
    }
    let tracking = &st.tracking;
    let wanted = |h: &Holder| {
        !h.no_copier
            && !h.undropped
            && tracking.contains_key(&h.owner)
            && match &h.copier {
                // (A small process writes few pages: read by the daemon,
                // they cost less than a page file kept for it.)
                None => {
                    (h.tracee.is_some() || h.page_fd.is_some())
                        && h.owner_resident.is_some_and(|p| p * 4096 >= COPIER_MIN_RSS)
                }
                Some(c) if c.making.is_some() || c.failed => false,
                Some(c) => match &c.file {
                    Some(f) => f.len() < c.want,
                    None => c.lent.as_ref().is_none_or(|l| l.strong_count() == 0),
                },
            }
    };
    let Some(h) = st.holders.iter_mut().find(|h| wanted(h)) else { return false };
    if let Some(c) = h.copier.as_mut() {
        let file = c.file.take();
        // (Lost with its template: the holder's descriptor again.)
        let fd = match file {
            Some(_) => None,
            None => match sandtree_sys::uffd::take_fd(h.host, c.fd) {
                Ok(fd) => Some(fd),
                Err(e) => {
                    tracing::debug!(pid = h.ns_pid, "the holder's page file is gone: {e}");
                    h.copier = None;
                    h.no_copier = true;
                    return true;
                }
            },
        };
        c.lent = None;
        c.make(file, fd);
        return true;
    }
    if let Err(e) = equip(h) {
        tracing::debug!(pid = h.ns_pid, "the holder copies no pages: {e}");
        h.no_copier = true;
    }
    true
}

/// Give holder `h` a page file: a memfd it makes (injected
/// `memfd_create`; the daemon takes a duplicate with `pidfd_getfd`), whose
/// pages are allocated on a thread of the daemon. It runs off the tracer's
/// CPU from here on (its copies run beside the tracer's work). A holder
/// whose copier was lost (with a checkpoint that failed while it was lent)
/// gets one again around the page file it has.
fn equip(h: &mut Holder) -> Result<()> {
    let host = h.host;
    let (t, fd) = match (h.tracee.take(), h.page_fd) {
        (Some(t), None) => make_page_file(h, t)?,
        (t, Some(fd)) => {
            let t = match t {
                Some(t) => t,
                None => {
                    let regs = ptrace::regs(host).map_err(|e| Error::Ptrace { pid: host, op: "GETREGS", source: e })?;
                    Tracee::new(host, regs, crate::inject::find_syscall_insn(host)?)
                }
            };
            (t, fd)
        }
        (None, None) => return Ok(()),
    };
    let file =
        sandtree_sys::uffd::take_fd(host, fd).map_err(|e| Error::Ptrace { pid: host, op: "pidfd_getfd", source: e })?;
    crate::inject::move_off_tracer(host);
    let want = first_page_file(h.owner);
    let mut c = Copier { tracee: t, fd, file: None, making: None, want, lent: None, failed: false };
    c.make(None, Some(file));
    h.copier = Some(c);
    Ok(())
}

/// The memfd of holder `h`'s page file, made by it (`t`): its descriptor
/// there.
fn make_page_file(h: &mut Holder, mut t: Tracee) -> Result<(Tracee, i32)> {
    let host = h.host;
    let base = crate::procfs::vdso_base(host).map_err(|e| Error::Proc { pid: host, what: "auxv", source: e })?;
    // The name: "", a zero byte of the vDSO's ELF header (e_ident's
    // padding, zero in every ELF file): memory the holder may read
    // whatever its owner does meanwhile.
    let name = base + 9;
    let mut zero = [1u8];
    ptrace::read_mem(host, name, &mut zero).map_err(|e| Error::Ptrace { pid: host, op: "read vdso", source: e })?;
    if zero[0] != 0 {
        return Err(Error::unsupported(h.ns_pid, "", "vdso", "no zero byte in the vDSO's ELF header"));
    }
    // (Sealable: the daemon seals it against shrinking, `PageFile`.)
    let flags = (libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) as u64;
    let fd = t.call("memfd_create (page file)", libc::SYS_memfd_create, &[name, flags])? as i32;
    h.page_fd = Some(fd);
    Ok((t, fd))
}

/// Lend the copier of `owner`'s holder to its checkpoint (`None` when it
/// has none, or none ready).
pub(crate) fn lend_copier(holders: &mut [Holder], owner: i32) -> Option<Copier> {
    holders.iter_mut().find(|h| h.owner == owner && h.copier.is_some())?.copier.take()
}

/// The copier lent by [`lend_copier`], back to its holder (or dropped, if
/// the holder is gone). One lost with a failed checkpoint is made again
/// between operations ([`equip_next`]).
pub(crate) fn give_back_copier(holders: &mut [Holder], owner: i32, copier: Copier) {
    if let Some(h) = holders.iter_mut().find(|h| h.owner == owner && h.copier.is_none() && h.tracee.is_none()) {
        h.copier = Some(copier);
    }
}

/// A page file lent to a template's pending write, back to the copier of
/// `owner`'s holder once its pages are written.
pub(crate) fn give_back_file(holders: &mut [Holder], owner: i32, file: sandtree_sys::pagefile::PageFile) {
    if let Some(c) = holders.iter_mut().find(|h| h.owner == owner).and_then(|h| h.copier.as_mut())
        && c.file.is_none()
        && c.making.is_none()
    {
        c.file = Some(file);
        c.lent = None;
    }
}

/// Make a holder of `t`'s address space (`t` stopped, ours). A child of
/// init for a child of init; else a child of the owner (with no exit
/// signal, another parent would never reap it), which passes to init with
/// the owner's death.
pub(crate) fn make(t: &mut Tracee, parent_is_init: bool) -> Result<Holder> {
    let owner = t.tid;
    let owner_fd = owner_pidfd(owner)?;
    let flags = if parent_is_init { libc::CLONE_VM | libc::CLONE_PARENT } else { libc::CLONE_VM } as u64;
    let (host, ns_pid, regs) = t.clone_stopped(flags, "clone (mm holder)")?;
    let mut tracee = Tracee::new(host, regs, t.insn);
    if let Err(e) = let_go_of_owner(&mut tracee) {
        crate::inject::kill_tracee(host);
        return Err(e);
    }
    Ok(Holder {
        host,
        ns_pid,
        owner,
        owner_fd,
        undropped: false,
        tracee: Some(tracee),
        copier: None,
        no_copier: false,
        page_fd: None,
        owner_resident: None,
    })
}

/// SIGKILL the holders whose owner exited; they are reaped by
/// [`reap_dying`] (their teardown must not hold the tracer).
pub(crate) fn retire(holders: &mut Vec<Holder>, dying: &mut Vec<Dying>) {
    holders.retain(|h| {
        if h.orphaned() {
            dying.push(crate::reap::let_die(h.host, h.ns_pid));
            false
        } else {
            true
        }
    });
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    #[test]
    fn standby_pids_count_down_from_the_top_and_skip_the_pools() {
        let max: i32 = std::fs::read_to_string("/proc/sys/kernel/pid_max").unwrap().trim().parse().unwrap();
        let mut next = 0;
        let none = HashSet::new();
        assert_eq!(super::pool_pid(&mut next, &none), max - 1);
        assert_eq!(super::pool_pid(&mut next, &none), max - 2);
        let taken: HashSet<i32> = [max - 3, max - 4].into();
        assert_eq!(super::pool_pid(&mut next, &taken), max - 5);
        // Down to the middle of the range, then from the top again.
        next = max / 2 + 1;
        assert_eq!(super::pool_pid(&mut next, &none), max / 2 + 1);
        assert_eq!(super::pool_pid(&mut next, &none), max - 1);
        let top: HashSet<i32> = [max - 1].into();
        next = max / 2 + 1;
        super::pool_pid(&mut next, &none);
        assert_eq!(super::pool_pid(&mut next, &top), max - 2);
    }
}
