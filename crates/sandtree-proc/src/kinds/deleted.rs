//! Deleted-but-open files (`FdKind::Deleted`): a regular file of the
//! sandbox's layers whose last name was removed. Its contents (up to
//! [`GHOST_MAX`]) are copied in pass 1, with memfds' (`memfd.rs`); at the
//! restore it is made anew as an unnamed file (`O_TMPFILE`) in its old
//! directory of the rolled-back tree, filled, and opened again with its
//! flags at its offset. Refused: one that is not a regular file of the
//! layers, one larger than [`GHOST_MAX`].

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
/// stopped process `host` (a dup's are its twin's), by descriptor.
pub(crate) fn capture_contents(host: HostPid, fds: &[FdImage]) -> Result<Vec<(i32, Vec<u8>)>> {
    let mut out = Vec::new();
    for f in fds.iter().filter(|f| f.same_as.is_none()) {
        let size = match &f.kind {
            FdKind::Deleted { on_layer: true, size, .. } | FdKind::Memfd { size, hugetlb: false, .. } => Some(*size),
            _ => None,
        };
        if let Some(size) = size
            && size <= GHOST_MAX
        {
            let bytes = read_contents(host, f.fd, size).map_err(|e| Error::Proc {
                pid: host,
                what: "deleted file or memfd contents",
                source: e,
            })?;
            out.push((f.fd, bytes));
        }
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
    fill_file(pid, tmp as i32, bytes).map_err(|e| Error::Proc { pid, what: "deleted file contents", source: e })?;
    // `tmp` may have the number the file had (closed by the template's
    // set-up): closed before the new descriptor moves there.
    reopen_unnamed(p, scratch, f, tmp, true)
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

/// Write `bytes` into the file behind fd `fd` of `host` (a fresh
/// `O_TMPFILE` of a restored process).
pub(crate) fn fill_file(host: HostPid, fd: i32, bytes: &[u8]) -> io::Result<()> {
    std::fs::File::from(open_proc_fd(host, fd, OFlags::WRONLY)?).write_all_at(bytes, 0)
}
