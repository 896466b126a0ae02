//! Running commands in a sandbox: one-shot `exec`, streaming `exec_stream`
//! and background processes.
//!
//! Flow of one command:
//! 1. the daemon creates three pipes and sends `Spawn` to init with the
//!    child ends attached (`SCM_RIGHTS`), then closes its copies of them;
//! 2. init forks/execs (see [`crate::init`]) and replies `Spawned { pid }`;
//! 3. the daemon writes stdin (then closes it) and drains stdout/stderr
//!    until EOF, keeping at most `max_output_bytes` per stream but always
//!    reading on, so a flooding process is never blocked on a full pipe;
//!    stdin is either bytes given up front or a [`StdinStream`] of chunks
//!    written as they come (a broken-off stream kills the process group,
//!    even while a write waits on a program that does not read: an
//!    interrupted upload must not look like the end of the input);
//! 4. init reports `Exited`; on timeout the daemon sends `Kill` for the
//!    process group (`SIGKILL`) first. After the exit, output is drained for
//!    a short grace period (a daemonised grandchild may hold the pipes).
//!
//! `exec_stream` hands output over through a bounded channel: a consumer
//! slower than the process holds the process back (pipe backpressure)
//! instead of piling output up in memory, and the grace period after the
//! exit counts only time spent waiting on the pipes, never time spent
//! waiting on that consumer, so no output is lost to a slow client.

use std::collections::{HashMap, VecDeque};
use std::os::fd::{AsFd, OwnedFd};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::unix::pipe;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;

use crate::protocol::{Reply, Request, StdioSpec};
use crate::sandbox::{Conn, Error, Result, Sandbox, io_err};

/// Default `PATH` inside sandboxes.
pub const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
/// Output kept per background process stream.
pub const BACKGROUND_RING: usize = 1024 * 1024;
const DRAIN_GRACE: Duration = Duration::from_millis(200);
/// Output chunks `exec_stream` holds for a slow consumer (64 KiB each).
const STREAM_CHUNKS: usize = 16;

/// Stdin fed chunk by chunk (e.g. from an HTTP request body), made by
/// [`stdin_channel`]. The end of the stream (its [`StdinSender`] dropped)
/// closes the program's stdin; [`StdinSender::break_off`] kills the
/// program's process group instead, at once, out of band of the chunks
/// still queued. The stream is dropped as soon as the program closes its
/// stdin or exits: the sender sees the channel closed.
pub struct StdinStream {
    chunks: mpsc::Receiver<Vec<u8>>,
    broken: oneshot::Receiver<String>,
}

impl std::fmt::Debug for StdinStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StdinStream").field("queued", &self.chunks.len()).finish_non_exhaustive()
    }
}

/// The feeding side of a [`StdinStream`].
pub struct StdinSender {
    chunks: mpsc::Sender<Vec<u8>>,
    broken: Option<oneshot::Sender<String>>,
}

/// A stream of stdin that holds at most `chunks` chunks in flight.
pub fn stdin_channel(chunks: usize) -> (StdinSender, StdinStream) {
    let (tx, rx) = mpsc::channel(chunks);
    let (broke, broken) = oneshot::channel();
    (StdinSender { chunks: tx, broken: Some(broke) }, StdinStream { chunks: rx, broken })
}

impl StdinSender {
    /// Queues a chunk; false once the program no longer reads.
    pub async fn send(&self, chunk: Vec<u8>) -> bool {
        self.chunks.send(chunk).await.is_ok()
    }

    /// The input broke off (`why`): the program is killed.
    pub fn break_off(mut self, why: String) {
        if let Some(b) = self.broken.take() {
            let _ = b.send(why);
        }
    }
}

/// Where a command's stdin comes from.
enum Stdin {
    /// These bytes (or nothing), then end of file.
    Bytes(Option<Vec<u8>>),
    /// Chunks as they come.
    Stream(StdinStream),
}

/// How a process ended.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExitInfo {
    /// Exit status.
    pub code: Option<i32>,
    /// Killing signal.
    pub signal: Option<i32>,
}

/// A command to run.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ExecRequest {
    /// Argument vector.
    pub argv: Vec<String>,
    /// Environment overrides on top of the defaults.
    pub env: Vec<(String, String)>,
    /// Working directory (default `/root`, or `user`'s home).
    pub cwd: Option<String>,
    /// The user to run as (a name or a uid, looked up by init in the
    /// sandbox's `/etc/passwd`; default root).
    pub user: Option<String>,
    /// Data for stdin (None = empty stdin).
    pub stdin: Option<Vec<u8>>,
    /// Kill the process group after this long.
    pub timeout: Option<Duration>,
    /// Bytes kept per stream.
    pub max_output_bytes: usize,
}

impl ExecRequest {
    /// A request with defaults (1 MiB output, no timeout).
    pub fn new<S: Into<String>>(argv: impl IntoIterator<Item = S>) -> Self {
        ExecRequest {
            argv: argv.into_iter().map(Into::into).collect(),
            env: Vec::new(),
            cwd: None,
            user: None,
            stdin: None,
            timeout: None,
            max_output_bytes: 1024 * 1024,
        }
    }
}

/// Result of `exec`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ExecOutput {
    /// In-sandbox pid.
    pub pid: i32,
    /// Exit status.
    pub exit_code: Option<i32>,
    /// Killing signal.
    pub signal: Option<i32>,
    /// Captured stdout.
    pub stdout: Vec<u8>,
    /// Captured stderr.
    pub stderr: Vec<u8>,
    /// Stdout exceeded the limit.
    pub stdout_truncated: bool,
    /// Stderr exceeded the limit.
    pub stderr_truncated: bool,
    /// Killed by the timeout.
    pub timed_out: bool,
    /// Wall time.
    pub duration: Duration,
}

/// One event of `exec_stream`.
#[derive(Clone, Debug)]
pub enum ExecEvent {
    /// Stdout bytes.
    Stdout(Vec<u8>),
    /// Stderr bytes.
    Stderr(Vec<u8>),
    /// The process ended (last event); `timed_out` when the timeout killed it.
    Exit { exit: ExitInfo, timed_out: bool },
}

/// Streaming output of a command.
#[derive(Debug)]
pub struct ExecStream {
    /// In-sandbox pid.
    pub pid: i32,
    rx: mpsc::Receiver<ExecEvent>,
}

impl ExecStream {
    /// Next event; `None` after `Exit`.
    pub async fn next(&mut self) -> Option<ExecEvent> {
        self.rx.recv().await
    }
}

/// A background process.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ProcessInfo {
    /// In-sandbox pid.
    pub pid: i32,
    /// Command.
    pub argv: Vec<String>,
    /// Start time, seconds since the epoch.
    pub started_at: u64,
    /// Exit, once it ended.
    pub exit: Option<ExitInfo>,
}

impl ProcessInfo {
    /// Whether it still runs.
    pub fn running(&self) -> bool {
        self.exit.is_none()
    }
}

#[derive(Default)]
struct Ring {
    data: VecDeque<u8>,
}

impl Ring {
    fn push(&mut self, bytes: &[u8]) {
        self.data.extend(bytes);
        let excess = self.data.len().saturating_sub(BACKGROUND_RING);
        self.data.drain(..excess);
    }
}

struct Background {
    info: ProcessInfo,
    /// Bumped when the process is restored from a template (same pid, new
    /// process): an exit waiter of an older incarnation must not mark it.
    incarnation: u64,
    stdout: Ring,
    stderr: Ring,
    /// How many of its two output pumps have ended (their pipe closed).
    pumped: watch::Receiver<u8>,
    /// Its output pipes (stdout, stderr), named without being opened
    /// (`O_PATH`): a rollback that restores the process opens their read
    /// ends again through them (see [`Sandbox::revive_background`]).
    outputs: Option<[OwnedFd; 2]>,
    /// Its output pumps, ended by a rollback that restores it.
    pumps: Vec<tokio::task::AbortHandle>,
    /// The read ends opened again by a rollback, pumped once the process
    /// is back ([`Sandbox::resume_restored_io`]).
    reopened: Option<[OwnedFd; 2]>,
}

/// Background processes of one sandbox handle.
#[derive(Default)]
pub(crate) struct BackgroundTable {
    procs: Arc<Mutex<HashMap<i32, Background>>>,
    tasks: Mutex<Vec<JoinHandle<()>>>,
    /// Output pipes of background processes a rollback forgot
    /// ([`BackgroundTable::forget`]), still read (and dropped).
    detached: Mutex<Vec<Detached>>,
}

/// An output pipe of a forgotten background process, which a process of a
/// checkpoint may have inherited: read and dropped, and held across each
/// rollback like a background process's ([`BackgroundTable::hold_output`]).
struct Detached {
    /// The pipe, named (`O_PATH`).
    path: OwnedFd,
    /// Its read end held by a rollback, pumped once the restore is over.
    reopened: Option<OwnedFd>,
    /// Its pump.
    pump: Option<tokio::task::AbortHandle>,
}

/// Record the exit of background `pid` (of this incarnation).
fn watch_exit(
    conn: Arc<Conn>,
    procs: Arc<Mutex<HashMap<i32, Background>>>,
    pid: i32,
    incarnation: u64,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let exit = conn.wait_pid(pid).await.unwrap_or(ExitInfo { code: None, signal: None });
        // The exit is reported once its output is in the rings: a client
        // that polls until the process exited, then reads its output, gets
        // all of it. (Bounded: a child that inherited the pipes keeps them
        // open after the process exits.)
        let pumped = procs.lock().unwrap_or_else(|e| e.into_inner()).get(&pid).map(|bg| bg.pumped.clone());
        if let Some(mut pumped) = pumped {
            let _ = tokio::time::timeout(DRAIN_GRACE, pumped.wait_for(|n| *n >= 2)).await;
        }
        if let Some(bg) = procs.lock().unwrap_or_else(|e| e.into_inner()).get_mut(&pid)
            && bg.incarnation == incarnation
        {
            bg.info.exit = Some(exit);
        }
    })
}

impl BackgroundTable {
    /// A rollback is about to kill background processes `pids` (every one:
    /// one it does not restore may have passed its pipes on to one it
    /// does): read ends of their output pipes, opened again through the
    /// `O_PATH`s kept for them (see [`Sandbox::revive_background`]), and
    /// the old pumps ended (what the process writes from now on waits in
    /// the pipe for the new ones; the old ones would only wake up to read
    /// the end of file of the kill, on the rollback's CPUs). A second call
    /// opens nothing more.
    pub(crate) fn hold_output(&self, pids: &[i32]) {
        for d in self.detached.lock().unwrap_or_else(|e| e.into_inner()).iter_mut() {
            if d.reopened.is_none() {
                d.reopened = reopen_output(&d.path).ok();
                if let Some(p) = d.pump.take().filter(|_| d.reopened.is_some()) {
                    p.abort();
                }
            }
        }
        let mut procs = self.procs.lock().unwrap_or_else(|e| e.into_inner());
        for pid in pids {
            let Some(bg) = procs.get_mut(pid).filter(|bg| bg.reopened.is_none()) else { continue };
            bg.reopened = match &bg.outputs {
                Some([o, e]) => match (reopen_output(o), reopen_output(e)) {
                    (Ok(o), Ok(e)) => Some([o, e]),
                    (Err(err), _) | (_, Err(err)) => {
                        tracing::warn!(pid, "output of a restored background process lost: {err}");
                        None
                    }
                },
                None => None,
            };
            // (Only once ours are open: with none, the old ones go on.)
            if bg.reopened.is_some() {
                for p in bg.pumps.drain(..) {
                    p.abort();
                }
            }
        }
    }

    /// Pump background process `pid`'s output pipes into its rings, from
    /// now on (a new count of ended pumps).
    fn pump_output(&self, pid: i32, stdout: pipe::Receiver, stderr: pipe::Receiver) -> [JoinHandle<()>; 2] {
        let (pumped_tx, pumped) = watch::channel(0u8);
        let pumped_tx = Arc::new(pumped_tx);
        let pump_to = |rx, is_out: bool| {
            let (procs, done) = (self.procs.clone(), pumped_tx.clone());
            let sink = move |b: &[u8]| {
                if let Some(bg) = procs.lock().unwrap_or_else(|e| e.into_inner()).get_mut(&pid) {
                    if is_out { bg.stdout.push(b) } else { bg.stderr.push(b) }
                }
            };
            tokio::spawn(async move {
                pump(rx, sink).await;
                done.send_modify(|n| *n += 1);
            })
        };
        let pumps = [pump_to(stdout, true), pump_to(stderr, false)];
        if let Some(bg) = self.procs.lock().unwrap_or_else(|e| e.into_inner()).get_mut(&pid) {
            bg.pumped = pumped;
            bg.pumps = pumps.iter().map(|p| p.abort_handle()).collect();
        }
        pumps
    }

    pub(crate) fn abort_all(&self) {
        for t in self.tasks.lock().unwrap_or_else(|e| e.into_inner()).drain(..) {
            t.abort();
        }
    }

    pub(crate) fn pids(&self) -> Vec<i32> {
        self.procs.lock().unwrap_or_else(|e| e.into_inner()).keys().copied().collect()
    }

    /// Forgets these processes (they were killed). Their output pumps end
    /// by themselves when the pipes close. Read ends a rollback held for
    /// them ([`BackgroundTable::hold_output`]) stay held, and are read and
    /// dropped once the restore is over ([`Sandbox::resume_restored_io`]):
    /// a process of the checkpoint that inherited the pipes (a server its
    /// shell started, the shell gone) may be restored and write to them.
    /// (Read before, they would end at once, the killed writer gone, and
    /// the restored one would find no reader.)
    pub(crate) fn forget(&self, pids: &[i32]) {
        let mut procs = self.procs.lock().unwrap_or_else(|e| e.into_inner());
        let mut detached = self.detached.lock().unwrap_or_else(|e| e.into_inner());
        for pid in pids {
            let Some(bg) = procs.remove(pid) else { continue };
            if let (Some(paths), Some(reopened)) = (bg.outputs, bg.reopened) {
                for (path, fd) in paths.into_iter().zip(reopened) {
                    detached.push(Detached { path, reopened: Some(fd), pump: None });
                }
            }
        }
    }
}

#[derive(Default)]
struct Capture {
    data: Vec<u8>,
    truncated: bool,
}

/// Root's HOME, the default of a process started as root; none as another
/// `user`, whose HOME (with USER and LOGNAME) init sets from its account.
pub(crate) fn default_home(user: Option<&String>) -> Option<(&'static str, &'static str)> {
    user.is_none().then_some(("HOME", "/root"))
}

/// The working directory a spawn asks for: `cwd`, else `/root`, or, as
/// another `user`, nothing (init takes the user's home).
pub(crate) fn spawn_cwd(cwd: Option<&String>, user: Option<&String>) -> String {
    match (cwd, user) {
        (Some(cwd), _) => cwd.clone(),
        (None, Some(_)) => String::new(),
        (None, None) => "/root".into(),
    }
}

fn build_env(req: &ExecRequest, extra: &[(&str, &str)]) -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> = [("PATH", DEFAULT_PATH), ("LANG", "C.UTF-8")]
        .iter()
        .chain(default_home(req.user.as_ref()).as_slice())
        .chain(extra)
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    for (k, v) in &req.env {
        env.retain(|(ek, _)| ek != k);
        env.push((k.clone(), v.clone()));
    }
    env
}

/// The file behind descriptor `fd` of ours opened again with `flags`
/// (close-on-exec), through `/proc/self/fd`: an `O_PATH` naming a pipe,
/// or a read end of the pipe an `O_PATH` names.
fn open_again(fd: &impl std::os::fd::AsRawFd, flags: rustix::fs::OFlags) -> rustix::io::Result<OwnedFd> {
    let path = format!("/proc/self/fd/{}", fd.as_raw_fd());
    rustix::fs::open(path, flags | rustix::fs::OFlags::CLOEXEC, rustix::fs::Mode::empty())
}

/// A read end of the pipe `path` names (`O_PATH`), opened again.
fn reopen_output(path: &OwnedFd) -> rustix::io::Result<OwnedFd> {
    open_again(path, rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::NONBLOCK)
}

/// A pipe for a program's stdio, owned by the sandbox's root (host uid
/// `owner`), as if the sandbox had made it: the process engine opens a pipe
/// end again inside the sandbox at a restore (through `/proc/self/fd`),
/// which a pipe of the host's root (unmapped there) would refuse. Mode
/// 0666, so that a program that runs as another user (or drops to one)
/// may open it again too: only a process that may look into the fd table
/// of one holding the pipe reaches it there.
fn pipe_pair(owner: u32) -> Result<(OwnedFd, OwnedFd)> {
    let (r, w) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC).map_err(|e| io_err("pipe")(e.into()))?;
    let id = Some(rustix::process::Uid::from_raw(owner));
    let gid = Some(rustix::process::Gid::from_raw(owner));
    rustix::fs::fchown(&r, id, gid).map_err(|e| io_err("chown of a pipe")(e.into()))?;
    rustix::fs::fchmod(&r, rustix::fs::Mode::from_raw_mode(0o666)).map_err(|e| io_err("chmod of a pipe")(e.into()))?;
    Ok((r, w))
}

async fn pump(rx: pipe::Receiver, mut sink: impl FnMut(&[u8])) {
    let mut rx = rx;
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match rx.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => sink(&buf[..n]),
        }
    }
}

/// Where the output of a command in the foreground goes.
enum Sink {
    /// Kept up to `max` bytes, the rest read and dropped.
    Capture(Arc<Mutex<Capture>>, usize),
    /// Sent as events (stdout when `true`); once the consumer is gone, read and dropped.
    Events(mpsc::Sender<ExecEvent>, bool),
}

impl Sink {
    async fn put(&mut self, b: &[u8]) {
        match self {
            Sink::Capture(cap, max) => {
                let mut c = cap.lock().unwrap_or_else(|e| e.into_inner());
                let room = max.saturating_sub(c.data.len());
                if b.len() > room {
                    c.truncated = true;
                }
                c.data.extend_from_slice(&b[..room.min(b.len())]);
            }
            Sink::Events(tx, is_out) => {
                if tx.is_closed() {
                    return;
                }
                let ev = if *is_out { ExecEvent::Stdout(b.to_vec()) } else { ExecEvent::Stderr(b.to_vec()) };
                let _ = tx.send(ev).await;
            }
        }
    }
}

/// Reads a foreground command's output pipe to its end into `sink`. Once
/// `exited` turns true, it stops after [`DRAIN_GRACE`] spent waiting on the
/// pipe (a daemonised grandchild may hold it open); time spent waiting for
/// the sink (a slow consumer) does not count.
async fn drain(mut rx: pipe::Receiver, mut sink: Sink, mut exited: watch::Receiver<bool>) {
    let mut buf = vec![0u8; 64 * 1024];
    let mut exit_at: Option<Instant> = None;
    let mut sink_time = Duration::ZERO;
    loop {
        let read = match exit_at {
            None => tokio::select! {
                r = rx.read(&mut buf) => r,
                // (Reads of a pipe are cancel-safe: nothing is lost.)
                _ = exited.wait_for(|e| *e) => {
                    exit_at = Some(Instant::now());
                    continue;
                }
            },
            Some(t) => {
                let Some(left) = DRAIN_GRACE.checked_sub(t.elapsed().saturating_sub(sink_time)) else {
                    break;
                };
                match tokio::time::timeout(left, rx.read(&mut buf)).await {
                    Ok(r) => r,
                    Err(_) => break,
                }
            }
        };
        let n = match read {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let t = Instant::now();
        sink.put(&buf[..n]).await;
        if exit_at.is_some() {
            sink_time += t.elapsed();
        }
    }
}

/// Writes `stdin` into the program's stdin pipe, then closes it.
async fn feed(conn: Arc<Conn>, pid: i32, mut pipe: pipe::Sender, stdin: Stdin) {
    match stdin {
        Stdin::Bytes(None) => {}
        Stdin::Bytes(Some(data)) => {
            let _ = pipe.write_all(&data).await;
        }
        Stdin::Stream(StdinStream { mut chunks, mut broken }) => {
            // `Some(why)`: broken off; `None`: the stream ended (its
            // sender dropped, the queued chunks written), or the program
            // stopped reading.
            let why = async {
                // (False once the sender is gone without breaking off.)
                let mut watching = true;
                loop {
                    let data = tokio::select! {
                        biased;
                        why = &mut broken, if watching => match why {
                            Ok(why) => return Some(why),
                            Err(_) => {
                                watching = false;
                                continue;
                            }
                        },
                        data = chunks.recv() => match data {
                            Some(data) => data,
                            None => return None,
                        },
                    };
                    // The write goes on across a clean end of the sender.
                    let write = pipe.write_all(&data);
                    tokio::pin!(write);
                    loop {
                        tokio::select! {
                            biased;
                            why = &mut broken, if watching => match why {
                                Ok(why) => return Some(why),
                                Err(_) => watching = false,
                            },
                            // EPIPE: the program closed its stdin; dropping
                            // the stream tells the sender to stop.
                            written = &mut write => {
                                if written.is_err() {
                                    return None;
                                }
                                break;
                            }
                        }
                    }
                }
            }
            .await;
            if let Some(why) = why {
                tracing::debug!(pid, "stdin stream broke off ({why}): killing the process group");
                let _ = conn.request(Request::Kill { pid, signal: 9, group: true }, &[]).await;
                let _ = conn.request(Request::Kill { pid, signal: 9, group: false }, &[]).await;
            }
        }
    }
}

pub(crate) fn map_spawn_error(argv: &[String], message: String, code: Option<i32>) -> Error {
    if message == crate::protocol::TASK_LIMIT {
        Error::TaskLimit
    } else if code == Some(127) && message.starts_with("command not found") {
        Error::CommandNotFound { command: argv.first().cloned().unwrap_or_default() }
    } else {
        Error::SpawnFailed { message, code }
    }
}

struct Started {
    pid: i32,
    stdout: pipe::Receiver,
    stderr: pipe::Receiver,
    stdin_task: JoinHandle<()>,
}

async fn start(conn: &Arc<Conn>, owner: u32, req: &ExecRequest, setsid: bool, stdin: Stdin) -> Result<Started> {
    let (in_r, in_w) = pipe_pair(owner)?;
    let (out_r, out_w) = pipe_pair(owner)?;
    let (err_r, err_w) = pipe_pair(owner)?;
    let spawn = Request::Spawn {
        argv: req.argv.clone(),
        env: build_env(req, &[]),
        cwd: spawn_cwd(req.cwd.as_ref(), req.user.as_ref()),
        stdio: StdioSpec::Fds,
        setsid,
        pgid: !setsid,
        user: req.user.clone(),
    };
    let reply = conn.request(spawn, &[in_r.as_fd(), out_w.as_fd(), err_w.as_fd()]).await;
    drop((in_r, out_w, err_w));
    let pid = match reply?.0 {
        Reply::Spawned { pid } => pid,
        Reply::Error { message, code } => return Err(map_spawn_error(&req.argv, message, code)),
        other => return Err(Error::Protocol(format!("unexpected spawn reply {other:?}"))),
    };
    let pipe = pipe::Sender::from_owned_fd(in_w).map_err(io_err("stdin pipe"))?;
    let stdin_task = tokio::spawn(feed(conn.clone(), pid, pipe, stdin));
    Ok(Started {
        pid,
        stdout: pipe::Receiver::from_owned_fd(out_r).map_err(io_err("stdout pipe"))?,
        stderr: pipe::Receiver::from_owned_fd(err_r).map_err(io_err("stderr pipe"))?,
        stdin_task,
    })
}

/// Waits for the process (killed at the timeout), then for its output
/// drains (see [`drain`]); stops feeding stdin. Returns the exit and
/// whether the timeout fired.
async fn wait_and_drain(
    conn: &Conn,
    pid: i32,
    timeout: Option<Duration>,
    exited: watch::Sender<bool>,
    drains: [JoinHandle<()>; 2],
    stdin_task: JoinHandle<()>,
) -> Result<(ExitInfo, bool)> {
    let res = wait_with_timeout(conn, pid, timeout).await;
    let _ = exited.send(true);
    for d in drains {
        let _ = d.await;
    }
    stdin_task.abort();
    res
}

async fn wait_with_timeout(conn: &Conn, pid: i32, timeout: Option<Duration>) -> Result<(ExitInfo, bool)> {
    let Some(t) = timeout else {
        return Ok((conn.wait_pid(pid).await?, false));
    };
    match tokio::time::timeout(t, conn.wait_pid(pid)).await {
        Ok(r) => Ok((r?, false)),
        Err(_) => {
            let _ = conn.request(Request::Kill { pid, signal: 9, group: true }, &[]).await;
            let _ = conn.request(Request::Kill { pid, signal: 9, group: false }, &[]).await;
            Ok((conn.wait_pid(pid).await?, true))
        }
    }
}

impl Sandbox {
    /// Run a command to completion and capture its output.
    pub async fn exec(&self, mut req: ExecRequest) -> Result<ExecOutput> {
        let stdin = Stdin::Bytes(req.stdin.take());
        self.exec_from(req, stdin).await
    }

    /// Like [`Sandbox::exec`], with stdin fed from `stdin` as it comes
    /// (`req.stdin` is ignored).
    pub async fn exec_with_stdin(&self, req: ExecRequest, stdin: StdinStream) -> Result<ExecOutput> {
        self.exec_from(req, Stdin::Stream(stdin)).await
    }

    async fn exec_from(&self, req: ExecRequest, stdin: Stdin) -> Result<ExecOutput> {
        let t0 = Instant::now();
        let conn = self.conn().clone();
        let st = start(&conn, self.inner.cfg.uid_base, &req, false, stdin).await?;
        let max = req.max_output_bytes;
        let cap_out = Arc::new(Mutex::new(Capture::default()));
        let cap_err = Arc::new(Mutex::new(Capture::default()));
        let (exited, exit_rx) = watch::channel(false);
        let drains = [
            tokio::spawn(drain(st.stdout, Sink::Capture(cap_out.clone(), max), exit_rx.clone())),
            tokio::spawn(drain(st.stderr, Sink::Capture(cap_err.clone(), max), exit_rx)),
        ];
        let (exit, timed_out) = wait_and_drain(&conn, st.pid, req.timeout, exited, drains, st.stdin_task).await?;
        let take = |c: &Arc<Mutex<Capture>>| std::mem::take(&mut *c.lock().unwrap_or_else(|e| e.into_inner()));
        let (o, e) = (take(&cap_out), take(&cap_err));
        Ok(ExecOutput {
            pid: st.pid,
            exit_code: exit.code,
            signal: exit.signal,
            stdout: o.data,
            stderr: e.data,
            stdout_truncated: o.truncated,
            stderr_truncated: e.truncated,
            timed_out,
            duration: t0.elapsed(),
        })
    }

    /// Run a command and stream its output.
    pub async fn exec_stream(&self, mut req: ExecRequest) -> Result<ExecStream> {
        let stdin = Stdin::Bytes(req.stdin.take());
        self.exec_stream_from(req, stdin).await
    }

    /// Like [`Sandbox::exec_stream`], with stdin fed from `stdin` as it
    /// comes (`req.stdin` is ignored).
    pub async fn exec_stream_with_stdin(&self, req: ExecRequest, stdin: StdinStream) -> Result<ExecStream> {
        self.exec_stream_from(req, Stdin::Stream(stdin)).await
    }

    async fn exec_stream_from(&self, req: ExecRequest, stdin: Stdin) -> Result<ExecStream> {
        let conn = self.conn().clone();
        let st = start(&conn, self.inner.cfg.uid_base, &req, false, stdin).await?;
        let (tx, rx) = mpsc::channel(STREAM_CHUNKS);
        let pid = st.pid;
        let (exited, exit_rx) = watch::channel(false);
        let drains = [
            tokio::spawn(drain(st.stdout, Sink::Events(tx.clone(), true), exit_rx.clone())),
            tokio::spawn(drain(st.stderr, Sink::Events(tx.clone(), false), exit_rx)),
        ];
        let timeout = req.timeout;
        tokio::spawn(async move {
            let res = wait_and_drain(&conn, pid, timeout, exited, drains, st.stdin_task).await;
            let (exit, timed_out) = res.unwrap_or((ExitInfo { code: None, signal: Some(9) }, false));
            let _ = tx.send(ExecEvent::Exit { exit, timed_out }).await;
        });
        Ok(ExecStream { pid, rx })
    }

    /// Start a background process (own session); its output is kept in a
    /// ring buffer of [`BACKGROUND_RING`] bytes per stream.
    pub async fn spawn_background(&self, mut req: ExecRequest) -> Result<ProcessInfo> {
        let conn = self.conn().clone();
        let stdin = Stdin::Bytes(req.stdin.take());
        let st = start(&conn, self.inner.cfg.uid_base, &req, true, stdin).await?;
        let info = ProcessInfo {
            pid: st.pid,
            argv: req.argv.clone(),
            started_at: SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0),
            exit: None,
        };
        let table = &self.inner.background;
        let name = |rx: &pipe::Receiver| open_again(rx, rustix::fs::OFlags::PATH);
        // (Without them, a rollback cannot give a restored process its
        // output back: it is then restarted, see `reroot`.)
        let outputs = match (name(&st.stdout), name(&st.stderr)) {
            (Ok(o), Ok(e)) => Some([o, e]),
            _ => None,
        };
        let (_, pumped) = watch::channel(2u8);
        table.procs.lock().unwrap_or_else(|e| e.into_inner()).insert(
            st.pid,
            Background {
                info: info.clone(),
                incarnation: 0,
                stdout: Ring::default(),
                stderr: Ring::default(),
                pumped,
                outputs,
                pumps: Vec::new(),
                reopened: None,
            },
        );
        let pid = st.pid;
        let pumps = table.pump_output(pid, st.stdout, st.stderr);
        let waiter = watch_exit(conn, table.procs.clone(), pid, 0);
        let mut tasks = table.tasks.lock().unwrap_or_else(|e| e.into_inner());
        tasks.retain(|t| !t.is_finished());
        tasks.extend(pumps.into_iter().chain([waiter, st.stdin_task]));
        Ok(info)
    }

    /// A background process was restored from a template with its pid (a
    /// rollback killed the running one): it runs again. Its output pipes
    /// have read ends of ours again, opened before the kill, its old pumps
    /// ended then ([`BackgroundTable::hold_output`]; here if that failed,
    /// and if it fails again the old pumps go on): with a
    /// reader always there, the restored process's writes never break the
    /// pipe, nothing the killed one wrote last is lost, and the pumps
    /// started once it is back ([`Sandbox::resume_restored_io`]) never read
    /// an end of file meant for the killed one. (The process engine gives
    /// the restored process its write ends again through the same pipes,
    /// `sandtree_proc`'s `kinds/pipe.rs`.)
    pub(crate) fn revive_background(&self, pid: i32) {
        let table = &self.inner.background;
        table.hold_output(&[pid]);
        let incarnation = {
            let mut procs = table.procs.lock().unwrap_or_else(|e| e.into_inner());
            let Some(bg) = procs.get_mut(&pid) else { return };
            bg.incarnation += 1;
            bg.info.exit = None;
            bg.incarnation
        };
        let waiter = watch_exit(self.conn().clone(), table.procs.clone(), pid, incarnation);
        table.tasks.lock().unwrap_or_else(|e| e.into_inner()).push(waiter);
    }

    /// The output pipes this handle reads (`O_PATH`s, duplicated): those
    /// of background processes and of forgotten ones. A restore from a
    /// durable image gives its processes these very pipes where they
    /// still exist (by inode), as a restore from templates does.
    pub fn output_pipes(&self) -> Vec<OwnedFd> {
        let table = &self.inner.background;
        let mut out = Vec::new();
        for bg in table.procs.lock().unwrap_or_else(|e| e.into_inner()).values() {
            out.extend(bg.outputs.iter().flatten().filter_map(|f| f.try_clone().ok()));
        }
        for d in table.detached.lock().unwrap_or_else(|e| e.into_inner()).iter() {
            out.extend(d.path.try_clone().ok());
        }
        out
    }

    /// Output pipes of restored processes that no background process of
    /// this handle reads (`O_PATH`s: those of processes restored from a
    /// durable image, whose reader was the daemon): read and dropped from
    /// the next [`Sandbox::resume_restored_io`] on, and held across each
    /// rollback, as a forgotten background process's.
    pub fn adopt_outputs(&self, paths: Vec<OwnedFd>) {
        let mut detached = self.inner.background.detached.lock().unwrap_or_else(|e| e.into_inner());
        for path in paths {
            let reopened = reopen_output(&path).ok();
            detached.push(Detached { path, reopened, pump: None });
        }
    }

    /// The processes of a rollback are back: the output of restored
    /// background processes is read again (see
    /// [`Sandbox::revive_background`]), and their sessions' terminals are
    /// theirs alone again.
    pub fn resume_restored_io(&self) {
        self.inner.sessions.resume();
        let table = &self.inner.background;
        let reopened: Vec<(i32, [OwnedFd; 2])> = {
            let mut procs = table.procs.lock().unwrap_or_else(|e| e.into_inner());
            procs.iter_mut().filter_map(|(pid, bg)| Some((*pid, bg.reopened.take()?))).collect()
        };
        let mut tasks = Vec::new();
        for d in table.detached.lock().unwrap_or_else(|e| e.into_inner()).iter_mut() {
            if let Some(rx) = d.reopened.take().and_then(|fd| pipe::Receiver::from_owned_fd(fd).ok()) {
                let t = tokio::spawn(pump(rx, |_| {}));
                d.pump = Some(t.abort_handle());
                tasks.push(t);
            }
        }
        for (pid, [o, e]) in reopened {
            match (pipe::Receiver::from_owned_fd(o), pipe::Receiver::from_owned_fd(e)) {
                (Ok(o), Ok(e)) => tasks.extend(table.pump_output(pid, o, e)),
                (Err(err), _) | (_, Err(err)) => {
                    tracing::warn!(pid, "output of a restored background process lost: {err}")
                }
            }
        }
        let mut all = table.tasks.lock().unwrap_or_else(|e| e.into_inner());
        all.retain(|t| !t.is_finished());
        all.extend(tasks);
    }

    /// Background processes started through this handle.
    pub fn processes(&self) -> Vec<ProcessInfo> {
        let mut v: Vec<ProcessInfo> = self
            .inner
            .background
            .procs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .map(|b| b.info.clone())
            .collect();
        v.sort_by_key(|p| p.pid);
        v
    }

    /// Buffered (stdout, stderr) of a background process.
    pub fn process_output(&self, pid: i32) -> Option<(Vec<u8>, Vec<u8>)> {
        let procs = self.inner.background.procs.lock().unwrap_or_else(|e| e.into_inner());
        procs.get(&pid).map(|b| (b.stdout.data.iter().copied().collect(), b.stderr.data.iter().copied().collect()))
    }

    /// Send `signal` to in-sandbox pid `pid`.
    pub async fn kill_process(&self, pid: i32, signal: i32) -> Result<()> {
        match self.conn().request(Request::Kill { pid, signal, group: false }, &[]).await?.0 {
            Reply::Ok => Ok(()),
            Reply::Error { message, code } => Err(Error::SpawnFailed { message, code }),
            other => Err(Error::Protocol(format!("unexpected kill reply {other:?}"))),
        }
    }
}
