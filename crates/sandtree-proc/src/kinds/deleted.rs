//! Deleted-but-open files (`FdKind::Deleted`): a regular file of the
//! sandbox's layers whose last name was removed. Its data segments are
//! copied in pass 1, whatever its size, into a memfd of the daemon at the
//! same offsets
//! (`fdstate::SparseCopy`: holes cost nothing); at the restore it is made
//! anew as an unnamed file (`O_TMPFILE`) in its old directory of the
//! rolled-back tree, its segments written at their offsets (holes stay
//! holes), its size, owner, mode and access and modification times set
//! back, and it is opened again with its flags at its offset. Refused: one
//! that is not a regular file of the layers, one still linked under
//! another name (a copy would be another file).

use std::io;
use std::sync::Arc;

use rustix::fs::OFlags;

use super::{Kind, Remake, reopen_unnamed};
use crate::batch::write_path;
use crate::fdstate::{SparseCopy, open_proc_fd};
use crate::inject::Tracee;
use crate::model::{FdImage, FdKind, ProcessImage};
use crate::{Error, HostPid, Result};

/// Deleted-but-open files.
pub(crate) struct Deleted;

impl Kind for Deleted {
    fn check(&self, f: &FdImage, _p: &ProcessImage) -> std::result::Result<(), String> {
        match &f.kind {
            FdKind::Deleted { path, on_layer: false, .. } => Err(format!(
                "open file {path} was deleted and is not a regular file or directory on the sandbox's layers"
            )),
            FdKind::Deleted { path, directory: true, remade: false, .. } => Err(format!(
                "open directory {path} was deleted, and its path is taken again or its parent is not one its user may write (a restore makes it again there)"
            )),
            FdKind::Deleted { path, nlink, .. } if *nlink > 0 => Err(format!(
                "open file {path} was deleted, but is still linked under another name (a copy would not be that file)"
            )),
            _ => Ok(()),
        }
    }

    fn cannot_move(&self, f: &FdImage) -> Option<&'static str> {
        matches!(f.kind, FdKind::Deleted { on_layer: true, .. }).then_some("a deleted file of the tree is open")
    }

    fn remake(&self, f: &FdImage, cx: &mut Remake<'_>) -> Result<()> {
        match &f.kind {
            FdKind::Deleted { path, directory: true, .. } if f.same_as.is_none() => {
                remake_dir(cx.p, cx.scratch, f, path)
            }
            FdKind::Deleted { path, .. } if f.same_as.is_none() => {
                let copy = cx.contents(f.fd);
                recreate(cx.p, (cx.scratch, cx.image), f, path, copy.as_deref())
            }
            _ => Ok(()),
        }
    }
}

/// Pass 1: the contents of the deleted files among `fds` of
/// stopped process `host` (a dup's are its twin's), by descriptor, saved
/// sparsely: their data segments only (which a deleted file's kind then
/// lists: the holes stay holes at the restore).
pub(crate) fn capture_contents(host: HostPid, fds: &mut [FdImage]) -> Result<Vec<(i32, Arc<SparseCopy>)>> {
    let mut out = Vec::new();
    for f in fds.iter_mut().filter(|f| f.same_as.is_none()) {
        let FdKind::Deleted { on_layer: true, directory: false, size, segments, .. } = &mut f.kind else { continue };
        // (Read without touching its access time.)
        let flags = OFlags::RDONLY | OFlags::NOATIME;
        let copy = open_proc_fd(host, f.fd, flags)
            .and_then(|file| SparseCopy::save(&file, *size))
            .map_err(|e| Error::Proc { pid: host, what: "deleted file contents", source: e })?;
        *segments = copy.runs.clone();
        out.push((f.fd, Arc::new(copy)));
    }
    Ok(out)
}

/// A deleted-but-open file: an unnamed file (`O_TMPFILE`) in its old
/// directory (or `/tmp`) of the rolled-back tree, filled with the
/// checkpoint's copy, opened again with the old flags at the old offset.
fn recreate(
    p: &mut Tracee,
    (scratch, image): (u64, &ProcessImage),
    f: &FdImage,
    path: &str,
    copy: Option<&SparseCopy>,
) -> Result<()> {
    let pid = p.tid;
    let dir = std::path::Path::new(path).parent().map(|d| d.to_string_lossy().into_owned()).unwrap_or_default();
    let mut tmp = None;
    for d in [dir.as_str(), "/tmp", "/"] {
        if d.is_empty() {
            continue;
        }
        let addr = write_path(pid, scratch, d)?;
        let out = p.syscall(libc::SYS_open, &[addr, (libc::O_TMPFILE | libc::O_RDWR) as u64, 0o600])?;
        if out.ret >= 0 {
            tmp = Some(out.ret as u64);
            break;
        }
    }
    let tmp = tmp.ok_or_else(|| {
        Error::unsupported(
            image.pid,
            &image.comm,
            format!("fd {}", f.fd),
            format!("cannot make an unnamed file for deleted {path}"),
        )
    })?;
    let FdKind::Deleted { size, mode, times, owner, .. } = &f.kind else { return Ok(()) };
    fill_file(pid, tmp as i32, copy).map_err(|e| Error::Proc { pid, what: "deleted file contents", source: e })?;
    // Its size (a hole at the end), owner, mode and times, as they were.
    p.call("ftruncate (deleted file)", libc::SYS_ftruncate, &[tmp, *size])?;
    set_attributes(p, scratch, tmp, (*mode, *times, *owner))?;
    // `tmp` may have the number the file had (closed by the template's
    // set-up): closed before the new descriptor moves there.
    reopen_unnamed(p, scratch, f, tmp, true)
}

/// A deleted file's permission bits, access and modification times (ns
/// since the epoch) and owner (host ids), as its image holds them.
type Attributes = (Option<u32>, Option<(i64, i64)>, Option<(u32, u32)>);

/// Give the file behind descriptor `tmp` of `p` its owner, mode and access
/// and modification times as they were.
fn set_attributes(p: &mut Tracee, scratch: u64, tmp: u64, (mode, times, owner): Attributes) -> Result<()> {
    let pid = p.tid;
    // (The owner by the daemon, in host ids, through the new file's magic
    // link; before the mode, which a change of owner may strip of its
    // set-id bits.)
    if let Some((uid, gid)) = owner {
        set_owner(pid, tmp as i32, uid, gid).map_err(|e| Error::Proc { pid, what: "deleted file owner", source: e })?;
    }
    if let Some(mode) = mode {
        p.call("fchmod (deleted file)", libc::SYS_fchmod, &[tmp, mode as u64])?;
    }
    if let Some((atime, mtime)) = times {
        let mut ts = Vec::with_capacity(32);
        for t in [atime, mtime] {
            ts.extend_from_slice(&t.div_euclid(1_000_000_000).to_ne_bytes());
            ts.extend_from_slice(&t.rem_euclid(1_000_000_000).to_ne_bytes());
        }
        sandtree_sys::ptrace::write_mem(pid.raw(), scratch + 1024, &ts).map_err(|source| Error::Ptrace {
            pid,
            op: "write timespec",
            source,
        })?;
        p.call("utimensat (deleted file)", libc::SYS_utimensat, &[tmp, 0, scratch + 1024, 0])?;
    }
    Ok(())
}

/// A deleted directory (empty: removed while open), made again at its path
/// by the process (the checkpoint's tree has no file there: checked at
/// the capture), opened, removed again; its mode, owner and times set
/// back; then opened again with its flags at its offset on its number.
fn remake_dir(p: &mut Tracee, scratch: u64, f: &FdImage, path: &str) -> Result<()> {
    let pid = p.tid;
    let FdKind::Deleted { mode, times, owner, .. } = &f.kind else { return Ok(()) };
    let at = write_path(pid, scratch, path)?;
    p.call("mkdir (deleted directory)", libc::SYS_mkdir, &[at, 0o700])?;
    let flags = (libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC) as u64;
    let tmp = p.call("open (deleted directory)", libc::SYS_open, &[at, flags, 0]);
    let removed = p.call("rmdir (deleted directory)", libc::SYS_rmdir, &[at]);
    let tmp = tmp?;
    removed?;
    set_attributes(p, scratch, tmp, (*mode, *times, *owner))?;
    reopen_unnamed(p, scratch, f, tmp, true)
}

/// Give the file behind descriptor `fd` of `pid` owner `uid`:`gid` (host
/// ids), unless it has them.
fn set_owner(pid: HostPid, fd: i32, uid: u32, gid: u32) -> io::Result<()> {
    let file = open_proc_fd(pid, fd, OFlags::PATH)?;
    let now = rustix::fs::fstat(&file)?;
    if (now.st_uid, now.st_gid) == (uid, gid) {
        return Ok(());
    }
    rustix::fs::chownat(
        &file,
        "",
        Some(rustix::process::Uid::from_raw(uid)),
        Some(rustix::process::Gid::from_raw(gid)),
        rustix::fs::AtFlags::EMPTY_PATH,
    )?;
    Ok(())
}

/// Write `copy`'s runs at their offsets into the file behind fd `fd` of
/// `host` (a fresh file of a restored process; no copy: nothing).
pub(crate) fn fill_file(host: HostPid, fd: i32, copy: Option<&SparseCopy>) -> io::Result<()> {
    match copy {
        Some(c) => c.write_into(&open_proc_fd(host, fd, OFlags::WRONLY)?),
        None => Ok(()),
    }
}
