//! The doors: the same two round trips through each way into Sandtree, so
//! that each door's cost over the API shows.
//!
//! - **API**: the daemon's HTTP API over its unix socket (the baseline),
//!   through the CLI's client, one connection a request;
//! - **CLI**: `sandtree create`, `sandtree exec …` as processes (for
//!   reference: each verb is a process start);
//! - **Python SDK**: `python/` (a script run by the venv `target/python`,
//!   which `scripts/test.sh` makes; the rows are left out, with a note,
//!   where it is missing);
//! - **MCP (HTTP)**: `tools/call` on `POST /mcp`;
//! - **MCP (stdio)**: `tools/call` to one `sandtree mcp` process;
//! - **e2b SDK**: the official `e2b` package against the E2B door
//!   (`commands.run` is `bash -l -c`, as E2B runs it; the rollback is
//!   Sandtree's extension, `POST /sandboxes/{id}/rollback`);
//! - **E2B door, plain Python client**: create + `process.Process/Start`
//!   through the door, beside create + exec through the API, both with
//!   Python's `http.client` (one connection kept) and `bash -l -c true`.
//!   The e2b SDK spends 2 to 3 ms of Python per trip of its own (measured
//!   against a server answering at once: docs/performance-notes.md), so
//!   the *door's* overhead is checked with one client on both sides.
//!
//! Round trips: *create + exec `true`* (a sandbox made and a command run
//! in it; the delete is not timed) and *checkpoint → rollback* (of a
//! sandbox holding a file). The daemon is the run's engine behind the
//! daemon's own router, on a socket in the scratch directory.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result, anyhow, bail};
use hyper::Method;
use sandtree_runtime::Engine;
use serde_json::{Value, json};

use super::report::{Report, Row};
use crate::cli::client::{Client, Endpoint};

const GROUP: &str = "doors";
/// What a door may add over the API, p50 (ms).
pub const DOOR_OVERHEAD_TARGET_MS: f64 = 2.0;
const CREATE_EXEC: &str = "create + exec true";
const CHECKPOINT_ROLLBACK: &str = "checkpoint → rollback";
/// The venv with the SDK, relative to the working directory.
const SDK_PYTHON: &str = "target/python/bin/python";

fn row_name(trip: &str, door: &str) -> String {
    format!("{trip}: {door}")
}

/// Measures every door and adds the rows and the overhead checks.
pub async fn rows(engine: Arc<Engine>, scratch: &Path, n: usize, report: &mut Report) -> Result<()> {
    let socket = scratch.join("doors.sock");
    let _ = std::fs::remove_file(&socket);
    let listener = tokio::net::UnixListener::bind(&socket).context("binding the doors' socket")?;
    let app = crate::daemon::server::app(Some(engine.clone()), None);
    let server = tokio::spawn(async move { axum::serve(listener, app).await });
    let result = measure(engine, &socket, n, report).await;
    server.abort();
    let _ = std::fs::remove_file(&socket);
    result
}

async fn measure(engine: Arc<Engine>, socket: &Path, n: usize, report: &mut Report) -> Result<()> {
    let api = Client::new(Endpoint::Unix(socket.to_path_buf()), None);
    let mut doors: Vec<(&str, [Vec<f64>; 2])> = Vec::new();
    doors.push(("API", api_door(&api, n).await?));
    doors.push(("CLI", cli_door(&api, socket, n).await?));
    match sdk_door(socket, n).await? {
        Some(samples) => doors.push(("Python SDK", samples)),
        None => eprintln!("bench: no {SDK_PYTHON} with the SDK (scripts/test.sh makes it): Python SDK rows left out"),
    }
    let mut plain = None;
    match e2b_door(engine.clone(), socket, n).await? {
        Some([create_exec, checkpoint_rollback, door, api]) => {
            doors.push(("e2b SDK", [create_exec, checkpoint_rollback]));
            plain = Some([door, api]);
        }
        None => {
            eprintln!("bench: no {SDK_PYTHON} with the e2b package (scripts/test.sh installs it): e2b rows left out")
        }
    }
    doors.push(("MCP (HTTP)", mcp_http_door(&api, n).await?));
    let sock = socket.to_path_buf();
    doors.push(("MCP (stdio)", tokio::task::spawn_blocking(move || mcp_stdio_door(&sock, n)).await??));
    for (trip, k) in [(CREATE_EXEC, 0), (CHECKPOINT_ROLLBACK, 1)] {
        for (door, samples) in &doors {
            report.rows.push(Row::new(GROUP, &row_name(trip, door), &samples[k]));
        }
    }
    // E2B runs every command as `bash -l -c`: its door is measured
    // against the API running the same.
    let login = api_login_shell(&api, n).await?;
    report.rows.push(Row::new(GROUP, &row_name(CREATE_EXEC, LOGIN_SHELL), &login));
    if let Some([door, api]) = &plain {
        report.rows.push(Row::new(GROUP, &row_name(CREATE_EXEC, PLAIN_DOOR), door));
        report.rows.push(Row::new(GROUP, &row_name(CREATE_EXEC, PLAIN_API), api));
    }
    for (trip, _) in [(CREATE_EXEC, 0), (CHECKPOINT_ROLLBACK, 1)] {
        for (door, _) in doors.iter().filter(|(d, _)| !matches!(*d, "API" | "CLI")) {
            let (door, base_door, label) = match (*door, trip) {
                // The e2b SDK's own client work is not the door's: the
                // door is checked with one plain client on both sides.
                ("e2b SDK", CREATE_EXEC) => {
                    let sdk = report.p50(&row_name(trip, door)) - report.p50(&row_name(trip, LOGIN_SHELL));
                    report.notes_extra.push(format!(
                        "{trip} via the e2b SDK: {sdk:+.2} ms over the API (bash -l -c true, Rust client), most of it the SDK's own client work in Python; the door's overhead is checked with one plain Python HTTP client on both sides"
                    ));
                    if plain.is_none() {
                        continue;
                    }
                    (PLAIN_DOOR, PLAIN_API, "E2B door, minus API (one plain Python client, bash -l -c true)")
                }
                (door, _) => (door, "API", ""),
            };
            let base = report.p50(&row_name(trip, base_door));
            let over = report.p50(&row_name(trip, door)) - base;
            let name = match label {
                "" => format!("{trip} via {door}, minus {base_door}"),
                label => format!("{trip} via {label}"),
            };
            report.check(
                &name,
                &format!("<= {DOOR_OVERHEAD_TARGET_MS} ms"),
                format!("{over:+.2} ms"),
                over <= DOOR_OVERHEAD_TARGET_MS,
            );
        }
    }
    Ok(())
}

fn ms_since(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1000.0
}

async fn call(api: &Client, method: Method, path: &str, body: Value) -> Result<Value> {
    let body = (!body.is_null()).then_some(body);
    api.call(method, path, body.as_ref()).await
}

/// A sandbox holding a file, for the checkpoint → rollback trips.
async fn sandbox_with_a_file(api: &Client) -> Result<String> {
    let v = call(api, Method::POST, "/v1/sandboxes", json!({})).await?;
    let id = v["sandbox"]["id"].as_str().ok_or_else(|| anyhow!("no sandbox id in {v}"))?.to_string();
    call(api, Method::POST, &format!("/v1/sandboxes/{id}/exec"), json!({"cmd": ["sh", "-c", "echo state > /root/f"]}))
        .await?;
    Ok(id)
}

async fn delete(api: &Client, id: &str) -> Result<()> {
    call(api, Method::DELETE, &format!("/v1/sandboxes/{id}?checkpoints=true"), Value::Null).await.map(|_| ())
}

/// The API's row the e2b SDK's command is shown against.
const LOGIN_SHELL: &str = "API, bash -l -c true";
/// The E2B door and the API through one plain Python HTTP client
/// (`http.client`, one connection kept): the door's own overhead.
const PLAIN_DOOR: &str = "E2B door, plain Python client";
const PLAIN_API: &str = "API, plain Python client, bash -l -c true";

/// Create + exec of `bash -l -c true` through the API: what E2B's
/// `commands.run("true")` runs.
async fn api_login_shell(api: &Client, n: usize) -> Result<Vec<f64>> {
    let mut samples = Vec::new();
    for _ in 0..n {
        let t = Instant::now();
        let v = call(api, Method::POST, "/v1/sandboxes", json!({})).await?;
        let id = v["sandbox"]["id"].as_str().unwrap_or_default().to_string();
        let cmd = json!({"cmd": ["/bin/bash", "-l", "-c", "true"]});
        call(api, Method::POST, &format!("/v1/sandboxes/{id}/exec"), cmd).await?;
        samples.push(ms_since(t));
        delete(api, &id).await?;
    }
    Ok(samples)
}

async fn api_door(api: &Client, n: usize) -> Result<[Vec<f64>; 2]> {
    let mut trips = [Vec::new(), Vec::new()];
    for _ in 0..n {
        let t = Instant::now();
        let v = call(api, Method::POST, "/v1/sandboxes", json!({})).await?;
        let id = v["sandbox"]["id"].as_str().unwrap_or_default().to_string();
        let out = call(api, Method::POST, &format!("/v1/sandboxes/{id}/exec"), json!({"cmd": ["true"]})).await?;
        trips[0].push(ms_since(t));
        if out["exit_code"] != json!(0) {
            bail!("true exited {out}");
        }
        delete(api, &id).await?;
    }
    let sb = sandbox_with_a_file(api).await?;
    for _ in 0..n {
        let t = Instant::now();
        let v = call(api, Method::POST, &format!("/v1/sandboxes/{sb}/checkpoints"), json!({})).await?;
        let ck = v["checkpoint"]["id"].as_str().unwrap_or_default().to_string();
        call(api, Method::POST, &format!("/v1/sandboxes/{sb}/rollback"), json!({"checkpoint": ck})).await?;
        trips[1].push(ms_since(t));
    }
    delete(api, &sb).await?;
    Ok(trips)
}

fn cli(socket: &Path, args: &[&str]) -> Result<String> {
    let exe = std::env::current_exe()?;
    let out = Command::new(exe).arg("--socket").arg(socket).args(args).stdin(Stdio::null()).output()?;
    if !out.status.success() {
        bail!("sandtree {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

async fn cli_door(api: &Client, socket: &Path, n: usize) -> Result<[Vec<f64>; 2]> {
    let mut trips = [Vec::new(), Vec::new()];
    for _ in 0..n {
        let t = Instant::now();
        let id = cli(socket, &["create"])?;
        cli(socket, &["exec", &id, "--", "true"])?;
        trips[0].push(ms_since(t));
        delete(api, &id).await?;
    }
    let sb = sandbox_with_a_file(api).await?;
    for _ in 0..n {
        let t = Instant::now();
        let ck = cli(socket, &["checkpoint", &sb])?;
        cli(socket, &["rollback", &sb, &ck])?;
        trips[1].push(ms_since(t));
    }
    delete(api, &sb).await?;
    Ok(trips)
}

/// The SDK's side: both trips `n` times, the samples as JSON on stdout.
const SDK_SCRIPT: &str = r#"
import json, sys, time
from sandtree import Sandtree
socket, n = sys.argv[1], int(sys.argv[2])
trips = [[], []]
with Sandtree(socket) as c:
    for _ in range(n):
        t = time.perf_counter()
        sb = c.create()
        sb.exec(["true"]).check()
        trips[0].append((time.perf_counter() - t) * 1000)
        sb.delete(checkpoints=True)
    sb = c.create()
    sb.exec("echo state > /root/f").check()
    for _ in range(n):
        t = time.perf_counter()
        ck = sb.checkpoint()
        sb.rollback(ck)
        trips[1].append((time.perf_counter() - t) * 1000)
    sb.delete(checkpoints=True)
print(json.dumps(trips))
"#;

async fn sdk_door(socket: &Path, n: usize) -> Result<Option<[Vec<f64>; 2]>> {
    let args = [socket.as_os_str().to_owned(), n.to_string().into()];
    python_trips(("the SDK", "sandtree"), SDK_SCRIPT, &args, &[]).await
}

/// Runs a door's bench script (`-c script args…`, with `env`) in the
/// venv: its trips' samples (the JSON it prints), or `None` where the
/// venv or the package `module` is missing.
async fn python_trips<T: serde::de::DeserializeOwned>(
    (door, module): (&str, &str),
    script: &str,
    args: &[std::ffi::OsString],
    env: &[(&str, String)],
) -> Result<Option<T>> {
    let python = PathBuf::from(SDK_PYTHON);
    if !python.exists() {
        return Ok(None);
    }
    let mut command = tokio::process::Command::new(&python);
    command.arg("-c").arg(script).args(args).env_remove("E2B_DEBUG");
    for (k, v) in env {
        command.env(k, v);
    }
    let out = command.output().await.with_context(|| format!("running {door}'s bench script"))?;
    if !out.status.success() {
        if String::from_utf8_lossy(&out.stderr).contains(&format!("No module named '{module}'")) {
            return Ok(None);
        }
        bail!("{door}'s bench script failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    let trips = serde_json::from_slice(&out.stdout).with_context(|| format!("{door}'s bench script's output"))?;
    Ok(Some(trips))
}

/// The e2b SDK's side: both trips `n` times (the checkpoint → rollback
/// trip is a snapshot and Sandtree's rollback extension); then create +
/// exec through the E2B door and through the API (argv[2], its unix
/// socket) with one plain Python HTTP client, alternately, `bash -l -c
/// true` on both sides. The four sample lists as JSON on stdout.
const E2B_SCRIPT: &str = r#"
import http.client, json, os, socket, struct, sys, time
import httpx
from e2b import Sandbox
n, api_socket = int(sys.argv[1]), sys.argv[2]
api = os.environ["E2B_API_URL"]
key = os.environ["E2B_API_KEY"]
trips = [[], [], [], []]
for _ in range(n):
    t = time.perf_counter()
    sbx = Sandbox.create()
    sbx.commands.run("true")
    trips[0].append((time.perf_counter() - t) * 1000)
    sbx.kill()
sbx = Sandbox.create()
sbx.files.write("/root/f", "state")
with httpx.Client(headers={"X-API-KEY": key}) as hx:
    for _ in range(n):
        t = time.perf_counter()
        snap = sbx.create_snapshot()
        r = hx.post(f"{api}/sandboxes/{sbx.sandbox_id}/rollback", json={"snapshotID": snap.snapshot_id})
        r.raise_for_status()
        trips[1].append((time.perf_counter() - t) * 1000)
sbx.kill()

class UnixConnection(http.client.HTTPConnection):
    def __init__(self, path):
        super().__init__("localhost")
        self.unix_path = path
    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.connect(self.unix_path)

def call(conn, method, path, body=None, headers={}):
    conn.request(method, path, body=body, headers=headers)
    r = conn.getresponse()
    data = r.read()
    if r.status >= 300:
        raise SystemExit(f"{method} {path}: {r.status} {data[:300]!r}")
    return data

door = http.client.HTTPConnection(api.removeprefix("http://"))
unix = UnixConnection(api_socket)
login = ["-l", "-c", "true"]
start = json.dumps({"process": {"cmd": "/bin/bash", "args": login}}).encode()
def via_door():
    t = time.perf_counter()
    v = json.loads(call(door, "POST", "/v2/sandboxes", json.dumps({"templateID": "base"}),
                        {"X-API-KEY": key, "Content-Type": "application/json"}))
    out = call(door, "POST", "/process.Process/Start", struct.pack(">BI", 0, len(start)) + start,
               {"Content-Type": "application/connect+json", "E2b-Sandbox-Id": v["sandboxID"],
                "X-Access-Token": v["envdAccessToken"]})
    trips[2].append((time.perf_counter() - t) * 1000)
    if b'"exitCode":0' not in out:
        raise SystemExit(f"true did not exit 0: {out!r}")
    call(door, "DELETE", f"/sandboxes/{v['sandboxID']}", headers={"X-API-KEY": key})
def via_api():
    t = time.perf_counter()
    v = json.loads(call(unix, "POST", "/v1/sandboxes", b"{}", {"Content-Type": "application/json"}))
    sid = v["sandbox"]["id"]
    out = json.loads(call(unix, "POST", f"/v1/sandboxes/{sid}/exec",
                          json.dumps({"cmd": ["/bin/bash"] + login}), {"Content-Type": "application/json"}))
    trips[3].append((time.perf_counter() - t) * 1000)
    if out["exit_code"] != 0:
        raise SystemExit(f"true exited {out}")
    call(unix, "DELETE", f"/v1/sandboxes/{sid}?checkpoints=true")
for i in range(n):
    for f in ((via_door, via_api) if i % 2 == 0 else (via_api, via_door)):
        f()
print(json.dumps(trips))
"#;

async fn e2b_door(engine: Arc<Engine>, socket: &Path, n: usize) -> Result<Option<[Vec<f64>; 4]>> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.context("binding the E2B door")?;
    let addr = listener.local_addr()?;
    let listener = axum::serve::ListenerExt::tap_io(listener, sandtree::daemon::server::no_delay);
    let token = format!("{:032x}", rand::random::<u128>());
    let door = sandtree::e2b::router(
        sandtree::e2b::E2b::open(engine, sandtree::daemon::auth::Token::new(token.clone())).await,
    );
    let server = tokio::spawn(async move { axum::serve(listener, door).await });
    let url = format!("http://{addr}");
    let env = [("E2B_API_URL", url.clone()), ("E2B_SANDBOX_URL", url), ("E2B_API_KEY", token)];
    let args = [n.to_string().into(), socket.as_os_str().to_owned()];
    let trips = python_trips(("the e2b SDK", "e2b"), E2B_SCRIPT, &args, &env).await;
    server.abort();
    trips
}

/// One `tools/call` answer's structured content (an error if the tool failed).
fn tool_result(answer: &Value) -> Result<&Value> {
    let result = &answer["result"];
    if result["isError"] != json!(false) {
        bail!("MCP tool call failed: {answer}");
    }
    Ok(&result["structuredContent"])
}

fn tool_call(id: u64, name: &str, args: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {"name": name, "arguments": args}})
}

async fn mcp_http_door(api: &Client, n: usize) -> Result<[Vec<f64>; 2]> {
    let mut trips = [Vec::new(), Vec::new()];
    let tool = |name: &'static str, args: Value| async move {
        let answer = call(api, Method::POST, "/mcp", tool_call(1, name, args)).await?;
        tool_result(&answer).cloned()
    };
    for _ in 0..n {
        let t = Instant::now();
        let sb = tool("create_sandbox", json!({})).await?;
        let id = sb["sandbox_id"].as_str().unwrap_or_default().to_string();
        tool("run_command", json!({"sandbox_id": id, "command": "true"})).await?;
        trips[0].push(ms_since(t));
        delete(api, &id).await?;
    }
    let sb = sandbox_with_a_file(api).await?;
    for _ in 0..n {
        let t = Instant::now();
        let ck = tool("checkpoint", json!({"sandbox_id": sb})).await?;
        tool("rollback", json!({"sandbox_id": sb, "checkpoint_id": ck["checkpoint_id"]})).await?;
        trips[1].push(ms_since(t));
    }
    delete(api, &sb).await?;
    Ok(trips)
}

/// The stdio server as a child: a line out, a line back.
struct StdioServer {
    child: std::process::Child,
    input: std::process::ChildStdin,
    output: BufReader<std::process::ChildStdout>,
    next_id: u64,
}

impl StdioServer {
    fn start(socket: &Path) -> Result<StdioServer> {
        let mut child = Command::new(std::env::current_exe()?)
            .arg("mcp")
            .env("SANDTREE_SOCKET", socket)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .context("starting sandtree mcp")?;
        let input = child.stdin.take().expect("piped");
        let output = BufReader::new(child.stdout.take().expect("piped"));
        let mut s = StdioServer { child, input, output, next_id: 0 };
        s.request(json!({"jsonrpc": "2.0", "id": 0, "method": "initialize",
            "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "bench", "version": "0"}}}))?;
        writeln!(s.input, "{}", json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))?;
        Ok(s)
    }

    fn request(&mut self, msg: Value) -> Result<Value> {
        writeln!(self.input, "{msg}")?;
        self.input.flush()?;
        let mut line = String::new();
        self.output.read_line(&mut line)?;
        serde_json::from_str(&line).with_context(|| format!("sandtree mcp answered {line:?}"))
    }

    fn tool(&mut self, name: &str, args: Value) -> Result<Value> {
        self.next_id += 1;
        let answer = self.request(tool_call(self.next_id, name, args))?;
        tool_result(&answer).cloned()
    }
}

impl Drop for StdioServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn mcp_stdio_door(socket: &Path, n: usize) -> Result<[Vec<f64>; 2]> {
    let mut s = StdioServer::start(socket)?;
    let mut trips = [Vec::new(), Vec::new()];
    for _ in 0..n {
        let t = Instant::now();
        let sb = s.tool("create_sandbox", json!({}))?;
        s.tool("run_command", json!({"sandbox_id": sb["sandbox_id"], "command": "true"}))?;
        trips[0].push(ms_since(t));
        s.tool("delete_sandbox", json!({"sandbox_id": sb["sandbox_id"], "delete_checkpoints": true}))?;
    }
    let sb = s.tool("create_sandbox", json!({}))?["sandbox_id"].clone();
    s.tool("write_file", json!({"sandbox_id": sb, "path": "/root/f", "content": "state\n"}))?;
    for _ in 0..n {
        let t = Instant::now();
        let ck = s.tool("checkpoint", json!({"sandbox_id": sb}))?;
        s.tool("rollback", json!({"sandbox_id": sb, "checkpoint_id": ck["checkpoint_id"]}))?;
        trips[1].push(ms_since(t));
    }
    s.tool("delete_sandbox", json!({"sandbox_id": sb, "delete_checkpoints": true}))?;
    Ok(trips)
}
