//! Engine-level tests against the real kernel (btrfs, namespaces, cgroups).
//!
//! `harness = false`: the zygote must be forked while the process is still
//! single-threaded, which libtest's runner does not allow. Cases run in
//! sequence on one engine; the last line is `N passed, M failed`.

use std::time::Instant;

use anyhow::{Context, Result, ensure};
use sandtree_api::{
    CheckpointRequest, CreateSandboxRequest, ErrorCode, ExecRequest, ForkRequest, Limits, ProcessOutcome,
    RestoreSource, RollbackRequest, SessionRunRequest,
};
use sandtree_runtime::Engine;

mod common;
use common::{Case, CaseFuture};
mod in_sandbox;
use in_sandbox::{sh, start_python};

async fn create(e: &Engine) -> Result<String> {
    Ok(e.create_sandbox(CreateSandboxRequest::default()).await?.sandbox.id)
}

async fn checkpoint(e: &Engine, sb: &str) -> Result<String> {
    Ok(e.checkpoint(sb, CheckpointRequest::default()).await?.checkpoint.id)
}

fn rollback_and_fork_restore_files(e: &Engine) -> CaseFuture<'_> {
    Box::pin(async move {
        let sb = create(e).await?;
        sh(e, &sb, "echo one > /root/a && mkdir -p /opt/x && echo hi > /opt/x/y").await?;
        let ck1 = checkpoint(e, &sb).await?;
        sh(e, &sb, "echo two > /root/a && rm -r /opt/x && echo extra > /root/b").await?;
        let ck2 = checkpoint(e, &sb).await?;
        let r = e.rollback(&sb, RollbackRequest { checkpoint: ck1.clone(), allow_restart: false }).await?;
        // Only init ran at the checkpoint: that is exactly what comes back.
        ensure!(!r.processes_restarted && r.restored_pids.is_empty(), "{r:?}");
        ensure!(sh(e, &sb, "cat /root/a /opt/x/y; test ! -e /root/b && echo nob").await? == "one\nhi\nnob\n");
        e.rollback(&sb, RollbackRequest { checkpoint: ck2.clone(), allow_restart: false }).await?;
        ensure!(sh(e, &sb, "cat /root/a /root/b; test ! -e /opt/x && echo nox").await? == "two\nextra\nnox\n");
        let f =
            e.fork(&ck1, ForkRequest { count: 3, labels: Default::default(), limits: None, files_only: false }).await?;
        ensure!(f.results.len() == 3);
        for r in &f.results {
            let id = &r.sandbox.as_ref().context("fork failed")?.id;
            ensure!(sh(e, id, "cat /root/a").await? == "one\n");
            e.delete_sandbox(id, false).await?;
        }
        // Sizes are measured in the background; the checkpoint of a 4-byte change is small.
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        let ck = e.get_checkpoint(&ck2).await?;
        ensure!(ck.size_bytes.is_some_and(|s| s < 1 << 20), "size {:?}", ck.size_bytes);
        ensure!(ck.parent.as_deref() == Some(ck1.as_str()));
        e.delete_sandbox(&sb, true).await?;
        Ok(())
    })
}

/// Rollback in place: init (and its pid namespace, cgroup, /dev) survive,
/// every other process is killed, the old tree is gone from view and its
/// subvolume is reclaimed; repeated rollbacks leak no mounts.
fn rollback_in_place_keeps_init_and_kills_the_rest(e: &Engine) -> CaseFuture<'_> {
    Box::pin(async move {
        let sb = create(e).await?;
        sh(e, &sb, "echo base > /root/f").await?;
        let ck = checkpoint(e, &sb).await?;
        let init_pid = e.get_sandbox(&sb).await?.init_pid.context("init pid")?;
        let init_start = sh(e, &sb, "cut -d' ' -f22 /proc/1/stat").await?;
        let mounts = sh(e, &sb, "wc -l < /proc/self/mountinfo").await?;
        for i in 0..12 {
            let bg = e
                .exec(
                    &sb,
                    ExecRequest { cmd: vec!["sleep".into(), "1000".into()], background: true, ..Default::default() },
                )
                .await?;
            ensure!(bg.pid > 1);
            let s = e.create_session(&sb, Default::default()).await?;
            e.session_run(&sb, &s.id, SessionRunRequest { command: "cd /tmp".into(), timeout_ms: None }).await?;
            sh(e, &sb, &format!("echo {i} > /root/f; echo junk > /tmp/junk")).await?;
            e.rollback(&sb, RollbackRequest { checkpoint: ck.clone(), allow_restart: false }).await?;
            ensure!(e.get_sandbox(&sb).await?.init_pid == Some(init_pid), "init was replaced");
            ensure!(sh(e, &sb, "cut -d' ' -f22 /proc/1/stat").await? == init_start, "init restarted");
            ensure!(sh(e, &sb, "cat /root/f; test ! -e /tmp/junk && echo clean").await? == "base\nclean\n");
            let comms = sh(e, &sb, "cat /proc/[0-9]*/comm").await?;
            ensure!(!comms.contains("sleep") && !comms.contains("bash"), "survivors after rollback: {comms}");
            ensure!(e.list_sessions(&sb).await?.sessions.is_empty(), "sessions survived");
        }
        ensure!(sh(e, &sb, "wc -l < /proc/self/mountinfo").await? == mounts, "mounts leaked");
        // What the sandbox mounted under the kept /dev does not survive (it
        // would pin the old layer), and /dev/shm starts empty again.
        sh(e, &sb, "mkdir /dev/shm/old /tmp/m && mount --bind /tmp /dev/shm/old && echo x > /dev/shm/f").await?;
        ensure!(sh(e, &sb, "grep -c ' /dev/shm/old ' /proc/self/mountinfo").await? == "1\n");
        e.rollback(&sb, RollbackRequest { checkpoint: ck.clone(), allow_restart: false }).await?;
        ensure!(sh(e, &sb, "ls -A /dev/shm | wc -l").await? == "0\n", "/dev/shm kept old files");
        ensure!(sh(e, &sb, "wc -l < /proc/self/mountinfo").await? == mounts, "sandbox-made mounts survived");
        ensure!(sh(e, &sb, "awk '$5 == \"/\"' /proc/self/mountinfo | wc -l").await? == "1\n", "two roots visible");
        // /dev and a fresh session (a pty on the kept devpts) still work.
        sh(e, &sb, "echo x > /dev/null && test -c /dev/pts/ptmx").await?;
        let s = e.create_session(&sb, Default::default()).await?;
        let out =
            e.session_run(&sb, &s.id, SessionRunRequest { command: "cat /root/f".into(), timeout_ms: None }).await?;
        ensure!(out.output.trim() == "base", "session output {:?}", out.output);
        // The replaced layers are reclaimed once the engine is idle; what
        // stays is the current layer, the checkpoint's (init ran alone: the
        // layer it wrote to became the checkpoint's), one prepared rollback
        // target over it (a spare) and the prepared next layer over the
        // current one (for its next checkpoint).
        let dir = e.volume().root().join("sandboxes").join(&sb);
        let layers_settle_at = |want: std::ops::RangeInclusive<usize>| {
            let dir = dir.clone();
            async move {
                let deadline = Instant::now() + std::time::Duration::from_secs(10);
                loop {
                    let n = std::fs::read_dir(&dir).map(|d| d.count()).unwrap_or(0);
                    if want.contains(&n) {
                        return Ok(());
                    }
                    ensure!(Instant::now() < deadline, "{n} layers in {}, want {want:?}", dir.display());
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                }
            }
        };
        layers_settle_at(3..=4).await?;
        ensure!(e.info().await?.spare_layers >= 1, "no spare layer prepared");
        // Rolling back a stopped sandbox starts it.
        e.stop_sandbox(&sb).await?;
        e.rollback(&sb, RollbackRequest { checkpoint: ck.clone(), allow_restart: false }).await?;
        ensure!(sh(e, &sb, "cat /root/f").await? == "base\n");
        e.delete_sandbox(&sb, true).await?;
        // Its spares go with it.
        layers_settle_at(0..=0).await?;
        Ok(())
    })
}

/// A program that keeps state in memory, in an open file (its offset) and
/// in its cwd, and reports it from inside: restored exactly by rollback.
const COUNTER: &str = r#"
import os, time
os.makedirs('/root/work', exist_ok=True)
os.chdir('/root/work')
log = open('/root/work/log', 'w')
secret = os.urandom(8).hex()
n = 0
while True:
    n += 1
    log.write(f'{n}\n'); log.flush()
    with open('/root/state.tmp', 'w') as f:
        f.write(f'{os.getpid()} {os.getppid()} {n} {os.getcwd()} {secret}')
    os.replace('/root/state.tmp', '/root/state')
    time.sleep(0.01)
"#;

/// The layer checkpoint `ck` stands on: `sandboxes/...` when it was
/// layered, `checkpoints/<ck>` when it was a snapshot.
fn layer_of(e: &Engine, ck: &str) -> Result<String> {
    Ok(e.meta().checkpoint(ck).map_err(anyhow::Error::from)?.context("checkpoint row")?.layer)
}

/// The contents of `path` in sandbox `sb`, once it exists (30 s at most).
async fn file_of(e: &Engine, sb: &str, path: &str) -> Result<String> {
    let deadline = Instant::now() + std::time::Duration::from_secs(30);
    loop {
        if let Ok(v) = sh(e, sb, &format!("cat {path} 2>/dev/null")).await {
            return Ok(v);
        }
        ensure!(Instant::now() < deadline, "{path} never appeared");
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}

/// Starts COUNTER in the background; its pid.
async fn start_counter(e: &Engine, sb: &str) -> Result<i32> {
    start_python(e, sb, COUNTER).await
}

async fn counter_state(e: &Engine, sb: &str) -> Result<Vec<String>> {
    Ok(sh(e, sb, "cat /root/state").await?.split_whitespace().map(String::from).collect())
}

/// Rollback in place brings the checkpoint's processes back: same pids and
/// parent, memory, registers, open file offsets, cwd, a shell's variables.
fn processes_come_back_after_rollback(e: &Engine) -> CaseFuture<'_> {
    Box::pin(async move {
        let sb = create(e).await?;
        let pid = start_counter(e, &sb).await?;
        let s = e.create_session(&sb, Default::default()).await?;
        let run = |cmd: &str| SessionRunRequest { command: cmd.into(), timeout_ms: Some(10_000) };
        e.session_run(&sb, &s.id, run("mkdir -p /root/work && cd /root/work && export FOO=bar && X=42")).await?;
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        let r = e.checkpoint(&sb, CheckpointRequest::default()).await?;
        ensure!(r.checkpoint.process_state == sandtree_api::ProcessState::Captured, "{r:?}");
        ensure!(r.checkpoint.processes.len() == 2, "captured {:?}", r.checkpoint.processes);
        let ck = r.checkpoint.id;
        let at_ck = counter_state(e, &sb).await?;
        for round in 0..3 {
            e.session_run(&sb, &s.id, run("cd / && export FOO=baz && X=0")).await?;
            tokio::time::sleep(std::time::Duration::from_millis(300)).await;
            let before = counter_state(e, &sb).await?;
            let n_before: u64 = before[2].parse()?;
            let r = e.rollback(&sb, RollbackRequest { checkpoint: ck.clone(), allow_restart: false }).await?;
            ensure!(!r.processes_restarted, "round {round}: {}", r.note);
            ensure!(r.restored_pids.contains(&pid), "round {round}: restored {:?}", r.restored_pids);
            tokio::time::sleep(std::time::Duration::from_millis(150)).await;
            let after = counter_state(e, &sb).await?;
            let n_after: u64 = after[2].parse()?;
            let n_ck: u64 = at_ck[2].parse()?;
            ensure!(after[0] == pid.to_string() && after[1] == "1", "round {round}: pid/ppid {after:?}");
            ensure!(
                after[3] == "/root/work" && after[4] == at_ck[4],
                "round {round}: cwd/secret {after:?} vs {at_ck:?}"
            );
            ensure!(n_after < n_before && n_after > n_ck, "round {round}: n {n_ck} -> {n_before} -> {n_after}");
            // The log continues right after the checkpoint's offset: 1..n with no gap or hole.
            let log = sh(e, &sb, "cat /root/work/log").await?;
            let nums: Vec<u64> = log.lines().map(|l| l.parse()).collect::<Result<_, _>>().context("log has holes")?;
            ensure!(nums.iter().enumerate().all(|(i, v)| *v == i as u64 + 1), "round {round}: log not consecutive");
            let out = e.session_run(&sb, &s.id, run("echo $(pwd) $FOO $X")).await?;
            ensure!(out.output.trim() == "/root/work bar 42", "round {round}: session {:?}", out.output);
        }
        let procs = e.processes(&sb).await?;
        ensure!(procs.processes.iter().any(|p| p.pid == pid && p.running), "background entry lost");
        e.delete_sandbox(&sb, true).await?;
        Ok(())
    })
}

/// The sandbox's cgroup directory (`cgroup.procs` lists its members).
fn cgroup_dir(sb: &str) -> Result<std::path::PathBuf> {
    ["/sys/fs/cgroup/freezer/sandtree-engine-test", "/sys/fs/cgroup/sandtree-engine-test"]
        .iter()
        .map(|base| std::path::Path::new(base).join(sb))
        .find(|p| p.join("cgroup.procs").exists())
        .context("sandbox cgroup not found")
}

fn cgroup_pids(dir: &std::path::Path) -> Result<Vec<i32>> {
    let text = std::fs::read_to_string(dir.join("cgroup.procs"))?;
    Ok(text.lines().filter_map(|l| l.trim().parse().ok()).collect())
}

/// The pool (templates, standbys, holders) lives in a cgroup of its own,
/// under the sandbox's, whose list init kills from: a process forking as
/// fast as it can when the rollback comes dies with all its children, the
/// templates survive every rollback, and each restored process is back in
/// the sandbox's cgroup (else the next rollback would not kill it).
fn rollback_kills_a_fork_storm_and_spares_the_pool(e: &Engine) -> CaseFuture<'_> {
    Box::pin(async move {
        let sb = create(e).await?;
        // (A shell of its own name: the test's commands run in `sh`.)
        sh(e, &sb, "cp /bin/sh /root/storm").await?;
        let pid = start_counter(e, &sb).await?;
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        let ck = checkpoint(e, &sb).await?;
        let dir = cgroup_dir(&sb)?;
        for round in 0..4 {
            let storm = "while :; do sleep 100 & sleep 0.002; done";
            let bg = ExecRequest {
                cmd: vec!["/root/storm".into(), "-c".into(), storm.into()],
                background: true,
                ..Default::default()
            };
            e.exec(&sb, bg).await?;
            tokio::time::sleep(std::time::Duration::from_millis(150)).await;
            let r = e.rollback(&sb, RollbackRequest { checkpoint: ck.clone(), allow_restart: false }).await?;
            ensure!(!r.processes_restarted, "round {round}: {}", r.note);
            ensure!(r.restored_pids == vec![pid], "round {round}: restored {:?}", r.restored_pids);
            // (Pool processes come and go meanwhile: a pid may vanish.)
            let comms = sh(e, &sb, "cat /proc/[0-9]*/comm 2>/dev/null; true").await?;
            ensure!(!comms.contains("sleep") && !comms.contains("storm"), "round {round}: survivors {comms}");
            let state = counter_state(e, &sb).await?;
            ensure!(state[0] == pid.to_string() && state[1] == "1", "round {round}: counter {state:?}");
            // Init and the counter; no template (an exec's process may
            // still be on its way out for a moment).
            let deadline = Instant::now() + std::time::Duration::from_secs(2);
            let mut members = cgroup_pids(&dir)?;
            while members.len() != 2 && Instant::now() < deadline {
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                members = cgroup_pids(&dir)?;
            }
            ensure!(members.len() == 2, "round {round}: the sandbox's cgroup lists {members:?}");
            let pool = cgroup_pids(&dir.join("pool"))?;
            ensure!(!pool.is_empty(), "round {round}: nothing in the pool's cgroup");
            ensure!(members.iter().all(|m| !pool.contains(m)), "round {round}: {members:?} and {pool:?}");
        }
        e.delete_sandbox(&sb, true).await?;
        // (Removed in the background once the delete returned.)
        let t = std::time::Instant::now();
        while dir.exists() && t.elapsed() < std::time::Duration::from_secs(5) {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        ensure!(!dir.exists(), "cgroup {} left behind", dir.display());
        Ok(())
    })
}

/// A Python holding a half-closed TCP connection (only established ones
/// are captured), with a child.
const HOLDS_A_CONNECTION: &str = r#"
import socket, subprocess, time
s = socket.create_server(('127.0.0.1', 0))
c = socket.create_connection(s.getsockname())
a = s.accept()
c.shutdown(socket.SHUT_WR)
subprocess.Popen(['sleep', '1000'])
time.sleep(1e6)
"#;

/// What the template path cannot restore fails the checkpoint with the
/// process and the reason; best effort marks it instead.
fn unrestorable_processes_are_named(e: &Engine) -> CaseFuture<'_> {
    Box::pin(async move {
        let sb = create(e).await?;
        sh(e, &sb, "echo one > /root/f").await?;
        e.exec(
            &sb,
            ExecRequest {
                cmd: vec!["python3".into(), "-c".into(), HOLDS_A_CONNECTION.into()],
                background: true,
                ..Default::default()
            },
        )
        .await?;
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        let err = e.checkpoint(&sb, CheckpointRequest::default()).await.err().context("checkpoint should fail")?;
        let msg = err.to_string();
        ensure!(err.code() == sandtree_api::ErrorCode::ProcessNotRestorable, "{msg}");
        ensure!(msg.contains("(python3)") && msg.contains("a TCP connection in state"), "{msg}");
        ensure!(e.list_checkpoints(Some(&sb)).await?.checkpoints.is_empty(), "a failed checkpoint was kept");
        // Nothing stays stopped: the sandbox still works.
        sh(e, &sb, "echo two > /root/f").await?;
        let r = e.checkpoint(&sb, CheckpointRequest { best_effort: true, ..Default::default() }).await?;
        ensure!(r.checkpoint.process_state == sandtree_api::ProcessState::Partial, "{r:?}");
        // Best effort: python3 is left out, and its child comes back as a
        // child of init.
        ensure!(r.checkpoint.reparented.iter().any(|u| u.comm == "sleep"), "{r:?}");
        ensure!(r.note.contains("sleep"), "{}", r.note);
        e.delete_sandbox(&sb, true).await?;
        Ok(())
    })
}

/// A process whose own seccomp filter refuses `clone`: its template cannot
/// be made, after calls were already injected into it. The checkpoint
/// fails, and the process runs on with its own signal mask (not the
/// all-blocked one the injected calls ran with).
const NO_CLONE: &str = r#"
import ctypes, signal, struct, time
signal.signal(signal.SIGUSR1, lambda *a: open('/root/got-usr1', 'w').write('yes'))
libc = ctypes.CDLL(None, use_errno=True)
deny = 0x00050000 | 1  # SECCOMP_RET_ERRNO | EPERM
prog = [(0x20, 0, 0, 0)]  # A = syscall number
for nr in (56, 57, 58, 435):  # clone, fork, vfork, clone3
    prog += [(0x15, 0, 1, nr), (0x06, 0, 0, deny)]
prog += [(0x06, 0, 0, 0x7fff0000)]  # allow
buf = ctypes.create_string_buffer(b''.join(struct.pack('HBBI', *i) for i in prog))
fprog = struct.pack('HxxxxxxQ', len(prog), ctypes.addressof(buf))
assert libc.prctl(38, ctypes.c_ulong(1), ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0)) == 0
assert libc.prctl(22, ctypes.c_ulong(2), ctypes.c_char_p(fprog), ctypes.c_ulong(0), ctypes.c_ulong(0)) == 0
open('/root/no-clone-ready', 'w').write('1')
while True:
    time.sleep(0.05)
"#;

fn failed_template_leaves_the_process_intact(e: &Engine) -> CaseFuture<'_> {
    Box::pin(async move {
        let sb = create(e).await?;
        start_python(e, &sb, NO_CLONE).await?;
        sh(e, &sb, "for i in $(seq 100); do test -e /root/no-clone-ready && exit 0; sleep 0.05; done; exit 1").await?;
        let err = e.checkpoint(&sb, CheckpointRequest::default()).await.err().context("checkpoint should fail")?;
        ensure!(err.to_string().contains("clone"), "{err}");
        ensure!(e.list_checkpoints(Some(&sb)).await?.checkpoints.is_empty(), "a failed checkpoint was kept");
        // Its signals are delivered again.
        sh(e, &sb, "pkill -USR1 -f 'no-clone-[r]eady'").await?;
        let got =
            sh(e, &sb, "for i in $(seq 100); do cat /root/got-usr1 2>/dev/null && exit 0; sleep 0.02; done; exit 1")
                .await
                .context("SIGUSR1 was not handled after the failed checkpoint: the process kept an all-blocked mask")?;
        ensure!(got == "yes", "{got:?}");
        e.delete_sandbox(&sb, true).await?;
        Ok(())
    })
}

fn limits_are_applied(e: &Engine) -> CaseFuture<'_> {
    Box::pin(async move {
        let sb = e
            .create_sandbox(CreateSandboxRequest {
                limits: Limits { memory_bytes: Some(64 << 20), pids: Some(32), cpu_millicores: Some(500) },
                ..Default::default()
            })
            .await?
            .sandbox
            .id;
        let out = e
            .exec(
                &sb,
                ExecRequest {
                    cmd: vec!["python3".into(), "-c".into(), "b = bytearray(300 << 20); print('survived')".into()],
                    ..Default::default()
                },
            )
            .await?;
        ensure!(out.exit_code != Some(0) && !out.stdout.contains("survived"), "memory limit not enforced: {out:?}");
        let info = e.get_sandbox(&sb).await?;
        let usage = info.usage.context("usage")?;
        ensure!(usage.pids_limit == Some(32), "{usage:?}");
        // At the task limit a spawn is refused by name, as a client error.
        let sleep = || ExecRequest { cmd: vec!["sleep".into(), "1000".into()], background: true, ..Default::default() };
        let mut refused = None;
        for _ in 0..40 {
            if let Err(err) = e.exec(&sb, sleep()).await {
                refused = Some(err);
                break;
            }
        }
        let err = refused.context("40 processes started in a sandbox limited to 32 tasks")?;
        let api = err.to_api();
        ensure!(api.code == ErrorCode::PidLimitReached && api.code.http_status() == 429, "{api:?}");
        ensure!(api.message.contains("limits.pids") && api.message.contains("--pids"), "{}", api.message);
        e.delete_sandbox(&sb, false).await?;
        Ok(())
    })
}

fn unknown_ids_are_not_found(e: &Engine) -> CaseFuture<'_> {
    Box::pin(async move {
        let err = e.get_sandbox("sb-../../x").await.err().context("expected an error")?;
        ensure!(err.code() == sandtree_api::ErrorCode::SandboxNotFound);
        let sb = create(e).await?;
        let err = e
            .rollback(&sb, RollbackRequest { checkpoint: "ck-zzzzzzzzzz".into(), allow_restart: false })
            .await
            .err()
            .context("err")?;
        ensure!(err.code() == sandtree_api::ErrorCode::CheckpointNotFound);
        let out = e.exec(&sb, ExecRequest { cmd: vec!["no-such-program".into()], ..Default::default() }).await?;
        ensure!(out.exit_code == Some(127), "{out:?}");
        e.delete_sandbox(&sb, false).await?;
        Ok(())
    })
}

fn gc_removes_orphans(e: &Engine) -> CaseFuture<'_> {
    Box::pin(async move {
        let orphan = e.volume().checkpoints_dir().join("ck-orphan0000");
        sandtree_fs::create_subvolume(&orphan)?;
        let report = e.gc().await?;
        ensure!(report.orphans_removed.iter().any(|o| o.contains("ck-orphan0000")), "{report:?}");
        ensure!(!orphan.exists());
        Ok(())
    })
}

/// A task that the freezer cannot freeze (a host helper blocked in a
/// kernel-mode userfaultfd fault, moved into the sandbox's cgroup) makes the
/// freeze time out: the checkpoint fails naming the task, the sandbox is
/// thawed and keeps working, and nothing was stored.
fn stuck_task_makes_checkpoint_fail_cleanly(e: &Engine) -> CaseFuture<'_> {
    Box::pin(async move {
        use std::io::BufRead;
        let sb = create(e).await?;
        let before = e.list_checkpoints(Some(&sb)).await?.checkpoints.len();
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/stuck_task.py");
        let mut helper =
            std::process::Command::new("/usr/bin/python3").arg(script).stdout(std::process::Stdio::piped()).spawn()?;
        let mut line = String::new();
        std::io::BufReader::new(helper.stdout.take().context("stdout")?).read_line(&mut line)?;
        ensure!(line.trim() == "ready", "helper said {line:?}");
        let pid = helper.id();
        let cgroup = ["/sys/fs/cgroup/freezer/sandtree-engine-test", "/sys/fs/cgroup/sandtree-engine-test"]
            .iter()
            .map(|base| std::path::Path::new(base).join(&sb).join("cgroup.procs"))
            .find(|p| p.exists())
            .context("sandbox cgroup not found")?;
        std::fs::write(&cgroup, pid.to_string())?;
        let t = Instant::now();
        let err = e.checkpoint(&sb, CheckpointRequest::default()).await.err();
        let took = t.elapsed();
        helper.kill()?;
        helper.wait()?;
        let err = err.context("checkpoint succeeded although a task could not be frozen")?;
        ensure!(err.code() == sandtree_api::ErrorCode::FreezeTimeout, "{err}");
        ensure!(err.to_string().contains(&format!("pid {pid}")), "{err}");
        ensure!(took.as_secs() < 10, "took {took:?}");
        ensure!(e.list_checkpoints(Some(&sb)).await?.checkpoints.len() == before);
        // Thawed: it works and a checkpoint now succeeds.
        ensure!(sh(e, &sb, "echo alive").await? == "alive\n");
        checkpoint(e, &sb).await?;
        e.delete_sandbox(&sb, true).await?;
        Ok(())
    })
}

/// A process holding 64 MiB that then changes 1,000 pages: its template
/// holds those pages (and its standby none more), not the 64 MiB.
const HOLDER: &str = r#"
import os, time
b = bytearray(64 << 20)
for i in range(0, len(b), 4096):
    b[i] = 1
open('/root/ready', 'w').close()
while not os.path.exists('/root/go'):
    time.sleep(0.01)
for i in range(1000):
    b[i * 16 * 4096] = 2
open('/root/done', 'w').close()
while True:
    time.sleep(1)
"#;

fn template_pool_counts_changed_pages(e: &Engine) -> CaseFuture<'_> {
    Box::pin(async move {
        let sb = create(e).await?;
        start_python(e, &sb, HOLDER).await?;
        let wait_for = |path: &'static str| file_of(e, &sb, path);
        wait_for("/root/ready").await?;
        checkpoint(e, &sb).await?;
        sh(e, &sb, "touch /root/go").await?;
        wait_for("/root/done").await?;
        // Standbys are made between operations: let them be.
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
        let pool = e.template_memory(&sb)?;
        let changed = 1000 * 4096;
        ensure!(
            pool >= changed * 9 / 10 && pool <= 16 << 20,
            "pool holds {pool} bytes after 1,000 pages of a 64 MiB process changed"
        );
        e.delete_sandbox(&sb, true).await?;
        Ok(())
    })
}

/// A checkpoint makes its rollback target's writable copy in its own
/// commit: a rollback right after it (before any spare could be prepared)
/// is exact; GC keeps the copy; deleting the checkpoint deletes it.
fn checkpoint_copy_serves_the_next_rollback(e: &Engine) -> CaseFuture<'_> {
    Box::pin(async move {
        let sb = create(e).await?;
        let layers =
            |sb: &str| -> Result<usize> { Ok(std::fs::read_dir(e.volume().sandboxes_dir().join(sb))?.count()) };
        sh(e, &sb, "echo one > /root/a").await?;
        // A process that cannot move to a new stack (a unix socket bound in
        // the tree) runs: the checkpoint is a snapshot (not a new layer).
        let listener = "import socket, time\ns = socket.socket(socket.AF_UNIX)\ns.bind('/root/sock')\ns.listen()\ntime.sleep(1000)";
        start_python(e, &sb, listener).await?;
        sh(e, &sb, "while [ ! -S /root/sock ]; do sleep 0.01; done").await?;
        let ck = checkpoint(e, &sb).await?;
        let layer = layer_of(e, &ck)?;
        ensure!(layer == format!("checkpoints/{ck}"), "not a snapshot: {layer}");
        // The sandbox's layer and the checkpoint's copy (and the next layer
        // prepared when init was still alone, unused now).
        let after = layers(&sb)?;
        ensure!((2..=3).contains(&after), "{after} layers after a checkpoint");
        sh(e, &sb, "echo two > /root/a && echo x > /root/b").await?;
        // (Other cases' deletions may still be pending: only this
        // sandbox's layers matter here.)
        let report = e.gc().await?;
        ensure!(!report.orphans_removed.iter().any(|o| o.contains(&sb)), "gc removed {:?}", report.orphans_removed);
        // (The next layer may have been prepared since the count: one more.)
        ensure!(layers(&sb)? >= after, "{} layers after gc, {after} before", layers(&sb)?);
        let r = e.rollback(&sb, RollbackRequest { checkpoint: ck.clone(), allow_restart: false }).await?;
        ensure!(!r.processes_restarted, "{}", r.note);
        ensure!(sh(e, &sb, "cat /root/a; test ! -e /root/b && echo nob").await? == "one\nnob\n");
        // A second checkpoint, deleted: its copy goes with it.
        let ck2 = checkpoint(e, &sb).await?;
        e.delete_checkpoint(&ck2, true).await?;
        let deadline = Instant::now() + std::time::Duration::from_secs(20);
        loop {
            let (n, spares) = (layers(&sb)?, e.info().await?.spare_layers);
            // The sandbox's layer, plus at most the rollback's re-wanted
            // spare and the layer prepared for its next checkpoint (put
            // back by this one, which was a snapshot).
            if n <= 2 + spares as usize {
                break;
            }
            ensure!(Instant::now() < deadline, "{n} layers left, {spares} spares");
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        e.delete_sandbox(&sb, true).await?;
        Ok(())
    })
}

/// Layered checkpoints (DeltaFS): with init alone, a checkpoint freezes
/// the writable subvolume as its layer and stacks a new one; rollbacks and
/// forks stack over the checkpoint's layers; layers shared by a stack
/// outlive a deleted checkpoint; deep stacks are squashed; when the
/// sandbox mounted something, a checkpoint is a snapshot instead.
fn layered_checkpoints_stack_and_share_layers(e: &Engine) -> CaseFuture<'_> {
    Box::pin(async move {
        let sb = create(e).await?;
        let rec = |id: &str| e.meta().sandbox(id).map_err(anyhow::Error::from)?.context("sandbox row");
        let ck_rec = |id: &str| e.meta().checkpoint(id).map_err(anyhow::Error::from)?.context("checkpoint row");
        let first = rec(&sb)?.subvol;
        sh(e, &sb, "echo one > /root/a && mkdir /root/d && echo in > /root/d/f").await?;
        let ck1 = checkpoint(e, &sb).await?;
        let c1 = ck_rec(&ck1)?;
        ensure!(c1.layer == format!("sandboxes/{first}") && c1.lowers.is_empty(), "{c1:?}");
        let r = rec(&sb)?;
        ensure!(r.subvol != first && r.lowers == vec![c1.layer.clone()], "{r:?}");
        // A file changed, a directory and an image file removed, a lower
        // directory renamed: whiteouts and redirects in the new layer.
        sh(e, &sb, "echo two >> /root/a && rm -r /root/d && rm /etc/hostname && mv /etc/apt /etc/apt2").await?;
        let ck2 = checkpoint(e, &sb).await?;
        ensure!(ck_rec(&ck2)?.lowers == vec![c1.layer.clone()]);
        sh(e, &sb, "echo three > /root/a && mkdir /root/d && echo again > /root/d/g").await?;
        e.rollback(&sb, RollbackRequest { checkpoint: ck1.clone(), allow_restart: false }).await?;
        let state = "cat /root/a; ls /root/d; test -e /etc/hostname && echo host; test -d /etc/apt && echo apt";
        ensure!(sh(e, &sb, state).await? == "one\nf\nhost\napt\n", "{}", sh(e, &sb, state).await?);
        e.rollback(&sb, RollbackRequest { checkpoint: ck2.clone(), allow_restart: false }).await?;
        let got = sh(e, &sb, "cat /root/a; ls /root/d 2>&1; ls /etc/hostname 2>&1; ls -d /etc/apt2").await?;
        ensure!(got.starts_with("one\ntwo\n") && got.contains("No such file") && got.ends_with("/etc/apt2\n"), "{got}");
        // Forks share the layers and diverge.
        let f =
            e.fork(&ck2, ForkRequest { count: 2, labels: Default::default(), limits: None, files_only: false }).await?;
        let ids: Vec<String> = f.results.iter().filter_map(|r| r.sandbox.as_ref().map(|s| s.id.clone())).collect();
        ensure!(ids.len() == 2, "{:?}", f.results);
        sh(e, &ids[0], "echo mine > /root/a").await?;
        ensure!(sh(e, &ids[1], "cat /root/a").await? == "one\ntwo\n");
        // ck1's layer outlives ck1: ck2 and the forks stack on it.
        e.delete_checkpoint(&ck1, true).await?;
        ensure!(e.volume().root().join(&c1.layer).exists(), "a shared layer was deleted");
        e.gc().await?;
        for layer in e.meta().layers_in_use()? {
            ensure!(e.volume().root().join(&layer).exists(), "gc removed {layer}, which a row names");
        }
        ensure!(sh(e, &ids[1], "cat /root/a").await? == "one\ntwo\n");
        for id in &ids {
            e.delete_sandbox(id, false).await?;
        }
        // A deep chain stays shallow: runs of layers are squashed in the
        // background, and every checkpoint still holds its own files.
        let max = e.config().max_layers;
        let mut chain = Vec::new();
        for i in 0..3 * max {
            let previous = if i > 0 { format!("rm /root/f{}", i - 1) } else { "true".into() };
            sh(e, &sb, &format!("echo {i} > /root/n; echo {i} > /root/f{i}; {previous}")).await?;
            chain.push(checkpoint(e, &sb).await?);
            ensure!(rec(&sb)?.lowers.len() <= max, "{} layers", rec(&sb)?.lowers.len());
        }
        let layers_of_checkpoints: std::collections::HashSet<String> =
            e.meta().checkpoints(None)?.into_iter().map(|c| c.layer).collect();
        let squashed = rec(&sb)?.lowers.iter().any(|l| !layers_of_checkpoints.contains(l));
        ensure!(squashed, "no squashed layer under {:?}", rec(&sb)?.lowers);
        // (A checkpoint that comes while a squash is still under way and the
        // stack is at `max_layers` is a snapshot; after a pause, layered.)
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
        sh(e, &sb, "echo after > /root/after").await?;
        let after = checkpoint(e, &sb).await?;
        ensure!(ck_rec(&after)?.layer.starts_with("sandboxes/"), "not layered: {:?}", ck_rec(&after)?);
        let layered = chain.iter().filter(|c| ck_rec(c).is_ok_and(|r| r.layer.starts_with("sandboxes/"))).count();
        ensure!(layered * 2 > chain.len(), "{layered} of {} checkpoints layered", chain.len());
        for i in [0, max, 2 * max + 1, 3 * max - 1] {
            e.rollback(&sb, RollbackRequest { checkpoint: chain[i].clone(), allow_restart: false }).await?;
            let want = format!("{i}\n{i}\n");
            ensure!(
                sh(e, &sb, &format!("cat /root/n /root/f{i}; ls /root | grep -c '^f'")).await? == format!("{want}1\n")
            );
        }
        // A mount the sandbox made (by a command that exited: init alone)
        // is refused by name; with best effort it would stay behind in the
        // old tree: snapshot.
        e.rollback(&sb, RollbackRequest { checkpoint: ck2.clone(), allow_restart: false }).await?;
        sh(e, &sb, "mkdir -p /mnt/t && mount -t tmpfs none /mnt/t && echo kept > /mnt/t/f").await?;
        let refused = e.checkpoint(&sb, CheckpointRequest::default()).await;
        ensure!(
            refused.as_ref().is_err_and(|err| err.to_string().contains("mount /mnt/t")),
            "a checkpoint with a mount of the sandbox's and init alone not refused: {refused:?}"
        );
        let ck3 = e.checkpoint(&sb, CheckpointRequest { best_effort: true, ..Default::default() }).await?.checkpoint.id;
        ensure!(ck_rec(&ck3)?.layer == format!("checkpoints/{ck3}"));
        ensure!(sh(e, &sb, "cat /mnt/t/f").await? == "kept\n");
        e.delete_sandbox(&sb, true).await?;
        Ok(())
    })
}

/// Layered checkpoints with processes, and templates outliving layered
/// checkpoints: a checkpoint with a process that writes all the time
/// through an open file in its cwd (layered: the process moves to the new
/// stack, and keeps writing there), the process gone, then checkpoints
/// with init alone but for the template (whose root the restack moves): a
/// rollback to the first brings the process back on exactly its files
/// (its log consecutive: nothing it wrote after the checkpoint reached the
/// checkpoint's layer), and one to a later checkpoint brings back only its
/// files.
fn templates_survive_layered_checkpoints(e: &Engine) -> CaseFuture<'_> {
    Box::pin(async move {
        let sb = create(e).await?;
        let pid = start_counter(e, &sb).await?;
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        let with_process = e.checkpoint(&sb, CheckpointRequest::default()).await?.checkpoint;
        ensure!(with_process.processes.len() == 1, "captured {:?}", with_process.processes);
        ensure!(layer_of(e, &with_process.id)?.starts_with("sandboxes/"), "a movable process ran: layered");
        // It goes on in the new stack (cwd and log there).
        let before = counter_state(e, &sb).await?;
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        let now = counter_state(e, &sb).await?;
        ensure!(now[2] != before[2] && now[3] == "/root/work", "{before:?} then {now:?}");
        sh(e, &sb, &format!("kill -9 {pid}; while kill -0 {pid} 2>/dev/null; do sleep 0.01; done")).await?;
        sh(e, &sb, "echo 1 > /root/after").await?;
        let alone = checkpoint(e, &sb).await?;
        ensure!(layer_of(e, &alone)?.starts_with("sandboxes/"), "init alone but for a template: layered");
        sh(e, &sb, "echo 2 > /root/after").await?;
        let alone2 = checkpoint(e, &sb).await?;
        ensure!(layer_of(e, &alone2)?.starts_with("sandboxes/"));
        for round in 0..2 {
            let r =
                e.rollback(&sb, RollbackRequest { checkpoint: with_process.id.clone(), allow_restart: false }).await?;
            ensure!(r.restored_pids == vec![pid], "round {round}: {}", r.note);
            tokio::time::sleep(std::time::Duration::from_millis(150)).await;
            let state = counter_state(e, &sb).await?;
            ensure!(state[0] == pid.to_string() && state[3] == "/root/work", "round {round}: {state:?}");
            ensure!(sh(e, &sb, "test ! -e /root/after && echo none").await? == "none\n", "round {round}");
            let log = sh(e, &sb, "cat /root/work/log").await?;
            let nums: Vec<u64> = log.lines().map(|l| l.parse()).collect::<Result<_, _>>().context("log has holes")?;
            ensure!(nums.iter().enumerate().all(|(i, v)| *v == i as u64 + 1), "round {round}: log not consecutive");
            let r = e.rollback(&sb, RollbackRequest { checkpoint: alone.clone(), allow_restart: false }).await?;
            ensure!(!r.processes_restarted && r.restored_pids.is_empty(), "round {round}: {}", r.note);
            ensure!(sh(e, &sb, "cat /root/after").await? == "1\n", "round {round}");
            // (Its template shows in /proc, stopped: nothing counts.)
            let before = sh(e, &sb, "cat /root/state").await?;
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            ensure!(
                sh(e, &sb, "cat /root/state").await? == before,
                "round {round}: the process runs in a checkpoint without it"
            );
        }
        e.delete_sandbox(&sb, true).await?;
        Ok(())
    })
}

/// A process large enough that forking it takes milliseconds, in 4 KiB
/// pages (a template's standby fork is then still running when the next
/// rollback swaps the root).
const BIG: &str = r#"
import mmap, time
b = mmap.mmap(-1, 160 << 20, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
b.madvise(mmap.MADV_NOHUGEPAGE)
for off in range(0, len(b), 4096):
    b[off] = 1
open('/root/big-ready', 'w').close()
while True:
    time.sleep(1)
"#;

/// Every restored process sees the rolled-back tree: its root is init's
/// (and that of a process init spawns).
/// Rollbacks back to back, A B A ...: after a rollback to A its template
/// forks a new standby between operations, while the rollback to B swaps
/// the root. A fork copies its parent's root before it joins the task
/// list `pivot_root` walks: a standby that straddled the swap kept the
/// old, detached tree, and the next rollback to A brought the process
/// back in it (its files stale; the next checkpoint said "a root of its
/// own" and took a snapshot). Such a standby is dropped and made again.
fn restored_processes_share_the_new_root(e: &Engine) -> CaseFuture<'_> {
    Box::pin(async move {
        let sb = create(e).await?;
        let pid = start_python(e, &sb, BIG).await?;
        sh(e, &sb, "while [ ! -e /root/big-ready ]; do sleep 0.02; done").await?;
        let a = checkpoint(e, &sb).await?;
        let b = checkpoint(e, &sb).await?;
        let same_root =
            format!("[ \"$(stat -L -c %d:%i /proc/{pid}/root/)\" = \"$(stat -L -c %d:%i /proc/self/root/)\" ]");
        for round in 0..8 {
            for ck in [&a, &b, &a] {
                let r = e.rollback(&sb, RollbackRequest { checkpoint: ck.clone(), allow_restart: false }).await?;
                ensure!(r.restored_pids == vec![pid], "round {round}: {}", r.note);
            }
            let out = e
                .exec(&sb, ExecRequest { cmd: vec!["sh".into(), "-c".into(), same_root.clone()], ..Default::default() })
                .await?;
            ensure!(out.exit_code == Some(0), "round {round}: the restored process has a root of its own");
        }
        let layered = e.checkpoint(&sb, CheckpointRequest::default()).await?.checkpoint;
        let layer = layer_of(e, &layered.id)?;
        ensure!(layer.starts_with("sandboxes/"), "the checkpoint after the rollbacks is a snapshot: {layer}");
        e.delete_sandbox(&sb, true).await?;
        Ok(())
    })
}

/// A rollback whose restored pid is held, when it comes, by a child of a
/// process that ignores SIGCHLD: the kernel reaps that child itself when
/// it dies before its parent (init never sees it), and the pid then names
/// the restored process. Init must not wait for it as if it were the
/// killed original. (The child holds 100 MB and the parent 400 MB: the
/// child is still dying when init first looks, and dies before its
/// parent, whose teardown takes longer.)
fn restored_pid_reaped_by_the_kernel(e: &Engine) -> CaseFuture<'_> {
    Box::pin(async move {
        let sb = create(e).await?;
        let pid = start_python(e, &sb, "import time\nwhile True: time.sleep(1)").await?;
        let ck = checkpoint(e, &sb).await?;
        sh(e, &sb, &format!("kill -9 {pid}; while kill -0 {pid} 2>/dev/null; do sleep 0.01; done")).await?;
        // Any process made in the sandbox between the write to ns_last_pid
        // and the fork takes the pid: the parent tries again then. The
        // waiter below is one shell blocked on a fifo (a polling loop would
        // fork all the time).
        sh(e, &sb, "mkfifo /root/forked").await?;
        let parent = format!(
            "import os, signal, time\nsignal.signal(signal.SIGCHLD, signal.SIG_IGN)\n\
             while True:\n    open('/proc/sys/kernel/ns_last_pid', 'w').write('{}')\n    c = os.fork()\n\
             \x20   if c == 0:\n        if os.getpid() != {pid}:\n            os._exit(0)\n\
             \x20       heavy = b'x' * (100 << 20)\n        time.sleep(1000)\n\
             \x20   if c == {pid}:\n        break\n    time.sleep(0.01)\n\
             heavy = b'x' * (400 << 20)\nopen('/root/forked', 'w').write(str(c))\ntime.sleep(1000)",
            pid - 1
        );
        start_python(e, &sb, &parent).await?;
        let forked = sh(e, &sb, "read c < /root/forked; echo $c").await?;
        ensure!(forked.trim() == pid.to_string(), "the child got pid {forked}, not {pid}");
        let t = Instant::now();
        let r = e.rollback(&sb, RollbackRequest { checkpoint: ck, allow_restart: false }).await?;
        ensure!(r.restored_pids == vec![pid] && !r.processes_restarted, "{}", r.note);
        ensure!(t.elapsed() < std::time::Duration::from_secs(1), "the rollback took {:?}", t.elapsed());
        ensure!(sh(e, &sb, &format!("kill -0 {pid} && echo up")).await? == "up\n");
        e.delete_sandbox(&sb, true).await?;
        Ok(())
    })
}

/// The checkpoint's copies of a process are processes of the sandbox:
/// killed from inside it (`ps` lists them, `kill` reaches them), the
/// rollback brings the process back from the checkpoint's durable image,
/// and says so. Without a usable image (deleted here), the rollback must
/// refuse, name the process and the image's state, and change nothing;
/// with `allow_restart` it restores the files alone and says so.
fn killed_checkpoint_copies_come_back_from_the_image(e: &Engine) -> CaseFuture<'_> {
    Box::pin(async move {
        let sb = create(e).await?;
        let pid = start_python(e, &sb, "import time\nmarker = 'copies-killed'\nwhile True: time.sleep(1)").await?;
        let req = CheckpointRequest { wait_durable: true, ..Default::default() };
        let ck = e.checkpoint(&sb, req).await?.checkpoint.id;
        // Every python3 but the original: its template and standby.
        let kill_copies =
            format!("for p in $(pgrep -x python3); do [ $p = {pid} ] || {{ kill -9 $p; echo $p; }}; done");
        sh(e, &sb, "echo after > /root/after").await?;
        ensure!(
            !sh(e, &sb, &kill_copies).await?.trim().is_empty(),
            "no checkpoint copy of {pid} was found in the sandbox"
        );
        let r = e.rollback(&sb, RollbackRequest { checkpoint: ck.clone(), allow_restart: false }).await?;
        ensure!(r.restored_pids == vec![pid] && r.restored_from == Some(RestoreSource::Image), "{r:?}");
        ensure!(r.note.contains("durable process image") && r.note.contains("killed"), "{}", r.note);
        ensure!(sh(e, &sb, &format!("kill -0 {pid} && test ! -e /root/after && echo back")).await? == "back\n");
        // Killed again, and the image gone.
        sh(e, &sb, "echo after > /root/after").await?;
        ensure!(!sh(e, &sb, &kill_copies).await?.trim().is_empty(), "no checkpoint copy of {pid} after the restore");
        std::fs::remove_file(sandtree_proc::durable::image_path(&e.process_images_dir(), &ck))?;
        let err = e.rollback(&sb, RollbackRequest { checkpoint: ck.clone(), allow_restart: false }).await.err();
        let err = err.context("a rollback whose processes were killed answered success")?;
        let msg = err.to_string();
        ensure!(err.code() == ErrorCode::ProcessesLost, "{msg}");
        ensure!(msg.contains(&format!("{pid} (python3)")) && msg.contains("killed"), "{msg}");
        ensure!(
            msg.contains("process image") && msg.contains(&ck),
            "the refusal does not say why the image cannot serve: {msg}"
        );
        // Nothing changed: the process runs, the later file is there.
        ensure!(sh(e, &sb, &format!("kill -0 {pid} && cat /root/after")).await? == "after\n");
        let r = e.rollback(&sb, RollbackRequest { checkpoint: ck, allow_restart: true }).await?;
        ensure!(r.processes == ProcessOutcome::Restarted && r.processes_restarted, "{r:?}");
        ensure!(r.note.contains("killed"), "{}", r.note);
        ensure!(sh(e, &sb, "test ! -e /root/after && echo gone").await? == "gone\n");
        e.delete_sandbox(&sb, true).await?;
        Ok(())
    })
}

/// A program holding files of the tree in every way a layered checkpoint
/// must move: a file opened read-write and its dup (one offset), one opened
/// for appending, a file of a lower layer opened read-only at an offset and
/// one opened read-write (reopening it copies it up), a directory, its cwd.
/// It writes through all of them once told to.
const FILE_HOLDER: &str = r#"
import os, time
os.makedirs('/root/d', exist_ok=True)
os.chdir('/root/d')
a = os.open('/root/d/a', os.O_RDWR | os.O_CREAT | os.O_TRUNC)
os.write(a, b'0123456789'); os.lseek(a, 4, 0)
b = os.dup(a)
ap = os.open('/root/app', os.O_WRONLY | os.O_CREAT | os.O_APPEND)
ro = os.open('/root/lower-ro', os.O_RDONLY); os.read(ro, 5)
dfd = os.open('/root/d', os.O_RDONLY | os.O_DIRECTORY)
open('/root/ready', 'w').close()
while not os.path.exists('/root/go'):
    time.sleep(0.005)
os.write(a, b'AB'); os.write(b, b'C'); os.write(ap, b'x\n')
pos = os.lseek(ro, 0, os.SEEK_CUR)
open('rel', 'w').close()
with open('/root/report', 'w') as f:
    f.write(f'{pos} {os.getcwd()} {sorted(os.listdir(dfd))}')
open('/root/done', 'w').close()
while True:
    time.sleep(1)
"#;

/// A layered checkpoint with a process holding files of the tree
/// (FILE_HOLDER):
/// the process goes on in the new stack through every one of them (offsets,
/// the shared one of a dup, append mode), nothing it writes
/// after the checkpoint reaches the checkpoint, and a rollback brings the
/// process back on exactly the checkpoint's files, where it does the same.
/// With a copied-up file open for writing, a file of the writable layer
/// mapped shared, or a mount the sandbox made, the checkpoint is a
/// snapshot instead.
fn layered_checkpoint_moves_open_files(e: &Engine) -> CaseFuture<'_> {
    Box::pin(async move {
        let sb = create(e).await?;
        // Files of a lower layer: written, then frozen by a checkpoint.
        sh(e, &sb, "echo -n abcdefghij > /root/lower-ro && echo -n lowerfile > /root/lower-rw").await?;
        checkpoint(e, &sb).await?;
        start_python(e, &sb, FILE_HOLDER).await?;
        sh(e, &sb, "while [ ! -e /root/ready ]; do sleep 0.01; done").await?;
        let ck = checkpoint(e, &sb).await?;
        let layer = layer_of(e, &ck)?;
        ensure!(layer.starts_with("sandboxes/"), "not layered: {layer}");
        let run = "touch /root/go; while [ ! -e /root/done ]; do sleep 0.01; done; \
                   cat /root/d/a; echo; cat /root/app /root/lower-rw; echo; cat /root/report; echo; ls /root/d";
        let want = "0123ABC789\nx\nlowerfile\n5 /root/d ['a', 'rel']\na\nrel\n";
        let got = sh(e, &sb, run).await?;
        ensure!(got == want, "after the checkpoint: {got:?}");
        for round in 0..2 {
            let r = e.rollback(&sb, RollbackRequest { checkpoint: ck.clone(), allow_restart: false }).await?;
            ensure!(!r.processes_restarted && r.restored_pids.len() == 1, "round {round}: {}", r.note);
            let clean = "cat /root/d/a; echo; cat /root/app /root/lower-rw; echo; ls /root/d; \
                         test ! -e /root/go && test ! -e /root/done && echo clean";
            let got = sh(e, &sb, clean).await?;
            ensure!(got == "0123456789\nlowerfile\na\nclean\n", "round {round}, rolled back: {got:?}");
            let got = sh(e, &sb, run).await?;
            ensure!(got == want, "round {round}, after the rollback: {got:?}");
        }
        // A file of a lower layer open for writing was copied up into the
        // writable layer, and would be again, from there, into the new
        // one: its inode number would change (SQLite takes its database
        // for moved then). That checkpoint is a snapshot.
        let other = create(e).await?;
        sh(e, &other, "echo -n lowerfile > /root/lower-rw").await?;
        checkpoint(e, &other).await?;
        // (Each layer numbers its inodes from the same start: files made
        // first, so that the copy's number is not the original's by chance.)
        sh(e, &other, "mkdir -p /root/n && touch /root/n/1 /root/n/2 /root/n/3 /root/n/4").await?;
        // A process before the holder moves its cwd into the staged tree
        // before the holder's reopen fails: it must be moved back, or
        // what it writes by a relative path would go to a tree that is
        // gone.
        let mover = "import os, time\nos.chdir('/root/n')\nopen('/root/moved', 'w').close()\n\
                     while not os.path.exists('go'):\n    time.sleep(0.01)\nopen('out', 'w').write('here')\n\
                     time.sleep(1000)\n";
        start_python(e, &other, mover).await?;
        sh(e, &other, "while [ ! -e /root/moved ]; do sleep 0.01; done").await?;
        let holder = "exec 7<>/root/lower-rw; echo $$ > /root/ready; exec sleep 1000";
        let req = ExecRequest {
            cmd: vec!["bash".into(), "-c".into(), holder.into()],
            background: true,
            ..Default::default()
        };
        e.exec(&other, req).await?;
        sh(e, &other, "while [ ! -s /root/ready ]; do sleep 0.01; done").await?;
        let ino = "stat -L -c %i /proc/$(cat /root/ready)/fd/7";
        let before = sh(e, &other, ino).await?;
        let snap = checkpoint(e, &other).await?;
        let layer = layer_of(e, &snap)?;
        ensure!(layer == format!("checkpoints/{snap}"), "a copied-up file open for writing, yet layered: {layer}");
        ensure!(sh(e, &other, ino).await? == before, "the open file's inode number changed");
        let out = "touch /root/n/go; for i in $(seq 500); do [ -s /root/n/out ] && break; sleep 0.01; done; \
                   cat /root/n/out";
        let got = sh(e, &other, out).await?;
        ensure!(got == "here", "a process's cwd was not moved back from the staged tree: {got:?}");
        e.delete_sandbox(&other, true).await?;
        // A file of the writable layer mapped shared (read-only, no
        // descriptor left): the mapping would stay on the frozen file
        // while writes through the tree go to a copy in the new layer.
        // (The overlay reports its own device for it, `map_files` too:
        // the check looks in the upper directory.) A snapshot.
        let mapped = create(e).await?;
        let mapper = "import mmap, time\nopen('/root/m', 'w').write('x' * 4096)\nf = open('/root/m', 'rb')\n\
                      m = mmap.mmap(f.fileno(), 0, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)\nf.close()\n\
                      open('/root/ready', 'w').close()\nwhile True:\n    time.sleep(1)\n";
        start_python(e, &mapped, mapper).await?;
        sh(e, &mapped, "while [ ! -e /root/ready ]; do sleep 0.01; done").await?;
        let snap = checkpoint(e, &mapped).await?;
        let layer = layer_of(e, &snap)?;
        ensure!(
            layer == format!("checkpoints/{snap}"),
            "a file of the writable layer mapped shared, yet layered: {layer}"
        );
        e.delete_sandbox(&mapped, true).await?;
        // A mount the sandbox made: a rollback would lose it, so a
        // checkpoint with processes is refused, naming it; with best
        // effort it is taken, the mount named as not restorable, and init
        // refuses to stage (the mount would stay behind in the old tree):
        // the checkpoint of the stopped processes is a snapshot, and a
        // rollback to it brings the process back.
        sh(e, &sb, "mkdir -p /mnt/t && mount -t tmpfs none /mnt/t").await?;
        let refused = e.checkpoint(&sb, CheckpointRequest::default()).await;
        ensure!(
            refused.as_ref().is_err_and(|err| err.to_string().contains("mount /mnt/t")),
            "a checkpoint with a mount of the sandbox's not refused: {refused:?}"
        );
        let taken = e.checkpoint(&sb, CheckpointRequest { best_effort: true, ..Default::default() }).await?;
        ensure!(
            taken.checkpoint.unrestorable.iter().any(|u| u.resource == "mount /mnt/t"),
            "the mount is not named: {:?}",
            taken.checkpoint.unrestorable
        );
        let snap = taken.checkpoint.id;
        let layer = layer_of(e, &snap)?;
        ensure!(layer == format!("checkpoints/{snap}"), "not a snapshot: {layer}");
        let r = e.rollback(&sb, RollbackRequest { checkpoint: snap, allow_restart: false }).await?;
        ensure!(!r.processes_restarted && r.restored_pids.len() == 1, "{}", r.note);
        ensure!(sh(e, &sb, "cat /root/d/a").await? == "0123ABC789");
        e.delete_sandbox(&sb, true).await?;
        Ok(())
    })
}

/// A tracked process (64 MiB) whose step `k` writes `k` into 1,000 pages;
/// it answers `/root/query` with its step and a sum over every page.
const STEPPER: &str = r#"
import os, time
b = bytearray(64 << 20)
for i in range(0, len(b), 4096):
    b[i] = 1
step = 0
def put(path, text):
    with open(path + '.tmp', 'w') as f:
        f.write(text)
    os.rename(path + '.tmp', path)
put('/root/ready', '')
while True:
    if os.path.exists('/root/step'):
        os.unlink('/root/step')
        step += 1
        for i in range(1000):
            b[(i * 16 + step) * 4096] = step
        put('/root/at', str(step))
    elif os.path.exists('/root/query'):
        os.unlink('/root/query')
        put('/root/answer', f'{step} {sum(b[::4096])}')
    else:
        time.sleep(0.005)
"#;

/// Checkpoints of a tracked process past the longest chain of templates
/// made from standbys (`incremental::MAX_GENERATION`, after which a
/// checkpoint forks the process again) each restore its exact memory, in
/// any order.
fn long_chain_of_checkpoints_restores_each(e: &Engine) -> CaseFuture<'_> {
    Box::pin(async move {
        let sb = create(e).await?;
        start_python(e, &sb, STEPPER).await?;
        let wait_for = |path: &'static str| file_of(e, &sb, path);
        wait_for("/root/ready").await?;
        let steps = 19u64;
        let mut cks = Vec::new();
        for k in 1..=steps {
            sh(e, &sb, "rm -f /root/at && touch /root/step").await?;
            let at = wait_for("/root/at").await?;
            ensure!(at == k.to_string(), "step {k}: the process says {at}");
            // (Standbys are made between operations.)
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            let r = e.checkpoint(&sb, CheckpointRequest::default()).await?;
            ensure!(r.checkpoint.process_state == sandtree_api::ProcessState::Captured, "{r:?}");
            cks.push(r.checkpoint.id);
        }
        // Its holder copied the pages written in the frozen windows (or
        // this test would not see that path): not all through
        // process_vm_readv.
        let by_holders = e.process_stats().pages_copied_by_holders;
        ensure!(by_holders >= 1000, "holders copied {by_holders} pages in 19 checkpoints");
        // The sum the process computes after step k, by the same writes.
        let expected = |k: u64| {
            let mut pages = vec![1u64; 16384];
            for step in 1..=k {
                for i in 0..1000 {
                    pages[(i * 16 + step) as usize] = step;
                }
            }
            pages.iter().sum::<u64>()
        };
        for k in [3u64, 19, 1, 9, 10, 5, 18, 2, 11, 6, 17, 4, 8, 19, 3] {
            let r = e
                .rollback(&sb, RollbackRequest { checkpoint: cks[k as usize - 1].clone(), allow_restart: false })
                .await?;
            ensure!(!r.processes_restarted, "rollback to {k}: {}", r.note);
            sh(e, &sb, "touch /root/query").await?;
            let answer = wait_for("/root/answer").await?;
            ensure!(answer == format!("{k} {}", expected(k)), "rolled back to step {k}: the process says {answer}");
        }
        e.delete_sandbox(&sb, true).await?;
        Ok(())
    })
}

/// A process blocked on a FIFO with a count in memory; each line written
/// to `/root/in` ("inc" or "get") makes it write its count to `/root/out`.
const WAITER: &str = r#"
import os
n = 0
os.mkfifo('/root/in')
def put(text):
    with open('/root/out.tmp', 'w') as f:
        f.write(text)
    os.rename('/root/out.tmp', '/root/out')
put('ready')
while True:
    fd = os.open('/root/in', os.O_RDONLY)
    cmd = os.read(fd, 64).decode().strip()
    os.close(fd)
    if cmd == 'inc':
        n += 1
    put(str(n))
"#;

/// Checkpoints of a process that ran no code since the one before make
/// its template from that one's standby without copying anything or
/// injecting a call (`incremental.rs`, "quiet"), and a rollback to them
/// brings it back as it was: waiting on its FIFO with its count.
fn idle_process_templates_from_standbys(e: &Engine) -> CaseFuture<'_> {
    Box::pin(async move {
        let sb = create(e).await?;
        start_python(e, &sb, WAITER).await?;
        ensure!(file_of(e, &sb, "/root/out").await? == "ready", "the waiter did not start");
        let send = |cmd: &'static str| {
            let sb = sb.clone();
            async move {
                sh(e, &sb, &format!("rm -f /root/out && echo {cmd} > /root/in")).await?;
                file_of(e, &sb, "/root/out").await
            }
        };
        ensure!(send("inc").await? == "1", "first count");
        let before = e.process_stats().quiet_templates;
        let mut cks = Vec::new();
        for _ in 0..3 {
            // (Standbys are made between operations.)
            tokio::time::sleep(std::time::Duration::from_millis(150)).await;
            let r = e.checkpoint(&sb, CheckpointRequest::default()).await?;
            ensure!(r.checkpoint.process_state == sandtree_api::ProcessState::Captured, "{r:?}");
            cks.push(r.checkpoint.id);
        }
        let quiet = e.process_stats().quiet_templates - before;
        ensure!(quiet >= 2, "{quiet} of 3 checkpoints of an idle process made its template from a standby");
        ensure!(send("inc").await? == "2", "count after the checkpoints");
        for ck in [&cks[2], &cks[1], &cks[0], &cks[2]] {
            let r = e.rollback(&sb, RollbackRequest { checkpoint: ck.clone(), allow_restart: false }).await?;
            ensure!(!r.processes_restarted, "rollback to {ck}: {}", r.note);
            ensure!(send("get").await? == "1", "count after the rollback to {ck}");
        }
        ensure!(send("inc").await? == "2", "count after an increment once rolled back");
        e.delete_sandbox(&sb, true).await?;
        Ok(())
    })
}

/// A process of 48 MiB that binds a unix socket in the tree on "bind"
/// (it cannot move to a new tree then) and closes it on "unbind", sends
/// itself a deleted file over a socket pair on "hold" (its capture is
/// refused then: a deleted file in flight) and receives it on "drop", acking each command in
/// `/root/big_out`.
const BINDER: &str = r#"
import os, socket
data = bytearray(os.urandom(1 << 20)) * 48
os.mkfifo('/root/big_in')
a, b = socket.socketpair()
s = None
def put(text):
    with open('/root/big_out.tmp', 'w') as f:
        f.write(text)
    os.rename('/root/big_out.tmp', '/root/big_out')
put('ready')
empty = 0
while True:
    fd = os.open('/root/big_in', os.O_RDONLY)
    cmd = os.read(fd, 64).decode().strip()
    os.close(fd)
    # (Seen once in CI, not reproduced: an end of file with no command,
    # as if a writer came and went without writing. Counted, and waited
    # past, so that the case tests what it is about.)
    if not cmd:
        empty += 1
        with open('/root/big_empty', 'w') as f:
            f.write(str(empty))
        continue
    if cmd == 'bind':
        s = socket.socket(socket.AF_UNIX)
        s.bind('/root/sock')
        s.listen()
    elif cmd == 'unbind':
        s.close()
        os.unlink('/root/sock')
    elif cmd == 'hold':
        f = os.open('/root/held', os.O_CREAT | os.O_RDWR)
        os.unlink('/root/held')
        socket.send_fds(a, [b'x'], [f])
        os.close(f)
    elif cmd == 'drop':
        for fd in socket.recv_fds(b, 1, 1)[1]:
            os.close(fd)
    put(cmd + ' ' + str(len(data)))
"#;

/// [`BINDER`] and [`PONGER`] started in sandbox `sb`, and ready.
async fn start_binder_and_ponger(e: &Engine, sb: &str) -> Result<()> {
    start_python(e, sb, BINDER).await?;
    start_python(e, sb, PONGER).await?;
    ensure!(file_of(e, sb, "/root/big_out").await? == "ready", "the binder did not start");
    ensure!(ping(e, sb).await? == "/root/d", "the ponger did not start");
    Ok(())
}

/// [`BINDER`]'s answer to `cmd`.
async fn binder(e: &Engine, sb: &str, cmd: &str) -> Result<String> {
    sh(e, sb, &format!("rm -f /root/big_out && echo {cmd} > /root/big_in")).await?;
    file_of(e, sb, "/root/big_out").await
}

/// The start of a round of the early-move cases: from the second round
/// on, [`BINDER`] `undo`es what the last round set up; then a checkpoint
/// that must be layered (every process can move); then the binder sets up
/// `arm` for the round's own checkpoint. Returns the early-move counter
/// before that one.
async fn arm_round(e: &Engine, sb: &str, round: usize, (undo, arm): (&str, &str), size: usize) -> Result<u64> {
    if round > 0 {
        ensure!(binder(e, sb, undo).await? == format!("{undo} {size}"), "{undo}");
    }
    let ck = checkpoint(e, sb).await?;
    ensure!(layer_of(e, &ck)?.starts_with("sandboxes/"), "round {round}: not layered: {}", layer_of(e, &ck)?);
    ensure!(binder(e, sb, arm).await? == format!("{arm} {size}"), "{arm}");
    Ok(e.process_stats().moved_early)
}

/// [`PONGER`]'s answer to a ping: its cwd.
async fn ping(e: &Engine, sb: &str) -> Result<String> {
    sh(e, sb, "rm -f /root/d/pong && touch /root/d/ping").await?;
    file_of(e, sb, "/root/d/pong").await
}

/// Says so when [`BINDER`] met an end of file with no command.
async fn note_empty_reads(e: &Engine, sb: &str) {
    if let Ok(n) = sh(e, sb, "cat /root/big_empty 2>/dev/null").await {
        println!("note: the binder read its FIFO empty {} time(s)", n.trim());
    }
}

/// A small process whose cwd is in the tree: each `ping` file there makes
/// it write its cwd to `pong`.
const PONGER: &str = r#"
import os, time
os.makedirs('/root/d', exist_ok=True)
os.chdir('/root/d')
while True:
    time.sleep(0.01)
    if os.path.exists('ping'):
        os.unlink('ping')
        with open('pong.tmp', 'w') as f:
            f.write(os.getcwd())
        os.rename('pong.tmp', 'pong')
"#;

/// In a layered checkpoint, every process but the largest moves to the
/// staged tree while the largest one is copied. When the largest cannot
/// move (a unix socket bound in the tree), the checkpoint is a snapshot
/// and the others go back to the old tree: they work on with their cwd,
/// and a rollback to that checkpoint brings both back.
fn early_moved_processes_go_back(e: &Engine) -> CaseFuture<'_> {
    Box::pin(async move {
        let sb = create(e).await?;
        start_binder_and_ponger(e, &sb).await?;
        let size = 48 << 20;
        let mut fallbacks = Vec::new();
        let mut went_back = false;
        // (Whether the tree is staged before the small process is cloned
        // is a matter of timing: a few rounds.)
        for round in 0..8 {
            // Movable: layered, and the next checkpoint stages its tree
            // while the processes are copied (betting they still can move).
            let before = arm_round(e, &sb, round, ("unbind", "bind"), size).await?;
            let ck = checkpoint(e, &sb).await?;
            ensure!(
                layer_of(e, &ck)? == format!("checkpoints/{ck}"),
                "round {round}: not a snapshot: {}",
                layer_of(e, &ck)?
            );
            ensure!(ping(e, &sb).await? == "/root/d", "round {round}: the small process lost its cwd");
            fallbacks.push(ck);
            if e.process_stats().moved_early > before {
                went_back = true;
                break;
            }
        }
        ensure!(went_back, "no snapshot checkpoint had moved a process while the largest was copied");
        for ck in fallbacks.iter().rev() {
            let r = e.rollback(&sb, RollbackRequest { checkpoint: ck.clone(), allow_restart: false }).await?;
            ensure!(!r.processes_restarted, "rollback to {ck}: {}", r.note);
            ensure!(ping(e, &sb).await? == "/root/d", "after the rollback to {ck}: the small process");
            ensure!(binder(e, &sb, "get").await? == format!("get {size}"), "after the rollback to {ck}: the binder");
        }
        note_empty_reads(e, &sb).await;
        e.delete_sandbox(&sb, true).await?;
        Ok(())
    })
}

/// A checkpoint whose largest process is refused after the others moved
/// to the staged tree while it was copied (a deleted file in flight on its
/// socket pair) fails with the reason, and the others go back: they work
/// on with their cwd, and the next checkpoint moves them again.
fn refused_largest_moves_the_others_back(e: &Engine) -> CaseFuture<'_> {
    Box::pin(async move {
        let sb = create(e).await?;
        start_binder_and_ponger(e, &sb).await?;
        let size = 48 << 20;
        let mut went_back = false;
        for round in 0..8 {
            let before = arm_round(e, &sb, round, ("drop", "hold"), size).await?;
            let refused = e.checkpoint(&sb, CheckpointRequest::default()).await;
            let Err(err) = refused else { anyhow::bail!("round {round}: a deleted file in flight was checkpointed") };
            ensure!(err.to_string().contains("in flight"), "round {round}: {err}");
            ensure!(ping(e, &sb).await? == "/root/d", "round {round}: the small process lost its cwd");
            if e.process_stats().moved_early > before {
                went_back = true;
                break;
            }
        }
        ensure!(went_back, "no refused checkpoint had moved a process while the largest was copied");
        ensure!(binder(e, &sb, "drop").await? == format!("drop {size}"), "drop");
        let ck = checkpoint(e, &sb).await?;
        ensure!(layer_of(e, &ck)?.starts_with("sandboxes/"), "after the refusal: not layered: {}", layer_of(e, &ck)?);
        ensure!(ping(e, &sb).await? == "/root/d", "after the next checkpoint: the small process");
        let r = e.rollback(&sb, RollbackRequest { checkpoint: ck.clone(), allow_restart: false }).await?;
        ensure!(!r.processes_restarted, "{}", r.note);
        ensure!(ping(e, &sb).await? == "/root/d", "after the rollback: the small process");
        ensure!(binder(e, &sb, "get").await? == format!("get {size}"), "after the rollback: the binder");
        note_empty_reads(e, &sb).await;
        e.delete_sandbox(&sb, true).await?;
        Ok(())
    })
}

fn main() {
    let cases: Vec<(&str, Case)> = vec![
        ("refused_largest_moves_the_others_back", refused_largest_moves_the_others_back),
        ("early_moved_processes_go_back", early_moved_processes_go_back),
        ("idle_process_templates_from_standbys", idle_process_templates_from_standbys),
        ("rollback_and_fork_restore_files", rollback_and_fork_restore_files),
        ("rollback_in_place_keeps_init_and_kills_the_rest", rollback_in_place_keeps_init_and_kills_the_rest),
        ("processes_come_back_after_rollback", processes_come_back_after_rollback),
        ("rollback_kills_a_fork_storm_and_spares_the_pool", rollback_kills_a_fork_storm_and_spares_the_pool),
        ("template_pool_counts_changed_pages", template_pool_counts_changed_pages),
        ("checkpoint_copy_serves_the_next_rollback", checkpoint_copy_serves_the_next_rollback),
        ("unrestorable_processes_are_named", unrestorable_processes_are_named),
        ("failed_template_leaves_the_process_intact", failed_template_leaves_the_process_intact),
        ("limits_are_applied", limits_are_applied),
        ("unknown_ids_are_not_found", unknown_ids_are_not_found),
        ("gc_removes_orphans", gc_removes_orphans),
        ("stuck_task_makes_checkpoint_fail_cleanly", stuck_task_makes_checkpoint_fail_cleanly),
        ("layered_checkpoints_stack_and_share_layers", layered_checkpoints_stack_and_share_layers),
        ("templates_survive_layered_checkpoints", templates_survive_layered_checkpoints),
        ("layered_checkpoint_moves_open_files", layered_checkpoint_moves_open_files),
        ("restored_processes_share_the_new_root", restored_processes_share_the_new_root),
        ("restored_pid_reaped_by_the_kernel", restored_pid_reaped_by_the_kernel),
        ("killed_checkpoint_copies_come_back_from_the_image", killed_checkpoint_copies_come_back_from_the_image),
        ("long_chain_of_checkpoints_restores_each", long_chain_of_checkpoints_restores_each),
    ];
    common::run("sandtree-engine-test", "sandtree-engine-test", |cfg| cfg.freeze_timeout_ms = 500, cases);
}
