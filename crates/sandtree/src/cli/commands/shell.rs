//! `shell`: an interactive terminal on a session, or `-c` to run one command.
//!
//! Interactive mode opens (or reuses, with `--session`) a session, attaches
//! to `GET …/sessions/{sid}/attach` over a websocket, puts the local terminal
//! in raw mode and pumps bytes both ways: binary frames carry terminal bytes,
//! a text frame `{"resize":[cols,rows]}` follows every SIGWINCH. The terminal
//! is restored on every exit path (a guard restores it on drop).

use std::io::{IsTerminal, Write};
use std::time::Duration;

use anyhow::{Context, Result};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use futures_util::{SinkExt, StreamExt};
use hyper::Method;
use nix::sys::termios::{self, SetArg, Termios};
use sandtree_api::*;
use tokio::io::AsyncReadExt;
use tokio_tungstenite::tungstenite::Message;

use super::Ctx;
use crate::cli::ShellArgs;
use crate::cli::client::enc;

/// Restores the terminal's settings when dropped.
struct RawMode {
    saved: Termios,
}

impl RawMode {
    fn enter() -> Result<RawMode> {
        let stdin = std::io::stdin();
        let saved = termios::tcgetattr(&stdin).context("reading the terminal's settings")?;
        let mut raw = saved.clone();
        termios::cfmakeraw(&mut raw);
        termios::tcsetattr(&stdin, SetArg::TCSANOW, &raw).context("setting the terminal to raw mode")?;
        Ok(RawMode { saved })
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        let _ = termios::tcsetattr(std::io::stdin(), SetArg::TCSANOW, &self.saved);
    }
}

/// (cols, rows) of the local terminal.
fn term_size() -> Option<(u16, u16)> {
    let ws = rustix::termios::tcgetwinsize(std::io::stdout()).ok()?;
    (ws.ws_col > 0 && ws.ws_row > 0).then_some((ws.ws_col, ws.ws_row))
}

fn resize_frame(cols: u16, rows: u16) -> Message {
    Message::Text(serde_json::json!({ "resize": [cols, rows] }).to_string().into())
}

async fn new_session(ctx: &Ctx, sandbox: &str, user: Option<String>) -> Result<SessionInfo> {
    let (cols, rows) = term_size().map(|(c, r)| (Some(c), Some(r))).unwrap_or((None, None));
    let req = CreateSessionRequest { cols, rows, user, ..Default::default() };
    ctx.client.call_as(Method::POST, &format!("/v1/sandboxes/{}/sessions", enc(sandbox)), Some(&req)).await
}

pub async fn shell(ctx: &Ctx, a: ShellArgs) -> Result<i32> {
    if let Some(command) = a.command {
        return run_one(ctx, &a.sandbox, (a.session, a.user), command, a.timeout).await;
    }
    if !std::io::stdin().is_terminal() {
        anyhow::bail!(
            "`sandtree shell` needs a terminal; use `sandtree shell SANDBOX -c 'command'` or `sandtree exec`"
        );
    }
    let (sid, created) = match a.session {
        Some(s) => (s, false),
        None => (new_session(ctx, &a.sandbox, a.user.clone()).await?.id, true),
    };
    let path = format!("/v1/sandboxes/{}/sessions/{}/attach", enc(&a.sandbox), enc(&sid));
    let ws = ctx.client.websocket(&path).await?;
    let (mut tx, mut rx) = ws.split();
    if !created {
        // Redraw at our size when joining an existing session.
        if let Some((c, r)) = term_size() {
            tx.send(resize_frame(c, r)).await?;
        }
    }
    let mut winch = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::window_change())?;
    let raw = RawMode::enter()?;
    let mut stdin = tokio::io::stdin();
    let mut buf = vec![0u8; 8192];
    let mut stdout = std::io::stdout();
    let outcome: Result<()> = async {
        loop {
            tokio::select! {
                msg = rx.next() => match msg {
                    Some(Ok(Message::Binary(b))) => {
                        stdout.write_all(&b)?;
                        stdout.flush()?;
                    }
                    Some(Ok(Message::Text(t))) => {
                        stdout.write_all(t.as_bytes())?;
                        stdout.flush()?;
                    }
                    Some(Ok(Message::Close(_))) | None => return Ok(()),
                    Some(Ok(_)) => {}
                    Some(Err(e)) => return Err(anyhow::anyhow!("connection to the daemon lost: {e}")),
                },
                n = stdin.read(&mut buf) => {
                    let n = n?;
                    if n == 0 {
                        let _ = tx.send(Message::Close(None)).await;
                        return Ok(());
                    }
                    tx.send(Message::Binary(buf[..n].to_vec().into())).await?;
                }
                _ = winch.recv() => {
                    if let Some((c, r)) = term_size() {
                        tx.send(resize_frame(c, r)).await?;
                    }
                }
            }
        }
    }
    .await;
    drop(raw);
    println!();
    outcome?;
    if !created {
        eprintln!("detached from session {sid}");
    }
    Ok(0)
}

async fn run_one(
    ctx: &Ctx,
    sandbox: &str,
    (session, user): (Option<String>, Option<String>),
    command: String,
    timeout: Option<Duration>,
) -> Result<i32> {
    let (sid, created) = match session {
        Some(s) => (s, false),
        None => (new_session(ctx, sandbox, user).await?.id, true),
    };
    let req = SessionRunRequest { command, timeout_ms: timeout.map(|d| d.as_millis() as u64) };
    let mut path = format!("/v1/sandboxes/{}/sessions/{}/run", enc(sandbox), enc(&sid));
    if !ctx.json {
        path.push_str("?encoding=base64"); // written out as the exact bytes
    }
    let result: Result<SessionRunResponse> = ctx.call(Method::POST, &path, Some(&req)).await;
    if created {
        let close = format!("/v1/sandboxes/{}/sessions/{}", enc(sandbox), enc(&sid));
        let _ = ctx.client.call(Method::DELETE, &close, None::<&()>).await;
    }
    let r = result?;
    if !ctx.json {
        let output = BASE64.decode(&r.output).context("the daemon sent output that is not base64")?;
        let mut stdout = std::io::stdout().lock();
        stdout.write_all(&output)?;
        stdout.flush()?;
        if r.timed_out {
            eprintln!("sandtree: the command timed out");
        }
    }
    Ok(r.exit_code.unwrap_or(if r.timed_out { 124 } else { 1 }))
}
