//! The zygote: a single-threaded child of the daemon that forks sandboxes.
//!
//! Why: `setns(CLONE_NEWUSER)` fails in multi-threaded processes and
//! `fork()` in a multi-threaded (tokio) process is unsafe, so the daemon
//! forks the zygote from `main()` before any thread exists and sends it
//! requests instead of forking itself.
//!
//! Protocol (daemon side [`Zygote`], zygote side `serve`):
//! 1. `Zygote::start` checks `/proc/self/task` has one entry, creates a
//!    `SOCK_SEQPACKET` socketpair and forks. The child names itself
//!    `sandtree:[zygote]`, sets `PR_SET_PDEATHSIG(SIGKILL)` and
//!    `SIGCHLD = SIG_IGN` (its children are reaped automatically), and
//!    compiles the seccomp filter once.
//! 2. The daemon sends `ZygoteRequest::Spawn` (serialised by a mutex: one
//!    request in flight).
//! 3. The zygote runs the spawn sequence of [`crate::spawn`] and replies
//!    `Spawned { pid }` with a pidfd of init attached (race-free handle: the
//!    pid cannot be recycled before the daemon holds it), or `Error`.
//! 4. EOF on the socket (daemon gone) ends the zygote.

use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::Mutex;

use rustix::net::{AddressFamily, SocketFlags, SocketType, socketpair};
use sandtree_sys::process::{Forked, exit_now, fork_single_threaded, ignore_signal, thread_count};

use crate::cgroup::Backend;
use crate::config::{HostConfig, OverlayLayer, SandboxSpec};
use crate::overlay::Idmapper;
use crate::protocol::{self, ZygoteReply, ZygoteRequest};

/// Errors of this module.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// `Zygote::start` was called after threads were started.
    #[error("zygote must start before any thread exists (process has {threads} threads)")]
    NotSingleThreaded {
        /// Threads found.
        threads: usize,
    },
    /// Socket or fork failure.
    #[error("zygote {op}: {source}")]
    Io {
        /// Step.
        op: &'static str,
        /// Error.
        source: io::Error,
    },
    /// The zygote is gone.
    #[error("zygote exited")]
    Gone,
    /// The zygote reported a spawn failure.
    #[error("spawn failed: {0}")]
    Spawn(String),
}

/// Result alias of this module.
pub type Result<T> = std::result::Result<T, Error>;

/// A freshly spawned init.
#[derive(Debug)]
pub struct SpawnedInit {
    /// Host pid of init.
    pub pid: i32,
    /// pidfd of init (readable once it exited).
    pub pidfd: OwnedFd,
}

/// Daemon-side handle of the zygote: one single-threaded worker process
/// per CPU (at most [`MAX_WORKERS`]), so spawns of a fork run in parallel.
pub struct Zygote {
    workers: Vec<Worker>,
    next: std::sync::atomic::AtomicUsize,
    cfg: HostConfig,
}

/// Upper bound on zygote worker processes.
pub const MAX_WORKERS: usize = 4;

struct Worker {
    sock: Mutex<OwnedFd>,
    pid: i32,
}

impl std::fmt::Debug for Zygote {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Zygote").field("pids", &self.workers.iter().map(|w| w.pid).collect::<Vec<_>>()).finish()
    }
}

impl Zygote {
    /// Fork the zygote workers. Must be called while the process is
    /// single-threaded (forking a child process does not add a thread, so
    /// every worker is forked from a single-threaded parent).
    pub fn start(cfg: HostConfig) -> Result<Zygote> {
        crate::overlay::LayerNames::new(&cfg)
            .install()
            .map_err(|e| Error::Io { op: "set up the names of overlay layers", source: io::Error::other(e) })?;
        let n = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1).clamp(1, MAX_WORKERS);
        let mut workers = Vec::with_capacity(n);
        for _ in 0..n {
            workers.push(Self::start_worker(&cfg)?);
        }
        Ok(Zygote { workers, next: std::sync::atomic::AtomicUsize::new(0), cfg })
    }

    fn start_worker(cfg: &HostConfig) -> Result<Worker> {
        let threads = thread_count().map_err(|source| Error::Io { op: "count threads", source })?;
        if threads != 1 {
            return Err(Error::NotSingleThreaded { threads });
        }
        let cfg = cfg.clone();
        let (daemon_end, zygote_end) =
            socketpair(AddressFamily::UNIX, SocketType::SEQPACKET, SocketFlags::CLOEXEC, None)
                .map_err(|e| Error::Io { op: "socketpair", source: e.into() })?;
        let parent_pid = std::process::id() as i32;
        match fork_single_threaded().map_err(|e| Error::Io { op: "fork", source: io::Error::other(e) })? {
            Forked::Child => {
                drop(daemon_end);
                let _ = rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::KILL));
                if rustix::process::getppid().map(|p| p.as_raw_nonzero().get()) != Some(parent_pid) {
                    exit_now(0);
                }
                let _ = rustix::thread::set_name(c"sandtree:[zygote]");
                let _ = ignore_signal(nix::libc::SIGCHLD);
                serve(cfg, zygote_end);
                exit_now(0);
            }
            Forked::Parent(pid) => {
                drop(zygote_end);
                Ok(Worker { sock: Mutex::new(daemon_end), pid })
            }
        }
    }

    /// Host pid of the first zygote worker.
    pub fn pid(&self) -> i32 {
        self.workers[0].pid
    }

    /// The host configuration the zygote was started with.
    pub fn config(&self) -> &HostConfig {
        &self.cfg
    }

    /// Kills the workers and waits for them; the pre-cloned inits they keep
    /// ready die with them. For a daemon's clean exit: a pre-cloned init has
    /// a mount namespace of its own, a copy of the host's made when it was
    /// cloned, and so holds every filesystem mounted then (the state store
    /// included: its loop device could not go while the daemon lived).
    /// Spawns fail afterwards ([`Error::Gone`]).
    pub fn stop(&self) {
        for w in &self.workers {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(w.pid), nix::sys::signal::Signal::SIGKILL);
        }
        for w in &self.workers {
            let _ = nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(w.pid), None);
        }
    }

    /// Create a sandbox and start its init (blocking; call from
    /// `spawn_blocking` in async code).
    /// Takes an idle worker if there is one, else waits for the next in turn.
    pub fn spawn(&self, spec: &SandboxSpec) -> Result<SpawnedInit> {
        let (reply, mut fds) = self.call(&ZygoteRequest::Spawn { spec: spec.clone() })?;
        match reply {
            ZygoteReply::Spawned { pid } => {
                let pidfd = fds.pop().ok_or_else(|| Error::Spawn("zygote sent no pidfd".into()))?;
                Ok(SpawnedInit { pid, pidfd })
            }
            ZygoteReply::Error { message } => Err(Error::Spawn(message)),
            other => Err(Error::Spawn(format!("unexpected zygote reply {other:?}"))),
        }
    }

    /// Build detached overlay mounts of `layers` (root first) for an
    /// in-place rollback ([`crate::reroot`]); blocking like [`Zygote::spawn`].
    /// Each layer is built by its own worker at once when there are several
    /// (a mount's setup is mostly waiting on the filesystem).
    pub fn build_layers(&self, layers: &[OverlayLayer]) -> Result<Vec<OwnedFd>> {
        if layers.len() < 2 || self.workers.len() < 2 {
            return self.build_each(layers);
        }
        std::thread::scope(|s| {
            let handles: Vec<_> =
                layers.iter().map(|l| s.spawn(move || self.build_each(std::slice::from_ref(l)))).collect();
            let mut fds = Vec::with_capacity(layers.len());
            for h in handles {
                fds.extend(h.join().map_err(|_| Error::Spawn("a layer-building thread panicked".into()))??);
            }
            Ok(fds)
        })
    }

    fn build_each(&self, layers: &[OverlayLayer]) -> Result<Vec<OwnedFd>> {
        let (reply, fds) = self.call(&ZygoteRequest::BuildLayers { layers: layers.to_vec() })?;
        match reply {
            ZygoteReply::Layers { count } if count == fds.len() && count == layers.len() => Ok(fds),
            ZygoteReply::Error { message } => Err(Error::Spawn(message)),
            other => Err(Error::Spawn(format!("unexpected zygote reply {other:?} with {} fds", fds.len()))),
        }
    }

    /// One request/reply on an idle worker, else on the next in turn.
    fn call(&self, req: &ZygoteRequest) -> Result<(ZygoteReply, Vec<OwnedFd>)> {
        let idle = self.workers.iter().find_map(|w| w.sock.try_lock().ok());
        let sock = match idle {
            Some(sock) => sock,
            None => {
                let i = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % self.workers.len();
                self.workers[i].sock.lock().unwrap_or_else(|e| e.into_inner())
            }
        };
        protocol::send(sock.as_fd(), req, &[]).map_err(|source| Error::Io { op: "send", source })?;
        protocol::recv::<ZygoteReply>(sock.as_fd())
            .map_err(|source| Error::Io { op: "recv", source })?
            .ok_or(Error::Gone)
    }
}

/// Keeps one pre-cloned init ready (see [`crate::spawn::preclone`]).
fn refill(state: &mut crate::spawn::ZygoteState) {
    if state.pool.is_empty() {
        match crate::spawn::preclone(state) {
            Ok(p) => state.pool.push(p),
            Err(e) => eprintln!("sandtree zygote: cannot pre-clone an init: {e}"),
        }
    }
}

/// Zygote main loop (runs in the forked child).
fn serve(cfg: HostConfig, sock: OwnedFd) {
    let seccomp = match crate::seccomp::compile() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("sandtree zygote: {e}");
            return;
        }
    };
    let mut state = crate::spawn::ZygoteState {
        backend: Backend::detect(),
        idmap: Idmapper::new(cfg.clone()),
        names: crate::overlay::LayerNames::new(&cfg),
        cfg,
        seccomp,
        pool: Vec::new(),
        net_maker: match crate::spawn::NetMaker::new() {
            Ok(m) => Some(m),
            Err(e) => {
                eprintln!("sandtree zygote: sandboxes share the host's TCP connection table ({e})");
                None
            }
        },
    };
    refill(&mut state);
    loop {
        let msg = match protocol::recv::<ZygoteRequest>(sock.as_fd()) {
            Ok(Some((msg, _fds))) => msg,
            Ok(None) => return,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => return,
        };
        match msg {
            ZygoteRequest::Spawn { spec } => match crate::spawn::spawn(&mut state, &spec) {
                Ok((pid, pidfd)) => {
                    let _ = protocol::send(sock.as_fd(), &ZygoteReply::Spawned { pid }, &[pidfd.as_fd()]);
                }
                Err(e) => {
                    let _ = protocol::send(sock.as_fd(), &ZygoteReply::Error { message: e.to_string() }, &[]);
                }
            },
            ZygoteRequest::BuildLayers { layers } => {
                let built: std::result::Result<Vec<OwnedFd>, _> = layers
                    .iter()
                    .map(|l| crate::overlay::build(l, &state.cfg, &mut state.idmap, &state.names))
                    .collect();
                let _ = match built {
                    Ok(fds) => {
                        let borrowed: Vec<_> = fds.iter().map(|f| f.as_fd()).collect();
                        protocol::send(sock.as_fd(), &ZygoteReply::Layers { count: fds.len() }, &borrowed)
                    }
                    Err(e) => protocol::send(sock.as_fd(), &ZygoteReply::Error { message: e.to_string() }, &[]),
                };
                continue; // the pool of pre-cloned inits did not change
            }
        }
        // After the reply: the next spawn finds its init already cloned.
        refill(&mut state);
    }
}
