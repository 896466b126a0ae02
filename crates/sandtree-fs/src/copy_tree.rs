//! Copying a directory tree from one file system to another with what a
//! program can see of it: contents (holes stay holes), mode, owner, access
//! and modification times, extended attributes, symbolic links, FIFOs,
//! device nodes and hard links (two names of one inode stay one inode).
//!
//! Used for the sandbox's `/dev/shm` (a tmpfs that a rollback replaces):
//! a checkpoint copies it into its layer's subvolume and a rollback copies
//! it back into the fresh tmpfs (`sandtree-runtime`'s `dev_shm.rs`).
//!
//! Both sides are walked through directory descriptors, every name opened
//! with `O_NOFOLLOW`: a symbolic link is copied as a link, never followed,
//! so a tree that sandboxed code made cannot lead the copy (which runs as
//! the host's root) anywhere else. Files are read with `O_NOATIME`, so the
//! copy changes nothing that the tree's users see, not even access times.
//!
//! Not copied: sockets (a socket file is a name of a bound socket, which
//! the process that holds it binds again; one that no process holds
//! cannot be connected to) and the change time (`ctime`), which no call
//! can set.

use std::collections::HashMap;
use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};

use rustix::fs::{
    AtFlags, Dir, FileType, Gid, Mode, OFlags, SeekFrom, Stat, Timespec, Timestamps, Uid, XattrFlags, chownat, fchmod,
    fchown, fgetxattr, flistxattr, fstat, ftruncate, futimens, linkat, mkdirat, mknodat, openat, readlinkat, seek,
    statat, symlinkat, utimensat,
};

use crate::{Error, Result};

/// What a copy did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Copied {
    /// Names made (files, directories, links, nodes; the root not counted).
    pub entries: u64,
    /// Bytes of file data copied (holes not counted).
    pub bytes: u64,
    /// Socket files left out.
    pub sockets: u64,
}

/// Opens a directory to copy from or into, by a path relative to `root`
/// that must not go through a symbolic link or leave `root`.
pub fn open_dir_beneath(root: BorrowedFd<'_>, path: &Path) -> Result<OwnedFd> {
    use rustix::fs::ResolveFlags;
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NOATIME;
    let resolve = ResolveFlags::IN_ROOT | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS;
    rustix::fs::openat2(root, path, flags, Mode::empty(), resolve).map_err(|e| Error::io("open", path, e.into()))
}

/// Copies what is in directory `from` into directory `to`, which must be
/// empty, and gives `to` the mode, owner, times and extended attributes
/// of `from`. `where_to` names `to` in errors.
pub fn copy_tree(from: BorrowedFd<'_>, to: BorrowedFd<'_>, where_to: &Path) -> Result<Copied> {
    let mut copy = Copy { copied: Copied::default(), links: HashMap::new(), where_to };
    copy.dir_contents(from, to, Path::new(""))?;
    let st = fstat(from).map_err(|e| copy.err("stat", Path::new(""), e))?;
    copy.attributes(from, to, &st, Path::new(""))?;
    Ok(copy.copied)
}

/// Whether directory `dir` has no entry.
pub fn is_empty_dir(dir: BorrowedFd<'_>) -> io::Result<bool> {
    let entries = Dir::new(open_nofollow(dir, c".", OFlags::DIRECTORY)?)?;
    for e in entries {
        let name = e?.file_name().to_bytes().to_vec();
        if name != b"." && name != b".." {
            return Ok(false);
        }
    }
    Ok(true)
}

struct Copy<'a> {
    copied: Copied,
    /// Inodes with more than one name: (device, inode) → the path copied
    /// first, relative to the root.
    links: HashMap<(u64, u64), PathBuf>,
    where_to: &'a Path,
}

impl Copy<'_> {
    fn err(&self, op: &'static str, rel: &Path, e: rustix::io::Errno) -> Error {
        Error::io(op, self.where_to.join(rel), e.into())
    }

    fn dir_contents(&mut self, from: BorrowedFd<'_>, to: BorrowedFd<'_>, rel: &Path) -> Result<()> {
        // (Its own open file: a dup would share, and move, the offset.)
        let own = open_nofollow(from, c".", OFlags::DIRECTORY).map_err(|e| self.err("open", rel, e))?;
        let entries = Dir::new(own).map_err(|e| self.err("read directory", rel, e))?;
        let mut names: Vec<CString> = Vec::new();
        for e in entries {
            let e = e.map_err(|e| self.err("read directory", rel, e))?;
            let name = e.file_name();
            if name != c"." && name != c".." {
                names.push(name.to_owned());
            }
        }
        for name in names {
            self.entry(from, to, rel, &name)?;
        }
        Ok(())
    }

    fn entry(&mut self, from: BorrowedFd<'_>, to: BorrowedFd<'_>, rel_dir: &Path, name: &CStr) -> Result<()> {
        use std::os::unix::ffi::OsStrExt;
        let rel = rel_dir.join(std::ffi::OsStr::from_bytes(name.to_bytes()));
        let st = statat(from, name, AtFlags::SYMLINK_NOFOLLOW).map_err(|e| self.err("stat", &rel, e))?;
        let kind = FileType::from_raw_mode(st.st_mode);
        // A second name of an inode already copied: a link to that copy.
        if kind != FileType::Directory && st.st_nlink > 1 {
            let key = (st.st_dev, st.st_ino);
            if let Some(first) = self.links.get(&key) {
                // (Relative to the destination root, whose fd is not at
                // hand here: `to` is a directory below it.)
                let depth = rel_dir.components().count();
                let up: PathBuf = std::iter::repeat_n("..", depth).collect();
                linkat(to, up.join(first), to, name, AtFlags::empty()).map_err(|e| self.err("link", &rel, e))?;
                self.copied.entries += 1;
                return Ok(());
            }
            self.links.insert(key, rel.clone());
        }
        match kind {
            FileType::Directory => {
                mkdirat(to, name, Mode::from_raw_mode(0o700)).map_err(|e| self.err("mkdir", &rel, e))?;
                let src = open_nofollow(from, name, OFlags::DIRECTORY).map_err(|e| self.err("open", &rel, e))?;
                let dst = open_nofollow(to, name, OFlags::DIRECTORY).map_err(|e| self.err("open", &rel, e))?;
                self.dir_contents(src.as_fd(), dst.as_fd(), &rel)?;
                self.attributes(src.as_fd(), dst.as_fd(), &st, &rel)?;
            }
            FileType::RegularFile => {
                let src = open_nofollow(from, name, OFlags::empty()).map_err(|e| self.err("open", &rel, e))?;
                let dst = openat(
                    to,
                    name,
                    OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                    Mode::from_raw_mode(0o600),
                )
                .map_err(|e| self.err("create", &rel, e))?;
                self.copied.bytes += self.data(&src, &dst, st.st_size as u64, &rel)?;
                self.attributes(src.as_fd(), dst.as_fd(), &st, &rel)?;
            }
            FileType::Symlink => {
                let target = readlinkat(from, name, Vec::new()).map_err(|e| self.err("readlink", &rel, e))?;
                symlinkat(target.as_c_str(), to, name).map_err(|e| self.err("symlink", &rel, e))?;
                let flags = AtFlags::SYMLINK_NOFOLLOW;
                chownat(to, name, Some(uid(&st)), Some(gid(&st)), flags).map_err(|e| self.err("chown", &rel, e))?;
                utimensat(to, name, &times(&st), flags).map_err(|e| self.err("set times of", &rel, e))?;
            }
            FileType::Socket => {
                self.copied.sockets += 1;
                return Ok(());
            }
            FileType::Fifo | FileType::CharacterDevice | FileType::BlockDevice => {
                let mode = Mode::from_raw_mode(st.st_mode & 0o7777);
                mknodat(to, name, kind, mode, st.st_rdev).map_err(|e| self.err("mknod", &rel, e))?;
                // (A node opened only to set its attributes: `O_PATH`
                // is enough for none of them, and opening a FIFO would
                // block: by name instead.)
                let flags = AtFlags::SYMLINK_NOFOLLOW;
                chownat(to, name, Some(uid(&st)), Some(gid(&st)), flags).map_err(|e| self.err("chown", &rel, e))?;
                rustix::fs::chmodat(to, name, mode, AtFlags::empty()).map_err(|e| self.err("chmod", &rel, e))?;
                utimensat(to, name, &times(&st), flags).map_err(|e| self.err("set times of", &rel, e))?;
            }
            _ => return Err(Error::io("copy", self.where_to.join(&rel), io::Error::other("unknown file type"))),
        }
        self.copied.entries += 1;
        Ok(())
    }

    /// Copies the data segments of `src` (holes stay holes); returns the
    /// bytes copied.
    fn data(&self, src: &OwnedFd, dst: &OwnedFd, size: u64, rel: &Path) -> Result<u64> {
        let mut buf = vec![0u8; 256 << 10];
        let mut at = 0u64;
        let mut copied = 0u64;
        while at < size {
            let start = match seek(src, SeekFrom::Data(at)) {
                Ok(s) => s,
                Err(rustix::io::Errno::NXIO) => break,
                Err(e) => return Err(self.err("seek data", rel, e)),
            };
            let end = seek(src, SeekFrom::Hole(start)).map_err(|e| self.err("seek hole", rel, e))?.min(size);
            let mut off = start;
            while off < end {
                let want = ((end - off) as usize).min(buf.len());
                let n = rustix::io::pread(src, &mut buf[..want], off).map_err(|e| self.err("read", rel, e))?;
                if n == 0 {
                    break;
                }
                let mut written = 0;
                while written < n {
                    written += rustix::io::pwrite(dst, &buf[written..n], off + written as u64)
                        .map_err(|e| self.err("write", rel, e))?;
                }
                off += n as u64;
                copied += n as u64;
            }
            at = end;
        }
        ftruncate(dst, size).map_err(|e| self.err("truncate", rel, e))?;
        Ok(copied)
    }

    /// Owner, mode (after the owner: a `chown` clears set-id bits),
    /// extended attributes, then times (last: every other step changes
    /// them).
    fn attributes(&self, src: BorrowedFd<'_>, dst: BorrowedFd<'_>, st: &Stat, rel: &Path) -> Result<()> {
        fchown(dst, Some(uid(st)), Some(gid(st))).map_err(|e| self.err("chown", rel, e))?;
        fchmod(dst, Mode::from_raw_mode(st.st_mode & 0o7777)).map_err(|e| self.err("chmod", rel, e))?;
        let mut names = vec![0u8; 64 << 10];
        let len = flistxattr(src, &mut names[..]).map_err(|e| self.err("list attributes of", rel, e))?;
        let mut value = vec![0u8; 64 << 10];
        for name in names[..len].split(|b| *b == 0).filter(|n| !n.is_empty()) {
            let name = CString::new(name).expect("split at NULs");
            let n =
                fgetxattr(src, name.as_c_str(), &mut value[..]).map_err(|e| self.err("read attribute of", rel, e))?;
            rustix::fs::fsetxattr(dst, name.as_c_str(), &value[..n], XattrFlags::empty())
                .map_err(|e| self.err("set attribute of", rel, e))?;
        }
        futimens(dst, &times(st)).map_err(|e| self.err("set times of", rel, e))
    }
}

fn open_nofollow(dir: BorrowedFd<'_>, name: &CStr, extra: OFlags) -> rustix::io::Result<OwnedFd> {
    openat(dir, name, OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NOATIME | extra, Mode::empty())
}

fn uid(st: &Stat) -> Uid {
    Uid::from_raw(st.st_uid)
}

fn gid(st: &Stat) -> Gid {
    Gid::from_raw(st.st_gid)
}

fn times(st: &Stat) -> Timestamps {
    Timestamps {
        last_access: Timespec { tv_sec: st.st_atime as _, tv_nsec: st.st_atime_nsec as _ },
        last_modification: Timespec { tv_sec: st.st_mtime as _, tv_nsec: st.st_mtime_nsec as _ },
    }
}

#[cfg(test)]
mod tests;
