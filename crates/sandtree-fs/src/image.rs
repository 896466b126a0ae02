//! Images: read-only subvolumes under `images/` holding a root filesystem,
//! built from the host (default image), a directory or a tarball.
//!
//! ```text
//! images/<name>/                   subvolume, read-only once complete
//!   bin -> usr/bin  lib -> usr/lib ...   (default image: mirrors host top-level symlinks)
//!   dev proc sys run tmp(1777) root(0700) home opt mnt srv var/{tmp,log,cache,lib}
//!   usr/                           empty mount point (default image: host /usr, idmapped ro)
//!   etc/                           filtered copy of host /etc + fresh passwd/group/shadow/hosts...
//!   var/lib/dpkg/                  copy of the host's, so `dpkg -l` works
//! ```
//!
//! Ownership is shifted while writing: id `n < 65536` is stored as
//! `uid_base + n`; larger ids become `uid_base + 65534` (nobody). Sandboxes
//! map `0..65536` inside to `uid_base..` outside, so files appear with their
//! original owners inside. Mode bits (setuid included) are applied *after*
//! `chown`, because `chown` clears setuid/setgid.
//!
//! Writing is done relative to directory fds with `O_NOFOLLOW` on every
//! component, so neither a hostile tarball (`../x`, absolute paths, a symlink
//! entry followed by an entry "through" it) nor a racing process can make us
//! write outside the destination; such entries are refused with
//! [`Error::UnsafePath`]. Device nodes and sockets are skipped (counted).
//! A failed import deletes the half-written subvolume. A completed image is
//! marked read-only; an existing writable image is an interrupted build and
//! is rebuilt.

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Component, Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use rustix::fs::{AtFlags, FileType, Gid, Mode, OFlags, Timespec, Timestamps, Uid};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::subvol::{create_subvolume, delete_subvolume, dir_size, is_subvolume, set_readonly};

/// Name of the default image under `images/`.
pub const DEFAULT_IMAGE: &str = "default";
/// Ids inside a sandbox: `0..ID_RANGE`.
pub const ID_RANGE: u32 = 65536;
const NOBODY: u32 = 65534;
const REPORT_EVERY_BYTES: u64 = 4 << 20;
const REPORT_EVERY_FILES: u64 = 256;

/// Where a lower (read-only) layer comes from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum LowerSource {
    /// A subvolume on the volume (files already owned by `uid_base + id`).
    Subvolume(PathBuf),
    /// A host directory, to be idmapped read-only by the sandbox crate.
    HostDir(PathBuf),
}

/// One lower layer, mounted at `target` inside the sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LowerLayer {
    /// Mount point inside the sandbox: `/` or e.g. `/usr`.
    pub target: PathBuf,
    pub source: LowerSource,
}

/// Progress report of an image build or import.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Progress {
    /// `"scan"`, `"copy"`, `"extract"`, `"finish"` or `"done"`.
    pub phase: &'static str,
    pub done_bytes: u64,
    pub total_bytes: u64,
    pub files: u64,
}

/// Maps a host-side id inside an image to its on-disk id.
pub fn shift_id(uid_base: u32, id: u32) -> u32 {
    uid_base.saturating_add(if id >= ID_RANGE { NOBODY } else { id })
}

/// Layers of the default image built at `dst`: the skeleton at `/` and the
/// host's `/usr` at `/usr`.
pub fn default_image_layers(dst: &Path) -> Vec<LowerLayer> {
    vec![
        LowerLayer { target: PathBuf::from("/"), source: LowerSource::Subvolume(dst.to_path_buf()) },
        LowerLayer { target: PathBuf::from("/usr"), source: LowerSource::HostDir(PathBuf::from("/usr")) },
    ]
}

fn single_layer(dst: &Path) -> Vec<LowerLayer> {
    vec![LowerLayer { target: PathBuf::from("/"), source: LowerSource::Subvolume(dst.to_path_buf()) }]
}

/// Deletes an image subvolume (missing is fine).
pub fn remove_image(path: &Path) -> Result<()> {
    delete_subvolume(path)
}

// ---------------------------------------------------------------------------
// Low-level writing helpers (fd relative, never following symlinks).

fn ts(sec: i64, nsec: i64) -> Timestamps {
    let t = Timespec { tv_sec: sec, tv_nsec: nsec as _ };
    Timestamps { last_access: t, last_modification: t }
}

fn open_dir_at(dir: &OwnedFd, name: &OsStr) -> io::Result<OwnedFd> {
    Ok(rustix::fs::openat(
        dir,
        name,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )?)
}

fn open_root(path: &Path) -> Result<OwnedFd> {
    rustix::fs::open(path, OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty())
        .map_err(|e| Error::io("open", path, e.into()))
}

/// Sets owner, mode and mtime on an open fd (mode after chown: see module docs).
fn set_attrs(fd: &OwnedFd, uid: u32, gid: u32, mode: u32, mtime: (i64, i64)) -> io::Result<()> {
    rustix::fs::fchown(fd, Some(Uid::from_raw(uid)), Some(Gid::from_raw(gid)))?;
    rustix::fs::fchmod(fd, Mode::from_raw_mode(mode & 0o7777))?;
    rustix::fs::futimens(fd, &ts(mtime.0, mtime.1))?;
    Ok(())
}

fn set_link_attrs(dir: &OwnedFd, name: &OsStr, uid: u32, gid: u32, mtime: (i64, i64)) -> io::Result<()> {
    rustix::fs::chownat(dir, name, Some(Uid::from_raw(uid)), Some(Gid::from_raw(gid)), AtFlags::SYMLINK_NOFOLLOW)?;
    rustix::fs::utimensat(dir, name, &ts(mtime.0, mtime.1), AtFlags::SYMLINK_NOFOLLOW)?;
    Ok(())
}

/// Creates (or replaces) a regular file `name` in `dir` for writing.
fn create_file_at(dir: &OwnedFd, name: &OsStr) -> io::Result<File> {
    let flags = OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    match rustix::fs::openat(dir, name, flags, Mode::from_raw_mode(0o600)) {
        Ok(fd) => Ok(File::from(fd)),
        Err(rustix::io::Errno::EXIST) => {
            rustix::fs::unlinkat(dir, name, AtFlags::empty())?;
            Ok(File::from(rustix::fs::openat(dir, name, flags, Mode::from_raw_mode(0o600))?))
        }
        Err(e) => Err(e.into()),
    }
}

/// mkdir + open, tolerating an existing directory (never a symlink).
fn mkdir_open_at(dir: &OwnedFd, name: &OsStr) -> io::Result<OwnedFd> {
    match rustix::fs::mkdirat(dir, name, Mode::from_raw_mode(0o700)) {
        Ok(()) | Err(rustix::io::Errno::EXIST) => {}
        Err(e) => return Err(e.into()),
    }
    open_dir_at(dir, name)
}

fn symlink_at(target: &Path, dir: &OwnedFd, name: &OsStr) -> io::Result<()> {
    match rustix::fs::symlinkat(target, dir, name) {
        Err(rustix::io::Errno::EXIST) => {
            rustix::fs::unlinkat(dir, name, AtFlags::empty())?;
            Ok(rustix::fs::symlinkat(target, dir, name)?)
        }
        r => Ok(r?),
    }
}

/// Shared state of one build/import: id shift, counters, progress.
struct Ctx<'a> {
    uid_base: u32,
    progress: &'a dyn Fn(Progress),
    phase: &'static str,
    total: u64,
    done: u64,
    files: u64,
    skipped: u64,
    last_bytes: u64,
    last_files: u64,
    /// (dev, ino) of multiply linked source files -> path written in dst.
    links: HashMap<(u64, u64), PathBuf>,
}

impl<'a> Ctx<'a> {
    fn new(uid_base: u32, progress: &'a dyn Fn(Progress), phase: &'static str) -> Self {
        Ctx {
            uid_base,
            progress,
            phase,
            total: 0,
            done: 0,
            files: 0,
            skipped: 0,
            last_bytes: 0,
            last_files: 0,
            links: HashMap::new(),
        }
    }

    fn id(&self, id: u32) -> u32 {
        shift_id(self.uid_base, id)
    }

    fn report(&mut self, force: bool) {
        if force
            || self.done - self.last_bytes >= REPORT_EVERY_BYTES
            || self.files - self.last_files >= REPORT_EVERY_FILES
        {
            self.last_bytes = self.done;
            self.last_files = self.files;
            (self.progress)(Progress {
                phase: self.phase,
                done_bytes: self.done,
                total_bytes: self.total.max(self.done),
                files: self.files,
            });
        }
    }

    fn phase(&mut self, phase: &'static str) {
        self.phase = phase;
        self.report(true);
    }
}

/// What to do with one source entry of a directory copy.
type Filter<'f> = &'f dyn Fn(&Path, &fs::Metadata) -> bool;

/// Copies the contents of host directory `src` into the open directory
/// `dst_fd` (whose path is `dst`), shifting ownership. `rel` is the path of
/// `src` relative to the copy root, for the filter. With `lenient`,
/// unreadable entries are skipped instead of failing the copy.
#[allow(clippy::too_many_arguments)]
fn copy_tree(
    ctx: &mut Ctx<'_>,
    src: &Path,
    dst_fd: &OwnedFd,
    dst: &Path,
    rel: &Path,
    root_dev: u64,
    filter: Filter<'_>,
    lenient: bool,
) -> Result<()> {
    let rd = match fs::read_dir(src) {
        Ok(rd) => rd,
        Err(e) if lenient => {
            tracing::debug!(path = %src.display(), error = %e, "skipping unreadable directory");
            return Ok(());
        }
        Err(e) => return Err(Error::io("read directory", src, e)),
    };
    for entry in rd {
        let entry = entry.map_err(|e| Error::io("read directory", src, e))?;
        let name = entry.file_name();
        let spath = entry.path();
        let srel = rel.join(&name);
        let dpath = dst.join(&name);
        let md = fs::symlink_metadata(&spath).map_err(|e| Error::io("stat", &spath, e))?;
        if md.dev() != root_dev || !filter(&srel, &md) {
            // Another filesystem (a mount point, a bind-mounted file) or excluded.
            continue;
        }
        let ft = md.file_type();
        let (uid, gid) = (ctx.id(md.uid()), ctx.id(md.gid()));
        let mtime = (md.mtime(), md.mtime_nsec());
        if ft.is_dir() {
            let fd = mkdir_open_at(dst_fd, &name).map_err(|e| Error::io("mkdir", &dpath, e))?;
            copy_tree(ctx, &spath, &fd, &dpath, &srel, root_dev, filter, lenient)?;
            set_attrs(&fd, uid, gid, md.mode(), mtime).map_err(|e| Error::io("set attributes of", &dpath, e))?;
        } else if ft.is_file() {
            if md.nlink() > 1
                && let Some(first) = ctx.links.get(&(md.dev(), md.ino()))
            {
                let _ = rustix::fs::unlinkat(dst_fd, &name, AtFlags::empty());
                rustix::fs::linkat(rustix::fs::CWD, first, dst_fd, &name, AtFlags::empty())
                    .map_err(|e| Error::io("hard link", &dpath, e.into()))?;
                ctx.files += 1;
                continue;
            }
            let mut input = match File::open(&spath) {
                Ok(f) => f,
                Err(e) if lenient => {
                    tracing::debug!(path = %spath.display(), error = %e, "skipping unreadable file");
                    continue;
                }
                Err(e) => return Err(Error::io("open", &spath, e)),
            };
            let mut out = create_file_at(dst_fd, &name).map_err(|e| Error::io("create", &dpath, e))?;
            let n = io::copy(&mut input, &mut out).map_err(|e| Error::io("copy", &dpath, e))?;
            let fd = OwnedFd::from(out);
            set_attrs(&fd, uid, gid, md.mode(), mtime).map_err(|e| Error::io("set attributes of", &dpath, e))?;
            if md.nlink() > 1 {
                ctx.links.insert((md.dev(), md.ino()), dpath);
            }
            ctx.done += n;
            ctx.files += 1;
            ctx.report(false);
        } else if ft.is_symlink() {
            let target = fs::read_link(&spath).map_err(|e| Error::io("read link", &spath, e))?;
            symlink_at(&target, dst_fd, &name).map_err(|e| Error::io("symlink", &dpath, e))?;
            set_link_attrs(dst_fd, &name, uid, gid, mtime).map_err(|e| Error::io("set attributes of", &dpath, e))?;
            ctx.files += 1;
        } else if ft.is_fifo() {
            rustix::fs::mknodat(dst_fd, &name, FileType::Fifo, Mode::from_raw_mode(0o600), 0)
                .map_err(|e| Error::io("mkfifo", &dpath, e.into()))?;
            // chmod/chown by name: a fifo cannot be opened without blocking.
            rustix::fs::chownat(
                dst_fd,
                &name,
                Some(Uid::from_raw(uid)),
                Some(Gid::from_raw(gid)),
                AtFlags::SYMLINK_NOFOLLOW,
            )
            .map_err(|e| Error::io("chown", &dpath, e.into()))?;
            rustix::fs::chmodat(dst_fd, &name, Mode::from_raw_mode(md.mode() & 0o7777), AtFlags::empty())
                .map_err(|e| Error::io("chmod", &dpath, e.into()))?;
            ctx.files += 1;
        } else {
            // Device nodes and sockets.
            ctx.skipped += 1;
        }
    }
    Ok(())
}

/// Runs `build` on a fresh subvolume `dst`; on error deletes it; on success
/// makes it read-only.
fn with_new_subvolume(dst: &Path, build: impl FnOnce(&OwnedFd) -> Result<()>) -> Result<()> {
    create_subvolume(dst)?;
    let res = (|| {
        let fd = open_root(dst)?;
        build(&fd)?;
        drop(fd);
        set_readonly(dst, true)
    })();
    if let Err(e) = res {
        if let Err(del) = delete_subvolume(dst) {
            tracing::warn!(path = %dst.display(), error = %del, "cleanup of failed image failed");
        }
        return Err(e);
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// import_dir

/// Imports host directory `src` as a new read-only image subvolume `dst`,
/// shifting ownership by `uid_base`.
pub fn import_dir(src: &Path, dst: &Path, uid_base: u32, progress: &dyn Fn(Progress)) -> Result<Vec<LowerLayer>> {
    let md = fs::metadata(src).map_err(|e| Error::io("stat", src, e))?;
    if !md.is_dir() {
        return Err(Error::io("import", src, io::Error::from_raw_os_error(libc::ENOTDIR)));
    }
    let mut ctx = Ctx::new(uid_base, progress, "scan");
    ctx.report(true);
    ctx.total = dir_size(src)?;
    ctx.phase("copy");
    with_new_subvolume(dst, |root| {
        copy_tree(&mut ctx, src, root, dst, Path::new(""), md.dev(), &|_, _| true, false)?;
        set_attrs(root, ctx.id(md.uid()), ctx.id(md.gid()), md.mode(), (md.mtime(), md.mtime_nsec()))
            .map_err(|e| Error::io("set attributes of", dst, e))
    })?;
    if ctx.skipped > 0 {
        tracing::info!(skipped = ctx.skipped, "skipped device nodes / sockets during import");
    }
    ctx.phase("done");
    Ok(single_layer(dst))
}

// ---------------------------------------------------------------------------
// import_tar

struct CountingReader<R> {
    inner: R,
    count: std::rc::Rc<std::cell::Cell<u64>>,
}

impl<R: Read> Read for CountingReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.count.set(self.count.get() + n as u64);
        Ok(n)
    }
}

/// Splits an archive path into safe components, refusing `..` and absolute
/// paths. Returns `None` for the archive root (`./`).
fn safe_components(path: &Path) -> Result<Option<(Vec<OsString>, OsString)>> {
    let mut comps = Vec::new();
    for c in path.components() {
        match c {
            Component::Normal(s) => comps.push(s.to_os_string()),
            Component::CurDir => {}
            Component::ParentDir => {
                return Err(Error::UnsafePath { path: path.to_path_buf(), reason: "contains `..`" });
            }
            Component::RootDir | Component::Prefix(_) => {
                return Err(Error::UnsafePath { path: path.to_path_buf(), reason: "is absolute" });
            }
        }
    }
    Ok(comps.pop().map(|last| (comps, last)))
}

/// Opens (creating with shifted-root ownership if `create`) the parent
/// directory chain `comps` under `root`, never following symlinks.
fn walk_parents(root: &OwnedFd, comps: &[OsString], create: bool, uid_base: u32, entry: &Path) -> Result<OwnedFd> {
    let mut cur = rustix::io::dup(root).map_err(|e| Error::io("dup", entry, e.into()))?;
    for c in comps {
        let next = match open_dir_at(&cur, c) {
            Ok(fd) => fd,
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) && create => {
                let fd = mkdir_open_at(&cur, c).map_err(|e| Error::io("mkdir", entry, e))?;
                let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default().as_secs() as i64;
                set_attrs(&fd, uid_base, uid_base, 0o755, (now, 0))
                    .map_err(|e| Error::io("set attributes of", entry, e))?;
                fd
            }
            Err(e) if matches!(e.raw_os_error(), Some(libc::ELOOP) | Some(libc::ENOTDIR)) => {
                return Err(Error::UnsafePath {
                    path: entry.to_path_buf(),
                    reason: "a parent component is a symlink or not a directory",
                });
            }
            Err(e) => return Err(Error::io("open", entry, e)),
        };
        cur = next;
    }
    Ok(cur)
}

struct DirAttrs {
    path: PathBuf,
    uid: u32,
    gid: u32,
    mode: u32,
    mtime: i64,
}

/// Imports a tarball (`.tar`, or gzip-compressed: detected by magic) as a new
/// read-only image subvolume `dst`, shifting ownership by `uid_base`.
pub fn import_tar(src: &Path, dst: &Path, uid_base: u32, progress: &dyn Fn(Progress)) -> Result<Vec<LowerLayer>> {
    let tar_err = |source| Error::Tar { path: src.to_path_buf(), source };
    let mut file = File::open(src).map_err(|e| Error::io("open", src, e))?;
    let total = file.metadata().map_err(|e| Error::io("stat", src, e))?.len();
    let mut magic = [0u8; 2];
    let gz = file.read_exact(&mut magic).is_ok() && magic == [0x1f, 0x8b];
    let file = File::open(src).map_err(|e| Error::io("open", src, e))?;
    let count = std::rc::Rc::new(std::cell::Cell::new(0u64));
    let counted = CountingReader { inner: io::BufReader::with_capacity(256 << 10, file), count: count.clone() };
    let reader: Box<dyn Read> = if gz { Box::new(flate2::read::GzDecoder::new(counted)) } else { Box::new(counted) };
    let mut archive = tar::Archive::new(reader);
    let mut ctx = Ctx::new(uid_base, progress, "extract");
    ctx.total = total;
    ctx.report(true);

    with_new_subvolume(dst, |root| {
        set_attrs(root, uid_base, uid_base, 0o755, (0, 0)).map_err(|e| Error::io("set attributes of", dst, e))?;
        let mut dirs: Vec<DirAttrs> = Vec::new();
        for entry in archive.entries().map_err(tar_err)? {
            let mut entry = entry.map_err(tar_err)?;
            let path = entry.path().map_err(tar_err)?.into_owned();
            let Some((parents, name)) = safe_components(&path)? else {
                continue;
            };
            let h = entry.header();
            let kind = h.entry_type();
            let mode = h.mode().map_err(tar_err)?;
            let uid = ctx.id(h.uid().map_err(tar_err)?.min(u64::from(u32::MAX)) as u32);
            let gid = ctx.id(h.gid().map_err(tar_err)?.min(u64::from(u32::MAX)) as u32);
            let mtime = h.mtime().map_err(tar_err)?.min(i64::MAX as u64) as i64;
            let dpath = dst.join(&path);
            let dir = walk_parents(root, &parents, true, uid_base, &path)?;
            use tar::EntryType as T;
            match kind {
                T::Directory => {
                    match rustix::fs::mkdirat(&dir, &name, Mode::from_raw_mode(0o700)) {
                        Ok(()) | Err(rustix::io::Errno::EXIST) => {}
                        Err(e) => return Err(Error::io("mkdir", &dpath, e.into())),
                    }
                    // Refuse an existing symlink at this name.
                    open_dir_at(&dir, &name).map_err(|_| Error::UnsafePath {
                        path: path.clone(),
                        reason: "directory entry is an existing symlink or file",
                    })?;
                    dirs.push(DirAttrs { path: path.clone(), uid, gid, mode, mtime });
                }
                T::Regular | T::Continuous => {
                    let mut out = create_file_at(&dir, &name).map_err(|e| Error::io("create", &dpath, e))?;
                    io::copy(&mut entry, &mut out).map_err(|e| Error::io("write", &dpath, e))?;
                    out.flush().map_err(|e| Error::io("write", &dpath, e))?;
                    let fd = OwnedFd::from(out);
                    set_attrs(&fd, uid, gid, mode, (mtime, 0))
                        .map_err(|e| Error::io("set attributes of", &dpath, e))?;
                    ctx.files += 1;
                }
                T::Symlink => {
                    let target = entry
                        .link_name()
                        .map_err(tar_err)?
                        .ok_or_else(|| tar_err(io::Error::other("symlink without target")))?
                        .into_owned();
                    symlink_at(&target, &dir, &name).map_err(|e| Error::io("symlink", &dpath, e))?;
                    set_link_attrs(&dir, &name, uid, gid, (mtime, 0))
                        .map_err(|e| Error::io("set attributes of", &dpath, e))?;
                    ctx.files += 1;
                }
                T::Link => {
                    let target = entry
                        .link_name()
                        .map_err(tar_err)?
                        .ok_or_else(|| tar_err(io::Error::other("hard link without target")))?
                        .into_owned();
                    let Some((tparents, tname)) = safe_components(&target)? else {
                        return Err(Error::UnsafePath { path: target, reason: "hard link to the archive root" });
                    };
                    let tdir = walk_parents(root, &tparents, false, uid_base, &target)?;
                    let _ = rustix::fs::unlinkat(&dir, &name, AtFlags::empty());
                    rustix::fs::linkat(&tdir, &tname, &dir, &name, AtFlags::empty())
                        .map_err(|e| Error::io("hard link", &dpath, e.into()))?;
                    ctx.files += 1;
                }
                T::Fifo => {
                    let _ = rustix::fs::unlinkat(&dir, &name, AtFlags::empty());
                    rustix::fs::mknodat(&dir, &name, FileType::Fifo, Mode::from_raw_mode(mode & 0o777), 0)
                        .map_err(|e| Error::io("mkfifo", &dpath, e.into()))?;
                    rustix::fs::chownat(
                        &dir,
                        &name,
                        Some(Uid::from_raw(uid)),
                        Some(Gid::from_raw(gid)),
                        AtFlags::SYMLINK_NOFOLLOW,
                    )
                    .map_err(|e| Error::io("chown", &dpath, e.into()))?;
                    ctx.files += 1;
                }
                T::Char | T::Block => ctx.skipped += 1,
                _ => {
                    tracing::debug!(path = %path.display(), kind = ?kind, "skipping tar entry type");
                    ctx.skipped += 1;
                }
            }
            ctx.done = count.get();
            ctx.report(false);
        }
        // Directory attributes last (writing children changes mtimes), deepest first.
        dirs.sort_by_key(|d| std::cmp::Reverse(d.path.components().count()));
        for d in dirs {
            let Some((parents, name)) = safe_components(&d.path)? else {
                continue;
            };
            let parent = walk_parents(root, &parents, false, uid_base, &d.path)?;
            let fd = open_dir_at(&parent, &name).map_err(|e| Error::io("open", dst.join(&d.path), e))?;
            set_attrs(&fd, d.uid, d.gid, d.mode, (d.mtime, 0))
                .map_err(|e| Error::io("set attributes of", dst.join(&d.path), e))?;
        }
        Ok(())
    })?;
    ctx.done = count.get();
    ctx.phase("done");
    Ok(single_layer(dst))
}

// ---------------------------------------------------------------------------
// Default image

/// The default image's account for programs that should not run as root:
/// E2B's templates' `user`, with its home `/home/user`.
pub const USER: &str = "user";
const USER_ID: u32 = 1000;

/// Paths under host `/etc` never copied into the default image (secrets,
/// host identity, and files written fresh).
const ETC_EXCLUDE: &[&str] = &[
    "shadow",
    "shadow-",
    "gshadow",
    "gshadow-",
    "passwd-",
    "group-",
    "subuid",
    "subuid-",
    "subgid",
    "subgid-",
    "sudoers",
    "sudoers.d",
    "ssl/private",
    "machine-id",
    "security/opasswd",
    // Written fresh:
    "passwd",
    "group",
    "hostname",
    "hosts",
    "resolv.conf",
];

fn etc_filter(rel: &Path, md: &fs::Metadata) -> bool {
    if md.file_type().is_socket() {
        return false;
    }
    if ETC_EXCLUDE.iter().any(|x| rel == Path::new(x)) {
        return false;
    }
    if rel.parent() == Some(Path::new("ssh")) && rel.file_name().is_some_and(|n| n.as_bytes().starts_with(b"ssh_host_"))
    {
        return false;
    }
    true
}

/// `name:...:id:...` lines of a passwd/group file with id < 1000 or the
/// given extra names (nobody / nogroup).
fn filter_id_file(content: &str, keep_names: &[&str]) -> String {
    let mut out = String::new();
    for line in content.lines() {
        let mut f = line.split(':');
        let (Some(name), Some(_), Some(id)) = (f.next(), f.next(), f.next()) else {
            continue;
        };
        let Ok(id) = id.parse::<u32>() else { continue };
        if id < 1000 || keep_names.contains(&name) {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

fn random_hex(bytes: usize) -> io::Result<String> {
    let mut buf = vec![0u8; bytes];
    File::open("/dev/urandom")?.read_exact(&mut buf)?;
    Ok(buf.iter().map(|b| format!("{b:02x}")).collect())
}

fn is_complete_image(dst: &Path, uid_base: u32) -> bool {
    is_subvolume(dst)
        && sandtree_sys::btrfs::is_readonly(dst).unwrap_or(false)
        && fs::symlink_metadata(dst).is_ok_and(|m| m.uid() == uid_base)
}

/// Builds the default image at `dst` (no download): a skeleton root whose
/// `/usr` is the host's (second layer), a filtered copy of host `/etc`, fresh
/// identity files, and host `/var/lib/dpkg`. Idempotent: an existing complete
/// image built for the same `uid_base` is returned as is; an interrupted or
/// differently shifted one is rebuilt.
pub fn build_default_image(dst: &Path, uid_base: u32, progress: &dyn Fn(Progress)) -> Result<Vec<LowerLayer>> {
    if is_complete_image(dst, uid_base) {
        (progress)(Progress { phase: "done", done_bytes: 0, total_bytes: 0, files: 0 });
        return Ok(default_image_layers(dst));
    }
    if fs::symlink_metadata(dst).is_ok() {
        tracing::info!(path = %dst.display(), "rebuilding incomplete default image");
        delete_subvolume(dst)?;
    }
    let mut ctx = Ctx::new(uid_base, progress, "copy");
    ctx.report(true);
    let root_id = ctx.id(0);
    with_new_subvolume(dst, |root| {
        build_default_into(&mut ctx, dst, root)?;
        set_attrs(root, root_id, root_id, 0o755, now_ts()).map_err(|e| Error::io("set attributes of", dst, e))
    })?;
    ctx.phase("done");
    Ok(default_image_layers(dst))
}

fn now_ts() -> (i64, i64) {
    let d = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
    (d.as_secs() as i64, i64::from(d.subsec_nanos()))
}

fn build_default_into(ctx: &mut Ctx<'_>, dst: &Path, root: &OwnedFd) -> Result<()> {
    let r = ctx.id(0);
    let now = now_ts();
    let mkdir = |parent: &OwnedFd, rel: &str, mode: u32| -> Result<OwnedFd> {
        let name = Path::new(rel).file_name().unwrap_or(OsStr::new(rel));
        let fd = mkdir_open_at(parent, name).map_err(|e| Error::io("mkdir", dst.join(rel), e))?;
        set_attrs(&fd, r, r, mode, now).map_err(|e| Error::io("set attributes of", dst.join(rel), e))?;
        Ok(fd)
    };
    for (d, mode) in [
        ("dev", 0o755),
        ("proc", 0o555),
        ("sys", 0o555),
        ("tmp", 0o1777),
        ("run", 0o755),
        ("opt", 0o755),
        ("mnt", 0o755),
        ("srv", 0o755),
        ("usr", 0o755),
    ] {
        mkdir(root, d, mode)?;
    }
    let home = mkdir(root, "home", 0o755)?;
    let var = mkdir(root, "var", 0o755)?;
    for (d, mode) in [("tmp", 0o1777), ("log", 0o755), ("cache", 0o755)] {
        mkdir(&var, d, mode)?;
    }
    let var_lib = mkdir(&var, "lib", 0o755)?;

    // Host top-level symlinks into usr (merged /usr: bin -> usr/bin, ...).
    if let Ok(rd) = fs::read_dir("/") {
        for entry in rd.flatten() {
            let Ok(target) = fs::read_link(entry.path()) else {
                continue;
            };
            let t = target.as_os_str().as_bytes();
            if t.starts_with(b"usr/") || t.starts_with(b"/usr/") {
                let name = entry.file_name();
                symlink_at(&target, root, &name).map_err(|e| Error::io("symlink", dst.join(&name), e))?;
                set_link_attrs(root, &name, r, r, now)
                    .map_err(|e| Error::io("set attributes of", dst.join(&name), e))?;
            }
        }
    }

    // /etc: filtered copy.
    let host_etc = Path::new("/etc");
    let etc_md = fs::metadata(host_etc).map_err(|e| Error::io("stat", host_etc, e))?;
    let etc = mkdir(root, "etc", 0o755)?;
    let etc_path = dst.join("etc");
    copy_tree(ctx, host_etc, &etc, &etc_path, Path::new(""), etc_md.dev(), &etc_filter, true)?;

    // Fresh identity files.
    let passwd_src = fs::read_to_string("/etc/passwd").unwrap_or_default();
    let mut passwd = filter_id_file(&passwd_src, &["nobody"]);
    if !passwd.starts_with("root:") && !passwd.contains("\nroot:") {
        passwd.insert_str(0, "root:x:0:0:root:/root:/bin/bash\n");
    }
    let group_src = fs::read_to_string("/etc/group").unwrap_or_default();
    let mut group = filter_id_file(&group_src, &["nogroup"]);
    if !group.starts_with("root:") && !group.contains("\nroot:") {
        group.insert_str(0, "root:x:0:\n");
    }
    // The account E2B's templates run as (`user`, 1000; ids of 1000 and
    // above are not copied from the host).
    passwd.push_str(&format!("{USER}:x:{USER_ID}:{USER_ID}:{USER}:/home/{USER}:/bin/bash\n"));
    group.push_str(&format!("{USER}:x:{USER_ID}:\n"));
    let days = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default().as_secs() / 86400;
    let shadow: String = passwd
        .lines()
        .filter_map(|l| l.split(':').next())
        .map(|name| format!("{name}:*:{days}:0:99999:7:::\n"))
        .collect();
    let shadow_gid = group
        .lines()
        .find(|l| l.starts_with("shadow:"))
        .and_then(|l| l.split(':').nth(2))
        .and_then(|g| g.parse().ok())
        .unwrap_or(0);
    let machine_id = random_hex(16).map_err(|e| Error::io("read", "/dev/urandom", e))? + "\n";
    let files: [(&str, String, u32, u32); 7] = [
        ("hostname", "sandbox\n".into(), 0o644, 0),
        ("hosts", "127.0.0.1\tlocalhost\n::1\tlocalhost\n127.0.1.1\tsandbox\n".into(), 0o644, 0),
        // The sandbox's DNS server (its router's forwarder; see sandtree-net).
        ("resolv.conf", "nameserver 10.0.2.2\n".into(), 0o644, 0),
        ("passwd", passwd, 0o644, 0),
        ("group", group, 0o644, 0),
        ("shadow", shadow, 0o640, shadow_gid),
        ("machine-id", machine_id, 0o444, 0),
    ];
    for (name, content, mode, gid) in files {
        let p = etc_path.join(name);
        let mut f = create_file_at(&etc, OsStr::new(name)).map_err(|e| Error::io("create", &p, e))?;
        f.write_all(content.as_bytes()).map_err(|e| Error::io("write", &p, e))?;
        set_attrs(&OwnedFd::from(f), r, ctx.id(gid), mode, now).map_err(|e| Error::io("set attributes of", &p, e))?;
    }

    // /root with /etc/skel.
    let root_home = mkdir(root, "root", 0o700)?;
    let skel = Path::new("/etc/skel");
    if let Ok(md) = fs::metadata(skel) {
        copy_tree(ctx, skel, &root_home, &dst.join("root"), Path::new(""), md.dev(), &|_, _| true, true)?;
        // skel files are root-owned on the host: keep them root (shifted).
    }

    // /home/user, with the regular files of /etc/skel, the user's.
    let u = ctx.id(USER_ID);
    let user_home =
        mkdir_open_at(&home, OsStr::new(USER)).map_err(|e| Error::io("mkdir", dst.join("home").join(USER), e))?;
    set_attrs(&user_home, u, u, 0o750, now)
        .map_err(|e| Error::io("set attributes of", dst.join("home").join(USER), e))?;
    for entry in fs::read_dir(skel).into_iter().flatten().flatten() {
        let Ok(md) = fs::symlink_metadata(entry.path()) else { continue };
        if !md.is_file() {
            continue;
        }
        let at = dst.join("home").join(USER).join(entry.file_name());
        let content = fs::read(entry.path()).map_err(|e| Error::io("read", entry.path(), e))?;
        let mut f = create_file_at(&user_home, &entry.file_name()).map_err(|e| Error::io("create", &at, e))?;
        f.write_all(&content).map_err(|e| Error::io("write", &at, e))?;
        set_attrs(&OwnedFd::from(f), u, u, md.mode() & 0o7777, now)
            .map_err(|e| Error::io("set attributes of", &at, e))?;
    }

    // /var/lib/dpkg.
    let dpkg = Path::new("/var/lib/dpkg");
    if let Ok(md) = fs::metadata(dpkg) {
        let dpkg_fd = mkdir(&var_lib, "dpkg", md.mode())?;
        copy_tree(ctx, dpkg, &dpkg_fd, &dst.join("var/lib/dpkg"), Path::new(""), md.dev(), &|_, _| true, true)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::TestVolume;
    use std::os::unix::fs::{PermissionsExt, symlink};
    use std::time::Instant;

    const BASE: u32 = 100_000;

    fn no_progress(_: Progress) {}

    #[test]
    fn ids_are_shifted_and_large_ids_clamped_to_nobody() {
        assert_eq!(shift_id(BASE, 0), BASE);
        assert_eq!(shift_id(BASE, 1000), BASE + 1000);
        assert_eq!(shift_id(BASE, 65535), BASE + 65535);
        assert_eq!(shift_id(BASE, 65536), BASE + 65534);
        assert_eq!(shift_id(BASE, u32::MAX), BASE + 65534);
    }

    #[test]
    fn passwd_filter_keeps_system_users_and_nobody() {
        let src = "root:x:0:0::/root:/bin/bash\nalice:x:1000:1000::/home/alice:/bin/sh\n\
                   nobody:x:65534:65534::/nonexistent:/usr/sbin/nologin\n_apt:x:42:65534::/:/x\n";
        let out = filter_id_file(src, &["nobody"]);
        assert!(out.contains("root:") && out.contains("nobody:") && out.contains("_apt:"));
        assert!(!out.contains("alice"));
    }

    #[test]
    fn tar_paths_with_dotdot_or_absolute_are_unsafe() {
        assert!(matches!(safe_components(Path::new("../evil")), Err(Error::UnsafePath { .. })));
        assert!(matches!(safe_components(Path::new("/etc/passwd")), Err(Error::UnsafePath { .. })));
        assert!(safe_components(Path::new("./")).unwrap().is_none());
        let (p, n) = safe_components(Path::new("./a/b/c")).unwrap().unwrap();
        assert_eq!(p, [OsString::from("a"), OsString::from("b")]);
        assert_eq!(n, "c");
    }

    #[test]
    fn import_dir_shifts_ownership_and_keeps_links_modes_mtimes() {
        let Some(tv) = TestVolume::new(1 << 30) else {
            return;
        };
        let src = tempfile::tempdir().unwrap();
        let s = src.path();
        fs::create_dir(s.join("sub")).unwrap();
        fs::write(s.join("sub/file"), b"data").unwrap();
        std::os::unix::fs::chown(s.join("sub/file"), Some(1000), Some(1001)).unwrap();
        fs::write(s.join("big-id"), b"x").unwrap();
        std::os::unix::fs::chown(s.join("big-id"), Some(70000), Some(70000)).unwrap();
        fs::write(s.join("suid"), b"#!/bin/sh\n").unwrap();
        fs::set_permissions(s.join("suid"), fs::Permissions::from_mode(0o4755)).unwrap();
        fs::hard_link(s.join("sub/file"), s.join("hard")).unwrap();
        symlink("sub/file", s.join("link")).unwrap();
        symlink("/etc/shadow", s.join("abs-link")).unwrap();
        let old = SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000_000);
        File::options().write(true).open(s.join("sub/file")).unwrap().set_modified(old).unwrap();
        std::os::unix::net::UnixListener::bind(s.join("sock")).unwrap();

        let dst = tv.vol().images_dir().join("imp");
        let reports = std::cell::RefCell::new(Vec::new());
        let layers = import_dir(s, &dst, BASE, &|p| reports.borrow_mut().push(p)).unwrap();
        assert_eq!(layers, single_layer(&dst));
        let md = fs::metadata(dst.join("sub/file")).unwrap();
        assert_eq!((md.uid(), md.gid()), (BASE + 1000, BASE + 1001));
        assert_eq!(md.modified().unwrap(), old);
        let md = fs::metadata(dst.join("big-id")).unwrap();
        assert_eq!((md.uid(), md.gid()), (BASE + 65534, BASE + 65534));
        let md = fs::metadata(dst.join("suid")).unwrap();
        assert_eq!(md.mode() & 0o7777, 0o4755);
        assert_eq!(md.uid(), BASE);
        assert_eq!(fs::metadata(dst.join("hard")).unwrap().ino(), fs::metadata(dst.join("sub/file")).unwrap().ino());
        assert_eq!(fs::read_link(dst.join("link")).unwrap(), Path::new("sub/file"));
        assert_eq!(fs::symlink_metadata(dst.join("link")).unwrap().uid(), BASE);
        assert_eq!(fs::read_link(dst.join("abs-link")).unwrap(), Path::new("/etc/shadow"));
        assert!(!dst.join("sock").exists(), "sockets are skipped");
        assert_eq!(fs::metadata(&dst).unwrap().uid(), BASE);
        assert!(subvolume_ro(&dst));
        let r = reports.borrow();
        assert_eq!(r.last().unwrap().phase, "done");
        assert!(r.last().unwrap().done_bytes >= 4 + 1 + 10);
        // dst exists now: a second import fails and leaves it intact.
        assert!(import_dir(s, &dst, BASE, &no_progress).is_err());
        assert!(dst.join("sub/file").exists());
    }

    fn subvolume_ro(p: &Path) -> bool {
        crate::subvol::subvolume_info(p).unwrap().readonly
    }

    fn tar_header(kind: tar::EntryType, size: u64, mode: u32, uid: u64) -> tar::Header {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(kind);
        h.set_size(size);
        h.set_mode(mode);
        h.set_uid(uid);
        h.set_gid(uid);
        h.set_mtime(1_234_567_890);
        h
    }

    fn build_tar(path: &Path, gzip: bool, evil: Option<&str>) {
        let f = File::create(path).unwrap();
        let w: Box<dyn Write> =
            if gzip { Box::new(flate2::write::GzEncoder::new(f, flate2::Compression::fast())) } else { Box::new(f) };
        let mut b = tar::Builder::new(w);
        let mut h = tar_header(tar::EntryType::Directory, 0, 0o755, 0);
        b.append_data(&mut h, "etc/", io::empty()).unwrap();
        let mut h = tar_header(tar::EntryType::Regular, 5, 0o644, 0);
        b.append_data(&mut h, "etc/hello", &b"hello"[..]).unwrap();
        let mut h = tar_header(tar::EntryType::Regular, 3, 0o4711, 1000);
        b.append_data(&mut h, "usr/bin/tool", &b"bin"[..]).unwrap();
        let mut h = tar_header(tar::EntryType::Link, 0, 0o644, 0);
        b.append_link(&mut h, "etc/hello2", "etc/hello").unwrap();
        let mut h = tar_header(tar::EntryType::Symlink, 0, 0o777, 0);
        b.append_link(&mut h, "escape", "/").unwrap();
        if let Some(evil) = evil {
            let mut h = tar_header(tar::EntryType::Regular, 4, 0o644, 0);
            // set_path refuses `..`: write the raw name bytes.
            let name = &mut h.as_old_mut().name;
            name.fill(0);
            name[..evil.len()].copy_from_slice(evil.as_bytes());
            h.set_cksum();
            b.append(&h, &b"evil"[..]).unwrap();
        }
        b.into_inner().unwrap().flush().unwrap();
    }

    #[test]
    fn import_tar_plain_and_gzip_shift_ids_and_keep_links() {
        let Some(tv) = TestVolume::new(1 << 30) else {
            return;
        };
        let tmp = tempfile::tempdir().unwrap();
        for gz in [false, true] {
            let tarp = tmp.path().join(if gz { "a.tgz" } else { "a.tar" });
            build_tar(&tarp, gz, None);
            let dst = tv.vol().images_dir().join(if gz { "gz" } else { "plain" });
            import_tar(&tarp, &dst, BASE, &no_progress).unwrap();
            assert_eq!(fs::read(dst.join("etc/hello")).unwrap(), b"hello");
            let md = fs::metadata(dst.join("usr/bin/tool")).unwrap();
            assert_eq!(md.mode() & 0o7777, 0o4711);
            assert_eq!(md.uid(), BASE + 1000);
            assert_eq!(fs::metadata(dst.join("usr")).unwrap().uid(), BASE, "implicit parent");
            assert_eq!(
                fs::metadata(dst.join("etc/hello2")).unwrap().ino(),
                fs::metadata(dst.join("etc/hello")).unwrap().ino()
            );
            assert_eq!(fs::read_link(dst.join("escape")).unwrap(), Path::new("/"));
            let etc = fs::metadata(dst.join("etc")).unwrap();
            assert_eq!(etc.mtime(), 1_234_567_890);
            assert!(subvolume_ro(&dst));
        }
    }

    #[test]
    fn import_tar_refuses_escapes_and_cleans_up() {
        let Some(tv) = TestVolume::new(1 << 30) else {
            return;
        };
        let tmp = tempfile::tempdir().unwrap();
        for (i, evil) in ["../evil", "/abs-evil", "escape/tmp/evil"].iter().enumerate() {
            let tarp = tmp.path().join(format!("evil{i}.tar"));
            build_tar(&tarp, false, Some(evil));
            let dst = tv.vol().images_dir().join(format!("evil{i}"));
            match import_tar(&tarp, &dst, BASE, &no_progress) {
                Err(Error::UnsafePath { path, reason }) => {
                    eprintln!("{evil}: refused {path:?}: {reason}")
                }
                other => panic!("{evil}: expected UnsafePath, got {other:?}"),
            }
            assert!(!dst.exists(), "failed import is deleted");
            assert!(!tv.vol().images_dir().join("evil").exists());
            assert!(!Path::new("/tmp/evil").exists());
        }
    }

    #[test]
    fn default_image_is_fast_idempotent_and_has_no_host_secrets() {
        let Some(tv) = TestVolume::new(1 << 30) else {
            return;
        };
        let dst = tv.vol().images_dir().join(DEFAULT_IMAGE);
        let t = Instant::now();
        let layers = build_default_image(&dst, BASE, &no_progress).unwrap();
        eprintln!("default image build: {:?}", t.elapsed());
        let t = Instant::now();
        assert_eq!(build_default_image(&dst, BASE, &no_progress).unwrap(), layers);
        eprintln!("default image rebuild (idempotent): {:?}", t.elapsed());
        assert_eq!(layers, default_image_layers(&dst));
        let usr = layers.iter().find(|l| l.target == Path::new("/usr")).expect("/usr layer");
        let LowerSource::HostDir(host_usr) = &usr.source else { panic!("usr not HostDir") };
        assert!(host_usr.join("bin/python3").exists(), "python3 reachable via /usr layer");
        assert!(fs::read_dir(dst.join("usr")).unwrap().next().is_none(), "usr is empty");
        assert_eq!(fs::read_link(dst.join("bin")).unwrap(), Path::new("usr/bin"));

        let shadow = fs::read_to_string(dst.join("etc/shadow")).unwrap();
        assert!(shadow.starts_with("root:*:"), "{shadow}");
        if let Ok(host) = fs::read_to_string("/etc/shadow") {
            assert_ne!(shadow, host);
        }
        assert!(!dst.join("etc/gshadow").exists());
        assert!(!dst.join("etc/sudoers").exists());
        let ssh_keys = fs::read_dir(dst.join("etc/ssh"))
            .map(|rd| rd.flatten().filter(|e| e.file_name().to_string_lossy().starts_with("ssh_host_")).count())
            .unwrap_or(0);
        assert_eq!(ssh_keys, 0);
        assert_eq!(fs::read_to_string(dst.join("etc/hostname")).unwrap(), "sandbox\n");
        assert_eq!(fs::read_to_string(dst.join("etc/resolv.conf")).unwrap(), "nameserver 10.0.2.2\n");
        let mid = fs::read_to_string(dst.join("etc/machine-id")).unwrap();
        assert_eq!(mid.trim().len(), 32);
        assert_ne!(Some(mid), fs::read_to_string("/etc/machine-id").ok());
        let passwd = fs::read_to_string(dst.join("etc/passwd")).unwrap();
        assert!(passwd.starts_with("root:") || passwd.contains("\nroot:"));
        for line in passwd.lines() {
            let id: u32 = line.split(':').nth(2).unwrap().parse().unwrap();
            assert!(id < 1000 || line.starts_with("nobody:") || line.starts_with("user:"), "{line}");
        }
        // E2B's `user`, with its home, its group and its skel files.
        assert!(passwd.contains("\nuser:x:1000:1000:user:/home/user:/bin/bash\n"), "{passwd}");
        let group = fs::read_to_string(dst.join("etc/group")).unwrap();
        assert!(group.contains("\nuser:x:1000:\n"), "{group}");
        assert!(shadow.contains("\nuser:*:"), "{shadow}");
        let home_md = fs::metadata(dst.join("home/user")).unwrap();
        assert_eq!((home_md.uid(), home_md.gid(), home_md.mode() & 0o7777), (BASE + 1000, BASE + 1000, 0o750));
        if let Ok(md) = fs::metadata("/etc/skel/.bashrc") {
            let copied = fs::metadata(dst.join("home/user/.bashrc")).unwrap();
            assert_eq!((copied.uid(), copied.len()), (BASE + 1000, md.len()));
        }
        // Host /root content is not there; skel is.
        let root_md = fs::metadata(dst.join("root")).unwrap();
        assert_eq!(root_md.mode() & 0o7777, 0o700);
        assert_eq!(root_md.uid(), BASE);
        if let Ok(rd) = fs::read_dir("/root") {
            for e in rd.flatten() {
                let n = e.file_name();
                if !Path::new("/etc/skel").join(&n).exists() {
                    assert!(!dst.join("root").join(&n).exists(), "host /root/{n:?} leaked");
                }
            }
        }
        assert_eq!(fs::metadata(dst.join("tmp")).unwrap().mode() & 0o7777, 0o1777);
        assert_eq!(fs::metadata(dst.join("var/tmp")).unwrap().mode() & 0o7777, 0o1777);
        assert!(dst.join("var/lib/dpkg/status").exists());
        assert!(!dst.join("var/lib/sandtree").exists());
        assert!(fs::read_dir(dst.join("proc")).unwrap().next().is_none());
        assert_eq!(fs::metadata(dst.join("etc/passwd")).unwrap().uid(), BASE);
        assert!(subvolume_ro(&dst));
        remove_image(&dst).unwrap();
        assert!(!dst.exists());
        remove_image(&dst).unwrap();
    }
}
