//! The sandbox init (pid 1 of the sandbox pid namespace).
//!
//! Init is the forked zygote code (no binary inside the sandbox), single
//! threaded, and runs a `poll` loop over:
//! * the listening `init.sock`: a new connection replaces the current one
//!   (this is how a restarted daemon re-adopts a running sandbox);
//! * the current daemon connection: requests of [`crate::protocol`];
//! * a signalfd for `SIGCHLD` (blocked): every child is reaped with
//!   `waitpid(-1, WNOHANG)`, orphans re-parented to pid 1 included;
//!   exits of processes init spawned are reported as `Exited`, and queued
//!   while no daemon is connected (flushed after the next `Hello`).
//!
//! Spawning a process:
//! 1. resolve `argv[0]` in `PATH` taken from the request env (glibc's
//!    `execvpe` would use init's own environment), missing -> error
//!    `command not found: X` (code 127) without forking;
//! 2. create a close-on-exec error pipe and fork;
//! 3. child: `setsid` (or `setpgid(0, 0)`), pty slave as controlling
//!    terminal, `dup2` stdio, `chdir` (failure is written to the error pipe,
//!    not a crash), reset signal dispositions and mask, `execve`;
//! 4. init reads the error pipe until EOF: EOF without data means `execve`
//!    succeeded (close-on-exec), so `Spawned` is sent before the child can
//!    be reaped and reported as `Exited`.

use std::collections::{HashSet, VecDeque};
use std::ffi::CString;
use std::fs;
use std::io::{Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::signal::{SigSet, SigmaskHow, Signal, kill, sigprocmask};
use nix::sys::signalfd::SignalFd;
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::Pid;
use rustix::net::SocketFlags;
use sandtree_sys::process::{Forked, exit_now, fork_single_threaded};

use crate::protocol::{self, FromInit, Reply, Request, StdioSpec, ToInit};

const MAX_QUEUED: usize = 16 * 1024;

struct Init {
    conn: Option<OwnedFd>,
    tracked: HashSet<i32>,
    /// Pids killed for a rollback that the daemon restores: the exit of the
    /// old process is not reported; once it is reaped, the pid is tracked
    /// again (for the restored process).
    /// (pid → the killed original's start time, which tells it from the
    /// restored process once that has its pid.)
    restoring: std::collections::HashMap<i32, Option<u64>>,
    /// Pids killed for a rollback (not restored) and not reaped yet: what
    /// `WaitGone` waits for.
    awaiting: HashSet<i32>,
    /// An old root is still to be detached: a rollback's at the first
    /// request after its `WaitGone`, a `Restack`'s right after its reply
    /// (see [`Init::finish_swap`]).
    detach_pending: bool,
    queued: VecDeque<FromInit>,
    /// The mounts known to be set-up's or ours (`reroot::Approved`).
    approved: crate::reroot::Approved,
}

/// Run the init loop forever.
pub fn run(listener: OwnedFd, sigfd: SignalFd) -> ! {
    let mut st = Init {
        conn: None,
        tracked: HashSet::new(),
        restoring: std::collections::HashMap::new(),
        awaiting: HashSet::new(),
        detach_pending: false,
        queued: VecDeque::new(),
        // (Nothing but init runs yet.)
        approved: crate::reroot::Approved::now(),
    };
    loop {
        let (listen_ready, sig_ready, conn_ready, conn_err) = {
            let mut fds =
                vec![PollFd::new(listener.as_fd(), PollFlags::POLLIN), PollFd::new(sigfd.as_fd(), PollFlags::POLLIN)];
            if let Some(c) = &st.conn {
                fds.push(PollFd::new(c.as_fd(), PollFlags::POLLIN));
            }
            match poll(&mut fds, PollTimeout::NONE) {
                Ok(_) => {}
                Err(Errno::EINTR) => continue,
                Err(_) => exit_now(1),
            }
            let r = |i: usize| fds.get(i).and_then(|f| f.revents()).unwrap_or(PollFlags::empty());
            (
                r(0).contains(PollFlags::POLLIN),
                r(1).contains(PollFlags::POLLIN),
                r(2).contains(PollFlags::POLLIN),
                r(2).intersects(PollFlags::POLLHUP | PollFlags::POLLERR | PollFlags::POLLNVAL),
            )
        };
        if sig_ready {
            while let Ok(Some(_)) = sigfd.read_signal() {}
            st.reap();
        }
        if conn_ready || conn_err {
            st.serve_one(&sigfd);
        }
        if listen_ready && let Ok(conn) = rustix::net::accept_with(&listener, SocketFlags::CLOEXEC) {
            st.conn = Some(conn); // replaces (and closes) the old connection
        }
    }
}

impl Init {
    /// Reply `Ok`, or the error of `res`.
    fn reply_done(&mut self, id: u64, res: Result<(), String>) {
        let reply = match res {
            Ok(()) => Reply::Ok,
            Err(message) => Reply::Error { message, code: None },
        };
        self.send(FromInit::Reply { id, reply }, &[]);
    }

    fn send(&mut self, msg: FromInit, fds: &[std::os::fd::BorrowedFd<'_>]) {
        if let Some(c) = &self.conn {
            if protocol::send(c.as_fd(), &msg, fds).is_ok() {
                return;
            }
            self.conn = None;
        }
        if matches!(msg, FromInit::Exited { .. }) && self.queued.len() < MAX_QUEUED {
            self.queued.push_back(msg);
        }
    }

    fn reap(&mut self) {
        loop {
            // __WALL: restored processes are clone children without an exit signal.
            let flags = WaitPidFlag::WNOHANG | WaitPidFlag::__WALL;
            let (pid, code, signal) = match waitpid(Pid::from_raw(-1), Some(flags)) {
                Ok(WaitStatus::Exited(pid, code)) => (pid.as_raw(), Some(code), None),
                Ok(WaitStatus::Signaled(pid, sig, _)) => (pid.as_raw(), None, Some(sig as i32)),
                Ok(WaitStatus::StillAlive) | Err(_) => return,
                Ok(_) => continue,
            };
            self.exited(crate::reroot::Reaped { pid, code, signal });
        }
    }

    /// Report an exit (or, for a pid being restored, start tracking its
    /// successor).
    fn exited(&mut self, r: crate::reroot::Reaped) {
        self.awaiting.remove(&r.pid);
        if self.restoring.remove(&r.pid).is_some() {
            self.tracked.insert(r.pid);
        } else if self.tracked.remove(&r.pid) {
            self.send(FromInit::Exited { pid: r.pid, code: r.code, signal: r.signal }, &[]);
        }
    }

    /// Kill for a rollback: `restore` pids still present become
    /// `restoring` (their old exit is swallowed), absent ones are tracked
    /// at once.
    fn kill_for_rollback(&mut self, keep: &[i32], restore: &[i32], members: Option<OwnedFd>) {
        // Start times before the kill: a read of a dying process's
        // `/proc/<pid>/stat` took 0.7-3 ms in one rollback of ten here
        // (`perf trace`), on the rollback's path.
        let started: std::collections::HashMap<i32, Option<u64>> = restore
            .iter()
            .filter(|p| !self.restoring.contains_key(p))
            .map(|&p| (p, sandtree_sys::process::start_time(p)))
            .collect();
        let mut present = crate::reroot::signal_all(keep, members.as_ref());
        // (The daemon's fd reaches outside the sandbox: not kept.)
        drop(members);
        // A pid to restore whose original is a zombie, or is not a member
        // of the cgroup (its exit must not be reported for its successor).
        for (&pid, started) in &started {
            if started.is_some() && !present.contains(&pid) && kill(Pid::from_raw(pid), Signal::SIGKILL).is_ok() {
                present.push(pid);
            }
        }
        self.awaiting.extend(present.iter().filter(|p| !restore.contains(p)));
        for &pid in restore {
            if self.restoring.contains_key(&pid) {
                continue;
            }
            self.tracked.remove(&pid);
            if present.contains(&pid) {
                self.restoring.insert(pid, started.get(&pid).copied().flatten());
            } else {
                self.tracked.insert(pid);
            }
        }
    }

    fn serve_one(&mut self, sigfd: &SignalFd) {
        let Some(conn) = &self.conn else { return };
        let (msg, fds) = match protocol::recv::<ToInit>(conn.as_fd()) {
            Ok(Some(m)) => m,
            Ok(None) => {
                self.conn = None;
                return;
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock || e.kind() == std::io::ErrorKind::Interrupted => {
                return;
            }
            Err(e) if e.kind() == std::io::ErrorKind::InvalidData => {
                self.send(
                    FromInit::Reply { id: 0, reply: Reply::Error { message: format!("bad request: {e}"), code: None } },
                    &[],
                );
                return;
            }
            Err(_) => {
                self.conn = None;
                return;
            }
        };
        let id = msg.id;
        // (Always `WaitGone` after a `Reroot`; anything else finishes the
        // swap first.)
        if !matches!(msg.req, Request::WaitGone | Request::SetLastPid { .. }) {
            self.finish_swap();
        }
        match msg.req {
            Request::Hello { .. } => {
                self.send(FromInit::Reply { id, reply: Reply::Hello { version: protocol::VERSION } }, &[]);
                while let Some(ev) = self.queued.pop_front() {
                    self.send(ev, &[]);
                    if self.conn.is_none() {
                        break;
                    }
                }
            }
            Request::Ping => self.send(FromInit::Reply { id, reply: Reply::Pong }, &[]),
            Request::SetLastPid { pid } => {
                let reply = match std::fs::write("/proc/sys/kernel/ns_last_pid", pid.to_string()) {
                    Ok(()) => Reply::Ok,
                    Err(e) => Reply::Error { message: format!("write ns_last_pid: {e}"), code: e.raw_os_error() },
                };
                self.send(FromInit::Reply { id, reply }, &[]);
            }
            Request::Reroot { targets, keep, restore, members } => {
                let mut layers = fds;
                let members = if members { layers.pop() } else { None };
                let swapped = self.reroot(&targets, &keep, &restore, layers, members);
                let reply = match &swapped {
                    Ok(()) => Reply::Ok,
                    Err(message) => Reply::Error { message: message.clone(), code: None },
                };
                self.send(FromInit::Reply { id, reply }, &[]);
                // The old tree goes at the first request after the
                // `WaitGone` that follows (the daemon sends one once the
                // restore is over): until then init reaps (a killed
                // original's pid is free, for its restored successor, only
                // once reaped), and the detach, an overlay's teardown (up
                // to milliseconds), is on no one's path.
                self.reap();
                self.detach_pending = swapped.is_ok();
            }
            Request::Restack { targets, keep } => {
                let res = crate::reroot::restack(&targets, &keep, fds, &mut self.approved);
                let reply = match &res {
                    Ok(()) => Reply::Ok,
                    Err((message, code)) => Reply::Error { message: message.clone(), code: *code },
                };
                self.send(FromInit::Reply { id, reply }, &[]);
                // (At once: no process was killed.)
                self.detach_pending = res.is_ok();
                self.finish_swap();
            }
            Request::Stage { targets } => {
                let reply = match crate::reroot::stage(&targets, fds, &self.approved) {
                    Ok(()) => Reply::Ok,
                    Err((message, code)) => Reply::Error { message, code },
                };
                self.send(FromInit::Reply { id, reply }, &[]);
            }
            Request::Unstage => self.reply_done(id, crate::reroot::unstage()),
            Request::SwapStaged => {
                let swapped = crate::reroot::swap_staged(&mut self.approved);
                let ok = swapped.is_ok();
                self.reply_done(id, swapped);
                if ok && let Err(e) = crate::reroot::detach_staged_old() {
                    // The new tree is in place; the old one stays mounted
                    // (under /dev) until init exits.
                    eprintln!("sandtree init: {e}");
                }
            }
            Request::KillAll { keep, restore, members } => {
                let members = if members { fds.into_iter().next() } else { None };
                self.kill_for_rollback(&keep, &restore, members);
                self.send(FromInit::Reply { id, reply: Reply::Ok }, &[]);
            }
            Request::WaitGone => {
                let res = self.wait_gone(sigfd);
                let reply = match res {
                    Ok(()) => Reply::Ok,
                    Err(message) => Reply::Error { message, code: None },
                };
                // (The old tree stays until the next request: the daemon
                // sends one once the restore is over.)
                self.send(FromInit::Reply { id, reply }, &[]);
            }
            Request::Kill { pid, signal, group } => {
                let target = Pid::from_raw(if group { -pid } else { pid });
                let reply = match Signal::try_from(signal)
                    .map_err(|e| e.to_string())
                    .and_then(|s| kill(target, s).map_err(|e| e.to_string()))
                {
                    Ok(()) => Reply::Ok,
                    Err(message) => Reply::Error { message: format!("kill {pid}: {message}"), code: None },
                };
                self.send(FromInit::Reply { id, reply }, &[]);
            }
            Request::Spawn { argv, env, cwd, stdio, setsid, pgid, user } => {
                match spawn(&argv, &env, &cwd, &stdio, (setsid, pgid, user.as_deref()), fds) {
                    Ok((pid, master)) => {
                        self.tracked.insert(pid);
                        let fds: Vec<_> = master.iter().map(|m| m.as_fd()).collect();
                        self.send(FromInit::Reply { id, reply: Reply::Spawned { pid } }, &fds);
                    }
                    Err((message, code)) => {
                        self.send(FromInit::Reply { id, reply: Reply::Error { message, code } }, &[])
                    }
                }
            }
        }
    }
}

impl Init {
    /// Reap until every process killed for the rollback is gone (see
    /// [`crate::reroot::wait_gone`]).
    /// The killed originals of restored pids are awaited too (the
    /// daemon's restore retries their pids until then).
    fn wait_gone(&mut self, sigfd: &SignalFd) -> Result<(), String> {
        let mut awaiting = std::mem::take(&mut self.awaiting);
        let restoring = self.restoring.clone();
        awaiting.extend(restoring.keys());
        // Gone once reaped, by init or (a parent that ignores SIGCHLD) by
        // the kernel: a restoring pid may already name the restored
        // process, another start time.
        let present = |pid: i32| match restoring.get(&pid) {
            Some(start) => start.is_some() && sandtree_sys::process::start_time(pid) == *start,
            None => std::path::Path::new(&format!("/proc/{pid}")).exists(),
        };
        let mut reaped = Vec::new();
        let res = crate::reroot::wait_gone(sigfd, &mut awaiting, &mut reaped, &present);
        awaiting.retain(|p| !restoring.contains_key(p));
        self.awaiting = awaiting;
        for r in reaped {
            self.exited(r);
        }
        // (Reaped by the kernel: the pid is the restored process's.)
        let gone: Vec<i32> =
            restoring.keys().copied().filter(|p| self.restoring.contains_key(p) && !present(*p)).collect();
        for pid in gone {
            self.restoring.remove(&pid);
            self.tracked.insert(pid);
        }
        res
    }

    /// Detach the old root of a rollback or a `Restack`, if that is still
    /// to be done. The new tree is in place and in use by then: an old root
    /// that cannot be detached stays stacked on `/`, where no path walk
    /// reaches it, until init exits.
    fn finish_swap(&mut self) {
        if std::mem::take(&mut self.detach_pending)
            && let Err(e) = crate::reroot::detach_old_root()
        {
            eprintln!("sandtree init: {e}");
        }
    }

    /// See [`crate::reroot`]: exits of tracked processes are reported before
    /// the reply.
    fn reroot(
        &mut self,
        targets: &[PathBuf],
        keep: &[i32],
        restore: &[i32],
        layers: Vec<OwnedFd>,
        members: Option<OwnedFd>,
    ) -> Result<(), String> {
        crate::reroot::validate(targets, &layers)?;
        // Stragglers since `KillAll` (or all of them, without one); the
        // daemon brings `restore` back from templates after the reply.
        self.kill_for_rollback(keep, restore, members);
        let swapped = crate::reroot::swap_root(targets, layers, &mut self.approved);
        // Those already dead (a process with an mm holder dies at once) are
        // reaped before the reply: their pids are free for the restore,
        // which otherwise retries until the `WaitGone` that follows. Each
        // by its pid: a `waitpid(-1)` walks every child, the pool's
        // hundreds of templates among them (~40 µs a call), and ends only
        // with a call that finds none; the others after the reply.
        let killed: Vec<i32> = self.restoring.keys().chain(self.awaiting.iter()).copied().collect();
        for pid in killed {
            if let Some(r) = crate::reroot::reap_one(pid) {
                self.exited(r);
            }
        }
        swapped
    }
}

/// Look `name` up in the colon-separated `path`.
fn resolve(name: &str, path: &str) -> Option<PathBuf> {
    let is_exec =
        |p: &Path| fs::metadata(p).map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0).unwrap_or(false);
    if name.contains('/') {
        let p = PathBuf::from(name);
        return is_exec(&p).then_some(p);
    }
    path.split(':').filter(|d| !d.is_empty()).map(|d| Path::new(d).join(name)).find(|p| is_exec(p))
}

type SpawnResult = Result<(i32, Option<OwnedFd>), (String, Option<i32>)>;

fn cstr(s: &str) -> Result<CString, (String, Option<i32>)> {
    CString::new(s).map_err(|_| (format!("argument contains nul byte: {s:?}"), Some(126)))
}

fn spawn(
    argv: &[String],
    env: &[(String, String)],
    cwd: &str,
    stdio: &StdioSpec,
    (setsid, pgid, user): (bool, bool, Option<&str>),
    mut fds: Vec<OwnedFd>,
) -> SpawnResult {
    let name = argv.first().ok_or_else(|| ("empty argv".to_string(), Some(127)))?;
    let path_var = env.iter().rev().find(|(k, _)| k == "PATH").map(|(_, v)| v.as_str()).unwrap_or("/usr/bin:/bin");
    let prog = resolve(name, path_var).ok_or_else(|| (format!("command not found: {name}"), Some(127)))?;
    let prog_c = cstr(prog.to_str().unwrap_or(name))?;
    let argv_c = argv.iter().map(|a| cstr(a)).collect::<Result<Vec<_>, _>>()?;
    let account = user.map(crate::users::look_up).transpose().map_err(|e| (e, Some(126)))?;
    let mut env = env.to_vec();
    let home = account.is_some() && cwd.is_empty();
    let cwd = match &account {
        Some(a) => {
            // The user's HOME, USER and LOGNAME, unless the request set them.
            for (k, v) in [("HOME", &a.home), ("USER", &a.name), ("LOGNAME", &a.name)] {
                if !env.iter().any(|(ek, _)| ek == k) {
                    env.push((k.to_string(), v.clone()));
                }
            }
            if cwd.is_empty() { a.home.as_str() } else { cwd }
        }
        None => cwd,
    };
    let env_c = env.iter().map(|(k, v)| cstr(&format!("{k}={v}"))).collect::<Result<Vec<_>, _>>()?;
    let cwd_c = cstr(cwd)?;

    let (master, child_stdio): (Option<OwnedFd>, [OwnedFd; 3]) = match stdio {
        StdioSpec::Fds => {
            if fds.len() != 3 {
                return Err((format!("expected 3 stdio fds, got {}", fds.len()), None));
            }
            let err = fds.pop().expect("len 3");
            let out = fds.pop().expect("len 3");
            let inp = fds.pop().expect("len 3");
            (None, [inp, out, err])
        }
        StdioSpec::Pty { cols, rows } => {
            let pair = sandtree_sys::pty::open_pair().map_err(|e| (format!("open pty: {e}"), None))?;
            let _ = sandtree_sys::pty::set_size(&pair.master, *cols, *rows);
            // The terminal of a user's shell is the user's (as `login`
            // makes it): it may open it again, as a restore does.
            if let Some(a) = &account {
                let (u, g) = (Some(rustix::fs::Uid::from_raw(a.uid)), Some(rustix::fs::Gid::from_raw(a.gid)));
                rustix::fs::fchown(&pair.slave, u, g).map_err(|e| (format!("chown of the pty: {e}"), None))?;
            }
            let dup = |fd: &OwnedFd| fd.try_clone().map_err(|e| (format!("dup pty: {e}"), None));
            let (a, b) = (dup(&pair.slave)?, dup(&pair.slave)?);
            (Some(pair.master), [pair.slave, a, b])
        }
    };
    let is_pty = master.is_some();
    let (err_rx, err_tx) =
        rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC).map_err(|e| (format!("pipe: {e}"), None))?;

    let forked = match fork_single_threaded() {
        // The sandbox's pids cgroup is full (or RLIMIT_NPROC): said apart,
        // so the daemon can name the limit.
        Err(sandtree_sys::process::Error::Sys { source, .. })
            if source.raw_os_error() == Some(nix::errno::Errno::EAGAIN as i32) =>
        {
            return Err((protocol::TASK_LIMIT.to_string(), None));
        }
        other => other.map_err(|e| (format!("fork: {e}"), None))?,
    };
    match forked {
        Forked::Child => {
            drop(err_rx);
            let mut err = fs::File::from(err_tx);
            let fail = |err: &mut fs::File, msg: String| -> ! {
                let _ = err.write_all(msg.as_bytes());
                exit_now(126)
            };
            if setsid {
                let _ = nix::unistd::setsid();
            } else if pgid {
                let _ = nix::unistd::setpgid(Pid::from_raw(0), Pid::from_raw(0));
            }
            if is_pty && let Err(e) = sandtree_sys::pty::make_controlling(&child_stdio[0]) {
                fail(&mut err, format!("set controlling tty: {e}"));
            }
            let [i, o, e] = &child_stdio;
            if rustix::stdio::dup2_stdin(i)
                .and(rustix::stdio::dup2_stdout(o))
                .and(rustix::stdio::dup2_stderr(e))
                .is_err()
            {
                fail(&mut err, "dup2 stdio failed".into());
            }
            // The user's groups and ids, before the working directory
            // (entered with its rights).
            if let Some(a) = &account
                && let Err(e) = crate::users::become_user(a)
            {
                fail(&mut err, format!("run as user {}: {e}", a.name));
            }
            // (A home that does not exist, as `nobody`'s `/nonexistent`:
            // `/`, as `su` does.)
            if let Err(e) = nix::unistd::chdir(cwd_c.as_c_str())
                && !(home && nix::unistd::chdir("/").is_ok())
            {
                fail(&mut err, format!("chdir {cwd}: {}", e.desc().to_lowercase()));
            }
            sandtree_sys::process::reset_all_signals();
            let _ = sigprocmask(SigmaskHow::SIG_SETMASK, Some(&SigSet::empty()), None);
            let e = nix::unistd::execve(&prog_c, &argv_c, &env_c).unwrap_err();
            fail(&mut err, format!("exec {}: {}", prog.display(), e.desc().to_lowercase()))
        }
        Forked::Parent(pid) => {
            drop(err_tx);
            drop(child_stdio);
            let mut msg = String::new();
            let _ = fs::File::from(err_rx).read_to_string(&mut msg);
            if !msg.is_empty() {
                return Err((msg, Some(126)));
            }
            Ok((pid, master))
        }
    }
}
