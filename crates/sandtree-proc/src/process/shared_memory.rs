//! Shared memory of no file of the tree: shared anonymous mappings
//! (`mmap(MAP_SHARED | MAP_ANONYMOUS)`, inherited across `fork`:
//! PostgreSQL's buffers, `multiprocessing`), SysV shared memory segments
//! attached (`shmat`), and deleted files of the sandbox's `/dev/shm`
//! (`multiprocessing`'s heap and semaphores: created, then unlinked),
//! mapped or held open.
//!
//! Each is one shmem object (a tmpfs inode) that the template shares with
//! the running process: the fork keeps its mappings and descriptors, so the
//! template holds the object alive and the restored processes, clones of
//! the templates, map the very same object again, together as before (a
//! child made again by its parent maps it too, `transplant.rs`). What the
//! template cannot hold is the contents, which the running processes go
//! on writing. So:
//!
//! - **capture** (pass 1, every process stopped): each object seen first
//!   is copied into a memfd of the daemon ([`SharedMemoryCopy`],
//!   `fdstate::SparseCopy`), its data segments only (`SEEK_DATA`/`SEEK_HOLE`: pages never touched are holes
//!   and stay holes), by `sendfile` from the object opened through
//!   `/proc/<pid>/map_files/<start>-<end>` (a mapping) or `/proc/<pid>/fd/<n>`
//!   (a descriptor);
//! - **put back** (a restore, before any process is cloned): the object,
//!   reached through a template that holds it ([`Reach`]), is cut to its
//!   size at the checkpoint, emptied (`FALLOC_FL_PUNCH_HOLE`) and given the
//!   copy's segments again.
//!
//! Objects are told apart by (device, inode, SysV or not) as `maps` and
//! `fstat` show them (a SysV segment's inode number is its id).
//!
//! A file of `/dev/shm` that still has its name is not one of these: a
//! rollback gives `/dev/shm` a fresh tmpfs with the checkpoint's files, and
//! the restore opens and maps it again there by path
//! (`process::memory::remap_shared_files`, `FdKind::ShmFile`). Not covered:
//! memfd mappings and huge pages (`MAP_HUGETLB`), which stay refused
//! (`process::memory::check`), and the SysV objects of the sandbox's IPC
//! namespace that no captured process has attached (segments, semaphore
//! sets, message queues: a rollback leaves them as they are).

use std::io;
use std::os::fd::{AsFd, OwnedFd};

use rustix::fs::{FallocateFlags, Mode, OFlags, SealFlags};

use crate::model::{FdImage, FdKind, MapImage};
use crate::{Error, HostPid, Result};

/// What kind of shared memory object a mapping is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Object {
    /// `MAP_SHARED | MAP_ANONYMOUS` (or a shared mapping of `/dev/zero`):
    /// `maps` names it `/dev/zero (deleted)`.
    Anonymous,
    /// A SysV segment attached by `shmat`: `/SYSV<key> (deleted)`, its inode
    /// number the segment's id.
    SysV,
    /// A deleted file of `/dev/shm`.
    DeletedShmFile,
    /// A memfd (`/memfd:<name> (deleted)`), mapped shared or private.
    Memfd,
}

/// The shared memory object mapping `m` is, if it is one this module
/// captures.
pub(crate) fn object_of(m: &MapImage) -> Option<Object> {
    let path = m.path.as_deref()?;
    let deleted = path.strip_suffix(" (deleted)")?;
    // (A private mapping of a memfd reads the pages it did not write from
    // the memfd: its contents matter as a shared one's.)
    if deleted.starts_with("/memfd:") {
        return Some(Object::Memfd);
    }
    if !m.shared() {
        return None;
    }
    if deleted == "/dev/zero" {
        Some(Object::Anonymous)
    } else if deleted.starts_with("/SYSV") {
        Some(Object::SysV)
    } else if deleted.strip_prefix("/dev/shm/").is_some_and(|name| !name.is_empty() && !name.contains('/')) {
        Some(Object::DeletedShmFile)
    } else {
        None
    }
}

/// One object: (device, inode, a SysV segment).
pub(crate) type ObjectKey = (u64, u64, bool);

/// Where a template holds an object: a mapping (start, end) or a
/// descriptor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Reach {
    Mapping(u64, u64),
    Descriptor(i32),
}

/// The saved contents of one object at a checkpoint.
#[derive(Debug)]
pub(crate) struct SharedMemoryCopy {
    pub key: ObjectKey,
    /// Its data segments, in a memfd of the daemon.
    saved: crate::fdstate::SparseCopy,
    /// A memfd's seals and permission bits (the object keeps seals added
    /// since: a restore fails then; its mode is set back).
    memfd: Option<(u32, u32)>,
}

impl SharedMemoryCopy {
    /// One of object `key` whose saved data is `saved` (read from a
    /// durable image): a memfd's seals and permission bits `memfd`.
    pub(crate) fn from_saved(key: ObjectKey, saved: crate::fdstate::SparseCopy, memfd: Option<(u32, u32)>) -> Self {
        SharedMemoryCopy { key, saved, memfd }
    }

    /// Bytes saved.
    pub(crate) fn bytes(&self) -> u64 {
        self.saved.bytes()
    }

    /// Its saved data.
    pub(crate) fn saved(&self) -> &crate::fdstate::SparseCopy {
        &self.saved
    }

    /// A memfd's seals and permission bits.
    pub(crate) fn memfd(&self) -> Option<(u32, u32)> {
        self.memfd
    }
}

/// The path that opens what `reach` holds in process `host`.
fn path_of(host: HostPid, reach: Reach) -> String {
    match reach {
        Reach::Mapping(start, end) => format!("/proc/{host}/map_files/{start:x}-{end:x}"),
        Reach::Descriptor(fd) => format!("/proc/{host}/fd/{fd}"),
    }
}

/// The object `reach` holds in process `host`, opened with `flags`.
pub(crate) fn open(host: HostPid, reach: Reach, flags: OFlags) -> io::Result<OwnedFd> {
    Ok(rustix::fs::open(path_of(host, reach), flags | OFlags::CLOEXEC, Mode::empty())?)
}

/// The objects of stopped process `host` (its `maps` and descriptors
/// `fds`), each with where the process holds it; for a template made from
/// it, which holds them at the same places.
pub(crate) fn held(host: HostPid, maps: &[MapImage], fds: &[FdImage]) -> io::Result<Vec<(ObjectKey, Reach)>> {
    let mut out = Vec::new();
    for m in maps {
        if let Some(o) = object_of(m) {
            out.push(((m.dev, m.inode, o == Object::SysV), Reach::Mapping(m.start, m.end)));
        }
    }
    for f in fds {
        if matches!(f.kind, FdKind::ShmFile { deleted: true, .. } | FdKind::Memfd { hugetlb: false, .. })
            && f.same_as.is_none()
        {
            let st = rustix::fs::stat(format!("/proc/{host}/fd/{}", f.fd))?;
            out.push(((st.st_dev, st.st_ino, false), Reach::Descriptor(f.fd)));
        }
    }
    Ok(out)
}

/// Pass 1: a copy of each object of `held` (by process `host`, stopped)
/// that `seen` has not met yet.
pub(crate) fn capture(
    host: HostPid,
    held: &[(ObjectKey, Reach)],
    seen: &mut crate::fdstate::Seen,
) -> Result<Vec<SharedMemoryCopy>> {
    let mut out = Vec::new();
    for &(key, reach) in held {
        if !seen.first_shared_memory(key) {
            continue;
        }
        let copy = open(host, reach, OFlags::RDONLY).and_then(|object| match on_tmpfs(&object) {
            true => {
                let st = rustix::fs::fstat(&object)?;
                let memfd = match rustix::fs::fcntl_get_seals(&object) {
                    Ok(seals) if seals.contains(SealFlags::FUTURE_WRITE) => {
                        // (Writes through mappings made before it go on,
                        // and nothing could put the contents back.)
                        return Err(io::Error::other("a memfd sealed with F_SEAL_FUTURE_WRITE is not captured"));
                    }
                    Ok(seals) => Some((seals.bits(), st.st_mode & 0o7777)),
                    Err(_) => None,
                };
                let saved = crate::fdstate::SparseCopy::save(&object, st.st_size as u64)?;
                Ok(SharedMemoryCopy { key, saved, memfd })
            }
            // (SysV segments on huge pages, `SHM_HUGETLB`.)
            false => {
                Err(io::Error::other("shared memory of another file system than tmpfs (huge pages?) is not captured"))
            }
        });
        out.push(copy.map_err(|e| Error::Proc { pid: host, what: "shared memory contents", source: e })?);
    }
    Ok(out)
}

/// At a restore, before any process is cloned: each object of `copies`
/// (with the template that holds it and where) holds its checkpoint's
/// contents again.
pub(crate) fn put_back(copies: &[(SharedMemoryCopy, HostPid, Reach)]) -> Result<()> {
    for (c, host, reach) in copies {
        let fill = || -> io::Result<()> {
            let object = open(*host, *reach, OFlags::RDWR)?;
            let size = c.saved.size;
            if let Some((seals, mode)) = c.memfd {
                let now = rustix::fs::fcntl_get_seals(&object)?.bits();
                if now != seals {
                    return Err(io::Error::other(format!(
                        "the memfd was sealed since the checkpoint (seals {seals:#x}, now {now:#x}: a seal cannot be taken off)"
                    )));
                }
                if rustix::fs::fstat(&object)?.st_mode & 0o7777 != mode {
                    rustix::fs::fchmod(&object, Mode::from_raw_mode(mode))?;
                }
                // Sealed against writes: the contents are the checkpoint's.
                if seals & SealFlags::WRITE.bits() != 0 && rustix::fs::fstat(&object)?.st_size as u64 == size {
                    return Ok(());
                }
            }
            if rustix::fs::fstat(&object)?.st_size as u64 != size {
                rustix::fs::ftruncate(&object, size)?;
            }
            let punch = FallocateFlags::PUNCH_HOLE | FallocateFlags::KEEP_SIZE;
            if size > 0 {
                rustix::fs::fallocate(&object, punch, 0, size)?;
            }
            c.saved.write_into(&object)
        };
        fill().map_err(|e| Error::Proc { pid: *host, what: "shared memory contents, put back", source: e })?;
    }
    Ok(())
}

/// Whether `fd`'s object is on a tmpfs (shmem: what this module can copy
/// and empty).
fn on_tmpfs(fd: impl AsFd) -> bool {
    const TMPFS_MAGIC: i64 = 0x0102_1994;
    rustix::fs::fstatfs(fd).is_ok_and(|s| s.f_type == TMPFS_MAGIC)
}
