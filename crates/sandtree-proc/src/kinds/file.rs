//! Regular files and directories opened by path (`FdKind::LayerFile`,
//! `KeptFile`, `OtherMount`). One on the sandbox's layers belongs to the
//! replaced tree: reopened at the restore by path in the rolled-back tree,
//! with its flags (less the creating ones) at its offset, onto its number.
//! One on a mount that rollback keeps (`/dev`, `/proc`, devpts) is kept
//! from the template, but a terminal's slave (`/dev/pts/N`, see
//! [`FdKind::terminal`]): opened again by path if a captured process holds
//! its master (the pty is made anew), else through the template's `O_PATH`
//! of its node; one whose pty was gone at the checkpoint (hung up, its
//! node deleted: a background job's after its shell's session ended) is
//! handed a hung-up terminal's slave (`pty.rs`). One of `/dev/shm` (`ShmFile`): opened again by path in the
//! fresh `/dev/shm`, or, deleted, through the template's descriptor.
//! Refused: a file of another mount that rollback replaces (a mount the
//! sandbox made), a lease being broken (an active one is taken again,
//! with its break notice signal, like a lock: [`Kind::configure`]).

use super::hand_over::{Handed, Key};
use super::{Kind, Remake};
use crate::batch::{Arg, Batch};
use crate::model::{FdImage, FdKind, ProcessImage};
use crate::{HostPid, Result, SandboxPid};

/// Files opened by path.
pub(crate) struct PathFile;

impl Kind for PathFile {
    fn check(&self, f: &FdImage, _p: &ProcessImage) -> std::result::Result<(), String> {
        match &f.kind {
            FdKind::LayerFile { path, locked: true, .. } => Err(format!(
                "a lease being broken or a delegation is held on {path} (not captured; flock, POSIX and OFD locks and leases are)"
            )),
            FdKind::KeptFile { path, unread, master_captured: true, .. } if *unread > 0 => Err(match *unread {
                u32::MAX => format!("terminal {path}, whose input waiting to be read could not be asked"),
                n => format!("terminal {path} with {n} bytes of input not read yet: checkpoint once it is read"),
            }),
            FdKind::OtherMount { path } => Err(match path.strip_prefix(crate::procfs::MQUEUE_PREFIX) {
                Some(name) => format!(
                    "POSIX message queue {name} (mq_open): not captured (its messages cannot be read without taking them)"
                ),
                None => format!(
                    "{path} is on a mount that rollback replaces (only the sandbox's layers, /dev and /proc are handled)"
                ),
            }),
            _ => Ok(()),
        }
    }

    fn cannot_move(&self, f: &FdImage) -> Option<&'static str> {
        match &f.kind {
            FdKind::OtherMount { .. } => Some("a file of another mount"),
            FdKind::LayerFile { locked: true, .. } => Some("a file of the tree is locked"),
            FdKind::LayerFile { locks, .. } if !locks.is_empty() => Some("a file of the tree is locked"),
            _ => None,
        }
    }

    /// The locks it held, taken again on the file reopened in the
    /// rolled-back tree (nothing else holds them there: the killed
    /// originals' were on the replaced tree's files).
    fn configure(&self, f: &FdImage, b: &mut Batch) -> bool {
        let FdKind::LayerFile { locks, .. } = &f.kind else { return false };
        for l in locks {
            lock_again(b, f.fd, l);
        }
        !locks.is_empty()
    }

    fn reopen(&self, f: &FdImage, b: &mut Batch, handed: &Handed) -> bool {
        if let k @ FdKind::KeptFile { path, master_captured, hung_up, .. } = &f.kind
            && let Some(index) = k.terminal()
        {
            // (A session's terminal closed since, or one hung up already:
            // handed over, `remake`.)
            if *hung_up || (!master_captured && handed.hung_up(index)) {
                return false;
            }
            // (Not the terminal of whatever session the process is in
            // before its own is restored.)
            let flags = (f.flags & !(libc::O_CREAT | libc::O_EXCL | libc::O_TRUNC) as u32) | libc::O_NOCTTY as u32;
            // A pty made anew by path; one that lived on (a session's)
            // through the template's O_PATH of its node: that pty alone.
            let (path, what) = match master_captured {
                true => (b.path(path), "open (terminal)"),
                false => (b.path(&format!("/proc/self/fd/{}", f.fd)), "open (terminal, through its O_PATH)"),
            };
            let fd = b.call(what, libc::SYS_open, &[path, Arg::Val(flags as u64), Arg::Val(0)]);
            b.move_fd(fd, f.fd, f.flags);
            return true;
        }
        if let FdKind::ShmFile { path, deleted } = &f.kind {
            // A deleted one: a new open file of the object the template
            // held for it (its contents put back, `process::shared_memory`).
            // (`O_NOFOLLOW`, which `shm_open` and `mkstemp` use, would not
            // follow the `/proc` link.)
            let (path, f) = match deleted {
                true => {
                    let through = FdImage { flags: f.flags & !(libc::O_NOFOLLOW as u32), ..f.clone() };
                    (b.path(&format!("/proc/self/fd/{}", f.fd)), std::borrow::Cow::Owned(through))
                }
                false => (b.path(path), std::borrow::Cow::Borrowed(f)),
            };
            reopen_at(&f, b, path);
            return true;
        }
        let FdKind::LayerFile { path, .. } = &f.kind else { return false };
        // The open file of another process, restored before: handed over
        // (`remake`), one offset for both.
        if f.opened_by.is_some() {
            return false;
        }
        let path = b.path(path);
        reopen_at(f, b, path);
        true
    }

    /// The slave of a session's terminal closed since the checkpoint, or of
    /// one hung up at it: a hung-up terminal in its place (`pty.rs`), as
    /// the template's held slave was before templates held none.
    fn remake(&self, f: &FdImage, cx: &mut Remake<'_>) -> Result<()> {
        // (A layer file several processes share: `hand_over::share`.)
        if matches!(f.kind, FdKind::LayerFile { .. }) {
            super::hand_over::share(f, cx)?;
            return Ok(());
        }
        if let k @ FdKind::KeptFile { master_captured: false, hung_up, .. } = &f.kind
            && let Some(index) = k.terminal()
            && f.same_as.is_none()
        {
            if *hung_up {
                cx.wanted.push((Key::HungUp(index), f.fd, f.flags));
            } else if cx.handed.hung_up(index) {
                cx.wanted.push((Key::Slave(index), f.fd, f.flags));
            }
        }
        Ok(())
    }
}

/// Add to `b`: the file at `path` opened with `f`'s flags (less the
/// creating ones) at its offset, onto its number.
fn reopen_at(f: &FdImage, b: &mut Batch, path: Arg) {
    let strip = (libc::O_CREAT | libc::O_EXCL | libc::O_TRUNC | libc::O_NOCTTY) as u32;
    let fd = b.call("open", libc::SYS_open, &[path, Arg::Val((f.flags & !strip) as u64), Arg::Val(0)]);
    if f.pos > 0 && f.flags & libc::O_DIRECTORY as u32 == 0 {
        b.call("lseek", libc::SYS_lseek, &[fd, Arg::Val(f.pos), Arg::Val(libc::SEEK_SET as u64)]);
    }
    b.move_fd(fd, f.fd, f.flags);
}

/// A process for [`share_open_files`]: the host pids of the process and
/// of its template (a file in flight is reached through the template:
/// `kinds/in_flight.rs`), its pid, its parent's pid, its descriptors.
pub(crate) type SharingProcess<'a> = ((HostPid, HostPid), SandboxPid, SandboxPid, &'a mut Vec<FdImage>);

/// Pass 1, every original still stopped: the files of the layers that
/// one open file of several captured processes names (`kcmp`: inherited,
/// as a build's log is by its compilers, or passed), and the inet
/// listeners and bound datagram sockets several hold (a preforking
/// server's workers share its listener: `gunicorn`, `multiprocessing`
/// after a `bind`). A restore opens or binds each again once, in the
/// process of the group that is an ancestor of the others (or the lowest
/// pid), and the others take it from there (`FdImage::opened_by`); else
/// each would get an open file of its own, with its own offset, and their
/// writes would overwrite each other, or each would bind the port again,
/// which the first holds.
pub(crate) fn share_open_files(processes: &mut [SharingProcess<'_>]) {
    // Candidates: the same path in two processes; the same socket.
    #[derive(PartialEq, Eq, Hash)]
    enum Same {
        Path(String),
        Socket(u64),
    }
    let mut by_key: std::collections::HashMap<Same, Vec<(usize, usize)>> = std::collections::HashMap::new();
    for (p, (_, _, _, fds)) in processes.iter().enumerate() {
        for (i, f) in fds.iter().enumerate().filter(|(_, f)| f.same_as.is_none()) {
            let key = match &f.kind {
                FdKind::LayerFile { path, .. } => Same::Path(path.clone()),
                FdKind::Socket { ino, inet: Some(_), tcp: None, .. } => Same::Socket(*ino),
                _ => continue,
            };
            by_key.entry(key).or_default().push((p, i));
        }
    }
    for (key, list) in by_key {
        if list.iter().all(|(p, _)| *p == list[0].0) {
            continue;
        }
        // Groups of one open file: each member with the first it is. (A
        // socket's inode is its one open file.)
        let mut groups: Vec<Vec<(usize, usize)>> = Vec::new();
        let through = |p: usize, i: usize| {
            let ((host, template), f) = (processes[p].0, &processes[p].3[i]);
            (if f.in_flight { template } else { host }, f.fd)
        };
        for &(p, i) in &list {
            let (host, fd) = through(p, i);
            let same = |&(q, j): &(usize, usize)| {
                q != p && {
                    let (h2, fd2) = through(q, j);
                    matches!(key, Same::Socket(_))
                        || sandtree_sys::process::same_open_file(host.raw(), fd, h2.raw(), fd2).unwrap_or(false)
                }
            };
            match groups.iter_mut().find(|g| g.iter().any(same)) {
                Some(g) => g.push((p, i)),
                None => groups.push(vec![(p, i)]),
            }
        }
        for g in groups.into_iter().filter(|g| g.len() > 1) {
            let pid = |(p, _): &(usize, usize)| processes[*p].1;
            let in_group = |pid_: SandboxPid| g.iter().any(|m| pid(m) == pid_);
            // The one whose parent is not in the group, lowest pid first.
            let Some(&owner) = g.iter().filter(|m| !in_group(processes[m.0].2)).min_by_key(|m| pid(m)) else {
                continue;
            };
            let by = (pid(&owner), processes[owner.0].3[owner.1].fd);
            for &(p, i) in &g {
                if (p, i) != owner && p != owner.0 {
                    processes[p].3[i].opened_by = Some(by);
                }
            }
        }
    }
}

/// Lock `l` taken again through descriptor `fd` (added to `b`): `flock`,
/// or `fcntl` with a `struct flock` (`l_type`, `l_whence` = `SEEK_SET`,
/// `l_start`, `l_len`: 0 to the end and beyond; 32 bytes on x86-64).
/// Without waiting: a lock someone else holds fails the restore.
/// `F_SETSIG` (`<asm-generic/fcntl.h>`).
const F_SETSIG: u64 = 10;

fn lock_again(b: &mut Batch, fd: i32, l: &crate::model::FileLock) {
    use crate::model::LockKind;
    if l.kind == LockKind::Flock {
        let op = if l.write { libc::LOCK_EX } else { libc::LOCK_SH } | libc::LOCK_NB;
        b.call("flock", libc::SYS_flock, &[Arg::Val(fd as u64), Arg::Val(op as u64)]);
        return;
    }
    if l.kind == LockKind::Lease {
        // (Its break notice first; the lease makes this process the file's
        // owner, which the original was when it took it.)
        if l.signal != 0 {
            let args = [Arg::Val(fd as u64), Arg::Val(F_SETSIG), Arg::Val(l.signal as u64)];
            b.call("fcntl(F_SETSIG)", libc::SYS_fcntl, &args);
        }
        let ty = if l.write { libc::F_WRLCK } else { libc::F_RDLCK };
        let args = [Arg::Val(fd as u64), Arg::Val(libc::F_SETLEASE as u64), Arg::Val(ty as u64)];
        b.call("fcntl(F_SETLEASE)", libc::SYS_fcntl, &args);
        return;
    }
    let ty = if l.write { libc::F_WRLCK } else { libc::F_RDLCK } as i16;
    let len = l.end.map_or(0, |end| end.saturating_sub(l.start) + 1);
    let mut raw = Vec::with_capacity(32);
    raw.extend_from_slice(&ty.to_ne_bytes());
    raw.extend_from_slice(&(libc::SEEK_SET as i16).to_ne_bytes());
    raw.extend_from_slice(&[0u8; 4]);
    raw.extend_from_slice(&l.start.to_ne_bytes());
    raw.extend_from_slice(&len.to_ne_bytes());
    raw.extend_from_slice(&[0u8; 8]);
    let cmd = if l.kind == LockKind::Ofd { libc::F_OFD_SETLK } else { libc::F_SETLK };
    let what = if l.kind == LockKind::Ofd { "fcntl(F_OFD_SETLK)" } else { "fcntl(F_SETLK)" };
    let flock = b.data(&raw);
    b.call(what, libc::SYS_fcntl, &[Arg::Val(fd as u64), Arg::Val(cmd as u64), flock]);
}
