//! `exec`, `ps`, `logs`, `kill`.

use std::io::{IsTerminal, Write};

use anyhow::{Context, Result};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use hyper::Method;
use sandtree_api::*;

use super::Ctx;
use crate::cli::ExecArgs;
use crate::cli::client::{RemoteError, enc, read_stream};
use crate::cli::output::{ago, print_json, table};

/// The shell convention: the exit status, or 128 + the signal.
pub fn exit_status(r: &ExecResponse) -> i32 {
    match (r.exit_code, r.signal) {
        (Some(c), _) => c,
        (None, Some(s)) => 128 + s,
        (None, None) => 1,
    }
}

/// Runs a command. Stdin that is not a terminal streams to the program
/// (any size, byte-exact) while the output streams back; output is asked
/// for in base64 and written out as the exact bytes. With `--json`, the
/// answer is one `ExecResponse` (output as text).
pub async fn exec(ctx: &Ctx, a: ExecArgs) -> Result<i32> {
    let streamed_stdin = !a.background && !a.no_stdin && !std::io::stdin().is_terminal();
    let req = ExecRequest {
        cmd: a.cmd,
        env: a.env.into_iter().collect(),
        cwd: a.cwd,
        user: a.user,
        timeout_ms: a.timeout.map(|d| d.as_millis() as u64),
        background: a.background,
        ..Default::default()
    };
    let base = format!("/v1/sandboxes/{}/exec", enc(&a.sandbox));
    if a.background {
        let r: ExecResponse = ctx.call(Method::POST, &base, Some(&req)).await?;
        if !ctx.json {
            println!("{}", r.pid);
        }
        return Ok(0);
    }
    if ctx.json && !streamed_stdin {
        let r: ExecResponse = ctx.call(Method::POST, &base, Some(&req)).await?;
        return Ok(exit_status(&r));
    }
    // Streamed both ways: the answer ends when the program does, however
    // much stdin is left (`head -c 10 < /dev/zero` ends).
    let path = format!("{base}?stream=true&encoding=base64");
    let (resp, mut stop) = if streamed_stdin {
        let (resp, stop) = ctx.client.send_stdin(&path, &req, std::io::stdin()).await?;
        (resp, Some(stop))
    } else {
        (ctx.client.send(Method::POST, &path, Some(&req)).await?, None)
    };
    let mut stdout = std::io::stdout().lock();
    let mut stderr = std::io::stderr().lock();
    // Kept for --json, at most as much as a buffered answer keeps.
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let (mut out_cut, mut err_cut) = (false, false);
    let mut last = None;
    read_stream(resp, |ev: ExecEvent| {
        match ev {
            ExecEvent::Started { .. } => {}
            ExecEvent::Stdout { data } if ctx.json => keep(&mut out, &mut out_cut, decode(&data)?),
            ExecEvent::Stderr { data } if ctx.json => keep(&mut err, &mut err_cut, decode(&data)?),
            ExecEvent::Stdout { data } => {
                stdout.write_all(&decode(&data)?)?;
                stdout.flush()?;
            }
            ExecEvent::Stderr { data } => {
                stderr.write_all(&decode(&data)?)?;
                stderr.flush()?;
            }
            ExecEvent::Exit(r) => {
                // The answer is complete: the rest of stdin is not wanted.
                if let Some(s) = stop.as_mut() {
                    s.stop();
                }
                last = Some(r);
            }
            ExecEvent::Error(e) => return Err(RemoteError(e).into()),
        }
        Ok(())
    })
    .await?;
    let mut r = last.context("the daemon's answer ended before the command did: see the daemon's log")?;
    if ctx.json {
        r.stdout = String::from_utf8_lossy(&out).into_owned();
        r.stderr = String::from_utf8_lossy(&err).into_owned();
        r.stdout_truncated = out_cut;
        r.stderr_truncated = err_cut;
        print_json(&serde_json::to_value(&r)?);
    } else if r.timed_out {
        eprintln!("sandtree: the command timed out and was killed");
    }
    Ok(exit_status(&r))
}

/// Appends `data` to `kept` up to [`JSON_KEPT`] bytes; `cut` says some was dropped.
fn keep(kept: &mut Vec<u8>, cut: &mut bool, data: Vec<u8>) {
    let room = JSON_KEPT.saturating_sub(kept.len());
    *cut |= data.len() > room;
    kept.extend_from_slice(&data[..room.min(data.len())]);
}

/// Output kept per stream for `--json` (the API's default `max_output_bytes`).
const JSON_KEPT: usize = 1 << 20;

/// Output the daemon sent as base64.
fn decode(data: &str) -> Result<Vec<u8>> {
    BASE64.decode(data).context("the daemon sent output that is not base64")
}

pub async fn ps(ctx: &Ctx, sandbox: &str) -> Result<i32> {
    let l: ProcessList = ctx.get(Method::GET, &format!("/v1/sandboxes/{}/processes", enc(sandbox))).await?;
    if !ctx.json {
        let rows: Vec<Vec<String>> = l
            .processes
            .iter()
            .map(|p| {
                let state = match (p.running, p.exit_code, p.signal) {
                    (true, _, _) => "running".to_string(),
                    (false, Some(c), _) => format!("exited {c}"),
                    (false, None, Some(s)) => format!("killed by signal {s}"),
                    (false, None, None) => "exited".to_string(),
                };
                vec![p.pid.to_string(), state, ago(&p.started_at), p.cmd.join(" ")]
            })
            .collect();
        print!("{}", table(&["PID", "STATE", "STARTED", "COMMAND"], &rows));
    }
    Ok(0)
}

/// A background process's output, as the exact bytes (`--json`: as text).
pub async fn logs(ctx: &Ctx, sandbox: &str, pid: i32) -> Result<i32> {
    let path = format!("/v1/sandboxes/{}/processes/{pid}", enc(sandbox));
    if ctx.json {
        let _: ProcessOutput = ctx.get(Method::GET, &path).await?;
        return Ok(0);
    }
    let o: ProcessOutput = ctx.get(Method::GET, &format!("{path}?encoding=base64")).await?;
    let mut stdout = std::io::stdout().lock();
    stdout.write_all(&decode(&o.stdout)?)?;
    stdout.flush()?;
    let mut stderr = std::io::stderr().lock();
    stderr.write_all(&decode(&o.stderr)?)?;
    stderr.flush()?;
    Ok(0)
}

pub async fn kill(ctx: &Ctx, sandbox: &str, pid: i32, signal: i32) -> Result<i32> {
    let path = format!("/v1/sandboxes/{}/processes/{pid}?signal={signal}", enc(sandbox));
    let _: serde_json::Value = ctx.get(Method::DELETE, &path).await?;
    if !ctx.json {
        println!("sent signal {signal} to {pid}");
    }
    Ok(0)
}
