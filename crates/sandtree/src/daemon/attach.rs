//! The websocket bridge of `GET /v1/sandboxes/{id}/sessions/{sid}/attach`.
//!
//! Frames:
//! - binary, client → server: bytes typed on the terminal (written to the pty);
//! - binary, server → client: what the pty prints from the moment of attach;
//! - text, client → server: `{"resize":[cols,rows]}` resizes the terminal
//!   (any other text frame is written to the pty as typed text);
//! - close: either side; the server closes when the shell exits (checked
//!   while the terminal is idle, every [`LIVENESS_EVERY`]). Several clients may attach to one session at once: each
//!   sees all output, and their input is interleaved.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::ws::{CloseFrame, Message, WebSocket};
use futures_util::{SinkExt, StreamExt};
use sandtree_api::ExecRequest;
use sandtree_runtime::{Engine, SessionIo};
use serde::Deserialize;
use tokio::sync::broadcast::error::RecvError;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Control {
    resize: (u16, u16),
}

/// How often an idle attach checks that the session's shell still runs.
pub const LIVENESS_EVERY: Duration = Duration::from_secs(1);

/// The session whose pty is bridged, for the liveness check.
pub struct Target {
    pub engine: Arc<Engine>,
    pub sandbox: String,
    /// In-sandbox pid of the session's shell.
    pub shell_pid: i32,
}

impl Target {
    /// Whether the shell still runs. The pty's output channel does not end
    /// when the shell exits (the session keeps its sender), so this asks the
    /// sandbox directly.
    async fn shell_alive(&self) -> bool {
        let req = ExecRequest {
            cmd: vec!["sh".into(), "-c".into(), format!("kill -0 {}", self.shell_pid)],
            timeout_ms: Some(5000),
            ..Default::default()
        };
        matches!(self.engine.exec(&self.sandbox, req).await, Ok(r) if r.exit_code == Some(0))
    }
}

/// Pumps bytes between the websocket and the session's pty until either ends.
pub async fn bridge(socket: WebSocket, mut io: SessionIo, target: Target) {
    // Take the receiver subscribed at attach time (it holds what the shell
    // printed since); `io` keeps a fresh one it never reads.
    let fresh = io.output.resubscribe();
    let mut output = std::mem::replace(&mut io.output, fresh);
    let io = io;
    let (mut tx, mut rx) = socket.split();
    let out = async {
        loop {
            let next = match tokio::time::timeout(LIVENESS_EVERY, output.recv()).await {
                Ok(next) => next,
                Err(_idle) if target.shell_alive().await => continue,
                Err(_idle) => Err(RecvError::Closed),
            };
            match next {
                // An empty chunk also marks the end of the output.
                Ok(bytes) if bytes.is_empty() => {
                    let close = CloseFrame { code: 1000, reason: "the session's shell exited".into() };
                    let _ = tx.send(Message::Close(Some(close))).await;
                    return;
                }
                Ok(bytes) => {
                    if tx.send(Message::Binary(bytes.into())).await.is_err() {
                        return;
                    }
                }
                // A slow client missed some output: keep going from here.
                Err(RecvError::Lagged(n)) => tracing::debug!(skipped = n, "attach client lagged"),
                Err(RecvError::Closed) => {
                    let close = CloseFrame { code: 1000, reason: "the session's shell exited".into() };
                    let _ = tx.send(Message::Close(Some(close))).await;
                    return;
                }
            }
        }
    };
    let input = async {
        while let Some(Ok(msg)) = rx.next().await {
            let r = match msg {
                Message::Binary(b) => io.write(&b).await,
                Message::Text(t) => match serde_json::from_str::<Control>(t.as_str()) {
                    Ok(Control { resize: (cols, rows) }) => io.resize(cols, rows),
                    Err(_) => io.write(t.as_bytes()).await,
                },
                Message::Close(_) => return,
                Message::Ping(_) | Message::Pong(_) => Ok(()),
            };
            if let Err(e) = r {
                tracing::debug!("attach: {e}");
                return;
            }
        }
    };
    tokio::select! {
        _ = out => {}
        _ = input => {}
    }
}
