//! Sandbox cgroups on cgroup v1 (one directory per controller) or pure
//! cgroup v2 (one directory).
//!
//! Layout: v1 `/sys/fs/cgroup/<ctrl>/<cgroup_name>/<id>` for `freezer`,
//! `memory`, `pids`, `cpu`, `cpuacct`; v2 `<root>/<cgroup_name>/<id>` with
//! `memory pids cpu` enabled in the parents' `cgroup.subtree_control`.
//!
//! The *pool* (`<id>/pool`, in the hierarchy of [`Cgroup::procs_dir`]
//! only: v1 `freezer`) holds the daemon's process templates and their
//! helpers (`sandtree-proc`'s tracer moves them there), so that the
//! sandbox's own `cgroup.procs` lists only the processes that run: a
//! rollback's kill reads that list (a few pids) instead of the pid
//! namespace's `/proc` (hundreds of pool pids, 0.3-0.7 ms). It is a child
//! of the sandbox's cgroup: its tasks count toward the sandbox's limits as
//! before (v1: it exists in the freezer hierarchy alone, so memory and
//! pids stay charged to `<id>`; v2: `<id>` enables no controller for its
//! children, so they are charged to `<id>`), and freezing the sandbox
//! freezes it too.
//!
//! Kernel quirks worked around:
//! * `cgroup.events` `POLLPRI` notifications are rate limited (~10 ms), so
//!   freezing polls the state file (`freezer.state` / `cgroup.events`) in a
//!   tight loop with short sleeps instead; freezing usually completes in
//!   0.04-0.2 ms.
//! * v1 has no `cgroup.kill`: freeze, `SIGKILL` every member, thaw (frozen
//!   tasks die as soon as they are thawed), repeat until empty.
//! * Controllers missing from a hierarchy (hybrid hosts expose only
//!   freeze/kill/procs on the unified mount) are skipped with a note.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde::{Deserialize, Serialize};

use crate::config::Limits;

/// Errors of this module.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A cgroup file operation failed.
    #[error("cgroup {op} {path}: {source}")]
    Io {
        /// What we did.
        op: &'static str,
        /// File or directory.
        path: PathBuf,
        /// The error.
        source: io::Error,
    },
    /// Tasks did not freeze in time; the cgroup was thawed again.
    #[error("freeze timed out after {timeout:?}; stuck tasks: {stuck:?}")]
    FreezeTimeout {
        /// The timeout.
        timeout: Duration,
        /// Tasks that were not frozen.
        stuck: Vec<StuckTask>,
    },
    /// Processes survived killing.
    #[error("cgroup {path} still has processes after kill")]
    NotEmpty {
        /// The cgroup.
        path: PathBuf,
    },
}

/// Result alias of this module.
pub type Result<T> = std::result::Result<T, Error>;

/// A task that did not freeze.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct StuckTask {
    /// Host pid.
    pub pid: i32,
    /// `comm`.
    pub comm: String,
    /// State letter from `/proc/<pid>/stat` (`D` = uninterruptible).
    pub state: String,
}

/// Resource usage of a sandbox.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Usage {
    /// Current memory usage.
    pub memory_bytes: u64,
    /// Memory limit (None = unlimited).
    pub memory_limit: Option<u64>,
    /// Current number of tasks.
    pub pids: u64,
    /// Task limit.
    pub pids_limit: Option<u64>,
    /// CPU time used, microseconds.
    pub cpu_usec: u64,
}

/// Which cgroup hierarchy layout the host uses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Backend {
    /// One hierarchy per controller under `root` (`/sys/fs/cgroup`).
    V1 {
        /// Directory containing `freezer/`, `memory/`, ...
        root: PathBuf,
    },
    /// Unified hierarchy mounted at `root`.
    V2 {
        /// The cgroup2 mount.
        root: PathBuf,
    },
}

const V1_CONTROLLERS: [&str; 5] = ["freezer", "memory", "pids", "cpu", "cpuacct"];

/// The pool's directory name, under the sandbox's (see the module docs).
const POOL: &str = "pool";

impl Backend {
    /// Pure v2 if `/sys/fs/cgroup/cgroup.controllers` exists, else v1.
    pub fn detect() -> Backend {
        let root = PathBuf::from("/sys/fs/cgroup");
        if root.join("cgroup.controllers").exists() { Backend::V2 { root } } else { Backend::V1 { root } }
    }
}

/// The cgroup(s) of one sandbox. Cheap to construct; does not touch the
/// filesystem until a method is called.
#[derive(Clone, Debug)]
pub struct Cgroup {
    backend: Backend,
    /// v1: one directory per available controller (freezer first); v2: one.
    dirs: Vec<(String, PathBuf)>,
}

fn io_err(op: &'static str, path: &Path) -> impl FnOnce(io::Error) -> Error {
    let path = path.to_path_buf();
    move |source| Error::Io { op, path, source }
}

fn read(path: &Path) -> Result<String> {
    fs::read_to_string(path).map_err(io_err("read", path))
}

fn write(path: &Path, value: &str) -> Result<()> {
    fs::write(path, value).map_err(io_err("write", path))
}

/// The pids of a `cgroup.procs` file.
fn read_pids(path: &Path) -> Result<Vec<i32>> {
    Ok(read(path)?.lines().filter_map(|l| l.trim().parse().ok()).collect())
}

fn read_u64(path: &Path) -> Result<u64> {
    Ok(read(path)?.trim().parse().unwrap_or(0))
}

fn read_limit(path: &Path) -> Result<Option<u64>> {
    let s = read(path)?;
    let s = s.trim();
    if s == "max" {
        return Ok(None);
    }
    match s.parse::<u64>() {
        // v1 reports "unlimited" as a huge page-aligned number.
        Ok(v) if v >= (1u64 << 62) => Ok(None),
        Ok(v) => Ok(Some(v)),
        Err(_) => Ok(None),
    }
}

impl Cgroup {
    /// The cgroup of sandbox `id` under parent `name` on `backend`.
    pub fn new(backend: Backend, name: &str, id: &str) -> Cgroup {
        let dirs = match &backend {
            Backend::V1 { root } => {
                let mut dirs: Vec<(String, PathBuf)> = Vec::new();
                let mut seen: Vec<PathBuf> = Vec::new();
                for ctrl in V1_CONTROLLERS {
                    let hier = root.join(ctrl);
                    let Ok(real) = fs::canonicalize(&hier) else {
                        continue;
                    };
                    if seen.contains(&real) {
                        continue; // cpu and cpuacct co-mounted
                    }
                    seen.push(real);
                    dirs.push((ctrl.to_string(), hier.join(name).join(id)));
                }
                dirs
            }
            Backend::V2 { root } => vec![("unified".to_string(), root.join(name).join(id))],
        };
        Cgroup { backend, dirs }
    }

    /// The backend.
    pub fn backend(&self) -> &Backend {
        &self.backend
    }

    fn dir(&self, ctrl: &str) -> Option<&Path> {
        match self.backend {
            Backend::V2 { .. } => Some(&self.dirs[0].1),
            Backend::V1 { .. } => self.dirs.iter().find(|(c, _)| c == ctrl).map(|(_, p)| p.as_path()),
        }
    }

    /// Directory whose `cgroup.procs` lists every member.
    pub fn procs_dir(&self) -> &Path {
        self.dir("freezer").or_else(|| self.dir("pids")).unwrap_or(&self.dirs[0].1)
    }

    /// The pool's directory (see the module docs): a child of
    /// [`Cgroup::procs_dir`].
    pub fn pool_dir(&self) -> PathBuf {
        self.procs_dir().join(POOL)
    }

    /// Make the pool's directory if it is missing (a sandbox booted by an
    /// older daemon has none).
    pub fn ensure_pool(&self) -> Result<()> {
        let dir = self.pool_dir();
        match fs::create_dir(&dir) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
            Err(e) => Err(io_err("mkdir", &dir)(e)),
        }
    }

    /// Host pids of the pool's members (none if it has no directory).
    pub fn pool_procs(&self) -> Result<Vec<i32>> {
        match read_pids(&self.pool_dir().join("cgroup.procs")) {
            Err(Error::Io { source, .. }) if source.kind() == io::ErrorKind::NotFound => Ok(Vec::new()),
            r => r,
        }
    }

    /// Host pids of every member and of the pool's (freezing and
    /// `cgroup.kill` reach both).
    fn all_procs(&self) -> Result<Vec<i32>> {
        let mut pids = self.procs()?;
        pids.extend(self.pool_procs()?);
        Ok(pids)
    }

    /// Whether the cgroup directory exists.
    pub fn exists(&self) -> bool {
        self.procs_dir().exists()
    }

    /// Create the directories and apply `limits`.
    pub fn create(&self, limits: &Limits) -> Result<()> {
        match &self.backend {
            Backend::V1 { .. } => {
                for (_, dir) in &self.dirs {
                    fs::create_dir_all(dir).map_err(io_err("mkdir", dir))?;
                }
                if let (Some(mem), Some(bytes)) = (self.dir("memory"), limits.memory_bytes) {
                    write(&mem.join("memory.limit_in_bytes"), &bytes.to_string())?;
                    let memsw = mem.join("memory.memsw.limit_in_bytes");
                    if memsw.exists() {
                        write(&memsw, &bytes.to_string())?;
                    }
                }
                if let (Some(pids), Some(max)) = (self.dir("pids"), limits.pids) {
                    write(&pids.join("pids.max"), &max.to_string())?;
                }
                if let (Some(cpu), Some(mc)) = (self.dir("cpu"), limits.cpu_millicores) {
                    write(&cpu.join("cpu.cfs_period_us"), "100000")?;
                    write(&cpu.join("cpu.cfs_quota_us"), &(mc * 100).max(1000).to_string())?;
                }
            }
            Backend::V2 { root } => {
                let dir = &self.dirs[0].1;
                let parent = dir.parent().unwrap_or(root);
                fs::create_dir_all(parent).map_err(io_err("mkdir", parent))?;
                // Enable the controllers we need down the path (root, parent).
                for level in [root.as_path(), parent] {
                    let avail = read(&level.join("cgroup.controllers")).unwrap_or_default();
                    let want: Vec<String> = ["memory", "pids", "cpu"]
                        .iter()
                        .filter(|c| avail.split_whitespace().any(|a| a == **c))
                        .map(|c| format!("+{c}"))
                        .collect();
                    if !want.is_empty() {
                        write(&level.join("cgroup.subtree_control"), &want.join(" "))?;
                    }
                }
                fs::create_dir_all(dir).map_err(io_err("mkdir", dir))?;
                let set = |file: &str, value: String| -> Result<()> {
                    let path = dir.join(file);
                    if path.exists() {
                        write(&path, &value)
                    } else {
                        tracing::warn!(path = %path.display(), "cgroup controller file missing, limit not applied");
                        Ok(())
                    }
                };
                if let Some(bytes) = limits.memory_bytes {
                    set("memory.max", bytes.to_string())?;
                    if dir.join("memory.swap.max").exists() {
                        set("memory.swap.max", "0".into())?;
                    }
                }
                if let Some(max) = limits.pids {
                    set("pids.max", max.to_string())?;
                }
                if let Some(mc) = limits.cpu_millicores {
                    set("cpu.max", format!("{} 100000", (mc * 100).max(1000)))?;
                }
            }
        }
        self.ensure_pool()
    }

    /// Move `pid` into the cgroup(s).
    pub fn add(&self, pid: i32) -> Result<()> {
        for (_, dir) in &self.dirs {
            write(&dir.join("cgroup.procs"), &pid.to_string())?;
        }
        Ok(())
    }

    /// Host pids of every member.
    pub fn procs(&self) -> Result<Vec<i32>> {
        read_pids(&self.procs_dir().join("cgroup.procs"))
    }

    fn is_frozen(&self) -> Result<bool> {
        match &self.backend {
            Backend::V1 { .. } => {
                let dir = self.dir("freezer").unwrap_or(self.procs_dir());
                Ok(read(&dir.join("freezer.state"))?.trim() == "FROZEN")
            }
            Backend::V2 { .. } => {
                Ok(read(&self.dirs[0].1.join("cgroup.events"))?.lines().any(|l| l.trim() == "frozen 1"))
            }
        }
    }

    /// Freeze every task; on timeout thaw again and report the stuck tasks.
    pub fn freeze(&self, timeout: Duration) -> Result<()> {
        self.request_freeze(true)?;
        let start = Instant::now();
        let mut spins = 0u32;
        loop {
            if self.is_frozen()? {
                return Ok(());
            }
            if start.elapsed() >= timeout {
                let stuck = self.stuck_tasks();
                self.request_freeze(false)?;
                return Err(Error::FreezeTimeout { timeout, stuck });
            }
            spins += 1;
            if spins > 50 {
                std::thread::sleep(Duration::from_micros(200));
            } else {
                std::thread::yield_now();
            }
        }
    }

    /// Thaw the cgroup.
    pub fn thaw(&self) -> Result<()> {
        self.request_freeze(false)
    }

    fn request_freeze(&self, frozen: bool) -> Result<()> {
        match &self.backend {
            Backend::V1 { .. } => {
                let dir = self.dir("freezer").unwrap_or(self.procs_dir());
                write(&dir.join("freezer.state"), if frozen { "FROZEN" } else { "THAWED" })
            }
            Backend::V2 { .. } => write(&self.dirs[0].1.join("cgroup.freeze"), if frozen { "1" } else { "0" }),
        }
    }

    fn stuck_tasks(&self) -> Vec<StuckTask> {
        // Per-thread view: v1 freezer.state FREEZING means some task has not
        // entered the refrigerator yet; report every task not sleeping in it.
        let mut out = Vec::new();
        for pid in self.procs().unwrap_or_default() {
            // (Read lossily: the name in it may be cut inside a UTF-8
            // character.)
            let Ok(stat) = fs::read(format!("/proc/{pid}/stat")).map(|b| String::from_utf8_lossy(&b).into_owned())
            else {
                continue;
            };
            let (comm, state) = parse_stat(&stat);
            out.push(StuckTask { pid, comm, state });
        }
        out
    }

    /// Kill every member and wait until the cgroup is empty (up to `timeout`).
    pub fn kill_all(&self, timeout: Duration) -> Result<()> {
        let start = Instant::now();
        match &self.backend {
            Backend::V2 { .. } => {
                let kill_file = self.dirs[0].1.join("cgroup.kill");
                write(&kill_file, "1")?;
            }
            Backend::V1 { .. } => {}
        }
        loop {
            let procs = self.all_procs()?;
            if procs.is_empty() {
                return Ok(());
            }
            if start.elapsed() > timeout {
                return Err(Error::NotEmpty { path: self.procs_dir().to_path_buf() });
            }
            if matches!(self.backend, Backend::V1 { .. }) {
                let _ = self.freeze(Duration::from_millis(100));
                for pid in self.all_procs()? {
                    let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
                }
                self.thaw()?;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Resource usage.
    pub fn usage(&self) -> Result<Usage> {
        let mut u = Usage::default();
        match &self.backend {
            Backend::V1 { .. } => {
                if let Some(d) = self.dir("memory") {
                    u.memory_bytes = read_u64(&d.join("memory.usage_in_bytes"))?;
                    u.memory_limit = read_limit(&d.join("memory.limit_in_bytes"))?;
                }
                if let Some(d) = self.dir("pids") {
                    u.pids = read_u64(&d.join("pids.current"))?;
                    u.pids_limit = read_limit(&d.join("pids.max"))?;
                }
                if let Some(d) = self.dir("cpuacct").or_else(|| self.dir("cpu")) {
                    let p = d.join("cpuacct.usage");
                    if p.exists() {
                        u.cpu_usec = read_u64(&p)? / 1000;
                    }
                }
            }
            Backend::V2 { .. } => {
                let d = &self.dirs[0].1;
                if d.join("memory.current").exists() {
                    u.memory_bytes = read_u64(&d.join("memory.current"))?;
                    u.memory_limit = read_limit(&d.join("memory.max"))?;
                }
                if d.join("pids.current").exists() {
                    u.pids = read_u64(&d.join("pids.current"))?;
                    u.pids_limit = read_limit(&d.join("pids.max"))?;
                } else {
                    u.pids = self.all_procs()?.len() as u64;
                }
                let stat = read(&d.join("cpu.stat"))?;
                for line in stat.lines() {
                    if let Some(v) = line.strip_prefix("usage_usec ") {
                        u.cpu_usec = v.trim().parse().unwrap_or(0);
                    }
                }
            }
        }
        Ok(u)
    }

    /// Drop what the (empty) memory cgroup still has charged to it: page
    /// cache of the files its processes read or wrote, mostly (v1
    /// `memory.force_empty`, v2 `memory.reclaim` of all of it). Without
    /// it a removed cgroup lingers in the kernel as a *dying* one for as
    /// long as one of those pages is cached, and a daemon that creates and
    /// deletes sandboxes all day piles them up: with 300 of them on this
    /// host a 100 MB process forked in 3.0 ms instead of 2.0 (in any
    /// cgroup), and a bench run's process rows, which come after its
    /// sandboxes of the filesystem rows are deleted, were ~50% slower
    /// (`/proc/cgroups` counted 215 memory cgroups for 18 directories).
    /// Best effort: pages that cannot be dropped now (under writeback)
    /// keep the cgroup dying until they can be, as before. Pages mapped
    /// by other sandboxes (a shared layer's libraries that this sandbox
    /// read first) are dropped too and read again from the page cache of
    /// the image by their next fault. Returns the bytes still charged.
    pub fn reclaim_charges(&self) -> u64 {
        let Some(mem) = self.dir("memory") else { return 0 };
        match &self.backend {
            Backend::V1 { .. } => {
                let _ = fs::write(mem.join("memory.force_empty"), "0");
                read_u64(&mem.join("memory.usage_in_bytes")).unwrap_or(0)
            }
            Backend::V2 { .. } => {
                let current = || read_u64(&mem.join("memory.current")).unwrap_or(0);
                let now = current();
                if now > 0 {
                    // (EAGAIN when not all of it could be reclaimed.)
                    let _ = fs::write(mem.join("memory.reclaim"), now.to_string());
                }
                current()
            }
        }
    }

    /// Remove the cgroup directories (they must be empty); missing ones are
    /// fine. The memory cgroup's charges are dropped right before its own
    /// directory goes ([`Cgroup::reclaim_charges`]; the other directories
    /// go first, without waiting for it).
    pub fn remove(&self) -> Result<()> {
        let pool = self.pool_dir();
        let memory = self.dir("memory");
        let mut dirs: Vec<&Path> =
            std::iter::once(pool.as_path()).chain(self.dirs.iter().map(|(_, d)| d.as_path())).collect();
        dirs.sort_by_key(|d| Some(*d) == memory);
        for dir in dirs {
            if Some(dir) == memory && dir.exists() {
                let left = self.reclaim_charges();
                tracing::debug!(left, "memory cgroup emptied before its removal");
            }
            let mut tries = 0;
            loop {
                match fs::remove_dir(dir) {
                    Ok(()) => break,
                    Err(e) if e.kind() == io::ErrorKind::NotFound => break,
                    // EBUSY right after the last task exited: retry briefly.
                    Err(e) if tries < 100 => {
                        let _ = e;
                        tries += 1;
                        std::thread::sleep(Duration::from_millis(2));
                    }
                    Err(e) => return Err(io_err("rmdir", dir)(e)),
                }
            }
        }
        Ok(())
    }
}

/// The directories of the parent cgroup `name` (the one that holds the
/// sandboxes' cgroups, `HostConfig::cgroup_name`) in each hierarchy of
/// `backend` that has one of the controllers sandboxes use. Empty for a
/// `name` that is not one plain path component (no parent to remove: ``,
/// `.`, `..`, or with a `/`).
pub fn parent_dirs(backend: &Backend, name: &str) -> Vec<PathBuf> {
    if name.is_empty() || name == "." || name == ".." || name.contains('/') || name.contains('\0') {
        return Vec::new();
    }
    match backend {
        Backend::V1 { .. } => {
            // (A sandbox id that exists in no hierarchy: only the parent's
            // path is used.)
            Cgroup::new(backend.clone(), name, "_")
                .dirs
                .into_iter()
                .filter_map(|(_, d)| d.parent().map(Path::to_path_buf))
                .collect()
        }
        Backend::V2 { root } => vec![root.join(name)],
    }
}

/// Removes the parent cgroup `name` (see [`parent_dirs`]) in every
/// hierarchy. Without `kill`, only where it is empty: a daemon's clean exit
/// after removing its sandboxes' cgroups (a parent shared with another
/// daemon's sandboxes stays). With `kill`, whatever still runs in it or
/// under it is killed and every cgroup under it removed, deepest first (a
/// bench that failed midway). Returns the directories still there.
pub fn remove_parent(backend: &Backend, name: &str, kill: bool) -> Vec<PathBuf> {
    let mut left = Vec::new();
    for dir in parent_dirs(backend, name) {
        if !dir.exists() {
            continue;
        }
        if kill {
            remove_tree(&dir, Instant::now() + Duration::from_secs(5));
        } else {
            let _ = fs::remove_dir(&dir);
        }
        if dir.exists() {
            left.push(dir);
        }
    }
    left
}

/// Depth first: thaw, kill the members, drop the memory charges, rmdir
/// (retried while the kernel still reports it busy), until `deadline`.
fn remove_tree(dir: &Path, deadline: Instant) {
    if let Ok(entries) = fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                remove_tree(&e.path(), deadline);
            }
        }
    }
    let _ = fs::write(dir.join("freezer.state"), "THAWED");
    let _ = fs::write(dir.join("cgroup.freeze"), "0");
    loop {
        let pids = read_pids(&dir.join("cgroup.procs")).unwrap_or_default();
        for &pid in &pids {
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
        if pids.is_empty() {
            let _ = fs::write(dir.join("memory.force_empty"), "0");
            if let Ok(bytes) = read(&dir.join("memory.current")) {
                let _ = fs::write(dir.join("memory.reclaim"), bytes.trim());
            }
            match fs::remove_dir(dir) {
                Ok(()) => return,
                Err(e) if e.kind() == io::ErrorKind::NotFound => return,
                Err(_) => {}
            }
        }
        if Instant::now() >= deadline {
            return;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Turns on cgroup2's `favordynmods` for the whole host, if a cgroup2
/// hierarchy is mounted (pure v2 at `/sys/fs/cgroup`, or hybrid at
/// `/sys/fs/cgroup/unified`). Returns whether it is on.
///
/// Why: moving a task into a cgroup takes `cgroup_threadgroup_rwsem` for
/// writing, a per-CPU rwsem whose writer waits for an RCU grace period
/// unless one was waited for very recently. On a v1 host every sandbox start
/// moves its init into five hierarchies: measured here, 10-15 ms when the
/// previous start was more than ~100 ms ago (an agent that thinks between
/// rollbacks), 1 ms back to back. `favordynmods` keeps that rwsem in its
/// slow-reader/fast-writer mode (the flag is global, whichever hierarchy
/// sets it), at a small cost to every fork and exit on the host. The other
/// mount options are kept: a cgroup2 remount resets the ones it is not given.
pub fn favor_dynamic_modifications() -> io::Result<bool> {
    let mounts = fs::read_to_string("/proc/self/mounts")?;
    for line in mounts.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < 4 || f[2] != "cgroup2" {
            continue;
        }
        let (target, opts) = (f[1], f[3]);
        if opts.split(',').any(|o| o == "favordynmods") {
            return Ok(true);
        }
        let mut keep: Vec<&str> = opts.split(',').filter(|o| CGROUP2_OPTIONS.contains(o)).collect();
        keep.push("favordynmods");
        nix::mount::mount(
            None::<&str>,
            target,
            None::<&str>,
            nix::mount::MsFlags::MS_REMOUNT,
            Some(keep.join(",").as_str()),
        )
        .map_err(io::Error::from)?;
        return Ok(true);
    }
    Ok(false)
}

/// cgroup2 mount options that a remount must repeat to keep.
const CGROUP2_OPTIONS: [&str; 5] =
    ["nsdelegate", "memory_localevents", "memory_recursiveprot", "memory_hugetlb_accounting", "pids_localevents"];

/// `(comm, state)` from the text of `/proc/<pid>/stat`.
pub fn parse_stat(stat: &str) -> (String, String) {
    let open = stat.find('(').unwrap_or(0);
    let close = stat.rfind(')').unwrap_or(stat.len());
    let comm = stat.get(open + 1..close).unwrap_or("").to_string();
    let state = stat.get(close + 2..close + 3).unwrap_or("?").to_string();
    (comm, state)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn root() -> bool {
        nix::unistd::Uid::effective().is_root()
    }

    #[test]
    fn only_plain_names_have_a_parent_to_remove() {
        let b = Backend::detect();
        for bad in ["", ".", "..", "a/b", "/", "../x"] {
            assert!(parent_dirs(&b, bad).is_empty(), "{bad:?}");
            assert!(remove_parent(&b, bad, true).is_empty());
        }
        let v2 = Backend::V2 { root: "/sys/fs/cgroup".into() };
        assert_eq!(parent_dirs(&v2, "sandtree-x"), vec![PathBuf::from("/sys/fs/cgroup/sandtree-x")]);
    }

    #[test]
    fn remove_parent_keeps_a_busy_parent_unless_asked_to_kill() {
        if !root() {
            eprintln!("SKIP: needs root");
            return;
        }
        let b = Backend::detect();
        let name = format!("sandtree-unit-parent-{}", std::process::id());
        let cg = Cgroup::new(b.clone(), &name, "sb-1");
        cg.create(&Limits::default()).unwrap();
        let mut child = std::process::Command::new("sleep").arg("1000").spawn().unwrap();
        cg.add(child.id() as i32).unwrap();
        let dirs = parent_dirs(&b, &name);
        assert!(!dirs.is_empty() && dirs.iter().all(|d| d.exists()), "{dirs:?}");

        // Not empty: stays, and so does the process.
        assert_eq!(remove_parent(&b, &name, false), dirs);
        assert!(child.try_wait().unwrap().is_none());

        // Kill: the process, the sandbox's cgroup and its pool, the parent.
        assert!(cg.pool_dir().exists());
        assert_eq!(remove_parent(&b, &name, true), Vec::<PathBuf>::new());
        assert!(child.wait().unwrap().code().is_none(), "killed by a signal");
        assert!(dirs.iter().all(|d| !d.exists()), "{dirs:?}");

        // Empty: removed without killing.
        cg.create(&Limits::default()).unwrap();
        cg.remove().unwrap();
        assert_eq!(remove_parent(&b, &name, false), Vec::<PathBuf>::new());
        assert!(dirs.iter().all(|d| !d.exists()));
    }
}
