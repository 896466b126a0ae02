//! Bearer-token authentication of the TCP listener.
//!
//! The unix socket is protected by its file mode (0600) and needs no token.
//! On TCP every request must carry `Authorization: Bearer <token>`; the token
//! lives in `<data-dir>/token` (64 hex characters, mode 0600, generated on
//! first start) unless `--token-file` names another file. The comparison is
//! constant-time. A missing or wrong token is a 401 `unauthorized` error.

use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use axum::extract::{Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use sandtree_api::ErrorCode;
use subtle::ConstantTimeEq;

use super::error::ApiFailure;

/// A bearer token.
#[derive(Clone)]
pub struct Token(Arc<str>);

impl Token {
    pub fn new(s: impl Into<String>) -> Token {
        Token(Arc::from(s.into()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Whether `presented` is this token (constant-time in the content).
    pub fn matches(&self, presented: &str) -> bool {
        constant_time_eq(self.0.as_bytes(), presented.as_bytes())
    }
}

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Token(..)")
    }
}

/// Constant-time equality of two byte strings (the length is not secret).
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && bool::from(a.ct_eq(b))
}

/// Extracts the token of an `Authorization: Bearer <token>` header value.
pub fn bearer(value: &str) -> Option<&str> {
    let (scheme, token) = value.trim().split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

/// Reads the token file, creating it (32 random bytes, hex, mode 0600) if missing.
pub fn load_or_create_token(path: &Path) -> Result<Token> {
    match std::fs::read_to_string(path) {
        Ok(s) => {
            let t = s.trim();
            if t.is_empty() {
                bail!("token file {} is empty: delete it to generate a new token", path.display());
            }
            let mode = std::fs::metadata(path)?.permissions().mode();
            if mode & 0o077 != 0 {
                tracing::warn!(path = %path.display(), mode = format!("{mode:o}"), "token file is readable by others");
            }
            Ok(Token::new(t))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
            }
            let bytes: [u8; 32] = rand::random();
            let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(path)
                .with_context(|| format!("creating token file {}", path.display()))?;
            writeln!(f, "{hex}")?;
            tracing::info!(path = %path.display(), "generated a new API token");
            Ok(Token::new(hex))
        }
        Err(e) => Err(e).with_context(|| format!("reading token file {}", path.display())),
    }
}

/// Middleware: rejects requests without the right bearer token.
pub async fn require_token(State(token): State<Token>, req: Request, next: Next) -> Response {
    let presented = req.headers().get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()).and_then(bearer);
    match presented {
        Some(p) if token.matches(p) => next.run(req).await,
        Some(_) => ApiFailure::new(ErrorCode::Unauthorized, "wrong bearer token").into_response(),
        None => ApiFailure::new(
            ErrorCode::Unauthorized,
            "this listener needs `Authorization: Bearer <token>` (the token is in the daemon's token file, <data-dir>/token)",
        )
        .into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compare() {
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"abcd"));
        assert!(!constant_time_eq(b"", b"a"));
        assert_eq!(bearer("Bearer xyz"), Some("xyz"));
        assert_eq!(bearer("bearer  xyz "), Some("xyz"));
        assert_eq!(bearer("Basic xyz"), None);
        assert_eq!(bearer("Bearer"), None);
    }

    #[test]
    fn token_file_is_created_private_and_reread() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("sub/token");
        let t = load_or_create_token(&p).unwrap();
        assert_eq!(t.as_str().len(), 64);
        assert_eq!(std::fs::metadata(&p).unwrap().permissions().mode() & 0o777, 0o600);
        let t2 = load_or_create_token(&p).unwrap();
        assert!(t.matches(t2.as_str()));
    }
}
