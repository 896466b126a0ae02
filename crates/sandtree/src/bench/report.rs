//! Benchmark results: percentiles, target checks, table and JSON output
//! (Markdown: `markdown.rs`).

use serde::Serialize;

/// One measured operation.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    pub group: String,
    pub name: String,
    pub n: usize,
    pub p50_ms: f64,
    pub p95_ms: f64,
    pub max_ms: f64,
}

impl Row {
    pub fn new(group: &str, name: &str, samples: &[f64]) -> Row {
        let mut v = samples.to_vec();
        v.sort_by(f64::total_cmp);
        Row {
            group: group.into(),
            name: name.into(),
            n: v.len(),
            p50_ms: percentile(&v, 50.0),
            p95_ms: percentile(&v, 95.0),
            max_ms: v.last().copied().unwrap_or(f64::NAN),
        }
    }
}

/// The memory target for `processes::FORKS` forks that each
/// write 4 MB: 8 MB each, plus 50 MB (MB).
pub fn fork_memory_target() -> f64 {
    super::processes::FORKS as f64 * 8.0 + 50.0
}

/// Nearest-rank percentile of sorted samples.
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// A target from the issue, checked against the measurement.
#[derive(Debug, Clone, Serialize)]
pub struct Check {
    pub name: String,
    pub target: String,
    pub measured: String,
    pub pass: bool,
}

#[derive(Debug, Clone, Serialize, Default)]
pub struct Report {
    pub kernel: String,
    pub workload_files: u64,
    pub workload_bytes: u64,
    pub rows: Vec<Row>,
    pub checks: Vec<Check>,
    pub metadata_bytes_per_checkpoint: f64,
    /// Process workload: (REPL size, checkpoints held, bytes the template
    /// pool holds after them).
    pub template_pool: Vec<(String, usize, u64)>,
    /// Process workload: (REPL size, pages written a checkpoint that the
    /// REPL's holder copied in the frozen window, p50 of the right-after
    /// checkpoints; the rest were read with `process_vm_readv`).
    pub holder_pages: Vec<(String, f64)>,
    /// Lines for under the tables that a group adds (the doors: what the
    /// e2b SDK's own client work costs).
    pub notes_extra: Vec<String>,
    /// Process workload: (REPL size, bytes of each step checkpoint's
    /// durable process image but the first, the first's bytes).
    pub image_bytes: Vec<(String, Vec<f64>, u64)>,
    /// Process workload: (REPL size, process templates of the right-after
    /// checkpoints made from the standby of the template before the
    /// previous one, templates of tracked processes made then).
    pub from_prev: Vec<(String, u64, usize)>,
    /// Process workload: (REPL size, process templates of the right-after
    /// checkpoints made from a standby still being forked, which the
    /// frozen window did not wait for, templates of tracked processes
    /// made then).
    pub from_forks: Vec<(String, u64, usize)>,
    /// Forks with live processes: the host's used memory added by
    /// `processes::FORKS` forks of the REPL 100 MB workload that each
    /// dirtied 1,000 pages, in MB.
    pub fork_memory: Option<f64>,
    pub total_seconds: f64,
    /// Share of the CPUs' time that the hypervisor gave to others while
    /// this machine wanted it (`steal` in `/proc/stat`), in percent: the
    /// whole run, and each process workload (name, share).
    pub cpu_stolen: Vec<(String, f64)>,
    /// Host pids of the inits of other sandboxes running when the run
    /// started (another daemon's, a killed test's).
    pub other_sandboxes: Vec<i32>,
}

/// The CPUs' time counters of `/proc/stat` (in ticks): stolen by the
/// hypervisor, and all of it. On a virtual machine the host may run other
/// guests on this one's CPUs; a run in such a spell is slower in every
/// row (here, 2026-12-03: a `--processes-only --quick` run with 15% of the
/// time stolen gave a 100 MB checkpoint p50 of 13.1 ms, where quieter runs
/// of the same binary gave 5.0-6.4 ms).
#[derive(Debug, Clone, Copy)]
pub struct Steal {
    stolen: u64,
    total: u64,
}

impl Steal {
    /// The counters now (`None` without `/proc/stat`).
    pub fn now() -> Option<Steal> {
        let stat = std::fs::read_to_string("/proc/stat").ok()?;
        Steal::parse(stat.lines().next()?)
    }

    /// The aggregate `cpu` line: user nice system idle iowait irq softirq
    /// steal (guest time is counted in user already).
    fn parse(line: &str) -> Option<Steal> {
        let mut fields = line.split_whitespace();
        (fields.next()? == "cpu").then_some(())?;
        let v: Vec<u64> = fields.take(8).map(str::parse).collect::<Result<_, _>>().ok()?;
        (v.len() == 8).then(|| Steal { stolen: v[7], total: v.iter().sum() })
    }

    /// The share stolen from `self` to `later`, in percent.
    pub fn percent_until(&self, later: &Steal) -> f64 {
        let total = later.total.saturating_sub(self.total);
        if total == 0 {
            return 0.0;
        }
        later.stolen.saturating_sub(self.stolen) as f64 * 100.0 / total as f64
    }
}

/// Host pids of the sandbox inits running on this machine (named
/// [`sandtree_runtime::INIT_NAME`]).
pub fn sandbox_inits() -> Vec<i32> {
    let name = sandtree_runtime::INIT_NAME.to_str().unwrap_or_default();
    let Ok(dir) = std::fs::read_dir("/proc") else { return Vec::new() };
    let mut pids: Vec<i32> = dir
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .filter(|pid| std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim_end() == name))
        .collect();
    pids.sort_unstable();
    pids
}

impl Report {
    /// An empty report of a run on this machine.
    pub fn new_run() -> Report {
        Report {
            kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default().trim().to_string(),
            ..Default::default()
        }
    }

    pub fn row(&self, name: &str) -> Option<&Row> {
        self.rows.iter().find(|r| r.name == name)
    }

    pub fn p50(&self, name: &str) -> f64 {
        self.row(name).map(|r| r.p50_ms).unwrap_or(f64::NAN)
    }

    pub fn check(&mut self, name: &str, target: &str, measured: String, pass: bool) {
        self.checks.push(Check { name: name.into(), target: target.into(), measured, pass });
    }

    pub fn print(&self) {
        println!(
            "sandtree bench — kernel {}, workload {} files / {:.1} MB, {:.0} s",
            self.kernel,
            self.workload_files,
            self.workload_bytes as f64 / 1e6,
            self.total_seconds
        );
        let mut group = "";
        println!("\n{:<11} {:<44} {:>5} {:>10} {:>10} {:>10}", "group", "operation", "n", "p50 ms", "p95 ms", "max ms");
        println!("{}", "-".repeat(95));
        for r in &self.rows {
            let g = if r.group == group { "" } else { &r.group };
            group = &r.group;
            println!("{:<11} {:<44} {:>5} {:>10.2} {:>10.2} {:>10.2}", g, r.name, r.n, r.p50_ms, r.p95_ms, r.max_ms);
        }
        println!("\n{:<58} {:<16} {:<16} result", "target", "goal", "measured");
        println!("{}", "-".repeat(100));
        for c in &self.checks {
            println!("{:<58} {:<16} {:<16} {}", c.name, c.target, c.measured, if c.pass { "PASS" } else { "MISS" });
        }
        println!();
        for line in self.notes() {
            println!("{line}");
        }
    }

    /// The lines printed under the tables: the pool, the paths taken, the
    /// CPU time stolen, other sandboxes, and how fast the machine forked
    /// and switched tasks during the run (also in `--markdown`).
    pub fn notes(&self) -> Vec<String> {
        let mut out = self.notes_extra.clone();
        if self.metadata_bytes_per_checkpoint > 0.0 {
            out.push(format!("metadata per checkpoint: {:.0} bytes", self.metadata_bytes_per_checkpoint));
        }
        for (repl, n, bytes) in &self.template_pool {
            out.push(format!(
                "template pool, REPL {repl}: {:.1} MB for {n} checkpoints ({:.2} MB each; 1,000 pages dirtied per step = 4.1 MB)",
                *bytes as f64 / 1e6,
                *bytes as f64 / 1e6 / (*n).max(1) as f64
            ));
        }
        for (repl, bytes, first) in &self.image_bytes {
            let mut v = bytes.clone();
            v.sort_by(f64::total_cmp);
            out.push(format!(
                "process image per checkpoint, REPL {repl}: {:.2} MB written p50, {:.2} MB p95 (1,000 pages dirtied per step = 4.1 MB; target <= 8 MB); the first, whole: {:.1} MB",
                percentile(&v, 50.0) / 1e6,
                percentile(&v, 95.0) / 1e6,
                *first as f64 / 1e6
            ));
        }
        if let Some(mb) = self.fork_memory {
            out.push(format!(
                "memory of {} forks with live processes (REPL 100 MB + http), each writing 4 MB: {mb:.0} MB of the host's used memory added (target <= {:.0} MB)",
                super::processes::FORKS,
                fork_memory_target()
            ));
        }
        for (repl, pages) in &self.holder_pages {
            out.push(format!(
                "written pages copied by the holder in the frozen window, REPL {repl}: {pages:.0} a checkpoint (the rest read from the daemon)"
            ));
        }
        for (repl, prev, of) in &self.from_prev {
            out.push(format!(
                "templates made from the standby of the template before the previous one (its own not forked yet), REPL {repl}: {prev} of {of}"
            ));
        }
        for (repl, later, of) in &self.from_forks {
            out.push(format!(
                "templates made from a standby still being forked (the frozen window did not wait for it), REPL {repl}: {later} of {of}"
            ));
        }
        if !self.cpu_stolen.is_empty() {
            let parts: Vec<String> = self.cpu_stolen.iter().map(|(what, p)| format!("{what} {p:.1}%")).collect();
            out.push(format!(
                "CPU time stolen by the hypervisor (other guests' time on these CPUs): {}",
                parts.join(", ")
            ));
        }
        if !self.other_sandboxes.is_empty() {
            out.push(format!(
                "warning: {} other sandbox(es) ran beside this run (init pids {:?}): its numbers are slower",
                self.other_sandboxes.len(),
                self.other_sandboxes
            ));
        }
        // How fast this machine was: the same kernel work a template made
        // by a fork costs, measured in the same run.
        for (repl, ..) in &self.template_pool {
            let ck = self.p50(&format!("checkpoint, REPL {repl} + http + shell"));
            let fork = self.p50(&super::processes::fork_row(repl));
            if ck.is_finite() && fork.is_finite() && fork > 0.0 {
                out.push(format!(
                    "checkpoint with processes, REPL {repl}: {:.2}x a plain fork() of a {repl} process ({fork:.2} ms p50 in this run)",
                    ck / fork
                ));
            }
            let inject = self.p50(&super::processes::inject_row(repl));
            if inject.is_finite() {
                out.push(format!(
                    "a syscall injected by ptrace, REPL {repl} run: {:.1} µs p50 (the unit of a checkpoint's pass 1)",
                    inject * 100.0
                ));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 50.0), 50.0);
        assert_eq!(percentile(&v, 95.0), 95.0);
        assert_eq!(percentile(&[3.0], 95.0), 3.0);
        assert!(percentile(&[], 50.0).is_nan());
    }

    #[test]
    fn steal_share_from_proc_stat_lines() {
        let a = Steal::parse("cpu  100 0 50 800 10 0 5 35 0 0").expect("parse");
        let b = Steal::parse("cpu  200 0 60 900 10 0 5 55 0 0").expect("parse");
        // 20 stolen of 230 ticks.
        assert!((a.percent_until(&b) - 20.0 * 100.0 / 230.0).abs() < 1e-9);
        assert!(Steal::parse("cpu0 1 2 3 4 5 6 7 8").is_none());
        assert!(Steal::parse("cpu 1 2 3").is_none());
    }

    #[test]
    fn row_sorts_samples() {
        let r = Row::new("g", "op", &[5.0, 1.0, 3.0]);
        assert_eq!((r.n, r.p50_ms, r.max_ms), (3, 3.0, 5.0));
    }
}
