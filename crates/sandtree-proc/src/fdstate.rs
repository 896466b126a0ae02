//! Descriptors of other processes, reached from the daemon: a duplicate
//! of one (`pidfd_getfd`, the same open file), a new open of one through
//! `/proc/<pid>/fd/<n>`, a process's root to resolve paths in; and which
//! shared objects a checkpoint captured already (`Seen`). What each kind
//! of object holds, and how it is put back, is its module's in `kinds/`.

use std::io;
use std::os::fd::OwnedFd;

use rustix::fs::{Mode, OFlags, SeekFrom};
use rustix::io::Errno;

use crate::HostPid;

/// A duplicate of descriptor `fd` of process `host` (`pidfd_getfd`): the
/// same open file, not a new open of it.
pub(crate) fn dup_from(host: HostPid, fd: i32) -> io::Result<OwnedFd> {
    Ok(rustix::process::pidfd_getfd(&pidfd_of(host)?, fd, rustix::process::PidfdGetfdFlags::empty())?)
}

/// A pidfd of process `host`.
pub(crate) fn pidfd_of(host: HostPid) -> io::Result<OwnedFd> {
    let pid = rustix::process::Pid::from_raw(host.raw()).ok_or_else(|| io::Error::other("bad pid"))?;
    Ok(rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty())?)
}

pub(crate) fn open_proc_fd(host: HostPid, fd: i32, flags: OFlags) -> io::Result<OwnedFd> {
    Ok(rustix::fs::open(format!("/proc/{host}/fd/{fd}"), flags | OFlags::NONBLOCK | OFlags::CLOEXEC, Mode::empty())?)
}

/// The data segments (offset, length) of `f`, `size` bytes long.
fn data_segments(f: &OwnedFd, size: u64) -> io::Result<Vec<(u64, u64)>> {
    let mut out = Vec::new();
    let mut at = 0u64;
    while at < size {
        let start = match rustix::fs::seek(f, rustix::fs::SeekFrom::Data(at)) {
            Ok(s) => s,
            // (No data from here on.)
            Err(rustix::io::Errno::NXIO) => break,
            Err(e) => return Err(e.into()),
        };
        let end = rustix::fs::seek(f, rustix::fs::SeekFrom::Hole(start))?.min(size);
        if end <= start {
            break;
        }
        out.push((start, end - start));
        at = end;
    }
    Ok(out)
}

/// `len` bytes at offset `start` of `from` written at the same offset of
/// `to` (`sendfile`: in the kernel, page by page).
pub fn copy_range(from: &OwnedFd, to: &OwnedFd, start: u64, len: u64) -> io::Result<()> {
    match copy_some(from, to, start, len)? {
        n if n < len => Err(io::Error::other(format!("the object ends at {}, before {}", start + n, start + len))),
        _ => Ok(()),
    }
}

/// A file's contents saved sparsely: its data runs copied at the same
/// offsets into a memfd of the daemon (the rest holes, which cost
/// nothing), and its size. Deleted files, memfds and shared memory objects
/// are saved so at a checkpoint, whatever their size.
#[derive(Debug)]
pub struct SparseCopy {
    /// The file's size (bytes).
    pub size: u64,
    /// Its data runs (offset, length), at the same offsets in the copy.
    pub runs: Vec<(u64, u64)>,
    copy: OwnedFd,
}

impl SparseCopy {
    /// A copy of the first `size` bytes of `file` (its data runs only:
    /// `SEEK_DATA`/`SEEK_HOLE`; a file system without them gives one run).
    pub fn save(file: &OwnedFd, size: u64) -> io::Result<SparseCopy> {
        let copy = rustix::fs::memfd_create("sandtree-copy", rustix::fs::MemfdFlags::CLOEXEC)?;
        rustix::fs::ftruncate(&copy, size)?;
        let runs = copy_data_runs(file, &copy, size)?;
        Ok(SparseCopy { size, runs, copy })
    }

    /// A copy of a file of `size` bytes whose data runs are `runs`
    /// (offset, bytes): what an image keeps of one (`durable`).
    pub fn from_runs(size: u64, runs: &[(u64, Vec<u8>)]) -> io::Result<SparseCopy> {
        let copy = rustix::fs::memfd_create("sandtree-copy", rustix::fs::MemfdFlags::CLOEXEC)?;
        rustix::fs::ftruncate(&copy, size)?;
        let file = std::fs::File::from(copy);
        for (offset, bytes) in runs {
            std::os::unix::fs::FileExt::write_all_at(&file, bytes, *offset)?;
        }
        let runs = runs.iter().map(|(o, b)| (*o, b.len() as u64)).collect();
        Ok(SparseCopy { size, runs, copy: file.into() })
    }

    /// Bytes saved.
    pub fn bytes(&self) -> u64 {
        self.runs.iter().map(|r| r.1).sum()
    }

    /// Another handle on the same copy.
    pub fn duplicate(&self) -> io::Result<SparseCopy> {
        Ok(SparseCopy { size: self.size, runs: self.runs.clone(), copy: self.copy.try_clone()? })
    }

    /// Read `buf.len()` saved bytes at `offset` (of the file).
    pub fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let mut done = 0usize;
        while done < buf.len() {
            match rustix::io::pread(&self.copy, &mut buf[done..], offset + done as u64) {
                Ok(0) => return Err(io::Error::from(io::ErrorKind::UnexpectedEof)),
                Ok(n) => done += n,
                Err(Errno::INTR) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    /// Write the saved runs at their offsets into `to` (the caller makes
    /// its size and holes).
    pub fn write_into(&self, to: &OwnedFd) -> io::Result<()> {
        for &(start, len) in &self.runs {
            copy_range(&self.copy, to, start, len)?;
        }
        Ok(())
    }
}

/// The data runs of the first `size` bytes of `from` written at the same
/// offsets of `to` (sized and empty: its other bytes stay holes); the runs
/// copied (a file cut short since its size was read: what is there).
pub fn copy_data_runs(from: &OwnedFd, to: &OwnedFd, size: u64) -> io::Result<Vec<(u64, u64)>> {
    let mut runs = data_segments(from, size)?;
    for run in &mut runs {
        run.1 = copy_some(from, to, run.0, run.1)?;
    }
    runs.retain(|r| r.1 > 0);
    Ok(runs)
}

/// Up to `len` bytes at offset `start` of `from` written at the same offset
/// of `to`; how many (fewer where `from` ends).
fn copy_some(from: &OwnedFd, to: &OwnedFd, start: u64, len: u64) -> io::Result<u64> {
    rustix::fs::seek(to, SeekFrom::Start(start))?;
    let (mut offset, end) = (start, start + len);
    while offset < end {
        let left = (end - offset) as usize;
        match rustix::fs::sendfile(to, from, Some(&mut offset), left) {
            Ok(0) => break,
            Ok(_) | Err(Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(offset - start)
}

/// The root of process `host`'s tree (`/proc/<host>/root`), to open
/// paths of the sandbox in with [`open_in`].
pub fn tree_root(host: HostPid) -> io::Result<OwnedFd> {
    Ok(rustix::fs::open(
        format!("/proc/{host}/root"),
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )?)
}

/// Open sandbox path `path` under `root` ([`tree_root`]) with `flags`
/// (close-on-exec added). It resolves inside that tree only
/// (`RESOLVE_IN_ROOT`, no magic links): a symlink of the sandbox's cannot
/// lead the daemon out of it.
pub fn open_in(root: &OwnedFd, path: &str, flags: OFlags) -> io::Result<OwnedFd> {
    Ok(rustix::fs::openat2(
        root,
        path.trim_start_matches('/'),
        flags | OFlags::CLOEXEC,
        Mode::empty(),
        rustix::fs::ResolveFlags::IN_ROOT | rustix::fs::ResolveFlags::NO_MAGICLINKS,
    )?)
}

/// Shared objects whose contents pass 1 captured already (from another
/// descriptor or process): pipes and FIFOs by (device, inode), unix
/// sockets by inode, shared memory objects by their key.
#[derive(Default)]
pub(crate) struct Seen {
    pipes: std::collections::HashSet<(u64, u64)>,
    sockets: std::collections::HashSet<u64>,
    shared_memory: std::collections::HashSet<(u64, u64, bool)>,
}

impl Seen {
    /// Whether pipe or FIFO `key` (device, inode) is seen here first.
    pub(crate) fn first_pipe(&mut self, key: (u64, u64)) -> bool {
        self.pipes.insert(key)
    }

    /// Whether shared memory object `key` (device, inode, SysV or not:
    /// `process::shared_memory::ObjectKey`) is seen here first.
    pub(crate) fn first_shared_memory(&mut self, key: (u64, u64, bool)) -> bool {
        self.shared_memory.insert(key)
    }

    /// Whether unix socket `ino` is seen here first.
    pub(crate) fn first_socket(&mut self, ino: u64) -> bool {
        self.sockets.insert(ino)
    }
}
