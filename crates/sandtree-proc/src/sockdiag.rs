//! The peer of a unix socket, by `NETLINK_SOCK_DIAG` (what `ss -x` shows);
//! and a TCP socket found by its addresses and destroyed (what `ss -K`
//! does).
//!
//! Unix sockets belong to a network namespace: the query goes through a
//! netlink socket made in the sandbox's (a short-lived thread enters it
//! with `setns`; the socket stays bound to it).
//!
//! Request: `nlmsghdr` (type `SOCK_DIAG_BY_FAMILY` = 20, `NLM_F_REQUEST`),
//! then `struct unix_diag_req { u8 family = AF_UNIX, u8 protocol = 0, u16
//! pad, u32 states (all), u32 ino, u32 show (UDIAG_SHOW_PEER = 4, here with `UDIAG_SHOW_VFS`), u32
//! cookie[2] (INET_DIAG_NOCOOKIE: ~0) }`. Answer: `nlmsghdr`, `struct
//! unix_diag_msg { u8 family, type, state, pad; u32 ino; u32 cookie[2] }`,
//! then attributes (`u16 len, u16 type`, 4-byte aligned);
//! `UNIX_DIAG_PEER` (2) holds the peer's inode (u32), `UNIX_DIAG_SHUTDOWN`
//! (6) the socket's shutdown bits (u8: 1 receive, 2 send), `UNIX_DIAG_VFS`
//! (1, asked with `UDIAG_SHOW_VFS` = 2) the inode and device of a bound
//! socket's file (`u32 ino, u32 dev`). An error answer
//! is `NLMSG_ERROR` (2) with a negative errno.

//!
//! TCP: `struct inet_diag_req_v2 { u8 family, u8 protocol = IPPROTO_TCP,
//! u8 ext = 0, u8 pad; u32 states; struct inet_diag_sockid id }`, where
//! `inet_diag_sockid` is `{ be16 sport, be16 dport; be32 src[4], dst[4];
//! u32 if; u32 cookie[2] }` (own address first, as the socket sees it).
//! With `NLM_F_DUMP` (and `states` a mask) it lists every socket in
//! those states ([`tcp_connections`]: a rollback's check for connections
//! to the outside; unlike `/proc/<pid>/net/tcp`, it skips the listening
//! table when `LISTEN` is not asked for, and walks the connection table
//! once). Without `NLM_F_DUMP` it names one socket: the kernel looks it up as a
//! packet to it would be, so a connection's, or else the listener of its
//! port. The answer is `struct inet_diag_msg { u8 family, state, timer,
//! retrans; inet_diag_sockid id; u32 expires, rqueue, wqueue, uid,
//! inode }`. `SOCK_DESTROY` (21) with the same request aborts that socket
//! (a reset is sent to its peer, and it leaves the connection table).

use std::io;
use std::os::fd::OwnedFd;

use crate::HostPid;

const SOCK_DIAG_BY_FAMILY: u16 = 20;
const SOCK_DESTROY: u16 = 21;
/// `TCP_LISTEN`, as `inet_diag_msg` gives a socket's state.
const TCP_LISTEN: u8 = 10;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const NLM_F_REQUEST: u16 = 1;
const NLM_F_DUMP: u16 = 0x300;
const NLM_F_ACK: u16 = 4;
const UDIAG_SHOW_VFS: u32 = 2;
const UDIAG_SHOW_PEER: u32 = 4;
const UNIX_DIAG_VFS: u16 = 1;
const UNIX_DIAG_PEER: u16 = 2;
const UNIX_DIAG_SHUTDOWN: u16 = 6;

/// What sock_diag tells of a unix socket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UnixState {
    /// Its peer's inode, if it has one.
    pub peer: Option<u64>,
    /// It can no longer receive (`shutdown(SHUT_RD)` here or `SHUT_WR` by
    /// the peer): nothing can be queued on it again.
    pub rcv_shutdown: bool,
    /// It can no longer send (`shutdown(SHUT_WR)` here or `SHUT_RD` by the
    /// peer).
    pub send_shutdown: bool,
    /// The inode number of its socket file, if it is bound to a path.
    pub file_ino: Option<u64>,
}

/// A socket of `family`, `ty` and `protocol` made in the network
/// namespace of `pid` (by a short-lived thread that enters it).
pub fn socket_in(pid: HostPid, family: u16, ty: i32, protocol: i32) -> io::Result<OwnedFd> {
    let net = ("net", rustix::thread::LinkNameSpaceType::Network);
    sandtree_sys::process::on_thread_in_namespace(pid.raw(), net, || -> io::Result<OwnedFd> {
        Ok(rustix::net::socket_with(
            rustix::net::AddressFamily::from_raw(family),
            rustix::net::SocketType::from_raw(ty as u32),
            rustix::net::SocketFlags::CLOEXEC,
            Some(rustix::net::Protocol::from_raw(
                std::num::NonZeroU32::new(protocol as u32).ok_or_else(|| io::Error::other("protocol 0"))?,
            )),
        )?)
    })?
}

/// A `NETLINK_SOCK_DIAG` socket in the network namespace of `pid`.
pub fn diag_socket(pid: HostPid) -> io::Result<OwnedFd> {
    socket_in(pid, libc::AF_NETLINK as u16, libc::SOCK_DGRAM, libc::NETLINK_SOCK_DIAG)
}

/// The peer and shutdown state of unix socket `ino`.
pub fn unix_state(diag: &OwnedFd, ino: u64) -> io::Result<UnixState> {
    let mut req = Vec::with_capacity(24);
    req.extend_from_slice(&[libc::AF_UNIX as u8, 0, 0, 0]);
    req.extend_from_slice(&u32::MAX.to_ne_bytes()); // every state
    req.extend_from_slice(&(ino as u32).to_ne_bytes());
    req.extend_from_slice(&(UDIAG_SHOW_PEER | UDIAG_SHOW_VFS).to_ne_bytes());
    req.extend_from_slice(&u32::MAX.to_ne_bytes());
    req.extend_from_slice(&u32::MAX.to_ne_bytes());
    parse_state(&exchange(diag, SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST, &req)?)
}

/// Sends one request of type `kind` with `flags` and `body` (after the
/// `nlmsghdr`, which this writes).
fn send_request(diag: &OwnedFd, kind: u16, flags: u16, body: &[u8]) -> io::Result<()> {
    let mut req = Vec::with_capacity(16 + body.len());
    req.extend_from_slice(&(16 + body.len() as u32).to_ne_bytes()); // nlmsg_len
    req.extend_from_slice(&kind.to_ne_bytes());
    req.extend_from_slice(&flags.to_ne_bytes());
    req.extend_from_slice(&1u32.to_ne_bytes()); // seq
    req.extend_from_slice(&0u32.to_ne_bytes()); // pid
    req.extend_from_slice(body);
    rustix::net::send(diag, &req, rustix::net::SendFlags::empty())?;
    Ok(())
}

/// One request (see [`send_request`]), and the answer as it came.
fn exchange(diag: &OwnedFd, kind: u16, flags: u16, body: &[u8]) -> io::Result<Vec<u8>> {
    send_request(diag, kind, flags, body)?;
    let mut buf = vec![0u8; 8192];
    let (n, _) = rustix::net::recv(diag, &mut buf[..], rustix::net::RecvFlags::empty())?;
    buf.truncate(n);
    Ok(buf)
}

/// Abort every socket of `diag`'s network namespace that holds the TCP
/// connection from `local` to `remote` (raw `sockaddr_in`/`sockaddr_in6`,
/// as `getsockname` and `getpeername` give them), whatever its state (a
/// connection closing, or in `TIME_WAIT`, included); not a listener.
/// Returns how many were aborted.
pub fn destroy_tcp(diag: &OwnedFd, local: &[u8], remote: &[u8]) -> io::Result<usize> {
    let id = inet_sockid(local, remote)?;
    let mut destroyed = 0;
    // (One socket per connection; a reset may leave its peer for the next
    // turn: a few turns at most.)
    for _ in 0..4 {
        let answer = match ask_tcp(diag, SOCK_DIAG_BY_FAMILY, local, &id, None) {
            Ok(a) => a,
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(destroyed),
            Err(e) => return Err(e),
        };
        let state = *answer.get(16 + 1).ok_or_else(|| io::Error::other("malformed sock_diag answer"))?;
        if state == TCP_LISTEN {
            return Ok(destroyed);
        }
        let cookie: [u8; 8] = answer
            .get(16 + 4 + 40..16 + 4 + 48)
            .and_then(|c| c.try_into().ok())
            .ok_or_else(|| io::Error::other("malformed sock_diag answer"))?;
        match ask_tcp(diag, SOCK_DESTROY, local, &id, Some(cookie)) {
            Ok(_) => destroyed += 1,
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(destroyed)
}

/// Every TCP socket of `diag`'s network namespace of `family` (`AF_INET`
/// or `AF_INET6`) in one of `states` (bit `1 << state`, the kernel's TCP
/// states), as raw (local, remote) `sockaddr_in`/`sockaddr_in6`: a dump
/// (`NLM_F_DUMP`), answered in several messages, `NLMSG_DONE` last.
pub fn tcp_connections(diag: &OwnedFd, family: u8, states: u32) -> io::Result<Vec<(Vec<u8>, Vec<u8>)>> {
    // (Any socket id, no cookie.)
    let req = inet_request(family, states, &[0u8; 40], [0xff; 8]);
    send_request(diag, SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST | NLM_F_DUMP, &req)?;
    let bad = || io::Error::other("malformed sock_diag answer");
    let mut out = Vec::new();
    let mut buf = vec![0u8; 32 << 10];
    loop {
        let (n, _) = rustix::net::recv(diag, &mut buf[..], rustix::net::RecvFlags::empty())?;
        let mut at = 0;
        while at + 16 <= n {
            let len = u32_at(&buf, at).ok_or_else(bad)? as usize;
            if len < 16 || at + len > n {
                return Err(bad());
            }
            match u16_at(&buf, at + 4).ok_or_else(bad)? {
                NLMSG_DONE => return Ok(out),
                NLMSG_ERROR => {
                    let errno = u32_at(&buf, at + 16).ok_or_else(bad)? as i32;
                    return Err(io::Error::from_raw_os_error(errno.wrapping_neg()));
                }
                _ => {
                    // `inet_diag_msg`: family, state, timer, retrans, then
                    // the id: sport, dport (be16), src[4], dst[4] (be32).
                    let msg = buf.get(at + 16..at + len).ok_or_else(bad)?;
                    let fam = *msg.first().ok_or_else(bad)?;
                    let id = msg.get(4..40).ok_or_else(bad)?;
                    let (sport, dport, src, dst) = (&id[0..2], &id[2..4], &id[4..20], &id[20..36]);
                    out.push((raw_inet(fam, sport, src), raw_inet(fam, dport, dst)));
                }
            }
            at += len.next_multiple_of(4);
        }
        if n == 0 {
            return Err(bad());
        }
    }
}

/// A raw `sockaddr_in` (`family` `AF_INET`: the first 4 bytes of `addr`)
/// or `sockaddr_in6` from a port and an address in network order.
pub(crate) fn raw_inet(family: u8, port: &[u8], addr: &[u8]) -> Vec<u8> {
    let mut raw = Vec::with_capacity(28);
    raw.extend_from_slice(&(family as u16).to_ne_bytes());
    raw.extend_from_slice(port);
    if family as i32 == libc::AF_INET6 {
        raw.extend_from_slice(&[0; 4]);
        raw.extend_from_slice(addr);
        raw.extend_from_slice(&[0; 4]);
    } else {
        raw.extend_from_slice(&addr[..4]);
        raw.extend_from_slice(&[0; 8]);
    }
    raw
}

/// `inet_diag_sockid` of the connection from `local` to `remote`, cookie
/// left out.
fn inet_sockid(local: &[u8], remote: &[u8]) -> io::Result<Vec<u8>> {
    let bad = || io::Error::new(io::ErrorKind::InvalidInput, "not an inet address");
    // (port, address as four be32 words)
    let split = |a: &[u8]| -> io::Result<([u8; 2], [u8; 16])> {
        let family = u16_at(a, 0).ok_or_else(bad)? as i32;
        let port: [u8; 2] = a.get(2..4).ok_or_else(bad)?.try_into().map_err(|_| bad())?;
        let mut addr = [0u8; 16];
        match family {
            libc::AF_INET => addr[..4].copy_from_slice(a.get(4..8).ok_or_else(bad)?),
            libc::AF_INET6 => addr.copy_from_slice(a.get(8..24).ok_or_else(bad)?),
            _ => return Err(bad()),
        }
        Ok((port, addr))
    };
    let ((sport, src), (dport, dst)) = (split(local)?, split(remote)?);
    let mut id = Vec::with_capacity(40);
    id.extend_from_slice(&sport);
    id.extend_from_slice(&dport);
    id.extend_from_slice(&src);
    id.extend_from_slice(&dst);
    id.extend_from_slice(&0u32.to_ne_bytes()); // interface
    Ok(id)
}

/// `struct inet_diag_req_v2` for TCP sockets of `family` in `states`,
/// `id` an `inet_diag_sockid` without its cookie.
fn inet_request(family: u8, states: u32, id: &[u8], cookie: [u8; 8]) -> Vec<u8> {
    let mut req = Vec::with_capacity(56);
    req.extend_from_slice(&[family, libc::IPPROTO_TCP as u8, 0, 0]);
    req.extend_from_slice(&states.to_ne_bytes());
    req.extend_from_slice(id);
    req.extend_from_slice(&cookie);
    req
}

/// One exact request about a TCP socket (`id` from [`inet_sockid`],
/// `cookie` ~0 when `None`): the answer's message, or its error.
fn ask_tcp(diag: &OwnedFd, kind: u16, local: &[u8], id: &[u8], cookie: Option<[u8; 8]>) -> io::Result<Vec<u8>> {
    let family = u16_at(local, 0).unwrap_or(0) as u8;
    let req = inet_request(family, u32::MAX, id, cookie.unwrap_or([0xff; 8]));
    // (A destroy is acknowledged: its answer is an error message, 0 on
    // success.)
    let flags = if kind == SOCK_DESTROY { NLM_F_REQUEST | NLM_F_ACK } else { NLM_F_REQUEST };
    let buf = exchange(diag, kind, flags, &req)?;
    let bad = || io::Error::other("malformed sock_diag answer");
    if u16_at(&buf, 4).ok_or_else(bad)? == NLMSG_ERROR {
        let errno = u32_at(&buf, 16).ok_or_else(bad)? as i32;
        if errno != 0 {
            return Err(io::Error::from_raw_os_error(errno.wrapping_neg()));
        }
    }
    Ok(buf)
}

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_ne_bytes(b.get(at..at + 2)?.try_into().ok()?))
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

fn parse_state(msg: &[u8]) -> io::Result<UnixState> {
    let bad = || io::Error::other("malformed sock_diag answer");
    let len = u32_at(msg, 0).ok_or_else(bad)? as usize;
    let kind = u16_at(msg, 4).ok_or_else(bad)?;
    if kind == NLMSG_ERROR {
        let errno = u32_at(msg, 16).ok_or_else(bad)? as i32;
        // (wrapping: a garbled i32::MIN must not panic.)
        return Err(io::Error::from_raw_os_error(errno.wrapping_neg()));
    }
    // Attributes follow the 16-byte header and the 16-byte unix_diag_msg:
    // an answer cut before their end is no answer (not one without a peer).
    if len.min(msg.len()) < 32 {
        return Err(bad());
    }
    let mut state = UnixState { peer: None, rcv_shutdown: false, send_shutdown: false, file_ino: None };
    let mut at = 32;
    while at + 4 <= len.min(msg.len()) {
        let alen = u16_at(msg, at).ok_or_else(bad)? as usize;
        let atype = u16_at(msg, at + 2).ok_or_else(bad)?;
        if alen < 4 {
            return Err(bad());
        }
        match atype {
            UNIX_DIAG_PEER => state.peer = Some(u32_at(msg, at + 4).ok_or_else(bad)? as u64),
            // (`struct unix_diag_vfs { u32 ino, dev }`.)
            UNIX_DIAG_VFS => state.file_ino = Some(u32_at(msg, at + 4).ok_or_else(bad)? as u64),
            UNIX_DIAG_SHUTDOWN => {
                let bits = msg.get(at + 4).ok_or_else(bad)?;
                state.rcv_shutdown = bits & 1 != 0;
                state.send_shutdown = bits & 2 != 0;
            }
            _ => {}
        }
        at += alen.next_multiple_of(4);
    }
    Ok(state)
}

#[cfg(test)]
mod tests {
    use super::*;

    // Answers captured from the kernel to `unix_state`'s request
    // (tests/fixtures/procfs/capture.py; native-endian, from x86_64), for
    // a socketpair whose ends are inodes 1665396 (a) and 1665397 (b).
    const PEER: &[u8] = include_bytes!("../tests/fixtures/procfs/sockdiag/peer.bin");
    const SHUTDOWN: &[u8] = include_bytes!("../tests/fixtures/procfs/sockdiag/shutdown.bin");
    const ENOENT: &[u8] = include_bytes!("../tests/fixtures/procfs/sockdiag/enoent.bin");
    const INODES: &str = include_str!("../tests/fixtures/procfs/sockdiag/inodes");

    fn inode(end: &str) -> u64 {
        INODES.lines().find_map(|l| l.strip_prefix(end)?.strip_prefix('\t')?.parse().ok()).expect("inodes")
    }

    #[cfg(target_endian = "little")]
    #[test]
    fn answer_for_one_end_of_a_socketpair_gives_its_peer() {
        // Arrange: the answer for a: its unix_diag_msg, UNIX_DIAG_PEER and
        // UNIX_DIAG_SHUTDOWN (0)
        let answer = PEER;

        // Act
        let state = parse_state(answer).expect("an answer");

        // Assert
        assert_eq!(state, UnixState { peer: Some(1665397), rcv_shutdown: false, send_shutdown: false, file_ino: None });
        assert_eq!(state.peer, Some(inode("b")));
        assert_eq!(u32_at(answer, 20).map(u64::from), Some(inode("a")));
    }

    #[cfg(target_endian = "little")]
    #[test]
    fn answer_for_the_end_whose_peer_shut_down_writing_says_it_cannot_receive() {
        // Arrange: the answer for b once a did shutdown(SHUT_WR)
        let answer = SHUTDOWN;

        // Act
        let state = parse_state(answer).expect("an answer");

        // Assert
        assert_eq!(
            state,
            UnixState { peer: Some(inode("a")), rcv_shutdown: true, send_shutdown: false, file_ino: None }
        );
        assert_eq!(state.peer, Some(1665396));
    }

    #[cfg(target_endian = "little")]
    #[test]
    fn answer_for_an_inode_that_is_no_socket_is_enoent() {
        // Arrange: NLMSG_ERROR with -ENOENT, and the request echoed
        let answer = ENOENT;

        // Act
        let err = parse_state(answer).expect_err("an error answer");

        // Assert
        assert_eq!(err.raw_os_error(), Some(libc::ENOENT));
        assert_eq!(err.kind(), io::ErrorKind::NotFound);
    }

    #[test]
    fn answers_cut_short_or_garbled_give_an_error_or_a_state_without_panicking() {
        // Arrange
        let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
        let mut next = |below: usize| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed % below as u64) as usize
        };

        for answer in [PEER, SHUTDOWN, ENOENT] {
            // Act & Assert: every prefix (one cut inside the headers is an
            // error, not a socket without a peer)
            for end in 0..=answer.len() {
                let parsed = std::panic::catch_unwind(|| parse_state(&answer[..end]));
                assert!(parsed.as_ref().is_ok(), "cut at {end}");
                if end < 32 {
                    assert!(parsed.is_ok_and(|p| p.is_err()), "cut at {end}");
                }
            }
            // ... and 500 garblings of a few bytes each
            for round in 0..500 {
                let mut garbled = answer.to_vec();
                for _ in 0..1 + next(6) {
                    let at = next(garbled.len());
                    garbled[at] = [0, 1, 2, 3, 4, 6, 0x7f, 0x80, 0xff][next(9)];
                }
                let parsed = std::panic::catch_unwind(|| parse_state(&garbled));
                assert!(parsed.is_ok(), "garbling {round}: {garbled:02x?}");
            }
        }
    }

    #[test]
    fn error_answer_with_the_most_negative_errno_is_an_error() {
        // Arrange: the ENOENT answer with i32::MIN as its error
        let mut answer = ENOENT.to_vec();
        answer[16..20].copy_from_slice(&i32::MIN.to_ne_bytes());

        // Act
        let parsed = std::panic::catch_unwind(|| parse_state(&answer));

        // Assert
        let err = parsed.expect("no panic").expect_err("an error answer");
        assert_eq!(err.raw_os_error(), Some(i32::MIN));
    }

    #[test]
    fn socketpair_peers_are_found() {
        let (a, b) = rustix::net::socketpair(
            rustix::net::AddressFamily::UNIX,
            rustix::net::SocketType::STREAM,
            rustix::net::SocketFlags::CLOEXEC,
            None,
        )
        .expect("socketpair");
        let ino = |fd: &OwnedFd| rustix::fs::fstat(fd).expect("fstat").st_ino;
        let diag = diag_socket(crate::HostPid(std::process::id() as i32)).expect("sock_diag socket");
        assert_eq!(
            unix_state(&diag, ino(&a)).expect("query"),
            UnixState { peer: Some(ino(&b)), rcv_shutdown: false, send_shutdown: false, file_ino: None }
        );
        rustix::net::shutdown(&a, rustix::net::Shutdown::Write).expect("shutdown");
        assert_eq!(
            unix_state(&diag, ino(&b)).expect("query"),
            UnixState { peer: Some(ino(&a)), rcv_shutdown: true, send_shutdown: false, file_ino: None }
        );
    }

    #[test]
    fn a_bound_listener_names_its_socket_file() {
        let dir = std::env::temp_dir().join(format!("sockdiag-vfs-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("s");
        let listener = std::os::unix::net::UnixListener::bind(&path).expect("bind");
        let ino = |p: &std::path::Path| std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(p).expect("stat"));
        let diag = diag_socket(crate::HostPid(std::process::id() as i32)).expect("sock_diag socket");
        let socket_ino = rustix::fs::fstat(&listener).expect("fstat").st_ino;
        let state = unix_state(&diag, socket_ino).expect("query");
        let file_ino = ino(&path);
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(state.file_ino, Some(file_ino));
    }
}
