//! Named pipes (`FdKind::Fifo`). On a layer, a FIFO's inode belongs to the
//! replaced tree: it is reopened by path in the rolled-back tree (whose
//! inode is the one later openers of the path reach), non-blocking so that
//! the open does not wait for a peer, its mode set back after; a *keeper*
//! the daemon opens there read-write first lets those opens succeed and
//! takes the saved bytes (`pipe.rs`). On a kept mount (`/dev`) its inode
//! lives on: it is a pipe's (`pipe.rs`), the template holding an `O_PATH`
//! of it and no end, opened again through it. So is a deleted one (its
//! last name removed while open), on a layer too: nothing can reach it by
//! path, the processes holding it share it as a pipe, and the template's
//! `O_PATH` keeps its inode (of the replaced tree, whose subvolume can
//! still be deleted: the inode goes with the last holder). Refused: a
//! FIFO on a mount that rollback replaces but that is not a layer. A
//! process holding one of the tree cannot move to a new tree.

use std::collections::HashMap;
use std::io::{self, Write};
use std::os::fd::OwnedFd;

use rustix::fs::OFlags;

use super::Kind;
use crate::batch::{Arg, Batch};
use crate::fdstate::{open_in, tree_root};
use crate::model::{FdImage, FdKind, ProcessImage};
use crate::template::CheckpointTemplates;
use crate::{Error, HostPid, Result};

/// Named pipes.
pub(crate) struct Fifo;

impl Kind for Fifo {
    fn check(&self, f: &FdImage, _p: &ProcessImage) -> std::result::Result<(), String> {
        match &f.kind {
            FdKind::Fifo { path, on_layer: false, kept: false, .. } => Err(format!(
                "named pipe {path} is on a mount that rollback replaces (only FIFOs on the sandbox's layers, /dev and /proc are handled)"
            )),
            _ => Ok(()),
        }
    }

    fn cannot_move(&self, f: &FdImage) -> Option<&'static str> {
        matches!(f.kind, FdKind::Fifo { on_layer: true, .. }).then_some("a named pipe of the tree is open")
    }

    fn reopen(&self, f: &FdImage, b: &mut Batch, _handed: &super::Handed) -> bool {
        if f.kind.held_as_o_path() {
            super::pipe::reopen_through_o_path(f, b);
            return true;
        }
        let FdKind::Fifo { path, on_layer: true, .. } = &f.kind else { return false };
        let strip = (libc::O_CREAT | libc::O_EXCL | libc::O_TRUNC | libc::O_NOCTTY) as u32;
        // Non-blocking, so that the open does not wait for a peer (the
        // restore holds the other end open); the mode as it was after.
        let path = b.path(path);
        let flags = (f.flags & !strip) | libc::O_NONBLOCK as u32;
        let fd = b.call("open (named pipe)", libc::SYS_open, &[path, Arg::Val(flags as u64), Arg::Val(0)]);
        if f.flags & libc::O_NONBLOCK as u32 == 0 {
            let args = [fd, Arg::Val(libc::F_SETFL as u64), Arg::Val((f.flags & !strip) as u64)];
            b.call("fcntl(F_SETFL)", libc::SYS_fcntl, &args);
        }
        b.move_fd(fd, f.fd, f.flags);
        true
    }
}

/// At a restore, before the processes are cloned: a keeper for each FIFO
/// of `set`'s layers, by path, open until every process is back.
pub(crate) fn open_keepers(set: &CheckpointTemplates) -> Result<HashMap<String, OwnedFd>> {
    let mut keepers: HashMap<String, OwnedFd> = HashMap::new();
    for t in &set.templates {
        for f in &t.image.fds {
            if let FdKind::Fifo { path, on_layer: true, deleted: false, .. } = &f.kind
                && !keepers.contains_key(path)
            {
                let keeper = open_keeper(t.host, path).map_err(|e| Error::Proc {
                    pid: t.host,
                    what: "named pipe in the rolled-back tree",
                    source: e,
                })?;
                keepers.insert(path.clone(), keeper);
            }
        }
    }
    Ok(keepers)
}

/// Open the named pipe at `path` in the tree of process `host` for
/// reading and writing, without blocking (a FIFO's keeper at a restore).
/// The path resolves inside that tree only (`RESOLVE_IN_ROOT`): a symlink
/// of the sandbox's cannot lead the daemon out of it.
fn open_keeper(host: HostPid, path: &str) -> io::Result<OwnedFd> {
    let fd = open_in(&tree_root(host)?, path, OFlags::RDWR | OFlags::NONBLOCK | OFlags::NOFOLLOW)?;
    if rustix::fs::fstat(&fd)?.st_mode & libc::S_IFMT != libc::S_IFIFO {
        return Err(io::Error::other(format!("{path} is not a named pipe in the rolled-back tree")));
    }
    Ok(fd)
}

/// Make the pipe behind `keeper` (open for reading and writing) hold
/// exactly `bytes`, with capacity `size` (at least).
pub(crate) fn fill(keeper: &OwnedFd, bytes: &[u8], size: usize) -> io::Result<()> {
    super::pipe::drain(keeper)?;
    let now = rustix::pipe::fcntl_getpipe_size(keeper)?;
    // (0: not known; only room for the bytes is needed then.)
    let want = if size == 0 { now.max(bytes.len()) } else { size.max(bytes.len()) };
    if want != now {
        rustix::pipe::fcntl_setpipe_size(keeper, want)?;
    }
    std::fs::File::from(keeper.try_clone()?).write_all(bytes)
}
