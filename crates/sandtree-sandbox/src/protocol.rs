//! Wire messages between daemon, zygote and init.
//!
//! Transport: `SOCK_SEQPACKET` unix sockets, one JSON document per packet,
//! file descriptors attached with `SCM_RIGHTS` (see `sandtree_sys::fdpass`).
//!
//! Daemon <-> zygote (socketpair created before the daemon has threads):
//! 1. daemon sends [`ZygoteRequest::Spawn`].
//! 2. zygote replies [`ZygoteReply::Spawned`] with a pidfd of the new init
//!    attached, or [`ZygoteReply::Error`].
//!
//! Daemon <-> init (`<run_dir>/sandboxes/<id>/init.sock`, one connection at a
//! time; a new connection replaces the old one):
//! 1. daemon sends `Hello { version }` ([`ToInit`] with a request id); init
//!    answers `Hello { version }` and then flushes `Exited` events that it
//!    queued while no daemon was connected.
//! 2. daemon sends `Spawn` with stdin/stdout/stderr attached (or asks for a
//!    pty); init answers `Spawned { pid }` (pty: master fd attached) or
//!    `Error`.
//! 3. whenever a spawned process is reaped, init sends an unsolicited
//!    [`FromInit::Exited`]. Init guarantees `Spawned` for a pid is sent
//!    before its `Exited`.
//! 4. `Kill` / `Ping` answer `Ok` / `Pong`.
//! 5. `Reroot` (rollback in place, see [`crate::reroot`]) carries one
//!    detached overlay mount fd per layer; init kills every other process,
//!    swaps its root for the new layers and answers `Ok` or `Error`.
//!
//! Daemon -> zygote `BuildLayers` asks for those overlay mounts; the reply
//! [`ZygoteReply::Layers`] carries them.

use std::io;
use std::os::fd::{BorrowedFd, OwnedFd};

use serde::{Deserialize, Serialize, de::DeserializeOwned};

use crate::config::{OverlayLayer, SandboxSpec};

/// Protocol version exchanged in `Hello`.
pub const VERSION: u32 = 4;

/// Largest packet we accept.
pub const MAX_PACKET: usize = 256 * 1024;

/// Daemon -> zygote.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ZygoteRequest {
    /// Create a sandbox and its init.
    Spawn {
        /// What to create.
        spec: SandboxSpec,
    },
    /// Build the overlay mounts of these layers (detached, one fd each).
    BuildLayers {
        /// The layers, root first.
        layers: Vec<OverlayLayer>,
    },
}

/// Zygote -> daemon.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ZygoteReply {
    /// Init runs; a pidfd for it is attached.
    Spawned {
        /// Host pid of init.
        pid: i32,
    },
    /// The overlay mounts of `BuildLayers`, attached in order.
    Layers {
        /// Number of fds attached.
        count: usize,
    },
    /// Spawning failed.
    Error {
        /// Lowercase description.
        message: String,
    },
}

/// The message of a spawn's [`Reply::Error`] when init's fork failed with
/// `EAGAIN`: the sandbox reached its task limit.
pub const TASK_LIMIT: &str = "fork: no task can be added (the sandbox's task limit is reached)";

/// How a spawned process gets stdin/stdout/stderr.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum StdioSpec {
    /// Three fds (stdin, stdout, stderr) are attached to the request.
    Fds,
    /// Init allocates a pty; the slave becomes the controlling terminal and
    /// the master is attached to the `Spawned` reply.
    Pty {
        /// Columns.
        cols: u16,
        /// Rows.
        rows: u16,
    },
}

/// Requests to init.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Request {
    /// Version handshake; must be the first request on a connection.
    Hello {
        /// Daemon protocol version.
        version: u32,
    },
    /// Fork and exec a process.
    Spawn {
        /// Argument vector; `argv[0]` is looked up in `PATH` from `env`.
        argv: Vec<String>,
        /// Complete environment.
        env: Vec<(String, String)>,
        /// Working directory.
        cwd: String,
        /// Stdio wiring.
        stdio: StdioSpec,
        /// Start a new session (background and pty processes).
        setsid: bool,
        /// Otherwise start a new process group (so timeouts kill the group).
        pgid: bool,
        /// Run as this user (a name or a uid), looked up in the sandbox's
        /// `/etc/passwd` and `/etc/group`; an empty `cwd` is then its home.
        #[serde(default)]
        user: Option<String>,
    },
    /// Send a signal.
    Kill {
        /// In-sandbox pid.
        pid: i32,
        /// Signal number.
        signal: i32,
        /// Signal the process group `pid` instead.
        group: bool,
    },
    /// Liveness check.
    Ping,
    /// Write `pid` to the sandbox's `/proc/sys/kernel/ns_last_pid`: the
    /// next process made in the sandbox gets the next free pid after it
    /// (a restore of a process that may not choose its pid itself).
    SetLastPid {
        /// In-sandbox pid.
        pid: i32,
    },
    /// Send SIGKILL to every process but init and `keep` (the first half
    /// of a rollback in place, while the daemon builds the new layers);
    /// answers `Ok` at once: the victims die and are reaped meanwhile.
    /// The exits of victims whose pid is in `restore` are not reported
    /// (the daemon brings that pid back), the next exit of that pid is.
    KillAll {
        /// Pids not to kill: process templates.
        keep: Vec<i32>,
        /// Pids the daemon will restore.
        restore: Vec<i32>,
        /// The one attached fd is the sandbox's cgroup directory (see
        /// [`Request::Reroot`]'s `members`).
        #[serde(default)]
        members: bool,
    },
    /// Wait until every process killed by `KillAll` / `Reroot` (but the
    /// restored pids) is reaped, bounded; answers `Ok` or `Error` naming
    /// them (or the failure of the last swap's end). Processes started
    /// meanwhile do not count.
    WaitGone,
    /// Kill every process but init and `keep` (no wait), then make the
    /// attached overlay mounts (one per target, root first) the sandbox's
    /// filesystem tree.
    Reroot {
        /// Mount point of each attached layer inside the sandbox (`/` first).
        targets: Vec<std::path::PathBuf>,
        /// Pids not to kill: process templates.
        keep: Vec<i32>,
        /// Pids the daemon restores right after the reply: init reports
        /// their exits.
        restore: Vec<i32>,
        /// The last attached fd is the sandbox's cgroup directory
        /// (`O_PATH`, [`crate::cgroup::Cgroup::procs_dir`]): its
        /// `cgroup.procs` lists every process of the sandbox but the
        /// daemon's pool, which is all init kills (without it, init lists
        /// its pid namespace's `/proc`). Init closes it after the kill.
        #[serde(default)]
        members: bool,
    },
    /// A layered checkpoint (see [`crate::reroot`], *restack*): if init is
    /// alone (every other pid is in `keep` or a zombie) and nothing but
    /// setup's mounts exists, make the attached overlay mounts the tree
    /// without killing anything. Otherwise the reply is an error with code
    /// `EBUSY`, naming what is in the way, and nothing changed.
    Restack {
        /// Mount point of each attached layer inside the sandbox (`/` first).
        targets: Vec<std::path::PathBuf>,
        /// Pids that may exist: process templates (stopped by the daemon).
        keep: Vec<i32>,
    },
    /// A layered checkpoint with live processes, first half: the mount
    /// check of `Restack` (the daemon holds every other process: stopped,
    /// spawns held, templates being made), then the attached overlay mounts
    /// are mounted at [`crate::reroot::STAGE`] for the stopped processes to
    /// reopen their files through. `EBUSY`: nothing changed.
    Stage {
        /// Mount point of each attached layer inside the sandbox (`/` first).
        targets: Vec<std::path::PathBuf>,
    },
    /// Undo `Stage`.
    Unstage,
    /// Second half: the staged tree becomes the root; the old one is put
    /// under `/dev` (not on top of the new root, where a `..` reaching `/`
    /// would cross into it) and detached after the reply.
    SwapStaged,
}

/// A request with its correlation id.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ToInit {
    /// Echoed in the reply.
    pub id: u64,
    /// The request.
    pub req: Request,
}

/// Replies from init.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Reply {
    /// Handshake answer.
    Hello {
        /// Init protocol version.
        version: u32,
    },
    /// Process started.
    Spawned {
        /// In-sandbox pid.
        pid: i32,
    },
    /// Generic success.
    Ok,
    /// Ping answer.
    Pong,
    /// Failure.
    Error {
        /// Lowercase description ("command not found: X").
        message: String,
        /// Shell-style exit code the failure corresponds to (127, 126).
        code: Option<i32>,
    },
}

/// Messages from init.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum FromInit {
    /// Answer to request `id`.
    Reply {
        /// Request id.
        id: u64,
        /// The answer.
        reply: Reply,
    },
    /// A spawned process was reaped.
    Exited {
        /// In-sandbox pid.
        pid: i32,
        /// Exit status if it exited.
        code: Option<i32>,
        /// Signal if it was killed.
        signal: Option<i32>,
    },
}

/// Serialise and send one message with fds.
pub fn send<T: Serialize>(sock: BorrowedFd<'_>, msg: &T, fds: &[BorrowedFd<'_>]) -> io::Result<()> {
    let data = serde_json::to_vec(msg).map_err(io::Error::other)?;
    sandtree_sys::fdpass::send_with_fds(sock, &data, fds)?;
    Ok(())
}

/// Receive and parse one message; `Ok(None)` when the peer closed.
pub fn recv<T: DeserializeOwned>(sock: BorrowedFd<'_>) -> io::Result<Option<(T, Vec<OwnedFd>)>> {
    let mut buf = vec![0u8; MAX_PACKET];
    let (n, fds) = sandtree_sys::fdpass::recv_with_fds(sock, &mut buf)?;
    if n == 0 {
        return Ok(None);
    }
    let msg = serde_json::from_slice(&buf[..n]).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
    Ok(Some((msg, fds)))
}
