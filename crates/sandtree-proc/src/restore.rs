//! Rollback in place of a sandbox's processes from their templates. See the
//! crate docs for the order; init has already killed every other process
//! and swapped the root when this runs.

use std::collections::HashSet;

use sandtree_sys::ptrace;
use serde::{Deserialize, Serialize};

use crate::batch::{Arg, Batch, SCRATCH};
use crate::cloned::Cloned;
use crate::inject::{self, RESTORE_NICE, SET_TID_OFFSET, Tracee, clone_args, nice_of, set_nice, write_clone_args};
use crate::memory_holder::Holder;
use crate::model::ProcessImage;
use crate::pool::Pool;
use crate::process::zombies::Phase;
use crate::reap::Dying;
use crate::template::Template;
use crate::track::Trackings;
use crate::{Error, HostPid, Result, SandboxPid};

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
    /// How a process that may not choose its pid gets it back.
    pub last_pid: Option<crate::LastPid>,
}

/// What [`crate::Tracer::restore`] brought back.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct RestoreReport {
    /// In-sandbox pids running again.
    pub restored: Vec<SandboxPid>,
    /// Checkpoints whose templates were dropped because one of them held
    /// a pid this restore needed.
    pub evicted: Vec<String>,
    /// Connections to the outside the processes find reset (`pid N fd F:
    /// local → remote`): their peers outside are not part of a restore.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub connections_reset: Vec<String>,
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
    let mut needed: HashSet<SandboxPid> = set
        .templates
        .iter()
        .flat_map(|t| std::iter::once(t.image.pid).chain(t.image.other_threads.iter().map(|th| th.tid)))
        .collect();
    // (And the pids of the gone leaders that surrogates take: `surrogate`.)
    let gone_leaders: Vec<SandboxPid> = set
        .templates
        .iter()
        .map(|t| &t.image)
        .flat_map(|i| {
            let session = crate::process::session::made_by_session(i).then_some(i.sid);
            let group = (i.pgid != i.pid && i.sid != i.pid).then_some(i.pgid);
            [session, group].into_iter().flatten()
        })
        .filter(|pid| !needed.contains(pid))
        .collect();
    needed.extend(gone_leaders);
    // Standby forks under way (`standby.rs`) end first where the restore
    // needs the template, or the pid their child gets, or where that pid
    // is not ours to give (a template that may not choose it: a plain
    // `clone`, which could take any pid the restore frees, and the one
    // `ns_last_pid` points the restore's next clone at); the others go on.
    for (k, set) in st.pool.iter_mut() {
        for t in set.templates.iter_mut() {
            let Some(f) = t.forking.as_ref() else { continue };
            if k == ck || f.ns_pid().is_none_or(|p| needed.contains(&p)) {
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
    // Objects the templates share with the killed originals: their
    // checkpoint state goes back before anything runs. FIFOs on the layers
    // are reopened by path in the rolled-back tree (in `fix_up`): their
    // keepers close once every process is back.
    let mut handed = crate::kinds::Handed::of(set);
    handed.last_pid = st.last_pid;
    let keepers = crate::kinds::put_back_shared(set, &mut handed)?;
    tracing::debug!(?t_untrack, ?t_settle, ?t_evict, t_objects = ?t0.elapsed() - t_settle - t_evict, "restore prelude");
    let mut holders = Vec::new();
    // Small processes first: the big ones take longest to tear down (unix
    // connections through listeners aside: `kinds::restore_order`). One
    // whose pid is not free yet (its killed original still exiting: a
    // session leader's terminal hangup takes a while) waits until the
    // others are back, or at once if others wait for it.
    let images: Vec<&crate::model::ProcessImage> = set.templates.iter().map(|t| &t.image).collect();
    let sorted = crate::kinds::restore_order(&images).map_err(|i| Error::Proc {
        pid: set.templates[i].host,
        what: "the order of a restore",
        source: std::io::Error::other("unix connections made through listeners wait for each other"),
    })?;
    let mut others_wait = vec![false; set.templates.len()];
    for &(i, w) in &sorted {
        others_wait[i] = w;
    }
    let mut order: Vec<(usize, bool)> = sorted.into_iter().map(|(i, _)| (i, false)).collect();
    // The signal each process stopped by one at the checkpoint stops with
    // again (`process::session::stop_signal`).
    let stop_with: Vec<Option<i32>> = set
        .templates
        .iter()
        .map(|t| {
            let reported = set
                .templates
                .iter()
                .find(|p| p.image.pid == t.image.ppid)
                .and_then(|p| p.image.stop_reports.iter().find(|(c, _)| *c == t.image.pid))
                .map(|&(_, sig)| sig);
            t.image.job_stopped.then(|| crate::process::session::stop_signal(&t.image, reported))
        })
        .collect();
    let mut next = 0;
    // Each process goes once all are back (see [`Ready`]).
    let mut waiting: Vec<Ready> = Vec::new();
    // The surrogates of gone group and session leaders (see [`surrogate`]), by
    // group; killed once every process is back.
    let mut surrogates: Vec<(SandboxPid, HostPid)> = Vec::new();
    let pids: HashSet<SandboxPid> = set.templates.iter().map(|t| t.image.pid).collect();
    while next < order.len() {
        let (i, wait) = order[next];
        next += 1;
        // A child of init in another's group joins it: once its leader is
        // back, or, that leader gone, once a surrogate made it again. One in
        // a session of the sandbox is made by that session's maker: its
        // restored leader, at the leader's turn, or a surrogate of the gone
        // leader (`process::session::made_by_session`).
        let image = &set.templates[i].image;
        let by_session = crate::process::session::made_by_session(image);
        let (pid, pgid, sid) = (image.pid, image.pgid, image.sid);
        let in_group = image.ppid == SandboxPid::INIT && pgid != pid && sid != pid;
        if in_group && pids.contains(&pgid) && !report.restored.contains(&pgid) {
            order.push((i, wait));
            continue;
        }
        let mut made = Ok(());
        if by_session && !handed.cloned_early.contains_key(&pid) {
            if pids.contains(&sid) {
                if !report.restored.contains(&sid) {
                    order.push((i, wait));
                    continue;
                }
                made = Err(Error::Proc {
                    pid: set.templates[i].host,
                    what: "its session's leader",
                    source: std::io::Error::other(format!("not made again by the leader of its session {sid}")),
                });
            } else {
                made = session_by_surrogate(set, sid, &mut handed, &mut surrogates);
            }
        } else if in_group && !by_session && !pids.contains(&pgid) && !surrogates.iter().any(|(g, _)| *g == pgid) {
            let t = &mut set.templates[i];
            let may_choose = crate::check::may_choose_pid(&t.image);
            made = surrogate(
                (&mut t.tracee, true),
                t.scratch,
                may_choose,
                (pgid, Surrogate::Group),
                handed.last_pid.as_mut(),
            )
            .map(|s| surrogates.push((pgid, s.tid)));
        }
        if let Err(e) = made {
            give_up(&mut handed, surrogates, (holders, st.holders), waiting);
            return Err(e);
        }
        // A child of a captured process is made by its parent once the
        // parent is back: one whose parent waits for its pid (put after
        // the others, above) waits after it.
        let ppid = set.templates[i].image.ppid;
        if ppid != SandboxPid::INIT
            && !handed.cloned_early.contains_key(&set.templates[i].image.pid)
            && set.templates.iter().any(|p| p.image.pid == ppid)
            && !report.restored.contains(&ppid)
        {
            order.push((i, wait));
            continue;
        }
        // (The processes whose connections through listeners it makes
        // again, cloned first: `kinds/unix.rs`.)
        let early = clone_connectors(set, i, &mut handed, &mut surrogates);
        let t = &mut set.templates[i];
        let t0 = std::time::Instant::now();
        let res = early.and_then(|()| restore_one(t, wait, cg, &mut handed, stop_with[i]));
        if !wait
            && let Err(Error::Remote { call: "clone3 (restore)", errno, .. }) = &res
            && errno.raw_os_error() == Some(libc::EEXIST)
        {
            if others_wait[i] {
                order.insert(next, (i, true));
            } else {
                order.push((i, true));
            }
            continue;
        }
        tracing::debug!(pid = t.image.pid.raw(), comm = t.image.comm, took = ?t0.elapsed(), "process restored");
        let parent = (t.image.pid, t.scratch, crate::check::may_choose_pid(&t.image));
        let leads = t.image.sid == t.image.pid && t.image.ppid == SandboxPid::INIT;
        // (Its zombies, with its group and the signals it had pending.)
        let zombies = match t.image.zombies.is_empty() {
            true => None,
            false => Some((t.image.zombies.clone(), t.image.pgid, t.image.queued_signals.clone())),
        };
        let failed = match res {
            Ok((holder, mut ready)) => {
                report.restored.push(t.image.pid);
                holders.extend(holder);
                // Its zombies, its children, which it makes again, and the
                // other children of init of the session it leads; then its
                // scratch mapping goes.
                let mut sent = Vec::new();
                let parked = make_zombies(&zombies, parent, &mut ready.main, &mut handed, Phase::First)
                    .map(|s| sent.extend(s))
                    .and_then(|()| make_children(set, parent, &mut ready.main, &mut handed, &mut surrogates))
                    .and_then(|()| make_zombies(&zombies, parent, &mut ready.main, &mut handed, Phase::Last))
                    .and_then(|s| {
                        sent.extend(s);
                        let Some((_, _, queued)) = &zombies else { return Ok(()) };
                        crate::process::zombies::take_back_signals(&mut ready.main, (parent.0, queued), parent.1, &sent)
                    })
                    .and_then(|()| match leads {
                        true => {
                            let (pid, scratch, may_choose_pid) = parent;
                            let maker = crate::transplant::Parent {
                                tracee: &mut ready.main,
                                scratch,
                                may_choose_pid,
                                its_parent: true,
                            };
                            make_session(set, pid, maker, &mut handed, &mut surrogates)
                        }
                        false => Ok(()),
                    })
                    .and_then(|()| ready.main.call("munmap (scratch)", libc::SYS_munmap, &[parent.1, SCRATCH]))
                    .and_then(|_| ready.park());
                waiting.push(ready);
                parked.err()
            }
            Err(e) => Some(e),
        };
        if let Some(e) = failed {
            give_up(&mut handed, surrogates, (holders, st.holders), waiting);
            return Err(e);
        }
    }
    st.holders.extend(holders);
    // Every member is in its group: the surrogates go (the groups live on
    // with their members, leaderless as they were).
    for (_, host) in surrogates {
        crate::inject::kill_tracee(host);
    }
    // Every process is back: the TCP connections made anew leave repair
    // mode (their peers are back too).
    // (And the UDP and unix datagram sockets get their datagrams again,
    // and the unix sockets with files in flight their queues.)
    let sent = crate::kinds::finish_connections(&handed)
        .and_then(|()| crate::kinds::send_datagrams_again(set))
        .and_then(|()| match waiting.first() {
            Some(r) => crate::kinds::send_unix_datagrams_again(set, &handed, r.main.tid)
                .and_then(|()| crate::kinds::send_in_flight(set, &handed, r.main.tid)),
            None => Ok(()),
        });
    if let Err(e) = sent {
        for r in waiting {
            let _ = r.release();
        }
        return Err(e);
    }
    // Every process is back with its pipe ends: the pipes' readers and
    // writers are theirs alone from now on.
    drop(keepers.pipes);
    report.connections_reset = crate::kinds::reset_outside(std::mem::take(&mut handed.resetting));
    drop(handed);
    let t_rel = std::time::Instant::now();
    // (Back on its CPU once the rollback has its answer.)
    crate::inject::step_aside();
    // Processes stopped by a signal at the checkpoint go first and stop
    // again; then their parents take the reports of those stops that they
    // had taken at the checkpoint (their stop would otherwise show them a
    // new one).
    let (jobs, mut rest): (Vec<Ready>, Vec<Ready>) = waiting.into_iter().partition(|r| r.job_stopped);
    let jobs_back: Vec<(SandboxPid, SandboxPid, HostPid)> = jobs.iter().map(|r| (r.pid, r.ppid, r.main.tid)).collect();
    let mut released = Ok(());
    for r in jobs {
        let res = r.release();
        if released.is_ok() {
            released = res;
        }
    }
    for &(pid, ppid, host) in &jobs_back {
        let res = stopped_again(host).and_then(|()| match rest.iter_mut().find(|r| r.pid == ppid) {
            Some(parent) => {
                let taken = !parent.reports.contains(&pid);
                parent.take_report(pid, taken)
            }
            None => Ok(()),
        });
        if released.is_ok() {
            released = res;
        }
    }
    for r in rest {
        let res = r.release();
        if released.is_ok() {
            released = res;
        }
    }
    drop(keepers.fifos);
    tracing::debug!(release = ?t_rel.elapsed(), "restore released");
    released?;
    Ok(report)
}

/// A restore that failed half-way: the processes made ahead of their turn
/// and the surrogates are killed, the new holders kept with the others
/// (`kept`), the processes back let go (the sandbox is restarted: they go
/// as they were).
fn give_up(
    handed: &mut crate::kinds::Handed,
    surrogates: Vec<(SandboxPid, HostPid)>,
    (holders, kept): (Vec<Holder>, &mut Vec<Holder>),
    waiting: Vec<Ready>,
) {
    for (_, c) in handed.cloned_early.drain() {
        c.kill();
    }
    for (_, host) in surrogates {
        crate::inject::kill_tracee(host);
    }
    kept.extend(holders);
    for r in waiting {
        let _ = r.release();
    }
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
    /// Its pid, and its parent's.
    pid: SandboxPid,
    ppid: SandboxPid,
    /// It stops again once let go (`Tracee::hold`).
    job_stopped: bool,
    /// Its children whose stop it had not waited for at the checkpoint.
    reports: Vec<SandboxPid>,
    /// It had a `SIGCHLD` pending at the checkpoint.
    sigchld_pending: bool,
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

    /// After child `child` stopped again: the report of its stop taken
    /// (`waitid`) if it had been taken at the checkpoint (`taken`), and the
    /// `SIGCHLD` that came with it unless one was pending then; parked
    /// again after.
    fn take_report(&mut self, child: SandboxPid, taken: bool) -> Result<()> {
        let p = &mut self.main;
        if taken {
            let how = (libc::WSTOPPED | libc::WNOHANG) as u64;
            let args = [libc::P_PID as u64, child.raw() as u64, 0, how, 0];
            p.call("waitid (a stop's report)", libc::SYS_waitid, &args)?;
        }
        if !self.sigchld_pending {
            // sigtimedwait({SIGCHLD}, NULL, {0, 0}), its arguments below the
            // stack pointer's red zone; none pending (a parent with
            // SA_NOCLDSTOP) is EAGAIN.
            crate::inject::below_red_zone(p, self.regs.rsp, 32, |p, at| {
                let mut args = [0u8; 32];
                args[..8].copy_from_slice(&(1u64 << (libc::SIGCHLD - 1)).to_ne_bytes());
                ptrace::write_mem(p.tid.raw(), at, &args).map_err(Error::ptrace(p.tid, "write sigset"))?;
                p.syscall(libc::SYS_rt_sigtimedwait, &[at, 0, at + 16, 8]).map(drop)
            })?;
        }
        p.park()
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

/// Wait until process `host`, let go with `SIGSTOP` (or another stop
/// signal) held for it, is stopped again.
fn stopped_again(host: HostPid) -> Result<()> {
    let mut backoff = crate::batch::Backoff::new(20, 1000, std::time::Duration::from_secs(2));
    loop {
        match crate::procfs::state(host) {
            Some('T') => return Ok(()),
            _ if backoff.snooze() => {}
            state => {
                return Err(Error::Proc {
                    pid: host,
                    what: "its stop by a signal",
                    source: std::io::Error::other(format!("still in state {state:?} 2 s after its release")),
                });
            }
        }
    }
}

/// Bring back one process from its template (and give it a holder of its
/// memory, for the next rollback), still stopped: the caller lets it go
/// ([`Ready::release`]).
///
/// With a standby (a fork of the template made ahead, `standby.rs`), the
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
    handed: &mut crate::kinds::Handed,
    stop_with: Option<i32>,
) -> Result<(Option<crate::memory_holder::Holder>, Ready)> {
    let cloned = match handed.cloned_early.remove(&t.image.pid) {
        Some(c) => c,
        None => clone_one(t, wait, handed.last_pid.as_mut())?,
    };
    let Cloned { tracee: mut p, standby, nice, t_start, by_parent, .. } = cloned;
    let child = p.tid;
    // (A child made by its parent lost its alternate stack and rseq
    // registration as a process that took a standby's memory did.)
    let via_standby = standby.is_some() || by_parent;
    let image = &t.image;
    let regs = image.regs.to_sys();
    let t_clone = t_start.elapsed();
    let mut threads = Vec::new();
    let fixed = (|| -> Result<()> {
        // Out of the pool's cgroup, before it runs (its threads, made
        // below, start where it is).
        if let Some(cg) = cg {
            cg.to_live(child).map_err(|e| Error::Proc {
                pid: child,
                what: "move into the sandbox's cgroup",
                source: e,
            })?;
        }
        let how = (via_standby, t.incremental, by_parent);
        fix_up(&mut p, image, (t.scratch, t.scratch_exec), t.host, how, &mut threads, handed)?;
        // Stopped by a signal at the checkpoint: stopped again once let go.
        if let Some(sig) = stop_with {
            p.hold(sig);
        }
        Ok(())
    })();
    finish_one(t, (p, fixed.map(|()| regs)), (standby, by_parent), nice, threads, t_clone)
}

/// The children of the process `(pid, scratch, may_choose_pid)` just
/// restored (`parent`, fixed up, still stopped), made again by it
/// (`transplant.rs`) and kept in `handed.cloned_early` for their turn.
fn make_children(
    set: &mut crate::template::CheckpointTemplates,
    (pid, scratch, may_choose_pid): (SandboxPid, u64, bool),
    parent: &mut Tracee,
    handed: &mut crate::kinds::Handed,
    surrogates: &mut Vec<(SandboxPid, HostPid)>,
) -> Result<()> {
    if pid == SandboxPid::INIT {
        return Ok(());
    }
    let Some(own_group) = set.templates.iter().find(|t| t.image.pid == pid).map(|t| t.image.pgid) else {
        return Ok(());
    };
    let children: Vec<usize> = (0..set.templates.len()).filter(|&i| set.templates[i].image.ppid == pid).collect();
    // (Their groups whose leader is gone: a pipeline's whose first command
    // exited. In its session, children of its parent, init: `process::tree`'s
    // checks.)
    let maker = crate::transplant::Parent { tracee: parent, scratch, may_choose_pid, its_parent: false };
    make_by(set, &children, (maker, own_group), handed, surrogates)
}

/// The zombies of the process `(pid, scratch, may_choose_pid)` just
/// restored (`parent`, fixed up, still stopped) of phase `phase`, made
/// again by it (`process/zombies.rs`): the exit signals they sent it.
fn make_zombies(
    zombies: &Option<(Vec<crate::model::ZombieImage>, SandboxPid, Vec<crate::model::QueuedSignal>)>,
    (_, scratch, may_choose_pid): (SandboxPid, u64, bool),
    parent: &mut Tracee,
    handed: &mut crate::kinds::Handed,
    phase: Phase,
) -> Result<Vec<i32>> {
    let Some((list, pgid, _)) = zombies else { return Ok(Vec::new()) };
    crate::process::zombies::make(parent, (list, *pgid), (scratch, may_choose_pid), &mut handed.last_pid, phase)
}

/// The processes that connect through listeners that the restore of
/// `set.templates[i]` binds again (see [`crate::kinds::restore_order`]),
/// cloned now unless they are already.
fn clone_connectors(
    set: &mut crate::template::CheckpointTemplates,
    i: usize,
    handed: &mut crate::kinds::Handed,
    surrogates: &mut Vec<(SandboxPid, HostPid)>,
) -> Result<()> {
    let maker = set.templates[i].image.pid;
    let connectors: Vec<SandboxPid> = handed
        .connections
        .iter()
        .filter(|c| c.maker == Some(maker) && c.connector != maker && !handed.cloned_early.contains_key(&c.connector))
        .map(|c| c.connector)
        .collect();
    for pid in connectors {
        if handed.cloned_early.contains_key(&pid) {
            continue;
        }
        // (One made by its parent is made at its parent's turn, which
        // comes before: `kinds::restore_order`.)
        let ppid = set.templates.iter().find(|t| t.image.pid == pid).map(|t| t.image.ppid);
        if ppid.is_some_and(|ppid| ppid != SandboxPid::INIT && set.templates.iter().any(|p| p.image.pid == ppid)) {
            continue;
        }
        // (One made by its session's maker: by its leader, at the leader's
        // turn, which comes before too; else by a surrogate, now.)
        if let Some(image) = set.templates.iter().map(|t| &t.image).find(|i| i.pid == pid)
            && crate::process::session::made_by_session(image)
        {
            let sid = image.sid;
            if !set.templates.iter().any(|p| p.image.pid == sid) {
                session_by_surrogate(set, sid, handed, surrogates)?;
            }
            continue;
        }
        let Some(t) = set.templates.iter_mut().find(|t| t.image.pid == pid) else { continue };
        // (Its pid may be busy still: it is needed now.)
        let cloned = clone_one(t, true, handed.last_pid.as_mut())?;
        handed.cloned_early.insert(pid, cloned);
    }
    Ok(())
}

/// What a surrogate makes again: a process group, or a session (with its
/// group).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Surrogate {
    Group,
    Session,
}

/// A surrogate for the gone leader of a process group or a session (`pid`),
/// which restored processes are in (`sh -c 'server &'` once `sh` exited,
/// as a child of init): a process of pid `pid` (a clone of `src`, whose
/// scratch page is at `scratch`, sharing its memory, a child of its parent,
/// init) that makes the group (`setpgid(0, 0)`) or the session (`setsid`)
/// again, for the restored members to join or be made in; killed once
/// every process is back (the group or session lives on with its members,
/// leaderless as it was). `src` is a member's template (outside any
/// session of the sandbox, a group's surrogate is in the member's session,
/// init's), or the session's maker (a group of its session). The pid is
/// free by then: the templates left those groups and sessions
/// (`Template::prepare`, `checkpoint::clone_of`), and the killed members
/// are gone (waited for, as a restored process's own pid is).
fn surrogate(
    (src, from_template): (&mut Tracee, bool),
    scratch: u64,
    may_choose_pid: bool,
    (pid, what): (SandboxPid, Surrogate),
    last_pid: Option<&mut crate::LastPid>,
) -> Result<Tracee> {
    const CALL: &str = "clone3 (a surrogate of a gone leader)";
    let by_last_pid = crate::process::pid_source(may_choose_pid, last_pid, (src.tid, CALL))?;
    let flags = (libc::CLONE_PARENT | libc::CLONE_VM) as u64;
    let args = clone_args(scratch + SET_TID_OFFSET, flags);
    write_clone_args(src.tid, scratch, &args, pid)?;
    let mut busy = 0u32;
    let out = crate::process::clone3_as(src, scratch, pid, by_last_pid, &mut busy, true)?;
    // (Signals sent to a template meanwhile are not its own; a restored
    // leader's held ones are: its stop by a signal, `restore_one`.)
    if from_template {
        src.take_held();
    }
    let call: (i64, &[u64]) = (libc::SYS_clone3, &[scratch, crate::inject::CLONE_ARGS_SIZE]);
    let (host, ns_pid, regs) = src.cloned(out, call, CALL)?;
    let mut made = Tracee::new(host, regs, src.insn);
    let done = match (ns_pid == pid, what) {
        (true, Surrogate::Group) => made.call("setpgid (a group's surrogate)", libc::SYS_setpgid, &[0, 0]),
        (true, Surrogate::Session) => made.call("setsid (a session's surrogate)", libc::SYS_setsid, &[]),
        (false, _) => Err(Error::Remote {
            pid: src.tid,
            call: CALL,
            errno: std::io::Error::other(format!("got pid {ns_pid} instead of {pid}")),
        }),
    };
    if let Err(e) = done {
        crate::inject::kill_tracee(host);
        return Err(e);
    }
    let kind = if what == Surrogate::Group { "process group" } else { "session" };
    tracing::debug!(pid = pid.raw(), kind, busy, "made again by a surrogate");
    Ok(made)
}

/// The processes of session `sid` made again by its maker
/// (`process::session::made_by_session`) and not made yet: transplanted
/// by `maker` (the restored leader, or a surrogate: [`session_by_surrogate`])
/// as children of init ([`make_by`]).
fn make_session(
    set: &mut crate::template::CheckpointTemplates,
    sid: SandboxPid,
    maker: crate::transplant::Parent<'_>,
    handed: &mut crate::kinds::Handed,
    surrogates: &mut Vec<(SandboxPid, HostPid)>,
) -> Result<()> {
    let members: Vec<usize> = (0..set.templates.len())
        .filter(|&i| {
            let image = &set.templates[i].image;
            crate::process::session::made_by_session(image)
                && image.sid == sid
                && !handed.cloned_early.contains_key(&image.pid)
        })
        .collect();
    make_by(set, &members, (maker, sid), handed, surrogates)
}

/// Processes `members` of `set` made again by `maker` (their restored
/// parent, or their session's maker: then children of init, `its_parent`)
/// into `handed.cloned_early`, after surrogates the maker makes for their
/// groups whose leader is gone (but `maker_group`, the maker's: into
/// `surrogates`).
fn make_by(
    set: &mut crate::template::CheckpointTemplates,
    members: &[usize],
    (maker, maker_group): (crate::transplant::Parent<'_>, SandboxPid),
    handed: &mut crate::kinds::Handed,
    surrogates: &mut Vec<(SandboxPid, HostPid)>,
) -> Result<()> {
    // (A group led by a zombie is made by that zombie, made before:
    // `process/zombies.rs`.)
    let pids: HashSet<SandboxPid> = set
        .templates
        .iter()
        .flat_map(|t| {
            std::iter::once(t.image.pid).chain(t.image.zombies.iter().filter(|z| z.pgid == z.pid).map(|z| z.pid))
        })
        .collect();
    let crate::transplant::Parent { tracee, scratch, may_choose_pid, its_parent } = maker;
    for &i in members {
        let image = &set.templates[i].image;
        let pgid = image.pgid;
        let gone = pgid != image.pid && pgid != image.sid && pgid != maker_group && !pids.contains(&pgid);
        if gone && !surrogates.iter().any(|(g, _)| *g == pgid) {
            let made = surrogate(
                (&mut *tracee, false),
                scratch,
                may_choose_pid,
                (pgid, Surrogate::Group),
                handed.last_pid.as_mut(),
            )?;
            surrogates.push((pgid, made.tid));
        }
    }
    for &i in members {
        let parent = crate::transplant::Parent { tracee: &mut *tracee, scratch, may_choose_pid, its_parent };
        let t = &mut set.templates[i];
        let child = crate::transplant::child_of(parent, t, handed.last_pid.as_mut())?;
        handed.cloned_early.insert(t.image.pid, child);
    }
    Ok(())
}

/// Session `sid`, whose leader is gone, started again by a surrogate of the
/// leader's pid ([`surrogate`], cloned from the template of the session's
/// first process: `process::tree::session_source`), which makes its
/// processes ([`make_session`]); the surrogate goes into `surrogates`.
fn session_by_surrogate(
    set: &mut crate::template::CheckpointTemplates,
    sid: SandboxPid,
    handed: &mut crate::kinds::Handed,
    surrogates: &mut Vec<(SandboxPid, HostPid)>,
) -> Result<()> {
    let images: Vec<(&ProcessImage, HostPid)> = set.templates.iter().map(|t| (&t.image, t.host)).collect();
    let Some(j) = crate::process::tree::session_source(&images, sid) else { return Ok(()) };
    let t = &mut set.templates[j];
    let (scratch, may_choose_pid) = (t.scratch, crate::check::may_choose_pid(&t.image));
    let mut made =
        surrogate((&mut t.tracee, true), scratch, may_choose_pid, (sid, Surrogate::Session), handed.last_pid.as_mut())?;
    surrogates.push((sid, made.tid));
    let maker = crate::transplant::Parent { tracee: &mut made, scratch, may_choose_pid, its_parent: true };
    make_session(set, sid, maker, handed, surrogates)
}

/// The first step of [`restore_one`] (see [`Cloned`]).
pub(crate) fn clone_one(t: &mut Template, wait: bool, last_pid: Option<&mut crate::LastPid>) -> Result<Cloned> {
    let mut standby = t.standby.take();
    // A standby killed behind our back (by the sandbox, or the OOM killer)
    // is collected and not used.
    if let Some(s) = &standby
        && !matches!(ptrace::try_wait(s.host.raw()), Ok(None))
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
    // A process that may not choose its pid (`set_tid`) gets it through
    // the sandbox's `ns_last_pid`.
    let by_last_pid =
        match crate::process::pid_source(crate::check::may_choose_pid(image), last_pid, (src_host, "clone3 (restore)"))
        {
            Ok(by) => by,
            Err(e) => {
                t.standby = standby;
                return Err(e);
            }
        };
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
    let out = crate::process::clone3_as(src, t.scratch, image.pid, by_last_pid, &mut busy, wait);
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
    let tracee = Tracee::new(child, regs, t.tracee.insn).with_mask(image.signals.blocked);
    let fds = image.fds.iter().map(|f| f.fd).collect();
    let cloned = Cloned { tracee, scratch: t.scratch, fds, standby, nice, t_start, by_parent: false };
    if busy > 0 {
        tracing::debug!(pid = image.pid.raw(), busy, "pid was busy");
    }
    match inject::wait_event_stop(child) {
        Ok(_) => Ok(cloned),
        Err(e) => {
            cloned.kill();
            Err(e)
        }
    }
}

/// The end of [`restore_one`]: process `p`, fixed up (with the registers
/// it goes on with) or not, made ready or killed.
fn finish_one(
    t: &Template,
    (p, fixed): (Tracee, Result<sandtree_sys::ptrace::Regs>),
    (standby, by_parent): (Option<crate::standby::Standby>, bool),
    nice: Option<i32>,
    threads: Vec<(Tracee, sandtree_sys::ptrace::Regs)>,
    t_clone: std::time::Duration,
) -> Result<(Option<crate::memory_holder::Holder>, Ready)> {
    let image = &t.image;
    let child = p.tid;
    let via_standby = standby.is_some();
    let fixed = fixed.map(|regs| (p, regs));
    tracing::debug!(pid = image.pid.raw(), via_standby, ?t_clone, "restore steps");
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
        Ok((mut p, regs)) => {
            // (None for a child made by its parent: a holder is a child
            // of the process it holds, which would see it.)
            let holder = match shared {
                Some(old) => crate::memory_holder::adopt(old, child),
                None if by_parent => Err(Error::Proc {
                    pid: child,
                    what: "a holder",
                    source: std::io::Error::other("none for a child of another process"),
                }),
                None => crate::memory_holder::make(&mut p),
            };
            let holder = match holder {
                Ok(h) => Some(h),
                Err(_) if by_parent => None,
                Err(e) => {
                    tracing::warn!(pid = image.pid.raw(), "no mm holder: {e}");
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
            let sigchld = 1u64 << (libc::SIGCHLD - 1);
            let sigchld_pending = image.signals.pending & sigchld != 0;
            Ok((
                holder,
                Ready {
                    main: p,
                    regs,
                    threads,
                    parked: false,
                    pid: image.pid,
                    ppid: image.ppid,
                    job_stopped: image.job_stopped,
                    reports: image.stop_reports.iter().map(|&(c, _)| c).collect(),
                    sigchld_pending,
                },
            ))
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

fn fix_up(
    p: &mut Tracee,
    image: &ProcessImage,
    (scratch, exec): (u64, bool),
    template: HostPid,
    (via_standby, incremental, by_parent): (bool, bool, bool),
    threads: &mut Vec<(Tracee, ptrace::Regs)>,
    handed: &mut crate::kinds::Handed,
) -> Result<()> {
    // Batched (one round trip, `batch.rs`): cwd, files reopened by path,
    // inet sockets. Then one at a time what needs the daemon between calls
    // (deleted files and memfds filled through /proc, unix listeners,
    // inotify instances), dups and signalfd masks batched, epoll watch
    // lists (`kinds::fix_up_descriptors`); then the rest batched again.
    let mut b = Batch::new(scratch, exec);
    match (image.cwd.strip_suffix(" (deleted)"), image.cwd_remade) {
        // A deleted working directory: made again at its path, entered,
        // its mode set (mkdir's is under the umask), removed again.
        (Some(path), Some(mode)) => {
            let at = b.path(path);
            b.call("mkdir (a deleted cwd)", libc::SYS_mkdir, &[at, Arg::Val(u64::from(mode))]);
            b.call("chdir", libc::SYS_chdir, &[at]);
            b.call("chmod (a deleted cwd)", libc::SYS_chmod, &[at, Arg::Val(u64::from(mode))]);
            b.call("rmdir (a deleted cwd)", libc::SYS_rmdir, &[at]);
        }
        _ => {
            let cwd = b.path(&image.cwd);
            b.call("chdir", libc::SYS_chdir, &[cwd]);
        }
    }
    // Every descriptor (`kinds/`): reopened in this batch, made anew,
    // dup'd, configured, linked.
    crate::kinds::fix_up_descriptors(p, &mut b, image, (scratch, template), handed)?;
    crate::process::session::restore(&mut b, image, &|index| handed.hung_up(index), by_parent);
    crate::process::signals::restore_altstack(&mut b, image, (via_standby, incremental));
    crate::process::threads::restore_registrations(&mut b, image, via_standby);
    crate::process::timers::restore(&mut b, image);
    crate::process::memory::mark_again(&mut b, image);
    crate::process::memory::remap_shared_files(&mut b, image, p.tid);
    p.run_batch(&mut b)?;
    crate::process::threads::restore(p, image, scratch, threads, handed.last_pid.as_mut())?;
    // (After the threads: a timer may signal one.)
    let mut b = Batch::new(scratch, exec);
    crate::process::timers::restore_posix(&mut b, image);
    p.run_batch(&mut b)?;
    crate::process::signals::requeue(p, image, scratch, threads)?;
    // (Its scratch mapping goes once it made its children: `restore`.)
    Ok(())
}
