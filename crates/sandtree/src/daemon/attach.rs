//! The websocket bridge of `GET /v1/sandboxes/{id}/sessions/{sid}/attach`.
//!
//! Frames:
//! - binary, client → server: bytes typed on the terminal (written to the pty);
//! - binary, server → client: what the pty prints from the moment of attach;
//! - text, client → server: `{"resize":[cols,rows]}` resizes the terminal
//!   (any other text frame is written to the pty as typed text);
//! - close: either side; the server closes when the shell exits (the
//!   session signals the end of its output). Several clients may attach to
//!   one session at once: each sees all output, and their input is interleaved.

use axum::extract::ws::{CloseFrame, Message, WebSocket};
use futures_util::{SinkExt, StreamExt};
use sandtree_runtime::SessionIo;
use serde::Deserialize;
use tokio::sync::broadcast::error::RecvError;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Control {
    resize: (u16, u16),
}

/// Pumps bytes between the websocket and the session's pty until either ends.
pub async fn bridge(socket: WebSocket, mut io: SessionIo) {
    // Take the receiver subscribed at attach time (it holds what the shell
    // printed since); `io` keeps a fresh one it never reads.
    let fresh = io.output.resubscribe();
    let mut output = std::mem::replace(&mut io.output, fresh);
    let io = io;
    let (mut tx, mut rx) = socket.split();
    let out = async {
        loop {
            match output.recv().await {
                // An empty chunk marks the end of the output: the shell exited.
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
