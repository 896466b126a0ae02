//! Error responses and the request extractors whose rejections are JSON.
//!
//! Every error the daemon serves is `{"error": {"code": "...", "message": "..."}}`
//! ([`sandtree_api::ErrorBody`]) with the status of
//! [`sandtree_api::ErrorCode::http_status`]. Axum's own rejections (bad JSON,
//! a pid that is not a number, a bad query string) are turned into
//! `invalid_argument` errors carrying serde's message; a JSON body over the
//! limit ([`super::server::MAX_BODY_BYTES`]) is a 413 `payload_too_large`
//! that names the limit and the streaming alternative.

use axum::body::{BodyDataStream, Bytes};
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use sandtree_api::{ApiError, EXEC_STDIN_CONTENT_TYPE, ErrorBody, ErrorCode};
use serde::de::DeserializeOwned;

/// An error as a response.
#[derive(Debug)]
pub struct ApiFailure(pub ApiError);

impl ApiFailure {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> ApiFailure {
        ApiFailure(ApiError::new(code, message))
    }

    pub fn invalid(message: impl Into<String>) -> ApiFailure {
        ApiFailure::new(ErrorCode::InvalidArgument, message)
    }
}

/// The response of an [`ApiError`]: its status and the JSON error body.
pub fn error_response(err: ApiError) -> Response {
    let status = StatusCode::from_u16(err.code.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (status, axum::Json(ErrorBody { error: err })).into_response()
}

impl IntoResponse for ApiFailure {
    fn into_response(self) -> Response {
        if self.0.code == ErrorCode::Internal {
            tracing::error!(message = %self.0.message, "internal error");
        }
        error_response(self.0)
    }
}

impl From<sandtree_runtime::Error> for ApiFailure {
    fn from(e: sandtree_runtime::Error) -> ApiFailure {
        ApiFailure(e.to_api())
    }
}

impl From<ApiError> for ApiFailure {
    fn from(e: ApiError) -> ApiFailure {
        ApiFailure(e)
    }
}

impl From<PathRejection> for ApiFailure {
    fn from(r: PathRejection) -> ApiFailure {
        ApiFailure::invalid(format!("invalid path parameter: {}", r.body_text()))
    }
}

impl From<QueryRejection> for ApiFailure {
    fn from(r: QueryRejection) -> ApiFailure {
        ApiFailure::invalid(format!("invalid query string: {}", r.body_text()))
    }
}

/// Result of a handler.
pub type ApiResult<T> = Result<T, ApiFailure>;

/// Path parameters; a rejection is a 400 `invalid_argument`.
#[derive(FromRequestParts)]
#[from_request(via(axum::extract::Path), rejection(ApiFailure))]
pub struct ApiPath<T>(pub T);

/// Query parameters; a rejection is a 400 `invalid_argument`.
#[derive(FromRequestParts)]
#[from_request(via(axum::extract::Query), rejection(ApiFailure))]
pub struct ApiQuery<T>(pub T);

/// A JSON request body. The `Content-Type` is not checked (curl-friendly);
/// a body that does not parse is a 400 `invalid_argument` with serde's message.
pub struct ApiJson<T>(pub T);

/// Like [`ApiJson`], but an empty body means `T::default()`.
pub struct ApiJsonOrDefault<T>(pub T);

/// The error of a JSON body over [`super::server::MAX_BODY_BYTES`].
pub fn body_too_large() -> ApiFailure {
    ApiFailure::new(
        ErrorCode::PayloadTooLarge,
        format!(
            "the request body is over the {} MiB limit of JSON bodies: send large stdin as a stream \
             (POST .../exec with Content-Type: {EXEC_STDIN_CONTENT_TYPE}: one line of ExecRequest JSON, \
             a newline, then the raw bytes; `sandtree exec` streams its stdin this way); \
             stdin_base64 is for small data",
            super::server::MAX_BODY_BYTES >> 20
        ),
    )
}

/// Bytes of a refused body the daemon still reads (and drops) before it
/// answers: closing a connection on a client that is still sending can
/// lose it the answer (a reset), so the client would never see why.
pub const DRAIN_MAX: usize = 1 << 30;

/// Reads and drops what is left of `body` (up to [`DRAIN_MAX`] bytes).
pub async fn drain(body: &mut BodyDataStream) {
    let mut n = 0;
    while let Some(Ok(chunk)) = body.next().await {
        n += chunk.len();
        if n > DRAIN_MAX {
            return;
        }
    }
}

/// The whole body, at most [`super::server::MAX_BODY_BYTES`]; a larger one
/// is read on (see [`drain`]) and refused with a 413 `payload_too_large`.
async fn body_bytes(req: Request) -> Result<Bytes, ApiFailure> {
    let max = super::server::MAX_BODY_BYTES;
    let mut body = req.into_body().into_data_stream();
    let mut buf = Vec::new();
    while let Some(chunk) = body.next().await {
        let chunk = chunk.map_err(|e| ApiFailure::invalid(format!("cannot read the request body: {e}")))?;
        if buf.len() + chunk.len() > max {
            drain(&mut body).await;
            return Err(body_too_large());
        }
        buf.extend_from_slice(&chunk);
    }
    Ok(Bytes::from(buf))
}

/// `bytes` as JSON of `T`; a 400 `invalid_argument` with serde's message if not.
pub fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiFailure> {
    serde_json::from_slice(bytes).map_err(|e| ApiFailure::invalid(format!("invalid JSON body: {e}")))
}

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for ApiJson<T> {
    type Rejection = ApiFailure;

    async fn from_request(req: Request, _state: &S) -> Result<Self, Self::Rejection> {
        let bytes = body_bytes(req).await?;
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Err(ApiFailure::invalid("invalid JSON body: the request body is empty"));
        }
        parse_json(&bytes).map(ApiJson)
    }
}

impl<S: Send + Sync, T: DeserializeOwned + Default> FromRequest<S> for ApiJsonOrDefault<T> {
    type Rejection = ApiFailure;

    async fn from_request(req: Request, _state: &S) -> Result<Self, Self::Rejection> {
        let bytes = body_bytes(req).await?;
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Ok(ApiJsonOrDefault(T::default()));
        }
        parse_json(&bytes).map(ApiJsonOrDefault)
    }
}
