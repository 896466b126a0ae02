//! Host uid ranges (issue 35, item 5): each data dir's daemon maps its
//! sandboxes to a range of its own, kept across restarts; a daemon forced
//! onto a range another running daemon holds is refused.

mod common;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use common::Daemon;

/// A registry of claims of this test's own: no other daemon of the host
/// changes which ranges are free.
fn registry(name: &str) -> PathBuf {
    let dir = PathBuf::from(format!("/var/tmp/sandtree-test-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

fn start(name: &str, registry: &Path) -> Daemon {
    Daemon::start_with(name, &["--image-size", "4G", "--uid-registry", registry.to_str().unwrap()])
}

fn uid_base(d: &Daemon) -> u64 {
    d.ok("GET", "/v1/info", None)["uid_base"].as_u64().expect("uid_base")
}

/// The host uid of a file made by root in a sandbox, seen from the host,
/// and the sandbox's uid map.
fn owner_and_map(d: &Daemon) -> (u32, String) {
    use std::os::unix::fs::MetadataExt;
    let sb = d.create();
    let map = d.sh_ok(&sb, "touch /root/mine; cat /proc/self/uid_map");
    let init = d.ok("GET", &format!("/v1/sandboxes/{sb}"), None)["init_pid"].as_i64().expect("init pid");
    let meta = std::fs::metadata(format!("/proc/{init}/root/root/mine")).expect("stat from the host");
    (meta.uid(), map.split_whitespace().collect::<Vec<_>>().join(" "))
}

#[test]
fn each_data_dir_gets_its_own_uid_range_and_keeps_it() {
    if common::must_skip() {
        return;
    }
    let reg = registry("uidreg");
    let mut a = start("uid-a", &reg);
    let b = start("uid-b", &reg);
    let (base_a, base_b) = (uid_base(&a), uid_base(&b));
    assert_ne!(base_a, base_b, "two daemons share a uid range");
    for base in [base_a, base_b] {
        assert!(base > 1_000_000_000 && (base - 1_000_000_000) % 65536 == 0, "range at {base}");
        assert!(base.abs_diff(if base == base_a { base_b } else { base_a }) >= 65536, "overlapping ranges");
    }
    // What the sandboxes map to, and own on the host.
    for (d, base) in [(&a, base_a), (&b, base_b)] {
        let (owner, map) = owner_and_map(d);
        assert_eq!(owner as u64, base, "owner of a file made by root inside");
        assert_eq!(map, format!("0 {base} 65536"));
        let info = d.ok("GET", "/v1/info", None);
        assert_eq!(info["uid_count"], 65536);
        assert_eq!(info["uid_claim"].as_str(), Some(reg.join(base.to_string()).to_str().unwrap()));
    }
    // The record in the data dir.
    let record = std::fs::read_to_string(a.dir.join("uid-range")).expect("record");
    assert_eq!(record.lines().next(), Some(base_a.to_string().as_str()));

    // A third data dir forced onto a's range while a runs: refused, with
    // an error naming the range, a's data dir and what to do.
    let c = PathBuf::from(format!("/var/tmp/sandtree-test-uid-c-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&c);
    std::fs::create_dir_all(&c).unwrap();
    let mut child = std::process::Command::new(common::BIN)
        .arg("daemon")
        .arg("--data-dir")
        .arg(&c)
        .arg("--socket")
        .arg(c.join("sandtree.sock"))
        .args(["--cgroup-name", "sandtree-test-uid-c", "--image-size", "4G", "--uid-registry"])
        .arg(&reg)
        .arg("--uid-base")
        .arg(base_a.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let t = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if t.elapsed() > Duration::from_secs(30) {
            let _ = child.kill();
            panic!("a daemon on a range in use did not exit");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    assert!(!status.success(), "a daemon on a range in use started: {err}");
    let range = format!("{base_a}-{}", base_a + 65535);
    assert!(err.contains(&range), "the error names the range: {err}");
    assert!(err.contains(a.dir.to_str().unwrap()), "the error names the other data dir: {err}");
    assert!(err.contains("stop that daemon first"), "the error says what to do: {err}");
    assert!(!c.join("uid-range").exists(), "the refused range was recorded");
    assert!(!c.join("sandtree.sock").exists(), "the refused daemon listened");
    let _ = std::fs::remove_dir_all(&c);

    // Restarts keep the range: after SIGKILL (its zygote lets the claim go
    // a moment later) and after a clean stop.
    a.restart();
    assert_eq!(uid_base(&a), base_a, "the range after a restart");
    a.terminate();
    a.spawn();
    assert_eq!(uid_base(&a), base_a, "the range after a stop and a start");
    let (owner, _) = owner_and_map(&a);
    assert_eq!(owner as u64, base_a);
    drop(a);
    drop(b);
    let _ = std::fs::remove_dir_all(&reg);
}

/// A data dir made before ranges were recorded (a store, no record)
/// keeps the range every data dir had then: its files are owned by it.
#[test]
fn a_data_dir_from_before_keeps_the_old_range() {
    if common::must_skip() {
        return;
    }
    let reg = registry("uidreg-old");
    let mut d = start("uid-old", &reg);
    let fresh = uid_base(&d);
    assert_ne!(fresh, 1_000_000_000);
    d.terminate();
    // As a daemon from before left it: no record.
    std::fs::remove_file(d.dir.join("uid-range")).unwrap();
    d.spawn();
    assert_eq!(uid_base(&d), 1_000_000_000);
    assert_eq!(std::fs::read_to_string(d.dir.join("uid-range")).unwrap().lines().next(), Some("1000000000"));
    drop(d);
    let _ = std::fs::remove_dir_all(&reg);
}
