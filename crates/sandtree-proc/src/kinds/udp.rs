//! Datagrams queued on UDP sockets (`model::UdpQueue`), IPv4 and IPv6:
//! captured at a checkpoint and sent to the socket again at a restore,
//! from their senders' addresses.
//!
//! - **Capture** (pass 1, every process stopped): through a `pidfd_getfd`
//!   copy, each datagram is peeked with its sender's address, walking the
//!   queue with `SO_PEEK_OFF` (set to 0 for the walk: each peek moves it
//!   past the datagram it read; the socket's own offset is put back).
//!   Nothing is taken: the process reads them as before (`datagrams.rs`).
//! - **Restore**: a socket the template holds (a connected one: it is not
//!   made anew) is drained first, of what came since the checkpoint
//!   ([`drain`], with the other shared objects' state). Once every process
//!   is back (a bound one is made anew by its process), each datagram is
//!   sent again ([`send_again`]) through a raw socket of the sandbox's
//!   network namespace (`IPPROTO_RAW`: the daemon writes the IP and UDP
//!   headers), from its sender's address and port to the socket's own
//!   address (its loopback address when it is bound to any): the process
//!   reads the same bytes from the same sender, in the same order.
//!
//! Not kept (not refused): what the datagrams' IP headers carried (TOS,
//! TTL, options: they come again with 0, 64, none), the destination
//! address of one sent to a socket bound to any address (`IP_PKTINFO`
//! shows loopback), and receive timestamps. Refused: another protocol than
//! UDP (UDP-Lite, ICMP "ping" sockets), a socket of a `SO_REUSEPORT`
//! group, bound to a device or with `UDP_GRO` (sent again by address, they
//! could reach another socket, be dropped, or come back coalesced), a
//! datagram larger than 65,507 bytes, an empty datagram (a peek marks it
//! peeked, and peeks at offset 0 then go past it: the kernel's rule). Not seen: an empty datagram peeked before, by the
//! process (`MSG_PEEK`) or by the check that refused it, behind another
//! (the walk goes past it).

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::OwnedFd;

use rustix::io::Errno;

use crate::fdstate::dup_from;
use crate::model::{Datagram, FdImage, FdKind, ProcessImage, UdpQueue};
use crate::template::CheckpointTemplates;
use crate::{Error, HostPid, Result};

/// The most datagrams captured from one socket (a queue is bounded by
/// its receive buffer; this bounds a walk that would not end).
const MOST: usize = 1 << 16;

/// Pass 1: the datagrams queued on the UDP sockets among `fds` of stopped
/// process `host` (into their `udp_queue`).
pub(crate) fn capture(host: HostPid, fds: &mut [FdImage]) {
    for f in fds.iter_mut().filter(|f| f.same_as.is_none()) {
        let FdKind::Socket { family, stream: false, listening: false, queued: true, udp_queue, .. } = &mut f.kind
        else {
            continue;
        };
        if !family.starts_with("inet") {
            continue;
        }
        let refused =
            |why: String| UdpQueue { to: (Ipv4Addr::UNSPECIFIED, 0).into(), datagrams: Vec::new(), refused: Some(why) };
        let q = match dup_from(host, f.fd).and_then(|sock| capture_one(&sock)) {
            Ok(q) => q,
            Err(e) => refused(format!("a UDP socket whose queued datagrams cannot be captured: {e}")),
        };
        *udp_queue = Some(Box::new(q));
    }
}

/// The datagrams queued on socket `sock` (see the module docs).
fn capture_one(sock: &OwnedFd) -> io::Result<UdpQueue> {
    let protocol = sandtree_sys::sockopt::get_raw(sock, libc::SOL_SOCKET, libc::SO_PROTOCOL, 4)?;
    if protocol.get(..4) != Some(&libc::IPPROTO_UDP.to_ne_bytes()[..]) {
        return Err(io::Error::other("a datagram protocol other than UDP"));
    }
    // Sent again by address, a datagram reaches the socket the kernel
    // picks for it: one of a `SO_REUSEPORT` group may go to another
    // member, one bound to a device may be dropped; coalesced ones
    // (`UDP_GRO`) would come back as one.
    let on = |level: i32, name: i32| {
        sandtree_sys::sockopt::get_raw(sock, level, name, 4).is_ok_and(|v| v.iter().any(|&b| b != 0))
    };
    const UDP_GRO: i32 = 104;
    if on(libc::SOL_SOCKET, libc::SO_REUSEPORT) {
        return Err(io::Error::other("a socket of a SO_REUSEPORT group (sent again, they could reach another member)"));
    }
    if on(libc::IPPROTO_UDP, UDP_GRO) {
        return Err(io::Error::other("a socket with UDP_GRO (coalesced datagrams would come back as one)"));
    }
    if sandtree_sys::sockopt::get_raw(sock, libc::SOL_SOCKET, libc::SO_BINDTODEVICE, 16)
        .is_ok_and(|v| v.first().is_some_and(|&b| b != 0))
    {
        return Err(io::Error::other("a socket bound to a device (SO_BINDTODEVICE)"));
    }
    let to = std_address(rustix::net::getsockname(sock)?)?;
    // (65,507 bytes: the most an IPv4 datagram carries.)
    let mut datagrams = Vec::new();
    for (from, bytes, _) in super::datagrams::peek_all(sock, 65_507, MOST, false)? {
        let from = from.ok_or_else(|| io::Error::other("a datagram without its sender"))?;
        datagrams.push(Datagram { from: std_address(from)?, bytes });
    }
    Ok(UdpQueue { to, datagrams, refused: None })
}

/// An inet socket address as the standard library's.
fn std_address(a: rustix::net::SocketAddrAny) -> io::Result<SocketAddr> {
    if let Ok(v4) = rustix::net::SocketAddrV4::try_from(a.clone()) {
        return Ok(SocketAddr::V4(v4));
    }
    rustix::net::SocketAddrV6::try_from(a).map(SocketAddr::V6).map_err(|_| io::Error::other("not an inet address"))
}

/// Pass 2: why the datagrams of `f` could not be captured, if so.
pub(crate) fn refusal(f: &FdImage) -> Option<String> {
    match &f.kind {
        FdKind::Socket { udp_queue: Some(q), .. } => q.refused.clone(),
        _ => None,
    }
}

/// At a restore, before any process is cloned: a UDP socket the template
/// `host` holds (not made anew) loses what came since the checkpoint (its
/// datagrams then are sent again by [`send_again`]).
pub(crate) fn drain(host: HostPid, f: &FdImage) -> Result<()> {
    let FdKind::Socket { family, stream: false, listening: false, inet: None, .. } = &f.kind else { return Ok(()) };
    if !family.starts_with("inet") || f.kind.recreated() {
        return Ok(());
    }
    let drained = (|| -> io::Result<()> {
        let sock = dup_from(host, f.fd)?;
        let mut buf = [0u8; 1];
        for _ in 0..MOST {
            match rustix::net::recv(&sock, &mut buf[..], rustix::net::RecvFlags::DONTWAIT) {
                Ok(_) | Err(Errno::INTR) => {}
                Err(Errno::AGAIN) => return Ok(()),
                Err(e) => return Err(e.into()),
            }
        }
        Err(io::Error::other("the socket does not drain"))
    })();
    drained.map_err(|e| Error::Proc { pid: host, what: "UDP socket queue", source: e })
}

/// At a restore, once every process is back: each UDP socket's datagrams
/// of the checkpoint, sent to it again from their senders.
pub(crate) fn send_again(set: &CheckpointTemplates) -> Result<()> {
    let images: Vec<(&ProcessImage, HostPid)> = set.templates.iter().map(|t| (&t.image, t.host)).collect();
    let mut raw: [Option<OwnedFd>; 2] = [None, None];
    // (A socket two processes hold is in both images: sent once.)
    let mut sent_to = std::collections::HashSet::new();
    for (image, host) in images {
        for f in image.fds.iter().filter(|f| f.same_as.is_none()) {
            let FdKind::Socket { ino, udp_queue: Some(q), .. } = &f.kind else { continue };
            if !sent_to.insert(*ino) {
                continue;
            }
            for d in &q.datagrams {
                let sent = (|| -> io::Result<()> {
                    let (packet, to) = packet(d, q.to)?;
                    let v6 = matches!(to, SocketAddr::V6(_));
                    let family = if v6 { libc::AF_INET6 } else { libc::AF_INET };
                    let sock = match &mut raw[usize::from(v6)] {
                        Some(s) => s,
                        empty => empty.insert(crate::sockdiag::socket_in(
                            host,
                            family as u16,
                            libc::SOCK_RAW,
                            libc::IPPROTO_RAW,
                        )?),
                    };
                    // (The port of a raw IPv6 destination names the protocol: 0.)
                    let dest = match to {
                        SocketAddr::V4(a) => SocketAddr::V4(std::net::SocketAddrV4::new(*a.ip(), 0)),
                        SocketAddr::V6(a) => SocketAddr::V6(std::net::SocketAddrV6::new(*a.ip(), 0, 0, a.scope_id())),
                    };
                    rustix::net::sendto(&*sock, &packet, rustix::net::SendFlags::empty(), &dest)?;
                    Ok(())
                })();
                sent.map_err(|e| Error::Proc { pid: host, what: "a UDP datagram, sent again", source: e })?;
            }
        }
    }
    Ok(())
}

/// The IP packet that carries datagram `d` to a socket whose address is
/// `to` (a loopback address for an unspecified one), and its destination.
/// An IPv4 sender of an IPv6 socket (`::ffff:a.b.c.d`) sends IPv4.
fn packet(d: &Datagram, to: SocketAddr) -> io::Result<(Vec<u8>, SocketAddr)> {
    let len = 8 + d.bytes.len();
    let from_v4 = match d.from.ip() {
        IpAddr::V4(a) => Some(a),
        IpAddr::V6(a) => a.to_ipv4_mapped(),
    };
    match from_v4 {
        Some(src) => {
            let dst = match to.ip() {
                IpAddr::V4(a) if !a.is_unspecified() => a,
                IpAddr::V6(a) if a.to_ipv4_mapped().is_some_and(|m| !m.is_unspecified()) => {
                    a.to_ipv4_mapped().unwrap_or(Ipv4Addr::LOCALHOST)
                }
                _ => Ipv4Addr::LOCALHOST,
            };
            // IPv4 header: version 4, 5 words; the kernel fills the total
            // length, the id and the header checksum (`IP_HDRINCL`).
            let total = 20 + len;
            if total > 65535 {
                return Err(io::Error::other("a datagram too large for IPv4"));
            }
            let mut p = Vec::with_capacity(total);
            p.extend_from_slice(&[0x45, 0]);
            p.extend_from_slice(&(total as u16).to_be_bytes());
            p.extend_from_slice(&[0, 0, 0, 0, 64, libc::IPPROTO_UDP as u8, 0, 0]);
            p.extend_from_slice(&src.octets());
            p.extend_from_slice(&dst.octets());
            // UDP header, checksum 0 (none: allowed over IPv4).
            p.extend_from_slice(&d.from.port().to_be_bytes());
            p.extend_from_slice(&to.port().to_be_bytes());
            p.extend_from_slice(&(len as u16).to_be_bytes());
            p.extend_from_slice(&[0, 0]);
            p.extend_from_slice(&d.bytes);
            Ok((p, SocketAddr::new(IpAddr::V4(dst), to.port())))
        }
        None => {
            let IpAddr::V6(src) = d.from.ip() else { return Err(io::Error::other("no IPv6 sender")) };
            let dst = match to.ip() {
                IpAddr::V6(a) if !a.is_unspecified() => a,
                _ => Ipv6Addr::LOCALHOST,
            };
            let mut udp = Vec::with_capacity(len);
            udp.extend_from_slice(&d.from.port().to_be_bytes());
            udp.extend_from_slice(&to.port().to_be_bytes());
            udp.extend_from_slice(&(len as u16).to_be_bytes());
            udp.extend_from_slice(&[0, 0]);
            udp.extend_from_slice(&d.bytes);
            // The checksum, which IPv6 requires, over the pseudo-header.
            let sum = checksum_v6(&src, &dst, &udp);
            udp[6..8].copy_from_slice(&sum.to_be_bytes());
            let mut p = Vec::with_capacity(40 + len);
            p.extend_from_slice(&[0x60, 0, 0, 0]);
            p.extend_from_slice(&(len as u16).to_be_bytes());
            p.extend_from_slice(&[libc::IPPROTO_UDP as u8, 64]);
            p.extend_from_slice(&src.octets());
            p.extend_from_slice(&dst.octets());
            p.extend_from_slice(&udp);
            Ok((p, SocketAddr::new(IpAddr::V6(dst), to.port())))
        }
    }
}

/// The UDP checksum of `udp` (header with a zero checksum, then data)
/// from `src` to `dst` over IPv6 (RFC 8200's pseudo-header); 0 is sent as
/// 0xffff.
fn checksum_v6(src: &Ipv6Addr, dst: &Ipv6Addr, udp: &[u8]) -> u16 {
    let mut sum: u64 = 0;
    let mut add = |b: &[u8]| {
        for pair in b.chunks(2) {
            sum += u64::from(u16::from_be_bytes([pair[0], *pair.get(1).unwrap_or(&0)]));
        }
    };
    add(&src.octets());
    add(&dst.octets());
    add(&(udp.len() as u32).to_be_bytes());
    add(&[0, 0, 0, libc::IPPROTO_UDP as u8]);
    add(udp);
    while sum >> 16 != 0 {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    match !(sum as u16) {
        0 => 0xffff,
        s => s,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_queued_datagram_is_captured_and_left_queued() {
        let r = std::net::UdpSocket::bind("127.0.0.1:0").expect("bind");
        let a = std::net::UdpSocket::bind("127.0.0.1:0").expect("bind");
        for d in [&b"one"[..], b"two", b"xyz"] {
            a.send_to(d, r.local_addr().unwrap()).expect("send");
        }
        let sock = OwnedFd::from(r.try_clone().expect("dup"));
        let q = capture_one(&sock).expect("captured");
        let got: Vec<&[u8]> = q.datagrams.iter().map(|d| d.bytes.as_slice()).collect();
        assert_eq!(got, vec![&b"one"[..], b"two", b"xyz"]);
        assert!(q.datagrams.iter().all(|d| d.from == a.local_addr().unwrap()));
        let mut buf = [0u8; 8];
        assert_eq!(r.recv(&mut buf).expect("still queued"), 3);
        // An empty one is refused.
        a.send_to(b"", r.local_addr().unwrap()).expect("send");
        assert!(capture_one(&sock).is_err(), "an empty datagram");
    }

    #[test]
    fn ipv6_checksum_of_a_known_datagram() {
        // Arrange: ::1 port 5000 to ::1 port 6000, "hi" (checksum worked
        // out by hand: the pseudo-header and the datagram summed in 16-bit
        // words, folded, complemented).
        let udp = [0x13, 0x88, 0x17, 0x70, 0, 10, 0, 0, b'h', b'i'];

        // Act
        let sum = checksum_v6(&Ipv6Addr::LOCALHOST, &Ipv6Addr::LOCALHOST, &udp);

        // Assert: 1 + 1 (addresses) + 10 (length) + 17 (protocol) + 0x1388 +
        // 0x1770 + 10 + 0x6869 = 0x9388; complemented: 0x6c77.
        assert_eq!(sum, 0x6c77);
    }

    #[test]
    fn an_ipv4_sender_of_an_ipv6_socket_bound_to_any_sends_ipv4_to_loopback() {
        let d = Datagram { from: "[::ffff:10.0.0.5]:4000".parse().unwrap(), bytes: b"x".to_vec() };
        let (p, to) = packet(&d, "[::]:9000".parse().unwrap()).expect("a packet");
        assert_eq!(to, "127.0.0.1:9000".parse::<SocketAddr>().unwrap());
        assert_eq!(p[0], 0x45);
        assert_eq!(&p[12..16], &[10, 0, 0, 5]);
        assert_eq!(&p[20..24], &[0x0f, 0xa0, 0x23, 0x28]);
        assert_eq!(p.len(), 20 + 8 + 1);
    }
}
