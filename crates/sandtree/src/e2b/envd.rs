//! envd, E2B's in-sandbox agent, served by the daemon for every sandbox
//! (the `E2b-Sandbox-Id` header names it; `X-Access-Token` must be its
//! token).
//!
//! - `GET /health` → 204.
//! - `GET /files?path=P[&username=U]` → the bytes; `POST /files` writes:
//!   `multipart/form-data` (each part's `filename` is its destination, or
//!   `path=`), or the raw body (`application/octet-stream`) to `path`;
//!   answers `[{"name", "type": "file", "path", "metadata"?}]`. A gzip
//!   body (`Content-Encoding: gzip`) is decoded; `X-Metadata-<key>`
//!   headers set every file's metadata (`user.e2b.<key>` attributes,
//!   which `EntryInfo.metadata` shows), see [`crate::upload`].
//! - `process.Process` (Connect): `Start` and `Connect` stream a process's
//!   events (`start {pid}`, `data {stdout|stderr}` in base64, `end
//!   {exitCode, exited, status}`); `List`, `SendSignal`, `SendInput`,
//!   `CloseStdin`, `StreamInput`. A process runs as the daemon's exec runs
//!   it; the door keeps the processes it started, so a client may leave a
//!   background one and `Connect` to it again, write its stdin, kill it.
//! - `filesystem.Filesystem` (Connect, unary): `Stat`, `ListDir`,
//!   `MakeDir`, `Move`, `Remove`.
//!
//! A `Start` with a `pty` opens a Sandtree session (an interactive bash on
//! a terminal): its output comes as `data.pty`, `SendInput` types
//! `input.pty`, `Update` resizes it.
//!
//! Directory watches (`CreateWatcher` / `GetWatcherEvents` /
//! `RemoveWatcher`, polled by the sync SDK; `WatchDir`, a stream, by the
//! async one) are the engine's inotify watches (`sandbox_watch.rs`).
//!
//! The user of an RPC is `Authorization: Basic base64("<user>:")`, of
//! `/files` the `username` query; absent, root. A signed `/files` URL
//! (`download_url`, `upload_url`: `signature`, `signature_expiration`)
//! names no sandbox: the door finds the one whose token signed it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use axum::extract::{FromRequest, Multipart, Query, Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use futures_util::StreamExt;
use sandtree_api::{
    CreateSessionRequest, ExecEvent, ExecRequest, FileInfo, FileKind, MakeDirRequest, MoveRequest, OutputEncoding,
};
use sandtree_runtime::{DirEvent, DirEventKind, DirWatch, ExecIo, SessionIo, StdinSender, WriteFile, stdin_channel};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::connect::{self, RpcError};
use super::{E2b, header};

type Door = State<Arc<E2b>>;

pub fn routes() -> axum::Router<Arc<E2b>> {
    axum::Router::new()
        .route("/health", get(health))
        .route("/files", get(read_file).post(write_files))
        .route("/process.Process/{method}", post(process_rpc))
        .route("/filesystem.Filesystem/{method}", post(filesystem_rpc))
}

/// The sandbox a request is for, once its access token is checked.
async fn sandbox_of(door: &Arc<E2b>, headers: &HeaderMap) -> Result<String, RpcError> {
    let id = header(headers, "e2b-sandbox-id")
        .ok_or_else(|| RpcError::invalid("no E2b-Sandbox-Id header: which sandbox is this for?"))?;
    let token = header(headers, "x-access-token").unwrap_or_default();
    if !crate::daemon::auth::constant_time_eq(token.as_bytes(), door.access_token(id).as_bytes()) {
        return Err(RpcError::new("unauthenticated", format!("wrong or missing X-Access-Token for sandbox {id}")));
    }
    unpaused(door, id).await
}

/// `id`, unless the sandbox is paused: it runs nothing then (work done now
/// would be lost at the resume, which rolls back to the pause). A sandbox
/// made with `autoResume` is resumed instead, its timeout armed again.
async fn unpaused(door: &Arc<E2b>, id: &str) -> Result<String, RpcError> {
    if door.is_paused(id) {
        let Some(timeout) = door.meta(id, |m| m.auto_resume.then_some(m.timeout_s)) else {
            return Err(RpcError::new(
                "unavailable",
                format!("sandbox {id} is paused: resume it with Sandbox.connect"),
            ));
        };
        let _resuming = door.resuming.lock().await;
        if door.is_paused(id) {
            tracing::info!(sandbox = %id, "a request to the paused sandbox resumes it (autoResume)");
            super::control::resume(door, id).await?;
            door.arm_timeout(id, timeout.unwrap_or(super::DEFAULT_TIMEOUT_S));
        }
    }
    Ok(id.to_string())
}

/// The user of an RPC: `Authorization: Basic base64("user:")`.
fn rpc_user(headers: &HeaderMap) -> Option<String> {
    let basic = header(headers, "authorization")?.strip_prefix("Basic ")?;
    let decoded = String::from_utf8(BASE64.decode(basic.trim()).ok()?).ok()?;
    let user = decoded.split(':').next()?.to_string();
    (!user.is_empty()).then_some(user)
}

/// An error of the plain HTTP routes, with the status the SDK maps.
fn http_error(e: RpcError) -> Response {
    let status = match e.code {
        "invalid_argument" => StatusCode::BAD_REQUEST,
        "unauthenticated" => StatusCode::UNAUTHORIZED,
        "not_found" => StatusCode::NOT_FOUND,
        "resource_exhausted" => StatusCode::INSUFFICIENT_STORAGE,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    };
    (status, axum::Json(json!({"code": status.as_u16(), "message": e.message}))).into_response()
}

async fn health(State(door): Door, headers: HeaderMap) -> Response {
    match sandbox_of(&door, &headers).await {
        Ok(id) if door.engine.get_sandbox(&id).await.is_ok() => StatusCode::NO_CONTENT.into_response(),
        Ok(id) => (StatusCode::BAD_GATEWAY, format!("sandbox {id} was not found")).into_response(),
        Err(e) if e.code == "unavailable" => (StatusCode::BAD_GATEWAY, e.message).into_response(),
        Err(e) => http_error(e),
    }
}

#[derive(Deserialize, Default)]
struct FilesQuery {
    path: Option<String>,
    username: Option<String>,
    /// A signed URL's (`download_url`, `upload_url`): it names no sandbox.
    signature: Option<String>,
    signature_expiration: Option<String>,
}

/// The sandbox of a `/files` request: named by its headers, or, for a
/// signed URL, the one whose token signed it for `operation` (`read`,
/// `write`), before its expiration.
async fn files_sandbox(
    door: &Arc<E2b>,
    headers: &HeaderMap,
    q: &FilesQuery,
    operation: &str,
) -> Result<String, RpcError> {
    let Some(signature) = q.signature.as_deref().filter(|_| header(headers, "e2b-sandbox-id").is_none()) else {
        return sandbox_of(door, headers).await;
    };
    let path = q.path.as_deref().unwrap_or_default();
    let user = q.username.as_deref().unwrap_or_default();
    let expiration = q.signature_expiration.as_deref();
    let id = door.signed_by((path, operation, user), signature, expiration).ok_or_else(|| {
        RpcError::new("unauthenticated", format!("the signature does not sign a {operation} of {path:?}"))
    })?;
    if let Some(e) = expiration {
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_secs();
        if e.parse::<u64>().map_or(true, |e| e < now) {
            return Err(RpcError::new("unauthenticated", "the signed URL has expired"));
        }
    }
    unpaused(door, &id).await
}

async fn read_file(State(door): Door, headers: HeaderMap, Query(q): Query<FilesQuery>) -> Response {
    let result = async {
        let id = files_sandbox(&door, &headers, &q, "read").await?;
        let path = q.path.ok_or_else(|| RpcError::invalid("no path"))?;
        let opened = door.engine.read_file(&id, &path, q.username.as_deref()).await?;
        Ok::<_, RpcError>(opened)
    }
    .await;
    match result {
        Ok(opened) => crate::daemon::routes::file_response(opened),
        Err(e) => http_error(e),
    }
}

fn written(info: &FileInfo) -> Value {
    let kind = if info.kind == FileKind::Dir { "dir" } else { "file" };
    let mut out = json!({"name": info.name, "type": kind, "path": info.path});
    if !info.metadata.is_empty() {
        out["metadata"] = json!(info.metadata);
    }
    out
}

async fn write_files(State(door): Door, headers: HeaderMap, Query(q): Query<FilesQuery>, req: Request) -> Response {
    let result = async {
        let id = files_sandbox(&door, &headers, &q, "write").await?;
        let req = crate::upload::decoded(req).map_err(RpcError::invalid)?;
        let metadata = crate::upload::metadata(&headers).map_err(RpcError::invalid)?;
        let opts = || WriteFile { user: q.username.clone(), mode: None, metadata: metadata.clone() };
        let multipart = header(&headers, "content-type").is_some_and(|t| t.starts_with("multipart/form-data"));
        let mut out = Vec::new();
        if multipart {
            let mut form = Multipart::from_request(req, &())
                .await
                .map_err(|e| RpcError::invalid(format!("not a multipart body: {e}")))?;
            while let Some(field) = form.next_field().await.map_err(|e| RpcError::invalid(e.to_string()))? {
                let path = match (&q.path, field.file_name()) {
                    (Some(p), _) => p.clone(),
                    (None, Some(name)) => name.to_string(),
                    (None, None) => return Err(RpcError::invalid("a part without a filename, and no path")),
                };
                let info = door.engine.write_file(&id, &path, opts(), field).await?;
                out.push(written(&info));
            }
        } else {
            let path = q.path.clone().ok_or_else(|| RpcError::invalid("no path"))?;
            let mut body = req.into_body().into_data_stream();
            let info = door.engine.write_file(&id, &path, opts(), &mut body).await?;
            out.push(written(&info));
        }
        if out.is_empty() {
            return Err(RpcError::invalid("no file in the upload"));
        }
        Ok(out)
    }
    .await;
    match result {
        Ok(out) => axum::Json(out).into_response(),
        Err(e) => http_error(e),
    }
}

/// The body of a unary RPC (JSON), or of a stream (envelopes).
async fn rpc_body(req: Request, streamed: bool) -> Result<Vec<Value>, RpcError> {
    let bytes = axum::body::to_bytes(req.into_body(), crate::daemon::server::MAX_BODY_BYTES)
        .await
        .map_err(|e| RpcError::invalid(format!("the body could not be read: {e}")))?;
    if streamed {
        return connect::messages(&bytes);
    }
    let v = if bytes.is_empty() {
        json!({})
    } else {
        serde_json::from_slice(&bytes).map_err(|e| RpcError::invalid(format!("not JSON: {e}")))?
    };
    Ok(vec![v])
}

fn is_stream(headers: &HeaderMap) -> bool {
    header(headers, "content-type").is_some_and(|t| t.starts_with("application/connect+json"))
}

// ------------------------------------------------------------------ processes

/// A process the door started: its config (for `List`), its stdin, and
/// the clients following its events.
struct Process {
    config: Value,
    tag: Option<String>,
    stdin: Mutex<Option<StdinSender>>,
    /// A PTY's terminal (a Sandtree session): input and size.
    pty: Option<SessionIo>,
    followers: Mutex<Vec<mpsc::Sender<Value>>>,
}

/// The processes the door runs, by (sandbox, pid).
#[derive(Default)]
pub struct Processes(Mutex<HashMap<(String, u32), Arc<Process>>>);

impl Processes {
    fn get(&self, id: &str, pid: u32) -> Option<Arc<Process>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).get(&(id.to_string(), pid)).cloned()
    }

    pub fn forget_sandbox(&self, id: &str) {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).retain(|(sb, _), _| sb != id);
    }
}

impl Process {
    /// A new follower's stream of events.
    fn follow(&self) -> mpsc::Receiver<Value> {
        let (tx, rx) = mpsc::channel(64);
        self.followers.lock().unwrap_or_else(|p| p.into_inner()).push(tx);
        rx
    }

    /// Sends an event to every follower (waiting for slow ones: the
    /// process's output is held back rather than dropped); a follower that
    /// left is forgotten.
    async fn publish(&self, ev: Value) {
        let followers = self.followers.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let mut left = false;
        for f in &followers {
            left |= f.send(ev.clone()).await.is_err();
        }
        if left {
            self.followers.lock().unwrap_or_else(|p| p.into_inner()).retain(|f| !f.is_closed());
        }
    }
}

fn selector_pid(req: &Value) -> Result<u32, RpcError> {
    req.pointer("/process/pid")
        .and_then(|p| p.as_u64().or_else(|| p.as_str().and_then(|s| s.parse().ok())))
        .map(|p| p as u32)
        .ok_or_else(|| RpcError::invalid("process.pid is required (selecting a process by tag is not supported)"))
}

/// `ExecEvent` → E2B's `ProcessEvent`.
fn event(ev: ExecEvent) -> Option<Value> {
    Some(match ev {
        ExecEvent::Started { pid } => json!({"start": {"pid": pid}}),
        ExecEvent::Stdout { data } => json!({"data": {"stdout": data}}),
        ExecEvent::Stderr { data } => json!({"data": {"stderr": data}}),
        ExecEvent::Exit(r) => {
            let (exit_code, status) = match (r.exit_code, r.signal) {
                (Some(c), _) => (c, format!("exit status {c}")),
                (None, Some(s)) => (-1, format!("signal: {s}")),
                _ => (-1, "ended".to_string()),
            };
            let mut end = json!({"exitCode": exit_code, "exited": r.exit_code.is_some(), "status": status});
            if r.timed_out {
                end["error"] = json!("timed out");
            }
            json!({"end": end})
        }
        ExecEvent::Error(e) => json!({"end": {"exitCode": -1, "exited": false, "status": "error", "error": e.message}}),
    })
}

async fn start(
    door: Arc<E2b>,
    id: String,
    req: Value,
    user: Option<String>,
    timeout_ms: Option<u64>,
) -> Result<Response, RpcError> {
    let config = req.get("process").cloned().unwrap_or_else(|| json!({}));
    let cmd = config["cmd"].as_str().ok_or_else(|| RpcError::invalid("process.cmd is required"))?.to_string();
    let mut argv = vec![cmd];
    argv.extend(config["args"].as_array().into_iter().flatten().filter_map(|a| a.as_str().map(str::to_string)));
    let mut env = door.meta(&id, |m| m.envs.clone());
    if let Some(envs) = config["envs"].as_object() {
        env.extend(envs.iter().filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string()))));
    }
    let exec = ExecRequest {
        cmd: argv,
        env,
        cwd: config["cwd"].as_str().filter(|c| !c.is_empty()).map(str::to_string),
        user,
        timeout_ms,
        ..Default::default()
    };
    if req.get("pty").is_some_and(|p| !p.is_null()) {
        return start_pty(door, id, req, exec).await;
    }
    let (stdin, stream) = match req["stdin"].as_bool() {
        Some(true) => {
            let (tx, rx) = stdin_channel(16);
            (Some(tx), Some(rx))
        }
        _ => (None, None),
    };
    let io = ExecIo { encoding: OutputEncoding::Base64, stdin: stream };
    let mut rx = door.engine.exec_stream_with(&id, exec, io).await?;
    let first = rx.recv().await.ok_or_else(|| RpcError::new("internal", "the process gave no event"))?;
    let ExecEvent::Started { pid } = first else {
        // It could not start: its message and exit, as a stream.
        let events: Vec<Result<Value, RpcError>> = std::iter::once(first)
            .chain(std::iter::from_fn(|| rx.try_recv().ok()))
            .filter_map(event)
            .map(|e| Ok(json!({"event": e})))
            .collect();
        let start = Ok(json!({"event": {"start": {"pid": 0}}}));
        return Ok(connect::stream(futures_util::stream::iter(std::iter::once(start).chain(events))));
    };
    let pid = pid as u32;
    let process = Arc::new(Process {
        config: config.clone(),
        tag: req["tag"].as_str().map(str::to_string),
        stdin: Mutex::new(stdin),
        pty: None,
        followers: Mutex::default(),
    });
    let follower = process.follow();
    door.processes.0.lock().unwrap_or_else(|p| p.into_inner()).insert((id.clone(), pid), process.clone());
    // The hub: every event to every follower; drained with none (a
    // background process whose client left keeps running).
    let hub_door = door.clone();
    tokio::spawn(async move {
        while let Some(ev) = rx.recv().await {
            if let Some(ev) = event(ev) {
                process.publish(ev).await;
            }
        }
        hub_door.processes.0.lock().unwrap_or_else(|p| p.into_inner()).remove(&(id, pid));
    });
    Ok(follow_stream(pid, follower))
}

/// `Start` with a `pty`: an interactive shell on a terminal, which is a
/// Sandtree session; its output comes as `data.pty`.
async fn start_pty(door: Arc<E2b>, id: String, req: Value, exec: ExecRequest) -> Result<Response, RpcError> {
    let size = |k: &str, default: u16| {
        req.pointer(&format!("/pty/size/{k}")).and_then(Value::as_u64).map_or(default, |v| v as u16)
    };
    let session = CreateSessionRequest {
        cwd: exec.cwd,
        user: exec.user,
        env: exec.env,
        cols: Some(size("cols", 80)),
        rows: Some(size("rows", 24)),
    };
    let info = door.engine.create_session(&id, session).await?;
    let mut io = door.engine.session_io(&id, &info.id).await?;
    // (The receiver subscribed at attach time holds what the shell printed since.)
    let fresh = io.output.resubscribe();
    let mut output = std::mem::replace(&mut io.output, fresh);
    let pid = info.pid as u32;
    let process = Arc::new(Process {
        config: req.get("process").cloned().unwrap_or_else(|| json!({})),
        tag: req["tag"].as_str().map(str::to_string),
        stdin: Mutex::new(None),
        pty: Some(io),
        followers: Mutex::default(),
    });
    let follower = process.follow();
    door.processes.0.lock().unwrap_or_else(|p| p.into_inner()).insert((id.clone(), pid), process.clone());
    let hub_door = door.clone();
    tokio::spawn(async move {
        loop {
            match output.recv().await {
                // (An empty chunk: the shell exited.)
                Ok(bytes) if bytes.is_empty() => break,
                Ok(bytes) => process.publish(json!({"data": {"pty": BASE64.encode(&bytes)}})).await,
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => continue,
                Err(tokio::sync::broadcast::error::RecvError::Closed) => break,
            }
        }
        // Its shell's status (its terminal closed: it exits, if it has not).
        let exit = tokio::time::timeout(std::time::Duration::from_secs(5), hub_door.engine.session_exit(&id, &info.id));
        let end = match exit.await {
            Ok(Ok((Some(c), _))) => json!({"exitCode": c, "exited": true, "status": format!("exit status {c}")}),
            Ok(Ok((None, Some(s)))) => json!({"exitCode": -1, "exited": false, "status": format!("signal: {s}")}),
            _ => json!({"exited": true, "status": "exited"}),
        };
        process.publish(json!({ "end": end })).await;
        hub_door.processes.0.lock().unwrap_or_else(|p| p.into_inner()).remove(&(id.clone(), pid));
        let _ = hub_door.engine.close_session(&id, &info.id).await;
    });
    Ok(follow_stream(pid, follower))
}

/// A process's events for one client: `start`, then what comes.
fn follow_stream(pid: u32, mut follower: mpsc::Receiver<Value>) -> Response {
    let start = futures_util::stream::once(async move { Ok(json!({"event": {"start": {"pid": pid}}})) });
    let rest = futures_util::stream::poll_fn(move |cx| follower.poll_recv(cx)).map(|e| Ok(json!({"event": e})));
    connect::stream(start.chain(rest))
}

async fn process_rpc(
    State(door): Door,
    axum::extract::Path(method): axum::extract::Path<String>,
    headers: HeaderMap,
    req: Request,
) -> Response {
    let streamed = is_stream(&headers);
    let result = async {
        let id = sandbox_of(&door, &headers).await?;
        let mut msgs = rpc_body(req, streamed).await?;
        let first = msgs.first().cloned().unwrap_or_else(|| json!({}));
        match method.as_str() {
            "Start" => {
                // (envd ends the process at the call's deadline, as the SDK's `timeout`.)
                let deadline = header(&headers, "connect-timeout-ms").and_then(|t| t.parse::<u64>().ok());
                start(door.clone(), id, first, rpc_user(&headers), deadline.filter(|t| *t > 0)).await
            }
            "Connect" => {
                let pid = selector_pid(&first)?;
                let p = door.processes.get(&id, pid).ok_or_else(|| not_running(pid))?;
                Ok(follow_stream(pid, p.follow()))
            }
            "StreamInput" => {
                let start = msgs.remove(0);
                let pid = start
                    .pointer("/start/process/pid")
                    .and_then(Value::as_u64)
                    .ok_or_else(|| RpcError::invalid("the first message must be start.process.pid"))?;
                let p = door.processes.get(&id, pid as u32).ok_or_else(|| not_running(pid as u32))?;
                for m in msgs {
                    if let Some(data) = m.pointer("/data/input/stdin").and_then(Value::as_str) {
                        send_stdin(&p, data).await?;
                    }
                }
                Ok(connect::answer(Ok(json!({})), true))
            }
            other => unary_process(&door, &id, other, &first).await.map(|v| connect::unary(Ok(v))),
        }
    }
    .await;
    match result {
        Ok(resp) => resp,
        Err(e) => connect::answer(Err(e), streamed),
    }
}

fn not_running(pid: u32) -> RpcError {
    RpcError::new("not_found", format!("process with pid {pid} not found"))
}

async fn send_stdin(p: &Process, data: &str) -> Result<(), RpcError> {
    let bytes = BASE64.decode(data).map_err(|e| RpcError::invalid(format!("stdin is not base64: {e}")))?;
    let sender = p.stdin.lock().unwrap_or_else(|e| e.into_inner()).take();
    let Some(sender) = sender else {
        return Err(RpcError::new("failed_precondition", "the process's stdin is closed (start it with stdin=True)"));
    };
    let ok = sender.send(bytes).await;
    *p.stdin.lock().unwrap_or_else(|e| e.into_inner()) = Some(sender);
    if !ok {
        return Err(RpcError::new("failed_precondition", "the process no longer reads its stdin"));
    }
    Ok(())
}

async fn unary_process(door: &Arc<E2b>, id: &str, method: &str, req: &Value) -> Result<Value, RpcError> {
    match method {
        "List" => {
            let map = door.processes.0.lock().unwrap_or_else(|p| p.into_inner());
            let processes: Vec<Value> = map
                .iter()
                .filter(|((sb, _), _)| sb == id)
                .map(|((_, pid), p)| {
                    let mut v = json!({"config": p.config, "pid": pid});
                    if let Some(t) = &p.tag {
                        v["tag"] = json!(t);
                    }
                    v
                })
                .collect();
            Ok(json!({"processes": processes}))
        }
        "SendSignal" => {
            let pid = selector_pid(req)?;
            let signal = match req["signal"].as_str() {
                Some("SIGNAL_SIGTERM") => 15,
                _ => 9,
            };
            door.engine.kill_process(id, pid as i32, signal).await.map_err(|e| match RpcError::from(e) {
                e if e.code == "not_found" => not_running(pid),
                e => e,
            })?;
            Ok(json!({}))
        }
        "SendInput" => {
            let pid = selector_pid(req)?;
            let p = door.processes.get(id, pid).ok_or_else(|| not_running(pid))?;
            if let (Some(data), Some(pty)) = (req.pointer("/input/pty").and_then(Value::as_str), &p.pty) {
                let bytes = BASE64.decode(data).map_err(|e| RpcError::invalid(format!("input is not base64: {e}")))?;
                pty.write(&bytes).await.map_err(|e| RpcError::new("internal", e.to_string()))?;
                return Ok(json!({}));
            }
            let data = req
                .pointer("/input/stdin")
                .and_then(Value::as_str)
                .ok_or_else(|| RpcError::invalid("input.stdin is required (input.pty: the process has no PTY)"))?;
            send_stdin(&p, data).await?;
            Ok(json!({}))
        }
        "CloseStdin" => {
            let pid = selector_pid(req)?;
            let p = door.processes.get(id, pid).ok_or_else(|| not_running(pid))?;
            p.stdin.lock().unwrap_or_else(|e| e.into_inner()).take();
            Ok(json!({}))
        }
        "Update" => {
            let pid = selector_pid(req)?;
            let p = door.processes.get(id, pid).ok_or_else(|| not_running(pid))?;
            let pty = p.pty.as_ref().ok_or_else(|| RpcError::invalid(format!("process {pid} has no PTY")))?;
            let size = |k: &str| req.pointer(&format!("/pty/size/{k}")).and_then(Value::as_u64).map(|v| v as u16);
            let (Some(cols), Some(rows)) = (size("cols"), size("rows")) else {
                return Err(RpcError::invalid("pty.size.cols and pty.size.rows are required"));
            };
            pty.resize(cols, rows).map_err(|e| RpcError::new("internal", e.to_string()))?;
            Ok(json!({}))
        }
        other => Err(RpcError::new("unimplemented", format!("process.Process/{other} is not served"))),
    }
}

// ------------------------------------------------------------------ filesystem

/// `FileInfo` → E2B's `EntryInfo`.
fn entry(info: &FileInfo) -> Value {
    let kind = match info.kind {
        FileKind::File => "FILE_TYPE_FILE",
        FileKind::Dir => "FILE_TYPE_DIRECTORY",
        FileKind::Symlink => "FILE_TYPE_SYMLINK",
        FileKind::Other => "FILE_TYPE_UNSPECIFIED",
    };
    let bits = u32::from_str_radix(&info.mode, 8).unwrap_or(0);
    let letter = match info.kind {
        FileKind::Dir => 'd',
        FileKind::Symlink => 'l',
        _ => '-',
    };
    let rwx: String = (0..9).map(|i| if bits & (0o400 >> i) != 0 { ['r', 'w', 'x'][i % 3] } else { '-' }).collect();
    let name_of = |name: &Option<String>, n: u32| name.clone().unwrap_or_else(|| n.to_string());
    let mut v = json!({
        "name": info.name, "type": kind, "path": info.path, "size": info.size.to_string(), "mode": bits,
        "permissions": format!("{letter}{rwx}"), "owner": name_of(&info.owner, info.uid),
        "group": name_of(&info.group, info.gid),
        "modifiedTime": info.modified_at, "isSymlink": info.kind == FileKind::Symlink,
    });
    if let Some(t) = &info.symlink_target {
        v["symlinkTarget"] = json!(t);
    }
    if !info.metadata.is_empty() {
        v["metadata"] = json!(info.metadata);
    }
    v
}

async fn filesystem_rpc(
    State(door): Door,
    axum::extract::Path(method): axum::extract::Path<String>,
    headers: HeaderMap,
    req: Request,
) -> Response {
    let streamed = is_stream(&headers);
    let result = async {
        let id = sandbox_of(&door, &headers).await?;
        let user = rpc_user(&headers);
        let msg = rpc_body(req, streamed).await?.into_iter().next().unwrap_or_else(|| json!({}));
        let path = || msg["path"].as_str().map(str::to_string).ok_or_else(|| RpcError::invalid("path is required"));
        let e = &door.engine;
        match method.as_str() {
            "Stat" => Ok(json!({"entry": entry(&e.stat_file(&id, &path()?, false, user.as_deref()).await?)})),
            "ListDir" => {
                let depth = msg["depth"].as_u64().or_else(|| msg["depth"].as_str()?.parse().ok()).unwrap_or(1);
                let l = e.list_files(&id, &path()?, depth.max(1) as u32, user.as_deref()).await?;
                Ok(json!({"entries": l.entries.iter().map(entry).collect::<Vec<_>>()}))
            }
            "MakeDir" => {
                let p = path()?;
                if e.stat_file(&id, &p, false, user.as_deref()).await.is_ok() {
                    return Err(RpcError::new("already_exists", format!("{p} already exists")));
                }
                let req = MakeDirRequest { path: p, user, mode: None, parents: true };
                Ok(json!({"entry": entry(&e.make_dir(&id, req).await?)}))
            }
            "Move" => {
                let field = |k: &str| {
                    msg[k].as_str().map(str::to_string).ok_or_else(|| RpcError::invalid(format!("{k} is required")))
                };
                let (from, to) = (field("source")?, field("destination")?);
                // (As envd: the destination's missing directories are made.)
                if let Some((parent, _)) = to.rsplit_once('/').filter(|(p, _)| !p.is_empty()) {
                    let mkdir =
                        MakeDirRequest { path: parent.to_string(), user: user.clone(), mode: None, parents: true };
                    e.make_dir(&id, mkdir).await?;
                }
                let req = MoveRequest { from, to, user, overwrite: true };
                Ok(json!({"entry": entry(&e.move_file(&id, req).await?)}))
            }
            "Remove" => {
                e.remove_file(&id, &path()?, true, user.as_deref()).await?;
                Ok(json!({}))
            }
            "CreateWatcher" => {
                let recursive = msg["recursive"].as_bool().unwrap_or(false);
                let watch = e.watch_dir(&id, &path()?, recursive, user.as_deref()).await?;
                Ok(json!({"watcherId": door.watchers.start(&id, watch)}))
            }
            "GetWatcherEvents" => {
                let events = door.watchers.drain(&id, msg["watcherId"].as_str().unwrap_or_default())?;
                Ok(json!({"events": events}))
            }
            "RemoveWatcher" => {
                door.watchers.remove(&id, msg["watcherId"].as_str().unwrap_or_default())?;
                Ok(json!({}))
            }
            "WatchDir" => {
                let recursive = msg["recursive"].as_bool().unwrap_or(false);
                let mut watch = e.watch_dir(&id, &path()?, recursive, user.as_deref()).await?;
                let start = futures_util::stream::once(async { Ok(json!({"start": {}})) });
                let events = futures_util::stream::poll_fn(move |cx| watch.events.poll_recv(cx))
                    .map(|ev| Ok(json!({"filesystem": fs_event(&ev)})));
                return Ok(Streamed(connect::stream(start.chain(events))));
            }
            other => Err(RpcError::new("unimplemented", format!("filesystem.Filesystem/{other} is not served"))),
        }
        .map(Unary)
    }
    .await;
    match result {
        Ok(Streamed(resp)) => resp,
        Ok(Unary(v)) => connect::answer(Ok(v), streamed),
        Err(e) => connect::answer(Err(e), streamed),
    }
}

/// A filesystem RPC's answer: one message, or a stream already made.
enum FsAnswer {
    Unary(Value),
    Streamed(Response),
}
use FsAnswer::{Streamed, Unary};

/// A change as E2B's `FilesystemEvent`.
fn fs_event(ev: &DirEvent) -> Value {
    let kind = match ev.kind {
        DirEventKind::Create => "EVENT_TYPE_CREATE",
        DirEventKind::Write => "EVENT_TYPE_WRITE",
        DirEventKind::Remove => "EVENT_TYPE_REMOVE",
        DirEventKind::Rename => "EVENT_TYPE_RENAME",
        DirEventKind::Chmod => "EVENT_TYPE_CHMOD",
    };
    json!({"name": ev.name, "type": kind})
}

/// The polled watches (`CreateWatcher`, `GetWatcherEvents`,
/// `RemoveWatcher`): each gathers its events until they are fetched.
#[derive(Default)]
pub struct Watchers(Mutex<HashMap<String, Watcher>>);

struct Watcher {
    sandbox: String,
    events: Arc<Mutex<Vec<Value>>>,
    task: tokio::task::AbortHandle,
}

impl Watchers {
    fn start(&self, id: &str, mut watch: DirWatch) -> String {
        let events: Arc<Mutex<Vec<Value>>> = Arc::default();
        let gathered = events.clone();
        let task = tokio::spawn(async move {
            while let Some(ev) = watch.events.recv().await {
                gathered.lock().unwrap_or_else(|p| p.into_inner()).push(fs_event(&ev));
            }
        })
        .abort_handle();
        let wid = format!("w-{:016x}", rand::random::<u64>());
        let w = Watcher { sandbox: id.to_string(), events, task };
        self.0.lock().unwrap_or_else(|p| p.into_inner()).insert(wid.clone(), w);
        wid
    }

    fn drain(&self, id: &str, wid: &str) -> Result<Vec<Value>, RpcError> {
        let map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let w = map
            .get(wid)
            .filter(|w| w.sandbox == id)
            .ok_or_else(|| RpcError::new("not_found", format!("no watcher {wid}")))?;
        Ok(std::mem::take(&mut *w.events.lock().unwrap_or_else(|p| p.into_inner())))
    }

    fn remove(&self, id: &str, wid: &str) -> Result<(), RpcError> {
        let mut map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        match map.get(wid) {
            Some(w) if w.sandbox == id => {
                w.task.abort();
                map.remove(wid);
                Ok(())
            }
            _ => Err(RpcError::new("not_found", format!("no watcher {wid}"))),
        }
    }

    pub fn forget_sandbox(&self, id: &str) {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).retain(|_, w| {
            let keep = w.sandbox != id;
            if !keep {
                w.task.abort();
            }
            keep
        });
    }
}
