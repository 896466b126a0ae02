//! Re-pointing stopped processes at a new filesystem tree: a layered
//! checkpoint with live processes.
//!
//! A layered checkpoint freezes the sandbox's writable layer by stacking a
//! new empty one over it (init's restack, `sandtree-sandbox`'s `reroot.rs`).
//! A running process still holds the old tree: its cwd and the files it has
//! open are on the old overlay, whose upper directory is the frozen layer,
//! and a write through them would change the checkpoint. So, while every
//! process is stopped (after the templates' copy, before the processes
//! are let go):
//!
//! 1. `check` (at the end of the copy, on the tracer thread, on what the
//!    copy read of each process): refuse what cannot be moved to another
//!    tree without changing its meaning (the checkpoint is then a btrfs
//!    snapshot, as before): a deleted file of the tree held open, a named
//!    pipe or a bound unix socket on the tree (their kernel object belongs
//!    to the old overlay's inode), inotify watches, kernel objects that may
//!    hold files (io_uring; a unix socket with data, maybe descriptors, in
//!    flight), a file of the writable layer mapped shared (the overlay
//!    gives such a mapping its own device: the layer's upper directory
//!    tells), one open file of the tree shared by two processes (reopening
//!    gives each its own offset), a thread with a descriptor table or
//!    filesystem context of its own, a process chrooted elsewhere;
//! 2. init mounts the new tree at a staging point (`stage`) and `open`
//!    opens, in each process, each of its files of the tree again through
//!    that point (same flags, minus the creating ones; same offset), onto
//!    spare descriptor numbers, and `chdir`s there (one call; an `O_PATH`
//!    open and an `fchdir` and `close` after the swap cost two more round
//!    trips a process). A failure closes every one of them and `chdir`s
//!    each process back by its old path (the old tree is still the root):
//!    nothing changed, and the caller unstages (steps 1 and 2 run in the
//!    copy's job, [`crate::Tracer::stop_and_clone`]);
//! 3. init moves the staged tree to `/` (the descriptors opened through it
//!    and the cwds in it follow the mount) and `finish` puts each new
//!    descriptor on its number (`dup3`, which closes the old one) and its
//!    dups after it (`Copied::finish_and_go`).
//!
//! Calls are injected into each process's main thread (the descriptor table
//! and cwd are shared by its threads); paths are written below its stack
//! pointer's red zone, where nothing lives while it is stopped, and what
//! was there is put back.

use std::os::unix::fs::MetadataExt;

use sandtree_sys::ptrace;

use super::Parts;
use crate::model::FdKind;
use crate::{Error, HostPid, Result};

/// What one process got in step 2: (new descriptor, its number, flags),
/// dups to make after them (from, to, flags), and, when it moved its cwd
/// into the staged tree, its old cwd's path (to go back to on abort).
#[derive(Default)]
pub(crate) struct Reopened {
    host: HostPid,
    files: Vec<(i32, i32, u32)>,
    dups: Vec<(i32, i32, u32)>,
    cwd: Option<String>,
}

/// Flags that only mean something when a file is first opened.
const CREATING: u32 = (libc::O_CREAT | libc::O_EXCL | libc::O_TRUNC | libc::O_NOCTTY) as u32;

/// Room for one path below the red zone.
const PATH_MAX: usize = 4096;

/// What step 1 needs to know of the sandbox.
#[derive(Debug, Clone)]
pub struct Tree {
    /// Its init (host pid), whose root the processes must share.
    pub init_host: HostPid,
    /// Each overlay's mount point in the sandbox (`/` first or not: the
    /// longest that holds a path is its) and its writable upper directory
    /// on the host.
    pub uppers: Vec<(String, std::path::PathBuf)>,
}

impl Tree {
    /// Whether sandbox path `path` names a file of the writable layer (one
    /// made or copied up since the layer was stacked), or cannot be told.
    fn in_upper(&self, path: &str) -> bool {
        let under = |target: &str| {
            let t = target.trim_end_matches('/');
            path.strip_prefix(t).filter(|rest| rest.is_empty() || rest.starts_with('/') || t.is_empty())
        };
        let Some((rest, upper)) = self
            .uppers
            .iter()
            .filter_map(|(target, upper)| under(target).map(|rest| (rest, upper)))
            .max_by_key(|(rest, _)| std::cmp::Reverse(rest.len()))
        else {
            return true;
        };
        // (An overlay reports its own device and inode for an upper file,
        // `/proc/<pid>/map_files` included: the upper directory tells.)
        std::fs::symlink_metadata(upper.join(rest.trim_start_matches('/'))).is_ok()
    }
}

/// Step 1: why the stopped processes (pass 1 done: [`Parts::cloned`],
/// whose descriptors, threads and cwd were read while they are stopped)
/// cannot be moved to a new tree, if they cannot. On the tracer thread,
/// at the end of the copy: ~10 µs a process (it used to read every
/// process's `/proc` again on the caller's thread, beside the copy:
/// 1.5-1.9 ms on a busy machine, two Python processes' `maps` alone
/// 0.3 ms).
pub(crate) fn check(st: &Parts<'_>, tree: &Tree) -> std::result::Result<(), String> {
    let root = crate::procfs::root_of(tree.init_host).ok_or("cannot read init's root")?;
    let mut layer_files: Vec<(HostPid, i32, &str)> = Vec::new();
    for c in st.cloned.iter() {
        let (host, who) = (c.stopped.host, format!("pid {}", c.stopped.ns_pid));
        if crate::procfs::root_of(host) != Some(root) {
            return Err(format!("{who} has a root of its own"));
        }
        // Calls go to the main thread: every thread must share its
        // descriptor table and filesystem context.
        for &(tid, ..) in &c.stopped.threads {
            if !sandtree_sys::process::same_files_and_fs(host.raw(), tid.raw()).unwrap_or(false) {
                return Err(format!("{who}: thread {tid} has a descriptor table or cwd of its own"));
            }
        }
        if c.paths.0.ends_with(" (deleted)") {
            return Err(format!("{who}: its cwd was deleted"));
        }
        for f in &c.fds {
            // (Not in its table: nothing could reopen it through the new tree.)
            if f.in_flight {
                return Err(format!("{who}: a file is in flight on one of its unix sockets (SCM_RIGHTS)"));
            }
            if let Some(why) = crate::kinds::of(&f.kind).cannot_move(f) {
                return Err(format!("{who}: fd {}: {why}", f.fd));
            }
            if let FdKind::LayerFile { path, .. } = &f.kind
                && f.same_as.is_none()
            {
                layer_files.push((host, f.fd, path));
            }
        }
        // A shared mapping of a file of the writable layer would keep
        // mapping the frozen file while writes through the tree go to its
        // copy in the new layer. (One of a lower layer's file was not
        // coherent with writes before either: a write copies it up.)
        for path in shared_file_maps(host).map_err(|e| format!("{who}: memory map: {e}"))? {
            if on_tree(&path) && !path.starts_with("/memfd:") && !path.starts_with("/SYSV") && tree.in_upper(&path) {
                return Err(format!("{who}: {path} of the writable layer is mapped shared"));
            }
        }
    }
    // One open file of the tree in two processes: each would get its own.
    for (i, (h1, fd1, p1)) in layer_files.iter().enumerate() {
        for (h2, fd2, p2) in &layer_files[i + 1..] {
            if h1 != h2
                && p1 == p2
                && sandtree_sys::process::same_open_file(h1.raw(), *fd1, h2.raw(), *fd2).unwrap_or(true)
            {
                return Err(format!("{p1} is one open file of two processes"));
            }
        }
    }
    Ok(())
}

/// The paths of `host`'s shared file mappings: asked of the kernel
/// (`PROCMAP_QUERY`), or read from `maps` where it cannot be.
fn shared_file_maps(host: HostPid) -> std::io::Result<Vec<String>> {
    if let Some(paths) = sandtree_sys::process::shared_file_maps(host.raw())? {
        return Ok(paths);
    }
    let maps = crate::procfs::maps(host)?;
    Ok(maps.into_iter().filter(|m| m.shared()).filter_map(|m| m.path).collect())
}

/// A path of the tree (absolute, not of the kept `/proc` and `/dev`).
fn on_tree(path: &str) -> bool {
    path.starts_with('/') && !crate::kinds::kept_path(path)
}

/// Step 2, through the tree staged at `stage` (a path in the sandbox),
/// for each process with its template that did not take it yet (a
/// checkpoint takes it for all but the largest process while the largest
/// one's copy runs, then for that one). On error, what was opened is
/// closed again.
pub(crate) fn open(st: &mut Parts<'_>, stage: &str) -> Result<()> {
    let mut done = std::mem::take(st.repointed);
    let mut failure = None;
    for c in st.cloned.iter_mut() {
        if done.iter().any(|r| r.host == c.stopped.host) {
            continue;
        }
        let Some(orig) = c.orig.as_mut() else { continue };
        let mut r = Reopened { host: c.stopped.host, ..Default::default() };
        let res = reopen(orig, c.stopped.regs.rsp, (&c.fds, &c.paths.0), stage, &mut r);
        done.push(r);
        match res {
            // (Killed meanwhile: nothing of it to move.)
            Ok(()) | Err(Error::Died { .. }) => {}
            Err(e) => {
                failure = Some(e);
                break;
            }
        }
    }
    *st.repointed = done;
    match failure {
        None => Ok(()),
        Some(e) => {
            abort(st);
            Err(e)
        }
    }
}

/// Step 2 for one process whose cwd (read in pass 1, while it was
/// stopped already) is `cwd`.
fn reopen(
    p: &mut crate::inject::Tracee,
    rsp: u64,
    (fds, cwd): (&[crate::model::FdImage], &str),
    stage: &str,
    r: &mut Reopened,
) -> Result<()> {
    let host = p.tid;
    // Room below the red zone for the longest path (what was there is put
    // back after).
    let paths = fds.iter().filter_map(|f| match &f.kind {
        FdKind::LayerFile { path, .. } => Some(path.len()),
        _ => None,
    });
    let len = paths.chain([cwd.len()]).max().unwrap_or(0) + stage.len() + 1;
    let (buf, saved) = below_red_zone(host, rsp, len, "open (new tree)")?;
    let put = |path: &str| -> Result<u64> {
        let mut bytes = format!("{stage}{path}").into_bytes();
        bytes.push(0);
        ptrace::write_mem(host.raw(), buf, &bytes).map_err(|source| Error::Ptrace {
            pid: host,
            op: "write path",
            source,
        })?;
        Ok(buf)
    };
    let res = (|| -> Result<()> {
        for f in fds {
            let FdKind::LayerFile { path, directory, .. } = &f.kind else { continue };
            if let Some(from) = f.same_as {
                r.dups.push((from, f.fd, f.flags));
                continue;
            }
            let at = put(path)?;
            let fd = p.call("open (new tree)", libc::SYS_open, &[at, (f.flags & !CREATING) as u64, 0])? as i32;
            r.files.push((fd, f.fd, f.flags));
            // A file copied up into the writable layer before is copied up
            // again from it, and its inode number (the layer's copy's)
            // changes: SQLite, for one, then takes its database for moved
            // and turns read-only. Such a checkpoint is a snapshot.
            let ino = |fd: i32| std::fs::metadata(format!("/proc/{host}/fd/{fd}")).map(|m| m.ino());
            if let (Ok(was), Ok(now)) = (ino(f.fd), ino(fd))
                && was != now
            {
                return Err(Error::Proc {
                    pid: host,
                    what: "a reopened file",
                    source: std::io::Error::other(format!(
                        "fd {} ({path}) would change inode number ({was} to {now})",
                        f.fd
                    )),
                });
            }
            if f.pos > 0 && !directory {
                p.call("lseek (new tree)", libc::SYS_lseek, &[fd as u64, f.pos, libc::SEEK_SET as u64])?;
            }
        }
        if on_tree(cwd) {
            let at = put(cwd)?;
            p.call("chdir (new tree)", libc::SYS_chdir, &[at])?;
            r.cwd = Some(cwd.to_string());
        }
        Ok(())
    })();
    put_back_below_red_zone(host, buf, &saved)?;
    res
}

/// Room for a path of `len` bytes (its NUL included) below stopped
/// process `host`'s red zone, its stack pointer being `rsp`: the address,
/// and the bytes there now, to put back.
fn below_red_zone(host: HostPid, rsp: u64, len: usize, call: &'static str) -> Result<(u64, Vec<u8>)> {
    if len > PATH_MAX {
        return Err(Error::Remote { pid: host, call, errno: std::io::Error::from_raw_os_error(libc::ENAMETOOLONG) });
    }
    let buf = (rsp - 128 - len as u64) & !15;
    let mut saved = vec![0u8; len];
    ptrace::read_mem(host.raw(), buf, &mut saved).map_err(|source| Error::Ptrace {
        pid: host,
        op: "read stack",
        source,
    })?;
    Ok((buf, saved))
}

/// Undo step 2 (the caller unstages the tree): close what it opened, and
/// `chdir` each process that moved its cwd back by the old path.
pub(crate) fn abort(st: &mut Parts<'_>) {
    for r in std::mem::take(st.repointed) {
        let Some(c) = st.cloned.iter_mut().find(|c| c.stopped.host == r.host) else { continue };
        let rsp = c.stopped.regs.rsp;
        let Some(p) = c.orig.as_mut() else { continue };
        for fd in r.files.iter().map(|f| f.0) {
            let _ = p.call("close", libc::SYS_close, &[fd as u64]);
        }
        if let Some(cwd) = r.cwd
            && let Err(e) = chdir_back(p, rsp, &cwd)
        {
            tracing::warn!(pid = c.stopped.ns_pid.raw(), "cwd not moved back from the staged tree: {e}");
        }
    }
}

/// What [`below_red_zone`] saved, written back at `buf`.
fn put_back_below_red_zone(host: HostPid, buf: u64, saved: &[u8]) -> Result<()> {
    ptrace::write_mem(host.raw(), buf, saved).map_err(|source| Error::Ptrace { pid: host, op: "restore stack", source })
}

/// `chdir(path)` in stopped process `p`, the path written below its red
/// zone (and what was there put back).
fn chdir_back(p: &mut crate::inject::Tracee, rsp: u64, path: &str) -> Result<()> {
    let host = p.tid;
    let (buf, saved) = below_red_zone(host, rsp, path.len() + 1, "chdir (old tree)")?;
    let mut bytes = path.as_bytes().to_vec();
    bytes.push(0);
    let res = ptrace::write_mem(host.raw(), buf, &bytes)
        .map_err(|source| Error::Ptrace { pid: host, op: "write path", source })
        .and_then(|()| p.call("chdir (old tree)", libc::SYS_chdir, &[buf]).map(drop));
    put_back_below_red_zone(host, buf, &saved)?;
    res
}

/// Step 3, once the staged tree is the root.
pub(crate) fn finish(st: &mut Parts<'_>) -> Result<()> {
    for r in std::mem::take(st.repointed) {
        let Some(c) = st.cloned.iter_mut().find(|c| c.stopped.host == r.host) else { continue };
        let Some(p) = c.orig.as_mut() else { continue };
        match put_in_place(p, &r) {
            // (Killed meanwhile: nothing of it runs on the old tree.)
            Ok(()) | Err(Error::Died { .. }) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

fn put_in_place(p: &mut crate::inject::Tracee, r: &Reopened) -> Result<()> {
    let cloexec = |flags: u32| (flags & libc::O_CLOEXEC as u32) as u64;
    for &(new, fd, flags) in &r.files {
        p.call("dup3 (new tree)", libc::SYS_dup3, &[new as u64, fd as u64, cloexec(flags)])?;
        p.call("close", libc::SYS_close, &[new as u64])?;
    }
    for &(from, fd, flags) in &r.dups {
        p.call("dup3 (new tree)", libc::SYS_dup3, &[from as u64, fd as u64, cloexec(flags)])?;
    }
    Ok(())
}
