//! `exec`: run a command in a sandbox (buffered, streamed or in the background)
//! and manage background processes.

use std::time::Duration;

use sandtree_api::{ExecEvent, ExecRequest, ExecResponse, ProcessInfo, ProcessList, ProcessOutput};
use tokio::sync::mpsc;

use crate::{Engine, Error, Result, util};

/// Default cap of captured bytes per output stream.
pub const DEFAULT_MAX_OUTPUT: usize = 1 << 20;

fn to_request(req: &ExecRequest) -> Result<sandtree_sandbox::ExecRequest> {
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
        stdin: req.stdin.as_ref().map(|s| s.as_bytes().to_vec()),
        timeout: req.timeout_ms.map(Duration::from_millis),
        max_output_bytes: req.max_output_bytes.unwrap_or(DEFAULT_MAX_OUTPUT),
    })
}

pub(crate) fn exec_response(out: sandtree_sandbox::ExecOutput) -> ExecResponse {
    ExecResponse {
        pid: out.pid,
        exit_code: out.exit_code,
        signal: out.signal,
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
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
fn spawn_failure(e: sandtree_sandbox::Error) -> Result<ExecResponse> {
    match e {
        sandtree_sandbox::Error::CommandNotFound { command } => Ok(ExecResponse {
            exit_code: Some(127),
            stderr: format!("sandtree: command not found: {command}\n"),
            ..Default::default()
        }),
        sandtree_sandbox::Error::SpawnFailed { message, code: Some(code) } => {
            Ok(ExecResponse { exit_code: Some(code), stderr: format!("sandtree: {message}\n"), ..Default::default() })
        }
        other => Err(other.into()),
    }
}

impl Engine {
    /// Runs a command to completion (or starts it, with `background`).
    pub async fn exec(&self, id: &str, req: ExecRequest) -> Result<ExecResponse> {
        self.record(id)?;
        let sreq = to_request(&req)?;
        let sb = self.running(id).await?;
        if req.background {
            let p = sb.spawn_background(sreq).await?;
            return Ok(ExecResponse { pid: p.pid, ..Default::default() });
        }
        let out = sb.exec(sreq).await;
        self.flusher.poke();
        match out {
            Ok(out) => Ok(exec_response(out)),
            Err(e) => spawn_failure(e),
        }
    }

    /// Runs a command and streams its output as events; the last is `Exit`.
    pub async fn exec_stream(&self, id: &str, req: ExecRequest) -> Result<mpsc::Receiver<ExecEvent>> {
        self.record(id)?;
        let sreq = to_request(&req)?;
        let sb = self.running(id).await?;
        let mut stream = sb.exec_stream(sreq).await?;
        let (tx, rx) = mpsc::channel(64);
        let flusher = self.flusher.clone();
        tokio::spawn(async move {
            let _ = tx.send(ExecEvent::Started { pid: stream.pid }).await;
            while let Some(ev) = stream.next().await {
                let ev = match ev {
                    sandtree_sandbox::ExecEvent::Stdout(b) => {
                        ExecEvent::Stdout { data: String::from_utf8_lossy(&b).into_owned() }
                    }
                    sandtree_sandbox::ExecEvent::Stderr(b) => {
                        ExecEvent::Stderr { data: String::from_utf8_lossy(&b).into_owned() }
                    }
                    sandtree_sandbox::ExecEvent::Exit(exit) => ExecEvent::Exit(ExecResponse {
                        pid: stream.pid,
                        exit_code: exit.code,
                        signal: exit.signal,
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
        self.record(id)?;
        let not_found = || Error::InvalidArgument(format!("no process {pid} was started through the API in {id}"));
        let sb = self.live_get(id).ok_or_else(not_found)?;
        let p = sb.processes().into_iter().find(|p| p.pid == pid).ok_or_else(not_found)?;
        let (stdout, stderr) = sb.process_output(pid).unwrap_or_default();
        Ok(ProcessOutput {
            process: process_info(&p),
            stdout: String::from_utf8_lossy(&stdout).into_owned(),
            stderr: String::from_utf8_lossy(&stderr).into_owned(),
        })
    }

    pub async fn kill_process(&self, id: &str, pid: i32, signal: i32) -> Result<()> {
        self.record(id)?;
        let sb = self.live_get(id).ok_or_else(|| Error::NotRunning(id.to_string()))?;
        sb.kill_process(pid, signal).await?;
        Ok(())
    }
}
