//! Rollback in place of a sandbox's processes from their templates. See the
//! crate docs for the order; init has already killed every other process
//! and swapped the root when this runs.

use crate::inject::{CLONE_ARGS_SIZE, RESTORE_NICE, SET_TID_OFFSET, clone_args, nice_of, set_nice, write_clone_args};
use std::collections::{HashMap, HashSet};
use std::os::fd::OwnedFd;

use sandtree_sys::ptrace;

use crate::batch::SCRATCH;
use crate::batch::{Arg, Backoff, Batch};
use crate::inject::{self, Tracee};
use crate::model::{AnonState, FdKind, ProcessImage};
use crate::template::Template;
use serde::{Deserialize, Serialize};

use crate::memory_holder::Holder;
use crate::pool::Pool;
use crate::reap::Dying;
use crate::track::Trackings;
use crate::{Error, Result};

use crate::inject::ERESTARTNOINTR;
const EEXIST: i64 = -(libc::EEXIST as i64);
/// How long a restore waits for the killed original to release its pid.
const PID_WAIT: std::time::Duration = std::time::Duration::from_secs(5);
/// Where in the scratch page paths go.
const PATH_OFFSET: u64 = 256;

fn ptrace_err(pid: i32, op: &'static str) -> impl FnOnce(std::io::Error) -> Error {
    move |source| Error::Ptrace { pid, op, source }
}

/// The parts of the tracer thread's state a restore reads and changes.
pub(crate) struct Parts<'a> {
    /// The pool, which holds the checkpoint's templates.
    pub pool: &'a mut Pool,
    /// Holders of the live processes' address spaces.
    pub holders: &'a mut Vec<Holder>,
    /// Killed pool processes not reaped yet.
    pub dying: &'a mut Vec<Dying>,
    /// The written-page trackings of the killed processes, which end.
    pub tracking: &'a mut Trackings,
    /// The pool's cgroup, out of which restored processes move.
    pub cgroup: Option<&'a crate::cgroup::PoolCgroup>,
}

/// What [`crate::Tracer::restore`] brought back.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct RestoreReport {
    /// In-sandbox pids running again.
    pub restored: Vec<i32>,
    /// Checkpoints whose templates were dropped because one of them held
    /// a pid this restore needed.
    pub evicted: Vec<String>,
}

pub(crate) fn restore(st: Parts<'_>, ck: &str) -> Result<RestoreReport> {
    let t0 = std::time::Instant::now();
    // The killed originals' trackings end with them.
    let holders = &st.holders;
    st.tracking.end_killed(|host| holders.iter().find(|h| h.owner == host).map(|h| h.host));
    let t_untrack = t0.elapsed();
    let mut report = RestoreReport::default();
    let Some(set) = st.pool.get(ck) else { return Err(Error::NoTemplates(ck.to_string())) };
    // A template of another checkpoint may hold a pid this one needs (its
    // process had exited by then and the pid was reused): drop that
    // checkpoint's templates first.
    let needed: HashSet<i32> = set
        .templates
        .iter()
        .flat_map(|t| std::iter::once(t.image.pid).chain(t.image.other_threads.iter().map(|th| th.tid)))
        .collect();
    // Standby forks under way (`memory_holder.rs`) end first where the restore
    // needs the template, or the pid their child gets; the others go on.
    for (k, set) in st.pool.iter_mut() {
        for t in set.templates.iter_mut() {
            let pid = t.forking.as_ref().and_then(|f| f.ns_pid());
            if k == ck || pid.is_some_and(|p| needed.contains(&p)) {
                t.settle_standby();
            }
        }
    }
    let t_settle = t0.elapsed();
    let conflicting = st.pool.holding_any(ck, &needed);
    for k in conflicting {
        st.pool.drop_checkpoint(&k, true, st.holders);
        report.evicted.push(k);
    }
    // Likewise a standby, or a holder (its owner was just killed): they go now.
    {
        for t in st.pool.templates_mut() {
            if t.standby.as_ref().is_some_and(|s| needed.contains(&s.ns_pid))
                && let Some(s) = t.standby.take()
            {
                crate::inject::kill_tracee(s.host);
            }
        }
    }
    st.dying.retain(|d| {
        if needed.contains(&d.ns_pid) {
            crate::inject::kill_tracee(d.host);
            false
        } else {
            true
        }
    });
    st.holders.retain(|h| {
        if needed.contains(&h.ns_pid) {
            crate::inject::kill_tracee(h.host);
            false
        } else {
            true
        }
    });
    let t_evict = t0.elapsed() - t_settle;
    let now = st.pool.tick();
    let cg = st.cgroup;
    let Some(set) = st.pool.get_mut(ck) else { return Err(Error::NoTemplates(ck.to_string())) };
    set.last_used = now;
    // FIFOs on the layers are reopened by path in the rolled-back tree (in
    // `fix_up`): a keeper opened here for reading and writing lets those
    // non-blocking opens succeed whatever their mode, and takes the saved
    // bytes. The keepers close once every process is back.
    let mut fifos: HashMap<String, OwnedFd> = HashMap::new();
    for t in &set.templates {
        for f in &t.image.fds {
            if let FdKind::Fifo { path, on_layer: true, .. } = &f.kind
                && !fifos.contains_key(path)
            {
                let keeper = crate::fdstate::open_fifo(t.host, path).map_err(|e| Error::Proc {
                    pid: t.host,
                    what: "named pipe in the rolled-back tree",
                    source: e,
                })?;
                fifos.insert(path.clone(), keeper);
            }
        }
    }
    // Objects the templates share with the killed originals: put their
    // checkpoint state back before anything runs.
    for (pipe, host, fd) in &set.pipes {
        let layer_fifo =
            set.templates.iter().filter(|t| t.host == *host).flat_map(|t| &t.image.fds).find_map(|f| match &f.kind {
                FdKind::Fifo { path, on_layer: true, .. } if f.fd == *fd => Some(path),
                _ => None,
            });
        let filled = match layer_fifo.and_then(|path| fifos.get(path)) {
            Some(keeper) => crate::fdstate::fill_pipe(keeper, &pipe.bytes, pipe.size),
            None => crate::fdstate::restore_pipe(*host, *fd, &pipe.bytes),
        };
        filled.map_err(|e| Error::Proc { pid: *host, what: "pipe contents", source: e })?;
    }
    for t in &set.templates {
        for f in &t.image.fds {
            if let FdKind::Socket { family, connected: true, .. } = &f.kind
                && family == "unix"
            {
                // Empty at the checkpoint (checked then): drop what came since.
                crate::fdstate::drain_socket(t.host, f.fd).map_err(|e| Error::Proc {
                    pid: t.host,
                    what: "unix socket queue",
                    source: e,
                })?;
            }
            if let FdKind::AnonInode { state: Some(state), what } = &f.kind
                && !f.kind.recreated()
            {
                crate::fdstate::restore_anon(t.host, f.fd, state).map_err(|e| Error::Proc {
                    pid: t.host,
                    what: if what == "eventfd" { "eventfd counter" } else { "timerfd setting" },
                    source: e,
                })?;
            }
        }
    }
    // After every drain: data queued at the checkpoint on unix sockets,
    // sent again by their peers.
    for (buf, host, fd) in &set.sockets {
        crate::fdstate::fill_socket(*host, *fd, &buf.messages, buf.stream).map_err(|e| Error::Proc {
            pid: *host,
            what: "unix socket data",
            source: e,
        })?;
    }
    tracing::debug!(?t_untrack, ?t_settle, ?t_evict, t_objects = ?t0.elapsed() - t_settle - t_evict, "restore prelude");
    let mut holders = Vec::new();
    // Small processes first: the big ones take longest to tear down. One
    // whose pid is not free yet (its killed original still exiting: a
    // session leader's terminal hangup takes a while) waits until the
    // others are back.
    let mut order: Vec<(usize, bool)> = (0..set.templates.len()).map(|i| (i, false)).collect();
    order.sort_by_key(|&(i, _)| set.templates[i].image.maps.iter().map(|m| m.end - m.start).sum::<u64>());
    let mut next = 0;
    // Each process goes once all are back (see [`Ready`]).
    let mut waiting: Vec<Ready> = Vec::new();
    while next < order.len() {
        let (i, wait) = order[next];
        next += 1;
        let t = &mut set.templates[i];
        let t0 = std::time::Instant::now();
        let res = restore_one(t, wait, cg);
        if !wait
            && let Err(Error::Remote { call: "clone3 (restore)", errno, .. }) = &res
            && errno.raw_os_error() == Some(libc::EEXIST)
        {
            order.push((i, true));
            continue;
        }
        tracing::debug!(pid = t.image.pid, comm = t.image.comm, took = ?t0.elapsed(), "process restored");
        let failed = match res {
            Ok((holder, mut ready)) => {
                report.restored.push(t.image.pid);
                holders.extend(holder);
                let parked = ready.park();
                waiting.push(ready);
                parked.err()
            }
            Err(e) => Some(e),
        };
        if let Some(e) = failed {
            st.holders.extend(holders);
            // (The sandbox is restarted: those back go as they were.)
            for r in waiting {
                let _ = r.release();
            }
            return Err(e);
        }
    }
    st.holders.extend(holders);
    let t_rel = std::time::Instant::now();
    // (Back on its CPU once the rollback has its answer.)
    crate::inject::step_aside();
    let mut released = Ok(());
    for r in waiting {
        let res = r.release();
        if released.is_ok() {
            released = res;
        }
    }
    drop(fifos);
    tracing::debug!(release = ?t_rel.elapsed(), "restore released");
    released?;
    Ok(report)
}

/// A restored process, fixed up and still stopped: let go once every
/// process of the checkpoint is back, so that none runs (its first
/// copy-on-write faults, on the tracer's CPU) ahead of the next one's
/// restore. Alternating in one run (quiet host), rollback p50 / p90 with
/// and without: 3.10 / 4.16 and 3.28 / 7.09 ms, 2.94 / 3.84 and 3.16 /
/// 4.21 ms.
///
/// It is parked ([`Ready::park`]: the stop in signal context that its
/// registers are set in, which takes a round trip through the process)
/// right after its restore, while it still runs on the tracer's CPU; the
/// release is then only ptrace requests that wait for no process, made
/// with the tracer stepped off its CPU ([`crate::inject::step_aside`]):
/// a process let go wakes where it ran, and there it preempted the
/// tracer, which waited 0.2-0.5 ms (`http.server` resuming) before it let
/// the next one go. Alternating in one run, the release of 3 processes
/// took 0.13 / 0.42 ms (p50, with / without), the rollback 2.99 / 3.37
/// and 3.47 / 3.94 ms.
struct Ready {
    main: Tracee,
    regs: sandtree_sys::ptrace::Regs,
    threads: Vec<(Tracee, sandtree_sys::ptrace::Regs)>,
    parked: bool,
}

impl Ready {
    /// Every thread into its signal-context stop ([`Tracee::park`]) now,
    /// so that the release waits for none of them to run.
    fn park(&mut self) -> Result<()> {
        self.main.park()?;
        for (t, _) in self.threads.iter_mut() {
            t.park()?;
        }
        self.parked = true;
        Ok(())
    }

    /// Every thread goes, whatever fails (the first error is told).
    fn release(self) -> Result<()> {
        let parked = self.parked;
        let go = |t: Tracee, regs: &sandtree_sys::ptrace::Regs| {
            if parked { t.release_parked(regs) } else { t.release(regs) }
        };
        let mut released = go(self.main, &self.regs);
        for (t, regs) in self.threads {
            let r = go(t, &regs);
            if released.is_ok() {
                released = r;
            }
        }
        released
    }
}

fn write_path(pid: i32, scratch: u64, path: &str) -> Result<u64> {
    let mut bytes = path.as_bytes().to_vec();
    bytes.push(0);
    if bytes.len() as u64 > crate::batch::BATCH_OFFSET - PATH_OFFSET {
        return Err(Error::unsupported(pid, "", "path", format!("path too long to reopen: {path}")));
    }
    ptrace::write_mem(pid, scratch + PATH_OFFSET, &bytes).map_err(ptrace_err(pid, "write path"))?;
    Ok(scratch + PATH_OFFSET)
}

/// Bring back one process from its template (and give it a holder of its
/// memory, for the next rollback), still stopped: the caller lets it go
/// ([`Ready::release`]).
///
/// With a standby (a fork of the template made ahead, `memory_holder.rs`), the
/// process takes the *standby's* address space (`CLONE_VM` from it: no
/// page tables to copy), and the standby stays as its holder; the
/// template stays as it is. (Taking the template's instead, with the
/// standby as the template from then on, would put one more fork under
/// the template at each rollback to it: each fork adds a level to the
/// kernel's anon_vma chain of every mapping, which every later fork copies
/// whole — a template rolled back to a hundred times would fork ~35 ms
/// slower, `incremental::MAX_GENERATION`.) Without a standby, the process
/// is a copy-on-write fork of the template.
fn restore_one(
    t: &mut Template,
    wait: bool,
    cg: Option<&crate::cgroup::PoolCgroup>,
) -> Result<(Option<crate::memory_holder::Holder>, Ready)> {
    let mut standby = t.standby.take();
    // A standby killed behind our back (by the sandbox, or the OOM killer)
    // is collected and not used.
    if let Some(s) = &standby
        && !matches!(ptrace::try_wait(s.host), Ok(None))
    {
        crate::inject::kill_tracee(s.host);
        standby = None;
    }
    let via_standby = standby.is_some();
    let flags = if via_standby { libc::CLONE_PARENT | libc::CLONE_VM } else { libc::CLONE_PARENT } as u64;
    let image = &t.image;
    // The clone's source: the standby (its scratch page is the template's,
    // copied), else the template.
    let src = match standby.as_mut() {
        Some(s) => &mut s.tracee,
        None => &mut t.tracee,
    };
    let src_host = src.tid;
    let args = clone_args(t.scratch + SET_TID_OFFSET, flags);
    let written = write_clone_args(src_host, t.scratch, &args, image.pid);
    // (Until the clone succeeds the template is as it was, its standby too.)
    if let Err(e) = written {
        t.standby = standby;
        return Err(e);
    }
    // The killed original may still be tearing down (init reaps it in the
    // background): its pid is busy until then.
    let t_start = std::time::Instant::now();
    let mut busy = 0u32;
    // The copy and the fix-up run in the source and the new process:
    // ahead of whatever else wants the CPU (the killed processes' exits,
    // standby forks of other templates); each gets the process's nice
    // value back at its release.
    let nice = nice_of(src_host);
    if nice.is_some() {
        set_nice(src_host, RESTORE_NICE);
    }
    let out = clone3_when_free(src, t.scratch, &mut busy, wait);
    if let Some(n) = nice {
        set_nice(src_host, n);
    }
    let out = match out {
        Ok(o) => {
            // Signals sent to the source (SIGHUP when the old session
            // leader died, SIGCHLD) are not the process's: drop them.
            src.take_held();
            o
        }
        Err(e) => {
            t.standby = standby;
            return Err(e);
        }
    };
    let (Some(child), true) = (out.child, out.ret > 0) else {
        t.standby = standby;
        return Err(Error::Remote {
            pid: src_host,
            call: "clone3 (restore)",
            errno: std::io::Error::from_raw_os_error((-out.ret) as i32),
        });
    };
    // An interrupted syscall restarts as the kernel decides; the restart
    // block of `-ERESTART_RESTARTBLOCK` (nanosleep's deadline) is copied
    // by fork, from the original through the template.
    let regs = image.regs.to_sys();
    let t_clone = t_start.elapsed();
    let mut threads = Vec::new();
    let fixed = (|| -> Result<Tracee> {
        inject::wait_event_stop(child)?;
        // Out of the pool's cgroup, before it runs (its threads, made
        // below, start where it is).
        if let Some(cg) = cg {
            cg.to_live(child).map_err(|e| Error::Proc {
                pid: child,
                what: "move into the sandbox's cgroup",
                source: e,
            })?;
        }
        let mut p = Tracee::new(child, regs, t.tracee.insn).with_mask(image.signals.blocked);
        fix_up(&mut p, image, (t.scratch, t.scratch_exec), t.host, (via_standby, t.incremental), &mut threads)?;
        Ok(p)
    })();
    tracing::debug!(pid = image.pid, via_standby, busy, ?t_clone, t_fix = ?t_start.elapsed() - t_clone, "restore steps");
    // (Before its holder is made from it: a holder's teardown, after the
    // next rollback, must not run ahead of anything.)
    if let Some(n) = nice {
        set_nice(child, n);
        for (t, _) in &threads {
            set_nice(t.tid, n);
        }
    }
    // The standby's address space is the process's now: the standby is
    // its holder, whatever happens next.
    let shared = standby.map(|s| (s.tracee, s.ns_pid));
    match fixed {
        Ok(mut p) => {
            let holder = match shared {
                Some(old) => crate::memory_holder::adopt(old, child),
                None => crate::memory_holder::make(&mut p, true),
            };
            let holder = match holder {
                Ok(h) => Some(h),
                Err(e) => {
                    tracing::warn!(pid = image.pid, "no mm holder: {e}");
                    None
                }
            };
            // (Set at the release: until then it stays on the tracer's CPU,
            // its threads too.)
            p.affinity_on_release(&image.affinity);
            let mut threads = threads;
            for (t, _) in threads.iter_mut() {
                t.affinity_on_release(&image.affinity);
            }
            Ok((holder, Ready { main: p, regs, threads, parked: false }))
        }
        Err(e) => {
            // The threads' exits first: the main thread's is reported only
            // once they are collected.
            for (t, _) in &threads {
                crate::inject::kill_tracee(t.tid);
            }
            crate::inject::kill_tracee(child);
            // (The failed copy may have written into the memory it shared.)
            if let Some((old, _)) = shared {
                crate::inject::kill_tracee(old.tid);
            }
            Err(e)
        }
    }
}

/// Inject `clone3` with the `clone_args` at `args` into `src` until the
/// pid (or tid) it asks for is free: the killed original's is busy until
/// init reaps it (or the thread is gone). A retry is one injected syscall
/// (~10 µs): poll finely. `busy` counts the retries.
fn clone3_when_free(src: &mut Tracee, args: u64, busy: &mut u32, wait: bool) -> Result<crate::inject::Outcome> {
    let mut backoff = Backoff::new(20, 100, PID_WAIT);
    let mut out = src.syscall(libc::SYS_clone3, &[args, CLONE_ARGS_SIZE])?;
    for _ in 0..100_000 {
        match out.ret {
            ERESTARTNOINTR => {}
            EEXIST if wait && backoff.snooze() => *busy += 1,
            _ => break,
        }
        out = src.syscall(libc::SYS_clone3, &[args, CLONE_ARGS_SIZE])?;
    }
    Ok(out)
}

/// The process's other threads again, each with its tid (`clone3` with
/// `set_tid`, `CLONE_THREAD`, its TLS), injected into the main thread; in
/// each new thread (stopped at birth): its XSAVE area, robust list,
/// `clear_child_tid`, rseq, alternate stack and name. Their tracees go to
/// `out`, to be let go with their registers and masks after the main one.
fn make_threads(
    p: &mut Tracee,
    image: &ProcessImage,
    scratch: u64,
    out: &mut Vec<(Tracee, ptrace::Regs)>,
) -> Result<()> {
    const FLAGS: u64 = (libc::CLONE_VM
        | libc::CLONE_FS
        | libc::CLONE_FILES
        | libc::CLONE_SIGHAND
        | libc::CLONE_THREAD
        | libc::CLONE_SYSVSEM
        | libc::CLONE_SETTLS) as u64;
    let pid = p.tid;
    for th in &image.other_threads {
        let regs = th.regs.to_sys();
        let mut args = clone_args(scratch + SET_TID_OFFSET, FLAGS);
        // struct clone_args: tls is the 8th field.
        args[56..64].copy_from_slice(&regs.fs_base.to_ne_bytes());
        write_clone_args(pid, scratch, &args, th.tid)?;
        // A killed thread's tid is free once it is gone.
        let made = clone3_when_free(p, scratch, &mut 0, true)?;
        let (Some(tid), true) = (made.child, made.ret > 0) else {
            return Err(Error::Remote {
                pid,
                call: "clone3 (thread)",
                errno: std::io::Error::from_raw_os_error((-made.ret) as i32),
            });
        };
        inject::wait_event_stop(tid)?;
        out.push((Tracee::new(tid, regs, p.insn).with_mask(th.blocked), regs));
        let t = &mut out.last_mut().expect("just pushed").0;
        ptrace::set_xstate(tid, &th.xstate).map_err(ptrace_err(tid, "SETREGSET (xstate)"))?;
        if th.robust_list.0 != 0 {
            t.call("set_robust_list", libc::SYS_set_robust_list, &[th.robust_list.0, th.robust_list.1])?;
        }
        t.call("set_tid_address", libc::SYS_set_tid_address, &[th.clear_child_tid])?;
        if let Some((area, len, _, sig)) = th.rseq {
            t.call("rseq", libc::SYS_rseq, &[area, len as u64, 0, sig as u64])?;
        }
        if let Some(ss) = &th.altstack {
            ptrace::write_mem(tid, scratch + 1024, ss).map_err(ptrace_err(tid, "write stack_t"))?;
            t.call("sigaltstack", libc::SYS_sigaltstack, &[scratch + 1024, 0])?;
        }
        // Its name: only a thread of the group may write its comm.
        let mut name = th.comm.as_bytes().to_vec();
        name.truncate(15);
        name.push(0);
        ptrace::write_mem(tid, scratch + 1024, &name).map_err(ptrace_err(tid, "write name"))?;
        const PR_SET_NAME: u64 = 15;
        t.call("prctl(PR_SET_NAME)", libc::SYS_prctl, &[PR_SET_NAME, scratch + 1024])?;
        crate::inject::set_affinity(tid, &th.affinity);
    }
    Ok(())
}

/// A unix listener is bound to a socket inode of the replaced tree: the
/// rolled-back tree has only a dead copy of that file, and `connect` to it
/// would be refused. Bind a new listener at the same path (same type and
/// flags, the file's mode kept) and put it on the old descriptor number.
/// Connections queued on the old one are dropped (their clients were
/// killed by the rollback, or came after the checkpoint).
fn rebind_listener(p: &mut Tracee, scratch: u64, fd: i32, flags: u32, stream: bool, path: &str) -> Result<()> {
    let pid = p.tid;
    let addr = write_path(pid, scratch, path)?;
    let mode = p.syscall(libc::SYS_stat, &[addr, scratch + 2048])?;
    let mut stat = [0u8; 144];
    let keep_mode = if mode.ret == 0 {
        ptrace::read_mem(pid, scratch + 2048, &mut stat).map_err(ptrace_err(pid, "read stat"))?;
        Some(u32::from_ne_bytes(stat[24..28].try_into().unwrap_or_default()) & 0o7777)
    } else {
        None
    };
    let _ = p.syscall(libc::SYS_unlink, &[addr])?;
    let ty = socket_type(if stream { libc::SOCK_STREAM } else { libc::SOCK_SEQPACKET }, flags);
    let new = p.call("socket (unix listener)", libc::SYS_socket, &[libc::AF_UNIX as u64, ty, 0])?;
    let mut sun = (libc::AF_UNIX as u16).to_ne_bytes().to_vec();
    sun.extend_from_slice(path.as_bytes());
    sun.push(0);
    ptrace::write_mem(pid, scratch + 1024, &sun).map_err(ptrace_err(pid, "write sockaddr"))?;
    p.call("bind (unix listener)", libc::SYS_bind, &[new, scratch + 1024, sun.len() as u64])?;
    p.call("listen", libc::SYS_listen, &[new, libc::SOMAXCONN as u64])?;
    move_fd(p, new, fd, flags)?;
    if let Some(m) = keep_mode {
        p.call("chmod (unix socket)", libc::SYS_chmod, &[addr, m as u64])?;
    }
    Ok(())
}

/// Make the epoll instance behind `epfd` (shared with the template, so
/// changed by the original after the checkpoint) watch exactly `watches`
/// again, by `epoll_ctl` in the restored process. A watched signalfd is
/// always added again: epoll waits for it on the signal queue of the task
/// that added it, the dead original's.
/// The restored instance has the checkpoint's watch descriptors (what
/// `fdstate::fill_inotify` relies on, checked rather than assumed).
fn check_inotify(pid: i32, comm: &str, fd: i32, watches: &[crate::model::InotifyWatch]) -> Result<()> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/fdinfo/{fd}")).map_err(|e| Error::Proc {
        pid,
        what: "inotify fdinfo",
        source: e,
    })?;
    let mut got: Vec<i32> = text
        .lines()
        .filter_map(|l| l.strip_prefix("inotify wd:")?.split_whitespace().next())
        .filter_map(|wd| i32::from_str_radix(wd, 16).ok())
        .collect();
    got.sort_unstable();
    let want: Vec<i32> = watches.iter().map(|w| w.wd).collect();
    if got != want {
        return Err(Error::unsupported(
            pid,
            comm,
            "inotify",
            format!("the restored inotify instance has watches {got:?} instead of {want:?}"),
        ));
    }
    Ok(())
}

fn restore_epoll(
    p: &mut Tracee,
    scratch: u64,
    template: i32,
    epfd: i32,
    watches: &[(i32, u32, u64)],
    signalfds: &[i32],
    recreated: &[i32],
) -> Result<()> {
    let pid = p.tid;
    let now = crate::procfs::epoll_watches_of(template, epfd).map_err(|e| Error::Proc {
        pid: template,
        what: "epoll fdinfo",
        source: e,
    })?;
    let event = |p: &mut Tracee, events: u32, data: u64| -> Result<u64> {
        let mut ev = events.to_ne_bytes().to_vec();
        ev.extend_from_slice(&data.to_ne_bytes());
        ptrace::write_mem(p.tid, scratch + 1024, &ev).map_err(ptrace_err(pid, "write epoll_event"))?;
        Ok(scratch + 1024)
    };
    for &(tfd, events, data) in &now {
        if !watches.iter().any(|w| w.0 == tfd) || signalfds.contains(&tfd) {
            let ev = event(p, events, data)?;
            // Not ours to fail on: the watched file may be gone already.
            let _ = p.syscall(libc::SYS_epoll_ctl, &[epfd as u64, libc::EPOLL_CTL_DEL as u64, tfd as u64, ev])?;
        }
    }
    for &(tfd, events, data) in watches {
        let op = match now.iter().find(|w| w.0 == tfd) {
            _ if signalfds.contains(&tfd) => libc::EPOLL_CTL_ADD,
            // A new file on that number: an entry seen there is the old
            // file's (its last holder, the killed original, may not be
            // gone yet), keyed by that file, so the new one is added.
            _ if recreated.contains(&tfd) => libc::EPOLL_CTL_ADD,
            Some(&(_, e, d)) if e == events && d == data => continue,
            Some(_) => libc::EPOLL_CTL_MOD,
            None => libc::EPOLL_CTL_ADD,
        };
        let ev = event(p, events, data)?;
        p.call("epoll_ctl", libc::SYS_epoll_ctl, &[epfd as u64, op as u64, tfd as u64, ev])?;
    }
    Ok(())
}

/// A deleted-but-open file: an unnamed file (`O_TMPFILE`) in its old
/// directory (or `/tmp`) of the rolled-back tree, filled with the
/// checkpoint's copy, opened again with the old flags at the old offset.
fn recreate_ghost(p: &mut Tracee, scratch: u64, f: &crate::model::FdImage, path: &str, bytes: &[u8]) -> Result<()> {
    let pid = p.tid;
    let dir = std::path::Path::new(path).parent().map(|d| d.to_string_lossy().into_owned()).unwrap_or_default();
    let mut tmp = None;
    for d in [dir.as_str(), "/tmp", "/"] {
        if d.is_empty() {
            continue;
        }
        let addr = write_path(pid, scratch, d)?;
        let out = p.syscall(libc::SYS_open, &[addr, (libc::O_TMPFILE | libc::O_RDWR) as u64, 0o600])?;
        if out.ret >= 0 {
            tmp = Some(out.ret as u64);
            break;
        }
    }
    let tmp = tmp.ok_or_else(|| {
        Error::unsupported(pid, "", format!("fd {}", f.fd), format!("cannot make an unnamed file for deleted {path}"))
    })?;
    crate::fdstate::fill_file(pid, tmp as i32, bytes).map_err(|e| Error::Proc {
        pid,
        what: "deleted file contents",
        source: e,
    })?;
    // `tmp` may have the number the file had (closed by the template's
    // set-up): closed before the new descriptor moves there.
    reopen_unnamed(p, scratch, f, tmp, true)
}

/// A memfd named `name` holding `bytes` (`size` long, mode bits `mode`)
/// with `seals`, on a new descriptor of the process (closed by the caller).
fn make_memfd(
    p: &mut Tracee,
    scratch: u64,
    name: &str,
    bytes: &[u8],
    (size, mode): (u64, u32),
    seals: u32,
) -> Result<u64> {
    let pid = p.tid;
    let addr = write_path(pid, scratch, name)?;
    let tmp = p.call("memfd_create", libc::SYS_memfd_create, &[addr, libc::MFD_ALLOW_SEALING as u64])?;
    crate::fdstate::fill_file(pid, tmp as i32, bytes).map_err(|e| Error::Proc {
        pid,
        what: "memfd contents",
        source: e,
    })?;
    if size != bytes.len() as u64 {
        p.call("ftruncate (memfd)", libc::SYS_ftruncate, &[tmp, size])?;
    }
    if mode != 0o777 {
        p.call("fchmod (memfd)", libc::SYS_fchmod, &[tmp, mode as u64])?;
    }
    if seals != 0 {
        p.call("fcntl(F_ADD_SEALS)", libc::SYS_fcntl, &[tmp, libc::F_ADD_SEALS as u64, seals as u64])?;
    }
    Ok(tmp)
}

/// Open the unnamed file on descriptor `tmp` again with `f`'s flags (its
/// access mode included) at `f`'s offset, on `f`'s number (closing `tmp`
/// first if `close_tmp`).
fn reopen_unnamed(p: &mut Tracee, scratch: u64, f: &crate::model::FdImage, tmp: u64, close_tmp: bool) -> Result<()> {
    // An O_TMPFILE keeps O_TMPFILE (which includes O_DIRECTORY) in its
    // flags; O_NOFOLLOW would refuse the /proc/self/fd magic link.
    let strip =
        (libc::O_CREAT | libc::O_EXCL | libc::O_TRUNC | libc::O_NOCTTY | libc::O_TMPFILE | libc::O_NOFOLLOW) as u32;
    let again = write_path(p.tid, scratch, &format!("/proc/self/fd/{tmp}"))?;
    let fd = p.call("open (unnamed file)", libc::SYS_open, &[again, (f.flags & !strip) as u64, 0])?;
    if close_tmp {
        p.call("close", libc::SYS_close, &[tmp])?;
    }
    if f.pos > 0 {
        p.call("lseek", libc::SYS_lseek, &[fd, f.pos, libc::SEEK_SET as u64])?;
    }
    move_fd(p, fd, f.fd, f.flags)
}

/// Put descriptor `new` (opened with the flags `flags`, close-on-exec
/// included) on number `fd`.
fn move_fd(p: &mut Tracee, new: u64, fd: i32, flags: u32) -> Result<()> {
    if new == fd as u64 {
        return Ok(());
    }
    let cloexec = (flags & libc::O_CLOEXEC as u32) as u64;
    p.call("dup3", libc::SYS_dup3, &[new, fd as u64, cloexec])?;
    p.call("close", libc::SYS_close, &[new])?;
    Ok(())
}

/// `socket()` type bits for a socket that had the open flags `flags`.
fn socket_type(kind: i32, flags: u32) -> u64 {
    let mut ty = kind as u64;
    if flags & libc::O_NONBLOCK as u32 != 0 {
        ty |= libc::SOCK_NONBLOCK as u64;
    }
    if flags & libc::O_CLOEXEC as u32 != 0 {
        ty |= libc::SOCK_CLOEXEC as u64;
    }
    ty
}

/// A bound inet socket (a listener, or a bound datagram socket) made anew
/// with its address and options, on its old descriptor number (added to
/// `b`).
fn rebind_inet(b: &mut Batch, fd: i32, flags: u32, stream: bool, listening: bool, bind: &crate::model::InetBinding) {
    let family = u16::from_ne_bytes([bind.sockaddr[0], bind.sockaddr[1]]) as u64;
    let ty = socket_type(if stream { libc::SOCK_STREAM } else { libc::SOCK_DGRAM }, flags);
    let new = b.call("socket (inet)", libc::SYS_socket, &[Arg::Val(family), Arg::Val(ty), Arg::Val(0)]);
    let mut opts = Vec::new();
    if bind.reuse_addr {
        opts.push((libc::SOL_SOCKET, libc::SO_REUSEADDR));
    }
    if bind.reuse_port {
        opts.push((libc::SOL_SOCKET, libc::SO_REUSEPORT));
    }
    if bind.v6only && family == libc::AF_INET6 as u64 {
        opts.push((libc::IPPROTO_IPV6, libc::IPV6_V6ONLY));
    }
    let one = b.data(&1i32.to_ne_bytes());
    for (level, name) in opts {
        let args = [new, Arg::Val(level as u64), Arg::Val(name as u64), one, Arg::Val(4)];
        b.call("setsockopt", libc::SYS_setsockopt, &args);
    }
    let addr = b.data(&bind.sockaddr);
    // A process killed by this rollback may still hold the port: it closes
    // its descriptors only after its memory is torn down (milliseconds for
    // a large one): the bind is retried for a while. (A port still in use
    // past that is someone else's, e.g. a listener shared with a process
    // restored just before, which is not supported: the rollback then
    // restarts.)
    b.call_retrying_in_use("bind (inet)", libc::SYS_bind, &[new, addr, Arg::Val(bind.sockaddr.len() as u64)]);
    if listening {
        b.call("listen", libc::SYS_listen, &[new, Arg::Val(libc::SOMAXCONN as u64)]);
    }
    b.move_fd(new, fd, flags);
}

fn fix_up(
    p: &mut Tracee,
    image: &ProcessImage,
    (scratch, exec): (u64, bool),
    template: i32,
    (via_standby, incremental): (bool, bool),
    threads: &mut Vec<(Tracee, ptrace::Regs)>,
) -> Result<()> {
    // Batched (one round trip, `batch.rs`): cwd, files reopened by path,
    // inet sockets. Then one at a time what needs the daemon between calls
    // (deleted files and memfds filled through /proc, unix listeners, epoll
    // watch lists); then the rest batched again.
    let mut b = Batch::new(scratch, exec);
    let cwd = b.path(&image.cwd);
    b.call("chdir", libc::SYS_chdir, &[cwd]);
    let strip = (libc::O_CREAT | libc::O_EXCL | libc::O_TRUNC | libc::O_NOCTTY) as u32;
    for f in image.fds.iter().filter(|f| f.same_as.is_none()) {
        match &f.kind {
            FdKind::LayerFile { path, .. } => {
                let path = b.path(path);
                let fd = b.call("open", libc::SYS_open, &[path, Arg::Val((f.flags & !strip) as u64), Arg::Val(0)]);
                if f.pos > 0 && f.flags & libc::O_DIRECTORY as u32 == 0 {
                    b.call("lseek", libc::SYS_lseek, &[fd, Arg::Val(f.pos), Arg::Val(libc::SEEK_SET as u64)]);
                }
                b.move_fd(fd, f.fd, f.flags);
            }
            FdKind::Fifo { path, on_layer: true, .. } => {
                // Non-blocking, so that the open does not wait for a peer
                // (the restore holds the other end open); the mode as it
                // was after.
                let path = b.path(path);
                let flags = (f.flags & !strip) | libc::O_NONBLOCK as u32;
                let fd = b.call("open (named pipe)", libc::SYS_open, &[path, Arg::Val(flags as u64), Arg::Val(0)]);
                if f.flags & libc::O_NONBLOCK as u32 == 0 {
                    let args = [fd, Arg::Val(libc::F_SETFL as u64), Arg::Val((f.flags & !strip) as u64)];
                    b.call("fcntl(F_SETFL)", libc::SYS_fcntl, &args);
                }
                b.move_fd(fd, f.fd, f.flags);
            }
            FdKind::Socket { inet: Some(bind), stream, listening, .. } => {
                rebind_inet(&mut b, f.fd, f.flags, *stream, *listening, bind);
            }
            _ => continue,
        }
        if b.is_full() {
            p.run_batch(&mut b)?;
        }
    }
    p.run_batch(&mut b)?;
    let ghost = |fd: i32| image.ghosts.iter().find(|(g, _)| *g == fd).map(|(_, b)| b.as_slice()).unwrap_or(&[]);
    for f in image.fds.iter().filter(|f| f.same_as.is_none()) {
        if let FdKind::Deleted { path, .. } = &f.kind {
            recreate_ghost(p, scratch, f, path, ghost(f.fd))?;
        }
    }
    // Memfds: one new memfd per inode (same name, the checkpoint's contents
    // and seals), opened again for each of its descriptors.
    let mut memfds: Vec<(u64, u64)> = Vec::new();
    for f in image.fds.iter().filter(|f| f.same_as.is_none()) {
        let FdKind::Memfd { name, ino, size, seals, mode, .. } = &f.kind else { continue };
        let made = memfds.iter().find(|(i, _)| i == ino).map(|(_, fd)| *fd);
        let tmp = match made {
            Some(tmp) => tmp,
            None => {
                let tmp = make_memfd(p, scratch, name, ghost(f.fd), (*size, *mode), *seals)?;
                memfds.push((*ino, tmp));
                tmp
            }
        };
        reopen_unnamed(p, scratch, f, tmp, false)?;
    }
    for (_, tmp) in memfds {
        p.call("close", libc::SYS_close, &[tmp])?;
    }
    for f in &image.fds {
        if let FdKind::Socket { listening: true, bound: Some(path), stream, inet: None, .. } = &f.kind
            && !path.starts_with("/proc/")
        {
            rebind_listener(p, scratch, f.fd, f.flags, *stream, path)?;
        }
    }
    // Inotify instances after the other descriptors (whose re-making would
    // show as events): a new instance in the process at its number, then
    // its watches added by the daemon through a duplicate (`fdstate.rs`).
    for f in image.fds.iter().filter(|f| f.same_as.is_none()) {
        if let FdKind::AnonInode { state: Some(AnonState::Inotify { watches, .. }), .. } = &f.kind {
            let cloexec = if f.flags & libc::O_CLOEXEC as u32 != 0 { libc::IN_CLOEXEC } else { 0 };
            let args = [Arg::Val((libc::IN_NONBLOCK | cloexec) as u64)];
            let ifd = b.call("inotify_init1", libc::SYS_inotify_init1, &args);
            b.move_fd(ifd, f.fd, f.flags);
            p.run_batch(&mut b)?;
            crate::fdstate::fill_inotify(p.tid, f.fd, watches, f.flags).map_err(|e| Error::Proc {
                pid: p.tid,
                what: "inotify watches",
                source: e,
            })?;
            check_inotify(p.tid, &image.comm, f.fd, watches)?;
        }
    }
    // Dups of descriptors made anew: the same open file again (one offset).
    for f in &image.fds {
        if let Some(src) = f.same_as {
            let cloexec = (f.flags & libc::O_CLOEXEC as u32) as u64;
            b.call("dup3 (dup)", libc::SYS_dup3, &[Arg::Val(src as u64), Arg::Val(f.fd as u64), Arg::Val(cloexec)]);
        }
    }
    // Watch lists after the descriptors they name exist again.
    let recreated: Vec<i32> = image.fds.iter().filter(|f| f.kind.recreated()).map(|f| f.fd).collect();
    let signalfds: Vec<i32> = image
        .fds
        .iter()
        .filter(|f| matches!(f.kind, FdKind::AnonInode { state: Some(AnonState::Signalfd { .. }), .. }))
        .map(|f| f.fd)
        .collect();
    for f in &image.fds {
        if let FdKind::AnonInode { state: Some(AnonState::Signalfd { mask }), .. } = &f.kind {
            let mask = b.data(&mask.to_ne_bytes());
            b.call("signalfd4 (mask)", libc::SYS_signalfd4, &[Arg::Val(f.fd as u64), mask, Arg::Val(8), Arg::Val(0)]);
            if b.is_full() {
                p.run_batch(&mut b)?;
            }
        }
    }
    p.run_batch(&mut b)?;
    for f in &image.fds {
        if let FdKind::AnonInode { state: Some(AnonState::Epoll { watches }), .. } = &f.kind {
            restore_epoll(p, scratch, template, f.fd, watches, &signalfds, &recreated)?;
        }
    }
    if image.ppid != 1 {
        // Best effort for a child of another process: a child of init now,
        // in a session of its own (the template left the parent's).
        b.call("setsid", libc::SYS_setsid, &[]);
    } else if image.sid == image.pid {
        // The session of the template is the dead original's: start a new
        // one under the same number, and take the terminal back.
        b.call("setsid", libc::SYS_setsid, &[]);
        if image.has_tty
            && let Some(tty) = image.fds.iter().find(|f| match &f.kind {
                FdKind::KeptFile { path } => path.starts_with("/dev/pts/") || path == "/dev/console",
                _ => false,
            })
        {
            let args = [Arg::Val(tty.fd as u64), Arg::Val(libc::TIOCSCTTY), Arg::Val(0)];
            b.call("ioctl(TIOCSCTTY)", libc::SYS_ioctl, &args);
        }
    } else if image.pgid == image.pid {
        b.call("setpgid", libc::SYS_setpgid, &[Arg::Val(0), Arg::Val(0)]);
    }
    // What a CLONE_VM child does not keep: the alternate signal stack and
    // the rseq registration (a plain fork keeps both; but a template made
    // from a standby has the previous checkpoint's stack, `incremental.rs`;
    // its rseq registration was checked equal).
    if via_standby || incremental {
        match &image.altstack {
            Some(ss) => {
                let ss = b.data(ss);
                b.call("sigaltstack", libc::SYS_sigaltstack, &[ss, Arg::Val(0)]);
            }
            None if incremental => {
                // stack_t { ss_sp, ss_flags = SS_DISABLE, ss_size }.
                let mut off = [0u8; 24];
                off[8..12].copy_from_slice(&libc::SS_DISABLE.to_ne_bytes());
                let ss = b.data(&off);
                b.call("sigaltstack", libc::SYS_sigaltstack, &[ss, Arg::Val(0)]);
            }
            None => {}
        }
    }
    if via_standby && let Some((area, len, _, sig)) = image.rseq {
        let args = [Arg::Val(area), Arg::Val(len as u64), Arg::Val(0), Arg::Val(sig as u64)];
        b.call("rseq", libc::SYS_rseq, &args);
    }
    // Neither keeps the robust futex list.
    if let Some((head, len)) = image.robust_list
        && head != 0
    {
        b.call("set_robust_list", libc::SYS_set_robust_list, &[Arg::Val(head), Arg::Val(len)]);
    }
    // Interval timers (a fork does not inherit them either).
    for (which, val) in &image.itimers {
        let val = b.data(val);
        b.call("setitimer", libc::SYS_setitimer, &[Arg::Val(*which as u64), val, Arg::Val(0)]);
    }
    // Nor the child-subreaper flag.
    if image.child_subreaper {
        let set = libc::PR_SET_CHILD_SUBREAPER as u64;
        b.call("prctl(PR_SET_CHILD_SUBREAPER)", libc::SYS_prctl, &[Arg::Val(set), Arg::Val(1)]);
    }
    p.run_batch(&mut b)?;
    // Signals pending at the checkpoint (a fork does not inherit them),
    // queued again with their siginfo, to the thread or the process as
    // they were (a process may queue any siginfo to itself). One at a time,
    // after the batches: a batch ends with a SIGSTOP, which would discard
    // a pending SIGCONT.
    make_threads(p, image, scratch, threads)?;
    for q in &image.queued_signals {
        let sig = u32::from_ne_bytes(q.siginfo[..4].try_into().unwrap_or_default()) as u64;
        ptrace::write_mem(p.tid, scratch + 1024, &q.siginfo).map_err(ptrace_err(p.tid, "write siginfo"))?;
        let me = image.pid as u64;
        if q.shared {
            p.call("rt_sigqueueinfo", libc::SYS_rt_sigqueueinfo, &[me, sig, scratch + 1024])?;
        } else {
            p.call("rt_tgsigqueueinfo", libc::SYS_rt_tgsigqueueinfo, &[me, me, sig, scratch + 1024])?;
        }
    }
    // Not in a batch: the batch's code is in the scratch mapping.
    p.call("munmap (scratch)", libc::SYS_munmap, &[scratch, SCRATCH])?;
    Ok(())
}
