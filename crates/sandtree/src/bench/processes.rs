//! The process workload: checkpoint and rollback of a sandbox whose live
//! processes matter.
//!
//! The sandbox runs a session shell (bash on a pty, with a variable and a
//! cwd), a Python "REPL" (a background python3 holding `--repl-mb` of data
//! in a buffer allocated as numpy does, with `MADV_HUGEPAGE`, plus 100,000
//! small live objects; it takes commands on 127.0.0.1:9000) and
//! `python3 -m http.server` on 127.0.0.1:8000. Each step dirties 10 files
//! and 1,000 random pages of the REPL's buffer, then checkpoints; then
//! rollbacks go to random checkpoints of the run (half of them after 100
//! ms of the agent's thinking); last, steps with 100 ms of thinking before
//! the checkpoint. Rows: checkpoint (right after the step, and 100 ms
//! later), the processes' pause, in-place rollback, rollback until the
//! HTTP server's first answer (seen by a client started inside the sandbox
//! right after the rollback returned), the memory the template pool holds,
//! and (REPL 100 MB) checkpoints after steps that also write 20 MB each (a
//! layered checkpoint does not follow what was written; with
//! `--snapshot-processes` the checkpoint syncs and snapshots it). A
//! baseline row per size, timed in the same sandbox before the workload
//! starts: plain `fork()`s of a Python holding as much in 4 KiB pages
//! (what a template made by a fork copies: DeltaBox's path, without
//! ptrace), which also tells how fast this machine forks at the time; the
//! report gives the checkpoint as a multiple of it. And a second one, for
//! the other kind of work a checkpoint's window is made of: syscalls
//! injected by ptrace into a stopped process on the injecting thread's
//! CPU, ten per sample (each is two ptrace stops, a context switch each
//! way per stop: the unit of the calls pass 1 injects one at a time),
//! which tells how fast this machine hands a CPU between two tasks then.
//! Then rollbacks from the durable image ([`from_image`]) and forks with
//! live processes ([`forks`]: time and memory); then the process-tree
//! workload ([`tree`]): a shell with 49 jobs; last,
//! the connections workload ([`connections`]): an echo server and a
//! client holding 16 TCP connections to it; last, the PostgreSQL workload
//! ([`postgresql`]): a server and a `psql` client in a transaction.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use rand::seq::IndexedRandom;
use sandtree_api::{CheckpointRequest, ExecRequest, ForkRequest, RollbackRequest, SessionRunRequest};
use sandtree_runtime::Engine;

use super::report::{Report, Row};
use super::workload::{create, sh};

const REPL: &str = r#"
import mmap, os, random, socket
size = int(os.environ['REPL_MB']) << 20
buf = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
buf.madvise(mmap.MADV_HUGEPAGE)   # as numpy does for large arrays
for off in range(0, size, 4096):
    buf[off] = 1
objs = {i: str(i) * 8 for i in range(100_000)}
srv = socket.socket()
srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind(('127.0.0.1', 9000))
srv.listen(16)
steps = 0
while True:
    c, _ = srv.accept()
    cmd = c.makefile().readline().split()
    if cmd and cmd[0] == 'dirty':
        pages = size // 4096
        for _ in range(int(cmd[1])):
            buf[random.randrange(pages) * 4096] = random.randrange(256)
        steps += 1
    c.sendall(f'{steps} {len(objs)}\n'.encode())
    c.close()
"#;

/// The baseline: `n` plain `fork()`s of a Python holding `REPL_MB` in
/// 4 KiB pages (the REPL's buffer is in 4 KiB pages once its first
/// checkpoints split its huge pages), timed in the parent until `fork`
/// returns: the copy a template made by a fork costs (DeltaBox's path),
/// without ptrace. Run in the sandbox before the workload starts, so that
/// the rows say how fast this machine forks at the time of the run.
const FORK: &str = r#"
import mmap, os, time
size = int(os.environ['REPL_MB']) << 20
buf = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
buf.madvise(mmap.MADV_NOHUGEPAGE)
for off in range(0, size, 4096):
    buf[off] = 1
"#;

/// The end of both fork baselines' programs: `FORKS` forks of the
/// process, each timed until `fork` returns, the times printed (ms).
const FORK_TIMES: &str = r#"
out = []
for _ in range(int(os.environ['FORKS'])):
    t = time.perf_counter()
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    out.append((time.perf_counter() - t) * 1e3)
    os.waitpid(pid, 0)
print(' '.join(f'{ms:.4f}' for ms in out))
"#;

/// A request over bash's `/dev/tcp` (no client binary to start).
fn tcp_request(port: u16, line: &str) -> String {
    format!("exec 3<>/dev/tcp/127.0.0.1/{port} && printf '{line}\\n' >&3 && head -c 64 <&3")
}

/// `bash -c` (the `/dev/tcp` redirections are bash's).
async fn bash(engine: &Engine, sb: &str, script: &str) -> Result<String> {
    let out = engine
        .exec(sb, ExecRequest { cmd: vec!["bash".into(), "-c".into(), script.into()], ..Default::default() })
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    if out.exit_code != Some(0) {
        bail!("`{script}` failed in {sb}: exit {:?}: {}", out.exit_code, out.stderr);
    }
    Ok(out.stdout)
}

async fn wait_for_port(engine: &Engine, sb: &str, port: u16, line: &str) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    while bash(engine, sb, &tcp_request(port, line)).await.is_err() {
        if Instant::now() > deadline {
            bail!("nothing answers on port {port}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}

/// A rollback in place of `sb` to one of the checkpoints `ids`, picked at
/// random: when it started, and how long it took (ms). One that restarted
/// the processes instead fails the run.
async fn rollback_to_one_of(engine: &Engine, sb: &str, ids: &[String]) -> Result<(Instant, f64)> {
    let target = ids.choose(&mut rand::rng()).context("checkpoints")?.clone();
    let t = Instant::now();
    let r = engine
        .rollback(sb, RollbackRequest { checkpoint: target, allow_restart: false })
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let ms = t.elapsed().as_secs_f64() * 1e3;
    if r.processes_restarted {
        bail!("rollback restarted the processes: {}", r.note);
    }
    Ok((t, ms))
}

/// Retries a checkpoint that found a process mid-request with a helper
/// thread (`http.server` answers each request on a thread that exits right
/// after): such a process is refused, never captured half-way.
async fn checkpoint(engine: &Engine, sb: &str) -> Result<(String, f64, f64)> {
    for _ in 0..20 {
        let t = Instant::now();
        match engine.checkpoint(sb, CheckpointRequest::default()).await {
            Ok(r) => {
                if r.checkpoint.process_state != sandtree_api::ProcessState::Captured {
                    bail!("processes not captured: {}", r.note);
                }
                return Ok((r.checkpoint.id, t.elapsed().as_secs_f64() * 1e3, r.checkpoint.frozen_ms));
            }
            Err(e)
                if e.code() == sandtree_api::ErrorCode::ProcessNotRestorable && e.to_string().contains("threads") =>
            {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            Err(e) => bail!("{e}"),
        }
    }
    bail!("a process stayed multi-threaded")
}

/// One run of the process workload with a REPL holding `repl_mb`.
pub async fn run(engine: &Engine, n: usize, repl_mb: u64, report: &mut Report) -> Result<()> {
    let label = repl_label(repl_mb);
    let steal = super::report::Steal::now();
    let sb = create(engine).await?;
    let fork_ms = fork_baseline(engine, &sb, n, repl_mb).await?;
    let inject_ms = tokio::task::spawn_blocking(move || {
        std::thread::spawn(move || ptrace_baseline(n)).join().unwrap_or_else(|_| bail!("the ptrace baseline panicked"))
    })
    .await??;
    start_repl_and_server(engine, &sb, repl_mb).await?;
    let err = |e: sandtree_runtime::Error| anyhow::anyhow!("{e}");
    let session = engine.create_session(&sb, Default::default()).await.map_err(err)?;
    let run = |c: &str| SessionRunRequest { command: c.into(), timeout_ms: Some(10_000) };
    engine.session_run(&sb, &session.id, run("cd /root/files && X=1")).await.map_err(err)?;
    wait_for_port(engine, &sb, 9000, "ping").await?;
    wait_for_port(engine, &sb, 8000, "GET / HTTP/1.0\\r\\n").await?;

    let step = |i: usize| {
        format!(
            "for f in 0 1 2 3 4 5 6 7 8 9; do echo {i} >> /root/files/$f; done && {}",
            tcp_request(9000, "dirty 1000")
        )
    };
    let (mut ck_ms, mut paused, mut ids) = (Vec::new(), Vec::new(), Vec::new());
    let mut by_holder = Vec::new();
    let from_prev = engine.process_stats().templates_from_older_standbys;
    let from_forks = engine.process_stats().templates_from_forks_under_way;
    for i in 0..n {
        bash(engine, &sb, &step(i)).await?;
        let copied = engine.process_stats().pages_copied_by_holders;
        let (id, ms, frozen) = checkpoint(engine, &sb).await?;
        by_holder.push((engine.process_stats().pages_copied_by_holders - copied) as f64);
        ck_ms.push(ms);
        paused.push(frozen);
        ids.push(id);
    }
    // Their durable process images, written after each checkpoint
    // answered: bytes and time each (the first one holds every page).
    let (mut image_bytes, mut image_ms, mut first_image) = (Vec::new(), Vec::new(), 0);
    for (k, id) in ids.iter().enumerate() {
        let image = settled_image(engine, id).await?;
        if image.state != sandtree_api::ImageState::Durable {
            bail!("checkpoint {id}'s process image: {:?} {}", image.state, image.error.unwrap_or_default());
        }
        match k {
            0 => first_image = image.bytes.unwrap_or(0),
            _ => {
                image_bytes.push(image.bytes.unwrap_or(0) as f64);
                image_ms.push(image.write_ms.unwrap_or(f64::NAN));
            }
        }
    }
    report.image_bytes.push((label.clone(), image_bytes, first_image));
    // (The REPL, the server and the shell are tracked.)
    let stats = engine.process_stats();
    report.from_prev.push((label.clone(), stats.templates_from_older_standbys - from_prev, 3 * n));
    report.from_forks.push((label.clone(), stats.templates_from_forks_under_way - from_forks, 3 * n));
    let pool = engine.template_memory(&sb).map_err(err)?;
    let (mut rb_ms, mut first_ms, mut think_ms) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..2 * n {
        bash(engine, &sb, &step(n + i)).await?;
        // The second half: the agent thinks 100 ms before it rolls back
        // (the engine prepares the likeliest target meanwhile).
        let think = i >= n;
        if think {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let (t, ms) = rollback_to_one_of(engine, &sb, &ids).await?;
        if think {
            think_ms.push(ms);
        } else {
            rb_ms.push(ms);
        }
        let answer = bash(engine, &sb, &tcp_request(8000, "GET / HTTP/1.0\\r\\n")).await?;
        if !think {
            first_ms.push(t.elapsed().as_secs_f64() * 1e3);
        }
        if !answer.starts_with("HTTP/1.0 200") {
            bail!("http.server answered {answer:?} after a rollback");
        }
    }
    // The session shell kept its state through all of it.
    let out = engine.session_run(&sb, &session.id, run("echo $(pwd) $X")).await.map_err(err)?;
    if out.output.trim() != "/root/files 1" {
        bail!("session state after rollbacks: {:?}", out.output);
    }
    // Steps that write a lot (a download, a build): 20 MB each. A
    // checkpoint's cost should not follow what was written.
    let mut heavy_ms = Vec::new();
    if repl_mb < 1024 {
        for i in 0..n.min(10) {
            let write = format!("head -c 20M /dev/urandom > /root/files/big{} && {}", i % 3, step(i));
            bash(engine, &sb, &write).await?;
            heavy_ms.push(checkpoint(engine, &sb).await?.1);
        }
    }
    // The agent thinks 100 ms between a step and its checkpoint: the
    // engine's background work (templates written and forked, the pool
    // measured) meets the checkpoint less, or differently.
    let mut think_ck_ms = Vec::new();
    for i in 0..n {
        bash(engine, &sb, &step(3 * n + i)).await?;
        tokio::time::sleep(Duration::from_millis(100)).await;
        think_ck_ms.push(checkpoint(engine, &sb).await?.1);
    }
    let g = "processes";
    report.rows.push(Row::new(g, &format!("checkpoint, REPL {label} + http + shell"), &ck_ms));
    report.rows.push(Row::new(g, &format!("checkpoint, 100 ms later (REPL {label})"), &think_ck_ms));
    if !heavy_ms.is_empty() {
        report.rows.push(Row::new(g, &format!("checkpoint, REPL {label}, 20 MB written per step"), &heavy_ms));
    }
    report.rows.push(Row::new(g, &format!("  processes paused (REPL {label})"), &paused));
    report.rows.push(Row::new(g, &format!("  process image written, after the answer (REPL {label})"), &image_ms));
    report.rows.push(Row::new(g, &format!("rollback in place (REPL {label})"), &rb_ms));
    report.rows.push(Row::new(g, &format!("  rollback + first HTTP answer (REPL {label})"), &first_ms));
    report.rows.push(Row::new(g, &format!("rollback in place, 100 ms later (REPL {label})"), &think_ms));
    report.rows.push(Row::new("baseline", &fork_row(&label), &fork_ms));
    report.rows.push(Row::new("baseline", &inject_row(&label), &inject_ms));
    by_holder.sort_by(f64::total_cmp);
    report.holder_pages.push((label.clone(), super::report::percentile(&by_holder, 50.0)));
    if let (Some(s0), Some(s1)) = (steal, super::report::Steal::now()) {
        report.cpu_stolen.push((format!("REPL {label}"), s0.percent_until(&s1)));
    }
    report.template_pool.push((label, n, pool));
    engine.delete_sandbox(&sb, true).await.map_err(err)?;
    Ok(())
}

/// Checkpoint `id`'s process image once it is no longer being written.
/// How the rows name a REPL holding `repl_mb` ("100 MB", "1 GB").
fn repl_label(repl_mb: u64) -> String {
    if repl_mb >= 1024 { format!("{} GB", repl_mb / 1024) } else { format!("{repl_mb} MB") }
}

/// The process workload's REPL (holding `repl_mb`) and `http.server`
/// (serving `/root/www`) started in the background in sandbox `sb`.
async fn start_repl_and_server(engine: &Engine, sb: &str, repl_mb: u64) -> Result<()> {
    sh(engine, sb, "mkdir -p /root/www /root/files && echo hello > /root/www/index.html").await?;
    let bg = |cmd: Vec<&str>, env: Vec<(String, String)>| ExecRequest {
        cmd: cmd.into_iter().map(String::from).collect(),
        env: env.into_iter().collect(),
        cwd: Some("/root/www".into()),
        background: true,
        ..Default::default()
    };
    let err = |e: sandtree_runtime::Error| anyhow::anyhow!("{e}");
    let repl = bg(vec!["python3", "-c", REPL], vec![("REPL_MB".into(), repl_mb.to_string())]);
    engine.exec(sb, repl).await.map_err(err)?;
    let server = bg(vec!["python3", "-m", "http.server", "8000", "--bind", "127.0.0.1"], vec![]);
    engine.exec(sb, server).await.map_err(err)?;
    Ok(())
}

/// Rollbacks from a checkpoint's durable image, its templates dropped
/// first (as after a daemon restart, or an eviction), of a REPL holding
/// `repl_mb` and an `http.server` (no session shell: an image does not
/// restore a terminal yet); each followed by one from the templates that
/// rollback made again, for the side by side. Each restored server must
/// answer.
pub async fn from_image(engine: &Engine, n: usize, repl_mb: u64, report: &mut Report) -> Result<()> {
    let label = repl_label(repl_mb);
    let err = |e: sandtree_runtime::Error| anyhow::anyhow!("{e}");
    let sb = create(engine).await?;
    start_repl_and_server(engine, &sb, repl_mb).await?;
    wait_for_port(engine, &sb, 9000, "ping").await?;
    wait_for_port(engine, &sb, 8000, "GET / HTTP/1.0\\r\\n").await?;
    let req = CheckpointRequest { wait_durable: true, ..Default::default() };
    let ck = engine.checkpoint(&sb, req).await.map_err(err)?.checkpoint;
    if ck.process_image.as_ref().map(|i| i.state) != Some(sandtree_api::ImageState::Durable) {
        bail!("checkpoint {}'s process image: {:?}", ck.id, ck.process_image);
    }
    let (mut image_ms, mut template_ms) = (Vec::new(), Vec::new());
    for i in 0..2 * n {
        bash(engine, &sb, &tcp_request(9000, "dirty 1000")).await?;
        let from_image = i % 2 == 0;
        if from_image {
            engine.drop_templates(&sb, &ck.id).map_err(err)?;
        }
        let t = Instant::now();
        let r = engine
            .rollback(&sb, RollbackRequest { checkpoint: ck.id.clone(), allow_restart: false })
            .await
            .map_err(err)?;
        let ms = t.elapsed().as_secs_f64() * 1e3;
        let want = if from_image { sandtree_api::RestoreSource::Image } else { sandtree_api::RestoreSource::Templates };
        if r.restored_from != Some(want) {
            bail!("restored from {:?}, not {want:?}: {}", r.restored_from, r.note);
        }
        let answer = bash(engine, &sb, &tcp_request(8000, "GET / HTTP/1.0\\r\\n")).await?;
        if !answer.starts_with("HTTP/1.0 200") {
            bail!("http.server answered {answer:?} after a rollback from the {want:?}");
        }
        if from_image { image_ms.push(ms) } else { template_ms.push(ms) }
    }
    engine.delete_sandbox(&sb, true).await.map_err(err)?;
    let g = "processes";
    let image_row = match repl_mb {
        100 => FROM_IMAGE_ROW.to_string(),
        _ => format!("rollback from the image, no templates (REPL {label} + http)"),
    };
    report.rows.push(Row::new(g, &image_row, &image_ms));
    report.rows.push(Row::new(g, &format!("  then from the templates it made (REPL {label} + http)"), &template_ms));
    Ok(())
}

async fn settled_image(engine: &Engine, id: &str) -> Result<sandtree_api::ProcessImageInfo> {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let info = engine.get_checkpoint(id).await.map_err(|e| anyhow::anyhow!("{e}"))?;
        match info.process_image {
            Some(i) if i.state != sandtree_api::ImageState::Writing => return Ok(i),
            None => bail!("checkpoint {id} has no process image"),
            Some(_) if Instant::now() > deadline => bail!("checkpoint {id}'s process image still being written"),
            Some(_) => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
}

/// The baseline row's name for a REPL of `label`.
pub fn fork_row(label: &str) -> String {
    format!("fork() of a {label} process (4 KiB pages)")
}

/// The second baseline row's name, in the run of a REPL of `label`.
pub fn inject_row(label: &str) -> String {
    format!("10 syscalls injected by ptrace (REPL {label} run)")
}

/// [`FORK`]'s samples in sandbox `sb`.
async fn fork_baseline(engine: &Engine, sb: &str, n: usize, repl_mb: u64) -> Result<Vec<f64>> {
    let req = ExecRequest {
        cmd: vec!["python3".into(), "-c".into(), format!("{FORK}{FORK_TIMES}")],
        env: [("REPL_MB".to_string(), repl_mb.to_string()), ("FORKS".to_string(), n.to_string())].into(),
        ..Default::default()
    };
    let out = engine.exec(sb, req).await.map_err(|e| anyhow::anyhow!("{e}"))?;
    fork_samples(&out, n, "the fork baseline")
}

/// The `n` times a fork baseline's program (its output `out`) printed.
fn fork_samples(out: &sandtree_api::ExecResponse, n: usize, what: &str) -> Result<Vec<f64>> {
    if out.exit_code != Some(0) {
        bail!("{what} failed: exit {:?}: {}", out.exit_code, out.stderr);
    }
    let ms: Vec<f64> = out.stdout.split_whitespace().map(str::parse).collect::<Result<_, _>>()?;
    if ms.len() != n {
        bail!("{what} printed {} samples, not {n}", ms.len());
    }
    Ok(ms)
}

/// `n` checkpoints of `sb`, each after a `step` (given its number): their
/// times (ms) and ids.
async fn checkpoint_after_each<F, Fut, T>(
    engine: &Engine,
    sb: &str,
    n: usize,
    mut step: F,
) -> Result<(Vec<f64>, Vec<String>)>
where
    F: FnMut(usize) -> Fut,
    Fut: std::future::Future<Output = Result<T>>,
{
    let (mut ck_ms, mut ids) = (Vec::new(), Vec::new());
    for i in 0..n {
        step(i).await?;
        let (id, ms, _) = checkpoint(engine, sb).await?;
        ck_ms.push(ms);
        ids.push(id);
    }
    Ok((ck_ms, ids))
}

/// The second baseline (see the module docs): `n` samples of ten `getppid`
/// calls injected into a stopped `sleep`, both pinned to the CPU this
/// (fresh, and gone with the pin once done) thread runs on, as the tracer
/// thread and its tracees are.
fn ptrace_baseline(n: usize) -> Result<Vec<f64>> {
    use sandtree_proc::inject;
    use sandtree_sys::ptrace;
    /// The tracee, killed whatever happens.
    struct Child(std::process::Child);
    impl Drop for Child {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let child = Child(std::process::Command::new("sleep").arg("600").spawn().context("spawn sleep")?);
    let pid = sandtree_proc::HostPid(child.0.id() as i32);
    let cpu = rustix::thread::sched_getcpu() as u32;
    inject::pin_self(&[cpu]);
    inject::set_affinity(pid, &[cpu]);
    ptrace::seize(pid.raw()).context("seize")?;
    ptrace::interrupt(pid.raw()).context("interrupt")?;
    inject::wait_event_stop(pid).context("wait for the stop")?;
    let regs = ptrace::regs(pid.raw()).context("registers")?;
    let insn = inject::find_syscall_insn(pid).context("find a syscall instruction")?;
    let mut tracee = inject::Tracee::new(pid, regs, insn);
    let mut ms = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        for _ in 0..10 {
            tracee.call("getppid", libc::SYS_getppid, &[])?;
        }
        ms.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    tracee.release(&regs).context("release")?;
    Ok(ms)
}

/// The process-tree workload: a session's bash with 49 background jobs
/// (`sleep`, children of bash, each in a process group of its own): 50
/// processes, 49 of them children of another. Each step touches a file
/// and checkpoints; then rollbacks go to random checkpoints (each job made
/// again by the restored bash). Rows: checkpoint, rollback in place.
pub async fn tree(engine: &Engine, n: usize, report: &mut Report) -> Result<()> {
    const JOBS: usize = 49;
    let err = |e: sandtree_runtime::Error| anyhow::anyhow!("{e}");
    let sb = create(engine).await?;
    let session = engine.create_session(&sb, Default::default()).await.map_err(err)?;
    let run = |c: &str| SessionRunRequest { command: c.into(), timeout_ms: Some(10_000) };
    let start = format!("for i in $(seq {JOBS}); do sleep 100000 & done");
    engine.session_run(&sb, &session.id, run(&start)).await.map_err(err)?;
    let count = "jobs -r | wc -l";
    let sb_ref = sb.as_str();
    let mark = |i: usize| async move { sh(engine, sb_ref, &format!("echo {i} > /root/step")).await };
    let (ck_ms, ids) = checkpoint_after_each(engine, &sb, n, mark).await?;
    let mut rb_ms = Vec::new();
    for i in 0..n {
        sh(engine, &sb, &format!("echo {} > /root/step", n + i)).await?;
        let (_, ms) = rollback_to_one_of(engine, &sb, &ids).await?;
        rb_ms.push(ms);
    }
    // The shell kept its jobs through all of it.
    let out = engine.session_run(&sb, &session.id, run(count)).await.map_err(err)?;
    if out.output.trim() != JOBS.to_string() {
        bail!("bash's running jobs after rollbacks: {:?}", out.output);
    }
    let g = "processes";
    report.rows.push(Row::new(g, TREE_CK_ROW, &ck_ms));
    report.rows.push(Row::new(g, TREE_RB_ROW, &rb_ms));
    engine.delete_sandbox(&sb, true).await.map_err(err)?;
    Ok(())
}

/// The process-tree workload's rows.
pub const TREE_CK_ROW: &str = "checkpoint, 50-process tree (bash + 49 jobs)";
pub const TREE_RB_ROW: &str = "rollback in place, 50-process tree (bash + 49 jobs)";

/// The connections workload's server: echoes each line on every
/// connection (one thread, `selectors`), on port 9200.
const ECHO_SERVER: &str = r#"
import selectors, socket
sel = selectors.DefaultSelector()
srv = socket.socket()
srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind(('127.0.0.1', 9200))
srv.listen(64)
sel.register(srv, selectors.EVENT_READ)
while True:
    for key, _ in sel.select():
        s = key.fileobj
        if s is srv:
            c, _ = srv.accept()
            sel.register(c, selectors.EVENT_READ)
            continue
        data = s.recv(4096)
        if not data:
            sel.unregister(s)
            s.close()
        else:
            s.sendall(data)
"#;

/// The connections workload's client: holds `CONNS` connections to the
/// echo server; asked `step` on port 9201, it makes a round trip on each
/// and answers how many came back right.
const ECHO_CLIENT: &str = r#"
import os, socket, time
n = int(os.environ['CONNS'])
for _ in range(200):
    try:
        conns = [socket.create_connection(('127.0.0.1', 9200)) for _ in range(n)]
        break
    except OSError:
        time.sleep(0.05)
ctl = socket.socket()
ctl.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
ctl.bind(('127.0.0.1', 9201))
ctl.listen(4)
steps = 0
while True:
    c, _ = ctl.accept()
    c.makefile().readline()
    steps += 1
    ok = 0
    for i, s in enumerate(conns):
        line = f'{steps} {i}\n'.encode()
        s.sendall(line)
        ok += s.recv(64) == line
    c.sendall(f'{ok}\n'.encode())
    c.close()
"#;

/// The connections workload: an echo server and a client holding
/// [`CONNS`] TCP connections to it (two processes); each step makes a
/// round trip on every connection and checkpoints; then rollbacks go to
/// random checkpoints, each followed by a round trip on every connection
/// (made anew in repair mode: `kinds/tcp.rs`). Rows: checkpoint, rollback
/// in place, and rollback + that round trip.
pub async fn connections(engine: &Engine, n: usize, report: &mut Report) -> Result<()> {
    let err = |e: sandtree_runtime::Error| anyhow::anyhow!("{e}");
    let sb = create(engine).await?;
    let py = |code: &str| ExecRequest {
        cmd: vec!["python3".into(), "-c".into(), code.into()],
        env: [("CONNS".to_string(), CONNS.to_string())].into_iter().collect(),
        background: true,
        ..Default::default()
    };
    engine.exec(&sb, py(ECHO_SERVER)).await.map_err(err)?;
    engine.exec(&sb, py(ECHO_CLIENT)).await.map_err(err)?;
    wait_for_port(engine, &sb, 9201, "step").await?;
    let step = || async {
        let got = bash(engine, &sb, &tcp_request(9201, "step")).await?;
        match got.trim() == CONNS.to_string() {
            true => Ok(()),
            false => Err(anyhow::anyhow!("round trips on {CONNS} connections: {got:?} came back right")),
        }
    };
    let (ck_ms, ids) = checkpoint_after_each(engine, &sb, n, |_| step()).await?;
    let (mut rb_ms, mut first_ms) = (Vec::new(), Vec::new());
    for _ in 0..n {
        step().await?;
        let (t, ms) = rollback_to_one_of(engine, &sb, &ids).await?;
        rb_ms.push(ms);
        step().await?;
        first_ms.push(t.elapsed().as_secs_f64() * 1e3);
    }
    let g = "processes";
    report.rows.push(Row::new(g, CONNS_CK_ROW, &ck_ms));
    report.rows.push(Row::new(g, CONNS_RB_ROW, &rb_ms));
    report.rows.push(Row::new(g, CONNS_FIRST_ROW, &first_ms));
    engine.delete_sandbox(&sb, true).await.map_err(err)?;
    Ok(())
}

/// TCP connections the connections workload's client holds.
const CONNS: usize = 16;
/// The connections workload's rows.
pub const CONNS_CK_ROW: &str = "checkpoint, 16 TCP connections (echo server + client)";
pub const CONNS_RB_ROW: &str = "rollback in place, 16 TCP connections";
pub const CONNS_FIRST_ROW: &str = "  rollback + a round trip on each connection";

/// The PostgreSQL workload's set-up: a cluster made and started as the
/// `postgres` user (the host's PostgreSQL, on the unix socket in `/tmp`
/// only), as an agent would run it.
const PG_START: &str = r#"
set -e
mkdir -p /tmp/pgdata && chown postgres /tmp/pgdata
cd /tmp
su postgres -c "initdb -D /tmp/pgdata -A trust -U pg --no-sync >/tmp/initdb.log 2>&1"
su postgres -c "pg_ctl -D /tmp/pgdata -l /tmp/pg.log -w -o \"-k /tmp -c listen_addresses=''\" start >/dev/null"
"#;

/// The PostgreSQL workload's client: a `psql` (as `postgres`) that this
/// program drives; asked `step` on port 9300, it commits the transaction
/// it holds open, opens another with a row inserted and answers the rows
/// it sees.
const PG_CLIENT: &str = r#"
import os, select, socket, subprocess
psql = subprocess.Popen(['psql', '-h', '/tmp', '-U', 'pg', '-d', 'postgres', '-X', '-q', '-A', '-t'],
    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, user='postgres', cwd='/tmp')
def ask(sql):
    psql.stdin.write((sql + '\n\\echo __done__\n').encode()); psql.stdin.flush()
    out = b''
    while not out.endswith(b'__done__\n'):
        if not select.select([psql.stdout], [], [], 10)[0]: raise RuntimeError(out)
        got = os.read(psql.stdout.fileno(), 4096)
        if not got: raise RuntimeError(out)
        out += got
    return out[:-9].decode().strip()
ask('create table t (x int primary key); begin;')
ctl = socket.socket()
ctl.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
ctl.bind(('127.0.0.1', 9300))
ctl.listen(4)
while True:
    c, _ = ctl.accept()
    c.makefile().readline()
    n = ask('commit; begin; insert into t select coalesce(max(x), 0) + 1 from t; select count(*) from t;')
    c.sendall(f'{n}\n'.encode())
    c.close()
"#;

/// The PostgreSQL workload's baseline: `n` plain `fork()`s of a Python
/// shaped as the postmaster (pid `PG`): as much shared anonymous memory,
/// with as many pages in it, and as many private pages of its own as the
/// postmaster has (its `smaps`), timed until `fork` returns.
const PG_FORK: &str = r#"
import mmap, os, time
shared_size = shared_rss = private = 0
cur = None
for line in open(f"/proc/{os.environ['PG']}/smaps"):
    f = line.split()
    if '-' in f[0] and len(f) >= 5:
        cur = f
        continue
    kb = int(f[1]) * 1024 if len(f) > 1 and f[1].isdigit() else 0
    anon_shared = cur[1].endswith('s') and len(cur) >= 6 and cur[5] == '/dev/zero'
    if f[0] == 'Size:' and anon_shared: shared_size += kb
    if f[0] == 'Rss:' and anon_shared: shared_rss += kb
    if f[0] in ('Private_Dirty:', 'Private_Clean:') and not cur[1].endswith('s'): private += kb
shared = mmap.mmap(-1, shared_size)
for off in range(0, shared_rss, 4096):
    shared[off] = 1
own = mmap.mmap(-1, private, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
for off in range(0, private, 4096):
    own[off] = 1
"#;

/// The PostgreSQL workload: a PostgreSQL server (postmaster and its
/// children, as the `postgres` user, sharing memory) and a `psql` client
/// holding a transaction open, driven by a Python (nine processes); each
/// step commits, opens another transaction with a row inserted, and
/// checkpoints; then
/// rollbacks go to random checkpoints, each followed by a step (the
/// client's transaction, rolled back with the server, commits). Rows:
/// checkpoint, rollback in place, and the baseline: a fork of a process
/// shaped as the postmaster.
pub async fn postgresql(engine: &Engine, n: usize, report: &mut Report) -> Result<()> {
    let err = |e: sandtree_runtime::Error| anyhow::anyhow!("{e}");
    let sb = create(engine).await?;
    bash(engine, &sb, PG_START).await.context("starting PostgreSQL")?;
    let req = |code: &str, env: Vec<(String, String)>, background: bool| ExecRequest {
        cmd: vec!["python3".into(), "-c".into(), code.into()],
        env: env.into_iter().collect(),
        background,
        ..Default::default()
    };
    let pid = bash(engine, &sb, "head -1 /tmp/pgdata/postmaster.pid").await?.trim().to_string();
    let env = vec![("PG".to_string(), pid), ("FORKS".to_string(), n.to_string())];
    let out = engine.exec(&sb, req(&format!("{PG_FORK}{FORK_TIMES}"), env, false)).await.map_err(err)?;
    let fork_ms = fork_samples(&out, n, "the PostgreSQL fork baseline")?;
    engine.exec(&sb, req(PG_CLIENT, Vec::new(), true)).await.map_err(err)?;
    wait_for_port(engine, &sb, 9300, "step").await?;
    let step = || async {
        let got = bash(engine, &sb, &tcp_request(9300, "step")).await?;
        got.trim().parse::<u64>().with_context(|| format!("the PostgreSQL client answered {got:?}"))
    };
    let (ck_ms, rb_ms) = steps_checkpoints_rollbacks(engine, &sb, n, step).await?;
    push_rows(report, [(PG_CK_ROW, &ck_ms), (PG_RB_ROW, &rb_ms), (PG_FORK_ROW, &fork_ms)]);
    engine.delete_sandbox(&sb, true).await.map_err(err)?;
    Ok(())
}

/// The PostgreSQL workload's rows.
pub const PG_CK_ROW: &str = "checkpoint, PostgreSQL + psql in a transaction (9 processes)";
pub const PG_RB_ROW: &str = "rollback in place, PostgreSQL + psql in a transaction";
pub const PG_FORK_ROW: &str = "fork() of a process shaped as PostgreSQL's postmaster";

/// The many-mappings workload's process: 10,000 mappings of one page
/// each (anonymous, private, made one by one; every other one read-only,
/// so that none merges with its neighbour), the writable ones written,
/// and a step (port 9500) that writes one of them. Its beginning, less
/// the server, is the baseline's program too.
const MANY_MAPS: &str = r#"
import mmap, os, socket, time
maps = []
for i in range(10_000):
    prot = mmap.PROT_READ | (mmap.PROT_WRITE if i % 2 == 0 else 0)
    m = mmap.mmap(-1, 4096, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, prot=prot)
    if i % 2 == 0:
        m[0] = 1
    maps.append(m)
"#;

const MANY_MAPS_SERVER: &str = r#"
srv = socket.socket()
srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind(('127.0.0.1', 9500))
srv.listen(16)
steps = 0
while True:
    c, _ = srv.accept()
    c.makefile().readline()
    steps += 1
    maps[(steps * 2) % len(maps)][0] = steps % 256
    n = sum(1 for _ in open('/proc/self/maps'))
    c.sendall(f'{steps} {n}\n'.encode())
    c.close()
"#;

/// The many-mappings workload: a process with 10,000 mappings (the
/// external suite's case that a checkpoint froze 323 ms); each step writes
/// a page and checkpoints, then rollbacks go to random checkpoints. Rows:
/// checkpoint, rollback in place, and the baseline: a fork of a process
/// with the same 10,000 mappings.
pub async fn many_mappings(engine: &Engine, n: usize, report: &mut Report) -> Result<()> {
    let err = |e: sandtree_runtime::Error| anyhow::anyhow!("{e}");
    let sb = create(engine).await?;
    let req = |code: String, background: bool| ExecRequest {
        cmd: vec!["python3".into(), "-c".into(), code],
        env: [("FORKS".to_string(), n.to_string())].into(),
        background,
        ..Default::default()
    };
    let out = engine.exec(&sb, req(format!("{MANY_MAPS}{FORK_TIMES}"), false)).await.map_err(err)?;
    let fork_ms = fork_samples(&out, n, "the many-mappings fork baseline")?;
    engine.exec(&sb, req(format!("{MANY_MAPS}{MANY_MAPS_SERVER}"), true)).await.map_err(err)?;
    wait_for_port(engine, &sb, 9500, "step").await?;
    let step = || async {
        let got = bash(engine, &sb, &tcp_request(9500, "step")).await?;
        let maps: usize = got.split_whitespace().nth(1).and_then(|m| m.parse().ok()).unwrap_or(0);
        if maps < 10_000 {
            bail!("the many-mappings process answered {got:?} (fewer than 10,000 mappings)");
        }
        Ok(())
    };
    let (ck_ms, rb_ms) = steps_checkpoints_rollbacks(engine, &sb, n, step).await?;
    push_rows(report, [(MAPS_CK_ROW, &ck_ms), (MAPS_RB_ROW, &rb_ms), (MAPS_FORK_ROW, &fork_ms)]);
    engine.delete_sandbox(&sb, true).await.map_err(err)?;
    Ok(())
}

/// `n` checkpoints of `sb`, each after a `step`; then `n` rollbacks to
/// random ones, each between two steps (the restored state must take the
/// next one): their times (ms).
async fn steps_checkpoints_rollbacks<F, Fut, T>(
    engine: &Engine,
    sb: &str,
    n: usize,
    step: F,
) -> Result<(Vec<f64>, Vec<f64>)>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<T>>,
{
    let (ck_ms, ids) = checkpoint_after_each(engine, sb, n, |_| step()).await?;
    let mut rb_ms = Vec::new();
    for _ in 0..n {
        step().await?;
        let (_, ms) = rollback_to_one_of(engine, sb, &ids).await?;
        rb_ms.push(ms);
        step().await?;
    }
    Ok((ck_ms, rb_ms))
}

/// A workload's checkpoint and rollback rows, and its fork baseline's.
fn push_rows(report: &mut Report, [(ck, ck_ms), (rb, rb_ms), (fork, fork_ms)]: [(&str, &Vec<f64>); 3]) {
    report.rows.push(Row::new("processes", ck, ck_ms));
    report.rows.push(Row::new("processes", rb, rb_ms));
    report.rows.push(Row::new("baseline", fork, fork_ms));
}

/// The many-mappings workload's rows.
pub const MAPS_CK_ROW: &str = "checkpoint, a process with 10,000 mappings";
pub const MAPS_RB_ROW: &str = "rollback in place, a process with 10,000 mappings";
pub const MAPS_FORK_ROW: &str = "fork() of a process with 10,000 mappings";

pub const FROM_IMAGE_ROW: &str = "rollback from the image, no templates (REPL 100 MB + http)";

/// How many sandboxes a fork row makes at once.
pub const FORKS: u32 = 16;
pub const FORK_LIVE_ROW: &str = "fork 16 with live processes (REPL 100 MB + http), total";
pub const FORK_FILES_ROW: &str = "  fork 16, files only (same checkpoint)";

/// Forks with live processes: `FORKS` sandboxes at once from a
/// checkpoint of the REPL (holding `repl_mb`) and `http.server`, each
/// running copies of them (made from the checkpoint's durable image);
/// beside it, the same fork with the files alone. In every fork the
/// server must answer and the REPL keep its state (its step count, its
/// objects). Then the memory: the host's used memory (`MemTotal` minus
/// free, buffers, page cache and reclaimable slabs) added by `FORKS`
/// forks that each dirty 1,000 pages (4 MB) of the REPL's buffer.
pub async fn forks(engine: &Engine, n: usize, repl_mb: u64, report: &mut Report) -> Result<()> {
    let err = |e: sandtree_runtime::Error| anyhow::anyhow!("{e}");
    let sb = create(engine).await?;
    start_repl_and_server(engine, &sb, repl_mb).await?;
    wait_for_port(engine, &sb, 9000, "ping").await?;
    wait_for_port(engine, &sb, 8000, "GET / HTTP/1.0\\r\\n").await?;
    let state = bash(engine, &sb, &tcp_request(9000, "dirty 10")).await?;
    let req = CheckpointRequest { wait_durable: true, ..Default::default() };
    let ck = engine.checkpoint(&sb, req).await.map_err(err)?.checkpoint.id;
    let fork = |files_only: bool| {
        let req = ForkRequest { count: FORKS, labels: Default::default(), limits: None, files_only };
        engine.fork(&ck, req)
    };
    let (mut live_ms, mut files_ms) = (Vec::new(), Vec::new());
    let mut used_mb = None;
    for i in 0..n.min(3) {
        let (ms, r) = {
            let t = Instant::now();
            let r = fork(true).await.map_err(err)?;
            (t.elapsed().as_secs_f64() * 1e3, r)
        };
        files_ms.push(ms);
        delete_forks(engine, &r).await?;
        settle_memory().await;
        let used0 = host_used_bytes()?;
        let t = Instant::now();
        let r = fork(false).await.map_err(err)?;
        live_ms.push(t.elapsed().as_secs_f64() * 1e3);
        if r.processes != sandtree_api::ProcessOutcome::Restored {
            bail!("a fork with processes answered {:?}: {}", r.processes, r.note);
        }
        let ids = fork_ids(&r)?;
        for id in &ids {
            let answer = bash(engine, id, &tcp_request(8000, "GET / HTTP/1.0\\r\\n")).await?;
            if !answer.starts_with("HTTP/1.0 200") {
                bail!("http.server answered {answer:?} in fork {id}");
            }
            // The REPL as at the checkpoint, then its own 1,000 pages.
            let got = bash(engine, id, &tcp_request(9000, "ping")).await?;
            if got != state {
                bail!("the REPL in fork {id} answered {got:?}, {state:?} at the checkpoint");
            }
            bash(engine, id, &tcp_request(9000, "dirty 1000")).await?;
        }
        if i == 0 {
            settle_memory().await;
            used_mb = Some((host_used_bytes()? as f64 - used0 as f64) / 1e6);
        }
        delete_forks(engine, &r).await?;
    }
    engine.delete_sandbox(&sb, true).await.map_err(err)?;
    let g = "processes";
    report.rows.push(Row::new(g, FORK_LIVE_ROW, &live_ms));
    report.rows.push(Row::new(g, FORK_FILES_ROW, &files_ms));
    report.fork_memory = used_mb;
    Ok(())
}

/// The sandboxes a fork made (all of them, or the run fails).
fn fork_ids(r: &sandtree_api::ForkResponse) -> Result<Vec<String>> {
    r.results
        .iter()
        .map(|res| {
            res.sandbox.as_ref().map(|s| s.id.clone()).with_context(|| format!("a fork failed: {:?}", res.error))
        })
        .collect()
}

async fn delete_forks(engine: &Engine, r: &sandtree_api::ForkResponse) -> Result<()> {
    for id in fork_ids(r)? {
        engine.delete_sandbox(&id, true).await.map_err(|e| anyhow::anyhow!("{e}"))?;
    }
    Ok(())
}

/// A moment for memory freed by deleted sandboxes and evicted templates
/// to show.
async fn settle_memory() {
    tokio::time::sleep(Duration::from_secs(1)).await;
}

/// The host's used memory, as `free` counts it: `MemTotal` minus
/// `MemFree`, `Buffers`, `Cached` and `SReclaimable` (the page cache of
/// the images and the trees is not the forks' cost).
fn host_used_bytes() -> Result<u64> {
    let text = std::fs::read_to_string("/proc/meminfo")?;
    let field = |name: &str| -> Result<u64> {
        let line = text.lines().find(|l| l.starts_with(name)).with_context(|| format!("no {name} in /proc/meminfo"))?;
        let kb: u64 = line.split_whitespace().nth(1).context("meminfo")?.parse()?;
        Ok(kb * 1024)
    };
    let free = field("MemFree:")? + field("Buffers:")? + field("Cached:")? + field("SReclaimable:")?;
    Ok(field("MemTotal:")?.saturating_sub(free))
}
