//! End-to-end: the real daemon binary, driven over its unix socket.

mod common;

use common::Daemon;
use serde_json::json;

/// Hash of every regular file, symlink and directory the agent can change.
const TREE_HASH: &str = "cd / && find root etc usr/local opt var/tmp tmp -xdev \\( -type f -o -type l -o -type d \\) -printf '%p %m %s %l\\n' 2>/dev/null | sort | sha256sum && find root etc usr/local opt -xdev -type f -print0 2>/dev/null | sort -z | xargs -0 sha256sum | sha256sum";

#[test]
fn checkpoint_rollback_fork_round_trip() {
    if common::must_skip() {
        return;
    }
    let d = Daemon::start("life");
    let sb = d.create();

    // The default image: host userland, root inside, hostname, no host secrets.
    assert_eq!(d.sh_ok(&sb, "id -u").trim(), "0");
    assert!(d.sh_ok(&sb, "python3 -c 'print(6*7)'").contains("42"));
    assert!(d.sh_ok(&sb, "cat /proc/1/comm").contains("sandtree:[init]"));
    let (code, _) = d.sh(
        &sb,
        "test -e /var/lib/sandtree || test -e /etc/ssh/ssh_host_rsa_key || ls /home/* 2>/dev/null | grep -q .",
    );
    assert_ne!(code, 0, "host state is visible inside the sandbox");

    // State 1: a project and a "pip install" into /usr/local.
    d.sh_ok(&sb, "mkdir -p /root/proj && cd /root/proj && seq 1 1000 > data.txt && echo v1 > version && mkdir -p /usr/local/lib/python3.11/dist-packages/demo && echo 'X=1' > /usr/local/lib/python3.11/dist-packages/demo/__init__.py && ln -s version /root/proj/link");
    let h1 = d.sh_ok(&sb, TREE_HASH);
    let ck1 = d.checkpoint(&sb, "one");

    // State 2.
    d.sh_ok(&sb, "cd /root/proj && echo v2 > version && rm data.txt && echo new > new.txt && chmod 600 version");
    let h2 = d.sh_ok(&sb, TREE_HASH);
    assert_ne!(h1, h2);
    let ck2 = d.checkpoint(&sb, "two");

    // Mess everything up, then go back to the OLDER checkpoint: byte-identical.
    d.sh_ok(&sb, "rm -rf /root/proj /usr/local/lib/python3.11/dist-packages/demo && echo junk > /etc/motd");
    // (Only init ran at ck1: that is what comes back; later processes go.)
    let r = d.rollback(&sb, &ck1);
    assert_eq!(r["processes_restarted"], json!(false), "{r}");
    assert_eq!(r["restored_pids"], json!([]), "{r}");
    assert!(r["note"].as_str().unwrap().contains("restored exactly"), "{r}");
    assert_eq!(d.sh_ok(&sb, TREE_HASH), h1);
    assert!(d.sh_ok(&sb, "python3 -c 'import demo; print(demo.X)'").contains('1'));

    // And forward again to the newer one.
    d.rollback(&sb, &ck2);
    assert_eq!(d.sh_ok(&sb, TREE_HASH), h2);

    // A live process over the API: captured, killed, brought back by a rollback.
    let bg = d.ok(
        "POST",
        &format!("/v1/sandboxes/{sb}/exec"),
        Some(
            json!({"cmd": ["python3", "-c", "import time\nx = 41\nwhile True: time.sleep(0.05)"], "background": true}),
        ),
    );
    let pid = bg["pid"].as_i64().unwrap();
    std::thread::sleep(std::time::Duration::from_millis(200));
    let v = d.ok("POST", &format!("/v1/sandboxes/{sb}/checkpoints"), Some(json!({"label": "live"})));
    assert_eq!(v["checkpoint"]["process_state"], json!("captured"), "{v}");
    assert_eq!(v["checkpoint"]["processes"], json!([pid]), "{v}");
    let live = v["checkpoint"]["id"].as_str().unwrap().to_string();
    d.ok("DELETE", &format!("/v1/sandboxes/{sb}/processes/{pid}"), None);
    std::thread::sleep(std::time::Duration::from_millis(100));
    let r = d.rollback(&sb, &live);
    assert_eq!(r["restored_pids"], json!([pid]), "{r}");
    let procs = d.ok("GET", &format!("/v1/sandboxes/{sb}/processes"), None);
    let me = procs["processes"].as_array().unwrap().iter().find(|p| p["pid"] == json!(pid)).cloned();
    assert_eq!(me.map(|p| p["running"].clone()), Some(json!(true)), "{procs}");
    d.rollback(&sb, &ck2);

    // The tree: ck2's parent is ck1; a checkpoint after rolling back to ck1 is ck1's child.
    d.rollback(&sb, &ck1);
    let ck3 = d.checkpoint(&sb, "three");
    let list = d.ok("GET", &format!("/v1/sandboxes/{sb}/checkpoints"), None);
    let parent_of =
        |id: &str| list["checkpoints"].as_array().unwrap().iter().find(|c| c["id"] == id).unwrap()["parent"].clone();
    assert_eq!(parent_of(&ck2), json!(ck1));
    assert_eq!(parent_of(&ck3), json!(ck1));
    assert_eq!(parent_of(&ck1), json!(null));

    // Fork 4 from ck2: each has ck2's files, each diverges.
    let f = d.ok("POST", &format!("/v1/checkpoints/{ck2}/fork"), Some(json!({"count": 4})));
    let forks: Vec<String> =
        f["results"].as_array().unwrap().iter().map(|r| r["sandbox"]["id"].as_str().unwrap().to_string()).collect();
    assert_eq!(forks.len(), 4);
    let mut uuids = std::collections::HashSet::new();
    for fk in &forks {
        assert_eq!(d.sh_ok(fk, TREE_HASH), h2);
        uuids.insert(d.sh_ok(fk, "python3 -c 'import uuid; print(uuid.uuid4())'"));
        d.sh_ok(fk, &format!("echo {fk} > /root/proj/who"));
    }
    assert_eq!(uuids.len(), 4, "forks share random state");
    for fk in &forks {
        assert_eq!(d.sh_ok(fk, "cat /root/proj/who").trim(), fk);
    }
    // A fork may roll back to any checkpoint of the shared tree.
    d.rollback(&forks[0], &ck1);
    assert_eq!(d.sh_ok(&forks[0], TREE_HASH), h1);

    // Deleting a checkpoint that others depend on is refused unless forced.
    let (status, v) = d.req("DELETE", &format!("/v1/checkpoints/{ck1}"), None);
    assert_eq!(status, 409, "{v}");
    assert_eq!(v["error"]["code"], "checkpoint_in_use");
    let v = d.ok("DELETE", &format!("/v1/checkpoints/{ck1}?force=true"), None);
    assert_eq!(v["deleted"], json!([ck1]));
    let list = d.ok("GET", &format!("/v1/sandboxes/{sb}/checkpoints"), None);
    assert!(list["checkpoints"].as_array().unwrap().iter().all(|c| c["id"] != ck1.as_str()));
    assert_eq!(
        list["checkpoints"].as_array().unwrap().iter().find(|c| c["id"] == ck2.as_str()).unwrap()["parent"],
        json!(null)
    );
    // ck2 still works after its parent is gone.
    d.rollback(&sb, &ck2);
    assert_eq!(d.sh_ok(&sb, TREE_HASH), h2);

    // Deleting sandboxes removes their subvolumes.
    for fk in &forks {
        d.ok("DELETE", &format!("/v1/sandboxes/{fk}"), None);
    }
    d.wait_on_disk("sandboxes", std::slice::from_ref(&sb));
}

#[test]
fn bad_input_gets_clear_errors() {
    if common::must_skip() {
        return;
    }
    let d = Daemon::start("errors");
    let sb = d.create();
    let cases = [
        ("GET", "/v1/sandboxes/sb-0000000000".to_string(), None, 404, "sandbox_not_found"),
        ("GET", "/v1/sandboxes/..%2F..%2Fetc".to_string(), None, 404, "sandbox_not_found"),
        (
            "POST",
            format!("/v1/sandboxes/{sb}/rollback"),
            Some(json!({"checkpoint": "ck-0000000000"})),
            404,
            "checkpoint_not_found",
        ),
        (
            "POST",
            "/v1/checkpoints/ck-0000000000/fork".to_string(),
            Some(json!({"count": 2})),
            404,
            "checkpoint_not_found",
        ),
        ("POST", format!("/v1/sandboxes/{sb}/exec"), Some(json!({"cmd": []})), 400, "invalid_argument"),
        ("POST", format!("/v1/sandboxes/{sb}/exec"), Some(json!({"command": "ls"})), 400, "invalid_argument"),
        ("POST", "/v1/sandboxes".to_string(), Some(json!({"image": "nope"})), 404, "image_not_found"),
        ("GET", "/v1/nothing-here".to_string(), None, 404, "not_found"),
    ];
    for (method, path, body, status, code) in cases {
        let (s, v) = d.req(method, &path, body);
        assert_eq!(s, status, "{method} {path}: {v}");
        let got = v["error"]["code"].as_str().unwrap_or_default().to_string();
        assert!(got.contains(code) || (code == "not_found" && !got.is_empty()), "{method} {path}: {v}");
        assert!(!v["error"]["message"].as_str().unwrap_or_default().is_empty());
    }
    // Fork count bounds.
    let ck = d.checkpoint(&sb, "x");
    let (s, v) = d.req("POST", &format!("/v1/checkpoints/{ck}/fork"), Some(json!({"count": 0})));
    assert_eq!((s, v["error"]["code"].as_str()), (400, Some("invalid_argument")));
    // A rollback to another tree's checkpoint is refused.
    let other = d.create();
    let ck_other = d.checkpoint(&other, "o");
    let (s, v) = d.req("POST", &format!("/v1/sandboxes/{sb}/rollback"), Some(json!({"checkpoint": ck_other})));
    assert_eq!((s, v["error"]["code"].as_str()), (400, Some("checkpoint_not_in_tree")), "{v}");
}

#[test]
fn exec_is_bounded_and_concurrent_rollbacks_serialize() {
    if common::must_skip() {
        return;
    }
    let d = Daemon::start("bounds");
    let sb = d.create();
    // A flood of output is truncated, not buffered without bound, and does not block.
    let t = std::time::Instant::now();
    let v = d.ok(
        "POST",
        &format!("/v1/sandboxes/{sb}/exec"),
        Some(json!({"cmd": ["sh", "-c", "head -c 200000000 /dev/zero | tr '\\0' x; echo done >&2"], "max_output_bytes": 65536})),
    );
    assert_eq!(v["stdout_truncated"], json!(true));
    assert_eq!(v["stdout"].as_str().unwrap().len(), 65536);
    assert!(v["stderr"].as_str().unwrap().contains("done"));
    assert!(t.elapsed().as_secs() < 60);
    // A timeout kills.
    let v =
        d.ok("POST", &format!("/v1/sandboxes/{sb}/exec"), Some(json!({"cmd": ["sleep", "100"], "timeout_ms": 300})));
    assert_eq!(v["timed_out"], json!(true));
    // Stdin, env, cwd.
    let v = d.ok(
        "POST",
        &format!("/v1/sandboxes/{sb}/exec"),
        Some(
            json!({"cmd": ["sh", "-c", "cat; echo $FOO; pwd"], "stdin": "in\n", "env": {"FOO": "bar"}, "cwd": "/tmp"}),
        ),
    );
    assert_eq!(v["stdout"], json!("in\nbar\n/tmp\n"));

    // Two rollbacks and a checkpoint at once on one sandbox: serialized, all succeed.
    d.sh_ok(&sb, "echo a > /root/f");
    let ck_a = d.checkpoint(&sb, "a");
    d.sh_ok(&sb, "echo b > /root/f");
    let ck_b = d.checkpoint(&sb, "b");
    let sock = d.socket.clone();
    let threads: Vec<_> = [ck_a.clone(), ck_b.clone(), ck_a.clone()]
        .into_iter()
        .map(|ck| {
            let (sock, sb) = (sock.clone(), sb.clone());
            std::thread::spawn(move || {
                common::request(
                    &sock,
                    "POST",
                    &format!("/v1/sandboxes/{sb}/rollback"),
                    Some(&json!({"checkpoint": ck})),
                )
                .unwrap()
            })
        })
        .collect();
    for t in threads {
        let (status, v) = t.join().unwrap();
        assert_eq!(status, 200, "{v}");
    }
    let content = d.sh_ok(&sb, "cat /root/f");
    assert!(content == "a\n" || content == "b\n");
    d.wait_on_disk("sandboxes", std::slice::from_ref(&sb));
    // Old writable generations are deleted once the daemon is idle; what
    // remains is the current one, the two checkpoints' layers (init ran
    // alone: layered checkpoints), the prepared rollback targets (spares)
    // of this sandbox's checkpoints (it is the daemon's only sandbox) and
    // the prepared next layer.
    let gens = || std::fs::read_dir(d.dir.join("btrfs/sandboxes").join(&sb)).unwrap().count();
    let spares = || d.ok("GET", "/v1/info", None)["spare_layers"].as_u64().unwrap() as usize;
    // (Spares come and go meanwhile: a count is taken between two equal
    // spare counts, and the one that settles is the one checked.)
    let counts = || {
        let before = spares();
        let g = gens();
        (spares() == before).then_some((g, before))
    };
    let t = std::time::Instant::now();
    let mut seen = None;
    while t.elapsed().as_secs() < 10 {
        if let Some((g, s)) = counts() {
            seen = Some((g, s));
            if g == 4 + s && s > 0 {
                break;
            }
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let (g, s) = seen.expect("the spare count never held still");
    let names: Vec<String> = std::fs::read_dir(d.dir.join("btrfs/sandboxes").join(&sb))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        g == 4 + s && (1..=2).contains(&s),
        "{g} generations, {s} spares: {names:?}; checkpoints {ck_a} {ck_b}; {}",
        d.ok("GET", &format!("/v1/sandboxes/{sb}/checkpoints"), None)
    );
}

/// A minimal rootfs (dash and the two libraries it needs) imported from a
/// directory and from a tarball; sandboxes run on it; images in use cannot
/// be removed.
#[test]
fn imported_images_run_sandboxes() {
    if common::must_skip() {
        return;
    }
    let d = Daemon::start("images");
    let src = d.dir.join("rootfs-src");
    for dir in ["usr/bin", "usr/lib/x86_64-linux-gnu", "usr/lib64", "root", "tmp", "etc"] {
        std::fs::create_dir_all(src.join(dir)).unwrap();
    }
    for (from, to) in [
        ("/usr/bin/dash", "usr/bin/dash"),
        ("/lib/x86_64-linux-gnu/libc.so.6", "usr/lib/x86_64-linux-gnu/libc.so.6"),
        ("/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2", "usr/lib64/ld-linux-x86-64.so.2"),
    ] {
        std::fs::copy(from, src.join(to)).unwrap();
    }
    for (link, target) in [("bin", "usr/bin"), ("lib", "usr/lib"), ("lib64", "usr/lib64"), ("usr/bin/sh", "dash")] {
        std::os::unix::fs::symlink(target, src.join(link)).unwrap();
    }
    std::fs::write(src.join("etc/marker"), "imported\n").unwrap();
    let tarball = d.dir.join("rootfs.tar");
    let ok = std::process::Command::new("tar").arg("-cf").arg(&tarball).arg("-C").arg(&src).arg(".").status().unwrap();
    assert!(ok.success());

    for (name, source) in [("mini-dir", &src), ("mini-tar", &tarball)] {
        let (status, body) =
            d.req("POST", "/v1/images", Some(json!({"name": name, "source": source.to_str().unwrap()})));
        assert_eq!(status, 200, "{body}");
        let text = body.as_str().map(str::to_string).unwrap_or_else(|| body.to_string());
        assert!(text.contains("\"done\""), "import of {name} did not finish: {text}");
        let sb =
            d.ok("POST", "/v1/sandboxes", Some(json!({"image": name})))["sandbox"]["id"].as_str().unwrap().to_string();
        assert_eq!(
            d.sh_ok(&sb, "read m < /etc/marker; echo $m; echo $((6*7)) > /root/x; read x < /root/x; echo $x"),
            "imported\n42\n"
        );
        // Files are owned by root inside (ids shifted at import).
        let (code, _) = d.sh(&sb, "test -O /etc/marker");
        assert_eq!(code, 0, "imported files are not owned by root inside");
        let (status, v) = d.req("DELETE", &format!("/v1/images/{name}"), None);
        assert_eq!((status, v["error"]["code"].as_str()), (409, Some("image_in_use")), "{v}");
        d.ok("DELETE", &format!("/v1/sandboxes/{sb}"), None);
        d.ok("DELETE", &format!("/v1/images/{name}"), None);
    }
    let names: Vec<String> = d.ok("GET", "/v1/images", None)["images"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(names, vec!["default"]);
    // A path outside the import is refused before anything is created.
    let (status, _) = d.req("POST", "/v1/images", Some(json!({"name": "x", "source": "relative/path"})));
    assert_eq!(status, 400);
}

/// A session keeps cwd, env and shell variables between `run` calls, reports
/// exit codes, and streamed exec delivers output as NDJSON events.
#[test]
fn sessions_keep_shell_state_and_exec_streams() {
    if common::must_skip() {
        return;
    }
    let d = Daemon::start("session");
    let sb = d.create();
    let s = d.ok("POST", &format!("/v1/sandboxes/{sb}/sessions"), Some(json!({})));
    let sid = s["id"].as_str().unwrap().to_string();
    let run =
        |cmd: &str| d.ok("POST", &format!("/v1/sandboxes/{sb}/sessions/{sid}/run"), Some(json!({"command": cmd})));
    run("cd /tmp && export GREETING=hi && count=41");
    let v = run("pwd; echo $GREETING $((count+1))");
    assert_eq!(v["output"], "/tmp\nhi 42\n", "{v}");
    assert_eq!(v["exit_code"], 0);
    assert_eq!(run("false")["exit_code"], 1);
    let v = d.ok(
        "POST",
        &format!("/v1/sandboxes/{sb}/sessions/{sid}/run"),
        Some(json!({"command": "sleep 30", "timeout_ms": 300})),
    );
    assert_eq!(v["timed_out"], true, "{v}");
    assert_eq!(run("echo still here")["output"], "still here\n");
    d.ok("DELETE", &format!("/v1/sandboxes/{sb}/sessions/{sid}"), None);

    let (status, body) = d.req(
        "POST",
        &format!("/v1/sandboxes/{sb}/exec?stream=true"),
        Some(json!({"cmd": ["sh", "-c", "echo out; echo err >&2; exit 3"]})),
    );
    assert_eq!(status, 200);
    let text = body.as_str().unwrap_or_default().to_string();
    let events: Vec<serde_json::Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(events.first().unwrap()["type"], "started", "{text}");
    assert!(events.iter().any(|e| e["type"] == "stdout" && e["data"] == "out\n"), "{text}");
    assert!(events.iter().any(|e| e["type"] == "stderr" && e["data"] == "err\n"), "{text}");
    let last = events.last().unwrap();
    assert_eq!((last["type"].as_str(), last["exit_code"].as_i64()), (Some("exit"), Some(3)), "{text}");
}
