//! `exec`, `ps`, `logs`, `kill`.

use std::io::{IsTerminal, Read, Write};

use anyhow::{Context, Result};
use hyper::Method;
use sandtree_api::*;

use super::Ctx;
use crate::cli::ExecArgs;
use crate::cli::client::{RemoteError, enc};
use crate::cli::output::{ago, table};

/// The shell convention: the exit status, or 128 + the signal.
pub fn exit_status(r: &ExecResponse) -> i32 {
    match (r.exit_code, r.signal) {
        (Some(c), _) => c,
        (None, Some(s)) => 128 + s,
        (None, None) => 1,
    }
}

pub async fn exec(ctx: &Ctx, a: ExecArgs) -> Result<i32> {
    let stdin = if a.background || std::io::stdin().is_terminal() {
        None
    } else {
        let mut buf = Vec::new();
        std::io::stdin().read_to_end(&mut buf).context("reading stdin")?;
        (!buf.is_empty()).then(|| String::from_utf8_lossy(&buf).into_owned())
    };
    let req = ExecRequest {
        cmd: a.cmd,
        env: a.env.into_iter().collect(),
        cwd: a.cwd,
        stdin,
        timeout_ms: a.timeout.map(|d| d.as_millis() as u64),
        max_output_bytes: None,
        background: a.background,
    };
    let base = format!("/v1/sandboxes/{}/exec", enc(&a.sandbox));
    if a.background {
        let r: ExecResponse = ctx.call(Method::POST, &base, Some(&req)).await?;
        if !ctx.json {
            println!("{}", r.pid);
        }
        return Ok(0);
    }
    if ctx.json {
        let r: ExecResponse = ctx.call(Method::POST, &base, Some(&req)).await?;
        return Ok(exit_status(&r));
    }
    let mut code = 1;
    let mut stdout = std::io::stdout();
    let mut stderr = std::io::stderr();
    ctx.client
        .stream(Method::POST, &format!("{base}?stream=true"), Some(&req), |ev: ExecEvent| {
            match ev {
                ExecEvent::Started { .. } => {}
                ExecEvent::Stdout { data } => {
                    stdout.write_all(data.as_bytes())?;
                    stdout.flush()?;
                }
                ExecEvent::Stderr { data } => {
                    stderr.write_all(data.as_bytes())?;
                    stderr.flush()?;
                }
                ExecEvent::Exit(r) => {
                    if r.timed_out {
                        eprintln!("sandtree: the command timed out and was killed");
                    }
                    if r.stdout_truncated || r.stderr_truncated {
                        eprintln!("sandtree: output was truncated");
                    }
                    code = exit_status(&r);
                }
                ExecEvent::Error(e) => return Err(RemoteError(e).into()),
            }
            Ok(())
        })
        .await?;
    Ok(code)
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

pub async fn logs(ctx: &Ctx, sandbox: &str, pid: i32) -> Result<i32> {
    let o: ProcessOutput = ctx.get(Method::GET, &format!("/v1/sandboxes/{}/processes/{pid}", enc(sandbox))).await?;
    if !ctx.json {
        print!("{}", o.stdout);
        eprint!("{}", o.stderr);
    }
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
