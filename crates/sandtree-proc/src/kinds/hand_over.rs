//! Objects a restore makes once and gives to several restored processes:
//! the ends of unix socket pairs and connections, unix sockets bound to a
//! path (`unix.rs`), and pty masters (`pty.rs`).
//! The daemon keeps a copy of each ([`Handed`]), taken with `pidfd_getfd`
//! from the process that made it, or made by itself; a process that holds
//! one it did not make gets it by `SCM_RIGHTS` ([`hand_over`]): over a
//! datagram pair made in the process, one end of which the daemon takes,
//! then `recvmsg` in the process and each descriptor put on its number. The
//! copies close once every process is back, before any runs: the objects'
//! holders are the restored processes alone from then on.

use std::collections::HashMap;
use std::io;
use std::os::fd::OwnedFd;

use sandtree_sys::ptrace;

use super::{Remake, move_fd};
use crate::inject::Tracee;
use crate::model::{FdImage, FdKind, ProcessImage, SocketBuffer, UnixPair};
use crate::template::CheckpointTemplates;
use crate::{Error, HostPid, Result};

/// What a handed object is, at the checkpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Key {
    /// An end of a unix socket pair or connection, or a unix socket bound
    /// again, by inode.
    Socket(u64),
    /// A pty master, by index.
    Terminal(u32),
    /// A hung-up terminal's slave, in place of that of a session's terminal
    /// (by index) closed since the checkpoint.
    Slave(u32),
    /// A hung-up terminal's slave, in place of one hung up at the
    /// checkpoint already (by its index then: `FdKind::KeptFile`'s
    /// `hung_up`).
    HungUp(u32),
    /// A TCP connection made anew, by inode (`tcp.rs`).
    Tcp(u64),
    /// An end of a pipe the daemon opened for a process whose user may not
    /// (`pipe.rs`), by template (host pid) and descriptor.
    Opened(i32, i32),
    /// An open file several restored processes share
    /// (`FdImage::opened_by`), by the process that opens it again and its
    /// descriptor ([`share`]).
    Shared(crate::SandboxPid, i32),
}

/// The objects a restore made so far, and what the socket pairs' ends
/// held at the checkpoint.
#[derive(Default)]
pub(crate) struct Handed {
    /// Daemon copies of the objects made.
    pub ends: HashMap<Key, OwnedFd>,
    /// Each socket pair end's state, by inode.
    pub pair_states: HashMap<u64, UnixPair>,
    /// Data queued on a socket pair end at the checkpoint, by inode.
    pub pair_queued: HashMap<u64, SocketBuffer>,
    /// The unix connections made through listeners, to make again.
    pub connections: Vec<Connection>,
    /// The listeners bound again, by path: their inodes at the checkpoint
    /// (the daemon accepts those connections on its copies, in `ends`).
    pub listeners: HashMap<String, u64>,
    /// The process that binds each socket bound again ([`binder`]), by
    /// inode.
    pub binders: HashMap<u64, crate::SandboxPid>,
    /// The open files several processes share, by the process that opens
    /// it again and its descriptor (`FdImage::opened_by`): handed over to
    /// the others ([`share`]).
    pub shared: std::collections::HashSet<(crate::SandboxPid, i32)>,
    /// The TCP connections made anew, in repair mode until every process
    /// is back (`tcp::finish`): (inode, `SO_REUSEADDR`, the bytes never
    /// sent, which it sends then).
    pub repaired: Vec<(u64, bool, Vec<u8>)>,
    /// The peers made anew of TCP connections their peers had closed
    /// (`tcp.rs`), closed once every process is back.
    pub closing_peers: Vec<OwnedFd>,
    /// Connections to the outside made anew as resets (`tcp.rs`): the
    /// daemon's end that resets each once every process is back, the
    /// daemon's copy of the process's socket, and what to report.
    pub resetting: Vec<(OwnedFd, OwnedFd, String)>,
    /// Processes cloned ahead of their turn, to connect through a listener
    /// while the process that holds it is restored (see
    /// [`crate::kinds::restore_order`]), by pid.
    pub cloned_early: HashMap<crate::SandboxPid, crate::cloned::Cloned>,
    /// The new peers of unix socket pair ends whose peers had been
    /// released (`UnixPair::peer` 0): they sent the data again, and close
    /// with the restore's end (`kinds/unix.rs`).
    pub released_peers: Vec<OwnedFd>,
    /// Daemon copies of the files in flight on unix sockets, by the
    /// process whose image has them and their number there
    /// (`in_flight::lift`), sent again once every process is back.
    pub in_flight: HashMap<(crate::SandboxPid, i32), OwnedFd>,
    /// How a process that may not choose its pid (or thread id) gets it
    /// back ([`crate::LastPid`]). (Not handed over: the restore's means,
    /// kept here because every step of it has this at hand.)
    pub last_pid: Option<crate::LastPid>,
}

/// A unix connection made through a listener, as a restore makes it again.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Connection {
    /// The accepted end's inode.
    pub accepted: u64,
    /// The connecting end's inode.
    pub connecting: u64,
    /// The listener's path (as it was bound: maybe relative).
    pub path: String,
    /// Where the process that connects connects to: the listener's path,
    /// absolute (a relative one as found from its binder's working
    /// directory, `FdKind::Socket::bound_from`).
    pub connect_to: String,
    /// `SOCK_STREAM` or `SOCK_SEQPACKET`.
    pub sock_type: i32,
    /// The process that connects (see [`crate::model::Listened`]).
    pub connector: crate::SandboxPid,
    /// The process whose restore makes it: the one that binds its
    /// listener again ([`binder`]; `None`: no captured process holds one).
    pub maker: Option<crate::SandboxPid>,
}

/// The process among `images` that binds socket `ino` again at a restore
/// ([`FdKind::bound_again`]; the others that hold it get it handed over):
/// the one that listened on it if it holds it (clients' peer credentials
/// name it again), else the first that holds it.
pub(crate) fn binder(images: &[&ProcessImage], ino: u64) -> Option<crate::SandboxPid> {
    let mut holders = images.iter().filter_map(|i| {
        i.fds.iter().find_map(|f| match &f.kind {
            k @ FdKind::Socket { ino: n, listened_by, .. } if *n == ino && k.bound_again().is_some() => {
                Some((i.pid, *listened_by))
            }
            _ => None,
        })
    });
    let first = holders.next()?;
    let by = first.1;
    Some(std::iter::once(first).chain(holders).find(|(pid, _)| Some(*pid) == by).unwrap_or(first).0)
}

/// The inode of the listener among `images`' descriptors bound to `path`
/// with socket type `sock_type` (a connection's, made through it).
pub(crate) fn listener_of(images: &[&ProcessImage], path: &str, sock_type: i32) -> Option<u64> {
    let seq = sock_type == libc::SOCK_SEQPACKET;
    images.iter().flat_map(|i| &i.fds).find_map(|g| match &g.kind {
        FdKind::Socket { ino, listening: true, bound: Some(p), seqpacket, .. } if p == path && *seqpacket == seq => {
            Some(*ino)
        }
        _ => None,
    })
}

/// The absolute path of the listener bound to relative path `path` among
/// `images`' descriptors (found from its binder's working directory).
fn absolute_listener_path(images: &[&ProcessImage], path: &str) -> Option<String> {
    images.iter().flat_map(|i| &i.fds).find_map(|g| match &g.kind {
        FdKind::Socket { listening: true, bound: Some(p), bound_from: Some(from), .. } if p == path => {
            Some(from.to_string())
        }
        _ => None,
    })
}

impl Connection {
    /// The connections made through listeners among `images`' descriptors
    /// (one per accepted end whose connector is known).
    pub(crate) fn all_of(images: &[&ProcessImage]) -> Vec<Connection> {
        let mut out: Vec<Connection> = Vec::new();
        for f in images.iter().flat_map(|i| &i.fds) {
            if let FdKind::Socket { ino, pair: Some(pair), .. } = &f.kind
                && let Some(l) = &pair.through
                && let (true, Some(connector)) = (l.accepted, l.connector)
                && !out.iter().any(|c| c.accepted == *ino)
            {
                let maker = listener_of(images, &l.path, pair.sock_type).and_then(|ino| binder(images, ino));
                let connect_to = match l.path.starts_with('/') || l.path.starts_with('@') {
                    true => l.path.clone(),
                    false => absolute_listener_path(images, &l.path).unwrap_or_else(|| l.path.clone()),
                };
                out.push(Connection {
                    accepted: *ino,
                    connecting: pair.peer,
                    path: l.path.clone(),
                    connect_to,
                    sock_type: pair.sock_type,
                    connector,
                    maker,
                });
            }
        }
        out
    }
}

impl Handed {
    /// Whether the terminal `/dev/pts/<index>` of a session was closed
    /// since the checkpoint (a hung-up one is handed over in its place).
    pub(crate) fn hung_up(&self, index: u32) -> bool {
        self.ends.contains_key(&Key::Slave(index))
    }

    /// For the restore of `set`'s processes.
    pub(crate) fn of(set: &CheckpointTemplates) -> Handed {
        let pair_states = set
            .templates
            .iter()
            .flat_map(|t| &t.image.fds)
            .filter_map(|f| match &f.kind {
                FdKind::Socket { ino, pair: Some(pair), .. } => Some((*ino, pair.clone())),
                _ => None,
            })
            .collect();
        let pair_queued = set.pair_data.iter().map(|b| (b.ino, b.clone())).collect();
        let images: Vec<&ProcessImage> = set.templates.iter().map(|t| &t.image).collect();
        let connections = Connection::all_of(&images);
        let binders = images
            .iter()
            .flat_map(|i| &i.fds)
            .filter_map(|f| f.kind.bound_again())
            .filter_map(|ino| Some((ino, binder(&images, ino)?)))
            .collect();
        let shared = images.iter().flat_map(|i| &i.fds).filter_map(|f| f.opened_by).collect();
        Handed {
            shared,
            ends: HashMap::new(),
            pair_states,
            pair_queued,
            connections,
            listeners: HashMap::new(),
            binders,
            repaired: Vec::new(),
            closing_peers: Vec::new(),
            resetting: Vec::new(),
            cloned_early: HashMap::new(),
            in_flight: HashMap::new(),
            released_peers: Vec::new(),
            last_pid: None,
        }
    }
}

/// Put descriptor `new` of `p` on number `fd` with `flags`' close-on-exec
/// and non-blocking flags.
pub(crate) fn place(p: &mut Tracee, new: u64, fd: i32, flags: u32) -> Result<()> {
    move_fd(p, new, fd, flags)?;
    if flags & libc::O_NONBLOCK as u32 != 0 {
        let args = [fd as u64, libc::F_SETFL as u64, libc::O_NONBLOCK as u64];
        p.call("fcntl(F_SETFL) (handed over)", libc::SYS_fcntl, &args)?;
    }
    Ok(())
}

/// Descriptor `at` of `p` again on number `fd` (a dup: the same open
/// file), with `flags`' close-on-exec.
pub(crate) fn dup_onto(p: &mut Tracee, at: i32, fd: i32, flags: u32) -> Result<()> {
    let cloexec = (flags & libc::O_CLOEXEC as u32) as u64;
    p.call("dup3 (same open file)", libc::SYS_dup3, &[at as u64, fd as u64, cloexec]).map(drop)
}

/// Whether object `key` of descriptor `f` was made already: by this
/// process (then `f` is a dup of the descriptor it was placed on), or by
/// another (then it is wanted, handed over later).
pub(crate) fn made_already(cx: &mut Remake<'_>, key: Key, f: &FdImage) -> Result<bool> {
    if let Some(&(_, at)) = cx.placed.iter().find(|(k, _)| *k == key) {
        if at != f.fd {
            dup_onto(cx.p, at, f.fd, f.flags)?;
        }
        return Ok(true);
    }
    if cx.handed.ends.contains_key(&key) {
        cx.wanted.push((key, f.fd, f.flags));
        return Ok(true);
    }
    Ok(false)
}

/// A `socketpair` of type `ty` (close-on-exec) made in `p`, its two
/// descriptors written at `area` of its memory first.
pub(crate) fn socketpair_in(p: &mut Tracee, area: u64, ty: i32) -> Result<(u64, u64)> {
    let pid = p.tid;
    let ty = (ty | libc::SOCK_CLOEXEC) as u64;
    p.call("socketpair", libc::SYS_socketpair, &[libc::AF_UNIX as u64, ty, 0, area])?;
    let mut two = [0u8; 8];
    ptrace::read_mem(pid.raw(), area, &mut two).map_err(Error::ptrace(pid, "read socketpair"))?;
    let fd = |b: &[u8]| i32::from_ne_bytes(b.try_into().unwrap_or_default()) as u64;
    Ok((fd(&two[..4]), fd(&two[4..])))
}

/// At the restore of `f`, a descriptor of `cx.p` (step 2, once the batch
/// of step 1 reopened what it could): an open file several processes share
/// (`FdImage::opened_by`, `kinds/file.rs`'s `share_open_files`). The one
/// that opened or bound it again lends the daemon a copy; the others are
/// handed that copy ([`hand_over`]), whatever their credentials (one that
/// dropped its privileges may not take it from the other itself).
/// Whether `f` is one the others hand over (not reopened by its kind).
pub(crate) fn share(f: &FdImage, cx: &mut Remake<'_>) -> Result<bool> {
    if f.same_as.is_some() {
        return Ok(false);
    }
    if let Some((pid, fd)) = f.opened_by {
        cx.wanted.push((Key::Shared(pid, fd), f.fd, f.flags));
        return Ok(true);
    }
    let own = (cx.image.pid, f.fd);
    if cx.handed.shared.contains(&own) {
        let pid = cx.p.tid;
        let copy =
            take_copy(pid, f.fd).map_err(|e| Error::Proc { pid, what: "a copy of a shared open file", source: e })?;
        cx.handed.ends.insert(Key::Shared(own.0, own.1), copy);
    }
    Ok(false)
}

/// A copy of descriptor `fd` of process `pid`, for the daemon.
pub(crate) fn take_copy(pid: HostPid, fd: i32) -> io::Result<OwnedFd> {
    let pidfd = rustix::process::pidfd_open(
        rustix::process::Pid::from_raw(pid.raw()).ok_or_else(|| io::Error::other("pid 0"))?,
        rustix::process::PidfdFlags::empty(),
    )?;
    Ok(rustix::process::pidfd_getfd(&pidfd, fd, rustix::process::PidfdGetfdFlags::empty())?)
}

/// The objects restored process `cx.p` holds that others made
/// (`cx.wanted`): sent by the daemon (see the module docs), then put on
/// their numbers (a second descriptor of one: a dup).
pub(crate) fn hand_over(cx: &mut Remake<'_>) -> Result<()> {
    let wanted = std::mem::take(&mut cx.wanted);
    if wanted.is_empty() {
        return Ok(());
    }
    let mut first: Vec<(Key, i32, u32)> = Vec::new();
    let mut dups: Vec<(i32, i32, u32)> = Vec::new();
    for (ino, fd, flags) in wanted {
        match first.iter().find(|(i, ..)| *i == ino) {
            Some(&(_, at, _)) => dups.push((at, fd, flags)),
            None => first.push((ino, fd, flags)),
        }
    }
    let keys: Vec<Key> = first.iter().map(|(key, ..)| *key).collect();
    let fds: Vec<std::os::fd::BorrowedFd<'_>> =
        keys.iter().filter_map(|key| cx.handed.ends.get(key).map(std::os::fd::AsFd::as_fd)).collect();
    let p = &mut *cx.p;
    if fds.len() != keys.len() {
        let source = io::Error::other("one was not made");
        return Err(Error::Proc { pid: p.tid, what: "handed-over descriptors", source });
    }
    let numbers: Vec<i32> = cx.image.fds.iter().map(|f| f.fd).collect();
    let got = give(p, cx.scratch + 1024, &fds, &numbers)?;
    for (tmp, &(_, fd, flags)) in got.into_iter().zip(&first) {
        place(p, tmp, fd, flags)?;
    }
    for (at, fd, flags) in dups {
        dup_onto(p, at, fd, flags)?;
    }
    Ok(())
}

/// Descriptors `fds` of the daemon sent to process `p` (see the module
/// docs; `area`: 1 KiB of its memory to use), their numbers there
/// returned, none of `numbers` ([`clear_of_numbers`]).
pub(crate) fn give(
    p: &mut Tracee,
    area: u64,
    fds: &[std::os::fd::BorrowedFd<'_>],
    numbers: &[i32],
) -> Result<Vec<u64>> {
    let pid = p.tid;
    let (ours, theirs) = socketpair_in(p, area, libc::SOCK_DGRAM)?;
    let [ours] = clear_of_numbers(p, [ours], numbers)?;
    let sender =
        take_copy(pid, theirs as i32).map_err(|e| Error::Proc { pid, what: "the hand-over socket", source: e });
    p.call("close", libc::SYS_close, &[theirs])?;
    let sender = sender?;
    let mut out = Vec::with_capacity(fds.len());
    for chunk in fds.chunks(HAND_OVER_MAX) {
        let mut space = vec![std::mem::MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(HAND_OVER_MAX))];
        let mut control = rustix::net::SendAncillaryBuffer::new(&mut space);
        control.push(rustix::net::SendAncillaryMessage::ScmRights(chunk));
        rustix::net::sendmsg(&sender, &[io::IoSlice::new(&[0])], &mut control, rustix::net::SendFlags::DONTWAIT)
            .map_err(|e| Error::Proc { pid, what: "sending descriptors to a restored process", source: e.into() })?;
        for tmp in receive(p, area, ours, chunk.len())? {
            let [tmp] = clear_of_numbers(p, [tmp as u64], numbers)?;
            out.push(tmp);
        }
    }
    p.call("close", libc::SYS_close, &[ours])?;
    Ok(out)
}

/// Descriptors `fds` of `p`, just made, moved off the numbers of its image
/// where one of them sits on such a number ([`clear_of_numbers`]): another
/// descriptor put on that number before the one there is placed would
/// close it.
pub(crate) fn clear_of<const N: usize>(p: &mut Tracee, fds: [u64; N], image: &ProcessImage) -> Result<[u64; N]> {
    let numbers: Vec<i32> = image.fds.iter().map(|f| f.fd).collect();
    clear_of_numbers(p, fds, &numbers)
}

/// [`clear_of`] the descriptor numbers `numbers`.
/// Above every number of the image; where the limit on descriptors
/// (`RLIMIT_NOFILE`) leaves no room there (bash's 255 under `ulimit -n
/// 256`), the lowest free number that is none of them.
pub(crate) fn clear_of_numbers<const N: usize>(p: &mut Tracee, mut fds: [u64; N], numbers: &[i32]) -> Result<[u64; N]> {
    let floor = numbers.iter().copied().max().unwrap_or(2) as u64 + 1;
    for fd in fds.iter_mut() {
        if !numbers.iter().any(|&n| n as u64 == *fd) {
            continue;
        }
        // (Numbers of the image found free on the way stay taken until the
        // search ends, so that the next try skips them.)
        let mut passed = Vec::new();
        let mut from = floor;
        let found = loop {
            let out = p.syscall(libc::SYS_fcntl, &[*fd, libc::F_DUPFD_CLOEXEC as u64, from])?;
            match out.ret {
                r if r >= 0 && !numbers.contains(&(r as i32)) => break Ok(r as u64),
                r if r >= 0 => {
                    passed.push(r as u64);
                    from = r as u64 + 1;
                }
                r if from == floor && (r == -(libc::EINVAL as i64) || r == -(libc::EMFILE as i64)) => from = 0,
                r => {
                    break Err(Error::Remote {
                        pid: p.tid,
                        call: "fcntl(F_DUPFD_CLOEXEC)",
                        errno: io::Error::from_raw_os_error(-r as i32),
                    });
                }
            }
        };
        for t in passed {
            p.call("close", libc::SYS_close, &[t])?;
        }
        let above = found?;
        p.call("close", libc::SYS_close, &[*fd])?;
        *fd = above;
    }
    Ok(fds)
}

/// Descriptors sent at once in a hand-over (the kernel's `SCM_MAX_FD` is
/// 253).
const HAND_OVER_MAX: usize = 64;

/// `recvmsg` of `n` descriptors on `sock` of `p` (`MSG_CMSG_CLOEXEC`),
/// its message header and buffers at `area`: the numbers they got.
fn receive(p: &mut Tracee, area: u64, sock: u64, n: usize) -> Result<Vec<i32>> {
    let pid = p.tid;
    // msghdr (56 bytes) | iovec (16) | 1 byte | control (cmsghdr 16 + fds)
    let (iov, byte, control) = (area + 64, area + 80, area + 96);
    let control_len = 16 + 4 * n as u64;
    let mut hdr = Vec::with_capacity(56);
    for v in [0u64, 0, iov, 1, control, control_len.next_multiple_of(8), 0] {
        hdr.extend_from_slice(&v.to_ne_bytes());
    }
    hdr.extend_from_slice(&byte.to_ne_bytes());
    hdr.extend_from_slice(&1u64.to_ne_bytes());
    ptrace::write_mem(pid.raw(), area, &hdr).map_err(Error::ptrace(pid, "write msghdr"))?;
    let flags = libc::MSG_CMSG_CLOEXEC as u64;
    p.call("recvmsg (hand-over)", libc::SYS_recvmsg, &[sock, area, flags])?;
    let mut got = vec![0u8; control_len as usize];
    ptrace::read_mem(pid.raw(), control, &mut got).map_err(Error::ptrace(pid, "read control message"))?;
    let len = u64::from_ne_bytes(got[..8].try_into().unwrap_or_default());
    let (level, ty) = (
        i32::from_ne_bytes(got[8..12].try_into().unwrap_or_default()),
        i32::from_ne_bytes(got[12..16].try_into().unwrap_or_default()),
    );
    if level != libc::SOL_SOCKET || ty != libc::SCM_RIGHTS || len != control_len {
        return Err(Error::Proc {
            pid,
            what: "handed-over descriptors",
            source: io::Error::other(format!("{n} descriptors sent, control message of {len} bytes received")),
        });
    }
    Ok(got[16..].chunks(4).map(|c| i32::from_ne_bytes(c.try_into().unwrap_or_default())).collect())
}
