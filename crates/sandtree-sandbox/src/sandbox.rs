//! Daemon-side live handle of a running sandbox.
//!
//! Live objects only (connection, pidfd, tasks); everything needed to find
//! the sandbox again after a daemon restart is derived from
//! [`HostConfig`] + id (`init.sock` path, cgroup path).
//!
//! Connection flow:
//! 1. `connect` (after spawn) / `adopt` (after a restart) connects to
//!    `init.sock`, sends `Hello` and waits for `Hello`.
//! 2. A reader task receives every packet: `Reply { id }` completes the
//!    waiting request; `Spawned { pid }` additionally registers an exit slot
//!    for `pid` (so an `Exited` arriving before anybody waits is kept);
//!    `Exited` completes that slot.
//! 3. A watcher task awaits the init pidfd; when init is gone, pending
//!    requests and exit waiters fail.

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::unix::AsyncFd;
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;

use crate::cgroup::{Backend, Cgroup, StuckTask, Usage};
use crate::config::HostConfig;
use crate::exec::{BackgroundTable, ExitInfo};
use crate::protocol::{self, FromInit, Reply, Request, ToInit};
use crate::session::SessionTable;
use crate::zygote::SpawnedInit;

/// Errors of the sandbox API.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// I/O on the init connection or pipes.
    #[error("{op}: {source}")]
    Io {
        /// Step.
        op: String,
        /// Error.
        source: io::Error,
    },
    /// Init closed the connection or died.
    #[error("sandbox {id} is gone")]
    Gone {
        /// Sandbox id.
        id: String,
    },
    /// Init refused the protocol version.
    #[error("protocol error: {0}")]
    Protocol(String),
    /// A restack was refused because something could still write through
    /// the old tree (a process, a mount); nothing changed.
    #[error("{0}")]
    Busy(String),
    /// The command does not exist (exit code 127 semantics).
    #[error("command not found: {command}")]
    CommandNotFound {
        /// argv[0].
        command: String,
    },
    /// The sandbox reached its task limit (its pids cgroup): no process
    /// could be started.
    #[error(
        "the sandbox reached its task limit (`limits.pids`, shown by `sandtree info SANDBOX`), so no process could be started: wait for processes to exit or kill some, or create the sandbox with a higher limit (`sandtree create --pids N`, API `limits.pids`)"
    )]
    TaskLimit,
    /// Init could not start the process.
    #[error("spawn failed: {message}")]
    SpawnFailed {
        /// Reason.
        message: String,
        /// Shell-style code.
        code: Option<i32>,
    },
    /// Freezing did not complete; the sandbox was thawed again.
    #[error("freeze timed out; stuck tasks: {stuck:?}")]
    FreezeTimeout {
        /// Tasks that did not freeze.
        stuck: Vec<StuckTask>,
    },
    /// Cgroup failure.
    #[error(transparent)]
    Cgroup(#[from] crate::cgroup::Error),
    /// Unknown session.
    #[error("no such session: {0}")]
    NoSession(String),
    /// Session command timed out.
    #[error("session command timed out")]
    SessionTimeout,
}

/// Result alias of this module.
pub type Result<T> = std::result::Result<T, Error>;

pub(crate) fn io_err(op: impl Into<String>) -> impl FnOnce(io::Error) -> Error {
    let op = op.into();
    move |source| Error::Io { op, source }
}

type ReplySender = oneshot::Sender<(Reply, Vec<OwnedFd>)>;

enum ExitSlot {
    Waiting(Vec<oneshot::Sender<ExitInfo>>),
    Done(ExitInfo),
}

pub(crate) struct Conn {
    pub(crate) id: String,
    fd: AsyncFd<OwnedFd>,
    next_id: AtomicU64,
    pending: Mutex<HashMap<u64, ReplySender>>,
    exits: Mutex<HashMap<i32, ExitSlot>>,
    closed: watch::Sender<bool>,
    /// Held for reading by every `Spawn` until its reply, for writing by
    /// [`Sandbox::hold_spawns`]: no process starts meanwhile.
    spawns: Arc<tokio::sync::RwLock<()>>,
}

impl Conn {
    /// Send a request and wait for its reply.
    pub(crate) async fn request(
        &self,
        req: Request,
        fds: &[std::os::fd::BorrowedFd<'_>],
    ) -> Result<(Reply, Vec<OwnedFd>)> {
        let _spawning = match req {
            Request::Spawn { .. } => Some(self.spawns.read().await),
            _ => None,
        };
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        self.pending.lock().unwrap_or_else(|e| e.into_inner()).insert(id, tx);
        if *self.closed.borrow() {
            self.pending.lock().unwrap_or_else(|e| e.into_inner()).remove(&id);
            return Err(Error::Gone { id: self.id.clone() });
        }
        let msg = ToInit { id, req };
        loop {
            let mut guard = self.fd.writable().await.map_err(io_err("init socket"))?;
            match guard.try_io(|fd| protocol::send(fd.get_ref().as_fd(), &msg, fds)) {
                Ok(Ok(())) => break,
                Ok(Err(e)) => {
                    self.pending.lock().unwrap_or_else(|e| e.into_inner()).remove(&id);
                    return Err(Error::Io { op: "send to init".into(), source: e });
                }
                Err(_would_block) => continue,
            }
        }
        rx.await.map_err(|_| Error::Gone { id: self.id.clone() })
    }

    /// Wait for the exit of in-sandbox pid `pid` (spawned on this connection
    /// or reported to it).
    pub(crate) async fn wait_pid(&self, pid: i32) -> Result<ExitInfo> {
        let rx = {
            let mut exits = self.exits.lock().unwrap_or_else(|e| e.into_inner());
            match exits.remove(&pid) {
                Some(ExitSlot::Done(info)) => return Ok(info),
                Some(ExitSlot::Waiting(mut v)) => {
                    let (tx, rx) = oneshot::channel();
                    v.push(tx);
                    exits.insert(pid, ExitSlot::Waiting(v));
                    rx
                }
                None => {
                    let (tx, rx) = oneshot::channel();
                    exits.insert(pid, ExitSlot::Waiting(vec![tx]));
                    rx
                }
            }
        };
        rx.await.map_err(|_| Error::Gone { id: self.id.clone() })
    }

    /// Forget the exit of `pid` (a restored process has its pid again).
    pub(crate) fn reset_exit(&self, pid: i32) {
        self.exits.lock().unwrap_or_else(|e| e.into_inner()).insert(pid, ExitSlot::Waiting(Vec::new()));
    }

    fn dispatch(&self, msg: FromInit, fds: Vec<OwnedFd>) {
        match msg {
            FromInit::Reply { id, reply } => {
                if let Reply::Spawned { pid } = &reply {
                    // Init sends `Spawned` before the child's `Exited`: an
                    // exit already there is an earlier process's with the
                    // same pid (nobody waited for it), not this one's.
                    let mut exits = self.exits.lock().unwrap_or_else(|e| e.into_inner());
                    if !matches!(exits.get(pid), Some(ExitSlot::Waiting(_))) {
                        exits.insert(*pid, ExitSlot::Waiting(Vec::new()));
                    }
                }
                if let Some(tx) = self.pending.lock().unwrap_or_else(|e| e.into_inner()).remove(&id) {
                    let _ = tx.send((reply, fds));
                }
            }
            FromInit::Exited { pid, code, signal } => {
                let info = ExitInfo { code, signal };
                let mut exits = self.exits.lock().unwrap_or_else(|e| e.into_inner());
                let mut delivered = false;
                if let Some(ExitSlot::Waiting(waiters)) = exits.remove(&pid) {
                    for w in waiters {
                        // A waiter whose future was dropped (e.g. by a
                        // timeout) does not count as delivery.
                        delivered |= w.send(info.clone()).is_ok();
                    }
                }
                if !delivered {
                    exits.insert(pid, ExitSlot::Done(info));
                }
            }
        }
    }

    fn close(&self) {
        self.closed.send_replace(true);
        self.pending.lock().unwrap_or_else(|e| e.into_inner()).clear();
        self.exits.lock().unwrap_or_else(|e| e.into_inner()).retain(|_, s| matches!(s, ExitSlot::Done(_)));
    }

    async fn read_loop(self: Arc<Self>) {
        loop {
            let Ok(mut guard) = self.fd.readable().await else {
                break;
            };
            match guard.try_io(|fd| protocol::recv::<FromInit>(fd.get_ref().as_fd())) {
                Ok(Ok(Some((msg, fds)))) => self.dispatch(msg, fds),
                Ok(Ok(None)) => break,
                Ok(Err(e)) if e.kind() == io::ErrorKind::InvalidData => {
                    tracing::warn!(sandbox = %self.id, error = %e, "bad message from init");
                }
                Ok(Err(_)) => break,
                Err(_would_block) => continue,
            }
        }
        self.close();
    }
}

pub(crate) struct Inner {
    pub(crate) cfg: HostConfig,
    pub(crate) id: String,
    pub(crate) conn: Arc<Conn>,
    pub(crate) cgroup: Cgroup,
    pub(crate) init_pid: i32,
    /// pidfd of init: signals reach exactly this process, never a reused pid.
    pub(crate) pidfd: Arc<AsyncFd<OwnedFd>>,
    pub(crate) alive: watch::Receiver<bool>,
    pub(crate) background: BackgroundTable,
    pub(crate) sessions: SessionTable,
    /// A freeze was asked for and no thaw succeeded since: only then does a
    /// rollback write the freezer (~0.1 ms) before it talks to init.
    pub(crate) maybe_frozen: std::sync::atomic::AtomicBool,
}

/// How long init may take to kill the other processes and swap its root.
const REROOT_TIMEOUT: Duration = Duration::from_secs(crate::reroot::KILL_TIMEOUT.as_secs() + 5);

/// How long init may take to answer the first message of a connection.
const HELLO_TIMEOUT: Duration = Duration::from_secs(5);

/// A running sandbox (daemon side).
pub struct Sandbox {
    pub(crate) inner: Arc<Inner>,
    tasks: Vec<JoinHandle<()>>,
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
        self.inner.sessions.abort_all();
        self.inner.background.abort_all();
    }
}

impl std::fmt::Debug for Sandbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sandbox").field("id", &self.inner.id).field("init_pid", &self.inner.init_pid).finish()
    }
}

fn cgroup_of(cfg: &HostConfig, id: &str) -> Cgroup {
    Cgroup::new(Backend::detect(), &cfg.cgroup_name, id)
}

async fn open_conn(cfg: &HostConfig, id: &str) -> io::Result<OwnedFd> {
    let path = cfg.init_socket(id);
    let sock = rustix::net::socket_with(
        rustix::net::AddressFamily::UNIX,
        rustix::net::SocketType::SEQPACKET,
        rustix::net::SocketFlags::CLOEXEC | rustix::net::SocketFlags::NONBLOCK,
        None,
    )?;
    let addr = rustix::net::SocketAddrUnix::new(&path)?;
    match rustix::net::connect(&sock, &addr) {
        Ok(()) => {}
        Err(rustix::io::Errno::INPROGRESS) | Err(rustix::io::Errno::AGAIN) => {
            let afd = async_fd(sock.try_clone()?)?;
            let _ = afd.writable().await?;
        }
        Err(e) => return Err(e.into()),
    }
    Ok(sock)
}

impl Sandbox {
    /// Connect to the init of a just spawned sandbox.
    pub async fn connect(cfg: &HostConfig, id: &str, init: SpawnedInit) -> Result<Sandbox> {
        let fd = open_conn(cfg, id).await.map_err(io_err(format!("connect {}", cfg.init_socket(id).display())))?;
        Self::finish(cfg, id, fd, init.pid, init.pidfd).await
    }

    /// Kills whatever still runs in a sandbox's cgroup and removes the cgroup
    /// and run directory: for a sandbox that cannot be re-adopted.
    pub fn destroy_stale(cfg: &HostConfig, id: &str) -> Result<()> {
        let cg = cgroup_of(cfg, id);
        let _ = cg.thaw();
        let _ = cg.kill_all(Duration::from_secs(5));
        cg.remove()?;
        let _ = std::fs::remove_dir_all(cfg.sandbox_dir(id));
        Ok(())
    }

    /// Re-adopt a sandbox after a daemon restart: `Some` if its init answers,
    /// `None` if it is gone (its cgroup and run directory are then removed).
    ///
    /// A daemon killed between freeze and thaw of a checkpoint leaves the
    /// cgroup frozen, and a frozen init never answers: thaw first.
    pub async fn adopt(cfg: &HostConfig, id: &str) -> Result<Option<Sandbox>> {
        let _ = cgroup_of(cfg, id).thaw();
        let fd = match open_conn(cfg, id).await {
            Ok(fd) => fd,
            Err(_) => {
                Self::destroy_stale(cfg, id)?;
                return Ok(None);
            }
        };
        let cred = rustix::net::sockopt::socket_peercred(&fd).map_err(|e| io_err("SO_PEERCRED")(e.into()))?;
        let pid = cred.pid.as_raw_nonzero().get();
        let pidfd = rustix::process::pidfd_open(cred.pid, rustix::process::PidfdFlags::empty())
            .map_err(|e| io_err("pidfd_open")(e.into()))?;
        Self::finish(cfg, id, fd, pid, pidfd).await.map(Some)
    }

    async fn finish(cfg: &HostConfig, id: &str, fd: OwnedFd, init_pid: i32, pidfd: OwnedFd) -> Result<Sandbox> {
        let (closed, _) = watch::channel(false);
        let conn = Arc::new(Conn {
            id: id.to_string(),
            fd: async_fd(fd).map_err(io_err("register init socket"))?,
            next_id: AtomicU64::new(1),
            pending: Mutex::new(HashMap::new()),
            exits: Mutex::new(HashMap::new()),
            closed,
            spawns: Arc::new(tokio::sync::RwLock::new(())),
        });
        let reader = tokio::spawn(conn.clone().read_loop());
        let (alive_tx, alive_rx) = watch::channel(true);
        let pidfd = Arc::new(async_fd(pidfd).map_err(io_err("register pidfd"))?);
        let conn2 = conn.clone();
        let watched = pidfd.clone();
        let watcher = tokio::spawn(async move {
            let _ = watched.readable().await;
            alive_tx.send_replace(false);
            conn2.close();
        });
        let sb = Sandbox {
            inner: Arc::new(Inner {
                cfg: cfg.clone(),
                id: id.to_string(),
                conn,
                cgroup: cgroup_of(cfg, id),
                init_pid,
                pidfd,
                alive: alive_rx,
                background: BackgroundTable::default(),
                sessions: SessionTable::default(),
                // A sandbox is thawed before it is adopted.
                maybe_frozen: std::sync::atomic::AtomicBool::new(false),
            }),
            tasks: vec![reader, watcher],
        };
        let hello = sb.inner.conn.request(Request::Hello { version: protocol::VERSION }, &[]);
        let answer = tokio::time::timeout(HELLO_TIMEOUT, hello).await.map_err(|_| {
            sb.tasks.iter().for_each(|t| t.abort());
            Error::Protocol(format!("init of {id} did not answer within {HELLO_TIMEOUT:?}"))
        })?;
        match answer? {
            (Reply::Hello { version }, _) if version == protocol::VERSION => {}
            (other, _) => {
                sb.tasks.iter().for_each(|t| t.abort());
                return Err(Error::Protocol(format!("unexpected hello reply {other:?}")));
            }
        }
        Ok(sb)
    }

    /// Sandbox id.
    pub fn id(&self) -> &str {
        &self.inner.id
    }

    /// Host pid of init.
    pub fn init_pid(&self) -> i32 {
        self.inner.init_pid
    }

    /// The upper directory of the overlay that is init's `/`: which
    /// writable layer the sandbox really runs on (checked on re-adoption:
    /// a daemon killed inside a rollback may leave it on either side).
    pub fn root_upper(&self) -> Option<std::path::PathBuf> {
        let mounts = sandtree_sys::mountinfo::mounts_of(self.inner.init_pid).ok()?;
        mounts.iter().rev().find(|m| m.target == std::path::Path::new("/"))?.option("upperdir")
    }

    /// Whether init is still running.
    pub fn is_alive(&self) -> bool {
        *self.inner.alive.borrow()
    }

    /// Wait until init exited.
    pub async fn wait_exit(&self) {
        let mut rx = self.inner.alive.clone();
        let _ = rx.wait_for(|alive| !*alive).await;
    }

    /// Have init set the sandbox's `ns_last_pid` ([`Request::SetLastPid`]).
    pub async fn set_last_pid(&self, pid: i32) -> Result<()> {
        match self.inner.conn.request(Request::SetLastPid { pid }, &[]).await? {
            (Reply::Ok, _) => Ok(()),
            (Reply::Error { message, .. }, _) => Err(Error::Protocol(message)),
            (other, _) => Err(Error::Protocol(format!("unexpected ns_last_pid reply {other:?}"))),
        }
    }

    /// Round-trip to init.
    pub async fn ping(&self) -> Result<()> {
        match self.inner.conn.request(Request::Ping, &[]).await? {
            (Reply::Pong, _) => Ok(()),
            (other, _) => Err(Error::Protocol(format!("unexpected ping reply {other:?}"))),
        }
    }

    /// Freeze every process of the sandbox.
    pub fn freeze(&self, timeout: Duration) -> Result<()> {
        self.inner.maybe_frozen.store(true, std::sync::atomic::Ordering::SeqCst);
        match self.inner.cgroup.freeze(timeout) {
            Ok(()) => Ok(()),
            Err(crate::cgroup::Error::FreezeTimeout { stuck, .. }) => Err(Error::FreezeTimeout { stuck }),
            Err(e) => Err(e.into()),
        }
    }

    /// Thaw the sandbox.
    pub fn thaw(&self) -> Result<()> {
        self.inner.cgroup.thaw()?;
        self.inner.maybe_frozen.store(false, std::sync::atomic::Ordering::SeqCst);
        Ok(())
    }

    /// [`Sandbox::thaw`] if a freeze may still hold (a checkpoint whose
    /// thaw failed): a frozen init would never answer.
    fn thaw_if_frozen(&self) -> Result<()> {
        if self.inner.maybe_frozen.load(std::sync::atomic::Ordering::SeqCst) { self.thaw() } else { Ok(()) }
    }

    /// Resource usage.
    pub fn usage(&self) -> Result<Usage> {
        Ok(self.inner.cgroup.usage()?)
    }

    /// The sandbox cgroup.
    pub fn cgroup(&self) -> &Cgroup {
        &self.inner.cgroup
    }

    /// Host pid of in-sandbox pid `pid` (via `NSpid` of the cgroup members).
    pub fn host_pid(&self, pid: i32) -> Option<i32> {
        for hp in self.inner.cgroup.procs().ok()? {
            // (Bytes, read lossily: a name cut at 15 bytes may end inside a
            // UTF-8 character, and must not hide the process.)
            let Ok(status) = std::fs::read(format!("/proc/{hp}/status")) else {
                continue;
            };
            let status = String::from_utf8_lossy(&status);
            let ns = status.lines().find_map(|l| l.strip_prefix("NSpid:"));
            if ns.and_then(|v| v.split_whitespace().last()).and_then(|v| v.parse::<i32>().ok()) == Some(pid) {
                return Some(hp);
            }
        }
        None
    }

    /// First half of a rollback in place: init sends SIGKILL to every
    /// process but itself and the templates in `keep`, and answers at once
    /// (they die while the daemon builds the new layers; pids in `restore`
    /// are brought back by the daemon, their old exits are not reported).
    pub async fn kill_all(&self, keep: Vec<i32>, restore: Vec<i32>) -> Result<()> {
        self.thaw_if_frozen()?;
        self.inner.sessions.hold_terminals(&restore);
        self.inner.background.hold_output(&self.inner.background.pids());
        let members = self.members_dir();
        let req = Request::KillAll { keep, restore, members: members.is_some() };
        let fds: Vec<_> = members.iter().map(|f| f.as_fd()).collect();
        self.request_with(req, &fds, "kill before rollback").await
    }

    /// The sandbox's cgroup directory (`O_PATH`) for init's kill list
    /// (`members` of [`Request::Reroot`]); `None` if it cannot be opened
    /// (init lists `/proc` then).
    fn members_dir(&self) -> Option<OwnedFd> {
        let dir = self.inner.cgroup.procs_dir();
        let flags = rustix::fs::OFlags::PATH | rustix::fs::OFlags::DIRECTORY | rustix::fs::OFlags::CLOEXEC;
        match rustix::fs::open(dir, flags, rustix::fs::Mode::empty()) {
            Ok(fd) => Some(fd),
            Err(e) => {
                tracing::warn!(dir = %dir.display(), "init lists /proc to kill: {e}");
                None
            }
        }
    }

    /// Last step of a rollback in place: wait until every process killed
    /// for it is gone (reaped), so that none shows after the rollback
    /// returns. May run while the restored processes are being made.
    pub async fn wait_gone(&self) -> Result<()> {
        self.simple_request(Request::WaitGone, "wait for the killed processes").await
    }

    async fn simple_request(&self, req: Request, what: &str) -> Result<()> {
        self.request_with(req, &[], what).await
    }

    async fn request_with(&self, req: Request, fds: &[BorrowedFd<'_>], what: &str) -> Result<()> {
        let request = self.inner.conn.request(req, fds);
        match tokio::time::timeout(REROOT_TIMEOUT, request).await {
            Err(_) => Err(Error::Protocol(format!("{what}: init did not answer within {REROOT_TIMEOUT:?}"))),
            Ok(res) => match res? {
                (Reply::Ok, _) => Ok(()),
                (Reply::Error { message, .. }, _) => Err(Error::Protocol(format!("{what}: {message}"))),
                (other, _) => Err(Error::Protocol(format!("{what}: unexpected reply {other:?}"))),
            },
        }
    }

    /// Rollback in place (see [`crate::reroot`]): init kills every other
    /// process but the templates in `keep` and makes `layers` (detached
    /// overlay mounts from [`crate::Zygote::build_layers`], one per target,
    /// `/` first) the sandbox's tree. Sessions and background processes of
    /// this handle are forgotten, except those whose pid is in `restore`
    /// (the caller brings them back from templates right after); those
    /// started while the request is under way survive it, in the new tree.
    /// On error the tree is unknown: stop the sandbox and boot it.
    pub async fn reroot(
        &self,
        targets: Vec<std::path::PathBuf>,
        layers: Vec<OwnedFd>,
        keep: Vec<i32>,
        restore: Vec<i32>,
    ) -> Result<()> {
        // A frozen init (a checkpoint whose thaw failed) would never answer.
        self.thaw_if_frozen()?;
        let mut sessions = self.inner.sessions.pids();
        sessions.retain(|(_, pid)| !restore.contains(pid));
        let sessions: Vec<String> = sessions.into_iter().map(|(id, _)| id).collect();
        let mut pids = self.inner.background.pids();
        pids.retain(|p| !restore.contains(p));
        self.inner.sessions.hold_terminals(&restore);
        self.inner.background.hold_output(&self.inner.background.pids());
        let members = self.members_dir();
        let fds: Vec<_> = layers.iter().chain(members.iter()).map(|f| f.as_fd()).collect();
        let req = Request::Reroot { targets, keep, restore: restore.clone(), members: members.is_some() };
        let request = self.inner.conn.request(req, &fds);
        let res = tokio::time::timeout(REROOT_TIMEOUT, request).await;
        drop(fds);
        drop(layers);
        self.inner.sessions.forget(&sessions);
        self.inner.background.forget(&pids);
        // The originals of restored pids were killed (and reported): their
        // successors start with a clean exit slot.
        for pid in &restore {
            self.inner.conn.reset_exit(*pid);
            self.revive_background(*pid);
        }
        let res = res.map_err(|_| Error::Protocol(format!("init did not swap its root within {REROOT_TIMEOUT:?}")))?;
        match res? {
            (Reply::Ok, _) => Ok(()),
            (Reply::Error { message, .. }, _) => Err(Error::Protocol(format!("rollback in place failed: {message}"))),
            (other, _) => Err(Error::Protocol(format!("unexpected reroot reply {other:?}"))),
        }
    }

    /// A layered checkpoint (see [`crate::reroot`], *restack*): makes
    /// `layers` (detached overlay mounts stacking the current writable
    /// directories under new ones, one per target, `/` first) the tree if
    /// init is alone but for `keep`. [`Error::Busy`] when it is not: then
    /// nothing changed. Any other error leaves the tree unknown: stop the
    /// sandbox and boot it.
    pub async fn restack(&self, targets: Vec<std::path::PathBuf>, layers: Vec<OwnedFd>, keep: Vec<i32>) -> Result<()> {
        self.thaw_if_frozen()?;
        self.tree_request(Request::Restack { targets, keep }, layers, "restack").await
    }

    /// A layered checkpoint with live processes, first half (see
    /// [`crate::reroot`]): the caller holds every process but init (stopped,
    /// spawns held with [`Sandbox::hold_spawns`], templates being made);
    /// with only setup's mounts, `layers` are mounted at
    /// [`crate::reroot::STAGE`] for the stopped processes to reopen their
    /// files through. [`Error::Busy`]: nothing changed. Then
    /// [`Sandbox::swap_staged`], or [`Sandbox::unstage`].
    pub async fn stage(&self, targets: Vec<std::path::PathBuf>, layers: Vec<OwnedFd>) -> Result<()> {
        self.thaw_if_frozen()?;
        self.tree_request(Request::Stage { targets }, layers, "stage").await
    }

    /// Undo [`Sandbox::stage`].
    pub async fn unstage(&self) -> Result<()> {
        self.tree_request(Request::Unstage, Vec::new(), "unstage").await
    }

    /// The staged tree becomes the root and the old one is detached. An
    /// error leaves the tree unknown: stop the sandbox and boot it.
    pub async fn swap_staged(&self) -> Result<()> {
        self.tree_request(Request::SwapStaged, Vec::new(), "swap to the staged tree").await
    }

    /// No process starts in the sandbox until the guard drops (a `Spawn`
    /// under way finishes first): a checkpoint that lets init run while the
    /// processes are stopped holds it.
    pub async fn hold_spawns(&self) -> tokio::sync::OwnedRwLockWriteGuard<()> {
        self.inner.conn.spawns.clone().write_owned().await
    }

    /// A request that changes the tree (an `EBUSY` refusal is
    /// [`Error::Busy`]).
    async fn tree_request(&self, req: Request, layers: Vec<OwnedFd>, what: &str) -> Result<()> {
        let fds: Vec<_> = layers.iter().map(|f| f.as_fd()).collect();
        let request = self.inner.conn.request(req, &fds);
        let res = tokio::time::timeout(REROOT_TIMEOUT, request).await;
        drop(fds);
        drop(layers);
        let res = res.map_err(|_| Error::Protocol(format!("init did not {what} within {REROOT_TIMEOUT:?}")))?;
        match res? {
            (Reply::Ok, _) => Ok(()),
            (Reply::Error { message, code: Some(c) }, _) if c == nix::errno::Errno::EBUSY as i32 => {
                Err(Error::Busy(message))
            }
            (Reply::Error { message, .. }, _) => Err(Error::Protocol(format!("{what} failed: {message}"))),
            (other, _) => Err(Error::Protocol(format!("unexpected {what} reply {other:?}"))),
        }
    }

    /// Kills every process of the sandbox and returns once its init is gone
    /// and its cgroup is empty (so its mount namespace, and with it the
    /// overlay over its writable layer, is released). The cgroup and run
    /// directory stay for a restart of the same sandbox; [`Sandbox::release`]
    /// removes them.
    ///
    /// SIGKILL to init kills the whole pid namespace (the kernel reaps every
    /// task of it before init's exit is reported); the cgroup sweep after it
    /// only catches tasks that joined the cgroup from outside the namespace.
    pub async fn stop(&self) -> Result<()> {
        let _ = rustix::process::pidfd_send_signal(self.inner.pidfd.get_ref(), rustix::process::Signal::KILL);
        let _ = tokio::time::timeout(Duration::from_secs(10), self.wait_exit()).await;
        let cg = self.inner.cgroup.clone();
        tokio::task::spawn_blocking(move || cg.kill_all(Duration::from_secs(10)))
            .await
            .map_err(|e| io_err("join")(io::Error::other(e)))??;
        Ok(())
    }

    /// Removes the cgroup and run directory of a stopped sandbox.
    pub async fn release(&self) -> Result<()> {
        let cg = self.inner.cgroup.clone();
        tokio::task::spawn_blocking(move || cg.remove()).await.map_err(|e| io_err("join")(io::Error::other(e)))??;
        let dir = self.inner.cfg.sandbox_dir(&self.inner.id);
        match std::fs::remove_dir_all(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(io_err(format!("remove {}", dir.display()))(e)),
        }
        Ok(())
    }

    /// [`Sandbox::stop`], then [`Sandbox::release`]: nothing of it remains.
    pub async fn kill(&self) -> Result<()> {
        self.stop().await?;
        self.release().await
    }

    pub(crate) fn conn(&self) -> &Arc<Conn> {
        &self.inner.conn
    }
}

/// Raw fd number helper for logging.
pub fn fd_number(fd: &impl AsRawFd) -> i32 {
    fd.as_raw_fd()
}

/// Register an owned fd with tokio. `AsyncFd::new` is deprecated because a
/// borrowed raw fd could be closed behind tokio's back; we only ever pass
/// owned descriptors that the `AsyncFd` keeps alive, which is the sound case.
#[allow(deprecated)]
pub(crate) fn async_fd(fd: OwnedFd) -> io::Result<AsyncFd<OwnedFd>> {
    AsyncFd::new(fd)
}
