//! MCP's streamable HTTP transport on the daemon: `POST /mcp`.
//!
//! Each request carries one JSON-RPC message ([`crate::mcp`] says which);
//! a request is answered with `200 application/json` and its JSON-RPC
//! answer, a notification with `202` and no body. The server keeps no
//! session (no `Mcp-Session-Id`) and opens no stream: `GET` and `DELETE`
//! are `405`. The tools call the API's own router in-process, so a tool
//! costs no extra connection. The route sits behind the same token check as
//! the API on TCP. A request from a browser page (an `Origin` header that
//! is not the local host) is refused (`403`), against DNS rebinding; one
//! whose `MCP-Protocol-Version` header names a revision the server does not
//! speak is a `400` with a JSON-RPC error (a client probing a newer
//! revision then falls back to the handshake).

use std::sync::Arc;

use axum::body::Body as HttpBody;
use axum::extract::Request;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Router};
use sandtree_runtime::Engine;
use serde_json::Value;
use tower::ServiceExt;

use super::routes::api_router;
use super::server::MAX_BODY_BYTES;
use crate::mcp::{Backend, Body, PROTOCOL_VERSIONS, Reply, Server, codes, error_response};

/// The API's router, called in-process.
pub struct InProcess {
    router: Router,
}

impl InProcess {
    pub fn new(engine: Arc<Engine>) -> InProcess {
        InProcess { router: api_router().layer(Extension(engine)) }
    }
}

impl Backend for InProcess {
    async fn request(&self, method: &'static str, path: String, body: Body) -> Result<Reply, String> {
        let (content_type, bytes) = match body {
            Body::None => (None, Vec::new()),
            Body::Json(v) => (Some("application/json"), serde_json::to_vec(&v).unwrap_or_default()),
            Body::Bytes(b) => (Some("application/octet-stream"), b),
        };
        let mut req = Request::builder().method(method).uri(path);
        if let Some(ct) = content_type {
            req = req.header(header::CONTENT_TYPE, ct);
        }
        let req = req.body(HttpBody::from(bytes)).map_err(|e| format!("internal: building the request: {e}"))?;
        let resp = self.router.clone().oneshot(req).await.map_err(|e| format!("internal: {e}"))?;
        let status = resp.status().as_u16();
        let body = axum::body::to_bytes(resp.into_body(), usize::MAX)
            .await
            .map_err(|e| format!("internal: reading the answer: {e}"))?;
        Ok(Reply { status, body: body.to_vec() })
    }
}

fn json_response(status: StatusCode, v: &Value) -> Response {
    let mut resp = (status, serde_json::to_vec(v).unwrap_or_default()).into_response();
    resp.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    resp
}

/// Whether an `Origin` header names this host (or is absent: not a browser).
fn origin_allowed(headers: &HeaderMap) -> bool {
    let Some(origin) = headers.get(header::ORIGIN).and_then(|o| o.to_str().ok()) else {
        return true;
    };
    let rest = origin.split_once("://").map_or(origin, |(_, r)| r);
    let host = match rest.strip_prefix('[') {
        Some(v6) => v6.split(']').next().map(|h| if h == "::1" { "[::1]" } else { "" }).unwrap_or_default(),
        None => rest.split(':').next().unwrap_or_default(),
    };
    matches!(host, "localhost" | "127.0.0.1" | "[::1]")
}

/// The MCP server whose tools call `engine`'s API in-process (the app
/// makes it once, `server::app`).
pub fn server(engine: Arc<Engine>) -> Server<InProcess> {
    Server::new(InProcess::new(engine))
}

/// `POST /mcp`: one JSON-RPC message in, its answer out.
pub async fn post(mcp: Option<Extension<Arc<Server<InProcess>>>>, req: Request) -> Response {
    if !origin_allowed(req.headers()) {
        let v = error_response(Value::Null, codes::INVALID_REQUEST, "requests from a web page's origin are refused");
        return json_response(StatusCode::FORBIDDEN, &v);
    }
    let Some(Extension(mcp)) = mcp else {
        let v = error_response(Value::Null, codes::INVALID_REQUEST, "the daemon's engine is not running");
        return json_response(StatusCode::SERVICE_UNAVAILABLE, &v);
    };
    // (The version the client negotiated, on every request after `initialize`.)
    let version = req.headers().get("mcp-protocol-version").map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
    let bytes = match axum::body::to_bytes(req.into_body(), MAX_BODY_BYTES).await {
        Ok(b) => b,
        Err(e) => {
            let v = error_response(Value::Null, codes::INVALID_REQUEST, format!("the body could not be read: {e}"));
            return json_response(StatusCode::PAYLOAD_TOO_LARGE, &v);
        }
    };
    let msg: Value = match serde_json::from_slice(&bytes) {
        Ok(v) => v,
        Err(e) => {
            let v = error_response(Value::Null, codes::PARSE_ERROR, format!("not JSON: {e}"));
            return json_response(StatusCode::BAD_REQUEST, &v);
        }
    };
    if let Some(version) = version.filter(|v| !PROTOCOL_VERSIONS.contains(&v.as_str())) {
        let id = msg.get("id").cloned().unwrap_or(Value::Null);
        let v = error_response(
            id,
            codes::INVALID_REQUEST,
            format!("MCP-Protocol-Version {version:?} is not supported: this server speaks {PROTOCOL_VERSIONS:?}"),
        );
        return json_response(StatusCode::BAD_REQUEST, &v);
    }
    match mcp.handle(msg).await {
        Some(answer) => json_response(StatusCode::OK, &answer),
        None => StatusCode::ACCEPTED.into_response(),
    }
}

/// `GET` and `DELETE /mcp`: no stream, no session.
pub async fn not_offered() -> Response {
    let mut resp =
        (StatusCode::METHOD_NOT_ALLOWED, "this MCP server answers POST only (no stream, no session)\n").into_response();
    resp.headers_mut().insert(header::ALLOW, HeaderValue::from_static("POST"));
    resp
}
