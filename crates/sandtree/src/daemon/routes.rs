//! The API routes: one table, used to build the router and checked against
//! the OpenAPI document by the tests (`tests/openapi.rs`).
//!
//! | method | path | body → response |
//! |--------|------|-----------------|
//! | GET    | `/v1/info` | → `DaemonInfo` |
//! | GET    | `/v1/openapi.json` | → the OpenAPI 3 document |
//! | POST   | `/v1/sandboxes` | `CreateSandboxRequest` → 201 `CreateSandboxResponse` |
//! | GET    | `/v1/sandboxes` | → `SandboxList` |
//! | GET    | `/v1/sandboxes/{id}` | → `SandboxInfo` (with usage) |
//! | DELETE | `/v1/sandboxes/{id}?checkpoints=true` | → `DeleteSandboxResponse` |
//! | POST   | `/v1/sandboxes/{id}/start`, `/stop` | → `SandboxInfo` |
//! | GET, PUT | `/v1/sandboxes/{id}/network` | (`NetworkPolicy` →) `NetworkInfo` |
//! | POST, GET | `/v1/sandboxes/{id}/ports` | (`ExposePortRequest` →) `PortInfo` / `PortList` |
//! | DELETE | `/v1/sandboxes/{id}/ports/{port}` | → 204 |
//! | GET    | `/v1/sandboxes/{id}/ports/{port}/connect` | `Upgrade: tcp` → 101, raw bytes |
//! | POST   | `/v1/sandboxes/{id}/exec[?stream=true][&encoding=base64]` | `ExecRequest`, or a streamed stdin (below) → `ExecResponse`, or NDJSON `ExecEvent`s |
//! | GET    | `/v1/sandboxes/{id}/processes` | → `ProcessList` |
//! | GET    | `/v1/sandboxes/{id}/processes/{pid}[?encoding=base64]` | → `ProcessOutput` |
//! | DELETE | `/v1/sandboxes/{id}/processes/{pid}?signal=9` | → 204 |
//! | GET    | `/v1/sandboxes/{id}/files?path=P` | → the file's bytes (`application/octet-stream`) |
//! | PUT    | `/v1/sandboxes/{id}/files?path=P[&user=U][&mode=644]` | the bytes → `FileInfo` |
//! | DELETE | `/v1/sandboxes/{id}/files?path=P[&recursive=true]` | → 204 |
//! | GET    | `/v1/sandboxes/{id}/files/stat?path=P` | → `FileInfo` |
//! | GET    | `/v1/sandboxes/{id}/files/list?path=P[&depth=1]` | → `FileList` |
//! | POST   | `/v1/sandboxes/{id}/files/mkdir` | `MakeDirRequest` → 201 `FileInfo` |
//! | POST   | `/v1/sandboxes/{id}/files/move` | `MoveRequest` → `FileInfo` |
//! | POST   | `/v1/sandboxes/{id}/sessions` | `CreateSessionRequest` (optional) → 201 `SessionInfo` |
//! | GET    | `/v1/sandboxes/{id}/sessions` | → `SessionList` |
//! | POST   | `/v1/sandboxes/{id}/sessions/{sid}/run[?encoding=base64]` | `SessionRunRequest` → `SessionRunResponse` |
//! | DELETE | `/v1/sandboxes/{id}/sessions/{sid}` | → 204 |
//! | GET    | `/v1/sandboxes/{id}/sessions/{sid}/attach` | websocket (see [`super::attach`]) |
//! | POST   | `/v1/sandboxes/{id}/checkpoints` | `CheckpointRequest` (optional) → 201 `CheckpointResponse` |
//! | GET    | `/v1/sandboxes/{id}/checkpoints` | → `CheckpointList` (the sandbox's tree) |
//! | POST   | `/v1/sandboxes/{id}/rollback` | `RollbackRequest` → `RollbackResponse` |
//! | GET    | `/v1/checkpoints` | → `CheckpointList` (every tree) |
//! | GET    | `/v1/checkpoints/{id}` | → `CheckpointInfo` |
//! | GET    | `/v1/checkpoints/{id}/image` | → the process image's summary (`sandtree checkpoint inspect`) |
//! | DELETE | `/v1/checkpoints/{id}?force=true` | → `DeleteCheckpointResponse` |
//! | POST   | `/v1/checkpoints/{id}/fork` | `ForkRequest` → `ForkResponse` |
//! | POST   | `/v1/gc` | → `GcReport` |
//! | GET    | `/v1/images` | → `ImageList` |
//! | POST   | `/v1/images` | `ImportImageRequest` → NDJSON `ImportEvent`s |
//! | DELETE | `/v1/images/{name}` | → 204 |
//!
//! # NDJSON streams
//! `POST /exec?stream=true` and `POST /v1/images` answer `200` with
//! `Content-Type: application/x-ndjson`, a chunked body of one JSON object per
//! line, each tagged by `"type"`:
//! - exec: `started {pid}`, then any number of `stdout {data}` / `stderr {data}`,
//!   then `exit {…ExecResponse}` (its `stdout`/`stderr` empty: the output
//!   came as events) or `error {code, message}`;
//! - import: `progress {phase, done_bytes, total_bytes, files}`…, then
//!   `done {…ImageInfo}` or `error {code, message}`.
//!
//! Errors found before the stream starts (unknown sandbox, invalid request,
//! an import that fails at once) are ordinary JSON error responses.
//!
//! # Bytes
//! Output (exec's `stdout`/`stderr` and `data`, a background process's
//! output, a session run's `output`) is lossy UTF-8 text by default;
//! `?encoding=base64` gives the exact bytes, base64-encoded. Stdin is
//! `stdin` (text) or `stdin_base64` (bytes) in the JSON body, which is
//! limited to 64 MiB (413 `payload_too_large`), or streams: with
//! `Content-Type: application/vnd.sandtree.exec+stdin` the body is one line
//! of `ExecRequest` JSON, `\n`, then raw stdin of any length, fed to the
//! program as it arrives (see [`super::stdin`]). With `?stream=true` the
//! events stream back while the body is still being sent (full duplex);
//! without, the daemon reads the whole body, then answers.

use std::convert::Infallible;
use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::rejection::ExtensionRejection;
use axum::extract::ws::WebSocketUpgrade;
use axum::extract::{FromRequest, Request};
use axum::handler::Handler;
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{MethodFilter, MethodRouter, on};
use axum::{Extension, Json, Router};
use sandtree_api::*;
use sandtree_runtime::{Engine, ExecIo};
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;
use utoipa::IntoParams;

use super::error::{ApiFailure, ApiJson, ApiJsonOrDefault, ApiPath, ApiQuery, ApiResult, drain, error_response};
use super::stdin;

/// The engine, as a request extension (so the router itself needs no state
/// and the route table can be probed without a running engine).
pub struct EngineState(pub Arc<Engine>);

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for EngineState {
    type Rejection = ApiFailure;

    async fn from_request_parts(parts: &mut axum::http::request::Parts, state: &S) -> Result<Self, ApiFailure> {
        let Extension(engine) = Extension::<Arc<Engine>>::from_request_parts(parts, state)
            .await
            .map_err(|e: ExtensionRejection| ApiFailure::new(ErrorCode::Internal, format!("no engine: {e}")))?;
        Ok(EngineState(engine))
    }
}

/// Runs a lifecycle verb as its own task, so that a client that disconnects
/// (axum then drops the handler) cannot stop it half-way: between its
/// metadata commit and the sandbox's switch to the new state, say.
async fn detached<T: Send + 'static>(
    op: impl std::future::Future<Output = sandtree_runtime::Result<T>> + Send + 'static,
) -> ApiResult<T> {
    match tokio::spawn(op).await {
        Ok(res) => Ok(res?),
        Err(e) => Err(ApiFailure::new(ErrorCode::Internal, format!("operation task failed: {e}"))),
    }
}

/// One route: its method, its path (axum and OpenAPI share the `{param}` syntax) and its handler.
pub struct Route {
    pub method: Method,
    pub path: &'static str,
    pub handler: MethodRouter,
}

fn route<H, T>(method: Method, path: &'static str, handler: H) -> Route
where
    H: Handler<T, ()>,
    T: 'static,
{
    let filter = MethodFilter::try_from(method.clone()).expect("standard method");
    Route { method, path, handler: on(filter, handler) }
}

/// Every API route. The single source of truth for the router.
pub fn table() -> Vec<Route> {
    vec![
        route(Method::GET, "/v1/info", info),
        route(Method::GET, "/v1/openapi.json", openapi_json),
        route(Method::POST, "/v1/sandboxes", create_sandbox),
        route(Method::GET, "/v1/sandboxes", list_sandboxes),
        route(Method::GET, "/v1/sandboxes/{id}", get_sandbox),
        route(Method::DELETE, "/v1/sandboxes/{id}", delete_sandbox),
        route(Method::POST, "/v1/sandboxes/{id}/start", start_sandbox),
        route(Method::POST, "/v1/sandboxes/{id}/stop", stop_sandbox),
        route(Method::GET, "/v1/sandboxes/{id}/network", get_network),
        route(Method::PUT, "/v1/sandboxes/{id}/network", set_network),
        route(Method::POST, "/v1/sandboxes/{id}/ports", expose_port),
        route(Method::GET, "/v1/sandboxes/{id}/ports", list_ports),
        route(Method::DELETE, "/v1/sandboxes/{id}/ports/{port}", close_port),
        route(Method::GET, "/v1/sandboxes/{id}/ports/{port}/connect", connect_port),
        route(Method::POST, "/v1/sandboxes/{id}/exec", exec),
        route(Method::GET, "/v1/sandboxes/{id}/processes", list_processes),
        route(Method::GET, "/v1/sandboxes/{id}/processes/{pid}", process_output),
        route(Method::DELETE, "/v1/sandboxes/{id}/processes/{pid}", kill_process),
        route(Method::GET, "/v1/sandboxes/{id}/files", read_file),
        route(Method::PUT, "/v1/sandboxes/{id}/files", write_file),
        route(Method::DELETE, "/v1/sandboxes/{id}/files", remove_file),
        route(Method::GET, "/v1/sandboxes/{id}/files/stat", stat_file),
        route(Method::GET, "/v1/sandboxes/{id}/files/list", list_files),
        route(Method::POST, "/v1/sandboxes/{id}/files/mkdir", make_dir),
        route(Method::POST, "/v1/sandboxes/{id}/files/move", move_file),
        route(Method::POST, "/v1/sandboxes/{id}/sessions", create_session),
        route(Method::GET, "/v1/sandboxes/{id}/sessions", list_sessions),
        route(Method::POST, "/v1/sandboxes/{id}/sessions/{sid}/run", session_run),
        route(Method::DELETE, "/v1/sandboxes/{id}/sessions/{sid}", close_session),
        route(Method::GET, "/v1/sandboxes/{id}/sessions/{sid}/attach", attach_session),
        route(Method::POST, "/v1/sandboxes/{id}/checkpoints", create_checkpoint),
        route(Method::GET, "/v1/sandboxes/{id}/checkpoints", sandbox_checkpoints),
        route(Method::POST, "/v1/sandboxes/{id}/rollback", rollback),
        route(Method::GET, "/v1/checkpoints", list_checkpoints),
        route(Method::GET, "/v1/checkpoints/{id}", get_checkpoint),
        route(Method::GET, "/v1/checkpoints/{id}/image", checkpoint_image),
        route(Method::DELETE, "/v1/checkpoints/{id}", delete_checkpoint),
        route(Method::POST, "/v1/checkpoints/{id}/fork", fork),
        route(Method::POST, "/v1/gc", gc),
        route(Method::GET, "/v1/images", list_images),
        route(Method::POST, "/v1/images", import_image),
        route(Method::DELETE, "/v1/images/{name}", delete_image),
    ]
}

/// The API router (no engine attached: add it with `Extension(Arc<Engine>)`).
/// Unknown paths answer 404 `route_not_found`, known paths with another
/// method 405 `method_not_allowed`.
pub fn api_router() -> Router {
    let mut router = Router::new();
    for r in table() {
        router = router.route(r.path, r.handler);
    }
    router.fallback(route_not_found).method_not_allowed_fallback(method_not_allowed)
}

async fn route_not_found(method: Method, uri: axum::http::Uri) -> Response {
    error_response(ApiError::new(
        ErrorCode::RouteNotFound,
        format!("no route {method} {}: see GET /v1/openapi.json for the API", uri.path()),
    ))
}

async fn method_not_allowed(method: Method, uri: axum::http::Uri) -> Response {
    error_response(ApiError::new(
        ErrorCode::MethodNotAllowed,
        format!("{} does not accept {method}: see GET /v1/openapi.json for the API", uri.path()),
    ))
}

const NDJSON: &str = "application/x-ndjson";

/// A `200 application/x-ndjson` response streaming `rx` one JSON per line.
fn ndjson_response<T: Serialize + Send + 'static>(first: Option<T>, rx: mpsc::Receiver<T>) -> Response {
    let first = futures_util::stream::iter(first);
    let rest = futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|ev| (ev, rx)) });
    use futures_util::StreamExt;
    let lines = first.chain(rest).map(|ev| {
        let mut line = serde_json::to_vec(&ev).unwrap_or_else(|e| {
            format!(r#"{{"type":"error","code":"internal","message":"cannot encode event: {e}"}}"#).into_bytes()
        });
        line.push(b'\n');
        Ok::<_, Infallible>(Bytes::from(line))
    });
    let mut resp = Body::from_stream(lines).into_response();
    resp.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static(NDJSON));
    resp
}

// ---------------------------------------------------------------- daemon

/// Daemon version, state store and counts.
#[utoipa::path(get, path = "/v1/info", tag = "daemon",
    responses((status = 200, body = DaemonInfo), (status = 500, body = ErrorBody)))]
pub async fn info(EngineState(e): EngineState) -> ApiResult<Json<DaemonInfo>> {
    Ok(Json(e.info().await?))
}

/// This OpenAPI document.
#[utoipa::path(get, path = "/v1/openapi.json", tag = "daemon",
    responses((status = 200, description = "The OpenAPI 3 document", content_type = "application/json")))]
pub async fn openapi_json() -> Response {
    let mut resp = super::openapi::document_json().into_response();
    resp.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    resp
}

/// Deletes orphaned subvolumes and stale runtime state.
#[utoipa::path(post, path = "/v1/gc", tag = "daemon",
    responses((status = 200, body = GcReport), (status = 500, body = ErrorBody)))]
pub async fn gc(EngineState(e): EngineState) -> ApiResult<Json<GcReport>> {
    Ok(Json(detached(async move { e.gc().await }).await?))
}

// ---------------------------------------------------------------- sandboxes

/// Creates and starts a sandbox.
#[utoipa::path(post, path = "/v1/sandboxes", tag = "sandboxes", request_body = CreateSandboxRequest,
    responses((status = 201, body = CreateSandboxResponse), (status = 400, body = ErrorBody),
              (status = 404, description = "image_not_found", body = ErrorBody), (status = 507, body = ErrorBody)))]
pub async fn create_sandbox(
    EngineState(e): EngineState,
    ApiJsonOrDefault(req): ApiJsonOrDefault<CreateSandboxRequest>,
) -> ApiResult<(StatusCode, Json<CreateSandboxResponse>)> {
    Ok((StatusCode::CREATED, Json(detached(async move { e.create_sandbox(req).await }).await?)))
}

/// Lists sandboxes.
#[utoipa::path(get, path = "/v1/sandboxes", tag = "sandboxes", responses((status = 200, body = SandboxList)))]
pub async fn list_sandboxes(EngineState(e): EngineState) -> ApiResult<Json<SandboxList>> {
    Ok(Json(e.list_sandboxes().await?))
}

/// Describes a sandbox, with its resource usage.
#[utoipa::path(get, path = "/v1/sandboxes/{id}", tag = "sandboxes", params(("id" = String, Path, description = "Sandbox id")),
    responses((status = 200, body = SandboxInfo), (status = 404, body = ErrorBody)))]
pub async fn get_sandbox(EngineState(e): EngineState, ApiPath(id): ApiPath<String>) -> ApiResult<Json<SandboxInfo>> {
    Ok(Json(e.get_sandbox(&id).await?))
}

#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct DeleteSandboxQuery {
    /// Also delete the sandbox's checkpoints (default: keep them, they can
    /// seed forks), except those another sandbox stands on and their
    /// ancestors: the response lists what was kept and why.
    #[serde(default)]
    pub checkpoints: bool,
}

/// Deletes a sandbox (kills its processes, removes its writable layer).
#[utoipa::path(delete, path = "/v1/sandboxes/{id}", tag = "sandboxes",
    params(("id" = String, Path, description = "Sandbox id"), DeleteSandboxQuery),
    responses((status = 200, body = DeleteSandboxResponse), (status = 404, body = ErrorBody)))]
pub async fn delete_sandbox(
    EngineState(e): EngineState,
    ApiPath(id): ApiPath<String>,
    ApiQuery(q): ApiQuery<DeleteSandboxQuery>,
) -> ApiResult<Json<DeleteSandboxResponse>> {
    Ok(Json(detached(async move { e.delete_sandbox(&id, q.checkpoints).await }).await?))
}

/// Starts a stopped sandbox from its filesystem state.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/start", tag = "sandboxes", params(("id" = String, Path, description = "Sandbox id")),
    responses((status = 200, body = SandboxInfo), (status = 404, body = ErrorBody)))]
pub async fn start_sandbox(EngineState(e): EngineState, ApiPath(id): ApiPath<String>) -> ApiResult<Json<SandboxInfo>> {
    Ok(Json(detached(async move { e.start_sandbox(&id).await }).await?))
}

/// Stops a sandbox's processes; its filesystem stays.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/stop", tag = "sandboxes", params(("id" = String, Path, description = "Sandbox id")),
    responses((status = 200, body = SandboxInfo), (status = 404, body = ErrorBody)))]
pub async fn stop_sandbox(EngineState(e): EngineState, ApiPath(id): ApiPath<String>) -> ApiResult<Json<SandboxInfo>> {
    Ok(Json(detached(async move { e.stop_sandbox(&id).await }).await?))
}

/// A sandbox's network: mode, policy, addresses, bytes in and out.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/network", tag = "sandboxes", params(("id" = String, Path, description = "Sandbox id")),
    responses((status = 200, body = NetworkInfo), (status = 404, body = ErrorBody)))]
pub async fn get_network(EngineState(e): EngineState, ApiPath(id): ApiPath<String>) -> ApiResult<Json<NetworkInfo>> {
    Ok(Json(e.get_sandbox(&id).await?.network))
}

/// Replaces a sandbox's egress policy: on its router at once (for new
/// connections), and for its next start and its forks. A malformed rule
/// (a bad CIDR, an empty name, a rule in both lists) is refused whole.
#[utoipa::path(put, path = "/v1/sandboxes/{id}/network", tag = "sandboxes", params(("id" = String, Path, description = "Sandbox id")),
    request_body = NetworkPolicy,
    responses((status = 200, body = NetworkInfo), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn set_network(
    EngineState(e): EngineState,
    ApiPath(id): ApiPath<String>,
    ApiJson(policy): ApiJson<NetworkPolicy>,
) -> ApiResult<Json<NetworkInfo>> {
    Ok(Json(detached(async move { e.set_network_policy(&id, policy).await }).await?))
}

/// Makes a port of the sandbox reachable on the daemon's host: answers
/// `127.0.0.1:<host port>` (the same for a port already exposed).
#[utoipa::path(post, path = "/v1/sandboxes/{id}/ports", tag = "sandboxes", params(("id" = String, Path, description = "Sandbox id")),
    request_body = ExposePortRequest,
    responses((status = 200, body = PortInfo), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn expose_port(
    EngineState(e): EngineState,
    ApiPath(id): ApiPath<String>,
    ApiJson(req): ApiJson<ExposePortRequest>,
) -> ApiResult<Json<PortInfo>> {
    Ok(Json(e.expose_port(&id, req.port).await?))
}

/// A sandbox's exposed ports.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/ports", tag = "sandboxes", params(("id" = String, Path, description = "Sandbox id")),
    responses((status = 200, body = PortList), (status = 404, body = ErrorBody)))]
pub async fn list_ports(EngineState(e): EngineState, ApiPath(id): ApiPath<String>) -> ApiResult<Json<PortList>> {
    Ok(Json(e.list_ports(&id)?))
}

/// Closes an exposed port.
#[utoipa::path(delete, path = "/v1/sandboxes/{id}/ports/{port}", tag = "sandboxes",
    params(("id" = String, Path, description = "Sandbox id"), ("port" = u16, Path, description = "Port inside the sandbox")),
    responses((status = 204), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn close_port(
    EngineState(e): EngineState,
    ApiPath((id, port)): ApiPath<(String, u16)>,
) -> ApiResult<StatusCode> {
    e.close_port(&id, port)?;
    Ok(StatusCode::NO_CONTENT)
}

/// A connection to a port inside the sandbox, through the API (and so
/// behind its token off the unix socket): `Connection: Upgrade`,
/// `Upgrade: tcp`; after `101` the connection carries the bytes both ways.
/// `sandtree port SB PORT --listen ADDR` serves a local port this way.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/ports/{port}/connect", tag = "sandboxes",
    params(("id" = String, Path, description = "Sandbox id"), ("port" = u16, Path, description = "Port inside the sandbox")),
    responses((status = 101, description = "Upgraded: raw bytes both ways"), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn connect_port(
    EngineState(e): EngineState,
    ApiPath((id, port)): ApiPath<(String, u16)>,
    mut req: axum::extract::Request,
) -> ApiResult<Response> {
    let wants_tcp = req
        .headers()
        .get(hyper::header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("tcp"));
    if !wants_tcp {
        return Err(ApiFailure::invalid("connect needs `Connection: Upgrade` and `Upgrade: tcp`".to_string()));
    }
    let mut inside = e.connect_port(&id, port).await?;
    let upgrade = hyper::upgrade::on(&mut req);
    tokio::spawn(async move {
        if let Ok(upgraded) = upgrade.await {
            let mut outside = hyper_util::rt::TokioIo::new(upgraded);
            let _ = tokio::io::copy_bidirectional(&mut outside, &mut inside).await;
        }
    });
    Ok(Response::builder()
        .status(StatusCode::SWITCHING_PROTOCOLS)
        .header(hyper::header::CONNECTION, "Upgrade")
        .header(hyper::header::UPGRADE, "tcp")
        .body(axum::body::Body::empty())
        .expect("a response"))
}

// ---------------------------------------------------------------- exec

#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ExecQuery {
    /// Stream `ExecEvent`s as NDJSON instead of one `ExecResponse` at the end.
    #[serde(default)]
    pub stream: bool,
    /// Encoding of the output: `utf8` (default, lossy text) or `base64` (the exact bytes).
    #[serde(default)]
    pub encoding: OutputEncoding,
}

/// Runs a command (to completion, streamed, or in the background).
///
/// The body is an `ExecRequest` (JSON, at most 64 MiB), or, with
/// `Content-Type: application/vnd.sandtree.exec+stdin`, one line of
/// `ExecRequest` JSON, a newline, then the raw stdin bytes to the end of
/// the body, of any length: they are fed to the program as they arrive. With
/// `?stream=true` the answer streams while the body is still being sent
/// (read it as you write); without, the whole body is read, then answered.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/exec", tag = "exec",
    request_body(content(
        (ExecRequest = "application/json"),
        (String = "application/vnd.sandtree.exec+stdin",
            example = json!("{\"cmd\":[\"sha256sum\"]}\n<raw stdin bytes to the end of the body>")),
    )),
    params(("id" = String, Path, description = "Sandbox id"), ExecQuery),
    responses(
        (status = 200, description = "`ExecResponse`, or with `?stream=true` one `ExecEvent` per line",
            content((ExecResponse = "application/json"), (ExecEvent = "application/x-ndjson"))),
        (status = 400, body = ErrorBody), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody),
        (status = 413, description = "payload_too_large: a JSON body over 64 MiB (stream stdin instead)", body = ErrorBody)))]
pub async fn exec(
    EngineState(e): EngineState,
    ApiPath(id): ApiPath<String>,
    ApiQuery(q): ApiQuery<ExecQuery>,
    body: Request,
) -> ApiResult<Response> {
    if stdin::is_streamed_stdin(body.headers()) {
        let mut rest = body.into_body().into_data_stream();
        let (req, first) = match stdin::split(&mut rest).await {
            Ok(split) => split,
            Err(e) => {
                drain(&mut rest).await;
                return Err(e);
            }
        };
        let (input, feeder) = stdin::feed(first, rest);
        let io = ExecIo { encoding: q.encoding, stdin: Some(input) };
        if q.stream {
            let rx = e.exec_stream_with(&id, req, io).await?;
            return Ok(ndjson_response(None, rx));
        }
        // A buffered answer comes once the body has ended (see `stdin`).
        let res = e.exec_with(&id, req, io).await;
        let _ = feeder.await;
        return Ok(Json(res?).into_response());
    }
    let ApiJson(req) = ApiJson::<ExecRequest>::from_request(body, &()).await?;
    let io = ExecIo { encoding: q.encoding, stdin: None };
    if q.stream && !req.background {
        let rx = e.exec_stream_with(&id, req, io).await?;
        return Ok(ndjson_response(None, rx));
    }
    Ok(Json(e.exec_with(&id, req, io).await?).into_response())
}

#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct EncodingQuery {
    /// Encoding of the output: `utf8` (default, lossy text) or `base64` (the exact bytes).
    #[serde(default)]
    pub encoding: OutputEncoding,
}

/// Lists the processes started through the API (`background: true`).
#[utoipa::path(get, path = "/v1/sandboxes/{id}/processes", tag = "exec", params(("id" = String, Path, description = "Sandbox id")),
    responses((status = 200, body = ProcessList), (status = 404, body = ErrorBody)))]
pub async fn list_processes(EngineState(e): EngineState, ApiPath(id): ApiPath<String>) -> ApiResult<Json<ProcessList>> {
    Ok(Json(e.processes(&id).await?))
}

/// State and buffered output of a background process.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/processes/{pid}", tag = "exec",
    params(("id" = String, Path, description = "Sandbox id"), ("pid" = i32, Path, description = "Pid inside the sandbox"),
           EncodingQuery),
    responses((status = 200, body = ProcessOutput), (status = 404, body = ErrorBody)))]
pub async fn process_output(
    EngineState(e): EngineState,
    ApiPath((id, pid)): ApiPath<(String, i32)>,
    ApiQuery(q): ApiQuery<EncodingQuery>,
) -> ApiResult<Json<ProcessOutput>> {
    Ok(Json(e.process_output_as(&id, pid, q.encoding).await?))
}

#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct KillQuery {
    /// Signal number (default 9, SIGKILL).
    #[serde(default)]
    pub signal: Option<i32>,
}

/// Sends a signal to a background process.
#[utoipa::path(delete, path = "/v1/sandboxes/{id}/processes/{pid}", tag = "exec",
    params(("id" = String, Path, description = "Sandbox id"), ("pid" = i32, Path, description = "Pid inside the sandbox"), KillQuery),
    responses((status = 204, description = "Signal sent"), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)))]
pub async fn kill_process(
    EngineState(e): EngineState,
    ApiPath((id, pid)): ApiPath<(String, i32)>,
    ApiQuery(q): ApiQuery<KillQuery>,
) -> ApiResult<StatusCode> {
    e.kill_process(&id, pid, q.signal.unwrap_or(9)).await?;
    Ok(StatusCode::NO_CONTENT)
}

// ---------------------------------------------------------------- files

#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct FileQuery {
    /// Path in the sandbox: absolute, or relative to the home of `user`.
    pub path: String,
    /// The user whose home relative paths start from (default root).
    #[serde(default)]
    pub user: Option<String>,
}

/// Reads a file: its bytes, streamed.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/files", tag = "files",
    params(("id" = String, Path, description = "Sandbox id"), FileQuery),
    responses((status = 200, description = "The file's bytes", content_type = "application/octet-stream"),
              (status = 400, body = ErrorBody), (status = 404, description = "sandbox_not_found, file_not_found", body = ErrorBody)))]
pub async fn read_file(
    EngineState(e): EngineState,
    ApiPath(id): ApiPath<String>,
    ApiQuery(q): ApiQuery<FileQuery>,
) -> ApiResult<Response> {
    let opened = e.read_file(&id, &q.path, q.user.as_deref()).await?;
    Ok(file_response(opened))
}

/// `200 application/octet-stream`: an opened file's bytes, streamed in
/// chunks as the client reads them (the files API, the E2B door).
pub fn file_response(opened: sandtree_runtime::OpenedFile) -> Response {
    let file = tokio::fs::File::from_std(opened.file);
    let chunks = futures_util::stream::unfold(file, |mut file| async move {
        use tokio::io::AsyncReadExt;
        let mut buf = vec![0u8; 256 << 10];
        match file.read(&mut buf).await {
            Ok(0) => None,
            Ok(n) => {
                buf.truncate(n);
                Some((Ok::<_, std::io::Error>(Bytes::from(buf)), file))
            }
            Err(err) => Some((Err(err), file)),
        }
    });
    let mut resp = Body::from_stream(chunks).into_response();
    resp.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/octet-stream"));
    resp.headers_mut().insert(header::CONTENT_LENGTH, HeaderValue::from(opened.info.size));
    resp
}

#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct WriteFileQuery {
    /// Path in the sandbox: absolute, or relative to the home of `user`.
    pub path: String,
    /// Owner of a file created and of the directories made (default root).
    #[serde(default)]
    pub user: Option<String>,
    /// Permission bits as octal text (default `644`, or the replaced file's).
    #[serde(default)]
    pub mode: Option<String>,
}

/// Writes a file: the body's bytes, of any length, replace it whole once
/// the body has ended; missing directories are made. A gzip body
/// (`Content-Encoding: gzip`) is decoded; `X-Metadata-<key>: <value>`
/// headers give the file its metadata (stored as `user.e2b.<key>`
/// extended attributes, keys lowercased), replacing the old file's.
#[utoipa::path(put, path = "/v1/sandboxes/{id}/files", tag = "files",
    request_body(content = String, content_type = "application/octet-stream", description = "The file's new bytes"),
    params(("id" = String, Path, description = "Sandbox id"), WriteFileQuery),
    responses((status = 200, body = FileInfo), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody),
              (status = 507, body = ErrorBody)))]
pub async fn write_file(
    EngineState(e): EngineState,
    ApiPath(id): ApiPath<String>,
    ApiQuery(q): ApiQuery<WriteFileQuery>,
    body: Request,
) -> ApiResult<Json<FileInfo>> {
    let metadata = crate::upload::metadata(body.headers()).map_err(ApiFailure::invalid)?;
    let body = crate::upload::decoded(body).map_err(ApiFailure::invalid)?;
    let opts = sandtree_runtime::WriteFile { user: q.user, mode: q.mode, metadata };
    let mut stream = body.into_body().into_data_stream();
    let res = e.write_file(&id, &q.path, opts, &mut stream).await;
    if res.is_err() {
        drain(&mut stream).await;
    }
    Ok(Json(res?))
}

#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct RemoveFileQuery {
    /// Path in the sandbox: absolute, or relative to the home of `user`.
    pub path: String,
    /// Remove a directory with its contents (default: only an empty one).
    #[serde(default)]
    pub recursive: bool,
    #[serde(default)]
    pub user: Option<String>,
}

/// Removes a file, a symlink or a directory.
#[utoipa::path(delete, path = "/v1/sandboxes/{id}/files", tag = "files",
    params(("id" = String, Path, description = "Sandbox id"), RemoveFileQuery),
    responses((status = 204, description = "Removed"), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn remove_file(
    EngineState(e): EngineState,
    ApiPath(id): ApiPath<String>,
    ApiQuery(q): ApiQuery<RemoveFileQuery>,
) -> ApiResult<StatusCode> {
    e.remove_file(&id, &q.path, q.recursive, q.user.as_deref()).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct StatFileQuery {
    /// Path in the sandbox: absolute, or relative to the home of `user`.
    pub path: String,
    /// Describe what a symlink leads to (inside the sandbox), not the link.
    #[serde(default)]
    pub follow: bool,
    #[serde(default)]
    pub user: Option<String>,
}

/// Describes a path (a symlink is described, not followed, unless `follow`).
#[utoipa::path(get, path = "/v1/sandboxes/{id}/files/stat", tag = "files",
    params(("id" = String, Path, description = "Sandbox id"), StatFileQuery),
    responses((status = 200, body = FileInfo), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn stat_file(
    EngineState(e): EngineState,
    ApiPath(id): ApiPath<String>,
    ApiQuery(q): ApiQuery<StatFileQuery>,
) -> ApiResult<Json<FileInfo>> {
    Ok(Json(e.stat_file(&id, &q.path, q.follow, q.user.as_deref()).await?))
}

#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ListFilesQuery {
    /// Directory in the sandbox: absolute, or relative to the home of `user`.
    pub path: String,
    /// Levels to list: 1 (default) lists the directory's own entries.
    #[serde(default)]
    pub depth: Option<u32>,
    #[serde(default)]
    pub user: Option<String>,
}

/// Lists a directory's entries.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/files/list", tag = "files",
    params(("id" = String, Path, description = "Sandbox id"), ListFilesQuery),
    responses((status = 200, body = FileList), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn list_files(
    EngineState(e): EngineState,
    ApiPath(id): ApiPath<String>,
    ApiQuery(q): ApiQuery<ListFilesQuery>,
) -> ApiResult<Json<FileList>> {
    Ok(Json(e.list_files(&id, &q.path, q.depth.unwrap_or(1), q.user.as_deref()).await?))
}

/// Makes a directory (by default with its missing parents, as `mkdir -p`).
#[utoipa::path(post, path = "/v1/sandboxes/{id}/files/mkdir", tag = "files", request_body = MakeDirRequest,
    params(("id" = String, Path, description = "Sandbox id")),
    responses((status = 201, body = FileInfo), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody),
              (status = 409, description = "already_exists (with parents false)", body = ErrorBody)))]
pub async fn make_dir(
    EngineState(e): EngineState,
    ApiPath(id): ApiPath<String>,
    ApiJson(req): ApiJson<MakeDirRequest>,
) -> ApiResult<(StatusCode, Json<FileInfo>)> {
    Ok((StatusCode::CREATED, Json(e.make_dir(&id, req).await?)))
}

/// Renames a file or directory within the sandbox.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/files/move", tag = "files", request_body = MoveRequest,
    params(("id" = String, Path, description = "Sandbox id")),
    responses((status = 200, body = FileInfo), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody),
              (status = 409, description = "already_exists (without overwrite)", body = ErrorBody)))]
pub async fn move_file(
    EngineState(e): EngineState,
    ApiPath(id): ApiPath<String>,
    ApiJson(req): ApiJson<MoveRequest>,
) -> ApiResult<Json<FileInfo>> {
    Ok(Json(e.move_file(&id, req).await?))
}

// ---------------------------------------------------------------- sessions

/// Opens a persistent pty-backed shell session.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/sessions", tag = "sessions", request_body = CreateSessionRequest,
    params(("id" = String, Path, description = "Sandbox id")),
    responses((status = 201, body = SessionInfo), (status = 404, body = ErrorBody)))]
pub async fn create_session(
    EngineState(e): EngineState,
    ApiPath(id): ApiPath<String>,
    ApiJsonOrDefault(req): ApiJsonOrDefault<CreateSessionRequest>,
) -> ApiResult<(StatusCode, Json<SessionInfo>)> {
    let info = e.create_session(&id, req).await?;
    Ok((StatusCode::CREATED, Json(info)))
}

/// Lists a sandbox's sessions.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/sessions", tag = "sessions", params(("id" = String, Path, description = "Sandbox id")),
    responses((status = 200, body = SessionList), (status = 404, body = ErrorBody)))]
pub async fn list_sessions(EngineState(e): EngineState, ApiPath(id): ApiPath<String>) -> ApiResult<Json<SessionList>> {
    Ok(Json(e.list_sessions(&id).await?))
}

/// Runs one command line in a session's shell and returns what it printed.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/sessions/{sid}/run", tag = "sessions", request_body = SessionRunRequest,
    params(("id" = String, Path, description = "Sandbox id"), ("sid" = String, Path, description = "Session id"),
           EncodingQuery),
    responses((status = 200, body = SessionRunResponse), (status = 404, body = ErrorBody)))]
pub async fn session_run(
    EngineState(e): EngineState,
    ApiPath((id, sid)): ApiPath<(String, String)>,
    ApiQuery(q): ApiQuery<EncodingQuery>,
    ApiJson(req): ApiJson<SessionRunRequest>,
) -> ApiResult<Json<SessionRunResponse>> {
    Ok(Json(e.session_run_as(&id, &sid, req, q.encoding).await?))
}

/// Closes a session (kills its shell).
#[utoipa::path(delete, path = "/v1/sandboxes/{id}/sessions/{sid}", tag = "sessions",
    params(("id" = String, Path, description = "Sandbox id"), ("sid" = String, Path, description = "Session id")),
    responses((status = 204, description = "Closed"), (status = 404, body = ErrorBody)))]
pub async fn close_session(
    EngineState(e): EngineState,
    ApiPath((id, sid)): ApiPath<(String, String)>,
) -> ApiResult<StatusCode> {
    e.close_session(&id, &sid).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Attaches to a session's terminal over a websocket.
///
/// Binary frames carry pty bytes both ways; a text frame
/// `{"resize":[cols,rows]}` resizes the terminal. The server closes the
/// socket when the shell exits.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/sessions/{sid}/attach", tag = "sessions",
    params(("id" = String, Path, description = "Sandbox id"), ("sid" = String, Path, description = "Session id")),
    responses((status = 101, description = "Switching to the websocket protocol"),
              (status = 400, description = "Not a websocket request", body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn attach_session(
    EngineState(e): EngineState,
    ApiPath((id, sid)): ApiPath<(String, String)>,
    ws: Result<WebSocketUpgrade, axum::extract::ws::rejection::WebSocketUpgradeRejection>,
) -> ApiResult<Response> {
    let ws = ws.map_err(|r| ApiFailure::invalid(format!("attach needs a websocket upgrade: {}", r.body_text())))?;
    let io = e.session_io(&id, &sid).await?;
    Ok(ws.on_upgrade(move |socket| super::attach::bridge(socket, io)))
}

// ---------------------------------------------------------------- checkpoints

/// Checkpoints a sandbox (freezes it for the snapshot only).
#[utoipa::path(post, path = "/v1/sandboxes/{id}/checkpoints", tag = "checkpoints", request_body = CheckpointRequest,
    params(("id" = String, Path, description = "Sandbox id")),
    responses((status = 201, body = CheckpointResponse), (status = 404, body = ErrorBody),
              (status = 504, description = "freeze_timeout", body = ErrorBody), (status = 507, body = ErrorBody)))]
pub async fn create_checkpoint(
    EngineState(e): EngineState,
    ApiPath(id): ApiPath<String>,
    ApiJsonOrDefault(req): ApiJsonOrDefault<CheckpointRequest>,
) -> ApiResult<(StatusCode, Json<CheckpointResponse>)> {
    Ok((StatusCode::CREATED, Json(detached(async move { e.checkpoint(&id, req).await }).await?)))
}

/// The checkpoint tree of one sandbox.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/checkpoints", tag = "checkpoints", params(("id" = String, Path, description = "Sandbox id")),
    responses((status = 200, body = CheckpointList), (status = 404, body = ErrorBody)))]
pub async fn sandbox_checkpoints(
    EngineState(e): EngineState,
    ApiPath(id): ApiPath<String>,
) -> ApiResult<Json<CheckpointList>> {
    Ok(Json(e.list_checkpoints(Some(&id)).await?))
}

/// Rolls a sandbox back to one of its checkpoints.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/rollback", tag = "checkpoints", request_body = RollbackRequest,
    params(("id" = String, Path, description = "Sandbox id")),
    responses((status = 200, body = RollbackResponse), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn rollback(
    EngineState(e): EngineState,
    ApiPath(id): ApiPath<String>,
    ApiJson(req): ApiJson<RollbackRequest>,
) -> ApiResult<Json<RollbackResponse>> {
    Ok(Json(detached(async move { e.rollback(&id, req).await }).await?))
}

/// Every checkpoint, as a forest (parents first).
#[utoipa::path(get, path = "/v1/checkpoints", tag = "checkpoints", responses((status = 200, body = CheckpointList)))]
pub async fn list_checkpoints(EngineState(e): EngineState) -> ApiResult<Json<CheckpointList>> {
    Ok(Json(e.list_checkpoints(None).await?))
}

/// Describes a checkpoint.
#[utoipa::path(get, path = "/v1/checkpoints/{id}", tag = "checkpoints", params(("id" = String, Path, description = "Checkpoint id")),
    responses((status = 200, body = CheckpointInfo), (status = 404, body = ErrorBody)))]
pub async fn get_checkpoint(
    EngineState(e): EngineState,
    ApiPath(id): ApiPath<String>,
) -> ApiResult<Json<CheckpointInfo>> {
    Ok(Json(e.get_checkpoint(&id).await?))
}

/// Reads and checks a checkpoint's durable process image, and sums it up:
/// its processes and where their pages are (stored in it, in its parents'
/// images, zeros).
#[utoipa::path(get, path = "/v1/checkpoints/{id}/image", tag = "checkpoints", params(("id" = String, Path, description = "Checkpoint id")),
    responses((status = 200, body = serde_json::Value), (status = 404, body = ErrorBody), (status = 400, body = ErrorBody)))]
pub async fn checkpoint_image(
    EngineState(e): EngineState,
    ApiPath(id): ApiPath<String>,
) -> ApiResult<Json<serde_json::Value>> {
    let summary = e.inspect_image(&id).await?;
    Ok(Json(serde_json::to_value(summary).unwrap_or_default()))
}

#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct DeleteCheckpointQuery {
    /// Delete even if children or sandboxes depend on it (children are relinked to its parent).
    #[serde(default)]
    pub force: bool,
}

/// Deletes a checkpoint.
#[utoipa::path(delete, path = "/v1/checkpoints/{id}", tag = "checkpoints",
    params(("id" = String, Path, description = "Checkpoint id"), DeleteCheckpointQuery),
    responses((status = 200, body = DeleteCheckpointResponse), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)))]
pub async fn delete_checkpoint(
    EngineState(e): EngineState,
    ApiPath(id): ApiPath<String>,
    ApiQuery(q): ApiQuery<DeleteCheckpointQuery>,
) -> ApiResult<Json<DeleteCheckpointResponse>> {
    Ok(Json(detached(async move { e.delete_checkpoint(&id, q.force).await }).await?))
}

/// Creates `count` new sandboxes from a checkpoint.
#[utoipa::path(post, path = "/v1/checkpoints/{id}/fork", tag = "checkpoints", request_body = ForkRequest,
    params(("id" = String, Path, description = "Checkpoint id")),
    responses((status = 200, body = ForkResponse), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn fork(
    EngineState(e): EngineState,
    ApiPath(id): ApiPath<String>,
    ApiJson(req): ApiJson<ForkRequest>,
) -> ApiResult<Json<ForkResponse>> {
    Ok(Json(detached(async move { e.fork(&id, req).await }).await?))
}

// ---------------------------------------------------------------- images

/// Lists images.
#[utoipa::path(get, path = "/v1/images", tag = "images", responses((status = 200, body = ImageList)))]
pub async fn list_images(EngineState(e): EngineState) -> ApiResult<Json<ImageList>> {
    Ok(Json(e.images().await?))
}

/// Imports a rootfs (directory or tarball on the daemon's host); streams progress.
#[utoipa::path(post, path = "/v1/images", tag = "images", request_body = ImportImageRequest,
    responses((status = 200, description = "One `ImportEvent` per line: `progress`…, then `done` or `error`",
                  body = ImportEvent, content_type = "application/x-ndjson"),
              (status = 400, body = ErrorBody), (status = 409, body = ErrorBody)))]
pub async fn import_image(
    EngineState(e): EngineState,
    ApiJson(req): ApiJson<ImportImageRequest>,
) -> ApiResult<Response> {
    let (tx, mut rx) = mpsc::channel(256);
    let done = tx.clone();
    tokio::spawn(async move {
        let last = match e.import_image(req, tx).await {
            Ok(image) => ImportEvent::Done(image),
            Err(err) => ImportEvent::Error(err.to_api()),
        };
        let _ = done.send(last).await;
    });
    // An import that fails before any progress is an ordinary error response.
    match rx.recv().await {
        Some(ImportEvent::Error(err)) => Err(ApiFailure(err)),
        Some(first) => Ok(ndjson_response(Some(first), rx)),
        None => Err(ApiFailure::new(ErrorCode::Internal, "the import task ended without a result")),
    }
}

/// Deletes an image no sandbox or checkpoint uses.
#[utoipa::path(delete, path = "/v1/images/{name}", tag = "images", params(("name" = String, Path, description = "Image name")),
    responses((status = 204, description = "Deleted"), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)))]
pub async fn delete_image(EngineState(e): EngineState, ApiPath(name): ApiPath<String>) -> ApiResult<StatusCode> {
    e.delete_image(&name).await?;
    Ok(StatusCode::NO_CONTENT)
}
