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
//! Each run has its own scratch data directory (`/var/tmp/sandtree-bench-<pid>`
//! unless `--data-dir` names one) and its own parent cgroup
//! (`sandtree-bench-<pid>`), so two runs on one host do not meet. At the
//! end, failed or not, the engine is shut down (its sandboxes stopped, their
//! cgroups and the parent removed, the volume unmounted) and the directory
//! removed; a guard kills and removes whatever of the cgroup is left even
//! if the run panics. Directories and cgroups of earlier runs whose process
//! is gone (killed) are removed at the start.
//!
//! Workload: the host's Python standard library (`/usr/lib/python3.11`,
//! about 1,400 files / 54 MB) copied into the sandbox; every step rewrites 10
//! of its files. Results print as a table (p50 / p95 / max in ms, and the
//! ratio of each baseline to Sandtree's checkpoint), as JSON (`--json`) or
//! as Markdown (`--markdown`, `markdown.rs`); `--record DIR` appends the run
//! to `DIR/docs/benchmarks.md` and puts its table in `DIR/README.md`.

mod doors;
mod markdown;
mod network;
mod processes;
mod report;
mod workload;

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result};
use clap::{Args, FromArgMatches};
use sandtree_runtime::{Config, Engine, Zygote};

#[derive(Args, Debug, Clone)]
pub struct BenchArgs {
    /// Scratch data directory (a fresh btrfs image is created inside and
    /// removed after) [default: /var/tmp/sandtree-bench-<pid>].
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
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
    #[arg(long, conflicts_with = "markdown")]
    pub json: bool,
    /// Print Markdown instead of tables: a line naming the machine (cores,
    /// memory), kernel, commit and date, then the results and targets.
    #[arg(long)]
    pub markdown: bool,
    /// Record the run in the repository at DIR (e.g. `.`): append it as a
    /// dated section to DIR/docs/benchmarks.md and replace the table between
    /// the `<!-- bench:begin -->` and `<!-- bench:end -->` lines of
    /// DIR/README.md. Checked before the run starts; needs a full run with
    /// the default engine settings.
    #[arg(long, value_name = "DIR", conflicts_with_all = ["quick", "processes_only", "doors_only", "network_only", "no_pre_sync", "snapshot_processes"])]
    pub record: Option<PathBuf>,
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
    /// Run only the doors: the same round trips through the API, the CLI,
    /// the Python SDK and MCP (HTTP and stdio).
    #[arg(long, conflicts_with = "processes_only")]
    pub doors_only: bool,
    /// Run only the network rows: create, rollback and fork with egress
    /// beside without, TCP round trips and throughput to a test peer.
    #[arg(long, conflicts_with_all = ["processes_only", "doors_only"])]
    pub network_only: bool,
    /// Keep the scratch data directory afterwards (unmounted: `sandtree
    /// daemon --data-dir` on it mounts it again).
    #[arg(long)]
    pub keep: bool,
}

/// Prefix of a run's cgroup and default data directory name.
const RUN_PREFIX: &str = "sandtree-bench-";
/// Where runs' default data directories go.
const SCRATCH: &str = "/var/tmp";

/// The name of the cgroup (and default data directory) of the run of
/// process `pid`.
pub fn run_name(pid: u32) -> String {
    format!("{RUN_PREFIX}{pid}")
}

/// The pid of the run that `name` belongs to, if that process is gone.
pub fn stale_run(name: &str) -> Option<u32> {
    let pid: u32 = name.strip_prefix(RUN_PREFIX)?.parse().ok()?;
    (!std::path::Path::new(&format!("/proc/{pid}")).exists()).then_some(pid)
}

/// Removes the cgroups and default data directories of earlier runs whose
/// process is gone (killed before it could clean up).
fn sweep_stale_runs(backend: &sandtree_runtime::Backend) {
    let mut names: Vec<String> = Vec::new();
    let roots =
        sandtree_runtime::cgroup::parent_dirs(backend, "_").into_iter().filter_map(|d| d.parent().map(PathBuf::from));
    for dir in roots.chain([PathBuf::from(SCRATCH)]) {
        if let Ok(entries) = std::fs::read_dir(&dir) {
            names.extend(entries.flatten().filter_map(|e| e.file_name().into_string().ok()));
        }
    }
    names.sort();
    names.dedup();
    for name in names.iter().filter(|n| stale_run(n).is_some()) {
        eprintln!("bench: removing {name}, left by a run that was killed");
        sandtree_runtime::cgroup::remove_parent(backend, name, true);
        let dir = PathBuf::from(SCRATCH).join(name);
        // (`run` alone: a teardown that stopped half-way, at a mount.)
        if dir.join("btrfs.img").exists() || dir.join("run").is_dir() {
            workload::teardown(&dir);
        }
    }
}

/// Kills and removes whatever is left of a run's cgroup when the run ends,
/// however it ends (an error, a panic), and its data directory unless kept.
struct RunGuard {
    backend: sandtree_runtime::Backend,
    cgroup: String,
    data_dir: Option<PathBuf>,
}

impl Drop for RunGuard {
    fn drop(&mut self) {
        let left = sandtree_runtime::cgroup::remove_parent(&self.backend, &self.cgroup, true);
        if !left.is_empty() {
            eprintln!("bench: cannot remove cgroup(s) {left:?}: remove them by hand (rmdir, deepest first)");
        }
        if let Some(dir) = &self.data_dir {
            workload::teardown(dir);
        }
    }
}

/// Runs the suite. Must be called before any thread exists (it starts the zygote).
pub fn run(args: BenchArgs) -> Result<()> {
    // RUST_LOG=sandtree_proc=debug,sandtree_runtime=debug shows where time goes.
    if let Ok(filter) = tracing_subscriber::EnvFilter::try_from_default_env() {
        let _ = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).try_init();
    }
    // A wrong directory, or a README without its markers, fails now, not
    // after the run.
    let record = args.record.as_deref().map(markdown::Record::open).transpose()?;
    let info = (args.markdown || record.is_some()).then(|| {
        let repo = args.record.clone().unwrap_or_else(|| PathBuf::from("."));
        markdown::RunInfo::collect(&repo, args.options())
    });
    let backend = sandtree_runtime::Backend::detect();
    sweep_stale_runs(&backend);
    let name = run_name(std::process::id());
    let data_dir = args.data_dir.clone().unwrap_or_else(|| PathBuf::from(SCRATCH).join(&name));
    if data_dir.join("btrfs").exists() {
        workload::teardown(&data_dir);
    }
    let guard = RunGuard { backend, cgroup: name.clone(), data_dir: (!args.keep).then(|| data_dir.clone()) };
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
    let mut cfg = Config::with_data_dir(&data_dir);
    cfg.image_size = 32 << 30;
    cfg.cgroup_name = name;
    cfg.pre_sync = !args.no_pre_sync;
    cfg.layered_processes = !args.snapshot_processes;
    // The process workload rolls back to any of its checkpoints, each of
    // which must keep its templates (the pool's default cap is 64
    // checkpoints a sandbox; each holds ~8 MB here).
    cfg.template_checkpoints = cfg.template_checkpoints.max(args.iterations + 10);
    // A host uid range of its own, as a daemon's (not the one data dirs
    // made before ranges were recorded keep): held for the run, free again
    // once its data dir is removed.
    std::fs::create_dir_all(&data_dir).with_context(|| format!("creating {}", data_dir.display()))?;
    let _uid_claim = cfg.claim_uid_range(None, Path::new(sandtree_runtime::uid_range::DEFAULT_REGISTRY))?;
    let zygote = Zygote::start(cfg.host_config()).context("starting the zygote")?;
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let result = rt.block_on(async {
        let t0 = Instant::now();
        let steal = report::Steal::now();
        let engine = Engine::open(cfg.clone(), zygote).await.context("opening the engine")?;
        let mut report = match args.doors_only || args.network_only {
            true => Ok(report::Report::new_run()),
            false => workload::run_all(&engine, &args).await,
        };
        if let Ok(r) = report.as_mut()
            && !args.processes_only
            && !args.doors_only
        {
            eprintln!("bench: the network (egress beside none, round trips, throughput)");
            if let Err(e) = network::rows(engine.clone(), args.iterations.max(5), r).await {
                report = Err(e);
            }
        }
        if let Ok(r) = report.as_mut()
            && !args.processes_only
            && !args.network_only
        {
            eprintln!("bench: the doors (API, CLI, Python SDK, MCP)");
            if let Err(e) = doors::rows(engine.clone(), &data_dir, args.iterations.max(5), r).await {
                report = Err(e);
            }
        }
        let cleanup = workload::cleanup(&engine).await;
        // Sandboxes' and the run's cgroups, the volume's mount and loop device.
        for left in engine.shutdown(false).await.left_behind {
            eprintln!("bench: left behind: {left}");
        }
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
    drop(guard);
    let report = result?;
    match &info {
        _ if args.json => println!("{}", serde_json::to_string_pretty(&report)?),
        Some(info) if args.markdown => print!("{}", markdown::render_run(&report, info)),
        _ => report.print(),
    }
    if let (Some(record), Some(info)) = (record, &info) {
        record.write(&report, info).context("recording the run (its results are printed above)")?;
        eprintln!("bench: recorded in {}", args.record.as_deref().unwrap_or(Path::new(".")).display());
    }
    Ok(())
}

impl BenchArgs {
    /// The options given other than the defaults, for the Markdown header.
    fn options(&self) -> Vec<String> {
        let matches = BenchArgs::augment_args(clap::Command::new("bench")).get_matches_from(["bench"]);
        let Ok(defaults) = BenchArgs::from_arg_matches(&matches) else { return Vec::new() };
        let mut out = Vec::new();
        for (on, flag) in [
            (self.quick, "--quick"),
            (self.processes_only, "--processes-only"),
            (self.doors_only, "--doors-only"),
            (self.network_only, "--network-only"),
            (self.no_pre_sync, "--no-pre-sync"),
            (self.snapshot_processes, "--snapshot-processes"),
        ] {
            if on {
                out.push(flag.to_string());
            }
        }
        if self.iterations != defaults.iterations {
            out.push(format!("--iterations {}", self.iterations));
        }
        if self.chain != defaults.chain && !self.quick && !self.processes_only {
            out.push(format!("--chain {}", self.chain));
        }
        if self.tree != defaults.tree {
            out.push(format!("--tree {}", self.tree.display()));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use clap::{Args, FromArgMatches};

    use super::*;

    fn parse(argv: &[&str]) -> Result<BenchArgs, clap::Error> {
        let matches = BenchArgs::augment_args(clap::Command::new("bench")).try_get_matches_from(argv)?;
        BenchArgs::from_arg_matches(&matches)
    }

    #[test]
    fn record_needs_a_full_run_with_the_default_engine() {
        let args = parse(&["bench", "--markdown", "--record", "."]).expect("full run");
        assert_eq!(args.record.as_deref(), Some(std::path::Path::new(".")));
        for partial in ["--quick", "--processes-only", "--no-pre-sync", "--snapshot-processes"] {
            let err = parse(&["bench", "--record", ".", partial]).expect_err(partial);
            assert_eq!(err.kind(), clap::error::ErrorKind::ArgumentConflict, "{partial}: {err}");
        }
        assert!(parse(&["bench", "--json", "--markdown"]).is_err());
    }

    #[test]
    fn options_name_what_differs_from_the_defaults() {
        assert!(parse(&["bench"]).expect("defaults").options().is_empty());
        let args = parse(&["bench", "--quick", "--iterations", "10", "--chain", "5"]).expect("parse");
        // (--chain means nothing in a quick run.)
        assert_eq!(args.options(), ["--quick", "--iterations 10"]);
    }

    #[test]
    fn each_run_has_its_own_cgroup_and_a_gone_run_is_stale() {
        let me = std::process::id();
        assert_eq!(run_name(me), format!("sandtree-bench-{me}"));
        assert_ne!(run_name(me), run_name(me + 1));
        assert_eq!(stale_run(&run_name(me)), None, "this run is alive");
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let gone = child.id();
        child.wait().unwrap();
        assert_eq!(stale_run(&run_name(gone)), Some(gone));
        for other in ["sandtree-bench", "sandtree", "sandtree-bench-x", "sandtree-test-1"] {
            assert_eq!(stale_run(other), None, "{other}");
        }
    }

    #[test]
    fn the_guard_kills_and_removes_the_runs_cgroup() {
        if !nix::unistd::Uid::effective().is_root() {
            eprintln!("SKIP: needs root");
            return;
        }
        let backend = sandtree_runtime::Backend::detect();
        let name = run_name(std::process::id());
        // A sandbox's cgroup as a run that failed midway leaves it.
        let cg = sandtree_runtime::Cgroup::new(backend.clone(), &name, "sb-1");
        cg.create(&sandtree_runtime::CgroupLimits::default()).unwrap();
        let mut sleeper = std::process::Command::new("sleep").arg("1000").spawn().unwrap();
        cg.add(sleeper.id() as i32).unwrap();
        let dirs = sandtree_runtime::cgroup::parent_dirs(&backend, &name);
        assert!(dirs.iter().all(|d| d.exists()));
        drop(RunGuard { backend, cgroup: name, data_dir: None });
        assert!(sleeper.wait().unwrap().code().is_none(), "killed");
        assert!(dirs.iter().all(|d| !d.exists()), "{dirs:?}");
    }
}
