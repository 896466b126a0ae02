//! The stop of a checkpoint: `PTRACE_SEIZE` + `PTRACE_INTERRUPT` of every
//! process of the sandbox but the pool's (and of every thread of each),
//! scan after scan of the sandbox's cgroup until none is new (a stopped
//! process cannot fork); optionally init too. [`Stops`] holds what is
//! stopped until the checkpoint lets it go.
//!
//! A process the engine cannot restore is refused here, from its status
//! alone (its parent, a main thread that exited, a job-control stop,
//! another tracer), before it is stopped. The stop is bounded: a task that
//! does not stop (an uninterruptible wait) fails it, named, and is
//! detached once it reaches its stop ([`Stops::settle_lingering`]).

use std::collections::HashSet;

use sandtree_sys::ptrace;
use serde::{Deserialize, Serialize};

use crate::check::Unrestorable;
use crate::inject::{self, Tracee};
use crate::{Error, HostPid, Result, SandboxPid, procfs};

fn is_gone(e: &std::io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ESRCH) | Some(libc::ENOENT))
}

/// What a checkpoint's stop holds: the stopped processes, init when it was
/// stopped too, and tasks seized that never reached their stop.
#[derive(Default)]
pub(crate) struct Stops {
    stopped: Vec<StoppedProcess>,
    /// Init, when stopped with the others (host pid, registers).
    init: Option<(HostPid, ptrace::Regs)>,
    /// Seized tasks whose interrupt has not taken effect yet.
    lingering: Vec<HostPid>,
    /// An init's host pid and the depth of its pid namespace (read once:
    /// its `status` took ~60 µs of every checkpoint's stop).
    init_depth: Option<(HostPid, usize)>,
}

/// A stopped original, between [`crate::Tracer::stop`] and [`crate::Tracer::clone_all`].
pub(crate) struct StoppedProcess {
    pub host: HostPid,
    pub ns_pid: SandboxPid,
    pub ns_ppid: SandboxPid,
    pub regs: sandtree_sys::ptrace::Regs,
    /// Its other threads, stopped too: (host tid, tid in the sandbox,
    /// registers).
    pub threads: Vec<(HostPid, SandboxPid, sandtree_sys::ptrace::Regs)>,
    /// It was stopped by a signal (`SIGSTOP`, `SIGTSTP`: a shell's job
    /// after Ctrl-Z). Let go, it stops again (the kernel puts a detached
    /// tracee of a stopped process back into its stop, without telling its
    /// parent again); restored, it is stopped again (`process::session`).
    pub job_stopped: bool,
    /// Its children stopped so (`job_stopped`), filled in once every
    /// process is stopped.
    pub stopped_children: Vec<SandboxPid>,
    /// Its children that exited and that it has not waited for yet
    /// (zombies), filled in once every process is stopped.
    pub zombies: Vec<crate::model::ZombieImage>,
}

/// What [`crate::Tracer::stop`] did.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct StopReport {
    /// Processes stopped.
    pub stopped: usize,
    /// Processes left running because they cannot be restored (best effort).
    pub skipped: Vec<Unrestorable>,
    /// The cgroup holds tasks from outside the sandbox's pid namespace:
    /// only a cgroup freeze holds them (init is then not stopped).
    pub foreign: bool,
}

impl Stops {
    /// Whether no process is stopped.
    pub(crate) fn is_empty(&self) -> bool {
        self.stopped.is_empty()
    }

    /// How many processes are stopped.
    pub(crate) fn len(&self) -> usize {
        self.stopped.len()
    }

    /// The stopped processes, for the capture (which lets each go).
    pub(crate) fn take(&mut self) -> Vec<StoppedProcess> {
        std::mem::take(&mut self.stopped)
    }

    /// Stop every process `list` gives but `init_host` and the pool's
    /// (`kept`); with `with_init`, init too. In best effort, processes that
    /// cannot be restored are left running and reported; otherwise the first
    /// one is an error and nothing stays stopped.
    pub(crate) fn stop(
        &mut self,
        list: &dyn Fn() -> std::io::Result<Vec<HostPid>>,
        (init_host, kept): (HostPid, &HashSet<HostPid>),
        best_effort: bool,
        timeout: std::time::Duration,
        with_init: bool,
    ) -> Result<StopReport> {
        self.settle_lingering();
        let st = self;
        let t0 = std::time::Instant::now();
        let res = st.stop_inner(list, (init_host, kept), best_effort, timeout).and_then(|report| {
            if with_init && !report.foreign {
                st.stop_init(init_host, std::time::Instant::now() + timeout).map(drop)?;
            }
            Ok(report)
        });
        tracing::debug!(took = ?t0.elapsed(), stopped = st.stopped.len(), "processes stopped");
        if res.is_err() {
            st.resume_all();
        }
        res
    }

    /// Seized tasks that never reached their stop (they were in an
    /// uninterruptible wait): detach each once it finally stops.
    pub(crate) fn settle_lingering(&mut self) {
        self.lingering.retain(|&host| match ptrace::try_wait(host.raw()) {
            Ok(None) => true,
            Ok(Some(ptrace::Stop::Exited(_) | ptrace::Stop::Killed(_))) | Err(_) => false,
            Ok(Some(_)) => {
                let _ = ptrace::detach(host.raw(), 0);
                false
            }
        });
    }

    fn stop_inner(
        &mut self,
        list: &dyn Fn() -> std::io::Result<Vec<HostPid>>,
        (init_host, templates): (HostPid, &HashSet<HostPid>),
        best_effort: bool,
        timeout: std::time::Duration,
    ) -> Result<StopReport> {
        let st = self;
        let deadline = std::time::Instant::now() + timeout;
        let depth = match st.init_depth {
            Some((host, depth)) if host == init_host => depth,
            _ => {
                let depth = procfs::status(init_host).map(|s| s.ns_depth).unwrap_or(0);
                if depth > 0 {
                    st.init_depth = Some((init_host, depth));
                }
                depth
            }
        };
        let me = HostPid(rustix::thread::gettid().as_raw_nonzero().get());
        let mut seen: HashSet<HostPid> = HashSet::new();
        let mut report = StopReport::default();
        loop {
            let procs = list().map_err(|e| Error::Proc { pid: init_host, what: "cgroup.procs", source: e })?;
            let new: Vec<HostPid> =
                procs.into_iter().filter(|p| *p != init_host && !templates.contains(p) && !seen.contains(p)).collect();
            if new.is_empty() {
                break;
            }
            // A refusal stops the scan, but what was seized must still reach its
            // stop and be recorded, so that the caller lets it go.
            let mut failure: Option<Error> = None;
            let mut seized = Vec::new();
            for host in new {
                seen.insert(host);
                let status = match procfs::status(host) {
                    Ok(s) => s,
                    Err(e) if is_gone(&e) || e.kind() == std::io::ErrorKind::NotFound => continue,
                    Err(e) => {
                        failure = Some(Error::Proc { pid: host, what: "status", source: e });
                        break;
                    }
                };
                // Zombies, and tasks that joined the cgroup from outside the
                // sandbox's pid namespace (not the sandbox's processes; the
                // cgroup freeze still holds them).
                if (status.state == 'Z' || status.state == 'X') && status.threads <= 1 {
                    continue;
                }
                // Traced by us: a standby being forked between operations
                // (`memory_holder.rs`; its pid is ours once the fork returns), or a task
                // an earlier checkpoint seized that never reached its stop.
                if status.tracer == me {
                    if st.lingering.contains(&host) {
                        let comm = std::fs::read_to_string(format!("/proc/{host}/comm")).unwrap_or_default();
                        failure = Some(Error::StopTimeout {
                            timeout_ms: timeout.as_millis() as u64,
                            stuck: format!(
                                "pid {host} ({}) in state {}, since an earlier checkpoint",
                                comm.trim_end(),
                                status.state
                            ),
                        });
                        break;
                    }
                    continue;
                }
                if status.ns_depth != depth {
                    report.foreign = true;
                    continue;
                }
                let comm = std::fs::read_to_string(format!("/proc/{host}/comm")).unwrap_or_default();
                let ppid = ns_ppid(init_host, status.host_ppid);
                let checked = match status.state {
                    'Z' => Err(Unrestorable {
                        pid: status.ns_pid,
                        comm: comm.trim_end().to_string(),
                        resource: "threads".into(),
                        reason: "its main thread exited while other threads run (not captured yet)".into(),
                    }),
                    _ => Ok(()),
                };
                if let Err(u) = checked {
                    if best_effort {
                        report.skipped.push(u);
                        continue;
                    }
                    failure = Some(Error::Unsupported(u));
                    break;
                }
                match ptrace::seize(host.raw()) {
                    Ok(()) => {}
                    Err(e) if is_gone(&e) => continue,
                    // (It exited meanwhile: a zombie, which `ptrace`
                    // refuses too; taken with its parent's.)
                    Err(e)
                        if e.raw_os_error() == Some(libc::EPERM)
                            && procfs::status(host)
                                .is_ok_and(|s| (s.state == 'Z' || s.state == 'X') && s.threads <= 1) =>
                    {
                        continue;
                    }
                    Err(e) if e.raw_os_error() == Some(libc::EPERM) => {
                        let u = Unrestorable {
                            pid: status.ns_pid,
                            comm: comm.trim_end().to_string(),
                            resource: "ptrace".into(),
                            reason: "it is traced by another process (a debugger or strace)".into(),
                        };
                        if best_effort {
                            report.skipped.push(u);
                            continue;
                        }
                        failure = Some(Error::Unsupported(u));
                        break;
                    }
                    Err(e) => {
                        failure = Some(Error::Ptrace { pid: host, op: "seize", source: e });
                        break;
                    }
                }
                if let Err(e) = ptrace::interrupt(host.raw()) {
                    let _ = ptrace::detach(host.raw(), 0);
                    if is_gone(&e) {
                        continue;
                    }
                    failure = Some(Error::Ptrace { pid: host, op: "interrupt", source: e });
                    break;
                }
                // (Stopped by a signal: it stays so, `StoppedProcess::job_stopped`.)
                seized.push((host, status.ns_pid, ppid, status.state == 'T'));
            }
            let mut stuck = Vec::new();
            for (host, ns_pid, ppid, job_stopped) in seized {
                match inject::wait_event_stop_until(host, deadline) {
                    Ok(None) => {
                        let state = procfs::status(host).map(|s| s.state).unwrap_or('?');
                        let comm = std::fs::read_to_string(format!("/proc/{host}/comm")).unwrap_or_default();
                        stuck.push(format!("pid {host} ({}) in state {state}", comm.trim_end()));
                        st.lingering.push(host);
                        continue;
                    }
                    Ok(Some(children)) => {
                        // Forked while we stopped it: the children are attached
                        // and stop on their own; the next list pass sees them as
                        // known (they are children of a non-init process, so they
                        // are refused or skipped there).
                        for c in children {
                            let _ = inject::wait_event_stop(c);
                            let _ = ptrace::detach(c.raw(), 0);
                        }
                    }
                    Err(Error::Died { .. }) => continue,
                    Err(e) => {
                        let _ = ptrace::detach(host.raw(), 0);
                        failure.get_or_insert(e);
                        continue;
                    }
                }
                let regs = match ptrace::regs(host.raw()) {
                    Ok(regs) => regs,
                    Err(e) => {
                        let _ = ptrace::detach(host.raw(), 0);
                        failure.get_or_insert(Error::Ptrace { pid: host, op: "GETREGS", source: e });
                        continue;
                    }
                };
                match stop_threads(host, deadline, &mut st.lingering) {
                    Ok(threads) => {
                        st.stopped.push(StoppedProcess {
                            host,
                            ns_pid,
                            ns_ppid: ppid,
                            regs,
                            threads,
                            job_stopped,
                            stopped_children: Vec::new(),
                            zombies: Vec::new(),
                        });
                        report.stopped += 1;
                    }
                    Err(e) => {
                        let _ = ptrace::set_regs(host.raw(), &regs);
                        let _ = ptrace::detach(host.raw(), 0);
                        failure.get_or_insert(e);
                    }
                }
            }
            if let Some(e) = failure {
                return Err(e);
            }
            if !stuck.is_empty() {
                return Err(Error::StopTimeout { timeout_ms: timeout.as_millis() as u64, stuck: stuck.join(", ") });
            }
        }
        // Children that exited and that their parent (a stopped process,
        // not init, which reaps its own) has not waited for yet (zombies;
        // not in the cgroup's list): a fork copies no child, so the restore
        // makes each again (`process/zombies.rs`). Read once every process
        // is stopped: no child can exit any more.
        let stopped_jobs: Vec<(SandboxPid, SandboxPid)> =
            st.stopped.iter().filter(|s| s.job_stopped).map(|s| (s.ns_pid, s.ns_ppid)).collect();
        for s in st.stopped.iter_mut() {
            s.stopped_children =
                stopped_jobs.iter().filter(|(_, ppid)| *ppid == s.ns_pid).map(|(pid, _)| *pid).collect();
            let (zombies, refused) = zombie_children(s, depth);
            s.zombies = zombies;
            for u in refused {
                if !best_effort {
                    return Err(Error::Unsupported(u));
                }
                report.skipped.push(u);
            }
        }
        Ok(report)
    }

    /// Let every stopped original go with its registers untouched.
    pub(crate) fn resume_all(&mut self) {
        for s in self.stopped.drain(..) {
            let_go_threads(&s.threads);
            let _ = ptrace::set_regs(s.host.raw(), &s.regs);
            let _ = ptrace::detach(s.host.raw(), 0);
        }
        self.resume_init();
    }

    /// Let init go (it was stopped with the others, untouched).
    pub(crate) fn resume_init(&mut self) {
        if let Some((host, regs)) = self.init.take() {
            let _ = ptrace::set_regs(host.raw(), &regs);
            let _ = ptrace::detach(host.raw(), 0);
        }
    }

    /// Stop init too (it is not captured): nothing in the sandbox then runs,
    /// so the filesystem snapshot needs no cgroup freeze and can be taken while
    /// the templates are made. Also init stopped to make templates from a
    /// durable image (`durable::templates`). Returns its registers;
    /// [`Stops::resume_init`] sets them back and lets it go. One that does
    /// not stop by `deadline` is left to [`Stops::settle_lingering`].
    pub(crate) fn stop_init(&mut self, init_host: HostPid, deadline: std::time::Instant) -> Result<ptrace::Regs> {
        let st = self;
        ptrace::seize(init_host.raw()).map_err(Error::ptrace(init_host, "seize init"))?;
        if let Err(e) = ptrace::interrupt(init_host.raw()) {
            let _ = ptrace::detach(init_host.raw(), 0);
            return Err(Error::Ptrace { pid: init_host, op: "interrupt init", source: e });
        }
        match inject::wait_event_stop_until(init_host, deadline)? {
            Some(children) => {
                for c in children {
                    let _ = inject::wait_event_stop(c);
                    let _ = ptrace::detach(c.raw(), 0);
                }
            }
            None => {
                st.lingering.push(init_host);
                return Err(Error::StopTimeout { timeout_ms: 0, stuck: format!("init (pid {init_host})") });
            }
        }
        let regs = ptrace::regs(init_host.raw()).map_err(Error::ptrace(init_host, "GETREGS"))?;
        st.init = Some((init_host, regs));
        Ok(regs)
    }
}

fn ns_ppid(init_host: HostPid, host_ppid: HostPid) -> SandboxPid {
    if host_ppid == init_host {
        return SandboxPid::INIT;
    }
    procfs::status(host_ppid).map(|s| s.ns_pid).unwrap_or(SandboxPid(0))
}

/// Stop every thread of process `host` but the main one (stopped
/// already), scan after scan of `/proc/<host>/task` until none is new (a
/// thread that runs may make another; one made by a stopped thread is
/// attached at once and reported by its stop). On error, every thread
/// stopped here is let go.
fn stop_threads(
    host: HostPid,
    deadline: std::time::Instant,
    lingering: &mut Vec<HostPid>,
) -> Result<Vec<(HostPid, SandboxPid, ptrace::Regs)>> {
    let mut done: Vec<(HostPid, SandboxPid, ptrace::Regs)> = Vec::new();
    // Seized and not stopped yet: on an error they are left to
    // `settle_lingering`, which detaches each once it stops.
    let mut waiting: Vec<HostPid> = Vec::new();
    let result = (|| -> Result<()> {
        loop {
            let tids: Vec<HostPid> = std::fs::read_dir(format!("/proc/{host}/task"))
                .map_err(|e| Error::Proc { pid: host, what: "tasks", source: e })?
                .flatten()
                .filter_map(|e| e.file_name().to_str()?.parse().ok().map(HostPid))
                .filter(|t| *t != host && !done.iter().any(|(d, ..)| d == t))
                .collect();
            if tids.is_empty() {
                return Ok(());
            }
            for tid in tids {
                match ptrace::seize(tid.raw()).and_then(|()| ptrace::interrupt(tid.raw())) {
                    Ok(()) => waiting.push(tid),
                    Err(e) if is_gone(&e) => {}
                    // Attached already: made by a thread we stopped.
                    Err(e) if e.raw_os_error() == Some(libc::EPERM) => waiting.push(tid),
                    Err(e) => return Err(Error::Ptrace { pid: tid, op: "seize thread", source: e }),
                }
            }
            while let Some(tid) = waiting.pop() {
                match inject::wait_event_stop_until(tid, deadline) {
                    Ok(Some(children)) => {
                        for c in children {
                            // A new thread of this process is one more to
                            // capture; a forked child is let go (the next
                            // scan of processes sees it).
                            if procfs::tgid(c).is_ok_and(|g| g == host) {
                                waiting.push(c);
                            } else {
                                let _ = inject::wait_event_stop(c);
                                let _ = ptrace::detach(c.raw(), 0);
                            }
                        }
                    }
                    Ok(None) => {
                        waiting.push(tid);
                        return Err(Error::StopTimeout { timeout_ms: 0, stuck: format!("thread {tid} of pid {host}") });
                    }
                    Err(Error::Died { .. }) => continue,
                    Err(e) => return Err(e),
                }
                let ns_tid = procfs::status(tid).map(|s| s.ns_pid).map_err(|e| Error::Proc {
                    pid: tid,
                    what: "thread status",
                    source: e,
                })?;
                let regs = ptrace::regs(tid.raw()).map_err(Error::ptrace(tid, "GETREGS"))?;
                done.push((tid, ns_tid, regs));
            }
        }
    })();
    match result {
        Ok(()) => Ok(done),
        Err(e) => {
            let_go_threads(&done);
            lingering.extend(waiting);
            Err(e)
        }
    }
}

/// Let stopped threads (host tid, tid in the sandbox, registers) go,
/// registers untouched.
pub(crate) fn let_go_threads(threads: &[(HostPid, SandboxPid, ptrace::Regs)]) {
    for (tid, _, regs) in threads {
        let _ = ptrace::set_regs((*tid).raw(), regs);
        let _ = ptrace::detach((*tid).raw(), 0);
    }
}

/// Let a stopped original go with its checkpoint registers, from whatever
/// stop it is in (in signal context, so an interrupted syscall restarts).
/// Its affinity may still be the tracer's pin: callers that pinned it put
/// it back first.
pub(crate) fn let_go(s: &StoppedProcess) {
    let_go_threads(&s.threads);
    if Tracee::new(s.host, s.regs, 0).release(&s.regs).is_err() {
        let _ = ptrace::set_regs(s.host.raw(), &s.regs);
        let _ = ptrace::detach(s.host.raw(), 0);
    }
}

/// The children of stopped process `s` (of each of its threads) that
/// exited and that it has not waited for yet (zombies), and the refusals
/// of those a restore cannot end the same way.
fn zombie_children(s: &StoppedProcess, depth: usize) -> (Vec<crate::model::ZombieImage>, Vec<Unrestorable>) {
    let (mut out, mut refused) = (Vec::new(), Vec::new());
    let tids = std::iter::once(s.host).chain(s.threads.iter().map(|t| t.0));
    for tid in tids {
        let Ok(list) = std::fs::read_to_string(format!("/proc/{}/task/{tid}/children", s.host)) else { continue };
        for child in list.split_whitespace().filter_map(|c| c.parse().ok()).map(HostPid) {
            let Ok(status) = procfs::status(child) else { continue };
            if status.state != 'Z' || status.threads > 1 {
                continue;
            }
            let comm = std::fs::read(format!("/proc/{child}/comm")).unwrap_or_default();
            let comm = String::from_utf8_lossy(comm.strip_suffix(b"\n").unwrap_or(&comm)).to_string();
            let refuse = |reason: String| Unrestorable {
                pid: status.ns_pid,
                comm: comm.clone(),
                resource: "exit status".into(),
                reason,
            };
            if status.ns_depth != depth {
                refused.push(refuse(format!(
                    "it exited in a pid namespace of its own and its parent, pid {}, has not waited for it yet (a zombie of another pid namespace: not captured yet)",
                    s.ns_pid
                )));
                continue;
            }
            let Ok((wait_status, exit_signal)) = procfs::exit_status(child) else {
                refused.push(refuse(format!(
                    "it exited and its parent, pid {}, has not waited for it yet (a zombie), and its exit status could not be read",
                    s.ns_pid
                )));
                continue;
            };
            if wait_status & 0x80 != 0 {
                refused.push(refuse(format!(
                    "it was killed by signal {} and dumped core, and its parent, pid {}, has not waited for it yet (a zombie): a restore cannot end a process so without writing a core dump",
                    wait_status & 0x7f,
                    s.ns_pid
                )));
                continue;
            }
            out.push(crate::model::ZombieImage {
                pid: status.ns_pid,
                pgid: status.ns_pgid,
                sid: status.ns_sid,
                comm,
                status: wait_status,
                exit_signal,
                uids: status.uids,
                gids: status.gids,
            });
        }
    }
    (out, refused)
}
