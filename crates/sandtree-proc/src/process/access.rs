//! What a process of a user other than root may open again. A restore
//! runs as the process's own user (it is a fork of its template): it
//! `chdir`s to the working directory and opens files again by path (or a
//! pipe or terminal through its `O_PATH`) with that user's rights. A
//! process that got a descriptor or a working directory with rights it
//! no longer has (it opened them as root, then changed users) would fail
//! there: the checkpoint refuses it by name instead.
//!
//! Asked only of a process without `CAP_DAC_OVERRIDE` and
//! `CAP_DAC_READ_SEARCH`, by the permission bits (not ACLs), against its
//! filesystem uid, gid and groups: host ids, as its image holds them
//! (read in `status` by the daemon) and `stat` shows the files'.

use std::fs;
use std::os::unix::fs::MetadataExt;

use crate::HostPid;
use crate::model::{FdImage, FdKind, ProcessImage};

/// `CAP_DAC_OVERRIDE` and `CAP_DAC_READ_SEARCH`.
const DAC: u64 = (1 << 1) | (1 << 2);

/// A process's filesystem credentials.
struct Credentials {
    uid: u32,
    gid: u32,
    groups: Vec<u32>,
}

impl Credentials {
    /// Of process `p` (its filesystem ids and groups).
    fn of(p: &ProcessImage) -> Credentials {
        Credentials { uid: p.uids[3], gid: p.gids[3], groups: p.groups.clone() }
    }

    /// Whether these credentials get all of `want` (`0o4` read, `0o2`
    /// write, `0o1` search) on the file `m` describes.
    fn may(&self, m: &fs::Metadata, want: u32) -> bool {
        let shift = if m.uid() == self.uid {
            6
        } else if m.gid() == self.gid || self.groups.contains(&m.gid()) {
            3
        } else {
            0
        };
        (m.mode() >> shift) & want == want
    }

    /// Whether these credentials may walk to `path` (absolute, in the tree
    /// of process `host`): search on `/` and each directory above it.
    fn may_walk_to(&self, host: HostPid, path: &str) -> bool {
        let mut at = String::new();
        for part in path.split('/').filter(|p| !p.is_empty()) {
            let dir = fs::metadata(format!("/proc/{host}/root{at}/"));
            if dir.is_ok_and(|m| !self.may(&m, 0o1)) {
                return false;
            }
            at.push('/');
            at.push_str(part);
        }
        true
    }
}

/// Whether `p` (its template `template`) is of a user that may not enter
/// its working directory.
pub(crate) fn cwd_denied(template: HostPid, p: &ProcessImage) -> bool {
    if p.cap_eff & DAC != 0 || !p.cwd.starts_with('/') {
        return false;
    }
    let c = Credentials::of(p);
    let dir = fs::metadata(format!("/proc/{template}/root{}", p.cwd));
    !c.may_walk_to(template, &p.cwd) || dir.is_ok_and(|m| !c.may(&m, 0o1))
}

/// A deleted working directory of `p` (its template `template`, its
/// original `orig`) that a restore can make again: its mode (of whichever
/// of the two still has it as its cwd: a forked template does, one made
/// from a standby does not, and the original, running again, may have
/// left it; else 0755), when its path is free in the checkpoint's tree and
/// its parent a directory its user may enter and write (the restore makes
/// it as that user).
pub(crate) fn deleted_cwd((template, orig): (HostPid, HostPid), p: &ProcessImage) -> Option<u32> {
    let path = p.cwd.strip_suffix(" (deleted)")?;
    if !may_make_dir(template, p, path) {
        return None;
    }
    let mode_of = |pid: HostPid| {
        let cwd = format!("/proc/{pid}/cwd");
        let same = fs::read_link(&cwd).is_ok_and(|l| l.to_string_lossy() == p.cwd);
        same.then(|| fs::metadata(&cwd).ok().map(|m| m.mode() & 0o7777)).flatten()
    };
    Some(mode_of(template).or_else(|| mode_of(orig)).unwrap_or(0o755))
}

/// Whether `p`'s user may make directory `path` again at a restore (as
/// the process, in the tree of its template `template`, the checkpoint's):
/// the path is free, its parent a directory the user may enter and write.
fn may_make_dir(template: HostPid, p: &ProcessImage, path: &str) -> bool {
    if !path.starts_with('/') || path == "/" || fs::symlink_metadata(format!("/proc/{template}/root{path}")).is_ok() {
        return false;
    }
    let Some(parent) = path.rsplit_once('/').map(|(a, _)| if a.is_empty() { "/" } else { a }) else { return false };
    let Some(dir) = fs::metadata(format!("/proc/{template}/root{parent}")).ok().filter(|m| m.is_dir()) else {
        return false;
    };
    let c = Credentials::of(p);
    p.cap_eff & DAC != 0 || (c.may_walk_to(template, parent) && c.may(&dir, 0o3))
}

/// Mark each deleted directory among `p`'s descriptors that a restore can
/// make again ([`may_make_dir`]; `template` is `p`'s template).
pub(crate) fn deleted_dirs(template: HostPid, p: &mut ProcessImage) {
    let remade: Vec<bool> = p
        .fds
        .iter()
        .map(|f| match &f.kind {
            FdKind::Deleted { directory: true, path, .. } => may_make_dir(template, p, path),
            _ => false,
        })
        .collect();
    for (f, ok) in p.fds.iter_mut().zip(remade) {
        if let FdKind::Deleted { directory: true, remade, .. } = &mut f.kind {
            *remade = ok;
        }
    }
}

/// The first descriptor of `p` (its template `template`, its original
/// `orig`) that its user may not open again as the restore does, with
/// what it names: a file of the tree or of `/dev/shm` (by path: every
/// directory above it searchable, the file readable or writable as its
/// access mode asks), a terminal (through its `O_PATH`: the inode alone).
/// An end of a pipe it may not open is marked for the daemon to open
/// (`FdImage::daemon_opens`) instead; a file of the layers is marked
/// (`FdImage::reopen_denied`), and refused in pass 2 unless another
/// process opens it again for it (`checkpoint::refuse_denied_reopens`).
pub(crate) fn fd_denied(orig: HostPid, template: HostPid, p: &mut ProcessImage) -> Option<(i32, String)> {
    if p.cap_eff & DAC != 0 {
        return None;
    }
    let c = Credentials::of(p);
    let want = |f: &FdImage| match f.flags & libc::O_ACCMODE as u32 {
        a if a == libc::O_WRONLY as u32 => 0o2,
        a if a == libc::O_RDWR as u32 => 0o6,
        _ => 0o4,
    };
    for f in p.fds.iter_mut().filter(|f| f.flags & libc::O_PATH as u32 == 0 && matches!(f.kind, FdKind::Pipe { .. })) {
        // (A file in flight is the template's alone: `kinds/in_flight.rs`.)
        let holder = if f.in_flight { template } else { orig };
        let node = fs::metadata(format!("/proc/{holder}/fd/{}", f.fd));
        f.daemon_opens = node.is_ok_and(|m| !c.may(&m, want(f)));
    }
    let mut layer_files = Vec::new();
    let first = p.fds.iter().filter(|f| f.same_as.is_none() && f.flags & libc::O_PATH as u32 == 0).find_map(|f| {
        let denied = match &f.kind {
            FdKind::LayerFile { path, .. }
            | FdKind::Fifo { path, on_layer: true, .. }
            | FdKind::ShmFile { path, deleted: false } => Some(path.clone()).filter(|path| {
                let file = fs::metadata(format!("/proc/{template}/root{path}"));
                !c.may_walk_to(template, path) || file.is_ok_and(|m| !c.may(&m, want(f)))
            }),
            k if (k.held_as_o_path() && !f.daemon_opens)
                || k.terminal().is_some()
                || matches!(k, FdKind::ShmFile { deleted: true, .. }) =>
            {
                let holder = if f.in_flight { template } else { orig };
                let node = fs::metadata(format!("/proc/{holder}/fd/{}", f.fd));
                node.is_ok_and(|m| !c.may(&m, want(f))).then(|| match k {
                    FdKind::ShmFile { path, .. } | FdKind::Fifo { path, .. } | FdKind::KeptFile { path, .. } => {
                        path.clone()
                    }
                    _ => "a pipe".to_string(),
                })
            }
            _ => None,
        };
        // (A layer file another process may open again for it: pass 2
        // tells, `FdImage::reopen_denied`.)
        match (denied, &f.kind) {
            (Some(_), FdKind::LayerFile { .. }) => {
                layer_files.push(f.fd);
                None
            }
            (denied, _) => denied.map(|what| (f.fd, what)),
        }
    });
    for f in p.fds.iter_mut().filter(|f| layer_files.contains(&f.fd)) {
        f.reopen_denied = true;
    }
    first
}
