//! Test harness for end-to-end tests: runs the real `sandtree daemon` binary
//! on a scratch data directory and talks HTTP/1.1 to it over its unix socket.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

pub const BIN: &str = env!("CARGO_BIN_EXE_sandtree");

/// Skips (returns true) when the host cannot run sandboxes at all.
pub fn must_skip() -> bool {
    if !nix::unistd::Uid::effective().is_root() {
        eprintln!("SKIP: end-to-end tests need root");
        return true;
    }
    if !std::fs::read_to_string("/proc/filesystems").unwrap_or_default().contains("btrfs") {
        eprintln!("SKIP: the kernel has no btrfs");
        return true;
    }
    false
}

pub struct Daemon {
    pub dir: PathBuf,
    pub socket: PathBuf,
    /// This daemon's own cgroup (`--cgroup-name`): removed, with every
    /// sandbox cgroup under it, when the test ends.
    pub cgroup: String,
    child: Option<Child>,
    extra: Vec<String>,
}

impl Daemon {
    /// A daemon on a fresh data directory with a small sparse image.
    pub fn start(name: &str) -> Daemon {
        Daemon::start_with(name, &["--image-size", "4G"])
    }

    pub fn start_with(name: &str, extra: &[&str]) -> Daemon {
        let dir = PathBuf::from(format!("/var/tmp/sandtree-test-{name}-{}", std::process::id()));
        let cgroup = format!("sandtree-test-{name}-{}", std::process::id());
        remove_cgroups(&cgroup);
        cleanup_dir(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let mut d = Daemon {
            socket: dir.join("sandtree.sock"),
            cgroup,
            dir,
            child: None,
            extra: extra.iter().map(|s| s.to_string()).collect(),
        };
        d.spawn();
        d
    }

    pub fn command(&self) -> Command {
        let mut c = Command::new(BIN);
        c.arg("daemon")
            .arg("--data-dir")
            .arg(&self.dir)
            .arg("--socket")
            .arg(&self.socket)
            .arg("--cgroup-name")
            .arg(&self.cgroup)
            .args(&self.extra);
        c
    }

    /// Starts the daemon process and waits until it answers.
    pub fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new().create(true).append(true).open(self.dir.join("daemon.log")).unwrap();
        let child = self
            .command()
            .stdout(Stdio::from(log.try_clone().unwrap()))
            .stderr(Stdio::from(log))
            .spawn()
            .expect("spawn daemon");
        self.child = Some(child);
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(60) {
            if let Some(Ok(Some(status))) = self.child.as_mut().map(|c| c.try_wait()) {
                panic!("daemon exited early ({status}): {}", self.log());
            }
            if UnixStream::connect(&self.socket).is_ok() && self.try_get("/v1/info").is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("daemon did not come up: {}", self.log());
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("daemon.log")).unwrap_or_default()
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    /// SIGTERM, and SIGKILL if the daemon has not exited 10 s later: a
    /// graceful stop lets it finish removing deleted sandboxes' cgroups.
    pub fn terminate(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ =
                nix::sys::signal::kill(nix::unistd::Pid::from_raw(c.id() as i32), nix::sys::signal::Signal::SIGTERM);
            let t = Instant::now();
            while t.elapsed() < Duration::from_secs(10) {
                if let Ok(Some(_)) = c.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Sends `signal` and waits (up to `limit`) for the daemon to exit.
    pub fn stop_with(&mut self, signal: nix::sys::signal::Signal, limit: Duration) -> std::process::ExitStatus {
        let mut c = self.child.take().expect("daemon running");
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(c.id() as i32), signal).unwrap();
        let t = Instant::now();
        loop {
            if let Some(status) = c.try_wait().unwrap() {
                return status;
            }
            if t.elapsed() > limit {
                let _ = c.kill();
                let _ = c.wait();
                panic!("daemon did not exit within {limit:?} of {signal}: {}", self.log());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The path of this daemon's cgroup of sandbox `id` in the freezer
    /// hierarchy (v1) or of its `cgroup.freeze` (v2).
    pub fn freeze_file(&self, id: &str) -> PathBuf {
        let v1 = Path::new("/sys/fs/cgroup/freezer").join(&self.cgroup).join(id).join("freezer.state");
        if v1.exists() { v1 } else { Path::new("/sys/fs/cgroup").join(&self.cgroup).join(id).join("cgroup.freeze") }
    }

    /// SIGKILL: no chance to clean up anything.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    pub fn restart(&mut self) {
        self.kill9();
        self.spawn();
    }

    pub fn try_request(&self, method: &str, path: &str, body: Option<&Value>) -> std::io::Result<(u16, Value)> {
        request(&self.socket, method, path, body)
    }

    fn try_get(&self, path: &str) -> std::io::Result<(u16, Value)> {
        self.try_request("GET", path, None)
    }

    pub fn req(&self, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
        self.try_request(method, path, body.as_ref()).unwrap_or_else(|e| panic!("{method} {path}: {e}\n{}", self.log()))
    }

    /// A request that must succeed (2xx); returns the JSON body.
    pub fn ok(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        let (status, v) = self.req(method, path, body);
        assert!((200..300).contains(&status), "{method} {path} -> {status}: {v}");
        v
    }

    pub fn create(&self) -> String {
        self.ok("POST", "/v1/sandboxes", Some(json!({})))["sandbox"]["id"].as_str().unwrap().to_string()
    }

    /// Runs `sh -c script` and returns (exit code, stdout).
    pub fn sh(&self, sb: &str, script: &str) -> (i64, String) {
        let v = self.ok(
            "POST",
            &format!("/v1/sandboxes/{sb}/exec"),
            Some(json!({"cmd": ["sh", "-c", script], "timeout_ms": 60000})),
        );
        (v["exit_code"].as_i64().unwrap_or(-1), v["stdout"].as_str().unwrap_or("").to_string())
    }

    /// `sh -c script` that must exit 0; returns stdout.
    pub fn sh_ok(&self, sb: &str, script: &str) -> String {
        let (code, out) = self.sh(sb, script);
        assert_eq!(code, 0, "`{script}` in {sb} exited {code}: {out}");
        out
    }

    pub fn checkpoint(&self, sb: &str, label: &str) -> String {
        let v = self.ok("POST", &format!("/v1/sandboxes/{sb}/checkpoints"), Some(json!({"label": label})));
        v["checkpoint"]["id"].as_str().unwrap().to_string()
    }

    /// A checkpoint of `sb` whose durable process image is written when it
    /// answers (`wait_durable`).
    pub fn checkpoint_durable(&self, sb: &str, label: &str) -> String {
        let body = json!({"label": label, "wait_durable": true});
        let v = self.ok("POST", &format!("/v1/sandboxes/{sb}/checkpoints"), Some(body));
        assert_eq!(v["checkpoint"]["process_image"]["state"], "durable", "{v}");
        v["checkpoint"]["id"].as_str().unwrap().to_string()
    }

    /// The durable process image file of checkpoint `ck`, found under the
    /// data directory (on the store's volume).
    pub fn image_file(&self, ck: &str) -> PathBuf {
        fn find(dir: &std::path::Path, name: &str, depth: u32) -> Option<PathBuf> {
            for entry in std::fs::read_dir(dir).ok()?.flatten() {
                let path = entry.path();
                if entry.file_name().to_str() == Some(name) {
                    return Some(path);
                }
                if depth > 0
                    && entry.file_type().is_ok_and(|t| t.is_dir())
                    && let Some(found) = find(&path, name, depth - 1)
                {
                    return Some(found);
                }
            }
            None
        }
        find(&self.dir, &format!("{ck}.img"), 4).unwrap_or_else(|| panic!("no image file of {ck} under {:?}", self.dir))
    }

    pub fn rollback(&self, sb: &str, ck: &str) -> Value {
        self.ok("POST", &format!("/v1/sandboxes/{sb}/rollback"), Some(json!({"checkpoint": ck})))
    }

    pub fn sandbox_ids(&self) -> Vec<String> {
        let v = self.ok("GET", "/v1/sandboxes", None);
        v["sandboxes"].as_array().unwrap().iter().map(|s| s["id"].as_str().unwrap().to_string()).collect()
    }

    pub fn checkpoint_ids(&self) -> Vec<String> {
        let v = self.ok("GET", "/v1/checkpoints", None);
        v["checkpoints"].as_array().unwrap().iter().map(|s| s["id"].as_str().unwrap().to_string()).collect()
    }

    /// Waits (up to 10 s) until `on_disk(kind)` is `expected`: unreferenced
    /// subvolumes are deleted when the daemon is idle, not at once.
    pub fn wait_on_disk(&self, kind: &str, expected: &[String]) {
        let t = Instant::now();
        while self.on_disk(kind) != expected && t.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(50));
        }
        assert_eq!(self.on_disk(kind), expected, "subvolumes under {kind}");
    }

    /// Names of subvolumes on disk under `btrfs/<kind>`.
    pub fn on_disk(&self, kind: &str) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(self.dir.join("btrfs").join(kind))
            .map(|rd| rd.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect())
            .unwrap_or_default();
        v.sort();
        v
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let listed = self.child.as_ref().and_then(|_| self.try_request("GET", "/v1/sandboxes", None).ok());
        if let Some((_, v)) = listed {
            for s in v["sandboxes"].as_array().cloned().unwrap_or_default() {
                let id = s["id"].as_str().unwrap_or_default();
                let _ = self.try_request("DELETE", &format!("/v1/sandboxes/{id}"), None);
            }
        }
        self.terminate();
        remove_cgroups(&self.cgroup);
        cleanup_dir(&self.dir);
        // The host's network table of this daemon (left by one that kept
        // its sandboxes).
        let _ = Command::new("nft")
            .args(["delete", "table", "ip", &sandtree_runtime::host_table_name(&self.cgroup)])
            .stderr(Stdio::null())
            .status();
    }
}

/// Kills whatever still runs in the daemon's cgroup `name` (in every
/// hierarchy) and removes it with every sandbox cgroup under it, so that
/// tests leave no cgroup behind: a host piles up memory cgroups otherwise
/// (each test's deleted sandboxes, dying in the kernel while page cache is
/// charged to them), and those slow every later fork on it.
fn remove_cgroups(name: &str) {
    let mut bases = vec![PathBuf::from("/sys/fs/cgroup")];
    if let Ok(rd) = std::fs::read_dir("/sys/fs/cgroup") {
        bases.extend(rd.flatten().map(|e| e.path()).filter(|p| p.is_dir() && !p.is_symlink()));
    }
    for base in bases {
        let root = base.join(name);
        if root.join("cgroup.procs").exists() {
            remove_cgroup_tree(&root);
        }
    }
}

/// Depth first: thaw, kill the members, drop the memory charges, rmdir.
fn remove_cgroup_tree(dir: &Path) {
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                remove_cgroup_tree(&e.path());
            }
        }
    }
    let _ = std::fs::write(dir.join("freezer.state"), "THAWED");
    let _ = std::fs::write(dir.join("cgroup.freeze"), "0");
    let t = Instant::now();
    loop {
        let pids: Vec<i32> = std::fs::read_to_string(dir.join("cgroup.procs"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect();
        for pid in &pids {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(*pid), nix::sys::signal::Signal::SIGKILL);
        }
        if pids.is_empty() {
            let _ = std::fs::write(dir.join("memory.force_empty"), "0");
            if let Ok(bytes) = std::fs::read_to_string(dir.join("memory.current")) {
                let _ = std::fs::write(dir.join("memory.reclaim"), bytes.trim());
            }
            if std::fs::remove_dir(dir).is_ok() {
                return;
            }
        }
        if t.elapsed() > Duration::from_secs(5) {
            eprintln!("warning: cannot remove cgroup {}", dir.display());
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

pub fn cleanup_dir(dir: &Path) {
    if !dir.exists() {
        return;
    }
    // (A daemon that exited cleanly unmounted them already; one that kept
    // its sandboxes leaves their routers' namespaces mounted: unmounted,
    // the kernel removes them and their links.)
    let _ = sandtree_sys::mountinfo::detach_all_under(dir);
    let _ = std::fs::remove_dir_all(dir);
}

pub use sandtree::unix_http::request;

/// Half duplex, as most HTTP libraries do: the whole body is sent (it must
/// all go through), then the answer is read.
pub fn half_duplex(socket: &Path, head: &str, body: &[u8]) -> (u16, Vec<u8>) {
    let mut s = UnixStream::connect(socket).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(300))).unwrap();
    s.set_write_timeout(Some(Duration::from_secs(60))).unwrap();
    s.write_all(head.as_bytes()).unwrap();
    s.write_all(body).expect("the daemon reads the whole body");
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap();
    parse_response(&raw)
}

/// (status, de-chunked body) of a raw HTTP/1.1 response.
pub fn parse_response(raw: &[u8]) -> (u16, Vec<u8>) {
    let end = raw.windows(4).position(|w| w == b"\r\n\r\n").expect("a response head");
    let head = String::from_utf8_lossy(&raw[..end]).to_ascii_lowercase();
    let status = head.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    let mut body = raw[end + 4..].to_vec();
    if head.contains("transfer-encoding: chunked") {
        let (mut out, mut rest) = (Vec::new(), &body[..]);
        while let Some(nl) = rest.windows(2).position(|w| w == b"\r\n") {
            let n = usize::from_str_radix(std::str::from_utf8(&rest[..nl]).unwrap().trim(), 16).unwrap();
            if n == 0 {
                break;
            }
            out.extend_from_slice(&rest[nl + 2..nl + 2 + n]);
            rest = &rest[nl + 2 + n + 2..];
        }
        body = out;
    }
    (status, body)
}

/// `n` pseudo-random bytes, starting with invalid UTF-8 (even a single
/// byte), NUL, `\r\n` and a lone `\n`.
pub fn random_bytes(n: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    let mut v: Vec<u8> = Vec::with_capacity(n + 8);
    v.extend_from_slice(b"\xff\0\xfe\xc3\x28\r\n\n");
    while v.len() < n {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.extend_from_slice(&x.to_le_bytes());
    }
    v.truncate(n);
    v
}

/// sha256 of `data`, by the host's `sha256sum`.
pub fn sha256(data: &[u8]) -> String {
    let mut c = Command::new("sha256sum").stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().unwrap();
    let mut stdin = c.stdin.take().unwrap();
    let data = data.to_vec();
    let w = std::thread::spawn(move || stdin.write_all(&data));
    let out = c.wait_with_output().unwrap();
    w.join().unwrap().unwrap();
    String::from_utf8(out.stdout).unwrap().split_whitespace().next().unwrap().to_string()
}
