//! The sandbox's `/dev/shm` in its checkpoints.
//!
//! `/dev/shm` is a tmpfs of its own, not a directory of the layers: a
//! rollback in place keeps `/dev` but gives `/dev/shm` a fresh tmpfs, and a
//! fork or a restart boots with an empty one. Its files are part of the
//! state all the same (POSIX shared memory and semaphores by name, files
//! a program leaves there), so a checkpoint copies them into its layer's
//! subvolume, beside the overlay directories, and a rollback or a fork
//! copies them back before any process runs:
//!
//! ```text
//! sandboxes/<id>/<gen>/layers/<i>/{upper,work}   the overlay's directories
//! sandboxes/<id>/<gen>/dev-shm/                  /dev/shm at the checkpoint (absent: empty, as made)
//! ```
//!
//! The copy ([`sandtree_fs::copy_tree`]) keeps contents, holes, mode, owner,
//! times, extended attributes and hard links; socket files are left out
//! (a bound socket's name, which the process holding it binds again).
//!
//! Both calls are cheap when there is nothing to copy (a few syscalls:
//! no blocking section); the copy itself runs in one.
//!
//! When: at a checkpoint, once nothing in the sandbox can write to
//! `/dev/shm` (every process stopped, or init alone with spawns held), into
//! the writable subvolume that becomes the checkpoint's layer or is
//! snapshotted as it (an older copy there, from the checkpoint a rollback
//! copied, is replaced or removed). At a rollback, after the tree swap
//! (killed processes gone from `/dev/shm`'s view, the tmpfs fresh) and
//! before the processes are restored; at a restart and at a fork, after
//! init boots.

use std::os::fd::AsFd;
use std::path::{Path, PathBuf};

use crate::{Error, Result};

/// The copy's directory in a layer's subvolume.
pub(crate) const SAVED: &str = "dev-shm";

/// `/dev/shm` of the sandbox whose init is host pid `init`, from the host.
fn open_live(init: i32) -> Result<std::os::fd::OwnedFd> {
    let root = PathBuf::from(format!("/proc/{init}/root"));
    let root = std::fs::File::open(&root).map_err(|e| Error::Internal(format!("open {}: {e}", root.display())))?;
    sandtree_fs::open_dir_beneath(root.as_fd(), Path::new("dev/shm")).map_err(|e| Error::fs("/dev/shm", e))
}

/// At a checkpoint: copies the sandbox's `/dev/shm` into `<subvol>/dev-shm`
/// (none if it is empty and as made: mode 1777, owned by the sandbox's
/// root, host ids `root`). Returns the bytes copied.
pub(crate) fn save(init: i32, root: (u32, u32), subvol: &Path) -> Result<u64> {
    let saved = subvol.join(SAVED);
    discard(subvol)?;
    let live = open_live(init)?;
    let st = rustix::fs::fstat(&live).map_err(|e| Error::Internal(format!("stat /dev/shm: {e}")))?;
    let empty = sandtree_fs::is_empty_dir(live.as_fd()).map_err(|e| Error::Internal(format!("read /dev/shm: {e}")))?;
    if empty && st.st_mode & 0o7777 == 0o1777 && (st.st_uid, st.st_gid) == root {
        return Ok(0);
    }
    std::fs::create_dir(&saved).map_err(|e| Error::fs("checkpoint", sandtree_fs::Error::io("mkdir", &saved, e)))?;
    let to =
        std::fs::File::open(&saved).map_err(|e| Error::fs("checkpoint", sandtree_fs::Error::io("open", &saved, e)))?;
    let copied = crate::engine::block(|| sandtree_fs::copy_tree(live.as_fd(), to.as_fd(), &saved))
        .map_err(|e| Error::fs("checkpoint", e))?;
    tracing::debug!(entries = copied.entries, bytes = copied.bytes, sockets = copied.sockets, "/dev/shm saved");
    Ok(copied.bytes)
}

/// Removes an older copy from a writable subvolume (a sandbox that does
/// not run has no `/dev/shm`: a checkpoint of it holds none).
pub(crate) fn discard(subvol: &Path) -> Result<()> {
    remove_saved(subvol, SAVED)
}

/// Removes directory `name` of a writable subvolume, if there (a copy a
/// checkpoint saves beside the layers: `/dev/shm`'s, the SysV IPC
/// objects').
pub(crate) fn remove_saved(subvol: &Path, name: &str) -> Result<()> {
    let saved = subvol.join(name);
    match std::fs::remove_dir_all(&saved) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(Error::fs("checkpoint", sandtree_fs::Error::io("remove", &saved, e))),
    }
}

/// At a rollback, restart or fork onto a checkpoint whose layer is
/// `layer`: copies its `/dev/shm` into the sandbox's (empty) one.
pub(crate) fn load(init: i32, layer: &Path) -> Result<()> {
    let saved = layer.join(SAVED);
    let from = match std::fs::File::open(&saved) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(Error::fs("rollback", sandtree_fs::Error::io("open", &saved, e))),
    };
    let live = open_live(init)?;
    if !sandtree_fs::is_empty_dir(live.as_fd()).map_err(|e| Error::Internal(format!("read /dev/shm: {e}")))? {
        return Err(Error::Internal("/dev/shm is not empty before the checkpoint's files are copied back".into()));
    }
    // The tmpfs belongs to the sandbox's user namespace, where the host's
    // root is unmapped and may not create files (`EOVERFLOW`): a thread
    // creates them as the sandbox's root, who mounted it and owns it.
    let st = rustix::fs::fstat(&live).map_err(|e| Error::Internal(format!("stat /dev/shm: {e}")))?;
    let copied = crate::engine::block(|| {
        std::thread::scope(|s| {
            s.spawn(|| {
                sandtree_sys::process::act_as_file_owner(st.st_uid, st.st_gid)
                    .map_err(|e| Error::Internal(format!("create files in /dev/shm as its owner: {e}")))?;
                sandtree_fs::copy_tree(from.as_fd(), live.as_fd(), Path::new("/dev/shm"))
                    .map_err(|e| Error::fs("rollback", e))
            })
            .join()
            .unwrap_or_else(|_| Err(Error::Internal("the /dev/shm copy panicked".into())))
        })
    })?;
    tracing::debug!(entries = copied.entries, bytes = copied.bytes, "/dev/shm loaded");
    Ok(())
}
