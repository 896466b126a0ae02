//! `sandtree bench --markdown` and `--record DIR`: a run's results as
//! Markdown, and the record of a run in the repository.
//!
//! - [`render_run`]: the whole run as a dated section: a line that says on
//!   what it ran (machine: cores, CPU model, memory; kernel; commit; date),
//!   every row (n, p50, p95, max), the targets, and the notes the plain
//!   report prints under its tables. `--markdown` prints it, and `--record`
//!   appends it to `DIR/docs/benchmarks.md`.
//! - [`render_summary`]: the README's table: the same line, p50 and p95 of
//!   every row, and how many targets the run met. `--record` puts it between
//!   [`BEGIN`] and [`END`] in `DIR/README.md` ([`replace_between_markers`]),
//!   so that the README's table is always one run's, generated.
//!
//! The commit is the repository's (`git rev-parse` in `DIR`, or the current
//! directory without `--record`), marked when tracked files other than the
//! two this module writes differ from it; without git, the crate's version.
//! A README without the two markers, or with them twice or out of order, is
//! an error before the run starts ([`Record::open`]), never a silent no-op.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::SystemTime;

use super::report::Report;

/// The line before the README's generated table.
pub const BEGIN: &str = "<!-- bench:begin -->";
/// The line after it.
pub const END: &str = "<!-- bench:end -->";

/// Where `--record` writes, under its directory.
const README: &str = "README.md";
const RUNS: &str = "docs/benchmarks.md";

/// Errors of `--record`.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    // (`err`, not `source`: the message names it already.)
    #[error("cannot read {path}: {err}: pass the repository's root directory to --record")]
    Read { path: PathBuf, err: std::io::Error },
    #[error("cannot write {path}: {err}")]
    Write { path: PathBuf, err: std::io::Error },
    #[error(
        "{path} has no `{BEGIN}` line followed by an `{END}` line: add both where the results table goes (the run \
         replaces what is between them)"
    )]
    NoMarkers { path: PathBuf },
    #[error("{path} has `{marker}` {count} times: keep one `{BEGIN}` and one `{END}`")]
    TwoMarkers { path: PathBuf, marker: &'static str, count: usize },
}

/// On what a run ran, for its Markdown header.
#[derive(Debug, Clone)]
pub struct RunInfo {
    /// `YYYY-MM-DD HH:MM UTC`, at the run's start.
    pub date: String,
    /// Short commit hash (with ` (with uncommitted changes)` when tracked
    /// files differ), or `version X (no git commit found)`.
    pub commit: String,
    /// Online CPUs.
    pub cores: usize,
    /// `model name` of `/proc/cpuinfo`, when there is one.
    pub cpu_model: Option<String>,
    /// `MemTotal` of `/proc/meminfo`.
    pub memory_bytes: u64,
    /// Options other than the defaults (`--quick`, `--iterations 10`...).
    pub options: Vec<String>,
}

impl RunInfo {
    /// This machine now; the commit of the repository at `repo`.
    pub fn collect(repo: &Path, options: Vec<String>) -> RunInfo {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        let (cores, cpu_model) = parse_cpuinfo(&cpuinfo);
        let cores = if cores > 0 { cores } else { std::thread::available_parallelism().map_or(0, |n| n.get()) };
        RunInfo {
            date: utc_minutes(SystemTime::now()),
            commit: commit(repo),
            cores,
            cpu_model,
            memory_bytes: parse_memtotal(&meminfo).unwrap_or(0),
            options,
        }
    }

    /// The line that says on what the run ran.
    fn machine(&self, report: &Report) -> String {
        let model = self.cpu_model.as_deref().map(|m| format!(" ({m})")).unwrap_or_default();
        let mut s = format!(
            "`sandtree bench` at commit {}, {}; {} cores{model}, {:.1} GiB memory, kernel {}",
            self.commit,
            self.date,
            self.cores,
            self.memory_bytes as f64 / f64::from(1u32 << 30),
            if report.kernel.is_empty() { "unknown" } else { &report.kernel },
        );
        if !self.options.is_empty() {
            let _ = write!(s, "; options {}", self.options.join(" "));
        }
        s
    }
}

/// Online CPUs (`processor` lines) and the first `model name`.
fn parse_cpuinfo(text: &str) -> (usize, Option<String>) {
    let field = |line: &str, key: &str| {
        line.split_once(':').filter(|(k, _)| k.trim() == key).map(|(_, v)| v.trim().to_string())
    };
    let cores = text.lines().filter(|l| field(l, "processor").is_some()).count();
    let model = text.lines().find_map(|l| field(l, "model name")).filter(|m| !m.is_empty());
    (cores, model)
}

/// `MemTotal` in bytes.
fn parse_memtotal(text: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.trim_start_matches("MemTotal:").trim().trim_end_matches("kB").trim().parse().ok()?;
    Some(kib * 1024)
}

/// The commit checked out at `repo`, or the crate's version.
fn commit(repo: &Path) -> String {
    // (The bench runs as root; the repository is often a user's, which git
    // refuses to read for root without `safe.directory`. Read only.)
    let git = |args: &[&str]| {
        Command::new("git")
            .arg("-C")
            .arg(repo)
            .args(["-c", "safe.directory=*"])
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
    };
    let Some(hash) = git(&["rev-parse", "--short", "HEAD"]).map(|h| h.trim().to_string()).filter(|h| !h.is_empty())
    else {
        return format!("version {} (no git commit found)", env!("CARGO_PKG_VERSION"));
    };
    let status = git(&["status", "--porcelain", "--untracked-files=no"]).unwrap_or_default();
    if changed_besides_records(&status) { format!("{hash} (with uncommitted changes)") } else { hash }
}

/// Whether `git status --porcelain` lists a file other than the two a
/// record writes (a second run before the first one's record is committed
/// is still a run of the commit).
fn changed_besides_records(porcelain: &str) -> bool {
    porcelain.lines().filter(|l| l.len() > 3).any(|l| {
        let path = &l[3..];
        path != README && path != RUNS
    })
}

/// `YYYY-MM-DD HH:MM UTC`.
fn utc_minutes(t: SystemTime) -> String {
    // `YYYY-MM-DDTHH:MM:SS.mmmZ`
    let full = sandtree_runtime::rfc3339(t);
    format!("{} {} UTC", &full[..10], &full[11..16])
}

/// A table cell: pipes escaped, a sub-row's indent shown as `↳`.
fn cell(name: &str) -> String {
    let escaped = name.trim().replace('|', "\\|");
    if name.starts_with("  ") { format!("↳ {escaped}") } else { escaped }
}

fn ms(v: f64) -> String {
    if v.is_finite() { format!("{v:.2}") } else { "–".into() }
}

/// `1234567` as `1,234,567`.
fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// The whole run as a Markdown section (for `--markdown` and
/// `docs/benchmarks.md`).
pub fn render_run(report: &Report, info: &RunInfo) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "## {} — {}\n", info.date, info.commit);
    let _ = write!(s, "{}", info.machine(report));
    if report.workload_files > 0 {
        let _ = write!(
            s,
            "; workload {} files / {:.1} MB",
            thousands(report.workload_files),
            report.workload_bytes as f64 / 1e6
        );
    }
    let _ = writeln!(s, "; {:.0} s.\n", report.total_seconds);
    s.push_str("| group | operation | n | p50 ms | p95 ms | max ms |\n");
    s.push_str("|-------|-----------|--:|-------:|-------:|-------:|\n");
    let mut group = "";
    for r in &report.rows {
        let g = if r.group == group { "" } else { &r.group };
        group = &r.group;
        let _ = writeln!(
            s,
            "| {g} | {} | {} | {} | {} | {} |",
            cell(&r.name),
            r.n,
            ms(r.p50_ms),
            ms(r.p95_ms),
            ms(r.max_ms)
        );
    }
    if !report.checks.is_empty() {
        s.push_str("\n| target | goal | measured | result |\n|--------|------|----------|--------|\n");
        for c in &report.checks {
            let result = if c.pass { "met" } else { "**missed**" };
            let _ = writeln!(s, "| {} | {} | {} | {result} |", cell(&c.name), cell(&c.target), cell(&c.measured));
        }
    }
    let notes = report.notes();
    if !notes.is_empty() {
        s.push('\n');
        for n in notes {
            let _ = writeln!(s, "- {n}");
        }
    }
    s
}

/// The README's table: the run's line, p50 / p95 of every row by group,
/// and the targets met.
pub fn render_summary(report: &Report, info: &RunInfo) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{}; p50 / p95 in ms (every run, with n, max and notes: [docs/benchmarks.md](docs/benchmarks.md)).\n",
        info.machine(report)
    );
    s.push_str("| operation | p50 | p95 |\n|-----------|----:|----:|\n");
    let mut group = "";
    for r in &report.rows {
        if r.group != group {
            group = &r.group;
            let _ = writeln!(s, "| **{}** | | |", cell(group));
        }
        let _ = writeln!(s, "| {} | {} | {} |", cell(&r.name), ms(r.p50_ms), ms(r.p95_ms));
    }
    if !report.checks.is_empty() {
        let met = report.checks.iter().filter(|c| c.pass).count();
        let _ = write!(s, "\nTargets met: {met} of {}", report.checks.len());
        let missed: Vec<String> = report
            .checks
            .iter()
            .filter(|c| !c.pass)
            .map(|c| format!("{} ({}): {}", c.name.trim(), c.target, c.measured))
            .collect();
        if missed.is_empty() {
            s.push_str(".\n");
        } else {
            let _ = writeln!(s, "; missed: {}.", missed.join("; "));
        }
    }
    s
}

/// `readme` with what lies between its [`BEGIN`] and [`END`] lines
/// replaced by `block` (`path` names it in errors).
pub fn replace_between_markers(path: &Path, readme: &str, block: &str) -> Result<String, RecordError> {
    for marker in [BEGIN, END] {
        let count = readme.matches(marker).count();
        if count > 1 {
            return Err(RecordError::TwoMarkers { path: path.to_path_buf(), marker, count });
        }
    }
    let no_markers = || RecordError::NoMarkers { path: path.to_path_buf() };
    let begin = readme.find(BEGIN).ok_or_else(no_markers)? + BEGIN.len();
    let end = readme[begin..].find(END).ok_or_else(no_markers)? + begin;
    Ok(format!("{}\n{}\n{}", &readme[..begin], block.trim_end(), &readme[end..]))
}

/// Where `--record` writes: checked before the run, written after it.
#[derive(Debug)]
pub struct Record {
    readme: PathBuf,
    runs: PathBuf,
}

impl Record {
    /// The repository at `dir`: its README must have the markers, and
    /// `docs/benchmarks.md` must exist (a wrong directory fails here, not
    /// after a run of many minutes).
    pub fn open(dir: &Path) -> Result<Record, RecordError> {
        let record = Record { readme: dir.join(README), runs: dir.join(RUNS) };
        let readme = read(&record.readme)?;
        replace_between_markers(&record.readme, &readme, "")?;
        std::fs::metadata(&record.runs).map_err(|err| RecordError::Read { path: record.runs.clone(), err })?;
        Ok(record)
    }

    /// Append the run's section to `docs/benchmarks.md` and put its table
    /// in the README.
    pub fn write(&self, report: &Report, info: &RunInfo) -> Result<(), RecordError> {
        let readme = replace_between_markers(&self.readme, &read(&self.readme)?, &render_summary(report, info))?;
        let mut runs = read(&self.runs)?;
        if !runs.ends_with("\n\n") {
            runs.push_str(if runs.ends_with('\n') { "\n" } else { "\n\n" });
        }
        runs.push_str(&render_run(report, info));
        write(&self.runs, &runs)?;
        write(&self.readme, &readme)
    }
}

fn read(path: &Path) -> Result<String, RecordError> {
    std::fs::read_to_string(path).map_err(|err| RecordError::Read { path: path.to_path_buf(), err })
}

/// Written whole, then renamed over the file.
fn write(path: &Path, text: &str) -> Result<(), RecordError> {
    let err = |err| RecordError::Write { path: path.to_path_buf(), err };
    let tmp = path.with_extension("md.tmp");
    std::fs::write(&tmp, text).map_err(err)?;
    std::fs::rename(&tmp, path).map_err(err)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::UNIX_EPOCH;

    use crate::bench::report::Row;

    fn info() -> RunInfo {
        RunInfo {
            date: "2026-12-06 10:15 UTC".into(),
            commit: "abc1234".into(),
            cores: 2,
            cpu_model: Some("Some CPU @ 2.00GHz".into()),
            memory_bytes: 8 << 30,
            options: Vec::new(),
        }
    }

    fn report() -> Report {
        let mut r = Report {
            kernel: "6.18.0".into(),
            workload_files: 1412,
            workload_bytes: 54_000_000,
            total_seconds: 1183.4,
            ..Default::default()
        };
        r.rows.push(Row::new("sandtree", "create sandbox (default image)", &[2.0, 3.0, 4.0]));
        r.rows.push(Row::new("sandtree", "  frozen window", &[0.5]));
        r.rows.push(Row::new("baseline", "a | b", &[10.0]));
        r.check("create sandbox p50", "<= 15 ms", "3.00 ms".into(), true);
        r.check("frozen window p50", "<= 0.1 ms", "0.50 ms".into(), false);
        r.metadata_bytes_per_checkpoint = 630.0;
        r
    }

    #[test]
    fn run_section_states_machine_kernel_commit_and_date() {
        let md = render_run(&report(), &info());
        let mut lines = md.lines();
        assert_eq!(lines.next(), Some("## 2026-12-06 10:15 UTC — abc1234"));
        assert_eq!(lines.next(), Some(""));
        assert_eq!(
            lines.next(),
            Some(
                "`sandtree bench` at commit abc1234, 2026-12-06 10:15 UTC; 2 cores (Some CPU @ 2.00GHz), 8.0 GiB \
                 memory, kernel 6.18.0; workload 1,412 files / 54.0 MB; 1183 s."
            )
        );
        assert!(md.contains("| group | operation | n | p50 ms | p95 ms | max ms |\n"), "{md}");
        assert!(md.contains("| sandtree | create sandbox (default image) | 3 | 3.00 | 4.00 | 4.00 |\n"), "{md}");
        // A sub-row keeps its mark; a group is named once; pipes escaped.
        assert!(md.contains("|  | ↳ frozen window | 1 | 0.50 | 0.50 | 0.50 |\n"), "{md}");
        assert!(md.contains("| baseline | a \\| b | 1 | 10.00 | 10.00 | 10.00 |\n"), "{md}");
        assert!(md.contains("| create sandbox p50 | <= 15 ms | 3.00 ms | met |\n"), "{md}");
        assert!(md.contains("| frozen window p50 | <= 0.1 ms | 0.50 ms | **missed** |\n"), "{md}");
        assert!(md.contains("\n- metadata per checkpoint: 630 bytes\n"), "{md}");
        // Every table row has as many cells as its header.
        for line in md.lines().filter(|l| l.starts_with('|')) {
            let cells = line.replace("\\|", "").matches('|').count() - 1;
            assert!(cells == 6 || cells == 4, "{line}");
        }
    }

    #[test]
    fn summary_is_p50_and_p95_by_group_with_the_targets() {
        let mut i = info();
        i.options = vec!["--iterations".into(), "10".into()];
        let md = render_summary(&report(), &i);
        assert!(
            md.starts_with(
                "`sandtree bench` at commit abc1234, 2026-12-06 10:15 UTC; 2 cores (Some CPU @ 2.00GHz), 8.0 GiB \
                 memory, kernel 6.18.0; options --iterations 10; p50 / p95 in ms"
            ),
            "{md}"
        );
        assert!(md.contains("| **sandtree** | | |\n| create sandbox (default image) | 3.00 | 4.00 |\n"), "{md}");
        assert!(md.contains("| ↳ frozen window | 0.50 | 0.50 |\n| **baseline** | | |\n"), "{md}");
        assert!(md.ends_with("Targets met: 1 of 2; missed: frozen window p50 (<= 0.1 ms): 0.50 ms.\n"), "{md}");
    }

    #[test]
    fn markers_replace_only_what_is_between_them() {
        let p = Path::new("README.md");
        let readme = format!("# T\n\nbefore\n{BEGIN}\nold table\nold line\n{END}\nafter\n");
        let new = replace_between_markers(p, &readme, "new table\n\n").expect("replaced");
        assert_eq!(new, format!("# T\n\nbefore\n{BEGIN}\nnew table\n{END}\nafter\n"));
        // Again: the same result (nothing piles up).
        assert_eq!(replace_between_markers(p, &new, "new table").expect("again"), new);
    }

    #[test]
    fn a_readme_without_its_markers_is_an_error() {
        let p = Path::new("/repo/README.md");
        let none = replace_between_markers(p, "# T\n| a | b |\n", "x").expect_err("no markers");
        assert!(matches!(none, RecordError::NoMarkers { .. }));
        assert!(none.to_string().contains("/repo/README.md has no `<!-- bench:begin -->` line"), "{none}");
        let only_begin = replace_between_markers(p, &format!("{BEGIN}\n"), "x").expect_err("no end");
        assert!(matches!(only_begin, RecordError::NoMarkers { .. }));
        let reversed = replace_between_markers(p, &format!("{END}\n{BEGIN}\n"), "x").expect_err("reversed");
        assert!(matches!(reversed, RecordError::NoMarkers { .. }));
        let twice = replace_between_markers(p, &format!("{BEGIN}\n{END}\n{BEGIN}\n{END}\n"), "x").expect_err("twice");
        assert!(matches!(twice, RecordError::TwoMarkers { count: 2, .. }), "{twice}");
    }

    #[test]
    fn record_checks_before_and_writes_after() {
        let dir = tempfile::tempdir().expect("tempdir");
        // No README: refused before any run.
        assert!(matches!(Record::open(dir.path()), Err(RecordError::Read { .. })));
        std::fs::write(dir.path().join(README), "# T\nno markers\n").expect("write");
        std::fs::create_dir(dir.path().join("docs")).expect("mkdir");
        std::fs::write(dir.path().join(RUNS), "# Runs\n").expect("write");
        assert!(matches!(Record::open(dir.path()), Err(RecordError::NoMarkers { .. })));
        std::fs::write(dir.path().join(README), format!("# T\n{BEGIN}\nold\n{END}\nend\n")).expect("write");
        let record = Record::open(dir.path()).expect("open");
        record.write(&report(), &info()).expect("first");
        record.write(&report(), &info()).expect("second");
        let readme = std::fs::read_to_string(dir.path().join(README)).expect("readme");
        assert!(readme.starts_with(&format!("# T\n{BEGIN}\n`sandtree bench` at commit abc1234")), "{readme}");
        assert!(readme.ends_with(&format!("0.50 ms.\n{END}\nend\n")), "{readme}");
        assert!(!readme.contains("old"));
        let runs = std::fs::read_to_string(dir.path().join(RUNS)).expect("runs");
        assert!(runs.starts_with("# Runs\n\n## 2026-12-06 10:15 UTC — abc1234\n"), "{runs}");
        assert_eq!(runs.matches("## 2026-12-06").count(), 2, "{runs}");
    }

    #[test]
    fn the_repository_is_ready_for_a_record() {
        // The README keeps its markers and docs/benchmarks.md exists, so
        // that `sandtree bench --record .` at the root works.
        let root = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."));
        Record::open(root).expect("the repository's README.md and docs/benchmarks.md");
    }

    #[test]
    fn run_info_of_this_machine() {
        let root = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."));
        let i = RunInfo::collect(root, Vec::new());
        assert!(i.cores > 0 && i.memory_bytes > 0, "{i:?}");
        assert!(i.date.ends_with(" UTC") && i.date.len() == "2026-12-06 10:15 UTC".len(), "{i:?}");
        assert!(!i.commit.is_empty(), "{i:?}");
    }

    #[test]
    fn machine_facts_from_proc() {
        let cpuinfo = "processor\t: 0\nmodel name\t: Some CPU\n\nprocessor\t: 1\nmodel name\t: Some CPU\n";
        assert_eq!(parse_cpuinfo(cpuinfo), (2, Some("Some CPU".into())));
        assert_eq!(parse_cpuinfo("processor : 0\n"), (1, None));
        assert_eq!(parse_memtotal("MemTotal:        8131288 kB\nMemFree: 1 kB\n"), Some(8_131_288 * 1024));
        assert_eq!(parse_memtotal("nothing"), None);
    }

    #[test]
    fn dates_and_changes() {
        assert_eq!(utc_minutes(UNIX_EPOCH), "1970-01-01 00:00 UTC");
        // 2026-12-06 10:15:42 UTC.
        assert_eq!(utc_minutes(UNIX_EPOCH + std::time::Duration::from_secs(1_796_552_142)), "2026-12-06 10:15 UTC");
        assert_eq!(utc_minutes(UNIX_EPOCH + std::time::Duration::from_secs(951_782_400)), "2000-02-29 00:00 UTC");
        assert!(!changed_besides_records(" M README.md\nM  docs/benchmarks.md\n"));
        assert!(changed_besides_records(" M README.md\n M crates/sandtree/src/main.rs\n"));
        assert!(!changed_besides_records(""));
        assert_eq!(thousands(1412), "1,412");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1_000_000), "1,000,000");
    }
}
