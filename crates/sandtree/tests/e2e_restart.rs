//! Daemon restarts and host faults: re-adoption, a full volume, a data dir
//! on the wrong filesystem.

mod common;

use common::Daemon;
use serde_json::json;

#[test]
fn restarted_daemon_readopts_running_sandboxes_with_their_processes() {
    if common::must_skip() {
        return;
    }
    let mut d = Daemon::start("restart");
    let sb = d.create();
    d.sh_ok(&sb, "echo kept > /root/f");
    let v =
        d.ok("POST", &format!("/v1/sandboxes/{sb}/exec"), Some(json!({"cmd": ["sleep", "1000"], "background": true})));
    let pid = v["pid"].as_i64().unwrap();
    let init_before = d.ok("GET", &format!("/v1/sandboxes/{sb}"), None)["init_pid"].clone();

    d.restart(); // SIGKILL + start

    let info = d.ok("GET", &format!("/v1/sandboxes/{sb}"), None);
    assert_eq!(info["status"], "running");
    assert_eq!(info["init_pid"], init_before, "the same init was re-adopted");
    assert_eq!(d.sh_ok(&sb, "cat /root/f"), "kept\n");
    // The background process survived the daemon's death.
    d.sh_ok(&sb, &format!("kill -0 {pid}"));
}

/// A daemon killed with SIGKILL loses every checkpoint's templates (they
/// die with it); its sandbox is re-adopted with its processes running on.
/// A rollback then brings the checkpoint's processes back from their
/// durable image, memory and all: a Python process's variables as at the
/// checkpoint, a background `sleep` with its pid.
#[test]
fn restarted_daemon_restores_checkpoints_from_their_images() {
    if common::must_skip() {
        return;
    }
    let mut d = Daemon::start("restart-images");
    let sb = d.create();
    let keeper = "import os, time\nstate = {'n': 0}\nwhile True:\n    if os.path.exists('/root/bump'):\n        os.remove('/root/bump')\n        state['n'] += 1\n    with open('/root/n.tmp', 'w') as f:\n        f.write(str(state['n']))\n    os.rename('/root/n.tmp', '/root/n')\n    time.sleep(0.01)\n";
    let v = d.ok(
        "POST",
        &format!("/v1/sandboxes/{sb}/exec"),
        Some(json!({"cmd": ["python3", "-c", keeper], "background": true})),
    );
    let python = v["pid"].as_i64().unwrap();
    let v =
        d.ok("POST", &format!("/v1/sandboxes/{sb}/exec"), Some(json!({"cmd": ["sleep", "1000"], "background": true})));
    let sleep = v["pid"].as_i64().unwrap();
    let bump = "touch /root/bump; while [ -e /root/bump ]; do sleep 0.01; done; sleep 0.05; cat /root/n";
    assert_eq!(d.sh_ok(&sb, bump), "1");
    let ck = d.checkpoint_durable(&sb, "n=1");
    assert_eq!(d.sh_ok(&sb, bump), "2");
    assert_eq!(d.sh_ok(&sb, bump), "3");

    d.restart(); // SIGKILL + start

    assert_eq!(d.sh_ok(&sb, "cat /root/n"), "3", "re-adopted with its processes running");
    let v = d.rollback(&sb, &ck);
    assert_eq!((v["processes"].as_str(), v["restored_from"].as_str()), (Some("restored"), Some("image")), "{v}");
    let mut pids: Vec<i64> = v["restored_pids"].as_array().unwrap().iter().map(|p| p.as_i64().unwrap()).collect();
    pids.sort_unstable();
    assert_eq!(pids, vec![python, sleep], "{v}");
    // Its variable as at the checkpoint (the file says 1 there too: the
    // next bump shows the memory's).
    assert_eq!(d.sh_ok(&sb, bump), "2", "the process's memory is not the checkpoint's");
    d.sh_ok(&sb, &format!("kill -0 {sleep}"));
}

/// A daemon killed between the freeze and the thaw of a checkpoint leaves
/// the sandbox frozen; the restarted daemon must thaw and re-adopt it.
#[test]
fn daemon_killed_while_a_sandbox_is_frozen_recovers_it() {
    if common::must_skip() {
        return;
    }
    let mut d = Daemon::start("frozen");
    let sb = d.create();
    d.sh_ok(&sb, "echo before > /root/f");
    let init_before = d.ok("GET", &format!("/v1/sandboxes/{sb}"), None)["init_pid"].clone();
    d.kill9();
    let freeze = d.freeze_file(&sb);
    let frozen = if freeze.ends_with("freezer.state") { "FROZEN" } else { "1" };
    std::fs::write(&freeze, frozen).unwrap();
    let t = std::time::Instant::now();
    d.spawn();
    assert!(t.elapsed().as_secs() < 4, "startup waited for the frozen sandbox");
    let info = d.ok("GET", &format!("/v1/sandboxes/{sb}"), None);
    assert_eq!(info["status"], "running");
    assert_eq!(info["init_pid"], init_before, "re-adopted, not restarted: {info}");
    assert_eq!(d.sh_ok(&sb, "cat /root/f"), "before\n");
}

#[test]
fn full_volume_fails_cleanly_and_keeps_checkpoints() {
    if common::must_skip() {
        return;
    }
    let d = Daemon::start_with("full", &["--image-size", "400M"]);
    let sb = d.create();
    d.sh_ok(&sb, "echo precious > /root/keep");
    let ck = d.checkpoint(&sb, "before-full");
    // Fill the volume from inside the sandbox.
    let (code, _) = d.sh(&sb, "dd if=/dev/urandom of=/root/fill bs=1M count=2000 2>/dev/null");
    assert_ne!(code, 0, "dd should hit ENOSPC on a 400M volume");
    // Checkpoints either succeed or fail with no_space; nothing stored is lost.
    let mut saw = Vec::new();
    for _ in 0..5 {
        let (status, v) = d.req("POST", &format!("/v1/sandboxes/{sb}/checkpoints"), Some(json!({})));
        if status == 507 {
            assert_eq!(v["error"]["code"], "no_space", "{v}");
        } else {
            assert!(status == 201 || status == 200, "{status} {v}");
        }
        saw.push(status);
    }
    eprintln!("checkpoint statuses on a full volume: {saw:?}");
    // Free the space, roll back: the old checkpoint is intact.
    d.rollback(&sb, &ck);
    assert_eq!(d.sh_ok(&sb, "cat /root/keep"), "precious\n");
    d.sh_ok(&sb, "test ! -e /root/fill");
}

#[test]
fn data_dir_on_a_non_btrfs_mount_is_refused_with_a_clear_message() {
    if common::must_skip() {
        return;
    }
    let dir = std::path::PathBuf::from(format!("/var/tmp/sandtree-test-wrongfs-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let out = std::process::Command::new(common::BIN)
        .arg("daemon")
        .arg("--data-dir")
        .arg(&dir)
        .arg("--btrfs-mount")
        .arg("/var/tmp")
        .arg("--socket")
        .arg(dir.join("s.sock"))
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("btrfs"), "{err}");
}
