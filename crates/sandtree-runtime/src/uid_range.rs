//! Host uid ranges: each data dir owns one.
//!
//! A sandbox maps its uids and gids `0..65536` to the host's
//! `uid_base..uid_base + 65536`, and the files of a data dir's store are
//! owned by those host ids. Two daemons whose sandboxes shared a range
//! would share their owners: root in a sandbox of one would own the files
//! and processes of the other's. So every data dir has a range of its
//! own:
//!
//! - **the record**: `<data-dir>/uid-range` holds the range's first id,
//!   written at the data dir's first start and never changed after (the
//!   store is shifted by it). A data dir made before ranges were recorded
//!   (it has a `meta.db` but no record) keeps [`LEGACY_BASE`], which every
//!   data dir had then (or the `--uid-base` it is started with).
//! - **the choice** at the first start: `--uid-base` if given, else the
//!   first range `LEGACY_BASE + k × 65536` (`k` ≥ 1: the legacy range
//!   stays for data dirs made before) that overlaps no range claimed by
//!   another data dir, up to `2^31`.
//! - **the claims**: a file per range in a host-wide directory
//!   ([`DEFAULT_REGISTRY`], persistent so that a stopped data dir keeps its
//!   claim across reboots), named by the range's first id, holding the
//!   data dir's path and the daemon's pid, `flock`ed by the running daemon
//!   for as long as it runs. A claim counts while its daemon runs (the
//!   lock is held) or while its data dir still records that range; one
//!   whose data dir is gone (or records another range) is free again.
//! - **the check** at every start: if a running daemon of another data
//!   dir holds a range overlapping this one's, the start is refused with
//!   an error naming the range, the other data dir and what to do.
//!   Overlapping records of data dirs that never run at once (two data
//!   dirs from before, both on [`LEGACY_BASE`]) are allowed, with a
//!   warning.
//!
//! Choosing and claiming happen under an exclusive lock of
//! `<registry>/.lock`: two daemons starting at once get distinct ranges.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rustix::fs::{FlockOperation, flock};
use sandtree_sandbox::config::ID_RANGE;

/// The range every data dir had before ranges were recorded.
pub const LEGACY_BASE: u32 = 1_000_000_000;
/// Where the claims are, unless the daemon is told otherwise.
pub const DEFAULT_REGISTRY: &str = "/var/lib/sandtree-uid-ranges";
/// The record's name in a data dir.
pub const RECORD: &str = "uid-range";
/// Ranges end at or below `2^31` (ids above are negative to some tools).
const LIMIT: u64 = 1 << 31;
/// How long a start waits for a claim held by the leftovers of a daemon
/// that just died (its zygote processes die a moment after it).
const DYING_WAIT: Duration = Duration::from_secs(5);

/// Errors of this module.
#[derive(Debug, thiserror::Error)]
pub enum UidRangeError {
    /// A running daemon of another data dir holds an overlapping range.
    #[error(
        "uid range {range} of data dir {data_dir} is in use by the running daemon (pid {pid}) of data dir {other}: \
         the sandboxes of the two would share host uids; stop that daemon first, or start this one on a data dir of \
         its own (a new data dir gets a free range)"
    )]
    Held {
        /// The range (`first-last`).
        range: String,
        /// This data dir.
        data_dir: PathBuf,
        /// The data dir of the daemon holding it.
        other: PathBuf,
        /// That daemon's pid (as it recorded it).
        pid: String,
    },
    /// `--uid-base` differs from the data dir's record.
    #[error(
        "--uid-base {requested} differs from the uid range of data dir {data_dir} ({recorded}, recorded in {record}): \
         the files of its store are owned by that range; drop --uid-base (a data dir keeps the range it was made \
         with), or use another data dir"
    )]
    Mismatch {
        /// What was asked.
        requested: u32,
        /// What the data dir records.
        recorded: String,
        /// The data dir.
        data_dir: PathBuf,
        /// The record file.
        record: PathBuf,
    },
    /// `--uid-base` names an unusable range.
    #[error(
        "--uid-base {0} is not usable: a range of 65536 ids must start at or above 65536 (ids below belong to the \
         host's users) and end at or below 2^31; pick another, or leave it out to get a free range"
    )]
    Invalid(u32),
    /// Every range is claimed.
    #[error(
        "no free uid range of 65536 ids between {LEGACY_BASE} and 2^31: every one is claimed in {0}; remove the \
         claims of data dirs no longer used there"
    )]
    Exhausted(PathBuf),
    /// The record cannot be read.
    #[error("the uid range record {path} is damaged ({content:?}): it must hold the range's first id")]
    BadRecord {
        /// The record file.
        path: PathBuf,
        /// What it holds.
        content: String,
    },
    /// A file operation failed.
    #[error("{op} {path}: {source}")]
    Io {
        /// The step.
        op: &'static str,
        /// The file.
        path: PathBuf,
        /// The error.
        source: io::Error,
    },
}

type Result<T> = std::result::Result<T, UidRangeError>;

fn io_err(op: &'static str, path: &Path) -> impl FnOnce(io::Error) -> UidRangeError {
    let path = path.to_path_buf();
    move |source| UidRangeError::Io { op, path, source }
}

/// `first-last` of the range starting at `base`.
pub fn range_text(base: u32) -> String {
    format!("{base}-{}", base as u64 + ID_RANGE as u64 - 1)
}

/// A data dir's claim on its range: held (locked) until dropped.
#[derive(Debug)]
pub struct UidClaim {
    base: u32,
    path: PathBuf,
    /// The locked claim file.
    _file: File,
}

impl UidClaim {
    /// First host id of the range.
    pub fn base(&self) -> u32 {
        self.base
    }

    /// The claim file.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// What a claim file says.
struct Claim {
    base: u32,
    data_dir: PathBuf,
    pid: String,
}

fn overlaps(a: u32, b: u32) -> bool {
    let (a, b, n) = (a as u64, b as u64, ID_RANGE as u64);
    a < b + n && b < a + n
}

/// The range `data_dir` records, if it records one.
fn recorded(data_dir: &Path) -> Result<Option<u32>> {
    let path = data_dir.join(RECORD);
    match fs::read_to_string(&path) {
        Ok(text) => {
            let first = text.lines().next().unwrap_or_default().trim();
            first.parse().map(Some).map_err(|_| UidRangeError::BadRecord { path, content: first.to_string() })
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(io_err("read", &path)(e)),
    }
}

fn write_record(data_dir: &Path, base: u32) -> Result<()> {
    let path = data_dir.join(RECORD);
    let tmp = data_dir.join(format!(".{RECORD}.tmp"));
    let text = format!(
        "{base}\n# The first of the 65536 host uids and gids ({}) that this data dir's sandboxes map 0..65535 to:\n\
         # the files of its store are owned by them. Chosen at its first start; do not change it.\n",
        range_text(base)
    );
    fs::write(&tmp, text).map_err(io_err("write", &tmp))?;
    fs::rename(&tmp, &path).map_err(io_err("rename", &tmp))
}

fn read_claim(file: &mut File, base: u32) -> Claim {
    let mut text = String::new();
    let _ = file.rewind().and_then(|_| file.read_to_string(&mut text));
    let field = |k: &str| text.lines().find_map(|l| l.strip_prefix(k)?.strip_prefix('=')).unwrap_or_default();
    Claim { base, data_dir: PathBuf::from(field("data_dir")), pid: field("pid").to_string() }
}

/// Whether the daemon that wrote `claim` holds it now (the file is
/// locked), and what the file says.
fn probe(path: &Path, base: u32) -> Option<(Claim, bool)> {
    let mut file = File::open(path).ok()?;
    let held = match flock(&file, FlockOperation::NonBlockingLockShared) {
        Ok(()) => false,
        Err(e) => e == rustix::io::Errno::WOULDBLOCK,
    };
    Some((read_claim(&mut file, base), held))
}

/// Every claim in `registry` of a data dir other than `data_dir` that
/// still counts (see the module docs), and whether its daemon runs.
fn live_claims(registry: &Path, data_dir: &Path) -> Result<Vec<(Claim, bool)>> {
    let mut out = Vec::new();
    for entry in fs::read_dir(registry).map_err(io_err("read", registry))?.flatten() {
        let Some(base) = entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
        let Some((claim, held)) = probe(&entry.path(), base) else { continue };
        if claim.data_dir == data_dir {
            continue;
        }
        let still = held || recorded(&claim.data_dir).ok().flatten() == Some(base);
        if still {
            out.push((claim, held));
        }
    }
    Ok(out)
}

fn pid_alive(pid: &str) -> bool {
    pid.parse::<i32>()
        .ok()
        .and_then(rustix::process::Pid::from_raw)
        .is_some_and(|p| !matches!(rustix::process::test_kill_process(p), Err(rustix::io::Errno::SRCH)))
}

impl crate::Config {
    /// Claims the host uid range of this config's data dir (see [`claim`])
    /// and points the config at it: held until the claim is dropped.
    pub fn claim_uid_range(&mut self, requested: Option<u32>, registry: &Path) -> Result<UidClaim> {
        let held = claim(&self.data_dir, requested, registry)?;
        self.uid_base = held.base();
        self.uid_claim = Some(held.path().to_path_buf());
        Ok(held)
    }
}

/// Claim this data dir's range: the recorded one, or (first start) the
/// one asked for or the first free one, recorded then. `data_dir` must
/// exist. Fails if a running daemon of another data dir holds an
/// overlapping range.
pub fn claim(data_dir: &Path, requested: Option<u32>, registry: &Path) -> Result<UidClaim> {
    let data_dir = fs::canonicalize(data_dir).map_err(io_err("canonicalize", data_dir))?;
    if let Some(r) = requested
        && (r < ID_RANGE || r as u64 + ID_RANGE as u64 > LIMIT)
    {
        return Err(UidRangeError::Invalid(r));
    }
    fs::DirBuilder::new().recursive(true).create(registry).map_err(io_err("create", registry))?;
    // Choosing and claiming, one daemon at a time.
    let lock_path = registry.join(".lock");
    let lock = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .map_err(io_err("open", &lock_path))?;
    flock(&lock, FlockOperation::LockExclusive).map_err(|e| io_err("lock", &lock_path)(e.into()))?;

    let record = recorded(&data_dir)?;
    let base = match (record, requested) {
        (Some(b), Some(r)) if r != b => {
            return Err(UidRangeError::Mismatch {
                requested: r,
                recorded: range_text(b),
                record: data_dir.join(RECORD),
                data_dir,
            });
        }
        (Some(b), _) => b,
        // Made before ranges were recorded: its store is shifted by the
        // range every data dir had then.
        (None, r) if data_dir.join("meta.db").exists() => r.unwrap_or(LEGACY_BASE),
        (None, Some(r)) => r,
        (None, None) => choose(registry, &data_dir)?,
    };
    let claim = take(registry, &data_dir, base)?;
    if record.is_none() {
        write_record(&data_dir, base)?;
    }
    drop(lock);
    Ok(claim)
}

/// The first range `LEGACY_BASE + k × 65536` (k ≥ 1) no live claim of
/// another data dir overlaps.
fn choose(registry: &Path, data_dir: &Path) -> Result<u32> {
    let claims = live_claims(registry, data_dir)?;
    let mut base = LEGACY_BASE as u64 + ID_RANGE as u64;
    while base + ID_RANGE as u64 <= LIMIT {
        if !claims.iter().any(|(c, _)| overlaps(c.base, base as u32)) {
            return Ok(base as u32);
        }
        base += ID_RANGE as u64;
    }
    Err(UidRangeError::Exhausted(registry.to_path_buf()))
}

/// Lock the claim of `base` for `data_dir` (waiting a moment for the
/// leftovers of a daemon that just died), after checking that no running
/// daemon of another data dir holds an overlapping range.
fn take(registry: &Path, data_dir: &Path, base: u32) -> Result<UidClaim> {
    let held = |c: Claim| UidRangeError::Held {
        range: range_text(base),
        data_dir: data_dir.to_path_buf(),
        other: c.data_dir,
        pid: if c.pid.is_empty() { "?".into() } else { c.pid },
    };
    for (c, running) in live_claims(registry, data_dir)? {
        if !overlaps(c.base, base) {
            continue;
        }
        if running && c.base != base {
            return Err(held(c));
        }
        if !running {
            tracing::warn!(
                range = range_text(base),
                other = %c.data_dir.display(),
                "data dir {} records a uid range that overlaps this one's: never run the two daemons at once",
                c.data_dir.display()
            );
        }
    }
    let path = registry.join(base.to_string());
    let mut file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(&path)
        .map_err(io_err("open", &path))?;
    let t0 = Instant::now();
    loop {
        match flock(&file, FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => break,
            Err(rustix::io::Errno::WOULDBLOCK) => {
                let c = read_claim(&mut file, base);
                // A daemon that just died (of this data dir, or whose pid
                // is gone) leaves the lock to its zygote a moment longer.
                let dying = c.data_dir == data_dir || !pid_alive(&c.pid);
                if !dying || t0.elapsed() > DYING_WAIT {
                    return Err(held(c));
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(e) => return Err(io_err("lock", &path)(e.into())),
        }
    }
    let text = format!("data_dir={}\npid={}\n", data_dir.display(), std::process::id());
    file.set_len(0)
        .and_then(|()| file.rewind())
        .and_then(|()| file.write_all(text.as_bytes()))
        .map_err(io_err("write", &path))?;
    Ok(UidClaim { base, path, _file: file })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dirs() -> (tempfile::TempDir, PathBuf, PathBuf, PathBuf) {
        let t = tempfile::tempdir().expect("tempdir");
        let (reg, a, b) = (t.path().join("reg"), t.path().join("a"), t.path().join("b"));
        fs::create_dir_all(&a).expect("mkdir");
        fs::create_dir_all(&b).expect("mkdir");
        (t, reg, a, b)
    }

    #[test]
    fn data_dirs_get_distinct_ranges_and_keep_them() {
        let (_t, reg, a, b) = dirs();
        let ca = claim(&a, None, &reg).expect("claim a");
        assert_eq!(ca.base(), LEGACY_BASE + ID_RANGE);
        let cb = claim(&b, None, &reg).expect("claim b");
        assert_eq!(cb.base(), LEGACY_BASE + 2 * ID_RANGE);
        drop(ca);
        // Stopped, a still records its range: a third data dir skips it.
        let c = a.parent().expect("parent").join("c");
        fs::create_dir_all(&c).expect("mkdir");
        assert_eq!(claim(&c, None, &reg).expect("claim c").base(), LEGACY_BASE + 3 * ID_RANGE);
        // a starts again: the range it recorded.
        assert_eq!(claim(&a, None, &reg).expect("claim a again").base(), LEGACY_BASE + ID_RANGE);
        drop(cb);
        // b is removed: its range is free for the next new data dir.
        fs::remove_dir_all(&b).expect("rm b");
        let d = a.parent().expect("parent").join("d");
        fs::create_dir_all(&d).expect("mkdir");
        assert_eq!(claim(&d, None, &reg).expect("claim d").base(), LEGACY_BASE + 2 * ID_RANGE);
    }

    #[test]
    fn a_range_held_by_a_running_daemon_is_refused() {
        let (_t, reg, a, b) = dirs();
        let ca = claim(&a, None, &reg).expect("claim a");
        let err = claim(&b, Some(ca.base()), &reg).expect_err("b on a's range");
        let text = err.to_string();
        assert!(text.contains(&range_text(ca.base())) && text.contains(&a.display().to_string()), "{text}");
        assert!(text.contains("stop that daemon"), "{text}");
        // Overlapping, not equal: refused too.
        assert!(matches!(claim(&b, Some(ca.base() + 100), &reg), Err(UidRangeError::Held { .. })));
        // Not recorded by the refusal.
        assert_eq!(recorded(&b).expect("read"), None);
    }

    #[test]
    fn a_data_dir_from_before_keeps_the_legacy_range() {
        let (_t, reg, a, _b) = dirs();
        fs::write(a.join("meta.db"), b"").expect("write");
        assert_eq!(claim(&a, None, &reg).expect("claim").base(), LEGACY_BASE);
        assert_eq!(recorded(&a).expect("read"), Some(LEGACY_BASE));
    }

    #[test]
    fn a_uid_base_other_than_the_record_is_refused() {
        let (_t, reg, a, _b) = dirs();
        let base = claim(&a, None, &reg).expect("claim").base();
        assert!(matches!(claim(&a, Some(base + ID_RANGE), &reg), Err(UidRangeError::Mismatch { .. })));
        assert_eq!(claim(&a, Some(base), &reg).expect("same").base(), base);
        assert!(matches!(claim(&a, Some(5), &reg), Err(UidRangeError::Invalid(5))));
    }
}
