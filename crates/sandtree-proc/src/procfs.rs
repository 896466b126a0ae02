//! Reading a stopped process's state from the host's `/proc/<host-pid>/`.
//!
//! Paths (`fd/N`, `cwd`, `root`) read from the host resolve inside the
//! process's own mount namespace, so they are paths as the sandbox sees
//! them. Ids come from `status` (`NSpid`, `NSpgid`, `NSsid`: the last field
//! is the sandbox's namespace). Which mount a descriptor is on comes from
//! `fdinfo`'s `mnt_id` and the process's `mountinfo`.

use std::collections::HashMap;
use std::fs;
use std::io;
use std::os::fd::OwnedFd;
use std::path::Path;

use sandtree_sys::mountinfo::{self, MountEntry};

use crate::model::{
    AnonState, FdImage, FdKind, InetBinding, InotifyWatch, MapImage, ProcessImage, Registers, SignalMasks,
};
use crate::{HostPid, SandboxPid};

/// The fields of `/proc/pid/status` this engine uses.
#[derive(Debug, Clone, Default)]
pub struct Status {
    /// Host pid of the parent.
    pub host_ppid: HostPid,
    /// Pid, process group and session in the innermost pid namespace
    /// (the sandbox's, for a task of the sandbox).
    pub ns_pid: SandboxPid,
    pub ns_pgid: SandboxPid,
    pub ns_sid: SandboxPid,
    /// Pid namespace depth (number of `NSpid` fields): a task that joined
    /// the sandbox's cgroup from outside its pid namespace has another.
    pub ns_depth: usize,
    /// Thread count.
    pub threads: u32,
    pub uids: [u32; 4],
    pub gids: [u32; 4],
    /// Supplementary groups.
    pub groups: Vec<u32>,
    pub cap_eff: u64,
    pub umask: u32,
    pub signals: SignalMasks,
    /// `State:` letter.
    pub state: char,
    /// Host tid of its tracer (0: none).
    pub tracer: HostPid,
    /// `VmSize:`, in kB: the size of its memory map.
    pub vm_size_kb: u64,
    /// The file as read (an incremental template's fingerprint takes its
    /// lines from it rather than read it again: `incremental.rs`).
    pub text: String,
}

fn last_num<T: std::str::FromStr>(v: &str) -> Option<T> {
    v.split_whitespace().last()?.parse().ok()
}

fn four(v: &str) -> [u32; 4] {
    let mut out = [0; 4];
    for (i, x) in v.split_whitespace().take(4).enumerate() {
        out[i] = x.parse().unwrap_or(0);
    }
    out
}

fn hex(v: &str) -> u64 {
    u64::from_str_radix(v.trim(), 16).unwrap_or(0)
}

/// The fields of a `/proc/<pid>/stat` line from the third (the state
/// letter) on: the comm before them may hold any byte, spaces and
/// parentheses included, so they start after the last `)`.
pub(crate) fn stat_fields(stat: &str) -> std::str::SplitWhitespace<'_> {
    stat.rsplit_once(')').map_or("", |(_, rest)| rest).split_whitespace()
}

/// The text of a file of `/proc`. Names in it (a comm, a path) are the
/// kernel's bytes, which need not be UTF-8: a comm is cut at 15 bytes,
/// possibly inside a character, and a file name is any bytes. They are
/// read lossily (U+FFFD) rather than failing the whole file.
pub(crate) fn read_text(path: impl AsRef<Path>) -> io::Result<String> {
    Ok(text_of(fs::read(path)?))
}

fn text_of(bytes: Vec<u8>) -> String {
    String::from_utf8(bytes).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
}

/// The state letter of `/proc/<pid>/stat` (`t` in a ptrace stop, `Z` a
/// zombie); `None` when the process is gone.
pub fn state(pid: HostPid) -> Option<char> {
    state_of_stat(&read_text(format!("/proc/{pid}/stat")).ok()?)
}

fn state_of_stat(stat: &str) -> Option<char> {
    stat_fields(stat).next()?.chars().next()
}

/// Parse `/proc/<pid>/status`.
pub fn status(pid: HostPid) -> io::Result<Status> {
    Ok(parse_status(read_text(format!("/proc/{pid}/status"))?))
}

/// The fields of a `/proc/<pid>/status` text, which it keeps.
fn parse_status(text: String) -> Status {
    let mut st = Status::default();
    let mut pending = 0;
    for line in text.lines() {
        let Some((k, v)) = line.split_once(':') else { continue };
        match k {
            "State" => st.state = v.trim().chars().next().unwrap_or('?'),
            "PPid" => st.host_ppid = HostPid(v.trim().parse().unwrap_or(0)),
            "TracerPid" => st.tracer = HostPid(v.trim().parse().unwrap_or(0)),
            "NSpid" => {
                st.ns_pid = SandboxPid(last_num(v).unwrap_or(0));
                st.ns_depth = v.split_whitespace().count();
            }
            "NSpgid" => st.ns_pgid = SandboxPid(last_num(v).unwrap_or(0)),
            "NSsid" => st.ns_sid = SandboxPid(last_num(v).unwrap_or(0)),
            "Threads" => st.threads = v.trim().parse().unwrap_or(0),
            "VmSize" => st.vm_size_kb = v.split_whitespace().next().and_then(|n| n.parse().ok()).unwrap_or(0),
            "Uid" => st.uids = four(v),
            "Gid" => st.gids = four(v),
            "Groups" => st.groups = v.split_whitespace().filter_map(|g| g.parse().ok()).collect(),
            "CapEff" => st.cap_eff = hex(v),
            "Umask" => st.umask = u32::from_str_radix(v.trim(), 8).unwrap_or(0o022),
            "SigBlk" => st.signals.blocked = hex(v),
            "SigIgn" => st.signals.ignored = hex(v),
            "SigCgt" => st.signals.caught = hex(v),
            "SigPnd" | "ShdPnd" => pending |= hex(v),
            _ => {}
        }
    }
    st.signals.pending = pending;
    st.text = text;
    st
}

/// `tty_nr` from `/proc/<pid>/stat` (0: no controlling terminal).
pub fn tty_nr(pid: HostPid) -> io::Result<i64> {
    Ok(parse_tty_nr(&read_text(format!("/proc/{pid}/stat"))?))
}

/// What `pid`'s `stat` tells of its terminal and its parent, in one
/// read: the foreground process group of its controlling terminal
/// (`tpgid`, field 8: a host pid, 0 or less without one) and the signal
/// its parent gets when it ends (`exit_signal`, field 38).
pub fn tpgid_and_exit_signal(pid: HostPid) -> io::Result<(i32, i32)> {
    let stat = read_text(format!("/proc/{pid}/stat"))?;
    let field = |n: usize| stat_fields(&stat).nth(n - 3).and_then(|v| v.parse().ok());
    match (field(8), field(38)) {
        (Some(tpgid), Some(exit_signal)) => Ok((tpgid, exit_signal)),
        _ => Err(io::Error::other("no tpgid or exit_signal in stat")),
    }
}

/// How process `pid`, a zombie, ended: its wait status as `waitpid` gives
/// it (`exit_code`, field 52) and the signal its parent got
/// (`exit_signal`, field 38).
pub fn exit_status(pid: HostPid) -> io::Result<(i32, i32)> {
    let stat = read_text(format!("/proc/{pid}/stat"))?;
    parse_exit_status(&stat).ok_or_else(|| io::Error::other("no exit_code or exit_signal in stat"))
}

pub(crate) fn parse_exit_status(stat: &str) -> Option<(i32, i32)> {
    let field = |n: usize| stat_fields(stat).nth(n - 3).and_then(|v| v.parse().ok());
    Some((field(52)?, field(38)?))
}

/// A terminal's foreground group `tpgid` (a host pid, see
/// [`tpgid_and_exit_signal`]) as its leader's pid in the sandbox; `own`,
/// the process's own host and sandbox pids (most often it leads that
/// group itself: no read then). `None` without a terminal, or when that
/// leader is gone.
pub fn foreground_group(tpgid: i32, (host, ns_pid): (HostPid, SandboxPid)) -> Option<SandboxPid> {
    match tpgid {
        ..=0 => None,
        t if t == host.raw() => Some(ns_pid),
        t => status(HostPid(t)).ok().map(|s| s.ns_pid),
    }
}

/// The lines of a `status` text whose key is one of `keys`.
pub(crate) fn status_lines<'a>(text: &'a str, keys: &'a [&str]) -> impl Iterator<Item = &'a str> {
    text.lines().filter(|l| l.split_once(':').is_some_and(|(k, _)| keys.contains(&k)))
}

fn parse_tty_nr(stat: &str) -> i64 {
    // state ppid pgrp session tty_nr ...
    stat_fields(stat).nth(4).and_then(|v| v.parse().ok()).unwrap_or(0)
}

pub(crate) fn readlink(path: impl AsRef<Path>) -> io::Result<String> {
    Ok(fs::read_link(path)?.to_string_lossy().into_owned())
}

/// `fdinfo` fields.
struct FdInfo {
    pos: u64,
    flags: u32,
    mnt_id: i32,
    /// The whole text, for per-kind fields.
    text: String,
}

impl FdInfo {
    /// The locks held through the open file (`lock:` lines), and whether
    /// one of them is of a kind a restore cannot take again (a lease being
    /// broken, a delegation).
    fn locks(&self) -> (Vec<crate::model::FileLock>, bool) {
        parse_locks(&self.text)
    }
}

/// The `lock:` lines of an `fdinfo` text: `lock:\t<n>: <KIND> <ADVISORY|
/// MANDATORY> <READ|WRITE> <pid> <dev:ino> <start> <end|EOF>` (a waiter's
/// has `->` before its kind: not held, left out). A lease's is `LEASE
/// <ACTIVE|BREAKING|BREAKER> <READ|WRITE|UNLCK> ...`: only an active one
/// is taken again.
fn parse_locks(text: &str) -> (Vec<crate::model::FileLock>, bool) {
    use crate::model::{FileLock, LockKind};
    let mut locks = Vec::new();
    let mut other = false;
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("lock:") else { continue };
        let mut f = rest.split_whitespace().skip(1);
        let kind = match f.next() {
            Some("->") => continue,
            Some("POSIX") => LockKind::Posix,
            Some("FLOCK") => LockKind::Flock,
            Some("OFDLCK") => LockKind::Ofd,
            Some("LEASE") => LockKind::Lease,
            _ => {
                other = true;
                continue;
            }
        };
        let state = match kind {
            LockKind::Lease => "ACTIVE",
            _ => "ADVISORY",
        };
        let (Some(s), Some(access @ ("READ" | "WRITE")), _pid, _inode, Some(start), Some(end)) =
            (f.next(), f.next(), f.next(), f.next(), f.next(), f.next())
        else {
            other = true;
            continue;
        };
        if s != state {
            other = true;
            continue;
        }
        let Ok(start) = start.parse() else {
            other = true;
            continue;
        };
        let end = if end == "EOF" { None } else { end.parse().ok() };
        locks.push(FileLock { kind, write: access == "WRITE", start, end, signal: 0 });
    }
    (locks, other)
}

fn fdinfo(pid: HostPid, fd: i32) -> io::Result<FdInfo> {
    Ok(parse_fdinfo(read_text(format!("/proc/{pid}/fdinfo/{fd}"))?))
}

/// The fields of a `/proc/<pid>/fdinfo/<fd>` text, which it keeps.
fn parse_fdinfo(text: String) -> FdInfo {
    let mut info = FdInfo { pos: 0, flags: 0, mnt_id: -1, text: String::new() };
    for line in text.lines() {
        let Some((k, v)) = line.split_once(':') else { continue };
        match k {
            "pos" => info.pos = v.trim().parse().unwrap_or(0),
            "flags" => info.flags = u32::from_str_radix(v.trim(), 8).unwrap_or(0),
            "mnt_id" => info.mnt_id = v.trim().parse().unwrap_or(-1),
            _ => {}
        }
    }
    info.text = text;
    info
}

/// The open flags of descriptor `fd` of `pid` (`O_CLOEXEC` included when
/// set on the descriptor).
pub(crate) fn fd_flags(pid: HostPid, fd: i32) -> io::Result<u32> {
    fdinfo(pid, fd).map(|i| i.flags)
}

fn field<'a>(text: &'a str, key: &str) -> Option<&'a str> {
    text.lines().find_map(|l| l.strip_prefix(key)?.strip_prefix(':')).map(str::trim)
}

/// `(sec, nsec)` of timerfd's fdinfo, in ns.
fn timespec_ns(v: &str) -> u64 {
    let v = v.trim_matches(|c| c == '(' || c == ')');
    let mut it = v.split(',').map(|x| x.trim().parse::<u64>().unwrap_or(0));
    let (s, ns) = (it.next().unwrap_or(0), it.next().unwrap_or(0));
    s.saturating_mul(1_000_000_000).saturating_add(ns)
}

/// A duplicate of descriptor `fd` of the process of `pidfd`
/// (`pidfd_getfd`: the same open file), to ask it things.
fn dup_of(pidfd: Option<&OwnedFd>, fd: i32) -> Option<OwnedFd> {
    rustix::process::pidfd_getfd(pidfd?, fd, rustix::process::PidfdGetfdFlags::empty()).ok()
}

/// A memfd's size, inode and seals (through a duplicate of the
/// descriptor, `pidfd_getfd`).
fn memfd_kind(pidfd: Option<&OwnedFd>, fd: i32, name: &str, link: &Path) -> FdKind {
    use std::os::unix::fs::MetadataExt;
    let meta = fs::metadata(link).ok();
    let dup = dup_of(pidfd, fd);
    let seals = dup.as_ref().and_then(|d| rustix::fs::fcntl_get_seals(d).ok()).map(|s| s.bits());
    let fs = dup.as_ref().and_then(|d| rustix::fs::fstatfs(d).ok());
    FdKind::Memfd {
        name: name.to_string(),
        ino: meta.as_ref().map(|m| m.ino()).unwrap_or(0),
        size: meta.as_ref().map(|m| m.len()).unwrap_or(0),
        seals: seals.unwrap_or(0),
        hugetlb: fs.as_ref().is_some_and(|s| s.f_type == libc::HUGETLBFS_MAGIC),
        mode: meta.as_ref().map(|m| m.mode() & 0o7777).unwrap_or(0),
        probed: seals.is_some() && fs.is_some() && meta.is_some(),
    }
}

/// The state an anonymous-inode object holds, from its fdinfo (and, for a
/// timerfd, `timerfd_gettime` on a duplicate: fdinfo shows an expired
/// periodic timer that nobody read as disarmed).
fn anon_state(what: &str, text: &str, pidfd: Option<&OwnedFd>, fd: i32) -> Option<AnonState> {
    let ns = |t: rustix::time::Timespec| (t.tv_sec as u64).saturating_mul(1_000_000_000) + t.tv_nsec as u64;
    let mut state = parse_anon_state(what, text);
    if let Some(AnonState::Timerfd { value_ns, interval_ns, .. }) = &mut state {
        let current = dup_of(pidfd, fd).and_then(|dup| rustix::time::timerfd_gettime(&dup).ok());
        if let Some(c) = current {
            (*value_ns, *interval_ns) = (ns(c.it_value), ns(c.it_interval));
        }
    }
    state
}

/// The state of an anonymous-inode object of kind `what` (the link's
/// `anon_inode:[what]`) as its fdinfo `text` shows it; `None` for kinds
/// without one here (inotify: [`inotify_state`]).
fn parse_anon_state(what: &str, text: &str) -> Option<AnonState> {
    match what {
        "eventfd" => Some(AnonState::Eventfd {
            count: field(text, "eventfd-count").and_then(|v| u64::from_str_radix(v, 16).ok()).unwrap_or(0),
            semaphore: field(text, "eventfd-semaphore") == Some("1"),
        }),
        "timerfd" => Some(AnonState::Timerfd {
            clockid: field(text, "clockid").and_then(|v| v.parse().ok()).unwrap_or(1),
            value_ns: field(text, "it_value").map(timespec_ns).unwrap_or(0),
            interval_ns: field(text, "it_interval").map(timespec_ns).unwrap_or(0),
            ticks: field(text, "ticks").and_then(|v| v.parse().ok()).unwrap_or(0),
        }),
        "eventpoll" => Some(AnonState::Epoll { watches: epoll_watches(text), stale: Vec::new() }),
        "pidfd" => Some(AnonState::Pidfd {
            pid: SandboxPid(field(text, "NSpid").and_then(|v| v.split_whitespace().last()?.parse().ok()).unwrap_or(-1)),
        }),
        "signalfd" => Some(AnonState::Signalfd {
            mask: field(text, "sigmask").and_then(|v| u64::from_str_radix(v, 16).ok()).unwrap_or(0),
        }),
        _ => None,
    }
}

/// An inotify instance, from its `fdinfo` (one line per watch: `inotify
/// wd:<hex> ino:<hex> sdev:<hex> mask:<hex> ignored_mask:<hex>
/// fhandle-bytes:<hex> fhandle-type:<hex> f_handle:<hex bytes>`), read
/// while its process is stopped. Each watch's inode is located through its
/// file handle: `sdev` names the mount (the kernel's `major << 20 | minor`);
/// on an overlay the handle is overlayfs's (`struct ovl_fb`: version,
/// magic `0xfb`, length, flags — bit 2: the upper layer — inner handle
/// type, the layer's filesystem uuid, then the inner handle), which is
/// opened with `open_by_handle_at` on the layer's directory: the path it
/// has there, below the layer's root, is its path in the sandbox.
fn inotify_state(
    pid: HostPid,
    text: &str,
    pidfd: Option<&OwnedFd>,
    fd: i32,
    mounts: &HashMap<i32, MountEntry>,
) -> AnonState {
    let pending = dup_of(pidfd, fd).and_then(|dup| rustix::io::ioctl_fionread(&dup).ok());
    let mut watches = Vec::new();
    let mut unresolved =
        pending.is_none().then(|| "the unread events of an inotify instance could not be counted".into());
    let pending = pending.unwrap_or(0);
    for line in parse_inotify_watches(text) {
        let located = line.and_then(|w| {
            locate_watch(pid, (w.sdev, w.ino), w.handle_type, w.handle.as_deref(), mounts)
                .map(|(path, dont_follow)| InotifyWatch { wd: w.wd, mask: w.mask, path, dont_follow, through_fd: None })
                .or_else(|why| match deleted_and_held(pid, (w.sdev, w.ino), mounts) {
                    Some((path, fd)) => {
                        Ok(InotifyWatch { wd: w.wd, mask: w.mask, path, dont_follow: false, through_fd: Some(fd) })
                    }
                    None => Err(why),
                })
        });
        match located {
            Ok(w) => watches.push(w),
            Err(why) => {
                unresolved.get_or_insert(why);
            }
        }
    }
    watches.sort_by_key(|w| w.wd);
    AnonState::Inotify { watches, pending, unresolved }
}

/// A deleted file of the layers that process `pid` holds open, on the
/// device and inode an inotify watch is on: its old path and the
/// descriptor (the lowest). (A file watched and then deleted while open:
/// `tail -f` of a log that was rotated away.)
fn deleted_and_held(pid: HostPid, (sdev, ino): (u64, u64), mounts: &HashMap<i32, MountEntry>) -> Option<(String, i32)> {
    use std::os::unix::fs::MetadataExt;
    let overlay = mounts.values().find(|m| m.kernel_dev() == sdev && m.fstype == "overlay")?;
    let mut held: Vec<(i32, String)> = fs::read_dir(format!("/proc/{pid}/fd"))
        .ok()?
        .flatten()
        .filter_map(|e| {
            let fd: i32 = e.file_name().to_string_lossy().parse().ok()?;
            let link = readlink(e.path()).ok()?;
            let path = link.strip_suffix(" (deleted)")?.to_string();
            let meta = fs::metadata(e.path()).ok()?;
            let on = fdinfo(pid, fd).ok()?.mnt_id;
            (meta.ino() == ino && meta.is_file() && mounts.get(&on).is_some_and(|m| m.id == overlay.id))
                .then_some((fd, path))
        })
        .collect();
    held.sort();
    held.into_iter().next().map(|(fd, path)| (path, fd))
}

/// A watch of an inotify instance, as its fdinfo line shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct WatchLine {
    wd: i32,
    /// The watched inode and its filesystem's device (`major << 20 |
    /// minor`).
    ino: u64,
    sdev: u64,
    mask: u32,
    /// Its file handle (`fhandle-type`, `f_handle`), absent when the
    /// filesystem gives none.
    handle_type: Option<u64>,
    handle: Option<Vec<u8>>,
}

/// The watches of an inotify instance's fdinfo `text`, in its order (an
/// error for a line that lacks a field).
fn parse_inotify_watches(text: &str) -> impl Iterator<Item = Result<WatchLine, String>> + '_ {
    text.lines().filter(|l| l.starts_with("inotify ")).map(|line| {
        let kv: HashMap<&str, &str> = line.split_whitespace().skip(1).filter_map(|f| f.split_once(':')).collect();
        let hex = |k: &str| kv.get(k).and_then(|v| u64::from_str_radix(v, 16).ok());
        match (hex("wd"), hex("sdev"), hex("mask"), hex("ino")) {
            (Some(wd), Some(sdev), Some(mask), Some(ino)) => Ok(WatchLine {
                wd: wd as i32,
                ino,
                sdev,
                mask: mask as u32,
                handle_type: hex("fhandle-type"),
                handle: kv.get("f_handle").and_then(|h| decode_hex(h)),
            }),
            _ => Err(format!("an inotify watch could not be parsed ({line})")),
        }
    })
}

fn decode_hex(h: &str) -> Option<Vec<u8>> {
    (0..h.len()).step_by(2).map(|i| u8::from_str_radix(h.get(i..i + 2)?, 16).ok()).collect()
}

/// The sandbox path of the inode an inotify watch is on (see
/// [`inotify_state`]), and whether it is a symbolic link. The path is
/// checked to lead to the watched inode in the process's tree (an overlay
/// handle names a copied-up file's lower origin, whose path may be stale).
fn locate_watch(
    pid: HostPid,
    (sdev, watched_ino): (u64, u64),
    handle_type: Option<u64>,
    handle: Option<&[u8]>,
    mounts: &HashMap<i32, MountEntry>,
) -> Result<(String, bool), String> {
    let Some(m) = mounts.values().find(|m| m.kernel_dev() == sdev) else {
        return Err(format!("an inotify watch on device {sdev:#x}, which is not mounted in the sandbox"));
    };
    let place = m.target.display();
    if m.fstype != "overlay" {
        return Err(format!(
            "an inotify watch on {place} ({}): only watches on the sandbox's layers are captured",
            m.fstype
        ));
    }
    let Some(OverlayHandle { upper, inner_type, inner }) = parse_overlay_handle(handle_type, handle) else {
        return Err(format!("an inotify watch on {place} has no overlay file handle to locate its inode with"));
    };
    let dirs: Vec<std::path::PathBuf> = if upper { m.option("upperdir").into_iter().collect() } else { m.lower_dirs() };
    for dir in dirs {
        let flags = rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::DIRECTORY | rustix::fs::OFlags::CLOEXEC;
        let Ok(layer) = rustix::fs::open(&dir, flags, rustix::fs::Mode::empty()) else { continue };
        let Ok(inode) = sandtree_sys::handle::open_by_handle(&layer, inner_type, inner, libc::O_PATH) else {
            continue;
        };
        let Ok(real) = readlink(format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&inode))) else {
            continue;
        };
        if let Some(gone) = real.strip_suffix(" (deleted)") {
            // (Its path in the sandbox, not the layer's on the host.)
            let name = Path::new(gone).strip_prefix(&dir).map(|rel| m.target.join(rel));
            let name = name.map(|p| p.to_string_lossy().into_owned()).unwrap_or_else(|_| "?".into());
            return Err(format!(
                "an inotify watch on a deleted file ({name}) that the process does not hold open (a restore could not make it again)"
            ));
        }
        let Ok(rel) = Path::new(&real).strip_prefix(&dir) else { continue };
        let symlink = rustix::fs::fstat(&inode)
            .map(|st| rustix::fs::FileType::from_raw_mode(st.st_mode) == rustix::fs::FileType::Symlink)
            .unwrap_or(false);
        let path = m.target.join(rel).to_string_lossy().into_owned();
        let at = crate::fdstate::tree_root(pid)
            .and_then(|root| {
                crate::fdstate::open_in(&root, &path, rustix::fs::OFlags::PATH | rustix::fs::OFlags::NOFOLLOW)
            })
            .and_then(|f| Ok(rustix::fs::fstat(&f)?));
        if !at.is_ok_and(|st| st.st_ino == watched_ino) {
            return Err(format!("the inode of an inotify watch is no longer at {path} (renamed or replaced)"));
        }
        return Ok((path, symlink));
    }
    Err(format!("the inode of an inotify watch on {place} could not be located on its layers"))
}

/// What an overlayfs file handle holds (see [`inotify_state`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct OverlayHandle<'a> {
    /// The inode is on the upper layer (else on a lower one).
    upper: bool,
    /// The handle of the layer's own filesystem: its type and bytes.
    inner_type: i32,
    inner: &'a [u8],
}

/// The overlayfs handle of type `handle_type` in `handle` (`None`: not
/// one, or malformed).
fn parse_overlay_handle(handle_type: Option<u64>, handle: Option<&[u8]>) -> Option<OverlayHandle<'_>> {
    // OVL_FILEID_V1 (0xf8) has 3 bytes of padding before the ovl_fb;
    // OVL_FILEID_V0 (0xfb) has none.
    let fb = match (handle_type, handle) {
        (Some(0xf8), Some(h)) => h.get(3..),
        (Some(0xfb), Some(h)) => Some(h),
        _ => None,
    };
    let fb = fb.filter(|fb| fb.len() > 21 && fb[1] == 0xfb && (fb[2] as usize) <= fb.len() && fb[2] > 21)?;
    Some(OverlayHandle { upper: fb[3] & 4 != 0, inner_type: fb[4] as i32, inner: &fb[21..fb[2] as usize] })
}

/// The watch list in an epoll's fdinfo: `tfd: N events: X data: Y ...`.
pub fn epoll_watches(text: &str) -> Vec<(i32, u32, u64)> {
    text.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            if f.len() < 6 || f[0] != "tfd:" || f[2] != "events:" || f[4] != "data:" {
                return None;
            }
            Some((f[1].parse().ok()?, u32::from_str_radix(f[3], 16).ok()?, u64::from_str_radix(f[5], 16).ok()?))
        })
        .collect()
}

/// The current watch list of epoll `fd` of `pid`.
pub fn epoll_watches_of(pid: HostPid, fd: i32) -> io::Result<Vec<(i32, u32, u64)>> {
    Ok(epoll_watches(&fs::read_to_string(format!("/proc/{pid}/fdinfo/{fd}"))?))
}

/// What a socket is, asked of the socket itself (a duplicate taken with
/// `pidfd_getfd`): far cheaper than `/proc/net/tcp`, which walks the
/// whole connection hash table.
fn socket_kind(pid: HostPid, pidfd: Option<&OwnedFd>, diag: &mut Option<OwnedFd>, fd: i32, ino: u64) -> FdKind {
    use rustix::net::{AddressFamily, SocketType, sockopt};
    let unknown = FdKind::Socket {
        ino,
        family: "unknown".into(),
        stream: false,
        seqpacket: false,
        listening: false,
        connected: false,
        bound: None,
        bound_gone: false,
        bound_from: None,
        queued: false,
        peer: None,
        inet: None,
        pair: None,
        peer_path: None,
        has_clients: false,
        listened_by: None,
        not_accepted: false,
        held_connection: false,
        tcp: None,
        udp_queue: None,
        unix_datagrams: None,
    };
    let Some(dup) = dup_of(pidfd, fd) else { return unknown };
    let family = match sockopt::socket_domain(&dup) {
        Ok(AddressFamily::UNIX) => "unix",
        Ok(AddressFamily::INET) => "inet",
        Ok(AddressFamily::INET6) => "inet6",
        Ok(AddressFamily::NETLINK) => "netlink",
        _ => "other",
    };
    let ty = sockopt::socket_type(&dup);
    let stream = matches!(ty, Ok(SocketType::STREAM) | Ok(SocketType::SEQPACKET));
    let listening = sockopt::socket_acceptconn(&dup).unwrap_or(false);
    let peer_addr = rustix::net::getpeername(&dup).ok().flatten();
    let connected = !listening && peer_addr.is_some();
    let own_addr = (family == "unix").then(|| rustix::net::getsockname(&dup).ok()).flatten();
    let bound = unix_path(own_addr.clone());
    // (FIONREAD and poll, not a peek: a peek would start at, and move,
    // the socket's own SO_PEEK_OFF, and would mark an empty datagram
    // peeked, which a later peek at offset 0 goes past. A datagram
    // socket's FIONREAD counts the next one, which may be empty: queued
    // all the same, as `POLLIN` says, but for a socket shut down.)
    let queued = !listening && {
        rustix::io::ioctl_fionread(&dup).is_ok_and(|n| n > 0)
            || (!stream && {
                use rustix::event::{PollFd, PollFlags};
                let mut fds = [PollFd::new(&dup, PollFlags::IN | PollFlags::RDHUP)];
                rustix::event::poll(&mut fds, Some(&rustix::time::Timespec { tv_sec: 0, tv_nsec: 0 })).is_ok()
                    && fds[0].revents().contains(PollFlags::IN)
                    && !fds[0].revents().contains(PollFlags::RDHUP)
            })
    };
    let inet = (family.starts_with("inet") && (listening || (!stream && !connected)))
        .then(|| inet_binding(&dup, matches!(ty, Ok(SocketType::STREAM))))
        .flatten();
    // Data queued on a connected unix socket is captured when its
    // receiver does not take the sender's credentials (SO_PASSCRED: the
    // restore sends as the daemon), and it can still receive, through the
    // peer that sent it (or a peer made for it, the old one released).
    // (The data itself is peeked once, by the checkpoint's first pass,
    // files in flight with it included: `kinds/in_flight.rs`.)
    let passcred = sockopt::socket_passcred(&dup).unwrap_or(true);
    // (One `NETLINK_SOCK_DIAG` socket per process, made at the first ask.)
    let mut state = || {
        if diag.is_none() {
            *diag = crate::sockdiag::diag_socket(pid).ok();
        }
        crate::sockdiag::unix_state(diag.as_ref()?, ino).ok()
    };
    let unix_connected = connected && family == "unix";
    // An unnamed pair: neither end has an address (an abstract one
    // included: an accepted connection has its listener's).
    // (An unnamed address is the family alone.)
    let no_address = |a: Option<&rustix::net::SocketAddrAny>| {
        a.is_some_and(|a| a.addr_len() as usize <= std::mem::size_of::<libc::sa_family_t>())
    };
    let unnamed = unix_connected && no_address(own_addr.as_ref()) && no_address(peer_addr.as_ref());
    // A connection made through a listener bound to a path: the accepted
    // end has the listener's path as its own address, the other end (not
    // bound itself) as its peer's.
    let listened = (unix_connected && stream)
        .then(|| match (unix_path(own_addr.clone()), unix_path(peer_addr.clone())) {
            (Some(path), None) if no_address(peer_addr.as_ref()) => Some((path, true)),
            (None, Some(path)) if no_address(own_addr.as_ref()) => Some((path, false)),
            _ => None,
        })
        .flatten()
        // (A relative one too: its listener, bound from its working
        // directory, tells where it is: `Connection::connect_to`.)
        .filter(|(path, _)| !path.is_empty());
    // (Every connection's, which a template would otherwise hold.)
    let diag_state = (unix_connected && (queued || unnamed || stream)).then(&mut state).flatten();
    // An end of an unnamed pair whose peer was released, with data queued
    // (a child's answer on a `multiprocessing.Pipe()` before it exited):
    // made anew at the restore with a peer that sends the data and closes
    // (`UnixPair::peer` 0). Its pending error (ECONNRESET: the peer went
    // with data unread) shows as `POLLERR`, which does not clear it.
    let released =
        unnamed && queued && !passcred && diag_state.is_some_and(|s| s.peer == Some(0) && (stream == s.rcv_shutdown));
    let peer = match released {
        true => Some(0),
        false => diag_state.filter(|s| queued && !passcred && !s.rcv_shutdown).and_then(|s| s.peer),
    };
    let pair = diag_state.filter(|_| unnamed || listened.is_some()).and_then(|s| {
        let sock_type = match ty {
            Ok(SocketType::STREAM) => libc::SOCK_STREAM,
            Ok(SocketType::SEQPACKET) => libc::SOCK_SEQPACKET,
            Ok(SocketType::DGRAM) => libc::SOCK_DGRAM,
            _ => return None,
        };
        // (0: the peer was released: a pair again only with data queued.)
        let peer = s.peer.filter(|&p| p != 0 || released)?;
        let reset = released && {
            let mut fds = [rustix::event::PollFd::new(&dup, rustix::event::PollFlags::empty())];
            rustix::event::poll(&mut fds, Some(&rustix::time::Timespec { tv_sec: 0, tv_nsec: 0 })).is_ok()
                && fds[0].revents().contains(rustix::event::PollFlags::ERR)
        };
        // (Of the accepted end: who connected, as the sandbox names it.)
        let through = listened.clone().map(|(path, accepted)| crate::model::Listened {
            connector: accepted.then(|| sandbox_pid_of_peer(&dup)).flatten(),
            path,
            accepted,
        });
        Some(crate::model::UnixPair {
            peer,
            sock_type,
            send_shutdown: s.send_shutdown,
            rcv_shutdown: s.rcv_shutdown,
            passcred,
            through,
            options: pair_options(&dup),
            creator: unnamed.then(|| sandbox_pid_of_peer(&dup)).flatten(),
            reset,
        })
    });
    // (Looked up in the process's tree: a socket file there, or none.)
    let bound_gone = bound.as_deref().is_some_and(|p| {
        p.starts_with('/')
            && !fs::symlink_metadata(format!("/proc/{pid}/root{p}"))
                .is_ok_and(|m| std::os::unix::fs::FileTypeExt::is_socket(&m.file_type()))
    });
    // A relative path: its socket file, found from the working directory.
    let bound_from = bound.as_deref().filter(|p| !p.starts_with('/') && !p.starts_with('@')).and_then(|rel| {
        use std::os::unix::fs::{FileTypeExt, MetadataExt};
        let cwd = readlink(format!("/proc/{pid}/cwd")).ok()?;
        let path = format!("{}/{rel}", cwd.trim_end_matches('/'));
        let file = fs::symlink_metadata(format!("/proc/{pid}/root{path}")).ok()?;
        // (sock_diag gives the inode number's low 32 bits.)
        (file.file_type().is_socket() && state()?.file_ino == Some(file.ino() & 0xffff_ffff))
            .then(|| path.into_boxed_str())
    });
    // (Not an abstract one: a datagram socket connected there is kept.)
    let peer_path = unix_path(peer_addr.filter(|_| unix_connected && !stream)).filter(|p| !p.starts_with('@'));
    let listened_by = (listening && bound.is_some()).then(|| sandbox_pid_of_peer(&dup)).flatten();
    // (The peer of a connection not accepted yet has no inode, like a
    // released one; but a released peer shut this end down.)
    let not_accepted = listened.as_ref().is_some_and(|(_, accepted)| !accepted)
        && diag_state.is_some_and(|s| s.peer == Some(0) && !s.rcv_shutdown && !s.send_shutdown);
    let held_connection = unix_connected
        && stream
        && pair.is_none()
        && diag_state.is_some_and(|s| s.peer.is_some_and(|p| p != 0) && !(s.rcv_shutdown && s.send_shutdown));
    FdKind::Socket {
        ino,
        family: family.into(),
        stream,
        seqpacket: matches!(ty, Ok(SocketType::SEQPACKET)),
        listening,
        connected,
        bound,
        bound_gone,
        bound_from,
        queued,
        peer,
        inet,
        pair,
        peer_path,
        has_clients: false,
        listened_by,
        not_accepted,
        held_connection,
        tcp: None,
        udp_queue: None,
        unix_datagrams: None,
    }
}

/// The sandbox's pid of the process that socket `sock`'s `SO_PEERCRED`
/// names (a connection's peer; a listener's own, of its `listen`), if it
/// is in the sandbox.
fn sandbox_pid_of_peer(sock: &OwnedFd) -> Option<SandboxPid> {
    let c = rustix::net::sockopt::socket_peercred(sock).ok()?;
    let st = status(HostPid(c.pid.as_raw_nonzero().get())).ok()?;
    (st.ns_depth > 1).then_some(st.ns_pid)
}

/// The options of a unix socket pair's or connection's end that its new
/// end gets again (`kinds/unix.rs`): buffer sizes (as `getsockopt` gives
/// them: twice what was asked) and timeouts, raw.
pub(crate) const PAIR_OPTIONS: [(i32, i32); 4] = [
    (libc::SOL_SOCKET, libc::SO_SNDBUF),
    (libc::SOL_SOCKET, libc::SO_RCVBUF),
    (libc::SOL_SOCKET, libc::SO_RCVTIMEO),
    (libc::SOL_SOCKET, libc::SO_SNDTIMEO),
];

/// [`PAIR_OPTIONS`] of socket `sock` (those it could read).
fn pair_options(sock: &OwnedFd) -> Vec<(i32, i32, Vec<u8>)> {
    PAIR_OPTIONS
        .iter()
        .filter_map(|&(level, name)| Some((level, name, sandtree_sys::sockopt::get_raw(sock, level, name, 16).ok()?)))
        .collect()
}

/// The filesystem path of unix socket address `a`, if it has one.
fn unix_path(a: Option<rustix::net::SocketAddrAny>) -> Option<String> {
    let a = rustix::net::SocketAddrUnix::try_from(a?).ok()?;
    if let Some(name) = a.abstract_name().filter(|n| !n.is_empty()) {
        // (As `ss` shows it. A name that is not text, or holds a NUL,
        // has none: such a socket stays the template's.)
        let name = std::str::from_utf8(name).ok().filter(|n| !n.contains('\0'))?;
        return Some(format!("@{name}"));
    }
    a.path_bytes().map(|p| String::from_utf8_lossy(p).into_owned()).filter(|p| !p.is_empty())
}

/// The state of the pty whose master is `fd` (asked of the same open file,
/// taken with `pidfd_getfd`: opening the master again would make another
/// pty).
fn pty_state(pid: HostPid, pidfd: Option<&OwnedFd>, fd: i32) -> Option<crate::model::PtyState> {
    use sandtree_sys::pty::master;
    use std::os::unix::fs::MetadataExt;
    let dup = dup_of(pidfd, fd)?;
    let w = rustix::termios::tcgetwinsize(&dup).ok()?;
    let index = master::index(&dup).ok()?;
    let (locked, packet) = (master::locked(&dup).ok()?, master::packet_mode(&dup).ok()?);
    let unread = rustix::io::ioctl_fionread(&dup).ok()? as u32;
    // (The slave's node in the process's devpts, looked at without opening it.)
    let slave = fs::metadata(format!("/proc/{pid}/root/dev/pts/{index}")).ok()?;
    Some(crate::model::PtyState {
        index,
        slave_owner: (slave.uid(), slave.gid(), slave.mode() & 0o7777),
        termios: master::termios(&dup).ok()?,
        winsize: [w.ws_row, w.ws_col, w.ws_xpixel, w.ws_ypixel],
        locked,
        packet,
        unread,
        // (Every process of the sandbox is stopped: reading it and queuing
        // it again changes nothing they see.)
        output: match unread > 0 && !packet && !locked {
            true => master::take_output(&dup).unwrap_or_default(),
            false => Vec::new(),
        },
    })
}

/// The index of the pty that descriptor `fd` (a `/dev/tty`) reaches, if
/// it is a pty's slave (major 136).
fn controlling_pty(pidfd: Option<&OwnedFd>, fd: i32) -> Option<u32> {
    let dup = dup_of(pidfd, fd)?;
    let dev = sandtree_sys::pty::device_of(&dup).ok()?;
    (libc::major(dev) == 136).then(|| libc::minor(dev))
}

/// Bytes waiting to be read on descriptor `fd` (`FIONREAD` of the same
/// open file).
fn unread_on(pidfd: Option<&OwnedFd>, fd: i32) -> Option<u32> {
    let dup = dup_of(pidfd, fd)?;
    Some(rustix::io::ioctl_fionread(&dup).ok()? as u32)
}

/// The bound address and options of an inet socket (`None`: not bound).
fn inet_binding(sock: &OwnedFd, stream: bool) -> Option<InetBinding> {
    use rustix::net::{SocketAddrV4, SocketAddrV6, sockopt};
    let addr = rustix::net::getsockname(sock).ok()?;
    let sockaddr = if let Ok(v4) = SocketAddrV4::try_from(addr.clone()) {
        if v4.port() == 0 {
            return None;
        }
        let mut b = (libc::AF_INET as u16).to_ne_bytes().to_vec();
        b.extend_from_slice(&v4.port().to_be_bytes());
        b.extend_from_slice(&v4.ip().octets());
        b.extend_from_slice(&[0u8; 8]);
        b
    } else {
        let v6 = SocketAddrV6::try_from(addr).ok()?;
        if v6.port() == 0 {
            return None;
        }
        let mut b = (libc::AF_INET6 as u16).to_ne_bytes().to_vec();
        b.extend_from_slice(&v6.port().to_be_bytes());
        b.extend_from_slice(&v6.flowinfo().to_be_bytes());
        b.extend_from_slice(&v6.ip().octets());
        b.extend_from_slice(&v6.scope_id().to_ne_bytes());
        b
    };
    let int = |v: Vec<u8>| i32::from_ne_bytes(v.get(..4)?.try_into().ok()?).into();
    let protocol = sandtree_sys::sockopt::get_raw(sock, libc::SOL_SOCKET, libc::SO_PROTOCOL, 4).ok().and_then(int);
    // (Multicast options read on a stream socket, but cannot be set on one.)
    let options = INET_OPTIONS
        .iter()
        .filter(|(level, name)| !(stream && MULTICAST.contains(&(*level, *name))))
        // (UDP-Lite's options read on a UDP socket too, but are UDP-Lite's.)
        .filter(|(level, _)| *level != libc::IPPROTO_UDPLITE || protocol == Some(libc::IPPROTO_UDPLITE))
        .filter_map(|&(level, name)| Some((level, name, sandtree_sys::sockopt::get_raw(sock, level, name, 16).ok()?)))
        .collect();
    Some(InetBinding {
        sockaddr,
        reuse_addr: sockopt::socket_reuseaddr(sock).unwrap_or(false),
        reuse_port: sockopt::socket_reuseport(sock).unwrap_or(false),
        v6only: sockopt::ipv6_v6only(sock).unwrap_or(false),
        protocol: protocol.unwrap_or(0),
        options,
        not_accepted: match stream && protocol == Some(libc::IPPROTO_TCP) {
            true => sandtree_sys::tcp_repair::info(sock).map(|i| i.unacked).unwrap_or(0),
            false => 0,
        },
    })
}

/// The multicast options of [`INET_OPTIONS`].
pub(crate) const MULTICAST: &[(i32, i32)] = &[
    (libc::IPPROTO_IP, libc::IP_MULTICAST_TTL),
    (libc::IPPROTO_IP, libc::IP_MULTICAST_LOOP),
    (libc::IPPROTO_IPV6, libc::IPV6_MULTICAST_HOPS),
    (libc::IPPROTO_IPV6, libc::IPV6_MULTICAST_LOOP),
];

/// The options of a bound inet socket that a checkpoint saves, and the
/// restore sets again (from the first to the last, before the `bind`: an
/// address bound with `IP_FREEBIND` may not be on any interface) on the
/// socket it makes anew. Each is one whose current value, set again,
/// changes nothing: buffer sizes are left out (setting one turns its
/// autotuning off), and so is `TCP_MAXSEG` (set, it clamps). An option a
/// socket's protocol does not have fails to read and is not saved.
pub(crate) const INET_OPTIONS: &[(i32, i32)] = &[
    (libc::SOL_SOCKET, libc::SO_KEEPALIVE),
    (libc::SOL_SOCKET, libc::SO_BROADCAST),
    (libc::SOL_SOCKET, libc::SO_OOBINLINE),
    (libc::SOL_SOCKET, libc::SO_PRIORITY),
    (libc::SOL_SOCKET, libc::SO_RCVLOWAT),
    (libc::SOL_SOCKET, libc::SO_LINGER),
    (libc::SOL_SOCKET, libc::SO_DONTROUTE),
    (libc::IPPROTO_IP, libc::IP_TTL),
    (libc::IPPROTO_IP, libc::IP_TOS),
    (libc::IPPROTO_IP, libc::IP_FREEBIND),
    (libc::IPPROTO_IP, libc::IP_RECVERR),
    (libc::IPPROTO_IP, libc::IP_PKTINFO),
    (libc::IPPROTO_IP, libc::IP_RECVTOS),
    (libc::IPPROTO_IP, libc::IP_RECVTTL),
    (libc::IPPROTO_IP, libc::IP_MTU_DISCOVER),
    (libc::IPPROTO_IP, libc::IP_MULTICAST_TTL),
    (libc::IPPROTO_IP, libc::IP_MULTICAST_LOOP),
    (libc::IPPROTO_IP, libc::IP_BIND_ADDRESS_NO_PORT),
    (libc::IPPROTO_IPV6, libc::IPV6_UNICAST_HOPS),
    (libc::IPPROTO_IPV6, libc::IPV6_TCLASS),
    (libc::IPPROTO_IPV6, libc::IPV6_RECVPKTINFO),
    (libc::IPPROTO_IPV6, libc::IPV6_MULTICAST_HOPS),
    (libc::IPPROTO_IPV6, libc::IPV6_MULTICAST_LOOP),
    (libc::IPPROTO_IPV6, libc::IPV6_RECVERR),
    (libc::IPPROTO_IPV6, libc::IPV6_MTU_DISCOVER),
    (libc::IPPROTO_TCP, libc::TCP_NODELAY),
    (libc::IPPROTO_TCP, libc::TCP_KEEPIDLE),
    (libc::IPPROTO_TCP, libc::TCP_KEEPINTVL),
    (libc::IPPROTO_TCP, libc::TCP_KEEPCNT),
    (libc::IPPROTO_TCP, libc::TCP_USER_TIMEOUT),
    (libc::IPPROTO_TCP, libc::TCP_DEFER_ACCEPT),
    (libc::IPPROTO_TCP, libc::TCP_FASTOPEN),
    (libc::IPPROTO_TCP, libc::TCP_NOTSENT_LOWAT),
    // UDP-Lite's checksum coverage (`UDPLITE_SEND_CSCOV`, `UDPLITE_RECV_CSCOV`).
    (libc::IPPROTO_UDPLITE, 10),
    (libc::IPPROTO_UDPLITE, 11),
];

/// Whether descriptor link `fd` (`/proc/<pid>/fd/<n>`), on mount `m`, is
/// a regular file of the sandbox's `/dev/shm`.
fn on_dev_shm(fd: &std::path::Path, m: Option<&MountEntry>) -> bool {
    m.is_some_and(|m| m.fstype == "tmpfs" && m.target == std::path::Path::new("/dev/shm"))
        && fs::metadata(fd).is_ok_and(|meta| meta.is_file())
}

/// Whether a mount keeps its identity across a rollback in place (`/proc`
/// and `/dev` with its binds and devpts are moved into the new tree;
/// `/dev/shm` is mounted fresh).
fn kept_mount(m: &MountEntry) -> bool {
    let t = m.target.to_string_lossy();
    let under = |p: &str| t == p || t.starts_with(&format!("{p}/"));
    under("/proc") || (under("/dev") && !under("/dev/shm"))
}

fn inode_of(link: &str, prefix: &str) -> Option<u64> {
    link.strip_prefix(prefix)?.strip_suffix(']')?.parse().ok()
}

/// What the target of a `/proc/<pid>/fd/<n>` link names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Link<'a> {
    /// `pipe:[ino]`.
    Pipe(u64),
    /// `socket:[ino]`.
    Socket(u64),
    /// `anon_inode:[what]` (or `anon_inode:what`: inotify's).
    Anon(&'a str),
    /// `/memfd:<name> (deleted)`: the name.
    Memfd(&'a str),
    /// `<path> (deleted)`: the path.
    Deleted(&'a str),
    /// A path (or another pseudo name).
    Path,
}

fn parse_fd_link(link: &str) -> Link<'_> {
    if let Some(ino) = inode_of(link, "pipe:[") {
        Link::Pipe(ino)
    } else if let Some(ino) = inode_of(link, "socket:[") {
        Link::Socket(ino)
    } else if let Some(what) = link.strip_prefix("anon_inode:") {
        Link::Anon(what.trim_matches(|c| c == '[' || c == ']'))
    } else if let Some(name) = link.strip_prefix("/memfd:") {
        Link::Memfd(name.trim_end_matches(" (deleted)"))
    } else if let Some(path) = link.strip_suffix(" (deleted)") {
        Link::Deleted(path)
    } else {
        Link::Path
    }
}

/// `statfs`'s `f_type` of the POSIX message queue file system.
const MQUEUE_MAGIC: i64 = 0x1980_0202;

/// How an `OtherMount` path names a POSIX message queue (`kinds/file.rs`
/// refuses it by that name).
pub(crate) const MQUEUE_PREFIX: &str = "mqueue:";

/// The mounts a process sees, by id.
pub fn mounts(pid: HostPid) -> io::Result<HashMap<i32, MountEntry>> {
    Ok(mountinfo::mounts_of(pid.raw())?.into_iter().map(|m| (m.id, m)).collect())
}

/// A sandbox's mounts by id as its init sees them, kept by the tracer
/// thread for the checkpoint's copy and checks, and read again only once
/// a mount of the namespace changed ([`mountinfo::Watched`]): a checkpoint
/// needed the table twice in its frozen window, where each read cost
/// ~0.1-0.2 ms.
/// The tracer reads it again between operations after a change (a
/// checkpoint's or rollback's own swap), so that the next one finds it.
#[derive(Clone, Default)]
pub struct MountCache(std::sync::Arc<std::sync::Mutex<Option<(mountinfo::Watched, Mounts)>>>);

/// Mounts by id.
pub type Mounts = std::sync::Arc<HashMap<i32, MountEntry>>;

impl MountCache {
    /// The table of `pid` (a sandbox's init), read now if it may have
    /// changed.
    pub fn of(&self, pid: HostPid) -> io::Result<Mounts> {
        let mut cached = self.0.lock().unwrap_or_else(|e| e.into_inner());
        match cached.as_ref() {
            // (`changed` reports a change once: the table is read again
            // right away, under the lock.)
            Some((watched, by_id)) if !watched.changed(pid.raw()) => Ok(by_id.clone()),
            _ => Self::read(&mut cached, pid),
        }
    }

    /// Forget the table: its open `mountinfo` holds the mount namespace,
    /// and with it every mount of the sandbox, alive.
    pub(crate) fn clear(&self) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }

    /// Read the table of `pid` again if it changed (between operations);
    /// whether it did.
    pub(crate) fn refresh(&self, pid: HostPid) -> bool {
        let mut cached = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if cached.as_ref().is_some_and(|(w, _)| !w.changed(pid.raw())) {
            return false;
        }
        Self::read(&mut cached, pid).is_ok()
    }

    fn read(cached: &mut Option<(mountinfo::Watched, Mounts)>, pid: HostPid) -> io::Result<Mounts> {
        *cached = None;
        let t0 = std::time::Instant::now();
        let watched = mountinfo::Watched::read(pid.raw())?;
        tracing::debug!(pid = pid.raw(), took = ?t0.elapsed(), "mount table read");
        let by_id: Mounts = std::sync::Arc::new(watched.entries().iter().map(|m| (m.id, m.clone())).collect());
        *cached = Some((watched, by_id.clone()));
        Ok(by_id)
    }
}

/// The root directory of process `pid`: mount and inode of
/// `/proc/<pid>/root` (two processes with the same one see the same mount
/// points).
pub fn root_of(pid: HostPid) -> Option<(u64, u64)> {
    let mask = rustix::fs::StatxFlags::MNT_ID | rustix::fs::StatxFlags::INO;
    let path = format!("/proc/{pid}/root");
    let sx = rustix::fs::statx(rustix::fs::CWD, path.as_str(), rustix::fs::AtFlags::empty(), mask).ok()?;
    Some((sx.stx_mnt_id, sx.stx_ino))
}

/// The open descriptors of `pid` (`mounts`: [`mounts`] of a process of the
/// same mount namespace).
pub fn fds(pid: HostPid, mounts: &HashMap<i32, MountEntry>) -> io::Result<Vec<FdImage>> {
    let pidfd = rustix::process::Pid::from_raw(pid.raw())
        .and_then(|p| rustix::process::pidfd_open(p, rustix::process::PidfdFlags::empty()).ok());
    let mut out = Vec::new();
    let mut diag = None;
    for entry in fs::read_dir(format!("/proc/{pid}/fd"))? {
        let entry = entry?;
        let Ok(fd) = entry.file_name().to_string_lossy().parse::<i32>() else { continue };
        let Ok(link) = readlink(entry.path()) else { continue }; // closed meanwhile
        let Ok(info) = fdinfo(pid, fd) else { continue };
        let kind = match parse_fd_link(&link) {
            Link::Pipe(ino) => FdKind::Pipe { ino },
            Link::Socket(ino) => socket_kind(pid, pidfd.as_ref(), &mut diag, fd, ino),
            Link::Anon(what) => {
                let mut state = match what {
                    "inotify" => Some(inotify_state(pid, &info.text, pidfd.as_ref(), fd, mounts)),
                    _ => anon_state(what, &info.text, pidfd.as_ref(), fd),
                };
                if let Some(AnonState::Epoll { stale, .. }) = &mut state {
                    *stale = stale_watches(pid, &info.text);
                }
                FdKind::AnonInode { what: what.to_string(), state }
            }
            Link::Memfd(name) => memfd_kind(pidfd.as_ref(), fd, name, &entry.path()),
            Link::Deleted(path) if on_dev_shm(&entry.path(), mounts.get(&info.mnt_id)) => {
                FdKind::ShmFile { path: path.to_string(), deleted: true }
            }
            Link::Deleted(path)
                if fs::metadata(entry.path())
                    .is_ok_and(|m| std::os::unix::fs::FileTypeExt::is_fifo(&m.file_type())) =>
            {
                let mount = mounts.get(&info.mnt_id);
                FdKind::Fifo {
                    path: path.to_string(),
                    on_layer: mount.is_some_and(|m| m.fstype == "overlay"),
                    kept: mount.is_some_and(kept_mount),
                    deleted: true,
                }
            }
            // The slave of a pty whose master was closed (its node went
            // with it): a hung-up terminal.
            Link::Deleted(path)
                if path.starts_with("/dev/pts/")
                    && mounts.get(&info.mnt_id).is_some_and(|m| m.fstype == "devpts")
                    && fs::metadata(entry.path())
                        .is_ok_and(|m| std::os::unix::fs::FileTypeExt::is_char_device(&m.file_type())) =>
            {
                FdKind::KeptFile { path: path.to_string(), unread: 0, master_captured: false, hung_up: true }
            }
            Link::Deleted(path) => {
                let meta = fs::metadata(entry.path()).ok();
                let regular = meta.as_ref().is_some_and(|m| m.is_file());
                let directory = meta.as_ref().is_some_and(|m| m.is_dir());
                let on_layer =
                    (regular || directory) && mounts.get(&info.mnt_id).is_some_and(|m| m.fstype == "overlay");
                use std::os::unix::fs::MetadataExt;
                FdKind::Deleted {
                    path: path.to_string(),
                    on_layer,
                    directory,
                    remade: false,
                    size: meta.as_ref().map(|m| m.len()).unwrap_or(0),
                    mode: meta.as_ref().map(|m| m.mode() & 0o7777),
                    times: meta.as_ref().map(|m| {
                        let ns = |s: i64, n: i64| s.saturating_mul(1_000_000_000).saturating_add(n);
                        (ns(m.atime(), m.atime_nsec()), ns(m.mtime(), m.mtime_nsec()))
                    }),
                    owner: meta.as_ref().map(|m| (m.uid(), m.gid())),
                    nlink: meta.as_ref().map(|m| m.nlink()).unwrap_or(0),
                    segments: Vec::new(),
                }
            }
            Link::Path => {
                let meta = fs::metadata(entry.path()).ok();
                let fifo = meta.as_ref().is_some_and(|m| std::os::unix::fs::FileTypeExt::is_fifo(&m.file_type()));
                match mounts.get(&info.mnt_id) {
                    // A named pipe: its bytes are saved like a pipe's, and on a
                    // layer it is reopened by path at the restore.
                    _ if fifo => {
                        let mount = mounts.get(&info.mnt_id);
                        FdKind::Fifo {
                            path: link,
                            on_layer: mount.is_some_and(|m| m.fstype == "overlay"),
                            kept: mount.is_some_and(kept_mount),
                            deleted: false,
                        }
                    }
                    Some(m) if m.fstype == "overlay" => {
                        let directory = meta.map(|m| m.is_dir()).unwrap_or(false);
                        let (mut locks, mut locked) = info.locks();
                        // A lease's break notice signal, asked of the open file;
                        // a lease of an open file several processes share is
                        // taken again by its holder alone (the file's owner:
                        // the process that took it; another one of the
                        // sandbox would take it from it).
                        let lease = |l: &crate::model::FileLock| l.kind == crate::model::LockKind::Lease;
                        if locks.iter().any(lease) {
                            let dup = dup_of(pidfd.as_ref(), fd);
                            let notices = dup
                                .as_ref()
                                .map(|d| (sandtree_sys::file_notices::signal(d), sandtree_sys::file_notices::owner(d)));
                            match notices {
                                Some((Ok(signal), Ok(owner))) => {
                                    let elsewhere = owner > 0
                                        && owner != pid.raw()
                                        && fs::metadata(format!("/proc/{owner}")).is_ok();
                                    locks.retain(|l| !(lease(l) && elsewhere));
                                    for l in locks.iter_mut().filter(|l| lease(l)) {
                                        l.signal = signal;
                                    }
                                }
                                _ => locked = true,
                            }
                        }
                        FdKind::LayerFile { path: link, directory, locked, locks }
                    }
                    m if on_dev_shm(&entry.path(), m) => FdKind::ShmFile { path: link, deleted: false },
                    Some(_) if link == "/dev/pts/ptmx" || link == "/dev/ptmx" => {
                        FdKind::PtyMaster { state: pty_state(pid, pidfd.as_ref(), fd) }
                    }
                    Some(m) if kept_mount(m) => {
                        // `/dev/tty` of a pty is that pty's slave (what a
                        // template must not hold, and what the restore
                        // opens again: the restored process may not have
                        // that controlling terminal when it opens it).
                        let link = match link.as_str() {
                            "/dev/tty" => controlling_pty(pidfd.as_ref(), fd).map_or(link, |i| format!("/dev/pts/{i}")),
                            _ => link,
                        };
                        let mut kept =
                            FdKind::KeptFile { path: link, unread: 0, master_captured: false, hung_up: false };
                        if kept.terminal().is_some()
                            && let FdKind::KeptFile { unread, .. } = &mut kept
                        {
                            *unread = unread_on(pidfd.as_ref(), fd).unwrap_or(u32::MAX);
                        }
                        kept
                    }
                    // A POSIX message queue (`mq_open`): on its IPC
                    // namespace's own mount, which no process mounted.
                    None if rustix::fs::statfs(entry.path()).is_ok_and(|s| s.f_type == MQUEUE_MAGIC) => {
                        FdKind::OtherMount { path: format!("{MQUEUE_PREFIX}{link}") }
                    }
                    _ => FdKind::OtherMount { path: link },
                }
            }
        };
        out.push(FdImage {
            fd,
            flags: info.flags,
            pos: info.pos,
            mnt_id: info.mnt_id,
            kind,
            same_as: None,
            opened_by: None,
            daemon_opens: false,
            reopen_denied: false,
            in_flight: false,
        });
    }
    out.sort_by_key(|f| f.fd);
    mark_dups(pid, &mut out);
    Ok(out)
}

/// The watched descriptor numbers of an epoll of process `pid` (its
/// fdinfo `text`) whose watched file (`ino:`) is not the file that number
/// names now (closed, or dup'd and closed, or reused).
fn stale_watches(pid: HostPid, text: &str) -> Vec<i32> {
    use std::os::unix::fs::MetadataExt;
    epoll_watch_inodes(text)
        .into_iter()
        .filter(|&(tfd, ino)| fs::metadata(format!("/proc/{pid}/fd/{tfd}")).map(|m| m.ino()).ok() != Some(ino))
        .map(|(tfd, _)| tfd)
        .collect()
}

/// (watched descriptor, inode of the watched file) of each watch in an
/// epoll's fdinfo (`tfd: N ... ino:<hex> sdev:<hex>`).
fn epoll_watch_inodes(text: &str) -> Vec<(i32, u64)> {
    text.lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            (f.next()? == "tfd:").then_some(())?;
            let tfd = f.next()?.parse().ok()?;
            let ino = f.find_map(|w| w.strip_prefix("ino:"))?;
            Some((tfd, u64::from_str_radix(ino, 16).ok()?))
        })
        .collect()
}

/// Mark the descriptors of `fds` (of process `pid`, sorted by number)
/// that are `dup`s of lower ones, for the kinds made anew at a restore.
fn mark_dups(pid: HostPid, fds: &mut [FdImage]) {
    for i in 0..fds.len() {
        if !fds[i].kind.reopened_file() {
            continue;
        }
        let twin = (0..i).find(|&j| {
            fds[j].same_as.is_none()
                && fds[j].kind == fds[i].kind
                && sandtree_sys::process::same_open_file(pid.raw(), fds[j].fd, pid.raw(), fds[i].fd).unwrap_or(false)
        });
        fds[i].same_as = twin.map(|j| fds[j].fd);
    }
}

/// The memory map of `pid`.
pub fn maps(pid: HostPid) -> io::Result<Vec<MapImage>> {
    Ok(parse_maps(&read_text(format!("/proc/{pid}/maps"))?))
}

/// The mappings of a `/proc/<pid>/maps` text.
fn parse_maps(text: &str) -> Vec<MapImage> {
    let mut out = Vec::new();
    for line in text.lines() {
        let mut f = line.splitn(6, ' ');
        let (Some(range), Some(perms), Some(offset)) = (f.next(), f.next(), f.next()) else { continue };
        let dev = f.next().and_then(|d| d.split_once(':')).map_or(0, |(major, minor)| {
            let hex = |v: &str| u32::from_str_radix(v, 16).unwrap_or(0);
            libc::makedev(hex(major), hex(minor))
        });
        let inode = f.next().and_then(|i| i.parse().ok()).unwrap_or(0);
        let path = f.next().map(|p| p.trim_start().to_string()).filter(|p| !p.is_empty());
        let Some((a, b)) = range.split_once('-') else { continue };
        out.push(MapImage {
            start: u64::from_str_radix(a, 16).unwrap_or(0),
            end: u64::from_str_radix(b, 16).unwrap_or(0),
            perms: perms.to_string(),
            offset: u64::from_str_radix(offset, 16).unwrap_or(0),
            path,
            dev,
            inode,
            dont_fork: false,
            advice: Vec::new(),
        });
    }
    out
}

/// A mapping's (start, end) and the `madvise` advice it carries.
pub type AdvisedRange = ((u64, u64), Vec<crate::model::Advice>);

/// The `madvise` advice of each mapping of `pid` that carries any
/// (`smaps`' `VmFlags`). (`smaps` walks the page tables.)
pub fn advice(pid: HostPid) -> io::Result<Vec<AdvisedRange>> {
    Ok(parse_advice(&read_text(format!("/proc/{pid}/smaps"))?))
}

/// [`advice`] of a `/proc/<pid>/smaps` text.
fn parse_advice(text: &str) -> Vec<AdvisedRange> {
    smaps_flags(text)
        .into_iter()
        .filter_map(|((start, end, _), flags)| {
            let advice: Vec<_> = flags.split_whitespace().filter_map(crate::model::Advice::from_flag).collect();
            (!advice.is_empty()).then_some(((start, end), advice))
        })
        .collect()
}

/// The mappings of `pid` marked `MADV_DONTFORK` (`dc` in `smaps`'
/// `VmFlags`), as (start, end, private and anonymous). (`smaps` walks the
/// page tables: read only for a process known to have some.)
pub fn dont_fork_ranges(pid: HostPid) -> io::Result<Vec<(u64, u64, bool)>> {
    Ok(parse_dont_fork(&read_text(format!("/proc/{pid}/smaps"))?))
}

/// [`dont_fork_ranges`] of a `/proc/<pid>/smaps` text.
fn parse_dont_fork(text: &str) -> Vec<(u64, u64, bool)> {
    smaps_flags(text)
        .into_iter()
        .filter(|(_, flags)| flags.split_whitespace().any(|f| f == "dc"))
        .map(|(range, _)| range)
        .collect()
}

/// Each mapping of a `/proc/<pid>/smaps` text: (start, end, private and
/// anonymous) and the words of its `VmFlags` line.
fn smaps_flags(text: &str) -> Vec<((u64, u64, bool), &str)> {
    let mut out = Vec::new();
    let mut current = None;
    for line in text.lines() {
        if let Some(flags) = line.strip_prefix("VmFlags:") {
            if let Some(range) = current.take() {
                out.push((range, flags));
            }
            continue;
        }
        // A mapping's line: `start-end perms offset dev inode [path]`.
        let mut f = line.split_whitespace();
        let (Some(range), Some(perms)) = (f.next(), f.next()) else { continue };
        let Some((a, b)) = range.split_once('-') else { continue };
        let (Ok(start), Ok(end)) = (u64::from_str_radix(a, 16), u64::from_str_radix(b, 16)) else { continue };
        if perms.len() != 4 {
            continue;
        }
        let inode = f.nth(2).and_then(|i| i.parse::<u64>().ok()).unwrap_or(1);
        let anon = inode == 0 && f.next().is_none_or(|p| p.starts_with("[anon:") || p == "[heap]");
        current = Some((start, end, perms.ends_with('p') && anon));
    }
    out
}

/// The image of a process from its template (a fork made at the
/// checkpoint, so its memory map, credentials, masks and session are the
/// original's), with what pass 1 read of the original while it was
/// stopped: its pid, parent, registers, descriptors (the template's file
/// positions are shared with the running original), and cwd, root and
/// executable (a layered checkpoint detaches the tree the template's point
/// into, where paths on a sub-layer read wrong).
pub fn capture(
    (pid, ppid): (SandboxPid, SandboxPid),
    regs: Registers,
    fds: Vec<FdImage>,
    (cwd, root, exe): (String, String, String),
    of_template: TemplateFacts,
    known_maps: Option<Vec<MapImage>>,
) -> io::Result<ProcessImage> {
    let TemplateFacts { status: st, tty_nr, comm, maps } = of_template;
    let maps = known_maps.or(maps).ok_or_else(|| io::Error::other("the template's memory map was not read"))?;
    Ok(ProcessImage {
        pid,
        ppid,
        pgid: if st.ns_pgid == st.ns_pid { pid } else { st.ns_pgid },
        sid: if st.ns_sid == st.ns_pid { pid } else { st.ns_sid },
        has_tty: tty_nr != 0,
        tpgid: None,
        comm,
        exe,
        threads: 1,
        uids: st.uids,
        gids: st.gids,
        groups: st.groups,
        cap_eff: st.cap_eff,
        umask: st.umask,
        affinity: Vec::new(),
        signals: st.signals,
        queued_signals: Vec::new(),
        regs,
        cwd,
        cwd_denied: false,
        cwd_remade: None,
        root,
        fds,
        maps,
        ghosts: Vec::new(),
        itimers: Vec::new(),
        posix_timers: Vec::new(),
        altstack: None,
        child_subreaper: false,
        rseq: None,
        robust_list: None,
        other_threads: Vec::new(),
        exit_signal: libc::SIGCHLD,
        job_stopped: false,
        stop_reports: Vec::new(),
        zombies: Vec::new(),
    })
}

/// What [`capture`] reads of the template itself (once the processes
/// run again: the template stays stopped and unchanged once made).
pub struct TemplateFacts {
    pub status: Status,
    pub tty_nr: i64,
    pub comm: String,
    /// Read only when asked for (a template made from a standby has the
    /// process's, read in the frozen window).
    pub maps: Option<Vec<MapImage>>,
}

/// Read [`TemplateFacts`] of `template`.
pub fn template_facts(template: HostPid, with_maps: bool) -> io::Result<TemplateFacts> {
    Ok(TemplateFacts {
        status: status(template)?,
        tty_nr: tty_nr(template)?,
        comm: read_text(format!("/proc/{template}/comm"))?.trim_end().to_string(),
        maps: if with_maps { Some(maps(template)?) } else { None },
    })
}

/// The thread group (process) of task `tid`.
pub fn tgid(tid: HostPid) -> io::Result<HostPid> {
    parse_tgid(&read_text(format!("/proc/{tid}/status"))?)
        .map(HostPid)
        .ok_or_else(|| io::Error::other("no Tgid in status"))
}

/// `Tgid` of a `/proc/<tid>/status` text.
fn parse_tgid(status: &str) -> Option<i32> {
    field(status, "Tgid").and_then(|v| v.parse().ok())
}

/// Whether `pid` has POSIX timers (`timer_create`; `/proc/pid/timers`).
pub fn has_posix_timers(pid: HostPid) -> bool {
    read_text(format!("/proc/{pid}/timers")).is_ok_and(|t| parse_has_posix_timers(&t))
}

/// A POSIX timer as `/proc/<pid>/timers` lists it: (id, signal, value,
/// `sigev_notify` with `SIGEV_THREAD_ID`, the pid or thread id it names
/// (host: the daemon's `/proc`), clock).
pub type ListedTimer = (i32, i32, u64, i32, i32, i32);

/// The POSIX timers of `pid`.
pub fn posix_timers(pid: HostPid) -> io::Result<Vec<ListedTimer>> {
    parse_posix_timers(&read_text(format!("/proc/{pid}/timers"))?)
}

/// [`posix_timers`] of a `/proc/<pid>/timers` text: per timer, `ID: <id>`,
/// `signal: <signo>/<value, hex>`, `notify: <signal|none|thread>/<pid|tid>.<n>`,
/// `ClockID: <clock>`.
fn parse_posix_timers(text: &str) -> io::Result<Vec<ListedTimer>> {
    let bad = |what: &str| io::Error::other(format!("/proc timers: bad {what}"));
    let mut out: Vec<ListedTimer> = Vec::new();
    for line in text.lines() {
        let Some((k, v)) = line.split_once(':') else { continue };
        let v = v.trim();
        match k {
            "ID" => out.push((v.parse().map_err(|_| bad("ID"))?, 0, 0, 0, 0, 0)),
            _ if out.is_empty() => return Err(bad("order")),
            "signal" => {
                let (signo, value) = v.split_once('/').ok_or_else(|| bad("signal"))?;
                let last = out.last_mut().ok_or_else(|| bad("signal"))?;
                last.1 = signo.parse().map_err(|_| bad("signo"))?;
                last.2 = u64::from_str_radix(value, 16).map_err(|_| bad("value"))?;
            }
            "notify" => {
                let (kind, who) = v.split_once('/').ok_or_else(|| bad("notify"))?;
                let (scope, n) = who.split_once('.').ok_or_else(|| bad("notify"))?;
                let mut notify = match kind {
                    "signal" => libc::SIGEV_SIGNAL,
                    "none" => libc::SIGEV_NONE,
                    "thread" => libc::SIGEV_THREAD,
                    _ => return Err(bad("notify kind")),
                };
                if scope == "tid" {
                    notify |= libc::SIGEV_THREAD_ID;
                }
                let last = out.last_mut().ok_or_else(|| bad("notify"))?;
                last.3 = notify;
                last.4 = n.parse().map_err(|_| bad("notify pid"))?;
            }
            "ClockID" => out.last_mut().ok_or_else(|| bad("ClockID"))?.5 = v.parse().map_err(|_| bad("clock"))?,
            _ => {}
        }
    }
    Ok(out)
}

/// Whether a `/proc/<pid>/timers` text lists a timer.
fn parse_has_posix_timers(timers: &str) -> bool {
    timers.lines().any(|l| l.starts_with("ID:"))
}

/// Base address of the vDSO of `pid` (`AT_SYSINFO_EHDR` in its auxv).
pub fn vdso_base(pid: HostPid) -> io::Result<u64> {
    parse_vdso_base(&fs::read(format!("/proc/{pid}/auxv"))?)
        .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "no vDSO in auxv"))
}

/// `AT_SYSINFO_EHDR` of a `/proc/<pid>/auxv` (native-endian 64-bit key and
/// value pairs).
fn parse_vdso_base(auxv: &[u8]) -> Option<u64> {
    const AT_SYSINFO_EHDR: u64 = 33;
    auxv.chunks_exact(16)
        .map(|c| {
            (
                u64::from_ne_bytes(c[..8].try_into().unwrap_or_default()),
                u64::from_ne_bytes(c[8..].try_into().unwrap_or_default()),
            )
        })
        .find(|(k, _)| *k == AT_SYSINFO_EHDR)
        .map(|(_, v)| v)
}

/// Physical frame numbers of the resident pages of the private writable
/// mappings of `pid`, from
/// `/proc/<pid>/pagemap` (64-bit entries, one per virtual page: bit 63
/// present, bits 0-54 the frame; real frames need `CAP_SYS_ADMIN`, which
/// the daemon has). Swapped-out pages have no frame and are left out.
/// Reading a 1 GB process takes a few milliseconds: not on a hot path.
/// `between` runs before each read of up to 4,096 entries (a caller that
/// must stay out of another's way waits there).
pub fn frames(pid: HostPid, between: &dyn Fn()) -> std::io::Result<Vec<u64>> {
    use std::os::unix::fs::FileExt;
    const PRESENT: u64 = 1 << 63;
    const PFN: u64 = (1 << 55) - 1;
    let maps = read_text(format!("/proc/{pid}/maps"))?;
    let pagemap = fs::File::open(format!("/proc/{pid}/pagemap"))?;
    let mut out = Vec::new();
    let mut buf = vec![0u8; 8 * 4096];
    for (start, end) in parse_cow_ranges(&maps) {
        let mut page = start / 4096;
        while page < end / 4096 {
            let n = ((end / 4096 - page) as usize).min(4096);
            between();
            let got = pagemap.read_at(&mut buf[..n * 8], page * 8)?;
            if got == 0 {
                break;
            }
            for e in buf[..got].chunks_exact(8) {
                let e = u64::from_ne_bytes(e.try_into().unwrap_or_default());
                if e & PRESENT != 0 && e & PFN != 0 {
                    out.push(e & PFN);
                }
            }
            page += (got / 8) as u64;
        }
    }
    Ok(out)
}

/// Resident pages of process `host` (0 if unknown).
pub(crate) fn resident_pages(host: HostPid) -> u64 {
    let statm = std::fs::read_to_string(format!("/proc/{host}/statm")).unwrap_or_default();
    statm.split_whitespace().nth(1).and_then(|v| v.parse().ok()).unwrap_or(0)
}

/// The address ranges (start, end) of a `/proc/<pid>/maps` text whose
/// pages [`frames`] reads.
fn parse_cow_ranges(maps: &str) -> impl Iterator<Item = (u64, u64)> + '_ {
    /// Larger mappings are address-space reservations, not memory.
    const MAX_MAPPING: u64 = 1 << 40;
    maps.lines().filter_map(|line| {
        if line.ends_with("[vsyscall]") {
            return None;
        }
        let mut fields = line.split_whitespace();
        let (range, perms) = (fields.next()?, fields.next()?);
        // Pages a template holds alone are copies made by copy-on-write:
        // only in private writable mappings (code and shared files are the
        // page cache of everyone).
        if !perms.starts_with("rw") || !perms.ends_with('p') {
            return None;
        }
        let (a, b) = range.split_once('-')?;
        let (start, end) = (u64::from_str_radix(a, 16).ok()?, u64::from_str_radix(b, 16).ok()?);
        // Reservations of terabytes (sanitizer shadows) are not read.
        end.checked_sub(start).is_some_and(|len| len <= MAX_MAPPING).then_some((start, end))
    })
}

#[cfg(test)]
mod tests;
