//! TCP connections (`FdKind::Socket` with `tcp`): captured through the
//! kernel's repair mode and made anew at a restore, with the same
//! addresses, sequence numbers, unread and unacknowledged bytes, windows
//! and options, so that both ends carry on as if nothing happened.
//!
//! **Capture** (pass 1, every process of the sandbox stopped; [`capture`]):
//! the daemon takes a copy of the socket (`pidfd_getfd`), reads its
//! options, puts it in repair mode, reads each queue's sequence number and
//! bytes (`MSG_PEEK`: nothing is taken), its windows and timestamp clock,
//! and takes it out of repair mode without a window probe
//! (`sandtree_sys::tcp_repair`). Nothing goes on the wire and the
//! process sees nothing: `SO_REUSEADDR`, which leaving repair mode clears,
//! is set again, and a `SO_PEEK_OFF` the peek would move is set to 0 for
//! it and put back. Only established connections can be read this way:
//! one in another state (half closed, closing) is refused by name.
//!
//! **Template:** holds no copy ([`FdKind::recreated`]): a template holding
//! a connection would keep it open after the process closed it, and its
//! peer would never see the end.
//!
//! **Pass 2** refuses a connection whose other end no captured process
//! holds ([`peerless`]): made anew, it would have no peer (not accepted
//! yet, or held by a process left out). A listener with connections not
//! accepted yet is refused too (`inet.rs`).
//!
//! **To the outside** (a peer neither on loopback nor at the sandbox's own
//! address): captured as `outside`, nothing else read. A rollback first
//! aborts the sandbox's live ones ([`reset_outside_connections`]: their
//! peers see a reset); a restore gives the process a socket connected to a
//! daemon listener on the sandbox's loopback, reset by the daemon once
//! every process is back ([`reset_outside`]): its next read or write fails
//! with `ECONNRESET`. Nothing goes to the peer from a fork.
//!
//! **Restore:** first, before any process is cloned, every socket of the
//! sandbox that still holds one of the connections (the killed originals',
//! closing, or in `TIME_WAIT`) is aborted by `sock_diag` ([`destroy_old`]):
//! a new socket cannot take a connection the kernel still has, and a late
//! close of the old one would reset the new one. Then, in the first
//! restored process that holds it ([`Tcp::remake`]), a socket of its family
//! is made by an injected `socket` call (its creator, cgroup and network
//! namespace are the process's), and the daemon sets it up through a copy
//! ([`set_up`]): repair mode, options, `bind` (an address in use is taken),
//! both queues' starting sequence numbers, `connect` (established at
//! once), the agreed options, the timestamp clock, the unread bytes into
//! the receive queue and the unacknowledged ones that had been sent into
//! the send queue, the windows. The other processes that hold it get it
//! handed over (`hand_over.rs`). It stays in repair mode, sending nothing,
//! until every process is back ([`finish`]): then each connection leaves
//! it with a window probe (its peer, made anew too, answers with what it
//! has received, so nothing is sent twice for long), gets its
//! `SO_REUSEADDR` back, and sends the bytes it had not sent yet.
//!
//! **Closed by its peer** (`CLOSE_WAIT`: the server closed an idle
//! keep-alive connection, the client has not noticed yet): repair mode
//! cannot read it, but nothing of its sequence numbers shows to the
//! process. Its unread bytes are peeked (and nothing may be written and
//! not acknowledged); the restore makes it with made-up sequence numbers
//! and makes its peer anew, in the daemon, in the sandbox's network
//! namespace, which, once every process is back, closes its side and is
//! dropped: the process reads the bytes, then the end, and a write gets
//! the reset an orphan answers, as before. Its orphaned peer of the
//! checkpoint is aborted with the rest.
//!
//! A restored connection's congestion state starts afresh, and its buffer
//! sizes are set (as at the checkpoint) only where they differ from a new
//! connection's, which then stops their autotuning.

use std::io;
use std::os::fd::OwnedFd;

use sandtree_sys::tcp_repair::{self, Leave, Queue};

use super::hand_over::{Key, clear_of, made_already, place, take_copy};
use super::{Kind, Remake, socket_type};
use crate::model::{FdImage, FdKind, ProcessImage, TcpConnection};
use crate::template::CheckpointTemplates;
use crate::{Error, HostPid, Result};

/// TCP connections.
pub(crate) struct Tcp;

impl Kind for Tcp {
    fn check(&self, f: &FdImage, _p: &ProcessImage) -> std::result::Result<(), String> {
        match &f.kind {
            FdKind::Socket { tcp: Some(c), .. } => c.refused.clone().map_or(Ok(()), Err),
            _ => Ok(()),
        }
    }

    fn remake(&self, f: &FdImage, cx: &mut Remake<'_>) -> Result<()> {
        let FdKind::Socket { ino, tcp: Some(c), .. } = &f.kind else { return Ok(()) };
        let key = Key::Tcp(*ino);
        if made_already(cx, key, f)? {
            return Ok(());
        }
        let p = &mut *cx.p;
        let pid = p.tid;
        let family = u16::from_ne_bytes([c.local[0], c.local[1]]) as u64;
        let ty = socket_type(libc::SOCK_STREAM, f.flags | libc::O_CLOEXEC as u32);
        let new = p.call("socket (tcp)", libc::SYS_socket, &[family, ty, libc::IPPROTO_TCP as u64])?;
        let [new] = clear_of(p, [new], cx.image)?;
        let copy = take_copy(pid, new as i32).map_err(|e| Error::Proc {
            pid,
            what: "a copy of a new TCP socket",
            source: e,
        })?;
        if c.outside {
            let reset = connect_to_reset(pid, &copy, family as i32).map_err(|e| Error::Proc {
                pid,
                what: "a connection to the outside, made anew as a reset",
                source: e,
            })?;
            let what =
                format!("pid {} fd {}: {} → {}", cx.image.pid.0, f.fd, address_text(&c.local), address_text(&c.remote));
            // (Other processes holding it get it handed over from `ends`.)
            let shared = rustix::io::fcntl_dupfd_cloexec(&copy, 0).map_err(|e| Error::Proc {
                pid,
                what: "a copy of a new TCP socket",
                source: e.into(),
            })?;
            cx.handed.ends.insert(key, shared);
            cx.handed.resetting.push((reset, copy, what));
            place(p, new, f.fd, f.flags)?;
            cx.placed.push((key, f.fd));
            return Ok(());
        }
        set_up(&copy, c).map_err(|e| Error::Proc { pid, what: "a TCP connection made anew", source: e })?;
        if c.state == CLOSE_WAIT {
            let peer = peer_of(pid, c).map_err(|e| Error::Proc {
                pid,
                what: "the peer of a TCP connection closed by it",
                source: e,
            })?;
            cx.handed.closing_peers.push(peer);
        }
        place(p, new, f.fd, f.flags)?;
        cx.placed.push((key, f.fd));
        cx.handed.ends.insert(key, copy);
        let tail = c.sent.len() - c.not_sent_len();
        cx.handed.repaired.push((*ino, c.reuse_addr, c.sent[tail..].to_vec()));
        Ok(())
    }
}

impl TcpConnection {
    /// Of the unacknowledged bytes, how many were never sent (at the
    /// end), bounded by what was captured.
    fn not_sent_len(&self) -> usize {
        (self.not_sent as usize).min(self.sent.len())
    }
}

/// Pass 1, process `host` stopped: the state of each TCP connection among
/// its descriptors `fds` (each descriptor's own copy; reading it twice
/// changes nothing).
pub(crate) fn capture(host: HostPid, fds: &mut [FdImage]) {
    for f in fds.iter_mut() {
        let FdKind::Socket { family, stream: true, listening: false, connected: true, tcp, .. } = &mut f.kind else {
            continue;
        };
        if !family.starts_with("inet") || tcp.is_some() {
            continue;
        }
        let Ok(sock) = crate::fdstate::dup_from(host, f.fd) else { continue };
        if int_option(&sock, libc::SOL_SOCKET, libc::SO_PROTOCOL).ok() == Some(libc::IPPROTO_TCP) {
            *tcp = Some(Box::new(capture_one(&sock)));
        }
    }
}

/// The state of the connection of socket `sock` (see the module docs).
fn capture_one(sock: &OwnedFd) -> TcpConnection {
    let mut c = TcpConnection {
        local: tcp_repair::address(sock, false).unwrap_or_default(),
        remote: tcp_repair::address(sock, true).unwrap_or_default(),
        peek_offset: -1,
        ..TcpConnection::default()
    };
    if !inside(&c.remote) {
        // Made anew as a reset: its state does not matter.
        c.outside = true;
        c.state = tcp_repair::info(sock).map(|i| i.state).unwrap_or(0);
        return c;
    }
    let info = match tcp_repair::info(sock) {
        Ok(i) => i,
        Err(e) => {
            c.refused = Some(format!("a TCP connection whose state cannot be read (TCP_INFO: {e})"));
            return c;
        }
    };
    c.state = info.state;
    if info.state == CLOSE_WAIT {
        if let Err(e) = read_closed_by_peer(sock, &mut c, info) {
            c.refused = Some(format!("a TCP connection closed by its peer (CLOSE_WAIT) {e}"));
        }
        return c;
    }
    if info.state != tcp_repair::ESTABLISHED {
        c.refused = Some(format!(
            "a TCP connection in state {} (only established connections are captured)",
            state_name(info.state)
        ));
        return c;
    }
    if let Err(e) = read_in_repair(sock, &mut c, info) {
        c.refused = Some(format!("a TCP connection whose state cannot be read in repair mode: {e}"));
    }
    c
}

/// What a connection made anew needs of `sock` besides its queues (read
/// without repair mode): `SO_REUSEADDR`, `SO_PEEK_OFF`, buffer sizes, MSS,
/// the options its handshake agreed (`info`), its own options.
fn read_settings(sock: &OwnedFd, c: &mut TcpConnection, info: tcp_repair::Info) -> io::Result<()> {
    let int = |level, name| int_option(sock, level, name);
    c.reuse_addr = int(libc::SOL_SOCKET, libc::SO_REUSEADDR)? != 0;
    c.peek_offset = sandtree_sys::sockopt::peek_offset(sock).unwrap_or(-1);
    c.buffers = (int(libc::SOL_SOCKET, libc::SO_SNDBUF)?, int(libc::SOL_SOCKET, libc::SO_RCVBUF)?);
    c.mss = int(libc::IPPROTO_TCP, libc::TCP_MAXSEG)? as u32;
    c.agreed = info.options;
    c.wscale = info.wscale;
    c.options = own_options(sock);
    Ok(())
}

/// Option `(level, name)` of socket `sock`, an `int`.
fn int_option(sock: &OwnedFd, level: i32, name: i32) -> io::Result<i32> {
    let v = sandtree_sys::sockopt::get_raw(sock, level, name, 4)?;
    Ok(i32::from_ne_bytes(v.get(..4).and_then(|b| b.try_into().ok()).ok_or_else(|| io::Error::other("short option"))?))
}

/// The options of connection `sock` a new socket gets again (see
/// `procfs::INET_OPTIONS`).
fn own_options(sock: &OwnedFd) -> Vec<(i32, i32, Vec<u8>)> {
    crate::procfs::INET_OPTIONS
        .iter()
        .filter(|o| !crate::procfs::MULTICAST.contains(o) && o.0 != libc::IPPROTO_UDPLITE)
        // (A listener's alone: refused on a connection.)
        .filter(|&&(level, name)| {
            !(level == libc::IPPROTO_TCP && matches!(name, libc::TCP_DEFER_ACCEPT | libc::TCP_FASTOPEN))
        })
        .filter_map(|&(level, name)| Some((level, name, sandtree_sys::sockopt::get_raw(sock, level, name, 16).ok()?)))
        .collect()
}

/// What [`capture_one`] reads of established socket `sock`, repair mode
/// entered and left.
fn read_in_repair(sock: &OwnedFd, c: &mut TcpConnection, info: tcp_repair::Info) -> io::Result<()> {
    use sandtree_sys::sockopt::set_peek_offset;
    read_settings(sock, c, info)?;
    let unread = rustix::io::ioctl_fionread(sock)? as usize;
    let unacked = tcp_repair::not_acked(sock)? as usize;
    c.not_sent = tcp_repair::not_sent(sock)?;
    tcp_repair::enter(sock)?;
    let read = (|| -> io::Result<()> {
        if c.peek_offset >= 0 {
            set_peek_offset(sock, 0)?;
        }
        tcp_repair::select_queue(sock, Queue::Receive)?;
        c.recv_seq = tcp_repair::queue_seq(sock)?;
        c.received = if unread > 0 { tcp_repair::peek(sock, unread)? } else { Vec::new() };
        tcp_repair::select_queue(sock, Queue::Send)?;
        c.send_seq = tcp_repair::queue_seq(sock)?;
        c.sent = if unacked > 0 { tcp_repair::peek(sock, unacked)? } else { Vec::new() };
        tcp_repair::select_queue(sock, Queue::None)?;
        c.timestamp = tcp_repair::timestamp(sock)?;
        c.window = tcp_repair::window(sock)?;
        if c.received.len() != unread || c.sent.len() != unacked {
            return Err(io::Error::other(format!(
                "{} of {unread} unread and {} of {unacked} unacknowledged bytes read",
                c.received.len(),
                c.sent.len()
            )));
        }
        Ok(())
    })();
    // Left as it was, whatever happened.
    let _ = tcp_repair::select_queue(sock, Queue::None);
    let left = tcp_repair::leave(sock, Leave::Quiet);
    if c.peek_offset >= 0 {
        let _ = set_peek_offset(sock, c.peek_offset);
    }
    if c.reuse_addr {
        sandtree_sys::sockopt::set_raw(sock, libc::SOL_SOCKET, libc::SO_REUSEADDR, &1i32.to_ne_bytes())?;
    }
    read.and(left)
}

/// `TCP_CLOSE_WAIT`: the peer closed its side (its FIN came), this one
/// may still send.
const CLOSE_WAIT: u8 = 8;

/// The sequence numbers a connection closed by its peer is made again
/// with (its own cannot be read: repair mode takes established sockets
/// only, and nothing but this end and its peer, made anew too, sees them).
const CLOSED_BY_PEER_SEQ: (u32, u32) = (0x1000_0000, 0x5000_0000);

/// What [`capture_one`] reads of socket `sock`, whose peer closed its side
/// (`CLOSE_WAIT`), without repair mode: its options, its unread bytes (a
/// `MSG_PEEK`, `SO_PEEK_OFF` set to 0 for it and put back), none written
/// and not acknowledged (else refused). Its sequence numbers are made up
/// ([`CLOSED_BY_PEER_SEQ`]); the restore makes its peer anew and closes
/// it ([`finish`]).
fn read_closed_by_peer(sock: &OwnedFd, c: &mut TcpConnection, info: tcp_repair::Info) -> io::Result<()> {
    use sandtree_sys::sockopt::set_peek_offset;
    let unacked = tcp_repair::not_acked(sock)?;
    if unacked > 0 {
        return Err(io::Error::other(format!("with {unacked} bytes written and not acknowledged yet")));
    }
    read_settings(sock, c, info)?;
    c.timestamp = tcp_repair::timestamp(sock).unwrap_or(0);
    let unread = rustix::io::ioctl_fionread(sock)? as usize;
    if c.peek_offset >= 0 {
        set_peek_offset(sock, 0)?;
    }
    let peeked = if unread > 0 { tcp_repair::peek(sock, unread) } else { Ok(Vec::new()) };
    if c.peek_offset >= 0 {
        let _ = set_peek_offset(sock, c.peek_offset);
    }
    c.received = peeked?;
    if c.received.len() != unread {
        return Err(io::Error::other(format!("with {} of {unread} unread bytes read", c.received.len())));
    }
    c.recv_seq = CLOSED_BY_PEER_SEQ.0.wrapping_add(unread as u32);
    c.send_seq = CLOSED_BY_PEER_SEQ.1;
    Ok(())
}

/// A TCP state's name (`include/net/tcp_states.h`).
fn state_name(state: u8) -> String {
    let names = [
        "",
        "ESTABLISHED",
        "SYN_SENT",
        "SYN_RECV",
        "FIN_WAIT1",
        "FIN_WAIT2",
        "TIME_WAIT",
        "CLOSE",
        "CLOSE_WAIT",
        "LAST_ACK",
        "LISTEN",
        "CLOSING",
    ];
    names.get(state as usize).filter(|n| !n.is_empty()).map(|n| n.to_string()).unwrap_or_else(|| format!("{state}"))
}

/// New socket `s` (closed, made in its process) set up to carry on
/// connection `c`, in repair mode still (see the module docs).
fn set_up(s: &OwnedFd, c: &TcpConnection) -> io::Result<()> {
    use sandtree_sys::sockopt::{get_raw, set_raw};
    tcp_repair::enter(s)?;
    for (level, name, value) in &c.options {
        set_raw(s, *level, *name, value)
            .map_err(|e| io::Error::new(e.kind(), format!("option {level}/{name}: {e}")))?;
    }
    tcp_repair::bind_raw(s, &c.local).map_err(|e| io::Error::new(e.kind(), format!("bind: {e}")))?;
    tcp_repair::select_queue(s, Queue::Receive)?;
    tcp_repair::set_queue_seq(s, c.recv_seq.wrapping_sub(c.received.len() as u32))?;
    tcp_repair::select_queue(s, Queue::Send)?;
    tcp_repair::set_queue_seq(s, c.send_seq.wrapping_sub(c.sent.len() as u32))?;
    tcp_repair::select_queue(s, Queue::None)?;
    tcp_repair::connect_raw(s, &c.remote).map_err(|e| io::Error::new(e.kind(), format!("connect: {e}")))?;
    tcp_repair::set_options(s, &agreed_options(c, false))?;
    if c.agreed & tcp_repair::INFO_TIMESTAMPS != 0 {
        tcp_repair::set_timestamp(s, c.timestamp)?;
    }
    // Buffer sizes, where a new connection's differ (before the bytes,
    // which may need them; as `getsockopt` gives them: twice what is set).
    for (now, (name, force)) in [c.buffers.0, c.buffers.1]
        .into_iter()
        .zip([(libc::SO_SNDBUF, libc::SO_SNDBUFFORCE), (libc::SO_RCVBUF, libc::SO_RCVBUFFORCE)])
    {
        let current = get_raw(s, libc::SOL_SOCKET, name, 4)?;
        if current[..] != now.to_ne_bytes()[..] {
            set_raw(s, libc::SOL_SOCKET, force, &(now / 2).to_ne_bytes())?;
        }
    }
    tcp_repair::select_queue(s, Queue::Receive)?;
    tcp_repair::fill(s, &c.received).map_err(|e| io::Error::new(e.kind(), format!("unread bytes: {e}")))?;
    tcp_repair::select_queue(s, Queue::Send)?;
    let sent = &c.sent[..c.sent.len() - c.not_sent_len()];
    tcp_repair::fill(s, sent).map_err(|e| io::Error::new(e.kind(), format!("unacknowledged bytes: {e}")))?;
    tcp_repair::select_queue(s, Queue::None)?;
    if !c.window.is_empty() {
        tcp_repair::set_window(s, &c.window)?;
    }
    if c.peek_offset >= 0 {
        sandtree_sys::sockopt::set_peek_offset(s, c.peek_offset)?;
    }
    Ok(())
}

/// What connection `c`'s handshake agreed, as `TCP_REPAIR_OPTIONS` sets
/// it (for its peer when `peer`: the window shifts swapped).
fn agreed_options(c: &TcpConnection, peer: bool) -> Vec<(u32, u32)> {
    let (send, receive) = if peer { (c.wscale.1, c.wscale.0) } else { c.wscale };
    let mut agreed = vec![(tcp_repair::OPT_MSS, c.mss)];
    if c.agreed & tcp_repair::INFO_WSCALE != 0 {
        agreed.push((tcp_repair::OPT_WINDOW, send as u32 | (receive as u32) << 16));
    }
    if c.agreed & tcp_repair::INFO_SACK != 0 {
        agreed.push((tcp_repair::OPT_SACK_PERM, 0));
    }
    if c.agreed & tcp_repair::INFO_TIMESTAMPS != 0 {
        agreed.push((tcp_repair::OPT_TIMESTAMP, 0));
    }
    agreed
}

/// The peer of connection `c`, closed by it (`CLOSE_WAIT`), made anew by
/// the daemon in the network namespace of process `pid`, in repair mode:
/// the other end of the made-up sequence numbers, with the same agreed
/// options (window shifts swapped). [`finish`] closes its side and drops
/// it: its FIN reaches `c`'s new socket after the unread bytes, and it
/// stays an orphan, as the peer that had closed was.
fn peer_of(pid: HostPid, c: &TcpConnection) -> io::Result<OwnedFd> {
    let family = u16::from_ne_bytes([c.remote[0], c.remote[1]]);
    let s = crate::sockdiag::socket_in(pid, family, libc::SOCK_STREAM, libc::IPPROTO_TCP)?;
    tcp_repair::enter(&s)?;
    tcp_repair::bind_raw(&s, &c.remote).map_err(|e| io::Error::new(e.kind(), format!("bind: {e}")))?;
    tcp_repair::select_queue(&s, Queue::Receive)?;
    tcp_repair::set_queue_seq(&s, c.send_seq)?;
    tcp_repair::select_queue(&s, Queue::Send)?;
    tcp_repair::set_queue_seq(&s, c.recv_seq)?;
    tcp_repair::select_queue(&s, Queue::None)?;
    tcp_repair::connect_raw(&s, &c.local).map_err(|e| io::Error::new(e.kind(), format!("connect: {e}")))?;
    tcp_repair::set_options(&s, &agreed_options(c, true))?;
    Ok(s)
}

/// Pass 2, once every template is made: the first of `images` holding a
/// TCP connection whose other end none of them holds, as (index,
/// resource, reason).
pub(crate) fn peerless(images: &[&ProcessImage]) -> Option<(usize, String, String)> {
    let ends: std::collections::HashSet<(&[u8], &[u8])> = images
        .iter()
        .flat_map(|i| &i.fds)
        .filter_map(|f| match &f.kind {
            FdKind::Socket { tcp: Some(c), .. } => Some((&c.local[..], &c.remote[..])),
            _ => None,
        })
        .collect();
    images.iter().enumerate().find_map(|(i, image)| {
        image.fds.iter().find_map(|f| match &f.kind {
            // (One its peer closed is made again with a peer of its own.)
            FdKind::Socket { tcp: Some(c), .. }
                if c.refused.is_none()
                    && !c.outside
                    && c.state != CLOSE_WAIT
                    && !ends.contains(&(&c.remote[..], &c.local[..])) =>
            {
                let why = if inside(&c.remote) {
                    format!(
                        "a TCP connection to {} whose other end no captured process holds (not accepted yet, or held by a process left out): made anew, it would have no peer",
                        address_text(&c.remote)
                    )
                } else {
                    format!(
                        "a TCP connection with {}, outside the sandbox: its other end cannot be made again, and connections to the outside are not reset at a restore yet; close it before the checkpoint",
                        address_text(&c.remote)
                    )
                };
                Some((i, format!("fd {}", f.fd), why))
            }
            _ => None,
        })
    })
}

/// A connection for the new socket `copy` (a daemon copy of a socket of
/// process `pid`, of `family`) to a listener the daemon makes on the
/// loopback of the process's network namespace: answers the daemon's end,
/// which resets it when closed ([`reset_outside`]).
fn connect_to_reset(pid: HostPid, copy: &OwnedFd, family: i32) -> io::Result<OwnedFd> {
    let listener = crate::sockdiag::socket_in(pid, family as u16, libc::SOCK_STREAM, libc::IPPROTO_TCP)?;
    let loopback: std::net::SocketAddr =
        if family == libc::AF_INET6 { "[::1]:0" } else { "127.0.0.1:0" }.parse().expect("an address");
    rustix::net::bind(&listener, &loopback)?;
    rustix::net::listen(&listener, 1)?;
    let listener = std::net::TcpListener::from(listener);
    match rustix::net::connect(copy, &listener.local_addr()?) {
        Ok(()) | Err(rustix::io::Errno::INPROGRESS) => {}
        Err(e) => return Err(e.into()),
    }
    let (accepted, _) = listener.accept()?;
    Ok(accepted.into())
}

/// Every process back, none running yet: closes the daemon's ends of the
/// connections to the outside made anew (each sends its reset), and waits
/// (up to a second each) until the process's socket has taken it.
pub(crate) fn reset_outside(resetting: Vec<(OwnedFd, OwnedFd, String)>) -> Vec<String> {
    let mut reset = Vec::new();
    for (end, copy, what) in resetting {
        drop(end);
        let mut fds = [rustix::event::PollFd::new(&copy, rustix::event::PollFlags::IN)];
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(1);
        while std::time::Instant::now() < deadline {
            let _ = rustix::event::poll(&mut fds, Some(&rustix::event::Timespec { tv_sec: 0, tv_nsec: 10_000_000 }));
            if fds[0].revents().intersects(rustix::event::PollFlags::HUP | rustix::event::PollFlags::ERR) {
                break;
            }
        }
        reset.push(what);
    }
    reset
}

/// Before a rollback kills the sandbox's processes (whose init is
/// `init`): every TCP connection of its network namespace with a peer
/// outside the sandbox is aborted, so that the peer sees a reset (a
/// process killed would close it in order, and its peer would take the
/// end for a normal one). Answers the connections reset, as text.
pub fn reset_outside_connections(init: HostPid) -> io::Result<Vec<String>> {
    // States with a peer: established, SYN sent/received, FIN waits,
    // close wait, last ack, closing.
    const LIVE: [u8; 8] = [0x01, 0x02, 0x03, 0x04, 0x05, 0x08, 0x09, 0x0B];
    if !has_tcp_sockets(init) {
        return Ok(Vec::new());
    }
    let diag = crate::sockdiag::diag_socket(init)?;
    let states = LIVE.iter().fold(0u32, |mask, state| mask | 1 << state);
    let mut conns = Vec::new();
    for family in [libc::AF_INET as u8, libc::AF_INET6 as u8] {
        let live = crate::sockdiag::tcp_connections(&diag, family, states)?;
        conns.extend(live.into_iter().filter(|(_, remote)| !inside(remote)));
    }
    let mut reset = Vec::new();
    for (local, remote) in conns {
        if crate::sockdiag::destroy_tcp(&diag, &local, &remote)? > 0 {
            reset.push(format!("{} → {}", address_text(&local), address_text(&remote)));
        }
    }
    Ok(reset)
}

/// Whether the network namespace of `init` has a TCP socket (IPv4 or
/// IPv6, any state but `TIME_WAIT`), from its `sockstat` and `sockstat6`
/// counts (`TCP: inuse N`, kept per namespace). Reading
/// `/proc/<pid>/net/tcp{,6}` walks the host's whole connection hash
/// table, empty or not: ~1.8 ms a file on the development VM (24 GiB of
/// memory), which every rollback paid. Unknown counts answer `true`.
fn has_tcp_sockets(init: HostPid) -> bool {
    let in_use = |file: &str, key: &str| -> Option<u64> {
        let text = std::fs::read_to_string(format!("/proc/{}/net/{file}", init.0)).ok()?;
        let line = text.lines().find(|l| l.starts_with(key))?;
        let mut words = line.split_whitespace().skip_while(|w| *w != "inuse").skip(1);
        words.next()?.parse().ok()
    };
    in_use("sockstat", "TCP:").is_none_or(|n| n > 0) || in_use("sockstat6", "TCP6:").is_none_or(|n| n > 0)
}

/// A sandbox's address on `eth0` (`sandtree_api::SANDBOX_ADDRESS`, which
/// this crate does not depend on; the runtime checks they agree).
pub const SANDBOX_ADDRESS: std::net::Ipv4Addr = std::net::Ipv4Addr::new(10, 0, 2, 15);

/// Whether raw inet address `raw` is one of the sandbox's own: loopback,
/// or its address on `eth0`.
fn inside(raw: &[u8]) -> bool {
    match u16::from_ne_bytes([raw.first().copied().unwrap_or(0), raw.get(1).copied().unwrap_or(0)]) as i32 {
        libc::AF_INET if raw.len() >= 8 => {
            let ip = std::net::Ipv4Addr::new(raw[4], raw[5], raw[6], raw[7]);
            ip.is_loopback() || ip == SANDBOX_ADDRESS
        }
        libc::AF_INET6 if raw.len() >= 24 => {
            let octets: [u8; 16] = raw[8..24].try_into().unwrap_or_default();
            let ip = std::net::Ipv6Addr::from(octets);
            ip.is_loopback() || ip.to_ipv4_mapped().is_some_and(|v4| v4.is_loopback() || v4 == SANDBOX_ADDRESS)
        }
        _ => true,
    }
}

/// A raw inet address as text (`127.0.0.1:8000`, `[::1]:8000`).
pub(crate) fn address_text(raw: &[u8]) -> String {
    let port = raw.get(2..4).map(|p| u16::from_be_bytes([p[0], p[1]])).unwrap_or(0);
    match u16::from_ne_bytes([raw.first().copied().unwrap_or(0), raw.get(1).copied().unwrap_or(0)]) as i32 {
        libc::AF_INET if raw.len() >= 8 => {
            format!("{}:{port}", std::net::Ipv4Addr::new(raw[4], raw[5], raw[6], raw[7]))
        }
        libc::AF_INET6 if raw.len() >= 24 => {
            let octets: [u8; 16] = raw[8..24].try_into().unwrap_or_default();
            format!("[{}]:{port}", std::net::Ipv6Addr::from(octets))
        }
        _ => "an unknown address".into(),
    }
}

/// At a restore, before any process is cloned: every socket of the
/// sandbox that still holds one of `set`'s connections aborted (see the
/// module docs).
pub(crate) fn destroy_old(set: &CheckpointTemplates) -> Result<()> {
    // (And the orphaned peer of one its peer closed: its new peer takes
    // its place.)
    let mut conns: Vec<(&[u8], &[u8])> = set
        .templates
        .iter()
        .flat_map(|t| &t.image.fds)
        .filter_map(|f| match &f.kind {
            FdKind::Socket { tcp: Some(c), .. } if c.refused.is_none() => Some(c),
            _ => None,
        })
        .flat_map(|c| {
            let orphan = (c.state == CLOSE_WAIT && !c.outside).then_some((&c.remote[..], &c.local[..]));
            std::iter::once((&c.local[..], &c.remote[..])).chain(orphan)
        })
        .collect();
    if conns.is_empty() {
        return Ok(());
    }
    conns.sort();
    conns.dedup();
    let host = set.templates[0].host;
    let diag = crate::sockdiag::diag_socket(host).map_err(|e| Error::Proc {
        pid: host,
        what: "a sock_diag socket",
        source: e,
    })?;
    for (local, remote) in conns {
        crate::sockdiag::destroy_tcp(&diag, local, remote).map_err(|e| Error::Proc {
            pid: host,
            what: "the old socket of a TCP connection",
            source: io::Error::new(e.kind(), format!("{} to {}: {e}", address_text(local), address_text(remote))),
        })?;
    }
    Ok(())
}

/// At a restore, every process back and none running yet: each
/// connection made anew leaves repair mode (see the module docs).
pub(crate) fn finish(handed: &super::Handed) -> Result<()> {
    for (ino, reuse_addr, not_sent) in &handed.repaired {
        let Some(s) = handed.ends.get(&Key::Tcp(*ino)) else { continue };
        let res = (|| -> io::Result<()> {
            tcp_repair::leave(s, Leave::Probe)?;
            if *reuse_addr {
                sandtree_sys::sockopt::set_raw(s, libc::SOL_SOCKET, libc::SO_REUSEADDR, &1i32.to_ne_bytes())?;
            }
            if !not_sent.is_empty() {
                tcp_repair::fill(s, not_sent)?;
            }
            Ok(())
        })();
        res.map_err(|e| Error::Proc {
            pid: HostPid(0),
            what: "a TCP connection made anew, leaving repair mode",
            source: e,
        })?;
    }
    // Connections to the outside: their daemon ends will reset them when
    // closed (no linger), in `reset_outside`.
    for (reset, _, _) in &handed.resetting {
        let linger: Vec<u8> = [1i32, 0i32].iter().flat_map(|v| v.to_ne_bytes()).collect();
        sandtree_sys::sockopt::set_raw(reset, libc::SOL_SOCKET, libc::SO_LINGER, &linger).map_err(|e| Error::Proc {
            pid: HostPid(0),
            what: "a connection to the outside, resetting",
            source: e,
        })?;
    }
    // The peers of connections their peers had closed: out of repair
    // mode, they close their side (the FIN comes after the unread bytes)
    // and are dropped (orphans, as those peers were).
    for peer in &handed.closing_peers {
        tcp_repair::leave(peer, Leave::Probe)
            .and_then(|()| Ok(rustix::net::shutdown(peer, rustix::net::Shutdown::Write)?))
            .map_err(|e| Error::Proc { pid: HostPid(0), what: "the peer of a TCP connection, closing", source: e })?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sock_diag_addresses_become_raw_socket_addresses() {
        use crate::sockdiag::raw_inet;
        let (inet, inet6) = (libc::AF_INET as u8, libc::AF_INET6 as u8);
        let v4 = raw_inet(inet, &8080u16.to_be_bytes(), &[10, 0, 2, 15, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(address_text(&v4), "10.0.2.15:8080");
        assert!(inside(&v4));
        let out = raw_inet(inet, &7u16.to_be_bytes(), &[198, 60, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(address_text(&out), "198.60.0.2:7");
        assert!(!inside(&out));
        let v6 = raw_inet(inet6, &80u16.to_be_bytes(), &std::net::Ipv6Addr::LOCALHOST.octets());
        assert_eq!(address_text(&v6), "[::1]:80");
        assert!(inside(&v6));
        let mapped = raw_inet(inet6, &80u16.to_be_bytes(), &std::net::Ipv4Addr::LOCALHOST.to_ipv6_mapped().octets());
        assert!(inside(&mapped));
    }
}
