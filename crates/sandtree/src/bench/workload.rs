//! The measured workload and the baselines, run against one engine.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use rand::Rng;
use rand::seq::IndexedRandom;
use sandtree_api::{CheckpointRequest, CreateSandboxRequest, ExecRequest, ForkRequest, RollbackRequest};
use sandtree_runtime::Engine;

use super::BenchArgs;
use super::report::{Report, Row};

/// The pause between the command that dirtied files and the checkpoint in
/// the "think time" row: far shorter than an LLM call.
const THINK_MS: u64 = 100;
const THINK_ROW: &str = "checkpoint, 10 dirty files, 100 ms later";
const THINK_RB_ROW: &str = "rollback, 100 ms after 10 files dirtied";
const COLD_RB_ROW: &str = "rollback, no prepared layer (old chain checkpoint)";
/// Checkpoints this far back in the chain have no prepared layer (the
/// engine keeps `Config::spare_layers`, 64 by default, for recent ones).
const SPARE_HORIZON: usize = 100;

/// Where the workload tree lives inside the sandbox.
const SRC: &str = "/root/src";

async fn timed<T, F: Future<Output = T>>(f: F) -> (T, f64) {
    let t = Instant::now();
    let out = f.await;
    (out, t.elapsed().as_secs_f64() * 1000.0)
}

/// Lets the volume settle between phases: commit what the previous phase
/// left dirty and give btrfs's cleaner time to drop deleted subvolumes, so
/// one phase's garbage is not billed to the next phase's measurements.
/// Between sections: the previous section's teardown is over (the engine's
/// queued subvolume deletions ran, `reaper.rs`, and btrfs's cleaner dropped
/// those subvolumes: after the chain of 1,000 checkpoints that takes tens
/// of seconds, and its transactions would stall the next section's
/// writers), the volume is synced, then one quiet second.
async fn settle(engine: &Engine) {
    let deadline = Instant::now() + std::time::Duration::from_secs(300);
    while engine.pending_deletions() > 0 && Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let root = engine.volume().root().to_path_buf();
    let _ = tokio::task::spawn_blocking(move || {
        // (`btrfs subvolume sync`: until the cleaner is done with every
        // deleted subvolume.)
        let _ = Command::new("btrfs").args(["subvolume", "sync"]).arg(&root).output();
        sandtree_fs::sync_fs(&root)
    })
    .await;
    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
}

fn eprint_phase(args: &BenchArgs, what: &str) {
    if !args.json {
        eprintln!("bench: {what}");
    }
}

pub(super) async fn sh(engine: &Engine, sb: &str, script: &str) -> Result<String> {
    let out = engine
        .exec(
            sb,
            ExecRequest {
                cmd: vec!["sh".into(), "-c".into(), script.into()],
                max_output_bytes: Some(64 << 20),
                ..Default::default()
            },
        )
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    if out.exit_code != Some(0) {
        bail!("`{script}` failed in {sb}: exit {:?}: {}", out.exit_code, out.stderr);
    }
    Ok(out.stdout)
}

/// Appends a line to 10 random files of the tree (inside the sandbox).
async fn dirty(engine: &Engine, sb: &str, files: &[String]) -> Result<()> {
    let picked: Vec<&String> = files.choose_multiple(&mut rand::rng(), 10).collect();
    let mut script = String::from("for f in");
    for f in picked {
        script.push_str(&format!(" '{f}'"));
    }
    script.push_str("; do echo \"# sandtree bench $$\" >> \"$f\"; done");
    sh(engine, sb, &script).await.map(|_| ())
}

pub(super) async fn create(engine: &Engine) -> Result<String> {
    Ok(engine.create_sandbox(CreateSandboxRequest::default()).await.map_err(|e| anyhow::anyhow!("{e}"))?.sandbox.id)
}

async fn checkpoint(engine: &Engine, sb: &str) -> Result<(String, f64)> {
    let r = engine.checkpoint(sb, CheckpointRequest::default()).await.map_err(|e| anyhow::anyhow!("{e}"))?;
    Ok((r.checkpoint.id, r.checkpoint.frozen_ms))
}

async fn rollback(engine: &Engine, sb: &str, ck: &str) -> Result<()> {
    engine
        .rollback(sb, RollbackRequest { checkpoint: ck.into(), allow_restart: false })
        .await
        .map(|_| ())
        .map_err(|e| anyhow::anyhow!("{e}"))
}

/// Checkpoint + rollback measurements on a sandbox holding a tree.
async fn ckpt_rollback_rows(
    engine: &Engine,
    sb: &str,
    files: &[String],
    n: usize,
    label: &str,
    report: &mut Report,
) -> Result<Vec<String>> {
    let (mut ck_ms, mut frozen, mut ids) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..n {
        dirty(engine, sb, files).await?;
        let (r, ms) = timed(checkpoint(engine, sb)).await;
        let (id, fz) = r?;
        ck_ms.push(ms);
        frozen.push(fz);
        ids.push(id);
    }
    let mut rb_ms = Vec::new();
    for _ in 0..n {
        dirty(engine, sb, files).await?;
        let target = ids.choose(&mut rand::rng()).expect("checkpoints").clone();
        let (r, ms) = timed(rollback(engine, sb, &target)).await;
        r?;
        rb_ms.push(ms);
    }
    report.rows.push(Row::new("sandtree", &format!("checkpoint, 10 dirty files{label}"), &ck_ms));
    report.rows.push(Row::new("sandtree", &format!("  frozen window{label}"), &frozen));
    report.rows.push(Row::new("sandtree", &format!("rollback to a random checkpoint{label}"), &rb_ms));
    Ok(ids)
}

pub async fn run_all(engine: &Engine, args: &BenchArgs) -> Result<Report> {
    let mut report = Report::new_run();
    let n = args.iterations.max(5);
    let tree = args.tree.to_string_lossy().into_owned();
    if !args.tree.starts_with("/usr") {
        bail!("--tree must be under /usr (the default image shows the host's /usr)");
    }

    if args.processes_only {
        return processes_rows(engine, args, n, report).await;
    }

    // --- create / exec / delete on the default image ---
    eprint_phase(args, "create, exec /bin/true, delete");
    let (mut create_ms, mut ids) = (Vec::new(), Vec::new());
    for _ in 0..n {
        let (r, ms) = timed(create(engine)).await;
        ids.push(r?);
        create_ms.push(ms);
    }
    let mut exec_ms = Vec::new();
    for _ in 0..n.max(50) {
        let (r, ms) =
            timed(engine.exec(&ids[0], ExecRequest { cmd: vec!["/bin/true".into()], ..Default::default() })).await;
        let out = r.map_err(|e| anyhow::anyhow!("{e}"))?;
        if out.exit_code != Some(0) {
            bail!("/bin/true exited {:?}", out.exit_code);
        }
        exec_ms.push(ms);
    }
    let mut delete_ms = Vec::new();
    for id in &ids {
        let (r, ms) = timed(engine.delete_sandbox(id, false)).await;
        r.map_err(|e| anyhow::anyhow!("{e}"))?;
        delete_ms.push(ms);
    }
    report.rows.push(Row::new("sandtree", "create sandbox (default image)", &create_ms));
    report.rows.push(Row::new("sandtree", "exec /bin/true", &exec_ms));

    // --- the workload sandbox ---
    eprint_phase(args, &format!("copying {tree} into a sandbox"));
    let sb = create(engine).await?;
    sh(engine, &sb, &format!("cp -a '{tree}' {SRC}")).await?;
    let listing = sh(engine, &sb, &format!("find {SRC} -type f")).await?;
    let files: Vec<String> = listing.lines().map(str::to_string).collect();
    let bytes: u64 = sh(engine, &sb, &format!("du -sb {SRC} | cut -f1")).await?.trim().parse().unwrap_or(0);
    report.workload_files = files.len() as u64;
    report.workload_bytes = bytes;

    settle(engine).await;
    eprint_phase(args, "checkpoint / rollback");
    let ck_ids = ckpt_rollback_rows(engine, &sb, &files, n, "", &mut report).await?;

    // An agent checkpoints after its LLM answered, not in the same
    // millisecond as the command that wrote: the engine flushes in that gap.
    eprint_phase(args, "checkpoint after think time");
    let (mut think_ms, mut think_frozen) = (Vec::new(), Vec::new());
    for _ in 0..n {
        dirty(engine, &sb, &files).await?;
        tokio::time::sleep(std::time::Duration::from_millis(THINK_MS)).await;
        let (r, ms) = timed(checkpoint(engine, &sb)).await;
        think_frozen.push(r?.1);
        think_ms.push(ms);
    }
    let mut think_rb = Vec::new();
    for _ in 0..n {
        dirty(engine, &sb, &files).await?;
        tokio::time::sleep(std::time::Duration::from_millis(THINK_MS)).await;
        let target = ck_ids.choose(&mut rand::rng()).expect("checkpoints").clone();
        let (r, ms) = timed(rollback(engine, &sb, &target)).await;
        r?;
        think_rb.push(ms);
    }
    report.rows.push(Row::new("sandtree", THINK_ROW, &think_ms));
    report.rows.push(Row::new("sandtree", "  frozen window (after think time)", &think_frozen));
    report.rows.push(Row::new("sandtree", THINK_RB_ROW, &think_rb));

    settle(engine).await;
    eprint_phase(args, "fork 16");
    let mut fork_ms = Vec::new();
    for _ in 0..n.min(8) {
        let ck = ck_ids.choose(&mut rand::rng()).expect("checkpoints").clone();
        let (r, ms) = timed(
            engine.fork(&ck, ForkRequest { count: 16, labels: Default::default(), limits: None, files_only: true }),
        )
        .await;
        let resp = r.map_err(|e| anyhow::anyhow!("{e}"))?;
        fork_ms.push(ms);
        for res in resp.results {
            let s = res.sandbox.with_context(|| format!("a fork failed: {:?}", res.error))?;
            let (r, ms) = timed(engine.delete_sandbox(&s.id, false)).await;
            r.map_err(|e| anyhow::anyhow!("{e}"))?;
            delete_ms.push(ms);
        }
    }
    report.rows.push(Row::new("sandtree", "fork 16 sandboxes (total)", &fork_ms));
    report.rows.push(Row::new("sandtree", "delete sandbox", &delete_ms));

    // --- baselines on the same tree, same btrfs volume ---
    eprint_phase(args, "baselines (cp -a, tar, git, btrfs CLI)");
    baselines(engine, &args.tree, n.min(10), &mut report)?;

    // --- scale: 10x files ---
    if !args.quick {
        settle(engine).await;
        eprint_phase(args, "10x files");
        let sb10 = create(engine).await?;
        sh(engine, &sb10, &format!("mkdir -p {SRC} && for i in 0 1 2 3 4 5 6 7 8 9; do cp -a '{tree}' {SRC}/$i; done"))
            .await?;
        let files10: Vec<String> =
            sh(engine, &sb10, &format!("find {SRC} -type f")).await?.lines().map(str::to_string).collect();
        // Measured in steady state, not while 140 MB of copy drain to disk.
        settle(engine).await;
        ckpt_rollback_rows(engine, &sb10, &files10, n, &format!(" ({}k files)", files10.len() / 1000), &mut report)
            .await?;
        engine.delete_sandbox(&sb10, true).await.map_err(|e| anyhow::anyhow!("{e}"))?;

        // --- scale: a chain of 1,000 checkpoints ---
        eprint_phase(args, &format!("chain of {} checkpoints", args.chain));
        let before = engine.meta().used_bytes()?;
        let mut chain = Vec::with_capacity(args.chain);
        for i in 0..args.chain {
            let f = &files[rand::rng().random_range(0..files.len())];
            sh(engine, &sb, &format!("echo {i} >> '{f}'")).await?;
            chain.push(checkpoint(engine, &sb).await?.0);
        }
        let after = engine.meta().used_bytes()?;
        report.metadata_bytes_per_checkpoint = (after.saturating_sub(before)) as f64 / args.chain as f64;
        settle(engine).await;
        ckpt_rollback_rows(engine, &sb, &files, n, &format!(" (chain {})", args.chain), &mut report).await?;
        // Old checkpoints have no prepared layer (only the most recent ones
        // do, see `spares.rs`): the rollback snapshots and mounts on its path.
        let old = &chain[..chain.len().saturating_sub(SPARE_HORIZON).max(1)];
        let mut cold = Vec::new();
        for _ in 0..n {
            dirty(engine, &sb, &files).await?;
            let target = old.choose(&mut rand::rng()).expect("chain").clone();
            let (r, ms) = timed(rollback(engine, &sb, &target)).await;
            r?;
            cold.push(ms);
        }
        report.rows.push(Row::new("sandtree", COLD_RB_ROW, &cold));
    }
    engine.delete_sandbox(&sb, true).await.map_err(|e| anyhow::anyhow!("{e}"))?;
    processes_rows(engine, args, n, report).await
}

/// The live-process workload, at 100 MB and (without `--quick`) 1 GB.
async fn processes_rows(engine: &Engine, args: &BenchArgs, n: usize, mut report: Report) -> Result<Report> {
    settle(engine).await;
    eprint_phase(args, "processes (REPL 100 MB, http.server, session shell)");
    super::processes::run(engine, n, 100, &mut report).await?;
    settle(engine).await;
    eprint_phase(args, "processes from their durable image (REPL 100 MB, http.server)");
    super::processes::from_image(engine, n, 100, &mut report).await?;
    settle(engine).await;
    eprint_phase(args, "forks with live processes (REPL 100 MB, http.server)");
    super::processes::forks(engine, n, 100, &mut report).await?;
    settle(engine).await;
    eprint_phase(args, "process tree (bash + 49 jobs)");
    super::processes::tree(engine, n, &mut report).await?;
    settle(engine).await;
    eprint_phase(args, "TCP connections (echo server + client, 16 connections)");
    super::processes::connections(engine, n, &mut report).await?;
    settle(engine).await;
    eprint_phase(args, "PostgreSQL (server + psql in a transaction)");
    super::processes::postgresql(engine, n, &mut report).await?;
    settle(engine).await;
    eprint_phase(args, "a process with 10,000 mappings");
    super::processes::many_mappings(engine, n, &mut report).await?;
    if !args.quick {
        settle(engine).await;
        eprint_phase(args, "processes (REPL 1 GB)");
        super::processes::run(engine, n, 1024, &mut report).await?;
    }
    evaluate(&mut report, args);
    Ok(report)
}

fn run(cmd: &mut Command) -> Result<()> {
    let out = cmd.output().with_context(|| format!("running {cmd:?}"))?;
    if !out.status.success() {
        bail!("{cmd:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(())
}

fn time(cmd: &mut Command) -> Result<f64> {
    let t = Instant::now();
    run(cmd)?;
    Ok(t.elapsed().as_secs_f64() * 1000.0)
}

fn dirty_host(files: &[PathBuf]) -> Result<()> {
    use std::io::Write;
    for f in files.choose_multiple(&mut rand::rng(), 10) {
        let mut file = std::fs::OpenOptions::new().append(true).open(f)?;
        writeln!(file, "# sandtree bench")?;
    }
    Ok(())
}

fn list_files(root: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else { continue };
        for e in entries.flatten() {
            match e.file_type() {
                Ok(t) if t.is_dir() => stack.push(e.path()),
                Ok(t) if t.is_file() => out.push(e.path()),
                _ => {}
            }
        }
    }
    out
}

/// The tools a user would otherwise reach for, on a copy of the same tree on
/// the same btrfs volume.
fn baselines(engine: &Engine, tree: &Path, n: usize, report: &mut Report) -> Result<()> {
    let base = engine.volume().root().join("bench");
    let _ = std::fs::remove_dir_all(&base);
    std::fs::create_dir_all(&base)?;
    let src = base.join("src");
    sandtree_fs::create_subvolume(&src)?;
    run(Command::new("cp").arg("-a").arg(format!("{}/.", tree.display())).arg(&src))?;
    let files = list_files(&src);

    let mut cp = Vec::new();
    for i in 0..n {
        dirty_host(&files)?;
        let dst = base.join(format!("cp{i}"));
        cp.push(time(Command::new("cp").arg("-a").arg(&src).arg(&dst))?);
        std::fs::remove_dir_all(&dst)?;
    }
    report.rows.push(Row::new("baseline", "cp -a (checkpoint by copy)", &cp));

    let mut tar = Vec::new();
    for _ in 0..n.min(5) {
        dirty_host(&files)?;
        let archive = base.join("a.tar");
        let dst = base.join("untar");
        std::fs::create_dir_all(&dst)?;
        let c = time(Command::new("tar").arg("-cf").arg(&archive).arg("-C").arg(&src).arg("."))?;
        let x = time(Command::new("tar").arg("-xf").arg(&archive).arg("-C").arg(&dst))?;
        tar.push(c + x);
        std::fs::remove_dir_all(&dst)?;
        std::fs::remove_file(&archive)?;
    }
    report.rows.push(Row::new("baseline", "tar archive + extract", &tar));

    let git = |args: &[&str]| {
        let mut c = Command::new("git");
        c.arg("-C").arg(&src).args(["-c", "user.name=bench", "-c", "user.email=bench@localhost", "-c", "gc.auto=0"]);
        c.args(args);
        c
    };
    run(&mut git(&["init", "-q"]))?;
    run(&mut git(&["add", "-A"]))?;
    run(&mut git(&["commit", "-q", "-m", "base"]))?;
    let (mut commit, mut checkout) = (Vec::new(), Vec::new());
    for i in 0..n {
        dirty_host(&files)?;
        let t = Instant::now();
        run(&mut git(&["add", "-A"]))?;
        run(&mut git(&["commit", "-q", "-m", &format!("step {i}")]))?;
        commit.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    let revs = String::from_utf8(git(&["rev-list", "HEAD"]).output()?.stdout)?;
    let revs: Vec<&str> = revs.lines().collect();
    for _ in 0..n {
        let rev = *revs.choose(&mut rand::rng()).context("git history is empty")?;
        checkout.push(time(&mut git(&["checkout", "-q", "-f", rev]))?);
    }
    report.rows.push(Row::new("baseline", "git add -A && git commit", &commit));
    report.rows.push(Row::new("baseline", "git checkout (rollback)", &checkout));

    let mut snap = Vec::new();
    if Command::new("btrfs").arg("--version").output().is_ok() {
        for i in 0..n {
            dirty_host(&files)?;
            let dst = base.join(format!("snap{i}"));
            snap.push(time(Command::new("btrfs").args(["-q", "subvolume", "snapshot", "-r"]).arg(&src).arg(&dst))?);
        }
        for i in 0..n {
            sandtree_fs::delete_subvolume(&base.join(format!("snap{i}")))?;
        }
        report.rows.push(Row::new("baseline", "btrfs subvolume snapshot (CLI)", &snap));
    }
    sandtree_fs::delete_subvolume(&src)?;
    let _ = std::fs::remove_dir_all(&base);
    Ok(())
}

fn evaluate(r: &mut Report, args: &BenchArgs) {
    if !args.processes_only {
        evaluate_fs(r, args);
    }
    let p = |r: &Report, name: &str| r.row(name).map(|row| (row.p50_ms, row.p95_ms)).unwrap_or((f64::NAN, f64::NAN));
    let (ck100, _) = p(r, "checkpoint, REPL 100 MB + http + shell");
    r.check("checkpoint with processes (REPL 100 MB) p50", "<= 5 ms", format!("{ck100:.2} ms"), ck100 <= 5.0);
    let (rb50, rb95) = p(r, "rollback in place (REPL 100 MB)");
    r.check("rollback in place with processes p50", "<= 3 ms", format!("{rb50:.2} ms"), rb50 <= 3.0);
    r.check("rollback in place with processes p95", "<= 6 ms", format!("{rb95:.2} ms"), rb95 <= 6.0);
    let (tree, _) = p(r, super::processes::TREE_CK_ROW);
    r.check("checkpoint, 50-process tree p50", "<= 10 ms", format!("{tree:.2} ms"), tree <= 10.0);
    // A workload's checkpoint against a plain fork of its largest process.
    use super::processes::{MAPS_CK_ROW, MAPS_FORK_ROW, PG_CK_ROW, PG_FORK_ROW};
    let ratio_checks = [
        ("checkpoint, PostgreSQL p50 vs a fork of its postmaster", PG_CK_ROW, PG_FORK_ROW, 2.0),
        ("checkpoint, 10,000 mappings p50 vs a fork of it", MAPS_CK_ROW, MAPS_FORK_ROW, 3.0),
    ];
    for (name, ck_row, fork_row, most) in ratio_checks {
        let ratio = p(r, ck_row).0 / p(r, fork_row).0;
        r.check(name, &format!("<= {most}x"), format!("{ratio:.1}x"), ratio <= most);
    }
    let (from_image, _) = p(r, super::processes::FROM_IMAGE_ROW);
    r.check("rollback from the image (REPL 100 MB) p50", "<= 10 ms", format!("{from_image:.2} ms"), from_image <= 10.0);
    let (forks, _) = p(r, super::processes::FORK_LIVE_ROW);
    r.check("fork 16 with live processes p50", "<= 150 ms", format!("{forks:.2} ms"), forks <= 150.0);
    if let Some(mb) = r.fork_memory {
        let most = super::report::fork_memory_target();
        r.check("memory of 16 forks writing 4 MB each", &format!("<= {most:.0} MB"), format!("{mb:.0} MB"), mb <= most);
    }
    let (pg_rb, _) = p(r, super::processes::PG_RB_ROW);
    r.check("rollback in place, PostgreSQL p50", "<= 5 ms", format!("{pg_rb:.2} ms"), pg_rb <= 5.0);
    if !args.quick {
        let (ck1g, _) = p(r, "checkpoint, REPL 1 GB + http + shell");
        r.check("checkpoint with processes (REPL 1 GB) p50", "<= 15 ms", format!("{ck1g:.2} ms"), ck1g <= 15.0);
    }
}

/// The filesystem targets (issue 2).
fn evaluate_fs(r: &mut Report, args: &BenchArgs) {
    let ck = r.p50("checkpoint, 10 dirty files");
    let checks: Vec<(&str, &str, f64, f64)> = vec![
        ("create sandbox p50", "<= 15 ms", r.p50("create sandbox (default image)"), 15.0),
        ("exec /bin/true p50", "<= 5 ms", r.p50("exec /bin/true"), 5.0),
        ("checkpoint (10 dirty files) p50", "<= 5 ms", ck, 5.0),
        ("frozen window p50", "<= 3 ms", r.p50("  frozen window"), 3.0),
        ("rollback p50", "<= 5 ms", r.p50("rollback to a random checkpoint"), 5.0),
        ("fork 16 total p50", "<= 100 ms", r.p50("fork 16 sandboxes (total)"), 100.0),
    ];
    for (name, target, v, limit) in checks {
        r.check(name, target, format!("{v:.2} ms"), v <= limit);
    }
    let think = r.p50(THINK_ROW);
    r.check("checkpoint 100 ms after the writes p50", "<= 5 ms", format!("{think:.2} ms"), think <= 5.0);
    let think_rb = r.p50(THINK_RB_ROW);
    r.check("rollback 100 ms after the writes p50", "<= 5 ms", format!("{think_rb:.2} ms"), think_rb <= 5.0);
    for base in ["cp -a (checkpoint by copy)", "git add -A && git commit"] {
        for (what, ours) in [("checkpoint", ck), ("checkpoint 100 ms later", think)] {
            let ratio = r.p50(base) / ours;
            r.check(&format!("{what} faster than {base}"), ">= 20x", format!("{ratio:.1}x"), ratio >= 20.0);
        }
    }
    if !args.quick {
        let rb = r.p50("rollback to a random checkpoint");
        let names: Vec<String> = r.rows.iter().map(|row| row.name.clone()).collect();
        for name in names {
            let (base, v) = if name.starts_with("checkpoint, 10 dirty files (") {
                (ck, r.p50(&name))
            } else if name.starts_with("rollback to a random checkpoint (") {
                (rb, r.p50(&name))
            } else {
                continue;
            };
            let ratio = v / base;
            r.check(&format!("{name} vs base"), "<= 1.5x", format!("{ratio:.2}x"), ratio <= 1.5);
        }
        let cold = r.p50(COLD_RB_ROW);
        r.check("rollback without a prepared layer p50", "<= 5 ms", format!("{cold:.2} ms"), cold <= 5.0);
        let meta = r.metadata_bytes_per_checkpoint;
        r.check("metadata per checkpoint", "<= 4096 B", format!("{meta:.0} B"), meta <= 4096.0);
    }
}

/// Deletes whatever the bench left in its engine (after an error too).
pub async fn cleanup(engine: &Engine) -> Result<()> {
    if let Ok(list) = engine.list_sandboxes().await {
        for s in list.sandboxes {
            let _ = engine.delete_sandbox(&s.id, true).await;
        }
    }
    // The deleted sandboxes' cgroups are removed in the background: let
    // that finish, or they stay behind when the process exits.
    engine.settle(std::time::Duration::from_secs(10)).await;
    Ok(())
}

/// Unmounts everything under the scratch data directory (the volume, the
/// idmapped host directories, routers' namespaces under `run/net`: a
/// router's namespace and host link go with its last mount) and removes
/// it; says so if it cannot.
pub fn teardown(data_dir: &Path) {
    // (After a clean shutdown nothing is mounted any more.)
    let _ = sandtree_sys::mountinfo::detach_all_under(data_dir);
    if let Err(e) = std::fs::remove_dir_all(data_dir)
        && e.kind() != std::io::ErrorKind::NotFound
    {
        let dir = data_dir.display();
        eprintln!("bench: cannot remove {dir}: {e} (`mount | grep {dir}` shows what holds it)");
    }
}
