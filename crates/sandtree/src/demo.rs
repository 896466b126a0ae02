//! `sandtree demo`: the quickstart walk-through against a running daemon.
//!
//! Create a sandbox on the embedded default image, install a package and
//! write a project, checkpoint it, fork 8 branches that diverge, roll one
//! back to the root checkpoint, print the checkpoint tree and the measured
//! latencies. Talks plain HTTP/1.1 over the daemon's unix socket.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use clap::Args;
use sandtree::unix_http::request;
use serde_json::{Value, json};

#[derive(Args, Debug, Clone)]
pub struct DemoArgs {
    /// Keep the demo's sandboxes and checkpoints afterwards.
    #[arg(long)]
    pub keep: bool,
}

struct Client {
    socket: PathBuf,
    timings: Vec<(String, f64)>,
}

impl Client {
    fn call(&mut self, what: &str, method: &str, path: &str, body: Option<Value>) -> Result<Value> {
        let t = Instant::now();
        let (status, v) = request(&self.socket, method, path, body.as_ref()).with_context(|| {
            format!("cannot reach the daemon at {} (start it with `sandtree daemon`)", self.socket.display())
        })?;
        let ms = t.elapsed().as_secs_f64() * 1000.0;
        if !(200..300).contains(&status) {
            bail!("{what}: {} ({status})", v["error"]["message"].as_str().unwrap_or(&v.to_string()));
        }
        self.timings.push((what.to_string(), ms));
        Ok(v)
    }

    fn sh(&mut self, what: &str, sb: &str, script: &str) -> Result<String> {
        let v = self.call(
            what,
            "POST",
            &format!("/v1/sandboxes/{sb}/exec"),
            Some(json!({"cmd": ["sh", "-c", script], "timeout_ms": 120000})),
        )?;
        if v["exit_code"] != json!(0) {
            bail!(
                "{what}: `{script}` failed: {}{}",
                v["stdout"].as_str().unwrap_or(""),
                v["stderr"].as_str().unwrap_or("")
            );
        }
        Ok(v["stdout"].as_str().unwrap_or("").to_string())
    }

    fn last_ms(&self) -> f64 {
        self.timings.last().map(|t| t.1).unwrap_or(0.0)
    }
}

const PROJECT: &str = r#"set -e
mkdir -p /root/proj/greet && cd /root/proj
cat > greet/__init__.py <<'PY'
import random, uuid
def hello(name):
    return f"hello {name} from {uuid.uuid4()}"
PY
cat > pyproject.toml <<'PY'
[project]
name = "greet"
version = "0.1.0"
[build-system]
requires = ["setuptools"]
build-backend = "setuptools.build_meta"
PY
pip install --quiet --root-user-action=ignore --no-index --no-build-isolation --break-system-packages . 2>&1 | tail -n 3
git init -q && git add -A && git -c user.email=demo@sandtree -c user.name=demo commit -qm init
python3 -c 'import greet; print(greet.hello("sandbox"))'
"#;

/// Step 6: a process whose state lives in memory (a counter and a random
/// token) and shows it in a file.
const COUNTER: &str = "import os, time\ntoken = os.urandom(4).hex()\nn = 0\nwhile True:\n    n += 1\n    open('/root/.counter', 'w').write(f'pid {os.getpid()} token {token} count {n}')\n    os.replace('/root/.counter', '/root/counter')\n    time.sleep(0.05)\n";

pub fn run(args: DemoArgs, socket: PathBuf) -> Result<()> {
    let mut c = Client { socket: socket.clone(), timings: Vec::new() };
    println!("== 1. create a sandbox on the embedded default image");
    let v = c.call("create sandbox", "POST", "/v1/sandboxes", Some(json!({"labels": {"demo": "quickstart"}})))?;
    let sb = v["sandbox"]["id"].as_str().context("no id")?.to_string();
    println!("   {sb}  ({:.1} ms)", c.last_ms());
    let out =
        c.sh("exec uname", &sb, "echo \"$(id -un)@$(hostname): $(python3 --version), $(gcc --version | head -1)\"")?;
    print!("   {out}");

    println!("== 2. install a package (pip, offline) and write a project (git)");
    let out = c.sh("install + write files", &sb, PROJECT)?;
    print!("   {}", out.replace('\n', "\n   ").trim_end_matches("   "));
    println!();

    println!("== 3. checkpoint");
    let v = c.call("checkpoint", "POST", &format!("/v1/sandboxes/{sb}/checkpoints"), Some(json!({"label": "root"})))?;
    let root = v["checkpoint"]["id"].as_str().context("no checkpoint id")?.to_string();
    println!(
        "   {root}  ({:.1} ms, frozen {:.2} ms)",
        c.last_ms(),
        v["checkpoint"]["frozen_ms"].as_f64().unwrap_or(0.0)
    );

    println!("== 4. fork 8 branches from it; each diverges");
    let v = c.call(
        "fork 8",
        "POST",
        &format!("/v1/checkpoints/{root}/fork"),
        Some(json!({"count": 8, "labels": {"demo": "branch"}})),
    )?;
    println!("   8 sandboxes in {:.1} ms", c.last_ms());
    let mut branches = Vec::new();
    for (i, r) in v["results"].as_array().context("no results")?.iter().enumerate() {
        let id = r["sandbox"]["id"].as_str().with_context(|| format!("fork {i} failed: {}", r["error"]))?.to_string();
        let out = c.sh(
            "exec in branch",
            &id,
            &format!("cd /root/proj && echo 'attempt {i}' > attempt.txt && python3 -c 'import greet; print(greet.hello(\"branch {i}\"))'"),
        )?;
        let v = c.call(
            "checkpoint",
            "POST",
            &format!("/v1/sandboxes/{id}/checkpoints"),
            Some(json!({"label": format!("attempt-{i}")})),
        )?;
        println!("   {id}: {}  -> {}", out.trim(), v["checkpoint"]["id"].as_str().unwrap_or("?"));
        branches.push(id);
    }

    println!("== 5. roll branch 0 back to the root checkpoint");
    let v = c.call(
        "rollback",
        "POST",
        &format!("/v1/sandboxes/{}/rollback", branches[0]),
        Some(json!({"checkpoint": root})),
    )?;
    println!("   {:.1} ms; {}", c.last_ms(), v["note"].as_str().unwrap_or(""));
    let out = c.sh("exec after rollback", &branches[0], "ls /root/proj; test ! -e /root/proj/attempt.txt && echo 'attempt.txt is gone, the package is still installed:' && python3 -c 'import greet; print(greet.__file__)'")?;
    print!("   {}", out.replace('\n', "\n   ").trim_end_matches("   "));
    println!();

    println!("== 6. live processes: a Python process keeps counting in memory; roll it back");
    let v = c.call(
        "start a background process",
        "POST",
        &format!("/v1/sandboxes/{sb}/exec"),
        Some(json!({"cmd": ["python3", "-c", COUNTER], "background": true})),
    )?;
    let pid = v["pid"].as_i64().unwrap_or(0);
    std::thread::sleep(std::time::Duration::from_millis(500));
    let v = c.call("checkpoint", "POST", &format!("/v1/sandboxes/{sb}/checkpoints"), Some(json!({"label": "live"})))?;
    let live = v["checkpoint"]["id"].as_str().context("no checkpoint id")?.to_string();
    let at_ck = c.sh("read state", &sb, "cat /root/counter")?;
    println!(
        "   checkpoint {live} ({:.1} ms, processes paused {:.2} ms): pid {pid} at {}",
        c.last_ms(),
        v["checkpoint"]["frozen_ms"].as_f64().unwrap_or(0.0),
        at_ck.trim()
    );
    std::thread::sleep(std::time::Duration::from_millis(700));
    let later = c.sh("read state", &sb, "cat /root/counter")?;
    println!("   0.7 s later: {}", later.trim());
    let v = c.call("rollback", "POST", &format!("/v1/sandboxes/{sb}/rollback"), Some(json!({"checkpoint": live})))?;
    let ms = c.last_ms();
    let after = c.sh("read state", &sb, "cat /root/counter")?;
    println!("   rolled back in {ms:.1} ms ({}): {}", v["note"].as_str().unwrap_or(""), after.trim());

    println!("== 7. the checkpoint tree");
    let v = c.call("list checkpoints", "GET", &format!("/v1/sandboxes/{sb}/checkpoints"), None)?;
    print_tree(v["checkpoints"].as_array().map(Vec::as_slice).unwrap_or(&[]));

    println!("== 8. latencies (client side, over the unix socket)");
    let mut groups: Vec<(String, Vec<f64>)> = Vec::new();
    for (what, ms) in &c.timings {
        match groups.iter_mut().find(|g| &g.0 == what) {
            Some(g) => g.1.push(*ms),
            None => groups.push((what.clone(), vec![*ms])),
        }
    }
    println!("   {:<24} {:>4} {:>10} {:>10}", "operation", "n", "median ms", "max ms");
    for (what, mut v) in groups {
        v.sort_by(f64::total_cmp);
        println!("   {:<24} {:>4} {:>10.1} {:>10.1}", what, v.len(), v[v.len() / 2], v[v.len() - 1]);
    }

    if !args.keep {
        for id in branches.iter().chain(std::iter::once(&sb)) {
            let _ = request(&socket, "DELETE", &format!("/v1/sandboxes/{id}?checkpoints=true"), None);
        }
        println!(
            "\n(demo sandboxes deleted; run `sandtree demo --keep` to keep them and explore with `sandtree tree`)"
        );
    }
    Ok(())
}

/// Prints checkpoints (parents first) as an indented tree.
fn print_tree(cks: &[Value]) {
    fn walk(cks: &[Value], parent: Option<&str>, prefix: &str) {
        let kids: Vec<&Value> = cks.iter().filter(|c| c["parent"].as_str() == parent).collect();
        for (i, c) in kids.iter().enumerate() {
            let last = i + 1 == kids.len();
            println!(
                "   {prefix}{} {} {:<10} sandbox {} frozen {:.2} ms",
                if last { "└──" } else { "├──" },
                c["id"].as_str().unwrap_or("?"),
                c["label"].as_str().unwrap_or(""),
                c["sandbox_id"].as_str().unwrap_or("?"),
                c["frozen_ms"].as_f64().unwrap_or(0.0)
            );
            let next = format!("{prefix}{}", if last { "    " } else { "│   " });
            walk(cks, c["id"].as_str(), &next);
        }
    }
    walk(cks, None, "");
}
