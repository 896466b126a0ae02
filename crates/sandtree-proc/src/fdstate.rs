//! State that lives inside kernel objects a template shares with its
//! running original, and so must be saved at the checkpoint and put back at
//! the restore: a pipe's buffered bytes, an eventfd's counter, a timerfd's
//! setting. (Files, cwd and the like are reopened instead; sockets,
//! signalfds and epolls are kept as they are.)
//!
//! Pipes and FIFOs: at the checkpoint (originals stopped) the daemon opens
//! the pipe through `/proc/<pid>/fd/<n>` for reading and `tee`s its bytes
//! into a pipe of its own (a copy that consumes nothing), once per pipe
//! inode. At the restore it opens the pipe through a template, drains it
//! and writes the saved bytes back. A FIFO on a layer is a new inode in the
//! rolled-back tree: the daemon opens it there by path, read-write (a
//! *keeper*, so that the restored processes' own opens of it do not wait for
//! a peer), and writes the bytes into it.
//!
//! eventfd and timerfd: their fdinfo holds the state (`eventfd-count`,
//! `it_value`/`it_interval`); at the restore a duplicate taken with
//! `pidfd_getfd` from the template is drained and refilled, or re-armed.

use std::io::{self, Write};
use std::os::fd::OwnedFd;
use std::os::unix::fs::FileExt;

use rustix::fs::{Mode, OFlags};
use rustix::io::Errno;

use crate::model::AnonState;

/// A duplicate of descriptor `fd` of process `host` (`pidfd_getfd`): the
/// same open file, not a new open of it.
fn dup_from(host: i32, fd: i32) -> io::Result<OwnedFd> {
    let pid = rustix::process::Pid::from_raw(host).ok_or_else(|| io::Error::other("bad pid"))?;
    let pidfd = rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty())?;
    Ok(rustix::process::pidfd_getfd(&pidfd, fd, rustix::process::PidfdGetfdFlags::empty())?)
}

fn open_proc_fd(host: i32, fd: i32, flags: OFlags) -> io::Result<OwnedFd> {
    Ok(rustix::fs::open(format!("/proc/{host}/fd/{fd}"), flags | OFlags::NONBLOCK | OFlags::CLOEXEC, Mode::empty())?)
}

/// The bytes buffered in the pipe that `fd` of process `host` refers to,
/// without consuming them, and the pipe's capacity.
pub fn capture_pipe(host: i32, fd: i32) -> io::Result<(Vec<u8>, usize)> {
    let src = open_proc_fd(host, fd, OFlags::RDONLY)?;
    let size = rustix::pipe::fcntl_getpipe_size(&src)?;
    let (copy_r, copy_w) =
        rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC | rustix::pipe::PipeFlags::NONBLOCK)?;
    rustix::pipe::fcntl_setpipe_size(&copy_w, size)?;
    let n = match rustix::pipe::tee(&src, &copy_w, size, rustix::pipe::SpliceFlags::NONBLOCK) {
        Ok(n) => n,
        Err(Errno::AGAIN) => 0,
        Err(e) => return Err(e.into()),
    };
    let mut out = vec![0u8; n];
    let mut got = 0;
    while got < n {
        match rustix::io::read(&copy_r, &mut out[got..]) {
            Ok(0) => break,
            Ok(k) => got += k,
            Err(Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
    out.truncate(got);
    Ok((out, size))
}

/// Make the pipe behind `fd` of `host` hold exactly `bytes`.
pub fn restore_pipe(host: i32, fd: i32, bytes: &[u8]) -> io::Result<()> {
    let rd = open_proc_fd(host, fd, OFlags::RDONLY)?;
    drain(&rd)?;
    if bytes.is_empty() {
        return Ok(());
    }
    // `rd` stays open: a FIFO refuses a non-blocking writer without a reader.
    let mut wr = std::fs::File::from(open_proc_fd(host, fd, OFlags::WRONLY)?);
    wr.write_all(bytes)
}

/// Read and drop whatever the (non-blocking) pipe `rd` holds.
fn drain(rd: &OwnedFd) -> io::Result<()> {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match rustix::io::read(rd, &mut buf) {
            Ok(0) | Err(Errno::AGAIN) => return Ok(()),
            Ok(_) | Err(Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
}

/// The root of process `host`'s tree (`/proc/<host>/root`), to open
/// paths of the sandbox in with [`open_in`].
pub fn tree_root(host: i32) -> io::Result<OwnedFd> {
    Ok(rustix::fs::open(
        format!("/proc/{host}/root"),
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )?)
}

/// Open sandbox path `path` under `root` ([`tree_root`]) with `flags`
/// (close-on-exec added). It resolves inside that tree only
/// (`RESOLVE_IN_ROOT`, no magic links): a symlink of the sandbox's cannot
/// lead the daemon out of it.
pub fn open_in(root: &OwnedFd, path: &str, flags: OFlags) -> io::Result<OwnedFd> {
    Ok(rustix::fs::openat2(
        root,
        path.trim_start_matches('/'),
        flags | OFlags::CLOEXEC,
        Mode::empty(),
        rustix::fs::ResolveFlags::IN_ROOT | rustix::fs::ResolveFlags::NO_MAGICLINKS,
    )?)
}

/// Open the named pipe at `path` in the tree of process `host` for
/// reading and writing, without blocking (a FIFO's keeper at a restore).
/// The path resolves inside that tree only (`RESOLVE_IN_ROOT`): a symlink
/// of the sandbox's cannot lead the daemon out of it.
pub fn open_fifo(host: i32, path: &str) -> io::Result<OwnedFd> {
    let fd = open_in(&tree_root(host)?, path, OFlags::RDWR | OFlags::NONBLOCK | OFlags::NOFOLLOW)?;
    if rustix::fs::fstat(&fd)?.st_mode & libc::S_IFMT != libc::S_IFIFO {
        return Err(io::Error::other(format!("{path} is not a named pipe in the rolled-back tree")));
    }
    Ok(fd)
}

/// Make the pipe behind `keeper` (open for reading and writing) hold
/// exactly `bytes`, with capacity `size` (at least).
pub fn fill_pipe(keeper: &OwnedFd, bytes: &[u8], size: usize) -> io::Result<()> {
    drain(keeper)?;
    let now = rustix::pipe::fcntl_getpipe_size(keeper)?;
    // (0: not known; only room for the bytes is needed then.)
    let want = if size == 0 { now.max(bytes.len()) } else { size.max(bytes.len()) };
    if want != now {
        rustix::pipe::fcntl_setpipe_size(keeper, want)?;
    }
    std::fs::File::from(keeper.try_clone()?).write_all(bytes)
}

/// The contents of a deleted-but-open file (fd `fd` of `host`), read
/// without moving its offset.
pub fn capture_ghost(host: i32, fd: i32, size: u64) -> io::Result<Vec<u8>> {
    let f = open_proc_fd(host, fd, OFlags::RDONLY)?;
    let mut out = vec![0u8; size as usize];
    let mut got = 0;
    while got < out.len() {
        match rustix::io::pread(&f, &mut out[got..], got as u64) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
    out.truncate(got);
    Ok(out)
}

/// Write `bytes` into the file behind fd `fd` of `host` (a fresh
/// `O_TMPFILE` of a restored process).
pub fn fill_file(host: i32, fd: i32, bytes: &[u8]) -> io::Result<()> {
    std::fs::File::from(open_proc_fd(host, fd, OFlags::WRONLY)?).write_all_at(bytes, 0)
}

/// Drop whatever is queued for reading on the socket behind `fd` of `host`.
pub fn drain_socket(host: i32, fd: i32) -> io::Result<()> {
    let sock = dup_from(host, fd)?;
    let mut buf = vec![0u8; 64 * 1024];
    for _ in 0..4096 {
        match rustix::net::recv(&sock, &mut buf[..], rustix::net::RecvFlags::DONTWAIT) {
            Ok((0, _)) | Err(Errno::AGAIN) => return Ok(()),
            Ok(_) | Err(Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Err(io::Error::other("socket does not drain"))
}

/// What is queued for reading on unix socket `sock`, without consuming
/// it (`MSG_PEEK`): a stream socket's bytes as one piece, a datagram or
/// seqpacket socket's messages one by one (peeked from `SO_PEEK_OFF` 0
/// on, which each peek moves past the message; the socket's own offset is
/// put back). An error if descriptors are in flight with them, or if a
/// stream's bytes cannot be read in one piece (from several writers).
pub fn socket_messages(sock: &OwnedFd, stream: bool) -> io::Result<Vec<Vec<u8>>> {
    let peek = |buf: &mut [u8]| -> io::Result<(usize, bool)> {
        let mut space = [std::mem::MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(253))];
        let mut control = rustix::net::RecvAncillaryBuffer::new(&mut space);
        let flags = rustix::net::RecvFlags::PEEK | rustix::net::RecvFlags::DONTWAIT | rustix::net::RecvFlags::TRUNC;
        let got = rustix::net::recvmsg(sock, &mut [io::IoSliceMut::new(buf)], &mut control, flags)?;
        // Descriptors passed with the bytes were installed here by the
        // peek: dropping them closes our copies.
        if control.drain().any(|m| matches!(m, rustix::net::RecvAncillaryMessage::ScmRights(_))) {
            return Err(io::Error::other("descriptors are in flight with the bytes"));
        }
        Ok((got.bytes, got.flags.contains(rustix::net::ReturnFlags::TRUNC)))
    };
    let saved = sandtree_sys::sockopt::peek_offset(sock)?;
    if stream {
        // A peek starts at (and moves) the socket's own offset, if set.
        if saved >= 0 {
            sandtree_sys::sockopt::set_peek_offset(sock, 0)?;
        }
        let n = rustix::io::ioctl_fionread(sock)? as usize;
        let mut buf = vec![0u8; n.max(1)];
        let peeked = peek(&mut buf);
        if saved >= 0 {
            sandtree_sys::sockopt::set_peek_offset(sock, saved)?;
        }
        let (got, _) = peeked?;
        if got != n {
            return Err(io::Error::other(format!("{got} of {n} queued bytes could be read in one piece")));
        }
        buf.truncate(n);
        return Ok(vec![buf]);
    }
    sandtree_sys::sockopt::set_peek_offset(sock, 0)?;
    let mut out = Vec::new();
    let mut buf = vec![0u8; 256 * 1024];
    let peeked = loop {
        match peek(&mut buf) {
            Ok((_, true)) => break Err(io::Error::other("a queued message is larger than 256 KiB")),
            Ok((n, false)) if out.len() < 4096 => out.push(buf[..n].to_vec()),
            Ok(_) => break Err(io::Error::other("more than 4096 messages queued")),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break Ok(out),
            Err(e) => break Err(e),
        }
    };
    sandtree_sys::sockopt::set_peek_offset(sock, saved)?;
    peeked
}

/// What is queued on unix socket `fd` of `host` ([`socket_messages`]), and
/// whether it is a byte stream.
pub fn capture_socket(host: i32, fd: i32) -> io::Result<(Vec<Vec<u8>>, bool)> {
    let sock = dup_from(host, fd)?;
    let stream = rustix::net::sockopt::socket_type(&sock)? == rustix::net::SocketType::STREAM;
    Ok((socket_messages(&sock, stream)?, stream))
}

/// Queue `messages` again on the peer of socket `fd` of `host`, by sending
/// them from that socket (the restore drained the peer beforehand): a
/// stream's bytes in full, a datagram or seqpacket message per send.
pub fn fill_socket(host: i32, fd: i32, messages: &[Vec<u8>], stream: bool) -> io::Result<()> {
    let sock = dup_from(host, fd)?;
    let flags = rustix::net::SendFlags::DONTWAIT | rustix::net::SendFlags::NOSIGNAL;
    for m in messages {
        let mut sent = 0;
        loop {
            match rustix::net::send(&sock, &m[sent..], flags) {
                Ok(n) if stream => {
                    sent += n;
                    if sent >= m.len() {
                        break;
                    }
                }
                Ok(n) if n == m.len() => break,
                Ok(_) => return Err(io::Error::other("a message was cut")),
                Err(Errno::INTR) => {}
                Err(e) => return Err(e.into()),
            }
        }
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
pub fn fill_inotify(host: i32, fd: i32, watches: &[crate::model::InotifyWatch], flags: u32) -> io::Result<()> {
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
        let target = open_in(&root, &w.path, OFlags::PATH | follow)?;
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

/// Put `state` back into the object behind `fd` of `host` (a template).
pub fn restore_anon(host: i32, fd: i32, state: &AnonState) -> io::Result<()> {
    let obj = dup_from(host, fd)?;
    match *state {
        AnonState::Eventfd { count } => {
            // The status flags belong to the shared open file: set
            // O_NONBLOCK only while draining, then put them back.
            let flags = rustix::fs::fcntl_getfl(&obj)?;
            rustix::fs::fcntl_setfl(&obj, flags | OFlags::NONBLOCK)?;
            let mut buf = [0u8; 8];
            // A semaphore-mode eventfd gives 1 per read.
            let mut reads = 0u32;
            let drained = loop {
                match rustix::io::read(&obj, &mut buf) {
                    Ok(_) if reads < 1 << 20 => reads += 1,
                    Ok(_) => break Err(io::Error::other("eventfd does not drain")),
                    Err(Errno::AGAIN) => break Ok(()),
                    Err(Errno::INTR) => {}
                    Err(e) => break Err(e.into()),
                }
            };
            let written = match (drained.is_ok(), count) {
                (true, c) if c > 0 => rustix::io::write(&obj, &c.to_ne_bytes()).map(|_| ()).map_err(io::Error::from),
                _ => Ok(()),
            };
            rustix::fs::fcntl_setfl(&obj, flags)?;
            drained?;
            written
        }
        AnonState::Timerfd { value_ns, interval_ns, ticks, .. } => {
            let ts = |ns: u64| rustix::time::Timespec {
                tv_sec: (ns / 1_000_000_000) as i64,
                tv_nsec: (ns % 1_000_000_000) as i64,
            };
            let spec = rustix::time::Itimerspec { it_interval: ts(interval_ns), it_value: ts(value_ns) };
            rustix::time::timerfd_settime(&obj, rustix::time::TimerfdTimerFlags::empty(), &spec)?;
            if ticks > 0 {
                sandtree_sys::timerfd::set_ticks(&obj, ticks)?;
            }
            Ok(())
        }
        // Configuration held by the descriptor's owner, or an object made
        // anew: restored by syscalls injected into the restored process
        // (`restore.rs`).
        AnonState::Epoll { .. } | AnonState::Signalfd { .. } | AnonState::Inotify { .. } => Ok(()),
    }
}

/// Shared objects whose contents pass 1 captured already (from another
/// descriptor or process): pipes and FIFOs by (device, inode), unix
/// sockets by inode.
#[derive(Default)]
pub(crate) struct Seen {
    pipes: std::collections::HashSet<(u64, u64)>,
    sockets: std::collections::HashSet<u64>,
}

impl Seen {
    /// Whether pipe or FIFO `key` (device, inode) is seen here first.
    pub(crate) fn first_pipe(&mut self, key: (u64, u64)) -> bool {
        self.pipes.insert(key)
    }

    /// Whether unix socket `ino` is seen here first.
    pub(crate) fn first_socket(&mut self, ino: u64) -> bool {
        self.sockets.insert(ino)
    }
}
