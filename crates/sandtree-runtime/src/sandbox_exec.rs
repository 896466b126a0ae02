//! `exec`: run a command in a sandbox (buffered, streamed or in the background)
//! and manage background processes.
//!
//! Bytes pass unchanged: stdin from `stdin` (text), `stdin_base64` or a
//! [`StdinStream`]; output in the caller's [`OutputEncoding`] (lossy UTF-8
//! text, or base64 of the exact bytes).

use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use sandtree_api::{ExecEvent, ExecRequest, ExecResponse, OutputEncoding, ProcessInfo, ProcessList, ProcessOutput};
use sandtree_sandbox::StdinStream;
use tokio::sync::mpsc;

use crate::{Engine, Error, Result, util};

/// Default cap of captured bytes per output stream.
pub const DEFAULT_MAX_OUTPUT: usize = 1 << 20;

/// How an exec takes its stdin and answers its output, beyond the request.
#[derive(Debug, Default)]
pub struct ExecIo {
    /// Encoding of stdout and stderr in the answer.
    pub encoding: OutputEncoding,
    /// Stdin streamed chunk by chunk (then the request must carry no
    /// `stdin`, `stdin_base64` or `background`).
    pub stdin: Option<StdinStream>,
}

/// `bytes` as a JSON string in `encoding`.
pub fn encode_output(bytes: &[u8], encoding: OutputEncoding) -> String {
    match encoding {
        OutputEncoding::Utf8 => String::from_utf8_lossy(bytes).into_owned(),
        OutputEncoding::Base64 => BASE64.encode(bytes),
    }
}

/// The request's stdin bytes (`stdin` or `stdin_base64`), checked against `io`.
fn stdin_bytes(req: &ExecRequest, io: &ExecIo) -> Result<Option<Vec<u8>>> {
    if io.stdin.is_some() {
        if req.stdin.is_some() || req.stdin_base64.is_some() {
            return Err(Error::InvalidArgument(
                "a streamed exec takes its stdin from the request body after the JSON line: \
                 leave stdin and stdin_base64 out of that line"
                    .into(),
            ));
        }
        if req.background {
            return Err(Error::InvalidArgument(
                "a background process cannot take a streamed stdin (the call returns at once): \
                 pass it as stdin_base64, or run in the foreground"
                    .into(),
            ));
        }
        return Ok(None);
    }
    match (&req.stdin, &req.stdin_base64) {
        (Some(_), Some(_)) => Err(Error::InvalidArgument(
            "stdin and stdin_base64 are exclusive: pass text as stdin, or any bytes as stdin_base64".into(),
        )),
        (Some(text), None) => Ok(Some(text.as_bytes().to_vec())),
        (None, Some(b64)) => BASE64.decode(b64.trim_ascii()).map(Some).map_err(|e| {
            Error::InvalidArgument(format!(
                "stdin_base64 is not valid base64 ({e}): encode the bytes with the standard alphabet and padding"
            ))
        }),
        (None, None) => Ok(None),
    }
}

/// A request's `user`, checked: a name or a uid (init looks it up).
pub(crate) fn user_name(user: Option<&str>) -> Result<Option<String>> {
    match user {
        Some(u) if u.is_empty() || u.contains(['\0', ':', '\n']) => {
            Err(Error::InvalidArgument(format!("user {u:?} is not a user name or uid (no ':', newline or NUL)")))
        }
        u => Ok(u.map(str::to_string)),
    }
}

fn to_request(req: &ExecRequest, io: &ExecIo) -> Result<sandtree_sandbox::ExecRequest> {
    if req.cmd.is_empty() || req.cmd[0].is_empty() {
        return Err(Error::InvalidArgument("cmd must name a program, e.g. [\"ls\", \"-l\"]".into()));
    }
    if req.cmd.iter().any(|a| a.contains('\0'))
        || req.env.iter().any(|(k, v)| k.contains(['\0', '=']) || v.contains('\0'))
    {
        return Err(Error::InvalidArgument("cmd and env must not contain NUL bytes (or '=' in names)".into()));
    }
    Ok(sandtree_sandbox::ExecRequest {
        argv: req.cmd.clone(),
        env: req.env.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
        cwd: req.cwd.clone(),
        user: user_name(req.user.as_deref())?,
        stdin: stdin_bytes(req, io)?,
        timeout: req.timeout_ms.map(Duration::from_millis),
        max_output_bytes: req.max_output_bytes.unwrap_or(DEFAULT_MAX_OUTPUT),
    })
}

pub(crate) fn exec_response(out: sandtree_sandbox::ExecOutput, encoding: OutputEncoding) -> ExecResponse {
    ExecResponse {
        pid: out.pid,
        exit_code: out.exit_code,
        signal: out.signal,
        stdout: encode_output(&out.stdout, encoding),
        stderr: encode_output(&out.stderr, encoding),
        stdout_truncated: out.stdout_truncated,
        stderr_truncated: out.stderr_truncated,
        timed_out: out.timed_out,
        duration_ms: util::ms(out.duration),
    }
}

fn process_info(p: &sandtree_sandbox::ProcessInfo) -> ProcessInfo {
    ProcessInfo {
        pid: p.pid,
        cmd: p.argv.clone(),
        started_at: util::rfc3339(std::time::UNIX_EPOCH + Duration::from_secs(p.started_at)),
        running: p.running(),
        exit_code: p.exit.as_ref().and_then(|e| e.code),
        signal: p.exit.as_ref().and_then(|e| e.signal),
    }
}

/// A command that could not start answers like a shell would (127 for a
/// missing program), so callers handle it as an ordinary failed command.
fn spawn_failure(e: sandtree_sandbox::Error, encoding: OutputEncoding) -> Result<ExecResponse> {
    let (code, stderr) = match e {
        sandtree_sandbox::Error::CommandNotFound { command } => {
            (127, format!("sandtree: command not found: {command}\n"))
        }
        sandtree_sandbox::Error::SpawnFailed { message, code: Some(code) } => (code, format!("sandtree: {message}\n")),
        other => return Err(other.into()),
    };
    Ok(ExecResponse { exit_code: Some(code), stderr: encode_output(stderr.as_bytes(), encoding), ..Default::default() })
}

impl Engine {
    /// Runs a command to completion (or starts it, with `background`).
    pub async fn exec(&self, id: &str, req: ExecRequest) -> Result<ExecResponse> {
        self.exec_with(id, req, ExecIo::default()).await
    }

    /// [`Engine::exec`] with a streamed stdin and an output encoding.
    pub async fn exec_with(&self, id: &str, req: ExecRequest, io: ExecIo) -> Result<ExecResponse> {
        self.record(id)?;
        let sreq = to_request(&req, &io)?;
        let sb = self.running(id).await?;
        if req.background {
            let p = sb.spawn_background(sreq).await?;
            return Ok(ExecResponse { pid: p.pid, ..Default::default() });
        }
        let out = match io.stdin {
            Some(stdin) => sb.exec_with_stdin(sreq, stdin).await,
            None => sb.exec(sreq).await,
        };
        self.flusher.poke();
        match out {
            Ok(out) => Ok(exec_response(out, io.encoding)),
            Err(e) => spawn_failure(e, io.encoding),
        }
    }

    /// Runs a command and streams its output as events; the last is `Exit`.
    pub async fn exec_stream(&self, id: &str, req: ExecRequest) -> Result<mpsc::Receiver<ExecEvent>> {
        self.exec_stream_with(id, req, ExecIo::default()).await
    }

    /// [`Engine::exec_stream`] with a streamed stdin and an output encoding.
    /// Output is held back (not piled up) while the receiver is slow.
    pub async fn exec_stream_with(&self, id: &str, req: ExecRequest, io: ExecIo) -> Result<mpsc::Receiver<ExecEvent>> {
        self.record(id)?;
        let sreq = to_request(&req, &io)?;
        let sb = self.running(id).await?;
        let t0 = std::time::Instant::now();
        let encoding = io.encoding;
        let started = match io.stdin {
            Some(stdin) => sb.exec_stream_with_stdin(sreq, stdin).await,
            None => sb.exec_stream(sreq).await,
        };
        let mut stream = match started {
            Ok(stream) => stream,
            // A program that could not start ends its stream as a shell
            // would (as the buffered answer does): its message, then 127.
            Err(e) => {
                let failed = spawn_failure(e, encoding)?;
                let (tx, rx) = mpsc::channel(2);
                let _ = tx.try_send(ExecEvent::Stderr { data: failed.stderr });
                let _ = tx.try_send(ExecEvent::Exit(ExecResponse {
                    exit_code: failed.exit_code,
                    duration_ms: util::ms_since(t0),
                    ..Default::default()
                }));
                return Ok(rx);
            }
        };
        let (tx, rx) = mpsc::channel(64);
        let flusher = self.flusher.clone();
        tokio::spawn(async move {
            let _ = tx.send(ExecEvent::Started { pid: stream.pid }).await;
            while let Some(ev) = stream.next().await {
                let ev = match ev {
                    sandtree_sandbox::ExecEvent::Stdout(b) => ExecEvent::Stdout { data: encode_output(&b, encoding) },
                    sandtree_sandbox::ExecEvent::Stderr(b) => ExecEvent::Stderr { data: encode_output(&b, encoding) },
                    sandtree_sandbox::ExecEvent::Exit { exit, timed_out } => ExecEvent::Exit(ExecResponse {
                        pid: stream.pid,
                        exit_code: exit.code,
                        signal: exit.signal,
                        timed_out,
                        duration_ms: util::ms_since(t0),
                        ..Default::default()
                    }),
                };
                if tx.send(ev).await.is_err() {
                    break; // client went away; the process keeps its own timeout
                }
            }
            flusher.poke();
        });
        Ok(rx)
    }

    pub async fn processes(&self, id: &str) -> Result<ProcessList> {
        self.record(id)?;
        let processes = match self.live_get(id) {
            Some(sb) => sb.processes().iter().map(process_info).collect(),
            None => Vec::new(),
        };
        Ok(ProcessList { processes })
    }

    pub async fn process_output(&self, id: &str, pid: i32) -> Result<ProcessOutput> {
        self.process_output_as(id, pid, OutputEncoding::Utf8).await
    }

    /// State and buffered output of a background process, in `encoding`.
    pub async fn process_output_as(&self, id: &str, pid: i32, encoding: OutputEncoding) -> Result<ProcessOutput> {
        self.record(id)?;
        let not_found = || Error::ProcessNotFound {
            sandbox: id.to_string(),
            pid,
            detail: format!("was started through the API (GET /v1/sandboxes/{id}/processes lists those)"),
        };
        let sb = self.live_get(id).ok_or_else(not_found)?;
        let p = sb.processes().into_iter().find(|p| p.pid == pid).ok_or_else(not_found)?;
        let (stdout, stderr) = sb.process_output(pid).unwrap_or_default();
        Ok(ProcessOutput {
            process: process_info(&p),
            stdout: encode_output(&stdout, encoding),
            stderr: encode_output(&stderr, encoding),
        })
    }

    pub async fn kill_process(&self, id: &str, pid: i32, signal: i32) -> Result<()> {
        self.record(id)?;
        let sb = self.live_get(id).ok_or_else(|| Error::NotRunning(id.to_string()))?;
        // A process of the API's that has ended: nothing to signal (a kill
        // is idempotent). Any other pid must run in the sandbox.
        if sb.processes().iter().any(|p| p.pid == pid && !p.running()) {
            return Ok(());
        }
        if sb.host_pid(pid).is_none() {
            return Err(Error::ProcessNotFound { sandbox: id.to_string(), pid, detail: "runs".into() });
        }
        sb.kill_process(pid, signal).await?;
        Ok(())
    }
}
