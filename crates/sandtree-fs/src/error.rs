//! The crate's error type. One enum for the whole crate because callers match
//! on a few variants across modules ([`Error::NoSpace`],
//! [`Error::UnsafePath`], [`Error::NotBtrfs`], ...); every variant carries the
//! path(s) and operation it failed on.

use std::io;
use std::path::PathBuf;

/// Result alias of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in the state store.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(
        "the kernel has no btrfs support (not in /proc/filesystems): load the btrfs module \
         (`modprobe btrfs`) or install a kernel with btrfs"
    )]
    BtrfsUnavailable,
    #[error("{path} is on a {found_fs} filesystem, not btrfs")]
    NotBtrfs { path: PathBuf, found_fs: String },
    #[error("mkfs.btrfs not found: `apt-get install btrfs-progs`")]
    MkfsMissing,
    #[error("mkfs.btrfs on {image} failed: {stderr}")]
    Mkfs { image: PathBuf, stderr: String },
    #[error("no space left on the btrfs volume during {op} of {path}")]
    NoSpace { op: &'static str, path: PathBuf },
    #[error("unsafe path {path} refused: {reason}")]
    UnsafePath { path: PathBuf, reason: &'static str },
    #[error("{path} is not a btrfs subvolume")]
    NotSubvolume { path: PathBuf },
    #[error("{path} has no parent directory or file name")]
    BadPath { path: PathBuf },
    #[error("attaching {image} to a loop device failed")]
    LoopAttach {
        image: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("mounting {dev} on {target} failed")]
    Mount {
        dev: PathBuf,
        target: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("unmounting {target} failed")]
    Unmount {
        target: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error(
        "{target} is still in use after {waited_ms} ms (a process with a file or directory open in it): it was \
         detached lazily and goes, with its loop device, when that process lets go; `fuser -vm {target}` names it"
    )]
    Busy { target: PathBuf, waited_ms: u64 },
    #[error(
        "loop device {dev} of {image} is still attached after {waited_ms} ms: something still holds the filesystem \
         (a mount namespace of a process still running{holders}); it detaches itself when that goes, or `losetup -d {dev}`"
    )]
    LoopStillAttached { dev: PathBuf, image: PathBuf, waited_ms: u64, holders: String },
    #[error("creating subvolume {path} failed")]
    CreateSubvolume {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("snapshot of {src} to {dst} failed")]
    Snapshot {
        src: PathBuf,
        dst: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("deleting subvolume {path} failed")]
    DeleteSubvolume {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("reading tar archive {path} failed")]
    Tar {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{op} {path} failed")]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

impl Error {
    /// Whether the kernel ran out of space (ENOSPC / EDQUOT) for this operation.
    pub fn is_no_space(&self) -> bool {
        match self {
            Error::NoSpace { .. } => true,
            Error::LoopAttach { source, .. }
            | Error::Mount { source, .. }
            | Error::Unmount { source, .. }
            | Error::CreateSubvolume { source, .. }
            | Error::Snapshot { source, .. }
            | Error::DeleteSubvolume { source, .. }
            | Error::Tar { source, .. }
            | Error::Io { source, .. } => is_enospc(source),
            _ => false,
        }
    }

    /// Builds an error for `op` on `path`, turning ENOSPC into [`Error::NoSpace`].
    pub fn io(op: &'static str, path: impl Into<PathBuf>, source: io::Error) -> Error {
        let path = path.into();
        if is_enospc(&source) { Error::NoSpace { op, path } } else { Error::Io { op, path, source } }
    }
}

/// Whether `e` is ENOSPC or EDQUOT.
pub(crate) fn is_enospc(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ENOSPC) | Some(libc::EDQUOT))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn enospc_io_error_becomes_no_space() {
        let e = Error::io("write", "/x", io::Error::from_raw_os_error(libc::ENOSPC));
        assert!(matches!(e, Error::NoSpace { op: "write", .. }));
        assert!(e.is_no_space());
        let e = Error::io("write", "/x", io::Error::from_raw_os_error(libc::EIO));
        assert!(!e.is_no_space());
    }
}
