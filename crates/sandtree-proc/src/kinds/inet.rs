//! Inet sockets (`FdKind::Socket`, families `inet` and `inet6`). A
//! listener or a bound datagram socket is made anew at the restore with its
//! protocol, address and options (a template holding it would keep its
//! port taken after the original closed it); one several processes hold
//! (a preforking server's listener) is made once and the daemon hands it
//! to the others (`file::share_open_files`, `hand_over.rs`); an unbound
//! one is kept. A TCP
//! connection is `tcp.rs`'s, a UDP socket's queued datagrams `udp.rs`'s.
//! Refused: a connection of another protocol (SCTP, MPTCP), a TCP listener
//! with connections not accepted yet (the listener made anew has none:
//! their other ends would come back without a peer).

use super::{Kind, socket_type};
use crate::batch::{Arg, Batch};
use crate::model::{FdImage, FdKind, InetBinding, ProcessImage};

/// Inet sockets.
pub(crate) struct Inet;

impl Kind for Inet {
    fn check(&self, f: &FdImage, _p: &ProcessImage) -> std::result::Result<(), String> {
        if let Some(why) = super::udp::refusal(f) {
            return Err(why);
        }
        match &f.kind {
            FdKind::Socket { family, stream: true, connected: true, .. } => {
                Err(format!("an open {family} connection of a protocol other than TCP (its state is not captured)"))
            }
            FdKind::Socket { listening: true, inet: Some(InetBinding { not_accepted: n @ 1.., .. }), .. } => {
                Err(format!(
                    "a TCP listener with {n} connection(s) not accepted yet (made anew, it has none: their other ends would have no peer)"
                ))
            }
            _ => Ok(()),
        }
    }

    fn reopen(&self, f: &FdImage, b: &mut Batch, _handed: &super::Handed) -> bool {
        let FdKind::Socket { inet: Some(bind), stream, listening, .. } = &f.kind else { return false };
        // (One several processes hold is bound again by one of them,
        // restored before, and handed over to the others: `remake`.)
        if f.opened_by.is_some() {
            return false;
        }
        rebind(b, f.fd, f.flags, *stream, *listening, bind);
        true
    }

    /// One several processes hold (`file::share_open_files`): handed over
    /// (`hand_over::share`).
    fn remake(&self, f: &FdImage, cx: &mut super::Remake<'_>) -> crate::Result<()> {
        if matches!(f.kind, FdKind::Socket { inet: Some(_), .. }) {
            super::hand_over::share(f, cx)?;
        }
        Ok(())
    }
}

/// A bound inet socket (a listener, or a bound datagram socket) made anew
/// with its address and options, on its old descriptor number (added to
/// `b`).
fn rebind(b: &mut Batch, fd: i32, flags: u32, stream: bool, listening: bool, bind: &InetBinding) {
    let family = u16::from_ne_bytes([bind.sockaddr[0], bind.sockaddr[1]]) as u64;
    let ty = socket_type(if stream { libc::SOCK_STREAM } else { libc::SOCK_DGRAM }, flags);
    // (Its protocol: UDP-Lite is a datagram socket too.)
    let protocol = Arg::Val(bind.protocol.max(0) as u64);
    let new = b.call("socket (inet)", libc::SYS_socket, &[Arg::Val(family), Arg::Val(ty), protocol]);
    // Its other options, as they were (`procfs::INET_OPTIONS`), before the
    // bind: `IP_FREEBIND` lets it bind an address no interface has.
    for (level, name, value) in &bind.options {
        let v = b.data(value);
        let args = [new, Arg::Val(*level as u64), Arg::Val(*name as u64), v, Arg::Val(value.len() as u64)];
        b.call("setsockopt", libc::SYS_setsockopt, &args);
    }
    let mut opts = Vec::new();
    if bind.reuse_addr {
        opts.push((libc::SOL_SOCKET, libc::SO_REUSEADDR));
    }
    if bind.reuse_port {
        opts.push((libc::SOL_SOCKET, libc::SO_REUSEPORT));
    }
    if bind.v6only && family == libc::AF_INET6 as u64 {
        opts.push((libc::IPPROTO_IPV6, libc::IPV6_V6ONLY));
    }
    let one = b.data(&1i32.to_ne_bytes());
    for (level, name) in opts {
        let args = [new, Arg::Val(level as u64), Arg::Val(name as u64), one, Arg::Val(4)];
        b.call("setsockopt", libc::SYS_setsockopt, &args);
    }
    let addr = b.data(&bind.sockaddr);
    // A process killed by this rollback may still hold the port: it closes
    // its descriptors only after its memory is torn down (milliseconds for
    // a large one): the bind is retried for a while. (A port still in use
    // past that is someone else's: the rollback then restarts.)
    b.call_retrying_in_use("bind (inet)", libc::SYS_bind, &[new, addr, Arg::Val(bind.sockaddr.len() as u64)]);
    if listening {
        b.call("listen", libc::SYS_listen, &[new, Arg::Val(libc::SOMAXCONN as u64)]);
    }
    b.move_fd(new, fd, flags);
}
