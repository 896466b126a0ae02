//! Sandboxes' networks: what egress costs the lifecycle, and what the
//! network gives.
//!
//! - **create, rollback, fork** of a sandbox with egress beside the same
//!   without a network (`mode: none`), interleaved, each `n` times; the
//!   rollback and fork are of a checkpoint holding a file (no processes);
//! - **TCP round trip** (1 byte each way, `TCP_NODELAY`) to an echo server
//!   of a test peer (`sandtree_net::peer`: a namespace linked to the host,
//!   standing for the internet), from a sandbox and from a host process,
//!   by the same Python script;
//! - **throughput**: 512 MiB sent to the peer's sink, from a sandbox and
//!   from the host, three times each.
//!
//! No traffic leaves the machine.

use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result, anyhow, bail};
use sandtree_api::{
    CheckpointRequest, CreateSandboxRequest, ExecRequest, ForkRequest, NetworkMode, NetworkSpec, RollbackRequest,
};
use sandtree_net::peer::{ECHO_PORT, Peer, SINK_PORT};
use sandtree_runtime::Engine;

use super::report::{Report, Row};

const GROUP: &str = "network";
/// Create with egress, p50 (ms).
pub const CREATE_TARGET_MS: f64 = 15.0;
/// What egress may add to a rollback or a fork, p50 (ms).
pub const OVERHEAD_TARGET_MS: f64 = 1.0;
/// Sandbox to peer, Gbit/s.
pub const THROUGHPUT_TARGET_GBITS: f64 = 1.0;
const ROUND_TRIPS: usize = 2000;
const SEND_MIB: u64 = 512;

const RTT_PY: &str = r#"
import socket, sys, time
s = socket.create_connection((sys.argv[1], int(sys.argv[2])))
s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
out = []
for i in range(int(sys.argv[3]) + 50):
    t = time.perf_counter(); s.sendall(b"x"); s.recv(1); d = time.perf_counter() - t
    if i >= 50: out.append(d * 1000)
print("\n".join("%.4f" % x for x in out))
"#;

const SEND_PY: &str = r#"
import socket, sys, time
n = int(sys.argv[3]); buf = b"\0" * (1 << 20)
s = socket.create_connection((sys.argv[1], int(sys.argv[2])))
t = time.perf_counter()
for i in range(n): s.sendall(buf)
s.shutdown(socket.SHUT_WR); got = int(s.makefile().readline())
d = time.perf_counter() - t
assert got == n << 20, got
print("%.3f" % (d * 1000))
"#;

fn spec(mode: NetworkMode) -> NetworkSpec {
    NetworkSpec { mode: Some(mode), ..Default::default() }
}

fn label(mode: NetworkMode) -> &'static str {
    match mode {
        NetworkMode::Egress => "egress",
        NetworkMode::None => "no network",
    }
}

fn ms_since(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1000.0
}

/// Measures and adds the rows and checks.
pub async fn rows(engine: Arc<Engine>, n: usize, report: &mut Report) -> Result<()> {
    if !engine.has_network() {
        bail!("the engine runs without networking");
    }
    let modes = [NetworkMode::Egress, NetworkMode::None];
    let e = |e: sandtree_runtime::Error| anyhow!("{e}");

    // Create, interleaved (deletes not timed).
    let mut create = [Vec::new(), Vec::new()];
    for _ in 0..n {
        for (k, mode) in modes.iter().enumerate() {
            let t = Instant::now();
            let r = engine
                .create_sandbox(CreateSandboxRequest { network: spec(*mode), ..Default::default() })
                .await
                .map_err(e)?;
            create[k].push(ms_since(t));
            engine.delete_sandbox(&r.sandbox.id, false).await.map_err(e)?;
        }
    }
    // Rollback and fork of a checkpoint of each.
    let mut sandboxes = Vec::new();
    let mut checkpoints = Vec::new();
    for mode in modes {
        let id = engine
            .create_sandbox(CreateSandboxRequest { network: spec(mode), ..Default::default() })
            .await
            .map_err(e)?
            .sandbox
            .id;
        exec_ok(&engine, &id, &["sh", "-c", "echo state > /root/f"]).await?;
        let ck = engine.checkpoint(&id, CheckpointRequest::default()).await.map_err(e)?.checkpoint.id;
        sandboxes.push(id);
        checkpoints.push(ck);
    }
    let (mut rollback, mut fork) = ([Vec::new(), Vec::new()], [Vec::new(), Vec::new()]);
    for _ in 0..n {
        for k in 0..2 {
            let req = RollbackRequest { checkpoint: checkpoints[k].clone(), allow_restart: false };
            let t = Instant::now();
            engine.rollback(&sandboxes[k], req).await.map_err(e)?;
            rollback[k].push(ms_since(t));
        }
        for k in 0..2 {
            let req = ForkRequest { count: 1, labels: Default::default(), limits: None, files_only: false };
            let t = Instant::now();
            let r = engine.fork(&checkpoints[k], req).await.map_err(e)?;
            fork[k].push(ms_since(t));
            for made in r.results.into_iter().filter_map(|r| r.sandbox) {
                engine.delete_sandbox(&made.id, false).await.map_err(e)?;
            }
        }
    }
    for (verb, samples) in [("create", &create), ("rollback", &rollback), ("fork 1", &fork)] {
        for (k, mode) in modes.iter().enumerate() {
            report.rows.push(Row::new(GROUP, &format!("{verb}: {}", label(*mode)), &samples[k]));
        }
    }
    let created = report.p50("create: egress");
    report.check(
        "create with egress",
        &format!("<= {CREATE_TARGET_MS} ms p50"),
        format!("{created:.2} ms"),
        created <= CREATE_TARGET_MS,
    );
    for verb in ["rollback", "fork 1"] {
        let over = report.p50(&format!("{verb}: egress")) - report.p50(&format!("{verb}: no network"));
        report.check(
            &format!("{verb} with egress, minus without"),
            &format!("<= {OVERHEAD_TARGET_MS} ms p50"),
            format!("{over:+.2} ms"),
            over <= OVERHEAD_TARGET_MS,
        );
    }

    // Round trips and throughput, from the egress sandbox and the host.
    let peer = tokio::task::spawn_blocking(Peer::new).await?.context("making the test peer")?;
    let ip = peer.peer.to_string();
    let sandbox = &sandboxes[0];
    let rtt_args = |port: u16| vec![ip.clone(), port.to_string(), ROUND_TRIPS.to_string()];
    let in_sandbox = lines(&exec_ok(&engine, sandbox, &python(RTT_PY, rtt_args(ECHO_PORT))).await?)?;
    let on_host = lines(&host_python(RTT_PY, rtt_args(ECHO_PORT)).await?)?;
    report.rows.push(Row::new(GROUP, "TCP round trip: sandbox → peer", &in_sandbox));
    report.rows.push(Row::new(GROUP, "TCP round trip: host → peer", &on_host));
    let send_args = vec![ip.clone(), SINK_PORT.to_string(), SEND_MIB.to_string()];
    let (mut from_sandbox, mut from_host) = (Vec::new(), Vec::new());
    for _ in 0..3 {
        from_sandbox.extend(lines(&exec_ok(&engine, sandbox, &python(SEND_PY, send_args.clone())).await?)?);
        from_host.extend(lines(&host_python(SEND_PY, send_args.clone()).await?)?);
    }
    let name = |from: &str| format!("send {SEND_MIB} MiB: {from} → peer");
    report.rows.push(Row::new(GROUP, &name("sandbox"), &from_sandbox));
    report.rows.push(Row::new(GROUP, &name("host"), &from_host));
    let gbits = |ms: f64| (SEND_MIB << 20) as f64 * 8.0 / (ms / 1000.0) / 1e9;
    let (sandbox_gbits, host_gbits) = (gbits(report.p50(&name("sandbox"))), gbits(report.p50(&name("host"))));
    report.check(
        "throughput sandbox → peer",
        &format!(">= {THROUGHPUT_TARGET_GBITS} Gbit/s (host → peer: {host_gbits:.1})"),
        format!("{sandbox_gbits:.1} Gbit/s"),
        sandbox_gbits >= THROUGHPUT_TARGET_GBITS,
    );
    for id in sandboxes {
        engine.delete_sandbox(&id, true).await.map_err(e)?;
    }
    Ok(())
}

fn python(script: &str, args: Vec<String>) -> Vec<String> {
    let mut v = vec!["python3".to_string(), "-c".to_string(), script.to_string()];
    v.extend(args);
    v
}

/// Runs `cmd` in sandbox `id`; its stdout, or an error with its stderr.
async fn exec_ok<S: AsRef<str>>(engine: &Engine, id: &str, cmd: &[S]) -> Result<String> {
    let req = ExecRequest {
        cmd: cmd.iter().map(|s| s.as_ref().to_string()).collect(),
        timeout_ms: Some(120_000),
        ..Default::default()
    };
    let r = engine.exec(id, req).await.map_err(|e| anyhow!("{e}"))?;
    if r.exit_code != Some(0) {
        bail!("{} exited {:?} in the sandbox: {}", cmd[0].as_ref(), r.exit_code, r.stderr);
    }
    Ok(r.stdout)
}

/// The same script as a host process (Debian's python3).
async fn host_python(script: &str, args: Vec<String>) -> Result<String> {
    let out = tokio::process::Command::new("/usr/bin/python3").arg("-c").arg(script).args(args).output().await?;
    if !out.status.success() {
        bail!("python3 on the host: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn lines(out: &str) -> Result<Vec<f64>> {
    out.lines().map(|l| l.trim().parse::<f64>().map_err(|_| anyhow!("not a number: {l:?}"))).collect()
}
