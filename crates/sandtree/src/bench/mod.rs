//! `sandtree bench`: the benchmark suite, with baselines in the same run.
//!
//! It starts its own engine on a scratch data directory (its own btrfs image,
//! so it never touches a running daemon's state) and measures, on one
//! workload, Sandtree's verbs and the tools a user would otherwise reach for:
//!
//! | group      | what is timed |
//! |------------|---------------|
//! | sandtree   | create (default image), exec `/bin/true`, checkpoint (+ frozen window) after dirtying 10 files, rollback to a random earlier checkpoint, fork of 16, delete |
//! | baselines  | `cp -a` of the tree, `tar` archive + extract, `git add -A && git commit`, `git checkout`, `btrfs subvolume snapshot` (the CLI) |
//! | scale      | checkpoint / rollback with 10x the files, and at the end of a chain of 1,000 checkpoints; metadata bytes per checkpoint |
//! | processes  | a session shell, a Python REPL holding 100 MB (and 1 GB) and `http.server`: checkpoint, processes' pause, rollback in place, rollback until the first HTTP answer, template pool memory (see `processes.rs`) |
//!
//! Workload: the host's Python standard library (`/usr/lib/python3.11`,
//! about 1,400 files / 54 MB) copied into the sandbox; every step rewrites 10
//! of its files. Results print as a table (p50 / p95 / max in ms, and the
//! ratio of each baseline to Sandtree's checkpoint) and as JSON (`--json`).

mod processes;
mod report;
mod workload;

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result};
use clap::Args;
use sandtree_runtime::{Config, Engine, Zygote};

#[derive(Args, Debug, Clone)]
pub struct BenchArgs {
    /// Scratch data directory (a fresh btrfs image is created inside and removed after).
    #[arg(long, default_value = "/var/tmp/sandtree-bench")]
    pub data_dir: PathBuf,
    /// Iterations per measured operation.
    #[arg(long, default_value_t = 30)]
    pub iterations: usize,
    /// Length of the checkpoint chain for the depth test.
    #[arg(long, default_value_t = 1000)]
    pub chain: usize,
    /// Skip the 10x-files and 1,000-deep scale runs.
    #[arg(long)]
    pub quick: bool,
    /// Print JSON instead of tables.
    #[arg(long)]
    pub json: bool,
    /// Source tree of the workload.
    #[arg(long, default_value = "/usr/lib/python3.11")]
    pub tree: PathBuf,
    /// Do not flush dirty data before freezing (the snapshot then flushes it
    /// inside the frozen window).
    #[arg(long)]
    pub no_pre_sync: bool,
    /// Checkpoint running processes over a btrfs snapshot, not a layered
    /// checkpoint (for comparison).
    #[arg(long)]
    pub snapshot_processes: bool,
    /// Run only the process workload (REPL, http.server, shell), for quick
    /// iterations on the process engine.
    #[arg(long)]
    pub processes_only: bool,
    /// Keep the scratch data directory afterwards.
    #[arg(long)]
    pub keep: bool,
}

/// Runs the suite. Must be called before any thread exists (it starts the zygote).
pub fn run(args: BenchArgs) -> Result<()> {
    // RUST_LOG=sandtree_proc=debug,sandtree_runtime=debug shows where time goes.
    if let Ok(filter) = tracing_subscriber::EnvFilter::try_from_default_env() {
        let _ = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).try_init();
    }
    if args.data_dir.join("btrfs").exists() {
        workload::teardown(&args.data_dir);
    }
    // Sandboxes of a daemon or of a test killed half-way share the CPUs
    // with the run (one test left behind a shell polling with `sleep
    // 0.01`: every process row was slower for as long as it ran).
    let others = report::sandbox_inits();
    if !others.is_empty() {
        eprintln!(
            "bench: warning: {} other sandbox(es) running on this machine (init pids {others:?}): the numbers will be slower",
            others.len()
        );
    }
    let mut cfg = Config::with_data_dir(&args.data_dir);
    cfg.image_size = 32 << 30;
    cfg.cgroup_name = "sandtree-bench".into();
    cfg.pre_sync = !args.no_pre_sync;
    cfg.layered_processes = !args.snapshot_processes;
    // The process workload rolls back to any of its checkpoints, each of
    // which must keep its templates (the pool's default cap is 64
    // checkpoints a sandbox; each holds ~8 MB here).
    cfg.template_checkpoints = cfg.template_checkpoints.max(args.iterations + 10);
    let zygote = Zygote::start(cfg.host_config()).context("starting the zygote")?;
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let result = rt.block_on(async {
        let t0 = Instant::now();
        let steal = report::Steal::now();
        let engine = Engine::open(cfg.clone(), zygote).await.context("opening the engine")?;
        let report = workload::run_all(&engine, &args).await;
        let cleanup = workload::cleanup(&engine).await;
        let mut report = report?;
        cleanup?;
        report.other_sandboxes = others;
        if let (Some(s0), Some(s1)) = (steal, report::Steal::now()) {
            report.cpu_stolen.insert(0, ("whole run".into(), s0.percent_until(&s1)));
        }
        report.total_seconds = t0.elapsed().as_secs_f64();
        Ok::<_, anyhow::Error>(report)
    });
    rt.shutdown_background();
    if !args.keep {
        workload::teardown(&args.data_dir);
    }
    let report = result?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        report.print();
    }
    Ok(())
}
