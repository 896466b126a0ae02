//! Deleted-but-open files (`FdKind::Deleted`): a regular file of the
//! sandbox's layers whose last name was removed. Its data segments (up to
//! [`GHOST_MAX`] bytes of file) are copied in pass 1, with memfds'
//! contents (`memfd.rs`); at the restore it is made anew as an unnamed file
//! (`O_TMPFILE`) in its old directory of the rolled-back tree, its
//! segments written at their offsets (holes stay holes), its size, owner,
//! mode and access and modification times set back, and it is opened again
//! with its flags at its offset. Refused: one that is not a regular file of
//! the layers, one still linked under another name (a copy would be
//! another file), one larger than [`GHOST_MAX`].

use std::io;
use std::os::unix::fs::FileExt;

use rustix::fs::OFlags;
use rustix::io::Errno;

use super::{Kind, Remake, reopen_unnamed};
use crate::batch::write_path;
use crate::check::GHOST_MAX;
use crate::fdstate::open_proc_fd;
use crate::inject::Tracee;
use crate::model::{FdImage, FdKind, ProcessImage};
use crate::{Error, HostPid, Result};

/// Deleted-but-open files.
pub(crate) struct Deleted;

impl Kind for Deleted {
    fn check(&self, f: &FdImage, _p: &ProcessImage) -> std::result::Result<(), String> {
        match &f.kind {
            FdKind::Deleted { path, on_layer: false, .. } => {
                Err(format!("open file {path} was deleted and is not a regular file on the sandbox's layers"))
            }
            FdKind::Deleted { path, nlink, .. } if *nlink > 0 => Err(format!(
                "open file {path} was deleted, but is still linked under another name (a copy would not be that file)"
            )),
            FdKind::Deleted { path, size, .. } if *size > GHOST_MAX => Err(format!(
                "open file {path} was deleted and holds {size} bytes (deleted-but-open files are copied at a checkpoint, up to {GHOST_MAX} bytes)"
            )),
            _ => Ok(()),
        }
    }

    fn cannot_move(&self, f: &FdImage) -> Option<&'static str> {
        matches!(f.kind, FdKind::Deleted { on_layer: true, .. }).then_some("a deleted file of the tree is open")
    }

    fn remake(&self, f: &FdImage, cx: &mut Remake<'_>) -> Result<()> {
        match &f.kind {
            FdKind::Deleted { path, .. } if f.same_as.is_none() => {
                let bytes = cx.contents(f.fd).to_vec();
                recreate(cx.p, (cx.scratch, cx.image), f, path, &bytes)
            }
            _ => Ok(()),
        }
    }
}

/// Pass 1: the contents of the deleted files and memfds among `fds` of
/// stopped process `host` (a dup's are its twin's), by descriptor. A
/// deleted file's are its data segments only (which its kind then lists:
/// the holes stay holes at the restore).
pub(crate) fn capture_contents(host: HostPid, fds: &mut [FdImage]) -> Result<Vec<(i32, Vec<u8>)>> {
    let mut out = Vec::new();
    for f in fds.iter_mut().filter(|f| f.same_as.is_none()) {
        let err = |e| Error::Proc { pid: host, what: "deleted file or memfd contents", source: e };
        match &mut f.kind {
            FdKind::Deleted { on_layer: true, size, segments, .. } if *size <= GHOST_MAX => {
                let (bytes, segs) = read_segments(host, f.fd, *size).map_err(err)?;
                *segments = segs;
                out.push((f.fd, bytes));
            }
            FdKind::Memfd { size, hugetlb: false, .. } if *size <= GHOST_MAX => {
                out.push((f.fd, read_contents(host, f.fd, *size).map_err(err)?));
            }
            _ => {}
        }
    }
    Ok(out)
}

/// Data segments of a file: (offset, length).
type Segments = Vec<(u64, u64)>;

/// The data segments (offset, length) of the file behind fd `fd` of
/// `host` (`SEEK_DATA`/`SEEK_HOLE` on a new open of it: the process's
/// offset does not move), and their bytes one after the other.
fn read_segments(host: HostPid, fd: i32, size: u64) -> io::Result<(Vec<u8>, Segments)> {
    let f = open_proc_fd(host, fd, OFlags::RDONLY)?;
    let (mut bytes, mut segments) = (Vec::new(), Vec::new());
    for (start, len) in crate::fdstate::data_segments(&f, size)? {
        let mut seg = vec![0u8; len as usize];
        let mut got = 0;
        while got < seg.len() {
            match rustix::io::pread(&f, &mut seg[got..], start + got as u64) {
                Ok(0) => break,
                Ok(n) => got += n,
                Err(Errno::INTR) => {}
                Err(e) => return Err(e.into()),
            }
        }
        seg.truncate(got);
        segments.push((start, seg.len() as u64));
        bytes.extend_from_slice(&seg);
    }
    Ok((bytes, segments))
}

/// A deleted-but-open file: an unnamed file (`O_TMPFILE`) in its old
/// directory (or `/tmp`) of the rolled-back tree, filled with the
/// checkpoint's copy, opened again with the old flags at the old offset.
fn recreate(
    p: &mut Tracee,
    (scratch, image): (u64, &ProcessImage),
    f: &FdImage,
    path: &str,
    bytes: &[u8],
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
    let FdKind::Deleted { size, mode, times, owner, segments, .. } = &f.kind else { return Ok(()) };
    let filled = if segments.is_empty() {
        fill_file(pid, tmp as i32, bytes)
    } else {
        fill_segments(pid, tmp as i32, bytes, segments)
    };
    filled.map_err(|e| Error::Proc { pid, what: "deleted file contents", source: e })?;
    // Its size (a hole at the end), owner, mode and times, as they were.
    p.call("ftruncate (deleted file)", libc::SYS_ftruncate, &[tmp, *size])?;
    // (The owner by the daemon, in host ids, through the new file's magic
    // link; before the mode, which a change of owner may strip of its
    // set-id bits.)
    if let Some((uid, gid)) = *owner {
        set_owner(pid, tmp as i32, uid, gid).map_err(|e| Error::Proc { pid, what: "deleted file owner", source: e })?;
    }
    if let Some(mode) = mode {
        p.call("fchmod (deleted file)", libc::SYS_fchmod, &[tmp, *mode as u64])?;
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
    // `tmp` may have the number the file had (closed by the template's
    // set-up): closed before the new descriptor moves there.
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

/// The contents of a deleted-but-open file (fd `fd` of `host`), read
/// without moving its offset.
fn read_contents(host: HostPid, fd: i32, size: u64) -> io::Result<Vec<u8>> {
    let f = open_proc_fd(host, fd, OFlags::RDONLY)?;
    let mut out = vec![0u8; size as usize];
    let mut got = 0;
    while got < out.len() {
        match rustix::io::pread(&f, &mut out[got..], got as u64) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
    out.truncate(got);
    Ok(out)
}

/// Write `bytes`, the data of `segments` (offset, length) one after the
/// other, at their offsets into the file behind fd `fd` of `host`.
fn fill_segments(host: HostPid, fd: i32, bytes: &[u8], segments: &[(u64, u64)]) -> io::Result<()> {
    let file = std::fs::File::from(open_proc_fd(host, fd, OFlags::WRONLY)?);
    let mut from = 0usize;
    for &(at, len) in segments {
        let to = from + len as usize;
        file.write_all_at(bytes.get(from..to).ok_or_else(|| io::Error::other("segments past the bytes"))?, at)?;
        from = to;
    }
    Ok(())
}

/// Write `bytes` into the file behind fd `fd` of `host` (a fresh
/// `O_TMPFILE` of a restored process).
pub(crate) fn fill_file(host: HostPid, fd: i32, bytes: &[u8]) -> io::Result<()> {
    std::fs::File::from(open_proc_fd(host, fd, OFlags::WRONLY)?).write_all_at(bytes, 0)
}
