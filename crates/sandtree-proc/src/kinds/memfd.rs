//! Memfds (`FdKind::Memfd`): shared memory objects of no file
//! (`process::shared_memory`): the template keeps each descriptor (the
//! very open file the process had, shared with it as a fork shares it) and
//! each mapping, so the restored processes have the same memfd again, with
//! its name, inode, seals and mode; its contents are copied in pass 1
//! (sparsely) and put back before any process is cloned. A restored
//! descriptor gets the checkpoint's offset and status flags back (the open
//! file is shared with the killed original, which may have moved them).
//! Refused: one whose seals or file system could not be read, one on huge
//! pages. A memfd sealed since the checkpoint fails the restore (a seal
//! cannot be taken off).

use super::Kind;
use crate::batch::{Arg, Batch};
use crate::model::{FdImage, FdKind, ProcessImage};

/// Memfds.
pub(crate) struct Memfd;

impl Kind for Memfd {
    fn check(&self, f: &FdImage, _p: &ProcessImage) -> std::result::Result<(), String> {
        match &f.kind {
            FdKind::Memfd { name, probed: false, .. } => {
                Err(format!("memfd {name}: its size, seals or file system could not be read"))
            }
            FdKind::Memfd { name, hugetlb: true, .. } => {
                Err(format!("memfd {name} on huge pages (MFD_HUGETLB is not captured yet)"))
            }
            _ => Ok(()),
        }
    }

    /// The checkpoint's offset and status flags, on the open file the
    /// template kept (shared with the killed original, which may have moved
    /// them).
    fn configure(&self, f: &FdImage, b: &mut Batch) -> bool {
        if !matches!(f.kind, FdKind::Memfd { .. }) || f.same_as.is_some() {
            return false;
        }
        let status = (f.flags & !(libc::O_ACCMODE | libc::O_CLOEXEC | libc::O_LARGEFILE) as u32) as u64;
        let fd = Arg::Val(f.fd as u64);
        b.call("fcntl(F_SETFL) (memfd)", libc::SYS_fcntl, &[fd, Arg::Val(libc::F_SETFL as u64), Arg::Val(status)]);
        b.call("lseek (memfd)", libc::SYS_lseek, &[fd, Arg::Val(f.pos), Arg::Val(libc::SEEK_SET as u64)]);
        true
    }
}
