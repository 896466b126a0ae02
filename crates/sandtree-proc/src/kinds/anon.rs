//! Anonymous inodes of other kinds (io_uring, fanotify, userfaultfd, ...):
//! refused, since their state points into the replaced tree or the kernel;
//! a process holding one cannot move to a new tree (it may hold files of
//! the tree).

use super::Kind;
use crate::model::{FdImage, FdKind, ProcessImage};

/// Anonymous inodes the engine does not capture.
pub(crate) struct OtherAnon;

impl Kind for OtherAnon {
    fn check(&self, f: &FdImage, _p: &ProcessImage) -> std::result::Result<(), String> {
        let what = match &f.kind {
            FdKind::AnonInode { what, .. } => what.as_str(),
            _ => "an anonymous inode",
        };
        Err(format!("{what} (not captured yet: its state points into the replaced tree or the kernel)"))
    }

    fn cannot_move(&self, _f: &FdImage) -> Option<&'static str> {
        Some("a kernel object that may hold files of the tree")
    }
}
