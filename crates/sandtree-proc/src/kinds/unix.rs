//! Unix sockets (`FdKind::Socket`, family `unix`).
//!
//! - An end of an unnamed pair (`socketpair`) with a live peer
//!   ([`crate::model::UnixPair`]) is not held by the template (a peer's
//!   close must show as the end of the stream, checkpoint or not): the
//!   restore makes the pair anew in the first restored process that holds
//!   an end, and hands the other ends to the processes that hold them
//!   (`hand_over.rs`); data queued at the checkpoint is sent again, then
//!   shutdowns and `SO_PASSCRED` are set. Refused: a pair whose other end no
//!   captured process holds. An end whose peer was released, with data
//!   queued (`UnixPair::peer` 0), is made anew too, with a peer that sends
//!   the data again and closes with the restore's end (and leaves a byte
//!   unread first where the old one had: `UnixPair::reset`).
//! - A connection made through a listener bound to a path or to a name of
//!   the abstract namespace (`@name`; stream or
//!   seqpacket; the connecting end not bound itself) is not held by the
//!   template either. The restore makes it again through the listener,
//!   bound again, so that both ends have their addresses and peer
//!   credentials back (`SO_PEERCRED` of the accepted end names the process
//!   that connects, that of the other end the one that listened): during
//!   the restore of its *maker* ([`Connection::maker`]: the listener's
//!   binder, below), right after the listener is bound again, the process that
//!   connected at first connects again (cloned ahead of its turn if it is
//!   another, `restore.rs`'s `Cloned`), the daemon accepts on its copy of
//!   the listener, and the ends are handed over like a pair's.
//!   [`restore_order`] brings the maker back before that process and every
//!   holder of an end. Refused: the connecting process exited, no captured
//!   process holds the listener, or makers wait for each other.
//! - A listener bound to a path, or a datagram socket bound to one and not
//!   connected, is bound anew at that path in the rolled-back tree (the old
//!   socket file is a dead copy there), with its type, once (a listener of
//!   the abstract namespace too, at its name, once the killed holders of
//!   the old one are gone): by its
//!   *binder* ([`super::hand_over::binder`]: the process that listened on
//!   it if it holds it, else the first holder), restored before the other
//!   holders, which get it handed over.
//! - Any other (a connection through an abstract listener whose name is
//!   not text, one whose connecting end is bound, one not accepted yet, one
//!   to a socket outside the sandbox) is held by the template as it is: a peer's close
//!   after a checkpoint does not show there yet. What is queued on a
//!   connected one at the checkpoint (bytes or messages) is peeked in
//!   pass 1 and, at the restore, the socket is drained and its peer sends
//!   the data again. Files in flight with it (`SCM_RIGHTS`): see
//!   `in_flight.rs`.
//!
//! Refused: a connection its listener has not accepted yet (the listener
//! is made anew: the pending connection would be lost), data in flight
//! that cannot be captured (no captured peer to send it, an empty
//! message), a listener or bound datagram socket on a relative path whose
//! socket file is not there from the process's working directory (a
//! restore, which enters that directory first, binds it again there), or
//! whose socket file was removed since its bind. A process holding one
//! bound in the tree, or with data in flight, cannot move to a new tree.

use std::io;
use std::os::fd::OwnedFd;

use rustix::io::Errno;
use sandtree_sys::ptrace;

use super::hand_over::{
    Connection, Handed, Key, binder, clear_of, clear_of_numbers, listener_of, made_already, place, socketpair_in,
    take_copy,
};
use super::{Kind, Remake, kept_path, move_fd, socket_type};
use crate::batch::write_path;
use crate::fdstate::{Seen, dup_from};
use crate::inject::Tracee;
use crate::model::{FdImage, FdKind, ProcessImage, SocketBuffer, UnixPair};
use crate::template::CheckpointTemplates;
use crate::{Error, HostPid, Result, SandboxPid};

/// Unix sockets.
pub(crate) struct Unix;

impl Kind for Unix {
    fn check(&self, f: &FdImage, _p: &ProcessImage) -> std::result::Result<(), String> {
        if let Some(why) = super::unix_datagrams::refusal(f) {
            return Err(why);
        }
        match &f.kind {
            FdKind::Socket { not_accepted: true, .. } => Err(
                "a unix connection its listener has not accepted yet (made anew at a restore, it would be lost): checkpoint once it is accepted".into(),
            ),
            FdKind::Socket { held_connection: true, bound, .. } => Err(format!(
                "a unix connection ({}) made from a bound socket, or through a listener of the abstract namespace whose name is not text, which a restore cannot make again yet (a copy the checkpoint held would hide this end's close from its peer)",
                match bound {
                    Some(address) => format!("address {address}"),
                    None => "the connecting end".to_string(),
                }
            )),
            FdKind::Socket { queued: true, peer: None, unix_datagrams: None, .. } => Err(
                "a unix socket with data in flight that is not captured (only a connected socket's whose peer a captured process holds or, of an unnamed pair, was closed, and a datagram socket's bound to a path, are; checkpoint once it is read)".into(),
            ),
            FdKind::Socket { listening: true, bound: Some(path), bound_from: None, .. }
                if !path.starts_with('/') && !path.starts_with('@') =>
            {
                Err(format!(
                    "a unix socket listening on relative path {path}, whose socket file is not there from its working directory (a restore binds it again from there)"
                ))
            }
            FdKind::Socket { listening: true, bound: Some(path), bound_gone: true, .. } => Err(format!(
                "a unix socket listening on {path}, whose socket file was removed since (bound again, it would be reachable there again)"
            )),
            FdKind::Socket { stream: false, connected: false, bound: Some(path), bound_from: None, .. }
                if !path.starts_with('/') && !path.starts_with('@') =>
            {
                Err(format!(
                    "a unix datagram socket bound to relative path {path}, whose socket file is not there from its working directory (a restore binds it again from there)"
                ))
            }
            FdKind::Socket { stream: false, connected: false, bound: Some(path), bound_gone: true, .. } => Err(format!(
                "a unix datagram socket bound to {path}, whose socket file was removed since (bound again, it would be reachable there again)"
            )),
            _ => Ok(()),
        }
    }

    fn cannot_move(&self, f: &FdImage) -> Option<&'static str> {
        match &f.kind {
            // (A relative name is the tree's too.)
            FdKind::Socket { bound: Some(path), .. } if !path.starts_with('@') && !kept_path(path) => {
                Some("a unix socket is bound in the tree")
            }
            FdKind::Socket { queued: true, peer: None, .. } => {
                Some("a unix socket holds data (maybe descriptors) in flight")
            }
            _ => None,
        }
    }

    fn remake(&self, f: &FdImage, cx: &mut Remake<'_>) -> Result<()> {
        match &f.kind {
            FdKind::Socket { ino, listening: true, bound: Some(path), seqpacket, inet: None, .. }
                if !path.starts_with("/proc/") =>
            {
                let ty = if *seqpacket { libc::SOCK_SEQPACKET } else { libc::SOCK_STREAM };
                bind_once(cx, f, *ino, (ty, true), path)
            }
            k @ FdKind::Socket { ino, listening: false, stream: false, bound: Some(path), inet: None, .. }
                if k.recreated() =>
            {
                bind_once(cx, f, *ino, (libc::SOCK_DGRAM, false), path)
            }
            FdKind::Socket { ino, pair: Some(pair), .. } if pair.through.is_none() => {
                remake_pair_end(cx, f, *ino, pair)
            }
            // (Made by the process that connected: [`Kind::remade_all`].)
            FdKind::Socket { ino, pair: Some(_), .. } => {
                cx.wanted.push((Key::Socket(*ino), f.fd, f.flags));
                Ok(())
            }
            _ => Ok(()),
        }
    }

    /// The connections through the listeners this process bound again
    /// that it makes (see [`Connection::maker`]), made again: their ends
    /// are handed over to their holders, this process included.
    fn remade_all(&self, cx: &mut Remake<'_>) -> Result<()> {
        let mine: Vec<Connection> = cx
            .handed
            .connections
            .iter()
            .filter(|c| c.maker == Some(cx.image.pid) && !cx.handed.ends.contains_key(&Key::Socket(c.accepted)))
            .cloned()
            .collect();
        for c in &mine {
            if c.connector == cx.image.pid {
                let numbers: Vec<i32> = cx.image.fds.iter().map(|f| f.fd).collect();
                connect_again(cx.p, (cx.scratch, &numbers), cx.handed, c)?;
            } else {
                let mut early = cx.handed.cloned_early.remove(&c.connector).ok_or_else(|| Error::Proc {
                    pid: cx.p.tid,
                    what: "a unix connection made again",
                    source: io::Error::other(format!("its connecting process {} is not cloned yet", c.connector)),
                })?;
                let numbers = early.fds.clone();
                let made = connect_again(&mut early.tracee, (early.scratch, &numbers), cx.handed, c);
                cx.handed.cloned_early.insert(c.connector, early);
                made?;
            }
        }
        Ok(())
    }
}

/// A listener (or datagram socket) bound to `path`, descriptor `f` of
/// socket `ino`, for restored process `cx.p`: bound again ([`rebind`]) by
/// its binder ([`super::hand_over::binder`], restored before the others
/// that hold it), the daemon keeping a copy; a dup of it in that process,
/// handed over to the others ([`hand_over`]): one socket again, reachable
/// at its path, however many hold it.
fn bind_once(cx: &mut Remake<'_>, f: &FdImage, ino: u64, (ty, listen): (i32, bool), path: &str) -> Result<()> {
    let key = Key::Socket(ino);
    if made_already(cx, key, f)? {
        return Ok(());
    }
    if cx.handed.binders.get(&ino).is_some_and(|&b| b != cx.image.pid) {
        cx.wanted.push((key, f.fd, f.flags));
        return Ok(());
    }
    rebind(cx.p, cx.scratch, (f.fd, f.flags), (ty, listen), path)?;
    let pid = cx.p.tid;
    let copy =
        take_copy(pid, f.fd).map_err(|e| Error::Proc { pid, what: "a copy of a socket bound again", source: e })?;
    cx.handed.ends.insert(key, copy);
    cx.placed.push((key, f.fd));
    // (A connection made through it is made again through this one,
    // accepted by the daemon.)
    if listen {
        cx.handed.listeners.insert(path.to_string(), ino);
    }
    Ok(())
}

/// Unix connection `c`, made again: a socket made in `p` (the process
/// that connected at first, whose scratch area and image's descriptor
/// numbers are `scratch` and `numbers`: the peer credentials of the
/// accepted end name it again) connects to the listener at `c.path` (just
/// bound again), the daemon accepts it on its copy of that listener (whose
/// credentials the connecting end's name, as before) and keeps both ends
/// to hand them over; their state is set as at the checkpoint.
fn connect_again(p: &mut Tracee, (scratch, numbers): (u64, &[i32]), handed: &mut Handed, c: &Connection) -> Result<()> {
    let pid = p.tid;
    let failed = |what: &'static str| move |e: io::Error| Error::Proc { pid, what, source: e };
    let sock = p.call(
        "socket (unix, connecting again)",
        libc::SYS_socket,
        &[libc::AF_UNIX as u64, (c.sock_type | libc::SOCK_CLOEXEC) as u64, 0],
    )?;
    let [sock] = clear_of_numbers(p, [sock], numbers)?;
    let sun = sockaddr_un(&c.connect_to);
    ptrace::write_mem(pid.raw(), scratch + 1024, &sun).map_err(Error::ptrace(pid, "write sockaddr"))?;
    let connected = p.call(
        "connect (unix, through its listener again)",
        libc::SYS_connect,
        &[sock, scratch + 1024, sun.len() as u64],
    );
    let copy = connected.and_then(|_| take_copy(pid, sock as i32).map_err(failed("a copy of a connection made again")));
    p.call("close", libc::SYS_close, &[sock])?;
    let connecting = copy?;
    let listener =
        handed.listeners.get(&c.path).and_then(|ino| handed.ends.get(&Key::Socket(*ino))).ok_or_else(|| {
            failed("a unix connection made again")(io::Error::other(format!(
                "its listener {} was not bound again",
                c.path
            )))
        })?;
    let accepted = accept_within(listener, std::time::Duration::from_secs(1))
        .map_err(failed("accepting a unix connection made again"))?;
    set_up_pair(handed, (c.connecting, &connecting), (c.accepted, &accepted))
        .map_err(failed("a unix connection's state"))?;
    handed.ends.insert(Key::Socket(c.connecting), connecting);
    handed.ends.insert(Key::Socket(c.accepted), accepted);
    Ok(())
}

/// The next connection queued on `listener`, waiting at most `limit` (the
/// listener may be a blocking one).
fn accept_within(listener: &OwnedFd, limit: std::time::Duration) -> io::Result<OwnedFd> {
    let mut fds = [rustix::event::PollFd::new(listener, rustix::event::PollFlags::IN)];
    let timeout = rustix::time::Timespec { tv_sec: limit.as_secs() as i64, tv_nsec: limit.subsec_nanos() as i64 };
    if rustix::event::poll(&mut fds, Some(&timeout))? == 0 {
        return Err(io::Error::other("no connection queued"));
    }
    Ok(rustix::net::accept_with(listener, rustix::net::SocketFlags::CLOEXEC)?)
}

/// An end of a unix socket pair, for restored process `cx.p`: a dup of the
/// end it placed already; handed over later ([`hand_over`]) if another
/// process made it; else the pair is made here, with the other end placed
/// too if this process holds it, and set as at the checkpoint (queued
/// data, shutdown, `SO_PASSCRED`).
fn remake_pair_end(cx: &mut Remake<'_>, f: &FdImage, ino: u64, pair: &UnixPair) -> Result<()> {
    if made_already(cx, Key::Socket(ino), f)? {
        return Ok(());
    }
    let p = &mut *cx.p;
    let pid = p.tid;
    let (a, b) = socketpair_in(p, cx.scratch + 1024, pair.sock_type)?;
    let [a, b] = clear_of(p, [a, b], cx.image)?;
    let (a, b) = (a as i32, b as i32);
    let copy = |fd: i32| {
        take_copy(pid, fd).map_err(|e| Error::Proc { pid, what: "a copy of a remade socket pair's end", source: e })
    };
    let (a_copy, b_copy) = (copy(a)?, copy(b)?);
    place(p, a as u64, f.fd, f.flags)?;
    cx.placed.push((Key::Socket(ino), f.fd));
    // The other end: here too, or kept by the daemon for its process.
    let peer_here = cx.image.fds.iter().find(|g| matches!(&g.kind, FdKind::Socket { ino: i, .. } if *i == pair.peer));
    match peer_here {
        Some(g) => {
            place(p, b as u64, g.fd, g.flags)?;
            cx.placed.push((Key::Socket(pair.peer), g.fd));
        }
        None => {
            p.call("close", libc::SYS_close, &[b as u64])?;
        }
    }
    set_up_pair(cx.handed, (ino, &a_copy), (pair.peer, &b_copy)).map_err(|e| Error::Proc {
        pid,
        what: "a remade socket pair's state",
        source: e,
    })?;
    cx.handed.ends.insert(Key::Socket(ino), a_copy);
    // (A released peer: closed once every process is back, before any
    // runs.)
    match pair.peer {
        0 => cx.handed.released_peers.push(b_copy),
        peer => drop(cx.handed.ends.insert(Key::Socket(peer), b_copy)),
    }
    Ok(())
}

/// A new pair's ends as at the checkpoint: buffer sizes and timeouts,
/// the data queued on each sent again from the other, then shutdowns and
/// `SO_PASSCRED`.
fn set_up_pair(pairs: &Handed, a: (u64, &OwnedFd), b: (u64, &OwnedFd)) -> io::Result<()> {
    // (Buffer sizes first: the data may need them.)
    for (ino, sock) in [a, b] {
        for (level, name, value) in pairs.pair_states.get(&ino).map(|st| &st.options[..]).unwrap_or_default() {
            set_option(sock, (*level, *name), value)?;
        }
    }
    // (With files in flight on either end, both queues and the shutdowns
    // wait until every process is back: `in_flight::send_again`.)
    let later = [a, b].iter().any(|(ino, _)| pairs.pair_queued.get(ino).is_some_and(super::in_flight::sent_last));
    for ((ino, _), (_, from)) in [(a, b), (b, a)] {
        if let Some(buf) = pairs.pair_queued.get(&ino)
            && !later
        {
            send_on(from, &buf.messages, buf.stream)?;
        }
    }
    // (A peer released with data unread: it goes with a byte unread too.)
    for (ino, sock) in [a, b] {
        if pairs.pair_states.get(&ino).is_some_and(|st| st.peer == 0 && st.reset) {
            send_on(sock, &[vec![0]], true)?;
        }
    }
    for (ino, sock) in [a, b] {
        let Some(st) = pairs.pair_states.get(&ino) else { continue };
        if !later {
            shut_down(sock, st)?;
        }
        if st.passcred {
            rustix::net::sockopt::set_socket_passcred(sock, true)?;
        }
    }
    Ok(())
}

/// A new pair's end `sock` shut down as `st` says its old one was.
pub(crate) fn shut_down(sock: &OwnedFd, st: &UnixPair) -> io::Result<()> {
    if st.send_shutdown {
        rustix::net::shutdown(sock, rustix::net::Shutdown::Write)?;
    }
    // (A connection's receive side follows the peer's send side.)
    if st.rcv_shutdown && st.sock_type == libc::SOCK_DGRAM {
        rustix::net::shutdown(sock, rustix::net::Shutdown::Read)?;
    }
    Ok(())
}

/// Option `(level, name)` of a new socket pair's end `sock` set to
/// `value`, as `getsockopt` gave it on the old end. A buffer size was
/// doubled by the kernel when set: half of it is set again, forced (the
/// daemon may go past `wmem_max`/`rmem_max`, as root in the sandbox could
/// with `SO_SNDBUFFORCE`).
fn set_option(sock: &OwnedFd, (level, name): (i32, i32), value: &[u8]) -> io::Result<()> {
    let forced = match name {
        libc::SO_SNDBUF if level == libc::SOL_SOCKET => Some(libc::SO_SNDBUFFORCE),
        libc::SO_RCVBUF if level == libc::SOL_SOCKET => Some(libc::SO_RCVBUFFORCE),
        _ => None,
    };
    match (forced, <[u8; 4]>::try_from(value)) {
        (Some(force), Ok(v)) => {
            let half = (i32::from_ne_bytes(v) / 2).to_ne_bytes();
            sandtree_sys::sockopt::set_raw(sock, level, force, &half)
        }
        _ => sandtree_sys::sockopt::set_raw(sock, level, name, value),
    }
}

/// Pass 1 for stopped process `host`: what is queued on its connected
/// unix sockets among `fds` not `seen` yet, each with the descriptors in
/// flight with its messages (by message index; `kinds/in_flight.rs` gives
/// them to the template). `who` names the process in a refusal (pid in
/// the sandbox, and its name, asked only then).
pub(crate) fn capture_queue(
    host: HostPid,
    fds: &[FdImage],
    seen: &mut Seen,
    who: (SandboxPid, &dyn Fn() -> String),
) -> Result<Vec<super::in_flight::PeekedQueue>> {
    let mut sockets = Vec::new();
    for f in fds {
        if let FdKind::Socket { ino, queued: true, peer: Some(peer), .. } = &f.kind
            && seen.first_socket(*ino)
        {
            let (peeked, stream) = read_queue(host, f.fd).map_err(|e| {
                Error::unsupported(
                    who.0,
                    &who.1(),
                    format!("fd {}", f.fd),
                    format!("a unix socket with data in flight that cannot be captured: {e}"),
                )
            })?;
            let mut messages = Vec::with_capacity(peeked.len());
            let mut in_flight = Vec::new();
            for (i, (bytes, fds)) in peeked.into_iter().enumerate() {
                messages.push(bytes);
                if !fds.is_empty() {
                    in_flight.push((i, fds));
                }
            }
            let buffer = SocketBuffer { ino: *ino, peer: *peer, stream, messages, passed: Vec::new(), passed_in: None };
            sockets.push((buffer, in_flight));
        }
    }
    Ok(sockets)
}

/// At a restore: a connected unix socket of template `host` loses what
/// came since the checkpoint (it was empty then, or its data is sent again
/// by [`put_back_queues`]).
pub(crate) fn drain(host: HostPid, f: &FdImage) -> Result<()> {
    match &f.kind {
        FdKind::Socket { family, connected: true, pair: None, .. } if family == "unix" => {
            drain_queue(host, f.fd).map_err(|e| Error::Proc { pid: host, what: "unix socket queue", source: e })
        }
        _ => Ok(()),
    }
}

/// At a restore, after every [`drain`]: the data queued at the checkpoint,
/// sent again by each socket's peer.
pub(crate) fn put_back_queues(set: &CheckpointTemplates) -> Result<()> {
    for (buf, host, fd) in set.sockets.iter().filter(|(b, ..)| !super::in_flight::sent_last(b)) {
        send_again(*host, *fd, &buf.messages, buf.stream).map_err(|e| Error::Proc {
            pid: *host,
            what: "unix socket data",
            source: e,
        })?;
    }
    Ok(())
}

/// A unix listener, or a datagram socket, is bound to a socket inode of
/// the replaced tree: the rolled-back tree has only a dead copy of that
/// file, and `connect` or a send to it would be refused. Bind a new socket
/// of type `ty` at the same path (same flags, the file's mode kept; a
/// listener listening) and put it on the old descriptor number. Connections
/// queued on an old listener are dropped (their clients were killed by the
/// rollback, or came after the checkpoint).
fn rebind(p: &mut Tracee, scratch: u64, (fd, flags): (i32, u32), (ty, listen): (i32, bool), path: &str) -> Result<()> {
    let pid = p.tid;
    // (An abstract name has no file: nothing to unlink or keep the mode of.)
    let file = match path.starts_with('@') {
        true => None,
        false => {
            let addr = write_path(pid, scratch, path)?;
            let mode = p.syscall(libc::SYS_stat, &[addr, scratch + 2048])?;
            let mut stat = [0u8; 144];
            let keep_mode = if mode.ret == 0 {
                ptrace::read_mem(pid.raw(), scratch + 2048, &mut stat).map_err(Error::ptrace(pid, "read stat"))?;
                Some(u32::from_ne_bytes(stat[24..28].try_into().unwrap_or_default()) & 0o7777)
            } else {
                None
            };
            let _ = p.syscall(libc::SYS_unlink, &[addr])?;
            Some((addr, keep_mode))
        }
    };
    let ty = socket_type(ty, flags);
    let new = p.call("socket (unix, bound again)", libc::SYS_socket, &[libc::AF_UNIX as u64, ty, 0])?;
    let sun = sockaddr_un(path);
    ptrace::write_mem(pid.raw(), scratch + 1024, &sun).map_err(Error::ptrace(pid, "write sockaddr"))?;
    // (An abstract name is free once every holder of the old socket is
    // gone: a killed holder may still be exiting. A path was unlinked.)
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(1);
    loop {
        let out = p.syscall(libc::SYS_bind, &[new, scratch + 1024, sun.len() as u64])?;
        match out.ret {
            0 => break,
            r if r == -(libc::EADDRINUSE as i64) && path.starts_with('@') && std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            r => {
                return Err(Error::Remote {
                    pid,
                    call: "bind (unix, bound again)",
                    errno: io::Error::from_raw_os_error(-r as i32),
                });
            }
        }
    }
    if listen {
        p.call("listen", libc::SYS_listen, &[new, libc::SOMAXCONN as u64])?;
    }
    move_fd(p, new, fd, flags)?;
    if let Some((addr, Some(m))) = file {
        p.call("chmod (unix socket)", libc::SYS_chmod, &[addr, m as u64])?;
    }
    Ok(())
}

/// The `struct sockaddr_un` of unix address `path` and its length: a path
/// (NUL-terminated), or a name of the abstract namespace (`@name`, as
/// `procfs` writes it: a leading NUL, and the name's bytes exactly).
fn sockaddr_un(path: &str) -> Vec<u8> {
    let mut sun = (libc::AF_UNIX as u16).to_ne_bytes().to_vec();
    match path.strip_prefix('@') {
        Some(name) => {
            sun.push(0);
            sun.extend_from_slice(name.as_bytes());
        }
        None => {
            sun.extend_from_slice(path.as_bytes());
            sun.push(0);
        }
    }
    sun
}

/// Drop whatever is queued for reading on the socket behind `fd` of `host`.
fn drain_queue(host: HostPid, fd: i32) -> io::Result<()> {
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

/// A message (or a stream's piece) queued on a unix socket, peeked: its
/// bytes, and the descriptors in flight with it, installed in the daemon
/// by the peek (the same open files: dropping them closes the copies).
pub type Peeked = (Vec<u8>, Vec<OwnedFd>);

/// What is queued for reading on unix socket `sock`, without consuming
/// it (`MSG_PEEK`), oldest first, peeked from `SO_PEEK_OFF` 0 on (each
/// peek moves past what it read; the socket's own offset is put back):
/// - a datagram or seqpacket socket's messages, one by one, each with its
///   descriptors;
/// - a stream's bytes: one piece, or, with descriptors in flight, pieces
///   that each end with bytes sent with descriptors. A stream's peek goes
///   on past a message without descriptors and stops after the first
///   with some, returning them; it does not tell where that message's
///   bytes begin, so the bytes sent before it come in its piece.
///
/// An error if a message is cut (over 256 KiB), or if more than 4096 are
/// queued.
pub fn socket_messages(sock: &OwnedFd, stream: bool) -> io::Result<Vec<Peeked>> {
    let peek = |buf: &mut [u8]| -> io::Result<(usize, bool, Vec<OwnedFd>)> {
        let mut space = [std::mem::MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(253))];
        let mut control = rustix::net::RecvAncillaryBuffer::new(&mut space);
        // (Close-on-exec: the daemon holds them until pass 1 gives them to
        // a template, and a program it starts meanwhile must not inherit
        // them.)
        let flags = rustix::net::RecvFlags::PEEK
            | rustix::net::RecvFlags::DONTWAIT
            | rustix::net::RecvFlags::TRUNC
            | rustix::net::RecvFlags::CMSG_CLOEXEC;
        let got = rustix::net::recvmsg(sock, &mut [io::IoSliceMut::new(buf)], &mut control, flags)?;
        let mut fds = Vec::new();
        for m in control.drain() {
            if let rustix::net::RecvAncillaryMessage::ScmRights(passed) = m {
                fds.extend(passed);
            }
        }
        if got.flags.contains(rustix::net::ReturnFlags::CTRUNC) {
            return Err(io::Error::other("more descriptors in flight with a message than a message can carry"));
        }
        Ok((got.bytes, got.flags.contains(rustix::net::ReturnFlags::TRUNC), fds))
    };
    let saved = sandtree_sys::sockopt::peek_offset(sock)?;
    sandtree_sys::sockopt::set_peek_offset(sock, 0)?;
    let mut out = Vec::new();
    let peeked = if stream {
        let n = rustix::io::ioctl_fionread(sock)? as usize;
        let mut buf = vec![0u8; n.max(1)];
        let mut got = 0;
        loop {
            if got >= n {
                break Ok(out);
            }
            match peek(&mut buf[..n - got]) {
                Ok((0, ..)) => break Err(io::Error::other(format!("{got} of {n} queued bytes could be read"))),
                Ok((k, _, fds)) if out.len() < 4096 => {
                    got += k;
                    out.push((buf[..k].to_vec(), fds));
                }
                Ok(_) => break Err(io::Error::other("more than 4096 messages with descriptors queued")),
                Err(e) => break Err(e),
            }
        }
    } else {
        let mut buf = vec![0u8; 256 * 1024];
        loop {
            match peek(&mut buf) {
                Ok((_, true, _)) => break Err(io::Error::other("a queued message is larger than 256 KiB")),
                // (The kernel marks an empty message peeked, and a later
                // peek at offset 0 goes past it: a second capture would
                // not see it.)
                Ok((0, ..)) => {
                    break Err(io::Error::other("an empty message is queued (a peek cannot capture it twice)"));
                }
                Ok((n, false, fds)) if out.len() < 4096 => out.push((buf[..n].to_vec(), fds)),
                Ok(_) => break Err(io::Error::other("more than 4096 messages queued")),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break Ok(out),
                Err(e) => break Err(e),
            }
        }
    };
    sandtree_sys::sockopt::set_peek_offset(sock, saved)?;
    peeked
}

/// What is queued on unix socket `fd` of `host` ([`socket_messages`]), and
/// whether it is a byte stream.
fn read_queue(host: HostPid, fd: i32) -> io::Result<(Vec<Peeked>, bool)> {
    let sock = dup_from(host, fd)?;
    let stream = rustix::net::sockopt::socket_type(&sock)? == rustix::net::SocketType::STREAM;
    Ok((socket_messages(&sock, stream)?, stream))
}

/// Queue `messages` again on the peer of socket `fd` of `host`, by sending
/// them from that socket (the restore drained the peer beforehand): a
/// stream's bytes in full, a datagram or seqpacket message per send.
fn send_again(host: HostPid, fd: i32, messages: &[Vec<u8>], stream: bool) -> io::Result<()> {
    send_on(&dup_from(host, fd)?, messages, stream)
}

/// Send `messages` from socket `sock` (a stream's bytes in full, a
/// datagram or seqpacket message per send).
fn send_on(sock: &OwnedFd, messages: &[Vec<u8>], stream: bool) -> io::Result<()> {
    send_each(sock, messages.iter().map(|m| Ok((&m[..], Vec::new()))), stream)
}

/// Send each message of `messages` from socket `sock` with its files
/// (`SCM_RIGHTS`, with its first send: a stream's rest, if the send was
/// cut, follows without): a stream's bytes in full, a datagram or
/// seqpacket message per send.
pub(crate) fn send_each<'a>(
    sock: &OwnedFd,
    messages: impl IntoIterator<Item = io::Result<(&'a [u8], Vec<std::os::fd::BorrowedFd<'a>>)>>,
    stream: bool,
) -> io::Result<()> {
    let flags = rustix::net::SendFlags::DONTWAIT | rustix::net::SendFlags::NOSIGNAL;
    for message in messages {
        let (m, files) = message?;
        let mut sent = 0;
        let mut with = Some(files).filter(|f| !f.is_empty());
        loop {
            // (Room for a control message only with files to send.)
            let room = if with.is_some() { rustix::cmsg_space!(ScmRights(253)) } else { 0 };
            let mut space = vec![std::mem::MaybeUninit::<u8>::uninit(); room];
            let mut control = rustix::net::SendAncillaryBuffer::new(&mut space);
            if let Some(files) = &with {
                control.push(rustix::net::SendAncillaryMessage::ScmRights(files));
            }
            match rustix::net::sendmsg(sock, &[io::IoSlice::new(&m[sent..])], &mut control, flags) {
                Ok(n) if stream => {
                    with = None;
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

/// The order a restore brings back `images`' processes in: smallest memory
/// first, except that a unix connection made through a listener is made
/// again during the restore of its maker ([`Connection::maker`], which
/// binds the listener again), by the process that connected (cloned ahead
/// of its turn if need be): the maker comes before that process and every
/// other holder of its ends (they get them handed over). An unnamed pair
/// is made by the first of its holders restored: its creator, when that
/// holds an end, comes before the others, so that the ends' `SO_PEERCRED`
/// names it again (unless that would make processes wait for each other:
/// then not). Each index with whether others wait for it. `Err(i)`:
/// process `i` waits in a cycle (it cannot be restored).
pub(crate) fn restore_order(images: &[&ProcessImage]) -> std::result::Result<Vec<(usize, bool)>, usize> {
    order_by(images, true).or_else(|_| order_by(images, false))
}

/// [`restore_order`], with or without the pairs' creators first.
fn order_by(images: &[&ProcessImage], creators: bool) -> std::result::Result<Vec<(usize, bool)>, usize> {
    let size = |i: usize| images[i].maps.iter().map(|m| m.end - m.start).sum::<u64>();
    let holding = |i: usize, want: &dyn Fn(&FdKind) -> bool| images[i].fds.iter().any(|f| want(&f.kind));
    let mut edges: Vec<(usize, usize)> = Vec::new();
    let at = |pid: crate::SandboxPid| images.iter().position(|i| i.pid == pid);
    // A socket bound again: its binder first.
    for ino in images.iter().flat_map(|i| &i.fds).filter_map(|f| f.kind.bound_again()) {
        let Some(b) = binder(images, ino).and_then(at) else { continue };
        let holds = |k: &FdKind| matches!(k, FdKind::Socket { ino: n, .. } if *n == ino);
        edges.extend((0..images.len()).filter(|&h| holding(h, &holds)).map(|h| (b, h)));
    }
    for c in Connection::all_of(images) {
        let Some(m) = images.iter().position(|i| Some(i.pid) == c.maker) else { continue };
        let ends = |k: &FdKind| matches!(k, FdKind::Socket { ino, .. } if *ino == c.accepted || *ino == c.connecting);
        edges.extend((0..images.len()).filter(|&h| holding(h, &ends)).map(|h| (m, h)));
        // (The connecting process is cloned early if need be, but not
        // after it was restored whole. One made by its parent is made at
        // its parent's turn: the parent comes before the maker.)
        if let Some(x) = images.iter().position(|i| i.pid == c.connector) {
            edges.push((m, x));
            if let Some(p) = by_parent(images, x) {
                edges.push((p, m));
            }
        }
    }
    // An open file shared with another process: after that one, which
    // opens it again (`kinds/file.rs`).
    for (c, image) in images.iter().enumerate() {
        edges.extend(image.fds.iter().filter_map(|f| f.opened_by).filter_map(|(pid, _)| at(pid)).map(|q| (q, c)));
    }
    // A child after its parent, which makes it again (`transplant.rs`); a
    // member of another's process group after that group's leader (a
    // child of init's too: it joins that group, `restore.rs`).
    for (c, image) in images.iter().enumerate() {
        let by_parent = by_parent(images, c);
        if let Some(p) = by_parent {
            edges.push((p, c));
        }
        if (by_parent.is_some() || image.ppid == SandboxPid::INIT)
            && image.pgid != image.pid
            && image.sid != image.pid
            && let Some(l) = at(image.pgid)
        {
            edges.push((l, c));
        }
    }
    // A pair's creator before the other holders of its ends.
    for (c, f) in images.iter().enumerate().flat_map(|(c, i)| i.fds.iter().map(move |f| (c, f))).filter(|_| creators) {
        let FdKind::Socket { ino, pair: Some(UnixPair { through: None, creator: Some(pid), peer, .. }), .. } = &f.kind
        else {
            continue;
        };
        if images[c].pid != *pid {
            continue;
        }
        let ends = |k: &FdKind| matches!(k, FdKind::Socket { ino: n, .. } if n == ino || n == peer);
        edges.extend((0..images.len()).filter(|&h| holding(h, &ends)).map(|h| (c, h)));
    }
    edges.retain(|(a, b)| a != b);
    edges.sort_unstable();
    edges.dedup();
    let mut left: Vec<usize> = (0..images.len()).collect();
    left.sort_by_key(|&i| size(i));
    let mut order = Vec::with_capacity(images.len());
    while !left.is_empty() {
        let free = left.iter().position(|&i| !edges.iter().any(|&(a, b)| b == i && left.contains(&a)));
        let Some(at) = free else { return Err(left[0]) };
        let i = left.remove(at);
        order.push((i, edges.iter().any(|&(a, _)| a == i)));
    }
    Ok(order)
}

/// The index of the process among `images` that makes `images[c]` again at
/// a restore, when there is one (other than init): its parent, or its
/// session's leader (`process::session::made_by_session`).
pub(crate) fn by_parent(images: &[&ProcessImage], c: usize) -> Option<usize> {
    let image = images[c];
    // (Or by its session's leader: `process::session::made_by_session`.)
    let maker = match crate::process::session::made_by_session(image) {
        true => image.sid,
        false => image.ppid,
    };
    (maker != crate::SandboxPid::INIT).then(|| images.iter().position(|i| i.pid == maker)).flatten()
}

/// Pass 2, once every template is made: the first of `images` whose unix
/// connection through a listener could not be made again, as (index,
/// resource, reason): its connecting process or its listener is not
/// captured, or the processes wait for each other ([`restore_order`]).
pub(crate) fn connection_refusal(images: &[&ProcessImage]) -> Option<(usize, String, String)> {
    let captured = |pid: Option<crate::SandboxPid>| pid.is_some_and(|p| images.iter().any(|i| i.pid == p));
    for (i, image) in images.iter().enumerate() {
        for f in &image.fds {
            let FdKind::Socket { pair: Some(UnixPair { through: Some(l), sock_type, .. }), .. } = &f.kind else {
                continue;
            };
            if !l.accepted {
                continue;
            }
            let path = &l.path;
            if !captured(l.connector) {
                let why = format!(
                    "a unix connection accepted from listener {path} whose connecting process has exited (made anew at a restore by the process that connected: its peer credentials name it)"
                );
                return Some((i, format!("fd {}", f.fd), why));
            }
            if listener_of(images, path, *sock_type).is_none() {
                let why = format!(
                    "a unix connection accepted from listener {path}, which no captured process holds any more (made anew at a restore, it goes through that listener)"
                );
                return Some((i, format!("fd {}", f.fd), why));
            }
        }
    }
    // A connection whose maker also makes its connecting process (its
    // parent, or its session's leader): that one is made only after the
    // maker's own restore, which makes the connection.
    for c in Connection::all_of(images) {
        let Some(m) = images.iter().position(|i| Some(i.pid) == c.maker) else { continue };
        let Some(x) = images.iter().position(|i| i.pid == c.connector) else { continue };
        if x != m && by_parent(images, x) == Some(m) {
            let why = format!(
                "a unix connection through listener {} from pid {}, which this process makes again at a restore only after its own restore, where the connection is made (not supported yet)",
                c.path, c.connector
            );
            return Some((m, "unix connections".into(), why));
        }
    }
    let cycle = restore_order(images).err()?;
    let why = "unix connections made through listeners whose processes wait for each other at a restore";
    Some((cycle, "unix connections".into(), why.into()))
}
