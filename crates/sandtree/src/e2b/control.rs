//! E2B's control plane (REST/JSON), mapped onto the engine.
//!
//! | E2B | Sandtree |
//! |-----|----------|
//! | `POST /v2/sandboxes` (201) | create (template `base`: the default image; an image name; a checkpoint id: a fork of it) |
//! | `GET /sandboxes/{id}`, `GET /v2/sandboxes` | describe, list (`metadata`, `state`, `limit`/`nextToken` with `x-next-token`) |
//! | `DELETE /sandboxes/{id}` (204) | delete (its checkpoints kept) |
//! | `POST /sandboxes/{id}/timeout` (204) | re-arm the timeout |
//! | `POST /v2/sandboxes/{id}/connect` (200) | resume if paused, extend the timeout |
//! | `POST /sandboxes/{id}/pause` (204, 409 if paused) | checkpoint (durable) + stop; the resume rolls back to it, processes included |
//! | create with `autoPause` (`lifecycle={"on_timeout": "pause"}`), `autoResume` | the timeout pauses instead of deleting; with auto-resume, the first envd request to a paused sandbox resumes it |
//! | `POST /sandboxes/{id}/snapshots` (201), `GET /snapshots`, `DELETE /templates/{id}` | checkpoints |
//! | `POST /sandboxes/{id}/fork` (201) | checkpoint + fork `count` |
//! | `GET /sandboxes/{id}/metrics` | the sandbox's usage, now |
//! | `POST /sandboxes/{id}/rollback` `{"snapshotID"}` (Sandtree's extension) | rollback in place to a snapshot of its tree, processes included |
//!
//! Every request needs `X-API-KEY: <the daemon's token>`. Errors are
//! `{"code": <HTTP status>, "message"}` (the SDK parses that shape for
//! every status) with `Should-Retry: false`.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::Json;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use sandtree_api::{
    CheckpointRequest, CreateSandboxRequest, ForkRequest, Limits, NetworkPolicy, NetworkSpec, RollbackRequest,
    SandboxInfo, SandboxStatus,
};
use serde::Deserialize;
use serde_json::{Value, json};

use super::{DEFAULT_TIMEOUT_S, E2b, ENVD_VERSION, header};

type Door = State<Arc<E2b>>;

pub fn routes() -> axum::Router<Arc<E2b>> {
    axum::Router::new()
        .route("/v2/sandboxes", post(create).get(list))
        .route("/sandboxes", get(list))
        .route("/sandboxes/{id}", get(get_info).delete(kill))
        .route("/sandboxes/{id}/timeout", post(set_timeout))
        .route("/v2/sandboxes/{id}/connect", post(connect))
        .route("/sandboxes/{id}/connect", post(connect))
        .route("/sandboxes/{id}/pause", post(pause))
        .route("/sandboxes/{id}/resume", post(connect))
        .route("/sandboxes/{id}/snapshots", post(create_snapshot))
        .route("/snapshots", get(list_snapshots))
        .route("/templates/{id}", delete(delete_snapshot))
        .route("/sandboxes/{id}/fork", post(fork))
        .route("/sandboxes/{id}/metrics", get(metrics))
        .route("/sandboxes/{id}/rollback", post(rollback))
        .route("/sandboxes/{id}/network", axum::routing::put(update_network))
}

/// E2B's egress settings (`network` of a create, the body of
/// `PUT /sandboxes/{id}/network`): `allowOut` and `denyOut` are Sandtree's
/// `allow` and `deny` (same rules: addresses, CIDRs, names; allow wins;
/// `0.0.0.0/0` denies all else), `allow_internet_access: false` adds
/// `0.0.0.0/0` to `denyOut`. What Sandtree does not do is refused by name.
#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct NetworkBody {
    #[serde(default)]
    allow_out: Vec<String>,
    #[serde(default)]
    deny_out: Vec<String>,
    /// Public URLs of the sandbox's ports (not served: see docs/e2b.md).
    allow_public_traffic: Option<bool>,
    #[serde(rename = "allow_internet_access")]
    allow_internet_access: Option<bool>,
    #[serde(flatten)]
    other: BTreeMap<String, Value>,
}

impl NetworkBody {
    /// The policy it asks for, or what it asks that Sandtree lacks.
    fn policy(self, allow_internet_access: Option<bool>) -> Result<NetworkPolicy, Failure> {
        if let Some((key, _)) = self.other.iter().find(|(_, v)| !v.is_null()) {
            return Err(unsupported(&format!("the network option {key:?}")));
        }
        let _ = self.allow_public_traffic;
        let mut deny = self.deny_out;
        let everything = "0.0.0.0/0".to_string();
        if self.allow_internet_access.or(allow_internet_access) == Some(false) && !deny.contains(&everything) {
            deny.push(everything);
        }
        Ok(NetworkPolicy { allow: self.allow_out, deny })
    }
}

async fn update_network(
    State(door): Door,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: Option<Json<NetworkBody>>,
) -> Reply {
    authorize(&door, &headers)?;
    let Json(body) = body.unwrap_or_default();
    let policy = body.policy(None)?;
    door.engine.set_network_policy(&id, policy).await.map_err(api_error)?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// An error as the SDK parses it: `{"code": <status>, "message"}`, not
/// to be retried.
pub(crate) struct Failure {
    status: StatusCode,
    message: String,
}

impl IntoResponse for Failure {
    fn into_response(self) -> Response {
        let body = Json(json!({"code": self.status.as_u16(), "message": self.message}));
        let mut resp = (self.status, body).into_response();
        resp.headers_mut().insert("should-retry", HeaderValue::from_static("false"));
        resp
    }
}

pub(crate) fn error(status: u16, message: impl Into<String>) -> Failure {
    Failure {
        status: StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
        message: message.into(),
    }
}

fn api_error(e: sandtree_runtime::Error) -> Failure {
    let api = e.to_api();
    error(api.code.http_status(), api.message)
}

/// An error of a pause, where the SDK takes 409 to mean "already paused":
/// a 409 made a 422 but for a sandbox no longer running (a pause raced by
/// another).
fn not_a_conflict(e: sandtree_runtime::Error) -> Failure {
    let stopped = e.to_api().code == sandtree_api::ErrorCode::SandboxNotRunning;
    let f = api_error(e);
    match f.status == StatusCode::CONFLICT && !stopped {
        true => Failure { status: StatusCode::UNPROCESSABLE_ENTITY, ..f },
        false => f,
    }
}

fn unsupported(what: &str) -> Failure {
    error(400, format!("{what} is not supported by Sandtree"))
}

type Reply = Result<Response, Failure>;

fn authorize(door: &E2b, headers: &HeaderMap) -> Result<(), Failure> {
    match header(headers, "x-api-key") {
        Some(key) if door.token.matches(key) => Ok(()),
        Some(_) => Err(error(401, "invalid API key: E2B_API_KEY must be the daemon's token (<data-dir>/token)")),
        None => Err(error(401, "no X-API-KEY: set E2B_API_KEY to the daemon's token (<data-dir>/token)")),
    }
}

fn rfc3339(t: SystemTime) -> String {
    sandtree_runtime::rfc3339(t)
}

/// The `Sandbox` object of create, connect and fork.
fn sandbox_object(door: &E2b, info: &SandboxInfo) -> Value {
    let template = door.meta(&info.id, |m| m.template.clone()).unwrap_or_else(|| info.image.clone());
    json!({
        "templateID": template,
        "sandboxID": info.id,
        "clientID": "sandtree",
        "envdVersion": ENVD_VERSION,
        "envdAccessToken": door.access_token(&info.id),
        "domain": null,
    })
}

fn host_memory_mb() -> u64 {
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb / 1024)
}

/// `SandboxDetail` / `ListedSandbox`.
fn detail(door: &E2b, info: &SandboxInfo) -> Value {
    let (template, started, end, paused) =
        door.meta(&info.id, |m| (m.template.clone(), m.started, m.end, m.paused.is_some()));
    // (A sandbox the door did not create: seen first now.)
    let started = started.unwrap_or_else(|| door.meta(&info.id, |m| *m.started.get_or_insert_with(SystemTime::now)));
    let end = end.unwrap_or(started + std::time::Duration::from_secs(DEFAULT_TIMEOUT_S));
    let state = if paused || info.status == SandboxStatus::Stopped { "paused" } else { "running" };
    let cpus = info
        .limits
        .cpu_millicores
        .map(|m| m.div_ceil(1000))
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get() as u64));
    let memory = info.limits.memory_bytes.map(|b| b >> 20).unwrap_or_else(host_memory_mb);
    json!({
        "templateID": template.unwrap_or_else(|| info.image.clone()),
        "sandboxID": info.id,
        "clientID": "sandtree",
        "startedAt": rfc3339(started),
        "endAt": rfc3339(end),
        "envdVersion": ENVD_VERSION,
        "cpuCount": cpus,
        "memoryMB": memory,
        "diskSizeMB": info.usage.as_ref().map_or(0, |u| u.disk_bytes >> 20),
        "state": state,
        "metadata": info.labels,
        "envdAccessToken": door.access_token(&info.id),
        "domain": null,
    })
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct CreateBody {
    #[serde(rename = "templateID")]
    template_id: Option<String>,
    timeout: Option<u64>,
    #[serde(default)]
    metadata: BTreeMap<String, String>,
    #[serde(default)]
    env_vars: BTreeMap<String, String>,
    /// At the timeout, pause rather than kill.
    auto_pause: Option<bool>,
    /// `{"enabled": true}`: a paused sandbox resumes at its first envd
    /// request (only with `autoPause`).
    auto_resume: Option<Value>,
    network: Option<NetworkBody>,
    volume_mounts: Option<Value>,
    mcp: Option<Value>,
    iam: Option<Value>,
    #[serde(rename = "allow_internet_access")]
    allow_internet_access: Option<bool>,
    /// Anything else the SDK may send (`secure`, `autoResume`, …, or a
    /// feature of a newer SDK): checked, never silently dropped.
    #[serde(flatten)]
    other: BTreeMap<String, Value>,
}

/// What a create may carry that changes nothing here: `secure` (the door
/// always gives an access token), the memory mode of an auto-pause (a
/// pause here always keeps the processes), an alias (unused).
fn harmless(key: &str, value: &Value) -> bool {
    match key {
        "secure" | "alias" | "autoPauseMemory" => true,
        _ => value.is_null(),
    }
}

async fn create(State(door): Door, headers: HeaderMap, body: Option<Json<CreateBody>>) -> Reply {
    authorize(&door, &headers)?;
    let Json(body) = body.unwrap_or_default();
    if body.volume_mounts.as_ref().is_some_and(|v| v.as_array().is_some_and(|a| !a.is_empty())) {
        return Err(unsupported("volume mounts"));
    }
    if body.mcp.is_some() {
        return Err(unsupported("the MCP gateway (use `sandtree mcp` or POST /mcp on the daemon)"));
    }
    let auto_pause = body.auto_pause == Some(true);
    let auto_resume = body.auto_resume.as_ref().and_then(|r| r.get("enabled")) == Some(&Value::Bool(true));
    if auto_resume && !auto_pause {
        return Err(error(400, "autoResume needs autoPause (on_timeout \"pause\")"));
    }
    let policy = body.network.unwrap_or_default().policy(body.allow_internet_access)?;
    if body.iam.is_some() {
        return Err(unsupported("workload identity (iam)"));
    }
    if let Some((key, _)) = body.other.iter().find(|(k, v)| !harmless(k, v)) {
        return Err(unsupported(&format!("the create option {key:?}")));
    }
    // A create repeated with its Idempotency-Key answers the sandbox the first made.
    let key = header(&headers, "idempotency-key").map(str::to_string);
    if let Some(key) = &key {
        let made = door
            .sandboxes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .find_map(|(id, m)| (m.idempotency_key.as_deref() == Some(key.as_str())).then(|| id.clone()));
        if let Some(id) = made
            && let Ok(info) = door.engine.get_sandbox(&id).await
        {
            return Ok((StatusCode::CREATED, Json(sandbox_object(&door, &info))).into_response());
        }
    }
    let template = body.template_id.clone().unwrap_or_else(|| "base".into());
    let info = if template.starts_with("ck-") {
        // A snapshot: a fork of that checkpoint, with its processes (and
        // its network: a different policy is set on the fork below).
        let req = ForkRequest { count: 1, labels: body.metadata.clone(), limits: None, files_only: false };
        let r = door.engine.fork(&template, req).await.map_err(api_error)?;
        let first = r.results.into_iter().next().ok_or_else(|| error(500, "the fork made nothing"))?;
        match (first.sandbox, first.error) {
            (Some(s), _) => s,
            (None, Some(e)) => return Err(error(e.code.http_status(), e.message)),
            (None, None) => return Err(error(500, "the fork made nothing")),
        }
    } else {
        let image = (!matches!(template.as_str(), "base" | "default")).then(|| template.clone());
        let req = CreateSandboxRequest {
            image,
            labels: body.metadata.clone(),
            limits: Limits::default(),
            network: NetworkSpec { mode: None, allow: policy.allow.clone(), deny: policy.deny.clone() },
        };
        door.engine.create_sandbox(req).await.map_err(api_error)?.sandbox
    };
    if template.starts_with("ck-") && policy != NetworkPolicy::default() {
        door.engine.set_network_policy(&info.id, policy).await.map_err(api_error)?;
    }
    door.meta(&info.id, |m| {
        m.template = Some(template);
        m.envs = body.env_vars;
        m.started = Some(SystemTime::now());
        m.idempotency_key = key;
        m.auto_pause = auto_pause;
        m.auto_resume = auto_resume;
    });
    door.arm_timeout(&info.id, body.timeout.unwrap_or(DEFAULT_TIMEOUT_S));
    Ok((StatusCode::CREATED, Json(sandbox_object(&door, &info))).into_response())
}

async fn get_info(State(door): Door, headers: HeaderMap, Path(id): Path<String>) -> Reply {
    authorize(&door, &headers)?;
    let info = door.engine.get_sandbox(&id).await.map_err(api_error)?;
    Ok(Json(detail(&door, &info)).into_response())
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct ListQuery {
    metadata: Option<String>,
    state: Option<String>,
    template: Option<String>,
    started_after: Option<String>,
    order: Option<String>,
    limit: Option<usize>,
    next_token: Option<String>,
}

/// One percent-decoding (`+` stays itself).
fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%'
            && i + 2 < b.len()
            && let Ok(v) = u8::from_str_radix(std::str::from_utf8(&b[i + 1..i + 3]).unwrap_or("zz"), 16)
        {
            out.push(v);
            i += 3;
            continue;
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The SDK's `metadata` filter: `k=v&k2=v2`, each part percent-encoded
/// once more.
fn metadata_filter(q: &str) -> BTreeMap<String, String> {
    q.split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (percent_decode(&percent_decode(k)), percent_decode(&percent_decode(v)))
        })
        .collect()
}

async fn list(State(door): Door, headers: HeaderMap, Query(q): Query<ListQuery>) -> Reply {
    authorize(&door, &headers)?;
    let wanted = q.metadata.as_deref().map(metadata_filter).unwrap_or_default();
    let states: Vec<String> = q.state.map(|s| s.split(',').map(str::to_string).collect()).unwrap_or_default();
    let after = match q.started_after.as_deref() {
        Some(t) => Some(
            crate::rfc3339::parse(t)
                .ok_or_else(|| error(400, format!("startedAfter {t:?} is not an RFC 3339 time")))?,
        ),
        None => None,
    };
    let descending = match q.order.as_deref() {
        None | Some("asc") => false,
        Some("desc") => true,
        Some(other) => return Err(error(400, format!("order {other:?} is neither asc nor desc"))),
    };
    let all = door.engine.list_sandboxes().await.map_err(api_error)?.sandboxes;
    let started = |d: &Value| d["startedAt"].as_str().and_then(crate::rfc3339::parse).unwrap_or(0);
    let mut rows: Vec<Value> = all
        .iter()
        .filter(|s| wanted.iter().all(|(k, v)| s.labels.get(k) == Some(v)))
        .map(|s| detail(&door, s))
        .filter(|d| states.is_empty() || states.iter().any(|s| d["state"] == json!(s)))
        .filter(|d| q.template.as_deref().is_none_or(|t| d["templateID"] == json!(t)))
        .filter(|d| after.is_none_or(|a| started(d) > a))
        .collect();
    rows.sort_by_key(|d| (started(d), d["sandboxID"].as_str().unwrap_or_default().to_string()));
    if descending {
        rows.reverse();
    }
    // (The token is the last sandbox of the page before: the page starts after it.)
    if let Some(token) = &q.next_token {
        let at = rows.iter().position(|d| d["sandboxID"] == json!(token)).map_or(0, |i| i + 1);
        rows.drain(..at);
    }
    paged(rows, q.limit, "sandboxID")
}

async fn kill(State(door): Door, headers: HeaderMap, Path(id): Path<String>) -> Reply {
    authorize(&door, &headers)?;
    door.engine.delete_sandbox(&id, false).await.map_err(api_error)?;
    door.forget(&id);
    Ok(StatusCode::NO_CONTENT.into_response())
}

#[derive(Deserialize, Default)]
struct TimeoutBody {
    timeout: Option<u64>,
}

async fn set_timeout(
    State(door): Door,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: Option<Json<TimeoutBody>>,
) -> Reply {
    authorize(&door, &headers)?;
    door.engine.get_sandbox(&id).await.map_err(api_error)?;
    let secs = body.and_then(|b| b.0.timeout).unwrap_or(DEFAULT_TIMEOUT_S);
    door.arm_timeout(&id, secs);
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// Resumes sandbox `id` if it is paused (a start, and a rollback to its
/// pause's checkpoint, processes included) or stopped (a start); it stays
/// paused if the rollback fails.
pub(crate) async fn resume(door: &Arc<E2b>, id: &str) -> Result<(), sandtree_runtime::Error> {
    let info = door.engine.get_sandbox(id).await?;
    if let Some(ck) = door.meta(id, |m| m.paused.clone()) {
        door.engine.start_sandbox(id).await?;
        let req = RollbackRequest { checkpoint: ck, allow_restart: false };
        door.engine.rollback(id, req).await?;
        door.meta(id, |m| m.paused = None);
    } else if info.status == SandboxStatus::Stopped {
        door.engine.start_sandbox(id).await?;
    }
    Ok(())
}

/// Pauses sandbox `id`: a durable checkpoint (with `best_effort`, the
/// processes it cannot restore left out instead of a refusal) and a stop;
/// its timeout stops until the resume.
pub(crate) async fn pause_now(door: &Arc<E2b>, id: &str, best_effort: bool) -> Result<(), sandtree_runtime::Error> {
    let req =
        CheckpointRequest { label: Some(PAUSE_LABEL.into()), wait_durable: true, best_effort, ..Default::default() };
    let ck = door.engine.checkpoint(id, req).await?.checkpoint.id;
    door.engine.stop_sandbox(id).await?;
    door.disarm_timeout(id);
    door.meta(id, |m| {
        m.paused = Some(ck);
        m.end = None;
    });
    Ok(())
}

/// The end of the timeout of a sandbox made with `autoPause`: a pause,
/// exact if it can be, else leaving out the processes the checkpoint
/// refuses (logged); a sandbox that cannot be paused at all is deleted,
/// as a timeout without auto-pause would (logged).
pub(crate) async fn pause_at_timeout(door: &Arc<E2b>, id: &str) {
    let paused = match pause_now(door, id, false).await {
        Err(e) if door.engine.get_sandbox(id).await.is_ok_and(|i| i.status == SandboxStatus::Running) => {
            tracing::warn!(sandbox = %id, "auto-pause at the timeout: {e}; pausing without what the checkpoint refuses");
            pause_now(door, id, true).await
        }
        other => other,
    };
    match paused {
        Ok(()) => tracing::info!(sandbox = %id, "E2B timeout reached: the sandbox is paused (autoPause)"),
        Err(e) => {
            tracing::warn!(sandbox = %id, "auto-pause at the timeout failed ({e}): deleting the sandbox");
            let _ = door.engine.delete_sandbox(id, false).await;
            door.forget(id);
        }
    }
}

async fn connect(
    State(door): Door,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: Option<Json<TimeoutBody>>,
) -> Reply {
    authorize(&door, &headers)?;
    resume(&door, &id).await.map_err(api_error)?;
    // A running sandbox's timeout only grows.
    let secs = body.and_then(|b| b.0.timeout).unwrap_or(DEFAULT_TIMEOUT_S);
    let left =
        door.meta(&id, |m| m.end).and_then(|end| end.duration_since(SystemTime::now()).ok()).map_or(0, |d| d.as_secs());
    if secs > left {
        door.arm_timeout(&id, secs);
    }
    let info = door.engine.get_sandbox(&id).await.map_err(api_error)?;
    Ok(Json(sandbox_object(&door, &info)).into_response())
}

async fn pause(State(door): Door, headers: HeaderMap, Path(id): Path<String>) -> Reply {
    authorize(&door, &headers)?;
    let info = door.engine.get_sandbox(&id).await.map_err(api_error)?;
    if door.meta(&id, |m| m.paused.is_some()) || info.status == SandboxStatus::Stopped {
        return Err(error(409, format!("sandbox {id} is already paused")));
    }
    // The SDK reads any 409 as "already paused" and returns False: a
    // checkpoint's refusal (a process it cannot restore, say) is answered
    // as 422 so that the SDK raises it with its reason.
    pause_now(&door, &id, false).await.map_err(not_a_conflict)?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

#[derive(Deserialize, Default)]
struct SnapshotBody {
    name: Option<String>,
}

async fn create_snapshot(
    State(door): Door,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: Option<Json<SnapshotBody>>,
) -> Reply {
    authorize(&door, &headers)?;
    let name = body.and_then(|b| b.0.name);
    // (Its process image is written right after, as for any checkpoint.)
    let req = CheckpointRequest { label: name.clone(), ..Default::default() };
    let ck = door.engine.checkpoint(&id, req).await.map_err(api_error)?.checkpoint;
    let names = vec![name.unwrap_or_else(|| ck.id.clone())];
    Ok((StatusCode::CREATED, Json(json!({"snapshotID": ck.id, "names": names}))).into_response())
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct SnapshotQuery {
    #[serde(rename = "sandboxID")]
    sandbox_id: Option<String>,
    name: Option<String>,
    limit: Option<usize>,
    next_token: Option<String>,
}

/// Labels of the checkpoints the door takes for itself (pause, fork).
const INTERNAL_LABELS: [&str; 2] = [PAUSE_LABEL, FORK_LABEL];
const PAUSE_LABEL: &str = "e2b pause";
const FORK_LABEL: &str = "e2b fork";

async fn list_snapshots(State(door): Door, headers: HeaderMap, Query(q): Query<SnapshotQuery>) -> Reply {
    authorize(&door, &headers)?;
    let mut l = door.engine.list_checkpoints(q.sandbox_id.as_deref()).await.map_err(api_error)?.checkpoints;
    l.sort_by(|a, b| a.id.cmp(&b.id));
    let rows: Vec<Value> = l
        .iter()
        .filter(|c| !c.label.as_deref().is_some_and(|l| INTERNAL_LABELS.contains(&l)))
        .filter(|c| q.sandbox_id.as_deref().is_none_or(|s| c.sandbox_id == s))
        .filter(|c| q.next_token.as_deref().is_none_or(|t| c.id.as_str() > t))
        .map(|c| (c.id.clone(), c.label.clone().unwrap_or_else(|| c.id.clone())))
        .filter(|(id, name)| q.name.as_deref().is_none_or(|n| n == name || n == id))
        .map(|(id, name)| json!({"snapshotID": id, "names": [name]}))
        .collect();
    paged(rows, q.limit, "snapshotID")
}

/// A page of `rows` (at most `limit`) and, when more follow, the token of
/// the next page (the last row's `key`) in `x-next-token`.
fn paged(rows: Vec<Value>, limit: Option<usize>, key: &str) -> Reply {
    let limit = limit.unwrap_or(usize::MAX).max(1);
    let more = rows.len() > limit;
    let page: Vec<Value> = rows.into_iter().take(limit).collect();
    let mut resp = Json(&page).into_response();
    if more && let Some(last) = page.last().and_then(|d| d[key].as_str()) {
        resp.headers_mut().insert("x-next-token", HeaderValue::from_str(last).map_err(|e| error(500, e.to_string()))?);
    }
    Ok(resp)
}

/// Any path the door does not serve.
pub(crate) async fn not_served(method: axum::http::Method, uri: axum::http::Uri) -> Failure {
    error(404, format!("{method} {} is not supported by Sandtree's E2B door", uri.path()))
}

async fn delete_snapshot(State(door): Door, headers: HeaderMap, Path(id): Path<String>) -> Reply {
    authorize(&door, &headers)?;
    // (E2B's snapshots stand alone: one that others build on goes anyway,
    // its children linked to its parent.)
    door.engine.delete_checkpoint(&id, true).await.map_err(api_error)?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

#[derive(Deserialize, Default)]
struct ForkBody {
    count: Option<u32>,
    timeout: Option<u64>,
}

async fn fork(State(door): Door, headers: HeaderMap, Path(id): Path<String>, body: Option<Json<ForkBody>>) -> Reply {
    authorize(&door, &headers)?;
    let body = body.map(|b| b.0).unwrap_or_default();
    let req = CheckpointRequest { label: Some(FORK_LABEL.into()), ..Default::default() };
    let ck = door.engine.checkpoint(&id, req).await.map_err(api_error)?.checkpoint.id;
    let template = door.meta(&id, |m| (m.template.clone(), m.envs.clone()));
    let req = ForkRequest { count: body.count.unwrap_or(1), labels: BTreeMap::new(), limits: None, files_only: false };
    let r = door.engine.fork(&ck, req).await.map_err(api_error)?;
    let mut out = Vec::new();
    for f in r.results {
        match (f.sandbox, f.error) {
            (Some(s), _) => {
                door.meta(&s.id, |m| {
                    m.template = template.0.clone();
                    m.envs = template.1.clone();
                    m.started = Some(SystemTime::now());
                });
                door.arm_timeout(&s.id, body.timeout.unwrap_or(DEFAULT_TIMEOUT_S));
                out.push(json!({"sandbox": sandbox_object(&door, &s)}));
            }
            (None, Some(e)) => out.push(json!({"error": {"code": e.code.http_status(), "message": e.message}})),
            (None, None) => {}
        }
    }
    Ok((StatusCode::CREATED, Json(out)).into_response())
}

async fn metrics(State(door): Door, headers: HeaderMap, Path(id): Path<String>) -> Reply {
    authorize(&door, &headers)?;
    let info = door.engine.get_sandbox(&id).await.map_err(api_error)?;
    let d = detail(&door, &info);
    let usage = info.usage.unwrap_or_default();
    let now = SystemTime::now();
    let unix = now.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let mem_total = usage.memory_limit_bytes.unwrap_or(d["memoryMB"].as_u64().unwrap_or(0) << 20);
    // The CPU used since the last sample (the first: since the start), as
    // a share of the sandbox's CPUs.
    let cpus = d["cpuCount"].as_f64().unwrap_or(1.0).max(1.0);
    let (since, used_before) = door.meta(&id, |m| {
        let before = m.cpu_sample.replace((now, usage.cpu_usec));
        before.unwrap_or((m.started.unwrap_or(now), 0))
    });
    let wall_us = now.duration_since(since).unwrap_or_default().as_micros() as f64;
    let used_us = usage.cpu_usec.saturating_sub(used_before) as f64;
    let cpu_pct = if wall_us > 0.0 { (100.0 * used_us / wall_us / cpus).min(100.0) } else { 0.0 };
    Ok(Json(json!([{
        "timestamp": rfc3339(now),
        "timestampUnix": unix,
        "cpuCount": d["cpuCount"],
        "cpuUsedPct": (cpu_pct * 100.0).round() / 100.0,
        "memUsed": usage.memory_bytes,
        "memTotal": mem_total,
        "memCache": 0,
        "diskUsed": usage.disk_bytes,
        "diskTotal": 0,
    }]))
    .into_response())
}

#[derive(Deserialize)]
struct RollbackBody {
    #[serde(rename = "snapshotID")]
    snapshot_id: String,
    #[serde(default, rename = "allowRestart")]
    allow_restart: bool,
}

/// Sandtree's extension: the sandbox back to a snapshot (checkpoint) of
/// its tree, in place, its processes included; answers the rollback.
async fn rollback(
    State(door): Door,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: Option<Json<RollbackBody>>,
) -> Reply {
    authorize(&door, &headers)?;
    let Some(Json(body)) = body else {
        return Err(error(400, "the body must be {\"snapshotID\": \"ck-…\"}"));
    };
    let req = RollbackRequest { checkpoint: body.snapshot_id, allow_restart: body.allow_restart };
    let r = door.engine.rollback(&id, req).await.map_err(api_error)?;
    door.meta(&id, |m| m.paused = None);
    // (The processes the door followed are gone or restored as they were.)
    door.processes.forget_sandbox(&id);
    Ok(Json(json!({
        "sandboxID": id,
        "snapshotID": r.checkpoint,
        "processes": r.processes,
        "restoredPids": r.restored_pids,
        "note": r.note,
        "durationMs": r.duration_ms,
    }))
    .into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sdks_doubly_encoded_metadata_filter_is_decoded() {
        // {"k": "v w", "a&b": "c=d"} as the SDK sends it, after the query's own decoding.
        let f = metadata_filter("k=v%2520w&a%2526b=c%253Dd");
        assert_eq!(f.get("k").map(String::as_str), Some("v w"));
        assert_eq!(f.get("a&b").map(String::as_str), Some("c=d"));
    }
}
