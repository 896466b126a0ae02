//! A sandbox's router: a network namespace of the host's (the sandbox's
//! root has no power over it) between the sandbox and the host.
//!
//! ```text
//!  sandbox netns            router netns (one per sandbox)            host netns
//!  eth0 10.0.2.15/24  <->  sb0 10.0.2.2/24 | up0 <slot>.2/30   <->   stree<slot> <slot>.1/30
//!  default via .2          DNS forwarder on 10.0.2.2:53 (daemon)      masquerade out
//!                          policy, SNAT to <slot>.2 (table ip sandtree)
//! ```
//!
//! Every sandbox has the same inside address, so a fork (or a restore) of
//! a process bound to it works anywhere; each router has an outward
//! address of its own (`<slot>.2`), so forks connect out side by side with
//! distinct addresses and conntrack state of their own.
//!
//! A router is made ahead of need ([`Router::make`], the pool in
//! `network.rs`) with its host link; [`Router::attach`] makes the pair
//! `sb0`/`eth0` with its ends already in the two namespaces and configures
//! both (six netlink requests, ~0.5 ms). Its namespace is bind-mounted on
//! `<run_dir>/net/stree<slot>` so that a daemon restarted beside running
//! sandboxes finds it again ([`Router::reopen`]).
//!
//! Interface indexes are fixed inside the two new namespaces (`sb0` 2,
//! `up0` 4; `eth0` 2 in the sandbox's), so no lookup is needed there.

use std::net::Ipv4Addr;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};

use sandtree_sys::netlink::{Route, VethEnd, in_netns, new_netns};

use crate::policy::{Policy, REJECT};
use crate::{Error, LINK_PREFIX, Range, nft};

/// The sandbox's address inside, and its gateway (also its DNS server).
pub const SANDBOX: Ipv4Addr = sandtree_api::SANDBOX_ADDRESS;
pub const GATEWAY: Ipv4Addr = sandtree_api::GATEWAY_ADDRESS;
const INSIDE_PREFIX: u8 = 24;
const SB0: i32 = 2;
const ETH0: i32 = 2;
const UP0: i32 = 4;
const MTU: u32 = 1500;
/// The router's nftables table.
pub const TABLE: &str = "sandtree";

/// One router namespace with its links.
#[derive(Debug)]
pub struct Router {
    pub slot: u32,
    ns: OwnedFd,
    /// A netlink socket in the router's namespace (no thread needs to
    /// enter it to configure `sb0`).
    route: std::sync::Mutex<Route>,
    /// The DNS forwarder's sockets (UDP, and a TCP listener), bound ahead
    /// (`IP_FREEBIND`: `sb0` and its address come at the attach), until
    /// taken.
    dns: std::sync::Mutex<Option<DnsSockets>>,
    host_link: String,
    mount: PathBuf,
    outward: Ipv4Addr,
}

impl Router {
    /// Makes the router of `slot`. `Ok(None)`: the slot's host link exists
    /// (another daemon's), try another.
    pub fn make(slot: u32, range: Range, net_dir: &Path) -> Result<Option<Router>, Error> {
        let (host_addr, outward) = range.slot_addresses(slot);
        let host_link = format!("{LINK_PREFIX}{slot}");
        let host_ns = open_ns("/proc/self/ns/net")?;
        let mount = net_dir.join(&host_link);
        let made = new_netns(|| {
            let mut r = Route::open()?;
            r.set_up(1)?;
            match r.add_veth(
                VethEnd { name: "up0", netns: None, index: UP0 },
                VethEnd { name: &host_link, netns: Some(host_ns.as_fd()), index: 0 },
                MTU,
            ) {
                Err(e) if e.raw_os_error() == Some(nix::errno::Errno::EEXIST as i32) => return Ok(None),
                other => other?,
            }
            r.add_address(UP0, outward, 30)?;
            r.set_up(UP0)?;
            r.add_default_route(UP0, host_addr)?;
            std::fs::write("/proc/sys/net/ipv4/ip_forward", "1")?;
            nft::apply(&router_script(outward)).map_err(|e| std::io::Error::other(e.to_string()))?;
            std::fs::write(&mount, b"")?;
            nix::mount::mount(
                Some("/proc/thread-self/ns/net"),
                &mount,
                None::<&str>,
                nix::mount::MsFlags::MS_BIND,
                None::<&str>,
            )?;
            Ok(Some((r, dns_sockets()?)))
        })
        .map_err(|e| Error::Io { op: format!("making the router of slot {slot}"), source: e })?;
        let (ns, Some((route, dns))) = made else { return Ok(None) };
        let router = Router {
            slot,
            ns,
            route: std::sync::Mutex::new(route),
            dns: std::sync::Mutex::new(Some(dns)),
            host_link,
            mount,
            outward,
        };
        let mut r = Route::open().map_err(|e| router.io("netlink", e))?;
        let index = r.index_of(&router.host_link).map_err(|e| router.io("host link", e))?.ok_or_else(|| Error::Io {
            op: format!("host link {} vanished", router.host_link),
            source: std::io::Error::from(std::io::ErrorKind::NotFound),
        })?;
        r.add_address(index, host_addr, 30).map_err(|e| router.io("host address", e))?;
        r.set_up(index).map_err(|e| router.io("host link up", e))?;
        Ok(Some(router))
    }

    /// The router of `slot` a previous daemon left mounted, if any.
    pub fn reopen(slot: u32, range: Range, net_dir: &Path) -> Option<Router> {
        let host_link = format!("{LINK_PREFIX}{slot}");
        let mount = net_dir.join(&host_link);
        let ns = open_ns(&mount).ok()?;
        let (_, outward) = range.slot_addresses(slot);
        let route = in_netns(ns.as_fd(), Route::open).ok()?;
        Some(Router {
            slot,
            ns,
            route: std::sync::Mutex::new(route),
            dns: std::sync::Mutex::new(None),
            host_link,
            mount,
            outward,
        })
    }

    /// Links the sandbox's namespace `sandbox` to the router (a veth pair
    /// made with its ends in the two namespaces: moving a link between
    /// namespaces waits for RCU grace periods, 10-50 ms here, making it
    /// there does not) and gives `eth0` its address and route.
    pub fn attach(&self, sandbox: BorrowedFd<'_>) -> Result<(), Error> {
        Route::open()
            .and_then(|mut r| {
                r.add_veth(
                    VethEnd { name: "sb0", netns: Some(self.ns.as_fd()), index: SB0 },
                    VethEnd { name: "eth0", netns: Some(sandbox), index: ETH0 },
                    MTU,
                )
            })
            .map_err(|e| self.io("linking the sandbox to its router", e))?;
        {
            let mut r = self.route.lock().expect("router's netlink socket");
            r.add_address(SB0, GATEWAY, INSIDE_PREFIX).and_then(|()| r.set_up(SB0))
        }
        .map_err(|e| self.io("configuring sb0", e))?;
        in_netns(sandbox, || {
            let mut r = Route::open()?;
            r.add_address(ETH0, SANDBOX, INSIDE_PREFIX)?;
            r.set_up(ETH0)?;
            r.add_default_route(ETH0, GATEWAY)
        })
        .map_err(|e| self.io("configuring the sandbox's eth0", e))
    }

    /// Sets the policy (one nftables transaction: sets and default verdict).
    pub fn set_policy(&self, policy: &Policy) -> Result<(), Error> {
        self.nft("setting the policy", &policy_script(policy))
    }

    /// Lets `addrs` through for `ttl_s` seconds (addresses of allowed names).
    pub fn allow_learned(&self, addrs: &[Ipv4Addr], ttl_s: u32) -> Result<(), Error> {
        if addrs.is_empty() {
            return Ok(());
        }
        let elems: Vec<String> = addrs.iter().map(|a| format!("{a} timeout {ttl_s}s")).collect();
        let script = format!("add element ip {TABLE} allow_names {{ {} }}\n", elems.join(", "));
        self.nft("letting a name's addresses through", &script)
    }

    /// Applies nftables `script` (one transaction) in the router's namespace.
    fn nft(&self, op: &str, script: &str) -> Result<(), Error> {
        self.run_in(|| nft::apply(script).map_err(|e| std::io::Error::other(e.to_string()))).map_err(|e| self.io(op, e))
    }

    /// Runs `f` in the router's namespace (sockets made there stay there).
    pub fn run_in<T: Send>(&self, f: impl FnOnce() -> std::io::Result<T> + Send) -> std::io::Result<T> {
        in_netns(self.ns.as_fd(), f)
    }

    /// A connection from the router to port `port` of the sandbox's
    /// address (a server listening on every address or on that one): to
    /// the sandbox's processes, a peer outside.
    pub fn connect(&self, port: u16) -> std::io::Result<std::net::TcpStream> {
        let to = std::net::SocketAddrV4::new(SANDBOX, port);
        self.run_in(|| std::net::TcpStream::connect_timeout(&to.into(), std::time::Duration::from_secs(2)))
    }

    /// The DNS forwarder's sockets: those bound ahead, or new ones.
    pub fn dns_sockets(&self) -> std::io::Result<DnsSockets> {
        match self.dns.lock().expect("router's DNS sockets").take() {
            Some(s) => Ok(s),
            None => self.run_in(dns_sockets),
        }
    }

    /// The address its traffic leaves with (before the host's NAT).
    pub fn outward(&self) -> Ipv4Addr {
        self.outward
    }

    /// Bytes (received by the sandbox, sent by it) through its host link.
    pub fn counters(&self) -> (u64, u64) {
        let read = |name: &str| {
            std::fs::read_to_string(format!("/sys/class/net/{}/statistics/{name}", self.host_link))
                .ok()
                .and_then(|s| s.trim().parse().ok())
                .unwrap_or(0)
        };
        // The host link transmits what the sandbox receives.
        (read("tx_bytes"), read("rx_bytes"))
    }

    /// Deletes its links and its namespace's mount (the namespace goes
    /// when its last user does: the sandbox's `eth0` goes with its peer).
    pub fn remove(&self) {
        if let Ok(mut r) = Route::open()
            && let Ok(Some(index)) = r.index_of(&self.host_link)
            && let Err(e) = r.delete_link(index)
        {
            tracing::warn!(link = self.host_link, "cannot delete a sandbox's host link: {e}");
        }
        let _ = nix::mount::umount2(&self.mount, nix::mount::MntFlags::MNT_DETACH);
        let _ = std::fs::remove_file(&self.mount);
    }

    fn io(&self, op: &str, source: std::io::Error) -> Error {
        Error::Io { op: format!("{op} (router {})", self.host_link), source }
    }
}

impl AsFd for Router {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.ns.as_fd()
    }
}

/// The DNS forwarder's sockets: UDP, and a TCP listener (for answers too
/// long for a datagram).
pub type DnsSockets = (std::net::UdpSocket, std::net::TcpListener);

/// A UDP socket and a TCP listener on the gateway's port 53, non-blocking,
/// in the calling thread's namespace (bound before the address exists:
/// `IP_FREEBIND`).
fn dns_sockets() -> std::io::Result<DnsSockets> {
    use rustix::net::{AddressFamily, SocketFlags, SocketType};
    let bound = |ty: SocketType| -> std::io::Result<std::os::fd::OwnedFd> {
        let fd = rustix::net::socket_with(AddressFamily::INET, ty, SocketFlags::CLOEXEC | SocketFlags::NONBLOCK, None)?;
        rustix::net::sockopt::set_ip_freebind(&fd, true)?;
        rustix::net::bind(&fd, &std::net::SocketAddrV4::new(GATEWAY, 53))?;
        Ok(fd)
    };
    let udp = bound(SocketType::DGRAM)?;
    let tcp = bound(SocketType::STREAM)?;
    rustix::net::listen(&tcp, 64)?;
    Ok((std::net::UdpSocket::from(udp), std::net::TcpListener::from(tcp)))
}

fn open_ns(path: impl AsRef<Path>) -> Result<OwnedFd, Error> {
    let path = path.as_ref();
    rustix::fs::open(path, rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::CLOEXEC, rustix::fs::Mode::empty())
        .map_err(|e| Error::Io { op: format!("opening {}", path.display()), source: e.into() })
}

/// The policy's part of the router's table: its sets and default verdict,
/// replaced whole.
fn policy_script(policy: &Policy) -> String {
    format!(
        "{}flush chain ip {TABLE} fallthrough\nadd rule ip {TABLE} fallthrough {}\n",
        policy.nft_sets(TABLE),
        policy.nft_default()
    )
}

/// The router's table: DNS to the forwarder, nothing else to the router,
/// replies back in, the policy on the way out (the empty one, until
/// [`Router::set_policy`]), SNAT to its outward address.
fn router_script(outward: Ipv4Addr) -> String {
    let g = GATEWAY;
    let s = SANDBOX;
    format!(
        "table ip {TABLE} {{
  set allow {{ type ipv4_addr; flags interval; }}
  set deny {{ type ipv4_addr; flags interval; }}
  set allow_names {{ type ipv4_addr; flags timeout; }}
  chain prerouting {{
    type nat hook prerouting priority dstnat; policy accept;
    iifname \"sb0\" udp dport 53 ip daddr != {g} dnat to {g}:53
    iifname \"sb0\" tcp dport 53 ip daddr != {g} dnat to {g}:53
  }}
  chain input {{
    type filter hook input priority filter; policy drop;
    iifname \"lo\" accept
    ct state established,related accept
    iifname \"sb0\" ip saddr {s} ip daddr {g} udp dport 53 accept
    iifname \"sb0\" ip saddr {s} ip daddr {g} tcp dport 53 accept
    iifname \"sb0\" {REJECT}
  }}
  chain forward {{
    type filter hook forward priority filter; policy drop;
    iifname \"up0\" oifname \"sb0\" ct state established,related accept
    iifname \"sb0\" oifname \"up0\" ip saddr != {s} drop
    iifname \"sb0\" oifname \"up0\" ip daddr @allow accept
    iifname \"sb0\" oifname \"up0\" ip daddr @allow_names accept
    iifname \"sb0\" oifname \"up0\" ip daddr @deny {REJECT}
    iifname \"sb0\" oifname \"up0\" jump fallthrough
  }}
  chain fallthrough {{
  }}
  chain postrouting {{
    type nat hook postrouting priority srcnat; policy accept;
    oifname \"up0\" snat to {outward}
  }}
}}
{}",
        policy_script(&Policy::default())
    )
}
