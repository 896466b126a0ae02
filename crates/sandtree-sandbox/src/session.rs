//! Pty-backed interactive shells.
//!
//! Flow:
//! 1. `open_session` sends `Spawn { stdio: Pty }` for
//!    `bash --noprofile --norc --noediting -i`; init opens `/dev/ptmx` of the
//!    sandbox devpts, forks bash with the slave as controlling terminal
//!    (`setsid` + `TIOCSCTTY`) and returns the master fd via `SCM_RIGHTS`.
//! 2. bash's `PROMPT_COMMAND` prints the marker `ESC ] 6973;ST;<n>;<status> BEL`
//!    before every prompt (`n` counts prompts), and its `PS1` is an ordinary
//!    prompt (`root@sb-…:/tmp# `) followed by `ESC ] 6973;SE BEL`. Both are
//!    OSC sequences, which terminals ignore, so an attached human sees a
//!    normal shell. A reader task drains the master, broadcasts raw output to
//!    attached clients, and cuts the stream: the text before a start marker is
//!    the output of the last command; the prompt up to the end marker is dropped.
//!    When the shell exits, an empty chunk is broadcast as end of stream.
//! 3. `session_run` turns terminal echo and output processing off (so the
//!    output is the bytes the command wrote, no `\r` added before `\n`),
//!    writes the command as one line
//!    `eval $'<escaped>'` (so multi-line commands, heredocs and syntax
//!    errors still yield exactly one prompt) and waits for the next marker;
//!    the text before it is the command's output, the marker carries `$?`.
//!    `--noediting` keeps readline (which does its own echo) out of the way.
//! 4. On timeout `^C` is written and `timed_out` is reported; the late
//!    marker is skipped by the prompt counter.

use std::collections::HashMap;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use tokio::io::unix::AsyncFd;
use tokio::sync::{broadcast, watch};
use tokio::task::JoinHandle;

use crate::exec::DEFAULT_PATH;
use crate::protocol::{Reply, Request, StdioSpec};
use crate::sandbox::{Error, Result, Sandbox, async_fd, io_err};

const MARK_START: &[u8] = b"\x1b]6973;ST;";
const MARK_PROMPT_END: &[u8] = b"\x1b]6973;SE\x07";
const MARK_END: u8 = 0x07;
const PROMPT_COMMAND: &str =
    r#"__st_rc=$?; __st_n=$((__st_n+1)); printf '\033]6973;ST;%d;%d\007' "$__st_n" "$__st_rc""#;
/// An ordinary prompt, then the end marker (inside `\[ \]`: zero width).
const PS1: &str = r"\u@\h:\w\$ \[\e]6973;SE\a\]";
const MAX_PENDING: usize = 16 * 1024 * 1024;

/// Session identifier.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct SessionId(pub String);

/// Options of a new session.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SessionOptions {
    /// Terminal columns.
    pub cols: u16,
    /// Terminal rows.
    pub rows: u16,
    /// Extra environment.
    pub env: Vec<(String, String)>,
    /// Working directory (default `/root`, or `user`'s home).
    pub cwd: Option<String>,
    /// The user the shell runs as (a name or a uid; default root).
    pub user: Option<String>,
}

impl Default for SessionOptions {
    fn default() -> Self {
        SessionOptions { cols: 120, rows: 40, env: Vec::new(), cwd: None, user: None }
    }
}

/// A session as listed.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SessionInfo {
    /// Id.
    pub id: SessionId,
    /// In-sandbox pid of the shell.
    pub pid: i32,
    /// Start time, seconds since the epoch.
    pub started_at: u64,
}

/// Result of `session_run`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SessionRunOutput {
    /// Output: stdout and stderr interleaved, the bytes as written (the
    /// terminal's output processing is off during the run).
    pub output: Vec<u8>,
    /// `$?` of the command (None on timeout).
    pub exit_code: Option<i32>,
    /// The timeout fired (the command got `^C`).
    pub timed_out: bool,
}

#[derive(Default)]
struct Cut {
    pending: Vec<u8>,
    last_output: Vec<u8>,
    last_rc: i32,
}

struct Shared {
    master: AsyncFd<OwnedFd>,
    cut: Mutex<Cut>,
    prompts: watch::Sender<u64>,
    out: broadcast::Sender<Vec<u8>>,
    run_lock: tokio::sync::Mutex<()>,
}

struct Session {
    info: SessionInfo,
    shared: Arc<Shared>,
    reader: JoinHandle<()>,
}

/// Sessions of one sandbox handle.
#[derive(Default)]
pub(crate) struct SessionTable {
    sessions: Mutex<HashMap<String, Session>>,
    /// Slaves of the terminals of sessions a rollback restores, held by
    /// the daemon from before the kill until the shells are back
    /// ([`SessionTable::hold_terminals`]).
    held: Mutex<Vec<(i32, OwnedFd)>>,
}

impl SessionTable {
    /// (session id, shell pid) of every session.
    pub(crate) fn pids(&self) -> Vec<(String, i32)> {
        self.sessions.lock().unwrap_or_else(|e| e.into_inner()).iter().map(|(k, s)| (k.clone(), s.info.pid)).collect()
    }

    /// Forgets these sessions (their shells were killed).
    pub(crate) fn forget(&self, ids: &[String]) {
        let mut sessions = self.sessions.lock().unwrap_or_else(|e| e.into_inner());
        for id in ids {
            if let Some(s) = sessions.remove(id) {
                s.reader.abort();
            }
        }
    }

    /// A rollback is about to kill the shells `pids` and restore them from
    /// templates, which hold no end of their terminals (`sandtree_proc`'s
    /// `FdKind::terminal`): a slave of ours keeps each terminal from hanging
    /// up (the reader from reading `EIO`) until they are back
    /// ([`SessionTable::resume`]). Called before the kill (by
    /// `Sandbox::kill_all`, or `Sandbox::reroot` when it kills); a second
    /// call holds nothing more.
    pub(crate) fn hold_terminals(&self, pids: &[i32]) {
        let sessions = self.sessions.lock().unwrap_or_else(|e| e.into_inner());
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        for s in sessions.values().filter(|s| pids.contains(&s.info.pid)) {
            if held.iter().any(|(pid, _)| *pid == s.info.pid) {
                continue;
            }
            match sandtree_sys::pty::master::open_slave(s.shared.master.get_ref()) {
                Ok(fd) => held.push((s.info.pid, fd)),
                Err(e) => tracing::warn!(pid = s.info.pid, "terminal of a session not held across a rollback: {e}"),
            }
        }
    }

    /// The shells are back: the held slaves go, and a session whose reader
    /// ended (its shell had exited since the checkpoint) reads again.
    pub(crate) fn resume(&self) {
        self.held.lock().unwrap_or_else(|e| e.into_inner()).clear();
        let mut sessions = self.sessions.lock().unwrap_or_else(|e| e.into_inner());
        for s in sessions.values_mut().filter(|s| s.reader.is_finished()) {
            s.reader = tokio::spawn(read_loop(s.shared.clone()));
        }
    }

    pub(crate) fn abort_all(&self) {
        for (_, s) in self.sessions.lock().unwrap_or_else(|e| e.into_inner()).drain() {
            s.reader.abort();
        }
    }
}

/// Interactive access to a session.
pub struct SessionIo {
    /// Raw pty output from now on.
    pub output: broadcast::Receiver<Vec<u8>>,
    shared: Arc<Shared>,
}

impl SessionIo {
    /// Write bytes into the pty.
    pub async fn write(&self, data: &[u8]) -> Result<()> {
        write_all(&self.shared, data).await
    }

    /// Resize the terminal.
    pub fn resize(&self, cols: u16, rows: u16) -> Result<()> {
        sandtree_sys::pty::set_size(self.shared.master.get_ref(), cols, rows).map_err(io_err("resize pty"))
    }
}

async fn write_all(shared: &Shared, mut data: &[u8]) -> Result<()> {
    while !data.is_empty() {
        let mut guard = shared.master.writable().await.map_err(io_err("pty"))?;
        match guard.try_io(|fd| rustix::io::write(fd.get_ref(), data).map_err(Into::into)) {
            Ok(Ok(n)) => data = &data[n..],
            Ok(Err(e)) => return Err(io_err("write pty")(e)),
            Err(_would_block) => continue,
        }
    }
    Ok(())
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

async fn read_loop(shared: Arc<Shared>) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let Ok(mut guard) = shared.master.readable().await else {
            break;
        };
        let n = match guard.try_io(|fd| rustix::io::read(fd.get_ref(), &mut buf).map_err(Into::into)) {
            Ok(Ok(0)) | Ok(Err(_)) => {
                // EIO: the shell is gone; tell attached clients.
                let _ = shared.out.send(Vec::new());
                break;
            }
            Ok(Ok(n)) => n,
            Err(_would_block) => continue,
        };
        let _ = shared.out.send(buf[..n].to_vec());
        let mut cut = shared.cut.lock().unwrap_or_else(|e| e.into_inner());
        cut.pending.extend_from_slice(&buf[..n]);
        while let Some(start) = find(&cut.pending, MARK_START) {
            let Some(len) = cut.pending[start..].iter().position(|&b| b == MARK_END) else {
                break;
            };
            // Wait until the prompt that follows the marker is complete.
            let after = start + len + 1;
            let Some(prompt_len) = find(&cut.pending[after..], MARK_PROMPT_END) else {
                break;
            };
            let body = String::from_utf8_lossy(&cut.pending[start + MARK_START.len()..start + len]).into_owned();
            let mut parts = body.split(';');
            let _shell_count = parts.next();
            let rc: i32 = parts.next().and_then(|v| v.parse().ok()).unwrap_or(-1);
            let output = cut.pending[..start].to_vec();
            cut.pending.drain(..after + prompt_len + MARK_PROMPT_END.len());
            cut.last_output = output;
            cut.last_rc = rc;
            // Count prompts here rather than trusting the shell's count: a
            // shell restored from a checkpoint counts from its old value.
            shared.prompts.send_modify(|c| *c += 1);
        }
        if cut.pending.len() > MAX_PENDING {
            let excess = cut.pending.len() - MAX_PENDING;
            cut.pending.drain(..excess);
        }
    }
}

/// Quote `s` as a bash ANSI-C string `$'...'`.
fn ansi_c_quote(s: &str) -> String {
    let mut out = String::from("$'");
    for &b in s.as_bytes() {
        if b.is_ascii_alphanumeric() || b" _-./,:=+@%".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("\\x{b:02x}"));
        }
    }
    out.push('\'');
    out
}

/// Terminal modes a run switches off: echo, and output processing (which
/// turns `\n` into `\r\n`).
#[derive(Clone, Copy)]
struct RunModes {
    echo: bool,
    opost: bool,
}

/// Puts a session's terminal modes back when dropped.
struct ModesBack {
    shared: Arc<Shared>,
    was: RunModes,
}

impl Drop for ModesBack {
    fn drop(&mut self) {
        if self.was.echo || self.was.opost {
            let _ = set_modes(self.shared.master.get_ref(), self.was);
        }
    }
}

/// Sets echo and output processing; returns what they were.
fn set_modes(fd: impl AsFd, modes: RunModes) -> std::io::Result<RunModes> {
    use rustix::termios::{LocalModes, OptionalActions, OutputModes, tcgetattr, tcsetattr};
    let mut t = tcgetattr(&fd)?;
    let was =
        RunModes { echo: t.local_modes.contains(LocalModes::ECHO), opost: t.output_modes.contains(OutputModes::OPOST) };
    t.local_modes.set(LocalModes::ECHO, modes.echo);
    t.output_modes.set(OutputModes::OPOST, modes.opost);
    tcsetattr(&fd, OptionalActions::Now, &t)?;
    Ok(was)
}

impl Sandbox {
    /// Start an interactive bash on a pty.
    pub async fn open_session(&self, opts: SessionOptions) -> Result<SessionId> {
        let mut env: Vec<(String, String)> = vec![
            ("PATH".into(), DEFAULT_PATH.into()),
            ("LANG".into(), "C.UTF-8".into()),
            ("TERM".into(), "xterm-256color".into()),
            ("PS1".into(), PS1.into()),
            ("PS2".into(), String::new()),
            ("PROMPT_COMMAND".into(), PROMPT_COMMAND.into()),
        ];
        if let Some((k, v)) = crate::exec::default_home(opts.user.as_ref()) {
            env.push((k.into(), v.into()));
        }
        for (k, v) in &opts.env {
            env.retain(|(ek, _)| ek != k);
            env.push((k.clone(), v.clone()));
        }
        let argv: Vec<String> =
            ["bash", "--noprofile", "--norc", "--noediting", "-i"].iter().map(|s| s.to_string()).collect();
        let req = Request::Spawn {
            argv: argv.clone(),
            env,
            cwd: crate::exec::spawn_cwd(opts.cwd.as_ref(), opts.user.as_ref()),
            user: opts.user.clone(),
            stdio: StdioSpec::Pty { cols: opts.cols, rows: opts.rows },
            setsid: true,
            pgid: false,
        };
        let (reply, mut fds) = self.conn().request(req, &[]).await?;
        let pid = match reply {
            Reply::Spawned { pid } => pid,
            Reply::Error { message, code } => {
                return Err(crate::exec::map_spawn_error(&argv, message, code));
            }
            other => return Err(Error::Protocol(format!("unexpected spawn reply {other:?}"))),
        };
        let master = fds.pop().ok_or_else(|| Error::Protocol("no pty master received".into()))?;
        rustix::io::ioctl_fionbio(&master, true).map_err(|e| io_err("set pty nonblocking")(e.into()))?;
        let (prompts, _) = watch::channel(0u64);
        let (out, _) = broadcast::channel(1024);
        let shared = Arc::new(Shared {
            master: async_fd(master).map_err(io_err("register pty"))?,
            cut: Mutex::new(Cut::default()),
            prompts,
            out,
            run_lock: tokio::sync::Mutex::new(()),
        });
        let mut first = shared.prompts.subscribe();
        let reader = tokio::spawn(read_loop(shared.clone()));
        // (The watch guard is dropped at once: it must not live across an await.)
        let ready = tokio::time::timeout(Duration::from_secs(10), async { first.wait_for(|n| *n >= 1).await.is_ok() })
            .await
            .unwrap_or(false);
        if !ready {
            reader.abort();
            let _ = self.kill_process(pid, 9).await;
            return Err(Error::SessionTimeout);
        }
        let id = SessionId(format!("s{pid}"));
        let info = SessionInfo {
            id: id.clone(),
            pid,
            started_at: SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0),
        };
        self.inner
            .sessions
            .sessions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id.0.clone(), Session { info, shared, reader });
        Ok(id)
    }

    fn session_shared(&self, sid: &SessionId) -> Result<Arc<Shared>> {
        let sessions = self.inner.sessions.sessions.lock().unwrap_or_else(|e| e.into_inner());
        sessions.get(&sid.0).map(|s| s.shared.clone()).ok_or_else(|| Error::NoSession(sid.0.clone()))
    }

    /// Run one command in the session's shell; shell state persists.
    pub async fn session_run(
        &self,
        sid: &SessionId,
        command: &str,
        timeout: Option<Duration>,
    ) -> Result<SessionRunOutput> {
        let shared = self.session_shared(sid)?;
        let _run = shared.run_lock.lock().await;
        let mut prompts = shared.prompts.subscribe();
        let start = *prompts.borrow_and_update();
        shared.cut.lock().unwrap_or_else(|e| e.into_inner()).pending.clear();
        let modes_were = set_modes(shared.master.get_ref(), RunModes { echo: false, opost: false })
            .map_err(io_err("disable terminal echo and output processing"))?;
        // Back as they were however the run ends (an error, a cancelled
        // request): else the next run would take "off" as the user's modes.
        let _modes = ModesBack { shared: shared.clone(), was: modes_were };
        let line = format!("eval {}\n", ansi_c_quote(command));
        write_all(&shared, line.as_bytes()).await?;
        let wait = async { prompts.wait_for(|n| *n > start).await.map(|_| ()) };
        let done = match timeout {
            Some(t) => tokio::time::timeout(t, wait).await.ok(),
            None => Some(wait.await),
        };
        match done {
            Some(Ok(_)) => {
                let cut = shared.cut.lock().unwrap_or_else(|e| e.into_inner());
                Ok(SessionRunOutput { output: cut.last_output.clone(), exit_code: Some(cut.last_rc), timed_out: false })
            }
            Some(Err(_)) => Err(Error::Gone { id: self.id().to_string() }),
            None => {
                write_all(&shared, b"\x03").await?;
                // Consume the interrupted command's prompt so the next run
                // does not mistake it for its own.
                let mut prompts = shared.prompts.subscribe();
                let _ = tokio::time::timeout(Duration::from_secs(2), prompts.wait_for(|n| *n > start)).await;
                let mut cut = shared.cut.lock().unwrap_or_else(|e| e.into_inner());
                let raw = if *prompts.borrow() > start {
                    std::mem::take(&mut cut.last_output)
                } else {
                    std::mem::take(&mut cut.pending)
                };
                Ok(SessionRunOutput { output: raw, exit_code: None, timed_out: true })
            }
        }
    }

    /// Attach to a session: output subscription, writer, resize.
    pub fn session_io(&self, sid: &SessionId) -> Result<SessionIo> {
        let shared = self.session_shared(sid)?;
        Ok(SessionIo { output: shared.out.subscribe(), shared })
    }

    /// How a session's shell ended: waits for its exit (once: the first
    /// caller gets it).
    pub async fn session_exit(&self, sid: &SessionId) -> Result<crate::exec::ExitInfo> {
        let pid = {
            let sessions = self.inner.sessions.sessions.lock().unwrap_or_else(|e| e.into_inner());
            sessions.get(&sid.0).map(|s| s.info.pid).ok_or_else(|| Error::NoSession(sid.0.clone()))?
        };
        self.conn().wait_pid(pid).await
    }

    /// Terminate a session's shell (SIGHUP to its process group, then SIGKILL).
    pub async fn close_session(&self, sid: &SessionId) -> Result<()> {
        let session = self
            .inner
            .sessions
            .sessions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&sid.0)
            .ok_or_else(|| Error::NoSession(sid.0.clone()))?;
        let pid = session.info.pid;
        let _ = self.conn().request(Request::Kill { pid, signal: 1, group: true }, &[]).await;
        let _ = self.conn().request(Request::Kill { pid, signal: 9, group: true }, &[]).await;
        session.reader.abort();
        Ok(())
    }

    /// Open sessions.
    pub fn sessions(&self) -> Vec<SessionInfo> {
        let sessions = self.inner.sessions.sessions.lock().unwrap_or_else(|e| e.into_inner());
        sessions.values().map(|s| s.info.clone()).collect()
    }
}
