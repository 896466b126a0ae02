//! The Connect protocol (connectrpc.com), JSON codec, as envd speaks it.
//!
//! - **Unary**: `POST /{package}.{Service}/{Method}`, `Content-Type:
//!   application/json`, the message as the body; the answer is `200` with
//!   the JSON message (`{}` when empty), or an error status with
//!   `{"code": "<connect code>", "message": "…"}`.
//! - **Streams**: `Content-Type: application/connect+json`; each message
//!   is an envelope `[flags: u8][length: u32 big-endian][JSON]`. The answer
//!   is `200 application/connect+json` (exactly: the e2b SDK checks the
//!   type without parameters), one envelope (flags `0x00`) per message,
//!   each flushed as it is made, then the end of stream: flags `0x02`,
//!   `{}` or `{"error": {"code", "message"}}`.

use std::convert::Infallible;

use axum::body::{Body, Bytes};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures_util::{Stream, StreamExt};
use serde_json::{Value, json};

/// A Connect error: its code and message.
#[derive(Debug, Clone)]
pub struct RpcError {
    pub code: &'static str,
    pub message: String,
}

impl RpcError {
    pub fn new(code: &'static str, message: impl Into<String>) -> RpcError {
        RpcError { code, message: message.into() }
    }

    pub fn invalid(message: impl Into<String>) -> RpcError {
        RpcError::new("invalid_argument", message)
    }

    /// The HTTP status of a unary error (Connect's mapping).
    fn status(&self) -> StatusCode {
        match self.code {
            "invalid_argument" | "failed_precondition" | "out_of_range" => StatusCode::BAD_REQUEST,
            "unauthenticated" => StatusCode::UNAUTHORIZED,
            "permission_denied" => StatusCode::FORBIDDEN,
            "not_found" => StatusCode::NOT_FOUND,
            "already_exists" | "aborted" => StatusCode::CONFLICT,
            "resource_exhausted" => StatusCode::TOO_MANY_REQUESTS,
            "unimplemented" => StatusCode::NOT_IMPLEMENTED,
            "unavailable" => StatusCode::SERVICE_UNAVAILABLE,
            "deadline_exceeded" => StatusCode::GATEWAY_TIMEOUT,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    fn body(&self) -> Value {
        json!({"code": self.code, "message": self.message})
    }
}

/// The Connect code of a Sandtree API error.
pub fn code_of(e: &sandtree_api::ApiError) -> &'static str {
    use sandtree_api::ErrorCode as C;
    match e.code {
        C::InvalidArgument | C::CheckpointNotInTree | C::PayloadTooLarge => "invalid_argument",
        C::Unauthorized => "unauthenticated",
        C::SandboxNotFound
        | C::CheckpointNotFound
        | C::ImageNotFound
        | C::SessionNotFound
        | C::ProcessNotFound
        | C::FileNotFound
        | C::RouteNotFound => "not_found",
        C::AlreadyExists => "already_exists",
        C::PidLimitReached | C::NoSpace | C::NotEnoughMemory => "resource_exhausted",
        C::Timeout | C::FreezeTimeout => "deadline_exceeded",
        C::Unsupported | C::MethodNotAllowed => "unimplemented",
        C::SandboxNotRunning => "unavailable",
        _ => "internal",
    }
}

impl From<sandtree_runtime::Error> for RpcError {
    fn from(e: sandtree_runtime::Error) -> RpcError {
        let api = e.to_api();
        RpcError::new(code_of(&api), api.message)
    }
}

/// A unary answer.
pub fn unary(result: Result<Value, RpcError>) -> Response {
    let (status, body) = match result {
        Ok(v) => (StatusCode::OK, v),
        Err(e) => (e.status(), e.body()),
    };
    let mut resp = (status, serde_json::to_vec(&body).unwrap_or_default()).into_response();
    resp.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    resp
}

/// One answer (or error) to a call: a unary answer, or, to a streaming
/// call, a stream of that one message.
pub fn answer(result: Result<Value, RpcError>, streamed: bool) -> Response {
    match streamed {
        true => stream(futures_util::stream::iter([result])),
        false => unary(result),
    }
}

/// One envelope.
pub fn envelope(flags: u8, msg: &Value) -> Bytes {
    let payload = serde_json::to_vec(msg).unwrap_or_default();
    let mut out = Vec::with_capacity(payload.len() + 5);
    out.push(flags);
    out.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    out.extend_from_slice(&payload);
    Bytes::from(out)
}

/// A server stream: the messages, then the end of stream (with the error
/// the stream ended on, if any).
pub fn stream(messages: impl Stream<Item = Result<Value, RpcError>> + Send + 'static) -> Response {
    let frames = messages
        .map(Some)
        .chain(futures_util::stream::once(async { None }))
        .scan(false, |failed, item| {
            let frame = match (item, *failed) {
                (_, true) => None,
                (Some(Ok(msg)), _) => Some(envelope(0x00, &msg)),
                (Some(Err(e)), _) => {
                    *failed = true;
                    Some(envelope(0x02, &json!({"error": e.body()})))
                }
                (None, _) => Some(envelope(0x02, &json!({}))),
            };
            std::future::ready(frame)
        })
        .map(Ok::<_, Infallible>);
    let mut resp = Body::from_stream(frames).into_response();
    resp.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/connect+json"));
    resp
}

/// The messages of a streamed request body (envelopes), decoded.
pub fn messages(body: &[u8]) -> Result<Vec<Value>, RpcError> {
    let mut out = Vec::new();
    let mut rest = body;
    while !rest.is_empty() {
        if rest.len() < 5 {
            return Err(RpcError::invalid("a truncated Connect envelope"));
        }
        let flags = rest[0];
        let len = u32::from_be_bytes([rest[1], rest[2], rest[3], rest[4]]) as usize;
        let payload = rest.get(5..5 + len).ok_or_else(|| RpcError::invalid("a truncated Connect envelope"))?;
        if flags & 0x01 != 0 {
            return Err(RpcError::new("unimplemented", "compressed Connect messages are not supported"));
        }
        if flags & 0x02 == 0 {
            out.push(serde_json::from_slice(payload).map_err(|e| RpcError::invalid(format!("not JSON: {e}")))?);
        }
        rest = &rest[5 + len..];
    }
    Ok(out)
}
