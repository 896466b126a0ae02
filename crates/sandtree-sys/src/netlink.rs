//! Network links, addresses and routes through rtnetlink (`NETLINK_ROUTE`).
//!
//! (No move of a link between namespaces: that waits for RCU grace periods,
//! 10-50 ms here; a veth pair is made with its ends where they belong.)
//!
//! A [`Route`] socket acts on the network namespace of the thread that
//! opened it, whatever namespace the thread is in later: open one in a
//! thread that entered a namespace ([`in_netns`]) to configure that
//! namespace from the outside.
//!
//! Each request is one message with `NLM_F_ACK`; the kernel answers with an
//! `NLMSG_ERROR` whose code is 0 (done) or `-errno`. Message layout (all
//! native-endian, every part padded to 4 bytes):
//!
//! ```text
//! nlmsghdr (16) | ifinfomsg (16) / ifaddrmsg (8) / rtmsg (12) | attributes
//! attribute: len u16 | type u16 | payload | padding; nested ones hold attributes
//! ```
//!
//! Safe code only: the socket comes from rustix, messages are built as
//! bytes.

use std::io;
use std::net::Ipv4Addr;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};

use rustix::net::netlink::SocketAddrNetlink;
use rustix::net::{AddressFamily, RecvFlags, SendFlags, SocketFlags, SocketType};

const RTM_NEWLINK: u16 = 16;
const RTM_DELLINK: u16 = 17;
const RTM_GETLINK: u16 = 18;
const RTM_NEWADDR: u16 = 20;
const RTM_NEWROUTE: u16 = 24;
const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_ACK: u16 = 0x4;
const NLM_F_EXCL: u16 = 0x200;
const NLM_F_CREATE: u16 = 0x400;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const IFLA_IFNAME: u16 = 3;
const IFLA_MTU: u16 = 4;
const IFLA_LINKINFO: u16 = 18;
const IFLA_NET_NS_FD: u16 = 28;
const IFLA_INFO_KIND: u16 = 1;
const IFLA_INFO_DATA: u16 = 2;
const VETH_INFO_PEER: u16 = 1;
const IFA_ADDRESS: u16 = 1;
const IFA_LOCAL: u16 = 2;
const RTA_OIF: u16 = 4;
const RTA_GATEWAY: u16 = 5;
const NLA_F_NESTED: u16 = 0x8000;
const IFF_UP: u32 = 0x1;

/// One end of a veth pair to make: its name, the namespace it is made in
/// (`None`: the socket's), and the interface index it asks for (`0`: the
/// kernel picks; a fixed index names the link in a fresh namespace without
/// a lookup).
#[derive(Clone, Copy, Debug)]
pub struct VethEnd<'a> {
    pub name: &'a str,
    pub netns: Option<BorrowedFd<'a>>,
    pub index: i32,
}

/// An rtnetlink socket bound to the namespace it was opened in.
#[derive(Debug)]
pub struct Route {
    fd: OwnedFd,
    seq: u32,
}

impl Route {
    /// A socket on the calling thread's network namespace.
    pub fn open() -> io::Result<Route> {
        let fd = rustix::net::socket_with(AddressFamily::NETLINK, SocketType::RAW, SocketFlags::CLOEXEC, None)?;
        Ok(Route { fd, seq: 0 })
    }

    /// A veth pair `a` <-> `b`, each end made in its namespace, down.
    pub fn add_veth(&mut self, a: VethEnd<'_>, b: VethEnd<'_>, mtu: u32) -> io::Result<()> {
        let mut m = Msg::new(RTM_NEWLINK, NLM_F_CREATE | NLM_F_EXCL);
        m.ifinfo(a.index, 0, 0);
        m.attr_str(IFLA_IFNAME, a.name)?;
        m.attr_u32(IFLA_MTU, mtu);
        if let Some(ns) = a.netns {
            m.attr_u32(IFLA_NET_NS_FD, ns.as_raw_fd() as u32);
        }
        let info = m.begin(IFLA_LINKINFO);
        m.attr_str(IFLA_INFO_KIND, "veth")?;
        let data = m.begin(IFLA_INFO_DATA);
        let peer = m.begin(VETH_INFO_PEER);
        m.ifinfo(b.index, 0, 0);
        m.attr_str(IFLA_IFNAME, b.name)?;
        m.attr_u32(IFLA_MTU, mtu);
        if let Some(ns) = b.netns {
            m.attr_u32(IFLA_NET_NS_FD, ns.as_raw_fd() as u32);
        }
        m.end(peer);
        m.end(data);
        m.end(info);
        self.request(m)
    }

    /// Sets link `index` up.
    pub fn set_up(&mut self, index: i32) -> io::Result<()> {
        let mut m = Msg::new(RTM_NEWLINK, 0);
        m.ifinfo(index, IFF_UP, IFF_UP);
        self.request(m)
    }

    /// Deletes link `index` (a veth's peer goes with it).
    pub fn delete_link(&mut self, index: i32) -> io::Result<()> {
        let mut m = Msg::new(RTM_DELLINK, 0);
        m.ifinfo(index, 0, 0);
        self.request(m)
    }

    /// The index of link `name`, or `None` if there is none.
    pub fn index_of(&mut self, name: &str) -> io::Result<Option<i32>> {
        let mut m = Msg::new(RTM_GETLINK, 0);
        m.ifinfo(0, 0, 0);
        m.attr_str(IFLA_IFNAME, name)?;
        match self.exchange(m) {
            Ok(Some(index)) => Ok(Some(index)),
            Ok(None) => Err(io::Error::other("RTM_GETLINK answered without a link")),
            Err(e) if e.raw_os_error() == Some(libc::ENODEV) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Adds `addr/prefix` to link `index`.
    pub fn add_address(&mut self, index: i32, addr: Ipv4Addr, prefix: u8) -> io::Result<()> {
        let mut m = Msg::new(RTM_NEWADDR, NLM_F_CREATE | NLM_F_EXCL);
        m.bytes(&[libc::AF_INET as u8, prefix, 0, 0]);
        m.bytes(&(index as u32).to_ne_bytes());
        m.attr(IFA_LOCAL, &addr.octets());
        m.attr(IFA_ADDRESS, &addr.octets());
        self.request(m)
    }

    /// Adds the default route through `gateway` on link `index`.
    pub fn add_default_route(&mut self, index: i32, gateway: Ipv4Addr) -> io::Result<()> {
        let mut m = Msg::new(RTM_NEWROUTE, NLM_F_CREATE | NLM_F_EXCL);
        // rtmsg: family, dst_len, src_len, tos, table (main), protocol
        // (boot), scope (universe), type (unicast); flags.
        m.bytes(&[libc::AF_INET as u8, 0, 0, 0, 254, 3, 0, 1]);
        m.bytes(&0u32.to_ne_bytes());
        m.attr(RTA_GATEWAY, &gateway.octets());
        m.attr_u32(RTA_OIF, index as u32);
        self.request(m)
    }

    fn request(&mut self, m: Msg) -> io::Result<()> {
        self.exchange(m).map(|_| ())
    }

    /// Sends `m` and reads to its acknowledgement; answers the index of
    /// the link an `RTM_GETLINK` returned.
    fn exchange(&mut self, mut m: Msg) -> io::Result<Option<i32>> {
        self.seq = self.seq.wrapping_add(1);
        let seq = self.seq;
        let buf = m.finish(seq);
        rustix::net::sendto(&self.fd, &buf, SendFlags::empty(), &SocketAddrNetlink::new(0, 0))?;
        let mut found = None;
        let mut rx = vec![0u8; 32 * 1024];
        loop {
            let (n, _) = rustix::net::recv(&self.fd, &mut rx[..], RecvFlags::empty())?;
            let mut at = 0;
            while at + 16 <= n {
                let len = u32::from_ne_bytes(rx[at..at + 4].try_into().expect("4 bytes")) as usize;
                let kind = u16::from_ne_bytes(rx[at + 4..at + 6].try_into().expect("2 bytes"));
                let got_seq = u32::from_ne_bytes(rx[at + 8..at + 12].try_into().expect("4 bytes"));
                if len < 16 || at + len > n {
                    return Err(io::Error::other("truncated netlink answer"));
                }
                let body = &rx[at + 16..at + len];
                if got_seq == seq {
                    match kind {
                        NLMSG_ERROR => {
                            let code = i32::from_ne_bytes(
                                body.get(..4).ok_or_else(|| io::Error::other("short error"))?.try_into().expect("4"),
                            );
                            return if code == 0 { Ok(found) } else { Err(io::Error::from_raw_os_error(-code)) };
                        }
                        NLMSG_DONE => return Ok(found),
                        RTM_NEWLINK if body.len() >= 16 => {
                            found = Some(i32::from_ne_bytes(body[4..8].try_into().expect("4 bytes")));
                            // A GETLINK of one link answers it without an ack
                            // unless asked: we asked (NLM_F_ACK), so go on.
                        }
                        _ => {}
                    }
                }
                at += align(len);
            }
        }
    }
}

impl AsFd for Route {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// Runs `f` on a new thread that has entered network namespace `netns`
/// (the caller's threads stay where they are). What `f` opens there
/// (sockets, `/proc/sys/net` files) belongs to that namespace; a child
/// process it spawns starts in it.
pub fn in_netns<T: Send>(netns: BorrowedFd<'_>, f: impl FnOnce() -> io::Result<T> + Send) -> io::Result<T> {
    crate::process::on_thread_in(netns, rustix::thread::LinkNameSpaceType::Network, f)?
}

/// Runs `f` on a new thread in a new network namespace, and answers a
/// descriptor of that namespace with `f`'s result (the namespace lives as
/// long as the descriptor, a mount of it, or something made in it does).
pub fn new_netns<T: Send>(f: impl FnOnce() -> io::Result<T> + Send) -> io::Result<(OwnedFd, T)> {
    std::thread::scope(|s| {
        s.spawn(|| {
            nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).map_err(io::Error::from)?;
            let ns = rustix::fs::open(
                "/proc/thread-self/ns/net",
                rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::CLOEXEC,
                rustix::fs::Mode::empty(),
            )?;
            Ok((ns, f()?))
        })
        .join()
        .map_err(|_| io::Error::other("network namespace thread panicked"))?
    })
}

fn align(n: usize) -> usize {
    (n + 3) & !3
}

/// A netlink message under construction.
struct Msg {
    buf: Vec<u8>,
}

impl Msg {
    fn new(kind: u16, flags: u16) -> Msg {
        let mut buf = vec![0u8; 16];
        buf[4..6].copy_from_slice(&kind.to_ne_bytes());
        buf[6..8].copy_from_slice(&(flags | NLM_F_REQUEST | NLM_F_ACK).to_ne_bytes());
        Msg { buf }
    }

    fn ifinfo(&mut self, index: i32, flags: u32, change: u32) {
        self.bytes(&[0, 0, 0, 0]); // family AF_UNSPEC, pad, type
        self.bytes(&index.to_ne_bytes());
        self.bytes(&flags.to_ne_bytes());
        self.bytes(&change.to_ne_bytes());
    }

    fn bytes(&mut self, b: &[u8]) {
        self.buf.extend_from_slice(b);
        self.buf.resize(align(self.buf.len()), 0);
    }

    fn attr(&mut self, kind: u16, payload: &[u8]) {
        let len = (4 + payload.len()) as u16;
        self.buf.extend_from_slice(&len.to_ne_bytes());
        self.buf.extend_from_slice(&kind.to_ne_bytes());
        self.bytes(payload);
    }

    fn attr_u32(&mut self, kind: u16, v: u32) {
        self.attr(kind, &v.to_ne_bytes());
    }

    fn attr_str(&mut self, kind: u16, s: &str) -> io::Result<()> {
        if s.is_empty() || s.len() >= libc::IFNAMSIZ || s.contains('\0') {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("bad interface name {s:?}")));
        }
        let mut v = s.as_bytes().to_vec();
        v.push(0);
        self.attr(kind, &v);
        Ok(())
    }

    /// Starts a nested attribute; [`Msg::end`] writes its length.
    fn begin(&mut self, kind: u16) -> usize {
        let at = self.buf.len();
        self.buf.extend_from_slice(&0u16.to_ne_bytes());
        self.buf.extend_from_slice(&(kind | NLA_F_NESTED).to_ne_bytes());
        at
    }

    fn end(&mut self, at: usize) {
        let len = (self.buf.len() - at) as u16;
        self.buf[at..at + 2].copy_from_slice(&len.to_ne_bytes());
    }

    fn finish(&mut self, seq: u32) -> Vec<u8> {
        let len = self.buf.len() as u32;
        self.buf[0..4].copy_from_slice(&len.to_ne_bytes());
        self.buf[8..12].copy_from_slice(&seq.to_ne_bytes());
        std::mem::take(&mut self.buf)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn root() -> bool {
        rustix::process::geteuid().is_root()
    }

    #[test]
    fn a_veth_pair_between_two_new_namespaces_carries_addresses_and_routes() {
        if !root() {
            eprintln!("skipped: needs root (network namespaces)");
            return;
        }
        let (a, ()) = new_netns(|| Ok(())).unwrap();
        let (b, ()) = new_netns(|| Ok(())).unwrap();
        in_netns(a.as_fd(), || {
            let mut r = Route::open()?;
            r.add_veth(
                VethEnd { name: "left", netns: None, index: 5 },
                VethEnd { name: "right", netns: Some(b.as_fd()), index: 7 },
                1500,
            )?;
            assert_eq!(r.index_of("left")?, Some(5));
            assert_eq!(r.index_of("right")?, None);
            r.add_address(5, Ipv4Addr::new(10, 9, 0, 1), 24)?;
            r.set_up(5)
        })
        .unwrap();
        in_netns(b.as_fd(), || {
            let mut r = Route::open()?;
            assert_eq!(r.index_of("right")?, Some(7));
            r.add_address(7, Ipv4Addr::new(10, 9, 0, 2), 24)?;
            r.set_up(7)?;
            r.add_default_route(7, Ipv4Addr::new(10, 9, 0, 1))?;
            // A second identical route is refused: errors come back.
            let again = r.add_default_route(7, Ipv4Addr::new(10, 9, 0, 1)).unwrap_err();
            assert_eq!(again.raw_os_error(), Some(libc::EEXIST));
            let routes = std::fs::read_to_string("/proc/thread-self/net/route")?;
            assert!(routes.lines().any(|l| l.starts_with("right\t00000000\t0100090A")), "{routes}");
            Ok(())
        })
        .unwrap();
    }
}
