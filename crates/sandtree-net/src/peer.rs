//! A stand-in for the internet, for tests and the bench: a network
//! namespace linked to the host (a /30 of 198.18.0.0/15, the range kept
//! for benchmarks), with servers on the peer's address:
//!
//! | port | what |
//! |------|------|
//! | [`HTTP_PORT`] | reads a request, answers `HTTP/1.0 200 OK` and `from <addr>:<port>` (the address it saw), closes |
//! | [`ECHO_PORT`] | echoes what it reads |
//! | [`SINK_PORT`] | reads to the end, then answers the byte count |
//! | 53 (UDP) | DNS: `peer.test` and names under it are the peer; other names `NXDOMAIN` |
//!
//! Traffic to it never leaves the machine. The namespace and its link go
//! when the [`Peer`] is dropped and its servers' sockets are closed (they
//! live as long as the process: fine for a test or a bench run).

use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpListener, UdpSocket};
use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use sandtree_sys::netlink::{Route, VethEnd, in_netns, new_netns};

pub const HTTP_PORT: u16 = 8080;
pub const ECHO_PORT: u16 = 7;
pub const SINK_PORT: u16 = 9;

/// The peer namespace.
pub struct Peer {
    /// The host's address on the link (what the peer sees after NAT).
    pub host: Ipv4Addr,
    /// The peer's address.
    pub peer: Ipv4Addr,
    /// Connections of the echo server that ended in a reset.
    pub echo_resets: Arc<AtomicU32>,
    _ns: OwnedFd,
}

impl Peer {
    /// Makes the namespace, its link and its servers (root only).
    pub fn new() -> std::io::Result<Peer> {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let n = (std::process::id().wrapping_mul(16) + NEXT.fetch_add(1, Ordering::SeqCst)) % 30000;
        let net = u32::from(Ipv4Addr::new(198, 18, 0, 0)) + n * 4;
        let (host, peer) = (Ipv4Addr::from(net + 1), Ipv4Addr::from(net + 2));
        let link = format!("stpeer{n}");
        let host_ns = std::fs::File::open("/proc/self/ns/net")?;
        let (ns, ()) = new_netns(|| {
            let mut r = Route::open()?;
            r.set_up(1)?;
            r.add_veth(
                VethEnd { name: "p0", netns: None, index: 2 },
                VethEnd { name: &link, netns: Some(host_ns.as_fd()), index: 0 },
                1500,
            )?;
            r.add_address(2, peer, 30)?;
            r.set_up(2)
        })?;
        let mut r = Route::open()?;
        let index = r.index_of(&link)?.ok_or_else(|| std::io::Error::other("the peer's host link vanished"))?;
        r.add_address(index, host, 30)?;
        r.set_up(index)?;
        let listen = |port| in_netns(ns.as_fd(), || TcpListener::bind((peer, port)));
        serve(listen(HTTP_PORT)?, |mut c| {
            let from = c.peer_addr()?;
            c.set_read_timeout(Some(std::time::Duration::from_millis(500)))?;
            let _ = c.read(&mut [0u8; 1024]);
            c.write_all(format!("HTTP/1.0 200 OK\r\n\r\nfrom {from}\n").as_bytes())
        });
        let echo_resets = Arc::new(AtomicU32::new(0));
        let resets = echo_resets.clone();
        serve(listen(ECHO_PORT)?, move |mut c| {
            c.set_nodelay(true)?;
            let mut buf = vec![0u8; 64 << 10];
            let echoed = (|| -> std::io::Result<()> {
                loop {
                    let n = c.read(&mut buf)?;
                    if n == 0 {
                        return Ok(());
                    }
                    c.write_all(&buf[..n])?;
                }
            })();
            if let Err(e) = &echoed
                && e.kind() == std::io::ErrorKind::ConnectionReset
            {
                resets.fetch_add(1, Ordering::SeqCst);
            }
            echoed
        });
        serve(listen(SINK_PORT)?, |mut c| {
            let mut buf = vec![0u8; 1 << 20];
            let mut total = 0u64;
            loop {
                let n = c.read(&mut buf)?;
                if n == 0 {
                    return c.write_all(format!("{total}\n").as_bytes());
                }
                total += n as u64;
            }
        });
        let udp = in_netns(ns.as_fd(), || UdpSocket::bind((peer, 53)))?;
        std::thread::spawn(move || dns_server(udp, peer));
        Ok(Peer { host, peer, echo_resets, _ns: ns })
    }
}

/// Serves each connection of `listener` on a thread of its own.
fn serve(listener: TcpListener, each: impl Fn(std::net::TcpStream) -> std::io::Result<()> + Clone + Send + 'static) {
    std::thread::spawn(move || {
        for c in listener.incoming().flatten() {
            let each = each.clone();
            std::thread::spawn(move || each(c));
        }
    });
}

/// Answers A queries for `peer.test` and the names under it with `peer`,
/// others with `NXDOMAIN`.
fn dns_server(sock: UdpSocket, peer: Ipv4Addr) {
    let mut buf = [0u8; 1500];
    loop {
        let Ok((n, from)) = sock.recv_from(&mut buf) else { continue };
        let q = &buf[..n];
        let Some((name, end)) = crate::dns::question(q) else { continue };
        let qtype = u16::from_be_bytes([q[end - 4], q[end - 3]]);
        let known = name == "peer.test" || name.ends_with(".peer.test");
        let mut a = crate::dns::error_answer(q, if known { 0 } else { 3 });
        if known && qtype == 1 {
            a[7] = 1;
            a.extend_from_slice(&[0xC0, 12, 0, 1, 0, 1, 0, 0, 0, 30, 0, 4]);
            a.extend_from_slice(&peer.octets());
        }
        let _ = sock.send_to(&a, from);
    }
}
