//! Exec with a streamed stdin: the request body of
//! `Content-Type: application/vnd.sandtree.exec+stdin`
//! ([`sandtree_api::EXEC_STDIN_CONTENT_TYPE`]).
//!
//! The body is one line of `ExecRequest` JSON (at most [`MAX_LINE`] bytes),
//! a newline, then the raw stdin bytes up to the end of the body. [`split`]
//! reads the line; [`feed`] passes the rest on, chunk by chunk as hyper
//! reads it, through a channel of [`CHUNKS`] chunks: the daemon holds a few
//! hundred KiB of a body of any size, and a program that reads slowly slows
//! the sender down (the socket's flow control), never the daemon's memory.
//!
//! A body that breaks off (the client went away) kills the program rather
//! than giving it a truncated stdin. A program that stops reading (it closed
//! its stdin, or exited, or never started) stops the feed, and the rest of
//! the body is read and dropped, up to the bound of a refused body
//! (`error::DRAIN_MAX`): the daemon does not close the connection on a
//! client that is still sending, which could lose it the answer. A buffered answer comes
//! once the body has ended (for clients that send the whole body before
//! they read: most HTTP libraries); a streamed one ends with the `exit`
//! event, and a full-duplex client then ends its body (as `sandtree exec`
//! does).

use axum::body::{BodyDataStream, Bytes};
use axum::http::{HeaderMap, header};
use futures_util::StreamExt;
use sandtree_api::{EXEC_STDIN_CONTENT_TYPE, ErrorCode, ExecRequest};
use sandtree_runtime::StdinStream;
use tokio::task::JoinHandle;

use super::error::{ApiFailure, parse_json};

/// Longest accepted JSON line.
pub const MAX_LINE: usize = 1 << 20;
/// Body chunks in flight between the connection and the program's stdin.
pub const CHUNKS: usize = 4;

/// Whether the request's `Content-Type` is the streamed-stdin one (parameters ignored).
pub fn is_streamed_stdin(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|t| t.trim().eq_ignore_ascii_case(EXEC_STDIN_CONTENT_TYPE))
}

/// Reads the JSON line of a streamed-stdin body; returns the request and
/// the stdin bytes that came with the line (the rest stays in `body`).
pub async fn split(body: &mut BodyDataStream) -> Result<(ExecRequest, Bytes), ApiFailure> {
    let mut line = Vec::new();
    let first = loop {
        let chunk = match body.next().await {
            Some(Ok(chunk)) => chunk,
            Some(Err(e)) => return Err(ApiFailure::invalid(format!("cannot read the request body: {e}"))),
            None => {
                return Err(ApiFailure::invalid(format!(
                    "the {EXEC_STDIN_CONTENT_TYPE} body ended before the newline that ends its first line: \
                     send one line of ExecRequest JSON, a newline, then the stdin bytes"
                )));
            }
        };
        if let Some(nl) = chunk.iter().position(|&b| b == b'\n') {
            line.extend_from_slice(&chunk[..nl]);
            break chunk.slice(nl + 1..);
        }
        line.extend_from_slice(&chunk);
        if line.len() > MAX_LINE {
            break Bytes::new();
        }
    };
    if line.len() > MAX_LINE {
        return Err(ApiFailure::new(
            ErrorCode::PayloadTooLarge,
            format!(
                "the first line of a {EXEC_STDIN_CONTENT_TYPE} body (the ExecRequest JSON) is over {} MiB: \
                 end it with a newline and send stdin after it",
                MAX_LINE >> 20
            ),
        ));
    }
    Ok((parse_json(&line)?, first))
}

/// Feeds `first`, then the rest of `body`, into the returned stream; once
/// the program stops reading, reads the body on and drops it. The task ends
/// with the body.
pub fn feed(first: Bytes, mut body: BodyDataStream) -> (StdinStream, JoinHandle<()>) {
    let (tx, rx) = sandtree_runtime::stdin_channel(CHUNKS);
    let task = tokio::spawn(async move {
        let mut open = true;
        let mut dropped = 0;
        let mut next = Some(first);
        loop {
            let chunk = match next.take() {
                Some(chunk) => chunk,
                None => match body.next().await {
                    None => return,
                    Some(Ok(chunk)) => chunk,
                    Some(Err(e)) => {
                        // (At once, whatever is still queued.)
                        tx.break_off(format!("reading the request body: {e}"));
                        return;
                    }
                },
            };
            if open && !chunk.is_empty() {
                open = tx.send(Vec::from(chunk)).await;
            } else if !open {
                // Read on and dropped, up to the bound a refused body gets.
                dropped += chunk.len();
                if dropped > super::error::DRAIN_MAX {
                    return;
                }
            }
        }
    });
    (rx, task)
}
