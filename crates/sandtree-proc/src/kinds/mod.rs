//! One module per kind of kernel object a descriptor can name, each behind
//! [`Kind`]: the hooks the passes call for it. The saved state of each is
//! a variant of [`FdKind`] (`model.rs`); what /proc says of it is parsed
//! by `procfs.rs`; the rest is here.
//!
//! | kind | module | kept from the template, or made anew at a restore |
//! |---|---|---|
//! | regular files, directories (layers, kept mounts, other mounts) | `file` | reopened by path (layers), kept (`/dev`, `/proc`), refused (other mounts) |
//! | deleted-but-open files | `deleted` | made anew (`O_TMPFILE`), contents copied |
//! | memfds | `memfd` | kept (the template holds them and their mappings), contents put back (`process::shared_memory`) |
//! | pty masters (`/dev/pts/ptmx`) | `pty` | made anew by the daemon (same index, settings, unread output), handed to their processes |
//! | terminal slaves (`/dev/pts/N`, `/dev/tty` of a pty) | `file` | the template holds an `O_PATH` of the node; opened again by path (pty made anew) or through that `O_PATH` (a session's) |
//! | pipes | `pipe` | the template holds an `O_PATH` of the inode; each end opened again through it, buffered bytes put back |
//! | FIFOs | `fifo` | reopened by path (layers) or kept; bytes put back |
//! | unix sockets | `unix` | kept; listeners and bound datagram sockets bound anew once; unnamed pairs and connections through listeners made anew; handed between processes; queued data sent again |
//! | files in flight on unix sockets (`SCM_RIGHTS`) | `in_flight` | given to the template as descriptors, made by their kinds, sent again with their messages |
//! | inet sockets | `inet` | listeners and bound datagram sockets made anew |
//! | TCP connections | `tcp` | made anew in repair mode: sequence numbers, queued bytes, windows, options |
//! | other sockets (netlink, ...) | `other_socket` | kept |
//! | eventfd | `eventfd` | kept; counter put back |
//! | timerfd | `timerfd` | kept; setting put back |
//! | signalfd | `signalfd` | kept; mask set again |
//! | epoll | `epoll` | kept; watch list set again |
//! | inotify | `inotify` | made anew, watches added again |
//! | pidfd | `pidfd` | kept |
//! | other anonymous inodes (io_uring, fanotify, ...) | `anon` | refused |
//!
//! The hooks, in the order of a checkpoint and a restore:
//! - [`Kind::check`] (pass 2): restorable, or the reason it is refused;
//! - [`Kind::cannot_move`] (a layered checkpoint's step 1): why a process
//!   holding it cannot move to a new tree;
//! - [`Kind::reopen`], [`Kind::remake`], [`Kind::configure`],
//!   [`Kind::link`]: the restore's fix-up, in that order over every
//!   descriptor (see [`fix_up_descriptors`]).
//!
//! Which descriptors a template closes at its set-up (the ones made anew)
//! is [`FdKind::recreated`] (a pipe end becomes an `O_PATH` descriptor
//! instead, a memfd stays). The contents of shared objects (pipe bytes,
//! socket queues, eventfd counters, timerfd settings) are captured in pass
//! 1 and put back before the processes are cloned: each kind's module has
//! its functions, called by `checkpoint/` and [`put_back_shared`].
//!
//! Adding a kind: its variant in [`FdKind`], a module here with a unit
//! struct implementing [`Kind`], its line in [`of`] (and in
//! [`REMAKE_ORDER`] if it is made anew one call at a time), a workload case.

mod anon;
mod datagrams;
mod deleted;
mod epoll;
mod eventfd;
mod fifo;
mod file;
mod hand_over;
mod in_flight;
mod inet;
mod inotify;
mod memfd;
mod other_socket;
mod pidfd;
mod pipe;
mod pty;
mod signalfd;
mod tcp;
mod timerfd;
mod udp;
mod unix;
mod unix_datagrams;

use std::collections::HashMap;
use std::os::fd::OwnedFd;

use crate::batch::write_path;
use crate::batch::{Arg, Batch};
use crate::inject::Tracee;
use crate::model::{FdImage, FdKind, ProcessImage};
use crate::template::CheckpointTemplates;
use crate::{HostPid, Result};

pub(crate) use deleted::capture_contents;
pub(crate) use file::share_open_files;
pub(crate) use hand_over::{Handed, give as give_descriptors};
pub(crate) use in_flight::{any as in_flight_any, give_to_template as give_in_flight, send_again as send_in_flight};
pub(crate) use inotify::shared_with as inotify_shared_with;
pub(crate) use pipe::capture as capture_pipe;
pub use tcp::{SANDBOX_ADDRESS, reset_outside_connections};
pub(crate) use tcp::{capture as capture_tcp, finish as finish_connections, reset_outside};
pub(crate) use udp::{capture as capture_udp, send_again as send_datagrams_again};
pub(crate) use unix::capture_queue as capture_unix_queue;
pub(crate) use unix::restore_order;
pub(crate) use unix_datagrams::{capture as capture_unix_datagrams, send_again as send_unix_datagrams_again};

/// The hooks of one kind of kernel object (see the module docs). Each has
/// a default that does nothing: a kind implements what concerns it.
pub(crate) trait Kind: Sync {
    /// Pass 2: `Err(reason)` when a descriptor of this kind cannot be
    /// restored exactly.
    fn check(&self, _f: &FdImage, _p: &ProcessImage) -> std::result::Result<(), String> {
        Ok(())
    }

    /// A layered checkpoint: why a process holding it cannot move to a new
    /// tree (`None`: it can, as it is or reopened by path).
    fn cannot_move(&self, _f: &FdImage) -> Option<&'static str> {
        None
    }

    /// Restore, step 1 (batched with every kind's): open it again in the
    /// restored process, onto its number. Returns whether it added calls.
    fn reopen(&self, _f: &FdImage, _b: &mut Batch, _handed: &Handed) -> bool {
        false
    }

    /// Restore, step 2 (one call at a time, kind by kind in
    /// [`REMAKE_ORDER`]): make it anew in the restored process.
    fn remake(&self, _f: &FdImage, _cx: &mut Remake<'_>) -> Result<()> {
        Ok(())
    }

    /// After step 2 for every descriptor of this kind.
    fn remade_all(&self, _cx: &mut Remake<'_>) -> Result<()> {
        Ok(())
    }

    /// Restore, step 4 (batched), once every descriptor exists again (dups
    /// are step 3): set what it holds of the process. Returns whether it
    /// added calls.
    fn configure(&self, _f: &FdImage, _b: &mut Batch) -> bool {
        false
    }

    /// Restore, step 5: what names other descriptors (an epoll's watches).
    fn link(&self, _f: &FdImage, _cx: &mut Remake<'_>) -> Result<()> {
        Ok(())
    }
}

/// What a kind's restore works in: the restored process, its scratch
/// area, its image, its template.
pub(crate) struct Remake<'a> {
    /// The restored process, stopped.
    pub p: &'a mut Tracee,
    /// Its scratch mapping (pointer arguments go there).
    pub scratch: u64,
    /// Its batch (for kinds that batch a call or two).
    pub batch: &'a mut Batch,
    /// Its image.
    pub image: &'a ProcessImage,
    /// Its template (host pid): the objects it still shares.
    pub template: HostPid,
    /// What the restore made to give to several processes
    /// (`hand_over.rs`).
    pub handed: &'a mut Handed,
    /// Of those, what this process made and placed: (key, descriptor).
    pub placed: Vec<(hand_over::Key, i32)>,
    /// Of those, what this process holds that another made: (key,
    /// descriptor, flags), handed over once all are known.
    pub wanted: Vec<(hand_over::Key, i32, u32)>,
}

impl<'a> Remake<'a> {
    /// One for restored process `p`, nothing made in it yet.
    fn new(
        p: &'a mut Tracee,
        batch: &'a mut Batch,
        image: &'a ProcessImage,
        (scratch, template): (u64, HostPid),
        handed: &'a mut Handed,
    ) -> Remake<'a> {
        Remake { p, scratch, batch, image, template, handed, placed: Vec::new(), wanted: Vec::new() }
    }

    /// The contents captured for descriptor `fd` (deleted files).
    pub fn contents(&self, fd: i32) -> Option<std::sync::Arc<crate::fdstate::SparseCopy>> {
        self.image.ghosts.iter().find(|(g, _)| *g == fd).map(|(_, c)| c.clone())
    }
}

/// The kinds made anew one call at a time, in this order: deleted files,
/// pipe ends the daemon opens (handed over), unix listeners and socket pairs, TCP connections, pty masters, terminals of
/// sessions closed since the checkpoint (handed over), then inotify
/// instances (after the other
/// descriptors, whose making would show as events), pidfds.
const REMAKE_ORDER: [&dyn Kind; 9] = [
    &deleted::Deleted,
    &pipe::Pipe,
    &unix::Unix,
    &inet::Inet,
    &tcp::Tcp,
    &pty::PtyMaster,
    &file::PathFile,
    &inotify::Inotify,
    &pidfd::Pidfd,
];

/// The kind of a descriptor.
pub(crate) fn of(kind: &FdKind) -> &'static dyn Kind {
    match kind {
        FdKind::LayerFile { .. } | FdKind::KeptFile { .. } | FdKind::ShmFile { .. } | FdKind::OtherMount { .. } => {
            &file::PathFile
        }
        FdKind::Deleted { .. } => &deleted::Deleted,
        FdKind::Memfd { .. } => &memfd::Memfd,
        FdKind::Pipe { .. } => &pipe::Pipe,
        FdKind::PtyMaster { .. } => &pty::PtyMaster,
        FdKind::Fifo { .. } => &fifo::Fifo,
        FdKind::Socket { family, .. } if family == "unix" => &unix::Unix,
        FdKind::Socket { tcp: Some(_), .. } => &tcp::Tcp,
        FdKind::Socket { family, .. } if family.starts_with("inet") => &inet::Inet,
        FdKind::Socket { .. } => &other_socket::OtherSocket,
        FdKind::AnonInode { what, .. } => match what.as_str() {
            "eventfd" => &eventfd::Eventfd,
            "timerfd" => &timerfd::Timerfd,
            "signalfd" => &signalfd::Signalfd,
            "eventpoll" => &epoll::Epoll,
            "inotify" => &inotify::Inotify,
            "pidfd" => &pidfd::Pidfd,
            _ => &anon::OtherAnon,
        },
    }
}

/// Pass 2's check of every descriptor of process `p`: the first refused,
/// as (resource, reason).
pub(crate) fn check(p: &ProcessImage) -> std::result::Result<(), (String, String)> {
    for f in &p.fds {
        let name = || match f.in_flight {
            true => format!("a file in flight on a unix socket (fd {} of its template)", f.fd),
            false => format!("fd {}", f.fd),
        };
        if let Some(why) = f.in_flight.then(|| in_flight::refusal(f)).flatten() {
            return Err((name(), why));
        }
        of(&f.kind).check(f, p).map_err(|why| (name(), why))?;
    }
    Ok(())
}

/// The restore's fix-up of every descriptor of `image`, in the restored
/// process `p` (after its `chdir`, which is in `b` already): files and
/// inet sockets reopened in one batch, then what is made anew one call at a
/// time, the dups, the batched configuration, the links.
pub(crate) fn fix_up_descriptors(
    p: &mut Tracee,
    b: &mut Batch,
    image: &ProcessImage,
    (scratch, template): (u64, HostPid),
    handed: &mut Handed,
) -> Result<()> {
    for f in image.fds.iter().filter(|f| f.same_as.is_none()) {
        if of(&f.kind).reopen(f, b, handed) && b.is_full() {
            p.run_batch(b)?;
        }
    }
    p.run_batch(b)?;
    let mut cx = Remake::new(p, b, image, (scratch, template), handed);
    for kind in REMAKE_ORDER {
        for f in &image.fds {
            if std::ptr::addr_eq(of(&f.kind), kind) {
                kind.remake(f, &mut cx)?;
            }
        }
        kind.remade_all(&mut cx)?;
    }
    hand_over::hand_over(&mut cx)?;
    let Remake { p, batch: b, handed, .. } = cx;
    // Dups of descriptors made anew: the same open file again (one offset).
    for f in &image.fds {
        if let Some(src) = f.same_as {
            let cloexec = (f.flags & libc::O_CLOEXEC as u32) as u64;
            b.call("dup3 (dup)", libc::SYS_dup3, &[Arg::Val(src as u64), Arg::Val(f.fd as u64), Arg::Val(cloexec)]);
        }
    }
    for f in &image.fds {
        if of(&f.kind).configure(f, b) && b.is_full() {
            p.run_batch(b)?;
        }
    }
    p.run_batch(b)?;
    let mut cx = Remake::new(p, b, image, (scratch, template), handed);
    for f in &image.fds {
        of(&f.kind).link(f, &mut cx)?;
    }
    in_flight::lift(cx.p, image, cx.handed)
}

/// Pass 2, once every template is made: the first of `images` holding a
/// connection a restore could not make again, as (index, resource,
/// reason): a TCP connection without its other end (`tcp.rs`), a unix
/// connection through a listener (`unix.rs`).
pub(crate) fn connection_refusal(images: &[&ProcessImage]) -> Option<(usize, String, String)> {
    tcp::peerless(images)
        .or_else(|| unix::connection_refusal(images))
        .or_else(|| unix_datagrams::sender_refusal(images))
}

/// What a restore holds open while the processes come back: keepers of
/// the pipes (see `pipe.rs`), closed once every process is back, before
/// any runs; keepers of the FIFOs on the layers, by path (see `fifo.rs`),
/// closed once they run.
pub(crate) struct Keepers {
    pub pipes: Vec<OwnedFd>,
    pub fifos: HashMap<String, OwnedFd>,
}

/// Before any process is cloned at a restore: the state of the objects the
/// templates share with the killed originals goes back (eventfd counters,
/// timerfd settings; unix socket queues drained, then filled again by
/// their peers, and the UDP sockets kept drained (`udp.rs` sends their
/// datagrams again once every process is back); shared memory's contents), the pipes are opened again and filled (their keepers
/// returned), the ptys whose masters processes held are made anew (in
/// `handed`). First, the sockets still holding the TCP connections made
/// anew are aborted (`tcp.rs`).
pub(crate) fn put_back_shared(set: &CheckpointTemplates, handed: &mut Handed) -> Result<Keepers> {
    tcp::destroy_old(set)?;
    pty::make_all(set, handed)?;
    pty::hung_up_in_place_of_gone(set, handed)?;
    let fifos = fifo::open_keepers(set)?;
    let pipes = pipe::put_back(set, &fifos)?;
    crate::process::shared_memory::put_back(&set.shared_memory)?;
    for t in &set.templates {
        for f in &t.image.fds {
            unix::drain(t.host, f)?;
            udp::drain(t.host, f)?;
            eventfd::put_back(t.host, f)?;
            timerfd::put_back(t.host, f)?;
        }
    }
    // After every drain.
    unix::put_back_queues(set)?;
    Ok(Keepers { pipes, fifos })
}

/// A path on the kept `/proc` or `/dev` (mounts a rollback keeps).
pub(crate) fn kept_path(path: &str) -> bool {
    ["/proc", "/dev"].iter().any(|k| path == *k || path.starts_with(&format!("{k}/")))
}

/// Open the unnamed file on descriptor `tmp` again with `f`'s flags (its
/// access mode included) at `f`'s offset, on `f`'s number (closing `tmp`
/// first if `close_tmp`).
pub(crate) fn reopen_unnamed(
    p: &mut Tracee,
    scratch: u64,
    f: &crate::model::FdImage,
    tmp: u64,
    close_tmp: bool,
) -> Result<()> {
    // An O_TMPFILE keeps O_TMPFILE (which includes O_DIRECTORY) in its
    // flags; O_NOFOLLOW would refuse the /proc/self/fd magic link.
    let strip =
        (libc::O_CREAT | libc::O_EXCL | libc::O_TRUNC | libc::O_NOCTTY | libc::O_TMPFILE | libc::O_NOFOLLOW) as u32;
    let again = write_path(p.tid, scratch, &format!("/proc/self/fd/{tmp}"))?;
    let fd = p.call("open (unnamed file)", libc::SYS_open, &[again, (f.flags & !strip) as u64, 0])?;
    if close_tmp {
        p.call("close", libc::SYS_close, &[tmp])?;
    }
    if f.pos > 0 {
        p.call("lseek", libc::SYS_lseek, &[fd, f.pos, libc::SEEK_SET as u64])?;
    }
    move_fd(p, fd, f.fd, f.flags)
}

/// Put descriptor `new` (opened with the flags `flags`, close-on-exec
/// included) on number `fd`.
pub(crate) fn move_fd(p: &mut Tracee, new: u64, fd: i32, flags: u32) -> Result<()> {
    if new == fd as u64 {
        return Ok(());
    }
    let cloexec = (flags & libc::O_CLOEXEC as u32) as u64;
    p.call("dup3", libc::SYS_dup3, &[new, fd as u64, cloexec])?;
    p.call("close", libc::SYS_close, &[new])?;
    Ok(())
}

/// [`move_fd`] for a descriptor made by a call that does not take the
/// close-on-exec flag, or always sets it (`memfd_create`, `pidfd_open`):
/// when `new` is already number `fd`, no `dup3` sets the flag, so it is
/// set to `flags`' there.
pub(crate) fn move_fd_setting_cloexec(p: &mut Tracee, new: u64, fd: i32, flags: u32) -> Result<()> {
    if new != fd as u64 {
        return move_fd(p, new, fd, flags);
    }
    let cloexec = if flags & libc::O_CLOEXEC as u32 != 0 { libc::FD_CLOEXEC as u64 } else { 0 };
    p.call("fcntl(F_SETFD)", libc::SYS_fcntl, &[fd as u64, libc::F_SETFD as u64, cloexec]).map(drop)
}

/// `socket()` type bits for a socket that had the open flags `flags`.
pub(crate) fn socket_type(kind: i32, flags: u32) -> u64 {
    let mut ty = kind as u64;
    if flags & libc::O_NONBLOCK as u32 != 0 {
        ty |= libc::SOCK_NONBLOCK as u64;
    }
    if flags & libc::O_CLOEXEC as u32 != 0 {
        ty |= libc::SOCK_CLOEXEC as u64;
    }
    ty
}
