//! Integration tests against real namespaces, overlays and cgroups.
//!
//! `harness = false`: the zygote must be forked before any thread exists,
//! so `main` starts it first, then builds a tokio runtime and runs the cases
//! sequentially.

use std::fs;
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use sandtree_sandbox::{ExecRequest, HostConfig, Limits, LowerDir, OverlayLayer, Sandbox, SandboxSpec, Zygote};

const UID_BASE: u32 = 1_000_000_000;

struct Env {
    _tmp: tempfile::TempDir,
    base: PathBuf,
    cfg: HostConfig,
    skeleton: PathBuf,
}

fn chown_tree(path: &Path, uid: u32) -> Result<()> {
    std::os::unix::fs::lchown(path, Some(uid), Some(uid))?;
    if path.is_dir() && !path.is_symlink() {
        for e in fs::read_dir(path)? {
            chown_tree(&e?.path(), uid)?;
        }
    }
    Ok(())
}

fn make_env() -> Result<Env> {
    let tmp = tempfile::Builder::new().prefix("sandtree-test").tempdir()?;
    let base = tmp.path().to_path_buf();
    fs::set_permissions(&base, fs::Permissions::from_mode(0o755))?;
    let skeleton = base.join("skeleton");
    for d in ["etc", "root", "tmp", "proc", "sys", "dev", "usr", "home", "var/tmp", "run"] {
        fs::create_dir_all(skeleton.join(d))?;
    }
    fs::set_permissions(skeleton.join("tmp"), fs::Permissions::from_mode(0o1777))?;
    fs::set_permissions(skeleton.join("root"), fs::Permissions::from_mode(0o700))?;
    for (l, t) in [("bin", "usr/bin"), ("lib", "usr/lib"), ("lib64", "usr/lib64"), ("sbin", "usr/sbin")] {
        symlink(t, skeleton.join(l))?;
    }
    for f in ["passwd", "group", "nsswitch.conf", "ld.so.cache"] {
        let src = Path::new("/etc").join(f);
        if src.exists() {
            fs::copy(&src, skeleton.join("etc").join(f))?;
        }
    }
    // /etc/alternatives: copy the symlinks.
    if let Ok(rd) = fs::read_dir("/etc/alternatives") {
        fs::create_dir_all(skeleton.join("etc/alternatives"))?;
        for e in rd.flatten() {
            if let Ok(t) = fs::read_link(e.path()) {
                let _ = symlink(t, skeleton.join("etc/alternatives").join(e.file_name()));
            }
        }
    }
    chown_tree(&skeleton, UID_BASE)?;
    let run = base.join("run");
    fs::create_dir_all(&run)?;
    fs::set_permissions(&run, fs::Permissions::from_mode(0o711))?;
    // Layers under `base` show as `<key>/store/...` inside.
    let cfg = HostConfig {
        run_dir: run,
        uid_base: UID_BASE,
        cgroup_name: "sandtree-test".into(),
        store_root: Some(base.clone()),
    };
    Ok(Env { _tmp: tmp, base, cfg, skeleton })
}

fn spec(env: &Env, id: &str, limits: Limits) -> SandboxSpec {
    let l = |name: &str| env.base.join("layers").join(id).join(name);
    SandboxSpec {
        id: id.into(),
        hostname: format!("sb-{id}"),
        layers: vec![
            OverlayLayer {
                target: "/".into(),
                lower: vec![LowerDir { path: env.skeleton.clone(), idmap: false }],
                upper: l("root-upper"),
                work: l("root-work"),
            },
            OverlayLayer {
                target: "/usr".into(),
                lower: vec![LowerDir { path: "/usr".into(), idmap: true }],
                upper: l("usr-upper"),
                work: l("usr-work"),
            },
        ],
        limits,
    }
}

struct Ctx<'a> {
    zygote: &'a Zygote,
    env: &'a Env,
}

impl Ctx<'_> {
    async fn start(&self, id: &str, limits: Limits) -> Result<Sandbox> {
        let spec = spec(self.env, id, limits);
        let init = self.zygote.spawn(&spec).with_context(|| format!("spawn {id}"))?;
        Ok(Sandbox::connect(&self.env.cfg, id, init).await?)
    }
}

async fn sh(sb: &Sandbox, script: &str) -> Result<sandtree_sandbox::ExecOutput> {
    Ok(sb.exec(ExecRequest::new(["sh", "-c", script])).await?)
}

fn out(o: &sandtree_sandbox::ExecOutput) -> String {
    String::from_utf8_lossy(&o.stdout).trim().to_string()
}

async fn basics(cx: &Ctx<'_>, sb: &Sandbox) -> Result<()> {
    let _ = cx;
    let o = sb.exec(ExecRequest::new(["/bin/true"])).await?;
    ensure!(o.exit_code == Some(0), "true: {o:?}");
    let o = sh(sb, "exit 7").await?;
    ensure!(o.exit_code == Some(7), "exit 7: {o:?}");
    let o = sh(sb, "echo out; echo err >&2").await?;
    ensure!(out(&o) == "out" && String::from_utf8_lossy(&o.stderr).trim() == "err", "{o:?}");
    let mut r = ExecRequest::new(["cat"]);
    r.stdin = Some(b"hello stdin".to_vec());
    let o = sb.exec(r).await?;
    ensure!(o.stdout == b"hello stdin", "{o:?}");
    let mut r = ExecRequest::new(["sh", "-c", "pwd; echo $FOO; echo $HOME"]);
    r.cwd = Some("/tmp".into());
    r.env = vec![("FOO".into(), "bar".into())];
    let o = sb.exec(r).await?;
    ensure!(out(&o) == "/tmp\nbar\n/root", "{o:?}");
    match sb.exec(ExecRequest::new(["no-such-command-xyz"])).await {
        Err(sandtree_sandbox::Error::CommandNotFound { command }) => {
            ensure!(command == "no-such-command-xyz")
        }
        other => bail!("expected command not found, got {other:?}"),
    }
    let mut r = ExecRequest::new(["true"]);
    r.cwd = Some("/nonexistent".into());
    ensure!(sb.exec(r).await.is_err(), "chdir failure must be an error");
    Ok(())
}

async fn identity(_cx: &Ctx<'_>, sb: &Sandbox) -> Result<()> {
    let o = sh(sb, "id -u; id -g").await?;
    ensure!(out(&o) == "0\n0", "id: {o:?}");
    let bg = sb.spawn_background(ExecRequest::new(["sleep", "100"])).await?;
    let hp = sb.host_pid(bg.pid).context("host pid")?;
    let status = fs::read_to_string(format!("/proc/{hp}/status"))?;
    let uid_line = status.lines().find(|l| l.starts_with("Uid:")).unwrap_or("");
    ensure!(uid_line.split_whitespace().nth(1) == Some(&UID_BASE.to_string()), "host uid: {uid_line}");
    sb.kill_process(bg.pid, 9).await?;
    // A name the kernel cuts at 15 bytes inside a UTF-8 character: its
    // /proc status is not UTF-8, and the process must still be found.
    let cut = "cp /bin/sleep /tmp/aaaaaaaaaaaaaa\u{e9} && exec /tmp/aaaaaaaaaaaaaa\u{e9} 100";
    let bg = sb.spawn_background(ExecRequest::new(["sh", "-c", cut])).await?;
    let mut found = None;
    for _ in 0..200 {
        let comm = fs::read(format!("/proc/{}/comm", sb.host_pid(bg.pid).unwrap_or(0))).unwrap_or_default();
        if comm.starts_with(b"aaaa") {
            found = sb.host_pid(bg.pid);
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    ensure!(found.is_some(), "a process whose name is cut inside a UTF-8 character is not found");
    sb.kill_process(bg.pid, 9).await?;
    let o = sb.exec(ExecRequest::new(["hostname"])).await?;
    ensure!(out(&o) == format!("sb-{}", sb.id()), "hostname {o:?}");
    let o = sb.exec(ExecRequest::new(["cat", "/proc/1/comm"])).await?;
    ensure!(out(&o) == "sandtree:[init]", "comm {o:?}");
    let o = sh(sb, "ls /proc | grep -E '^[0-9]+$' | sort -n | tr '\\n' ' '").await?;
    let pids: Vec<i32> = out(&o).split_whitespace().filter_map(|p| p.parse().ok()).collect();
    ensure!(pids.first() == Some(&1) && pids.len() < 10 && pids.iter().all(|p| *p < 1000), "proc pids {pids:?}");
    Ok(())
}

async fn isolation(_cx: &Ctx<'_>, sb: &Sandbox) -> Result<()> {
    let marker = Path::new("/root/.sandtree-test-marker");
    fs::write(marker, "x")?;
    let o = sh(sb, "test -e /root/.sandtree-test-marker && echo visible || echo absent").await;
    fs::remove_file(marker)?;
    ensure!(out(&o?) == "absent");
    let o = sh(sb, "cat /proc/net/dev | tail -n +3 | cut -d: -f1 | tr -d ' '").await?;
    ensure!(out(&o) == "lo", "interfaces {o:?}");
    let o = sh(sb, "cat /sys/class/net/lo/operstate 2>/dev/null; python3 -c 'import socket; s=socket.socket(); s.bind((\"127.0.0.1\",0)); s.listen(); c=socket.create_connection(s.getsockname()); print(\"lo-up\")'").await?;
    ensure!(out(&o).ends_with("lo-up"), "loopback {o:?}");
    let o = sb.exec(ExecRequest::new(["python3", "-c", "print(1+1)"])).await?;
    ensure!(out(&o) == "2", "python {o:?}");
    let o = sh(
        sb,
        "mkdir -p /usr/local/lib && touch /usr/local/lib/x && echo hi > /usr/bin/newfile && cat /usr/bin/newfile",
    )
    .await?;
    ensure!(o.exit_code == Some(0) && out(&o) == "hi", "usr write {o:?}");
    ensure!(!Path::new("/usr/bin/newfile").exists() && !Path::new("/usr/local/lib/x").exists(), "host /usr touched");
    let o = sb
        .exec(ExecRequest::new([
            "python3",
            "-c",
            "import ctypes,os; r=ctypes.CDLL(None,use_errno=True).syscall(321,0,0,0); print(r, ctypes.get_errno())",
        ]))
        .await?;
    ensure!(out(&o) == "-1 1", "bpf should fail with EPERM: {o:?}");
    Ok(())
}

async fn timeouts(_cx: &Ctx<'_>, sb: &Sandbox) -> Result<()> {
    let mut r = ExecRequest::new(["sleep", "100"]);
    r.timeout = Some(Duration::from_millis(300));
    let t = Instant::now();
    let o = sb.exec(r).await?;
    ensure!(o.timed_out && o.signal == Some(9) && t.elapsed() < Duration::from_secs(2), "timeout {o:?}");
    let mut r = ExecRequest::new(["sh", "-c", "yes | head -c 50000000"]);
    r.max_output_bytes = 1024 * 1024;
    let t = Instant::now();
    let o = sb.exec(r).await?;
    ensure!(o.stdout.len() == 1024 * 1024 && o.stdout_truncated && o.exit_code == Some(0), "flood {:?}", o.exit_code);
    println!("  info: 50 MB flood took {:?}", t.elapsed());
    Ok(())
}

async fn background(_cx: &Ctx<'_>, sb: &Sandbox) -> Result<()> {
    let p = sb.spawn_background(ExecRequest::new(["sh", "-c", "echo started; exec sleep 1000"])).await?;
    tokio::time::sleep(Duration::from_millis(100)).await;
    ensure!(sb.processes().iter().any(|x| x.pid == p.pid && x.running()), "listed");
    ensure!(sb.process_output(p.pid).map(|(o, _)| o) == Some(b"started\n".to_vec()), "bg output");
    sb.kill_process(p.pid, 15).await?;
    for _ in 0..100 {
        if sb.processes().iter().any(|x| x.pid == p.pid && !x.running()) {
            let u = sb.usage()?;
            println!("  info: usage {u:?}");
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    bail!("background process not reported as exited")
}

async fn freeze(_cx: &Ctx<'_>, sb: &Sandbox) -> Result<()> {
    sb.spawn_background(ExecRequest::new(["sh", "-c", "i=0; while true; do i=$((i+1)); echo $i > /tmp/counter; done"]))
        .await?;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let t = Instant::now();
    sb.freeze(Duration::from_secs(2))?;
    println!("  info: freeze took {:?}", t.elapsed());
    let upper = _cx.env.base.join("layers").join(sb.id()).join("root-upper/tmp/counter");
    let a = fs::read_to_string(&upper)?;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let b = fs::read_to_string(&upper)?;
    ensure!(a == b, "counter advanced while frozen: {a} -> {b}");
    sb.thaw()?;
    // (A read between the loop's truncation and its write sees ""; on a
    // loaded machine the thawed shell may wait a while for a CPU: a
    // fresh-clone CI run beside a release build read "" before the freeze,
    // while frozen, and for the two seconds it then waited.)
    let mut c = b.clone();
    for _ in 0..200 {
        tokio::time::sleep(Duration::from_millis(50)).await;
        c = fs::read_to_string(&upper)?;
        if c != b && !c.is_empty() {
            break;
        }
    }
    ensure!(c != b, "counter did not advance after thaw: {a:?} {b:?} {c:?}");
    match sb.freeze(Duration::ZERO) {
        Ok(()) => println!("  note: zero-timeout freeze completed immediately"),
        Err(sandtree_sandbox::Error::FreezeTimeout { stuck }) => {
            println!("  info: zero-timeout freeze reported {} stuck tasks", stuck.len())
        }
        Err(e) => return Err(e.into()),
    }
    sb.thaw()?;
    sh(sb, "true").await?;
    Ok(())
}

async fn sessions(_cx: &Ctx<'_>, sb: &Sandbox) -> Result<()> {
    let t = Instant::now();
    let sid = sb.open_session(sandtree_sandbox::SessionOptions::default()).await?;
    println!("  info: open_session took {:?}", t.elapsed());
    let r = sb.session_run(&sid, "cd /tmp; export FOO=bar; x=5", None).await?;
    ensure!(r.exit_code == Some(0), "setup {r:?}");
    let r = sb.session_run(&sid, "pwd; echo $FOO $x", Some(Duration::from_secs(10))).await?;
    ensure!(r.output == b"/tmp\nbar 5\n" && r.exit_code == Some(0), "state {r:?}");
    let r = sb.session_run(&sid, "false", None).await?;
    ensure!(r.exit_code == Some(1) && r.output.is_empty(), "false {r:?}");
    let r = sb.session_run(&sid, "for i in 1 2; do\n echo \"l$i\"\ndone; tty", None).await?;
    ensure!(r.output.starts_with(b"l1\nl2\n/dev/pts/"), "multiline {r:?}");
    // The bytes as written: NUL, invalid UTF-8, a bare \n and a \r\n of its own.
    let r = sb.session_run(&sid, r"printf 'a\000\377\n\r\n\200'", None).await?;
    ensure!(r.output == b"a\0\xff\n\r\n\x80", "binary output {r:?}");
    let r = sb.session_run(&sid, "sleep 100", Some(Duration::from_millis(300))).await?;
    ensure!(r.timed_out, "timeout {r:?}");
    let r = sb.session_run(&sid, "echo after", Some(Duration::from_secs(10))).await?;
    ensure!(r.output == b"after\n", "after timeout {r:?}");
    let mut io = sb.session_io(&sid)?;
    io.resize(100, 30)?;
    io.write(b"echo attached-$((40+2))\n").await?;
    let mut seen = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(5);
    while !String::from_utf8_lossy(&seen).contains("attached-42") && Instant::now() < deadline {
        if let Ok(Ok(chunk)) = tokio::time::timeout(Duration::from_millis(500), io.output.recv()).await {
            seen.extend(chunk);
        }
    }
    ensure!(String::from_utf8_lossy(&seen).contains("attached-42"), "attach output {seen:?}");
    ensure!(sb.sessions().len() == 1);
    sb.close_session(&sid).await?;
    ensure!(sb.sessions().is_empty());
    Ok(())
}

async fn limits(cx: &Ctx<'_>) -> Result<()> {
    let sb =
        cx.start("limits", Limits { memory_bytes: Some(64 << 20), pids: Some(20), cpu_millicores: Some(500) }).await?;
    let o = sb.exec(ExecRequest::new(["python3", "-c", "x = bytearray(200 * 1024 * 1024); print('survived')"])).await?;
    ensure!(o.signal == Some(9) || o.exit_code != Some(0), "memory limit not enforced: {o:?}");
    let o = sh(&sb, "for i in $(seq 1 40); do sleep 5 & done 2>/dev/null; echo done").await?;
    let u = sb.usage()?;
    ensure!(u.pids_limit == Some(20) && u.pids <= 20, "pids {u:?} {o:?}");
    sb.kill().await?;
    Ok(())
}

async fn adopt(cx: &Ctx<'_>) -> Result<()> {
    let sb = cx.start("adopt", Limits::default()).await?;
    let pid = sb.init_pid();
    drop(sb);
    let sb = Sandbox::adopt(&cx.env.cfg, "adopt").await?.context("adopt returned None")?;
    ensure!(sb.init_pid() == pid, "adopted init pid {} != {pid}", sb.init_pid());
    let o = sh(&sb, "echo again").await?;
    ensure!(out(&o) == "again");
    sb.kill().await?;
    ensure!(Sandbox::adopt(&cx.env.cfg, "adopt").await?.is_none(), "dead sandbox adopted");
    Ok(())
}

async fn kill_and_cleanup(cx: &Ctx<'_>, sb: Sandbox) -> Result<()> {
    sb.spawn_background(ExecRequest::new(["sleep", "1000"])).await?;
    let init = sb.init_pid();
    sb.kill().await?;
    ensure!(!sb.is_alive(), "init alive");
    ensure!(!Path::new(&format!("/proc/{init}")).exists(), "init still in /proc");
    ensure!(!sb.cgroup().exists(), "cgroup left");
    let layers = cx.env.base.join("layers").join(sb.id());
    // The upper dirs are not busy: renaming and removing them works.
    fs::rename(layers.join("root-upper"), layers.join("gone"))?;
    fs::remove_dir_all(&layers)?;
    ensure!(!cx.env.cfg.sandbox_dir(sb.id()).exists(), "run dir left");
    Ok(())
}

async fn latencies(cx: &Ctx<'_>) -> Result<()> {
    let mut spawn = Vec::new();
    for i in 0..5 {
        let t = Instant::now();
        let sb = cx.start(&format!("lat{i}"), Limits::default()).await?;
        spawn.push(t.elapsed());
        if i == 4 {
            let mut ex = Vec::new();
            for _ in 0..50 {
                let t = Instant::now();
                sb.exec(ExecRequest::new(["/bin/true"])).await?;
                ex.push(t.elapsed());
            }
            ex.sort();
            println!("  info: exec /bin/true p50 {:?} p90 {:?}", ex[25], ex[45]);
        }
        sb.kill().await?;
    }
    spawn.sort();
    println!("  info: spawn+connect p50 {:?} min {:?}", spawn[2], spawn[0]);
    Ok(())
}

fn v2_cgroup_paths() -> Result<()> {
    let root = Path::new("/sys/fs/cgroup/unified");
    if !root.join("cgroup.procs").exists() {
        println!("  note: no cgroup2 at {}, skipped", root.display());
        return Ok(());
    }
    let cg = sandtree_sandbox::Cgroup::new(sandtree_sandbox::Backend::V2 { root: root.into() }, "sandtree-test", "v2");
    cg.create(&Limits { memory_bytes: Some(1 << 30), pids: Some(100), cpu_millicores: None })?;
    let mut child = std::process::Command::new("sleep").arg("100").spawn()?;
    cg.add(child.id() as i32)?;
    ensure!(cg.procs()? == vec![child.id() as i32]);
    cg.freeze(Duration::from_secs(1))?;
    cg.thaw()?;
    let u = cg.usage()?;
    println!("  info: v2 usage on hybrid unified mount: {u:?} (memory/pids controllers absent here)");
    cg.kill_all(Duration::from_secs(2))?;
    let _ = child.wait();
    cg.remove()?;
    let _ = fs::remove_dir(root.join("sandtree-test"));
    Ok(())
}

/// The page cache a sandbox's processes left charged to its memory cgroup
/// is dropped before the cgroup is removed (else the removed cgroup stays
/// in the kernel, dying, and hundreds of them slow every fork).
fn removed_cgroup_leaves_no_charges() -> Result<()> {
    let backend = sandtree_sandbox::Backend::detect();
    let cg = sandtree_sandbox::Cgroup::new(backend, "sandtree-test", "charges");
    cg.create(&Limits { memory_bytes: Some(1 << 30), pids: Some(100), cpu_millicores: None })?;
    if cg.usage()?.memory_limit.is_none() {
        println!("  note: no memory controller here, skipped");
        cg.remove()?;
        return Ok(());
    }
    // (On a disk filesystem: tmpfs pages are not reclaimable without swap.)
    let dir = tempfile::tempdir_in("/var/tmp")?;
    let (go, done) = (dir.path().join("go"), dir.path().join("done"));
    let script = format!(
        "while [ ! -e {go} ]; do sleep 0.01; done; head -c 32M /dev/zero > {f}; cat {f} > /dev/null; touch {done}; sleep 100",
        go = go.display(),
        f = dir.path().join("data").display(),
        done = done.display()
    );
    let mut child = std::process::Command::new("sh").arg("-c").arg(&script).spawn()?;
    cg.add(child.id() as i32)?;
    fs::write(&go, "")?;
    let t = Instant::now();
    while !done.exists() {
        ensure!(t.elapsed() < Duration::from_secs(20), "the writer did not finish");
        std::thread::sleep(Duration::from_millis(10));
    }
    let before = cg.usage()?.memory_bytes;
    cg.kill_all(Duration::from_secs(2))?;
    let _ = child.wait();
    ensure!(before >= 16 << 20, "only {before} bytes charged after writing 32 MiB");
    let left = cg.reclaim_charges();
    ensure!(left < 4 << 20, "{left} of {before} bytes still charged after the reclaim");
    cg.remove()?;
    Ok(())
}

fn main() {
    let env = make_env().expect("test env");
    let zygote = Zygote::start(env.cfg.clone()).expect("zygote start");
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    let mut passed = 0;
    let mut failed = 0;
    let filter = std::env::var("SANDTREE_TEST").ok();
    let skip = |name: &str| filter.as_deref().is_some_and(|f| !name.contains(f));
    let mut report = |name: &str, r: Result<()>| match r {
        Ok(()) => {
            println!("test {name} ... ok");
            passed += 1;
        }
        Err(e) => {
            println!("test {name} ... FAILED: {e:#}");
            failed += 1;
        }
    };
    report("cgroup_v2_paths", v2_cgroup_paths());
    report("removed_cgroup_leaves_no_charges", removed_cgroup_leaves_no_charges());
    rt.block_on(async {
        let cx = Ctx { zygote: &zygote, env: &env };
        let t = Instant::now();
        let sb = match cx.start("main", Limits::default()).await {
            Ok(sb) => sb,
            Err(e) => {
                report("spawn", Err(e));
                return;
            }
        };
        println!("  info: first spawn took {:?}", t.elapsed());
        report("spawn", Ok(()));
        if !skip("exec_basics") {
            report("exec_basics", basics(&cx, &sb).await);
        }
        if !skip("identity") {
            report("identity", identity(&cx, &sb).await);
        }
        if !skip("isolation") {
            report("isolation", isolation(&cx, &sb).await);
        }
        if !skip("timeouts") {
            report("timeouts", timeouts(&cx, &sb).await);
        }
        if !skip("background") {
            report("background", background(&cx, &sb).await);
        }
        if !skip("freeze") {
            report("freeze", freeze(&cx, &sb).await);
        }
        if !skip("sessions") {
            report("sessions", sessions(&cx, &sb).await);
        }
        if !skip("limits") {
            report("limits", limits(&cx).await);
        }
        if !skip("adopt") {
            report("adopt", adopt(&cx).await);
        }
        if !skip("latencies") {
            report("latencies", latencies(&cx).await);
        }
        report("kill_cleanup", kill_and_cleanup(&cx, sb).await);
    });
    println!("{passed} passed, {failed} failed");
    // Detach the idmapped /usr clone (read-only) before removing its directory.
    if let Ok(rd) = fs::read_dir(env.cfg.lower_dir()) {
        for e in rd.flatten() {
            let _ = nix::mount::umount2(&e.path(), nix::mount::MntFlags::MNT_DETACH);
            let _ = fs::remove_dir(e.path());
        }
    }
    for p in ["freezer", "memory", "pids", "cpu", "cpuacct"] {
        let _ = fs::remove_dir(Path::new("/sys/fs/cgroup").join(p).join("sandtree-test"));
    }
    std::process::exit(if failed == 0 { 0 } else { 1 });
}
