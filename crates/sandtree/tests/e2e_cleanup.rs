//! Nothing left behind, and what is kept is said: `rm` and its
//! checkpoints, `gc`'s report, `tree` on a long chain, through the real
//! daemon and the real CLI.

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::Daemon;
use serde_json::{Value, json};

/// Runs the CLI against daemon `d`: (exit code, stdout, stderr).
fn cli(d: &Daemon, args: &[&str]) -> (i32, String, String) {
    let out = Command::new(common::BIN).arg("--socket").arg(&d.socket).args(args).output().expect("run the CLI");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn cli_ok(d: &Daemon, args: &[&str]) -> (String, String) {
    let (code, out, err) = cli(d, args);
    assert_eq!(code, 0, "sandtree {args:?} exited {code}\nstdout: {out}\nstderr: {err}");
    (out, err)
}

/// Waits until the checkpoint's size is measured (in the background).
fn measured(d: &Daemon, ck: &str) -> u64 {
    let t = Instant::now();
    loop {
        let v = d.ok("GET", &format!("/v1/checkpoints/{ck}"), None);
        if let Some(b) = v["size_bytes"].as_u64() {
            return b;
        }
        assert!(t.elapsed() < Duration::from_secs(10), "size of {ck} never measured: {v}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn fork1(d: &Daemon, ck: &str) -> String {
    let v = d.ok("POST", &format!("/v1/checkpoints/{ck}/fork"), Some(json!({"count": 1})));
    v["results"][0]["sandbox"]["id"].as_str().unwrap_or_else(|| panic!("fork of {ck}: {v}")).to_string()
}

fn ids(v: &Value) -> Vec<String> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_str().map(str::to_string).unwrap_or_else(|| x["id"].to_string()))
        .collect()
}

fn kept(v: &Value) -> Vec<(String, Vec<String>)> {
    v["checkpoints_kept"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| (k["id"].as_str().unwrap().to_string(), ids(&k["needed_by"])))
        .collect()
}

#[test]
fn rm_says_which_checkpoints_remain_and_why_and_deletes_only_unneeded_ones() {
    if common::must_skip() {
        return;
    }
    let d = Daemon::start("rmck");

    // A: three checkpoints a1 <- a2 <- a3 (4 MB, then 1 MB, then nothing
    // new), a fork standing on a1. Deleted by the API, checkpoints kept.
    let a = d.create();
    d.sh_ok(&a, "head -c 4000000 /dev/urandom > /root/big");
    let a1 = d.checkpoint(&a, "a1");
    d.sh_ok(&a, "head -c 1000000 /dev/urandom > /root/small");
    let a2 = d.checkpoint(&a, "a2");
    let a3 = d.checkpoint(&a, "a3");
    let f = fork1(&d, &a1);
    let sizes: u64 = [&a1, &a2, &a3].iter().map(|c| measured(&d, c)).sum();
    assert!(sizes >= 5_000_000, "sizes {sizes}");
    let v = d.ok("DELETE", &format!("/v1/sandboxes/{a}"), None);
    assert_eq!(ids(&v["checkpoints_deleted"]), Vec::<String>::new(), "{v}");
    assert_eq!(
        kept(&v),
        vec![(a3.clone(), vec![]), (a2.clone(), vec![a3.clone()]), (a1.clone(), vec![f.clone(), a2.clone()])],
        "children first, each with what needs it: {v}"
    );
    assert_eq!(v["checkpoints_kept_bytes"].as_u64(), Some(sizes), "{v}");
    let note = v["note"].as_str().unwrap();
    assert!(
        note.contains("3 checkpoint(s)") && note.contains("seed forks") && note.contains("checkpoints=true"),
        "{note}"
    );

    // B: b1 <- b2 <- b3, a fork standing on b2; `rm --checkpoints` by the
    // CLI deletes b3 and keeps b2 (the fork's base) and b1 (b2's parent).
    let b = d.create();
    let b1 = d.checkpoint(&b, "b1");
    d.sh_ok(&b, "echo 2 > /root/f");
    let b2 = d.checkpoint(&b, "b2");
    d.sh_ok(&b, "echo 3 > /root/f");
    let b3 = d.checkpoint(&b, "b3");
    let g = fork1(&d, &b2);
    let (out, err) = cli_ok(&d, &["rm", "--checkpoints", &b]);
    assert_eq!(out, format!("{b}\n"));
    assert!(err.contains(&format!("deleted 1 checkpoint(s) of {b} with it")) && err.contains(&b3), "{err}");
    assert!(err.contains(&format!("kept 2 checkpoint(s) of {b}")) && err.contains("that others still need"), "{err}");
    assert!(err.contains(&format!("  {b2}  needed by {g}\n")), "{err}");
    assert!(err.contains(&format!("  {b1}  needed by {b2}\n")), "{err}");
    let all = d.checkpoint_ids();
    assert!(!all.contains(&b3) && all.contains(&b2) && all.contains(&b1), "{all:?}");
    assert_eq!(d.ok("GET", &format!("/v1/sandboxes/{g}"), None)["base_checkpoint"], json!(b2), "the fork is untouched");
    d.sh_ok(&g, "test \"$(cat /root/f)\" = 2");

    // C: nothing needs its checkpoints: the API deletes all of them.
    let c = d.create();
    d.sh_ok(&c, "head -c 2000000 /dev/urandom > /root/big");
    let c1 = d.checkpoint(&c, "c1");
    let c2 = d.checkpoint(&c, "c2");
    let csize = measured(&d, &c1) + measured(&d, &c2);
    let v = d.ok("DELETE", &format!("/v1/sandboxes/{c}?checkpoints=true"), None);
    assert_eq!(ids(&v["checkpoints_deleted"]), vec![c2.clone(), c1.clone()], "{v}");
    assert_eq!(v["checkpoints_deleted_bytes"].as_u64(), Some(csize), "{v}");
    assert!(kept(&v).is_empty(), "{v}");

    // D: without --checkpoints the CLI says what remains and how to delete it.
    let e = d.create();
    let e1 = d.checkpoint(&e, "e1");
    let e2 = d.checkpoint(&e, "e2");
    measured(&d, &e1);
    measured(&d, &e2);
    let (out, err) = cli_ok(&d, &["rm", &e]);
    assert_eq!(out, format!("{e}\n"));
    assert!(err.contains(&format!("kept 2 checkpoint(s) of {e} (")), "{err}");
    assert!(err.contains("they can still seed forks"), "{err}");
    assert!(err.contains(&format!("to delete them: sandtree rm {e2} {e1} ")), "{err}");
    // ... and that command works as printed (children first: no --force).
    cli_ok(&d, &["rm", &e2, &e1]);

    // gc deletes no checkpoint, but counts those whose sandbox is gone.
    let (out, _) = cli_ok(&d, &["--json", "gc"]);
    let r: Value = serde_json::from_str(&out).unwrap();
    let mut orphaned = ids(&r["checkpoints_of_deleted_sandboxes"]);
    orphaned.sort();
    let mut expected = vec![a1.clone(), a2.clone(), a3.clone(), b1.clone(), b2.clone()];
    expected.sort();
    assert_eq!(orphaned, expected, "{r}");
    assert!(r["checkpoints_of_deleted_sandboxes_bytes"].as_u64().unwrap() >= sizes, "{r}");
    let (out, _) = cli_ok(&d, &["gc"]);
    assert!(out.contains("kept 5 checkpoint(s) of deleted sandboxes"), "{out}");
}

/// Makes an orphan subvolume holding `bytes` of data, as a crash between
/// "subvolume made" and "row committed" leaves one.
fn orphan(d: &Daemon, name: &str, bytes: usize) {
    let path = d.dir.join("btrfs").join("checkpoints").join(name);
    sandtree_fs::create_subvolume(&path).unwrap();
    let data: Vec<u8> = (0..bytes).map(|i| (i * 7 + i / 4096) as u8).collect();
    std::fs::write(path.join("data"), data).unwrap();
    sandtree_fs::sync_fs(&path).unwrap();
}

#[test]
fn gc_reports_what_it_removed_and_the_bytes_it_freed() {
    if common::must_skip() {
        return;
    }
    let d = Daemon::start("gcbytes");
    orphan(&d, "ck-orphan1", 16 << 20);
    let (out, _) = cli_ok(&d, &["--json", "gc"]);
    let r: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(ids(&r["orphans_removed"]), vec!["checkpoints/ck-orphan1".to_string()], "{r}");
    let freed = r["bytes_freed"].as_u64().unwrap();
    assert!((15 << 20..=24 << 20).contains(&freed), "freed {freed} bytes for a 16 MiB orphan: {r}");

    orphan(&d, "ck-orphan2", 8 << 20);
    let (out, _) = cli_ok(&d, &["gc"]);
    let first = out.lines().next().unwrap();
    assert!(first.starts_with("removed 1 orphaned subvolume(s) and 0 stale runtime entr(ies), freed "), "{out}");
    let mib: f64 = first.split("freed ").nth(1).unwrap().split(" MiB").next().unwrap().parse().unwrap_or(0.0);
    assert!((7.5..=12.0).contains(&mib), "{out}");
    assert!(out.contains("  checkpoints/ck-orphan2\n"), "{out}");
}

/// Everything on the host that names the daemon's data directory or its
/// cgroup: mounts, loop devices, cgroup directories (v1 controllers, v2).
fn host_leftovers(d: &Daemon) -> Vec<String> {
    let dir = d.dir.to_string_lossy().into_owned();
    let mut found = Vec::new();
    for line in std::fs::read_to_string("/proc/self/mountinfo").unwrap().lines() {
        if line.contains(&dir) {
            found.push(format!("mount: {line}"));
        }
    }
    for e in std::fs::read_dir("/sys/block").unwrap().flatten() {
        if let Ok(backing) = std::fs::read_to_string(e.path().join("loop/backing_file"))
            && backing.contains(&dir)
        {
            let (ours, theirs) = holders(d);
            if ours.is_empty() && !theirs.is_empty() {
                // Not ours to remove: see `holders`.
                eprintln!("loop device {:?} is held by other daemons' pre-cloned inits: {theirs:?}", e.file_name());
                continue;
            }
            found.push(format!("loop device {:?}: {} (held by {ours:?}, {theirs:?})", e.file_name(), backing.trim()));
        }
    }
    let mut bases = vec![std::path::PathBuf::from("/sys/fs/cgroup")];
    bases.extend(std::fs::read_dir("/sys/fs/cgroup").unwrap().flatten().map(|e| e.path()).filter(|p| p.is_dir()));
    for base in bases {
        if base.join(&d.cgroup).exists() {
            found.push(format!("cgroup: {}", base.join(&d.cgroup).display()));
        }
    }
    if d.socket.exists() {
        found.push(format!("socket: {}", d.socket.display()));
    }
    found
}

/// Processes whose mount namespace still has the daemon's store mounted,
/// split into (ours, other sandtree daemons' pre-cloned inits). A process
/// that makes a mount namespace copies every mount of the host, ours
/// included, and a mount copied into a namespace of another user namespace
/// is locked there: the host's umount does not reach it, and our loop
/// device stays bound until that process lets go. Another daemon's zygote
/// pre-clones its next init after each spawn (`sandtree-sandbox`'s
/// `spawn.rs`), so tests that run beside this one (another daemon of this
/// binary, or of another worktree) pin our store that way until their next
/// spawn or their exit: not a leftover of ours.
fn holders(d: &Daemon) -> (Vec<String>, Vec<String>) {
    let root = d.dir.join("btrfs");
    let dir = d.dir.to_string_lossy().into_owned();
    let (mut ours, mut theirs) = (Vec::new(), Vec::new());
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let path = e.path();
        let Ok(info) = std::fs::read_to_string(path.join("mountinfo")) else { continue };
        if !info.lines().any(|l| l.split(' ').nth(4) == Some(root.to_str().unwrap())) {
            continue;
        }
        let status = std::fs::read_to_string(path.join("status")).unwrap_or_default();
        let ppid = status.lines().find_map(|l| l.strip_prefix("PPid:")).unwrap_or("").trim().to_string();
        let parent = std::fs::read(format!("/proc/{ppid}/cmdline")).unwrap_or_default();
        let parent = String::from_utf8_lossy(&parent).replace('\0', " ");
        let who = format!("{} (parent {ppid}: {parent})", e.file_name().to_string_lossy());
        if parent.contains("sandtree") && !parent.contains(&dir) { theirs.push(who) } else { ours.push(who) }
    }
    (ours, theirs)
}

fn alive(pid: i64) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| !s.contains(") Z "))
}

/// A clean exit leaves nothing behind, and the next start still has every
/// sandbox and checkpoint.
fn clean_exit_leaves_nothing(name: &str, signal: nix::sys::signal::Signal) {
    if common::must_skip() {
        return;
    }
    let mut d = Daemon::start(name);
    let sb = d.create();
    d.sh_ok(&sb, "echo v1 > /root/f");
    let v =
        d.ok("POST", &format!("/v1/sandboxes/{sb}/exec"), Some(json!({"cmd": ["sleep", "1000"], "background": true})));
    let pid = v["pid"].as_i64().unwrap();
    let ck = d.checkpoint_durable(&sb, "v1");
    d.sh_ok(&sb, "echo v2 > /root/f");
    let init = d.ok("GET", &format!("/v1/sandboxes/{sb}"), None)["init_pid"].as_i64().unwrap();
    let host_sleep = d.sh_ok(&sb, &format!("cat /proc/{pid}/stat >/dev/null && echo ok"));
    assert_eq!(host_sleep, "ok\n");
    let before = host_leftovers(&d);
    assert!(
        before.iter().any(|l| l.starts_with("mount")) && before.iter().any(|l| l.starts_with("loop")),
        "{before:?}"
    );
    assert!(before.iter().any(|l| l.starts_with("cgroup")), "{before:?}");

    let t = Instant::now();
    let status = d.stop_with(signal, Duration::from_secs(30));
    eprintln!("{signal}: exited in {:?} ({status})", t.elapsed());
    assert!(status.success(), "{status}: {}", d.log());
    let left = host_leftovers(&d);
    assert!(left.is_empty(), "left behind after {signal}: {left:#?}\n{}", d.log());
    assert!(!alive(init), "the sandbox's init {init} still runs");
    // Only a store pinned by others (see `holders`) may be reported.
    for line in d.log().lines().filter(|l| l.contains("left behind")) {
        assert!(line.contains("loop device") && line.contains("sandtree:[zygot"), "{line}");
    }

    // The next start on the same data directory has it all.
    d.spawn();
    assert_eq!(d.sandbox_ids(), vec![sb.clone()]);
    assert!(d.checkpoint_ids().contains(&ck));
    let info = d.ok("GET", &format!("/v1/sandboxes/{sb}"), None);
    assert_eq!(info["status"], "running", "{info}");
    assert!(
        info["status_reason"].as_str().unwrap_or("").contains("processes from before the restart were lost"),
        "{info}"
    );
    assert_eq!(d.sh_ok(&sb, "cat /root/f"), "v2\n");
    // The checkpoint's templates went with the daemon: a rollback brings
    // its process back from its durable image, and says so.
    let v = d.rollback(&sb, &ck);
    assert_eq!((v["processes"].as_str(), v["restored_from"].as_str()), (Some("restored"), Some("image")), "{v}");
    assert_eq!(v["restored_pids"], json!([pid]), "{v}");
    assert_eq!(
        d.sh_ok(&sb, &format!("kill -0 {pid} && cat /proc/{pid}/cmdline | tr '\\0' ' '; cat /root/f")),
        "sleep 1000 v1\n"
    );
    // The next rollback, from the templates made from the image.
    let v = d.rollback(&sb, &ck);
    assert_eq!(v["restored_from"].as_str(), Some("templates"), "{v}");
    // Without the image, it would have been lost: said, nothing changed,
    // unless a restart is allowed.
    std::fs::remove_file(d.image_file(&ck)).unwrap();
    d.stop_with(signal, Duration::from_secs(30));
    d.spawn();
    d.sh_ok(&sb, "echo v3 > /root/f");
    let (status, v) = d.req("POST", &format!("/v1/sandboxes/{sb}/rollback"), Some(json!({"checkpoint": ck})));
    assert_eq!((status, v["error"]["code"].as_str()), (409, Some("processes_lost")), "{v}");
    assert_eq!(d.sh_ok(&sb, "cat /root/f"), "v3\n");
    d.ok("POST", &format!("/v1/sandboxes/{sb}/rollback"), Some(json!({"checkpoint": ck, "allow_restart": true})));
    assert_eq!(d.sh_ok(&sb, "cat /root/f"), "v1\n");
}

#[test]
fn sigterm_leaves_no_mount_loop_device_or_cgroup_and_the_next_start_works() {
    clean_exit_leaves_nothing("term", nix::sys::signal::Signal::SIGTERM);
}

#[test]
fn sigint_leaves_no_mount_loop_device_or_cgroup_and_the_next_start_works() {
    clean_exit_leaves_nothing("int", nix::sys::signal::Signal::SIGINT);
}

#[test]
fn keep_sandboxes_leaves_them_running_for_the_next_start_to_readopt() {
    if common::must_skip() {
        return;
    }
    let mut d = Daemon::start_with("keep", &["--image-size", "4G", "--keep-sandboxes"]);
    let sb = d.create();
    let v =
        d.ok("POST", &format!("/v1/sandboxes/{sb}/exec"), Some(json!({"cmd": ["sleep", "1000"], "background": true})));
    let pid = v["pid"].as_i64().unwrap();
    let init = d.ok("GET", &format!("/v1/sandboxes/{sb}"), None)["init_pid"].clone();
    let status = d.stop_with(nix::sys::signal::Signal::SIGTERM, Duration::from_secs(30));
    assert!(status.success(), "{status}");
    assert!(alive(init.as_i64().unwrap()), "kept running");
    let left = host_leftovers(&d);
    assert!(left.iter().any(|l| l.starts_with("mount")) && !left.iter().any(|l| l.starts_with("socket")), "{left:?}");
    d.spawn();
    let info = d.ok("GET", &format!("/v1/sandboxes/{sb}"), None);
    assert_eq!(info["init_pid"], init, "re-adopted: {info}");
    d.sh_ok(&sb, &format!("kill -0 {pid}"));
}

#[test]
fn tree_keeps_linear_runs_in_one_column_folds_them_and_marks_sandboxes() {
    if common::must_skip() {
        return;
    }
    let d = Daemon::start("tree");
    let sb = d.create();
    let cks: Vec<String> = (0..40).map(|i| d.checkpoint(&sb, &format!("c{i}"))).collect();
    let f = fork1(&d, &cks[30]);
    let f0 = d.checkpoint(&f, "f0");
    let line_of = |text: &str, id: &str| -> String {
        text.lines()
            .find(|l| l.contains(&format!("{id}  ")))
            .unwrap_or_else(|| panic!("{id} not in\n{text}"))
            .to_string()
    };

    // c0..c30 is one run (31 > 21: folded), then c30 branches into c31..c39 and f0.
    let (out, err) = cli_ok(&d, &["tree"]);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 10 + 1 + 10 + 9 + 1, "{out}");
    assert_eq!(lines[10], "… 11 more …", "{out}");
    assert!(err.contains("11 checkpoints of long linear runs folded") && err.contains("--all"), "{err}");
    assert!(line_of(&out, &cks[0]).starts_with(&cks[0]));
    assert!(line_of(&out, &cks[30]).starts_with(&cks[30]), "a run stays in column 0: {out}");
    assert!(line_of(&out, &cks[31]).starts_with(&format!("├── {}", cks[31])), "{out}");
    assert!(line_of(&out, &cks[39]).starts_with(&format!("│   {}", cks[39])), "{out}");
    assert!(line_of(&out, &cks[39]).ends_with(&format!("◀ {sb}")), "where {sb} stands: {out}");
    assert!(line_of(&out, &f0).starts_with(&format!("└── {f0}")), "{out}");
    assert!(line_of(&out, &f0).ends_with(&format!("◀ {f}")), "where the fork stands: {out}");
    let width = out.lines().map(|l| l.chars().count()).max().unwrap();
    assert!(width < 100, "{width} columns:\n{out}");

    let (all, err) = cli_ok(&d, &["tree", "--all"]);
    assert_eq!(all.lines().count(), 41, "{all}");
    assert!(!all.contains("more …") && !err.contains("folded"), "{all}\n{err}");
    for c in &cks[..31] {
        assert!(line_of(&all, c).starts_with(c.as_str()), "{all}");
    }
    let width = all.lines().map(|l| l.chars().count()).max().unwrap();
    assert!(width < 100, "no indentation per level: {width} columns:\n{all}");

    // One sandbox's tree: the same drawing.
    let shape = |t: &str| t.lines().map(|l| l.split("  ").next().unwrap().to_string()).collect::<Vec<_>>();
    let (own, _) = cli_ok(&d, &["tree", &sb]);
    assert_eq!(shape(&own), shape(&out), "{own}");
}
