#![forbid(unsafe_code)]
//! `sandtree-net`: a sandbox's way out.
//!
//! Each sandbox with a network (`mode: egress`, the default) gets a
//! router: a network namespace owned by the host, between the sandbox's
//! own namespace and the host's (the drawing is in [`router`]). The policy
//! lives in the router's nftables table, out of the sandbox's reach: its
//! root can change its own routes, addresses and firewall, none of which
//! the router obeys. The host has one table per daemon ([`host`]):
//! sandboxes reach neither the host nor each other, and their traffic is
//! masqueraded out.
//!
//! Routers are made ahead ([`Network`]'s pool), so a create only moves
//! `eth0` into the sandbox and sets its address and route.
//!
//! | module    | what |
//! |-----------|------|
//! | `policy`  | allow/deny rules, checked, as nftables set elements |
//! | `router`  | one router namespace: made, attached, policy set, removed |
//! | `host`    | the host's table and forwarding |
//! | `dns`     | the forwarder on the gateway address |
//! | `nft`     | running `nft -f -` |
//! | `network` | the daemon's side: configuration, pool, attachments |
//! | `peer`    | a stand-in for the internet (tests, bench) |

pub mod dns;
pub mod host;
mod network;
pub mod nft;
pub mod peer;
pub mod policy;
pub mod router;

use std::net::Ipv4Addr;

pub use network::{Attachment, Config, Network};
pub use policy::Policy;

/// Host links of routers are named `stree<slot>`.
pub const LINK_PREFIX: &str = "stree";

/// Errors of this crate.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{op}: {source}")]
    Io { op: String, source: std::io::Error },
    #[error("{0}")]
    Nft(String),
    #[error("invalid network policy: {0}")]
    Policy(String),
    #[error("no free network slot in {0} (every router address is taken)")]
    Full(Range),
}

/// The host-side addresses routers take their /30s from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Range {
    pub base: Ipv4Addr,
    pub prefix: u8,
}

impl Range {
    /// `10.213.0.0/16`: 16384 routers.
    pub const DEFAULT: Range = Range { base: Ipv4Addr::new(10, 213, 0, 0), prefix: 16 };

    /// Parses `a.b.c.d/n` (n from 8 to 28).
    pub fn parse(s: &str) -> Result<Range, String> {
        let (a, p) = s.split_once('/').ok_or("expected a.b.c.d/prefix")?;
        let base: Ipv4Addr = a.parse().map_err(|_| format!("{a:?} is not an IPv4 address"))?;
        let prefix: u8 = p.parse().ok().filter(|p| (8..=28).contains(p)).ok_or("prefix must be 8 to 28")?;
        let mask = u32::MAX << (32 - prefix);
        if u32::from(base) & !mask != 0 {
            return Err(format!("{s} has host bits set"));
        }
        Ok(Range { base, prefix })
    }

    /// How many routers fit.
    pub fn slots(&self) -> u32 {
        1 << (32 - self.prefix - 2)
    }

    /// Slot `slot`'s host address (`.1` of its /30) and router address (`.2`).
    pub fn slot_addresses(&self, slot: u32) -> (Ipv4Addr, Ipv4Addr) {
        let net = u32::from(self.base) + slot * 4;
        (Ipv4Addr::from(net + 1), Ipv4Addr::from(net + 2))
    }
}

impl std::fmt::Display for Range {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.base, self.prefix)
    }
}
