//! Inotify instances (`FdKind::AnonInode`, `inotify`): made anew at the
//! restore (after the other descriptors, whose making would show as
//! events), their watches added again by path in the rolled-back tree with
//! the same watch descriptors ([`fill`]). Refused: unread events, watch
//! descriptors above [`INOTIFY_MAX_WD`], a watch whose inode could not be
//! located (a deleted file no descriptor of the process holds), an instance shared by two processes; one whose state was not
//! read. A process with watches cannot move to a new tree.

use std::io;
use std::os::fd::OwnedFd;

use rustix::fs::{Mode, OFlags};
use rustix::io::Errno;

use super::{Kind, Remake};
use crate::batch::Arg;
use crate::check::INOTIFY_MAX_WD;
use crate::fdstate::{dup_from, open_in, tree_root};
use crate::model::{AnonState, FdImage, FdKind, InotifyWatch, ProcessImage};
use crate::template::Template;
use crate::{Error, HostPid, Result};

/// Inotify instances.
pub(crate) struct Inotify;

impl Kind for Inotify {
    fn check(&self, f: &FdImage, _p: &ProcessImage) -> std::result::Result<(), String> {
        match &f.kind {
            FdKind::AnonInode { state: Some(AnonState::Inotify { watches, pending, unresolved }), .. } => {
                if let Some(why) = unresolved {
                    return Err(why.clone());
                }
                if *pending > 0 {
                    return Err(format!(
                        "an inotify instance with {pending} bytes of events not read yet (reading them would take them from the process; checkpoint once they are read)"
                    ));
                }
                if watches.last().is_some_and(|w| w.wd > INOTIFY_MAX_WD) {
                    return Err(format!(
                        "an inotify instance with watch descriptors above {INOTIFY_MAX_WD} (only small watch sets are captured yet)"
                    ));
                }
                Ok(())
            }
            _ => super::anon::OtherAnon.check(f, _p),
        }
    }

    fn cannot_move(&self, f: &FdImage) -> Option<&'static str> {
        match &f.kind {
            FdKind::AnonInode { state: Some(AnonState::Inotify { watches, .. }), .. } if !watches.is_empty() => {
                Some("inotify watches")
            }
            _ => super::anon::OtherAnon.cannot_move(f),
        }
    }

    /// A new instance in the process at its number, then its watches added
    /// by the daemon through a duplicate ([`fill`]).
    fn remake(&self, f: &FdImage, cx: &mut Remake<'_>) -> Result<()> {
        let FdKind::AnonInode { state: Some(AnonState::Inotify { watches, .. }), .. } = &f.kind else {
            return Ok(());
        };
        if f.same_as.is_some() {
            return Ok(());
        }
        let cloexec = if f.flags & libc::O_CLOEXEC as u32 != 0 { libc::IN_CLOEXEC } else { 0 };
        let args = [Arg::Val((libc::IN_NONBLOCK | cloexec) as u64)];
        let ifd = cx.batch.call("inotify_init1", libc::SYS_inotify_init1, &args);
        cx.batch.move_fd(ifd, f.fd, f.flags);
        cx.p.run_batch(cx.batch)?;
        fill(cx.p.tid, f.fd, watches, f.flags).map_err(|e| Error::Proc {
            pid: cx.p.tid,
            what: "inotify watches",
            source: e,
        })?;
        check_restored(cx.p.tid, cx.image, f.fd, watches)
    }
}

/// The restored instance has the checkpoint's watch descriptors (what
/// [`fill`] relies on, checked rather than assumed).
fn check_restored(pid: HostPid, image: &ProcessImage, fd: i32, watches: &[InotifyWatch]) -> Result<()> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/fdinfo/{fd}")).map_err(|e| Error::Proc {
        pid,
        what: "inotify fdinfo",
        source: e,
    })?;
    let mut got: Vec<i32> = text
        .lines()
        .filter_map(|l| l.strip_prefix("inotify wd:")?.split_whitespace().next())
        .filter_map(|wd| i32::from_str_radix(wd, 16).ok())
        .collect();
    got.sort_unstable();
    let want: Vec<i32> = watches.iter().map(|w| w.wd).collect();
    if got != want {
        return Err(Error::unsupported(
            image.pid,
            &image.comm,
            "inotify",
            format!("the restored inotify instance has watches {got:?} instead of {want:?}"),
        ));
    }
    Ok(())
}

/// Add `watches` to the new, empty inotify instance `fd` of `host`, from
/// the daemon through a duplicate (with the daemon's rights: a process
/// that dropped privileges after adding its watches gets them back all the
/// same), each with its watch descriptor, then set the instance's status
/// `flags` (it was made non-blocking).
///
/// The kernel hands out watch descriptors in order (1, 2, ...; never one
/// just removed): a gap in the checkpoint's numbers is filled by adding and
/// removing a *spacer* watch on the daemon's root directory (never one the
/// sandbox watches). Each removal queues an `IN_IGNORED` event, read away
/// while the real watches still have a narrow mask (`IN_DELETE_SELF`), so
/// that no real event is read with them; then each real watch gets its
/// mask. Paths resolve in the process's tree (`RESOLVE_IN_ROOT`), and the
/// watch is added on `/proc/self/fd/N` of the opened inode (a symbolic
/// link itself when the watch was made with `IN_DONT_FOLLOW`).
fn fill(host: HostPid, fd: i32, watches: &[InotifyWatch], flags: u32) -> io::Result<()> {
    use rustix::fs::inotify::{WatchFlags, add_watch, remove_watch};
    const IN_DONT_FOLLOW: u32 = 0x0200_0000;
    let inotify = dup_from(host, fd)?;
    let root = tree_root(host)?;
    let spacer = rustix::fs::open("/", OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty())?;
    let via = |f: &OwnedFd| format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(f));
    let mismatch = |path: &str, got: i32, want: i32| {
        io::Error::other(format!("the watch on {path} got descriptor {got} instead of {want}"))
    };
    let mut next = 1;
    let mut spacers = 0usize;
    let mut targets = Vec::with_capacity(watches.len());
    for w in watches {
        while next < w.wd {
            // (DELETE_SELF: the daemon's root is never deleted, so the
            // spacer reports nothing but its removal.)
            let s = add_watch(&inotify, via(&spacer), WatchFlags::DELETE_SELF | WatchFlags::MASK_CREATE)?;
            remove_watch(&inotify, s)?;
            next += 1;
            spacers += 1;
        }
        let follow = if w.dont_follow { OFlags::NOFOLLOW } else { OFlags::empty() };
        // (A deleted file the process holds: the one made anew on that
        // descriptor, `kinds/deleted.rs`, before this.)
        let target = match w.through_fd {
            Some(held) => crate::fdstate::open_proc_fd(host, held, OFlags::PATH)?,
            None => open_in(&root, &w.path, OFlags::PATH | follow)?,
        };
        let wd = add_watch(&inotify, via(&target), WatchFlags::DELETE_SELF)?;
        if wd != w.wd {
            return Err(mismatch(&w.path, wd, w.wd));
        }
        targets.push((target, w));
        next = w.wd + 1;
    }
    // struct inotify_event is 16 bytes without a name: the spacers' events
    // exactly.
    let mut left = 16 * spacers;
    let mut buf = vec![0u8; left.max(16)];
    while left > 0 {
        match rustix::io::read(&inotify, &mut buf[..left]) {
            Ok(0) => break,
            Ok(n) => left -= n,
            Err(Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
    for (target, w) in &targets {
        let wd = add_watch(&inotify, via(target), WatchFlags::from_bits_retain(w.mask & !IN_DONT_FOLLOW))?;
        if wd != w.wd {
            return Err(mismatch(&w.path, wd, w.wd));
        }
    }
    if flags & libc::O_NONBLOCK as u32 == 0 {
        let keep = OFlags::from_bits_retain(flags & !(libc::O_CLOEXEC | libc::O_ACCMODE) as u32);
        rustix::fs::fcntl_setfl(&inotify, keep)?;
    }
    Ok(())
}

/// An inotify instance is made anew per process at the restore: one that
/// another process shares (inherited over a fork) would come back as two,
/// each reporting every event.
pub(crate) fn shared_with(t: &Template, made: &[Template]) -> Result<()> {
    let mine = |t: &Template| -> Vec<i32> {
        t.image
            .fds
            .iter()
            .filter(|f| matches!(f.kind, FdKind::AnonInode { state: Some(AnonState::Inotify { .. }), .. }))
            .map(|f| f.fd)
            .collect()
    };
    for fd in mine(t) {
        for other in made {
            if mine(other)
                .into_iter()
                .any(|o| sandtree_sys::process::same_open_file(t.host.raw(), fd, other.host.raw(), o).unwrap_or(false))
            {
                return Err(Error::unsupported(
                    t.image.pid,
                    &t.image.comm,
                    format!("fd {fd}"),
                    format!(
                        "an inotify instance shared with process {} (made anew per process at a restore, it would come back as two)",
                        other.image.pid
                    ),
                ));
            }
        }
    }
    Ok(())
}
