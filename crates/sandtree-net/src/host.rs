//! The host's side: forwarding on, and one nftables table per daemon that
//! keeps sandboxes' traffic off the host and each other, and masquerades
//! what leaves for the outside.
//!
//! ```text
//! table ip <name>
//!   input:       from a sandbox link: replies pass, the rest is refused
//!                (the daemon's API, the host's services)
//!   forward:     sandbox link to sandbox link: dropped
//!   postrouting: from the sandboxes' range out of any other link: masquerade
//! ```
//!
//! Every daemon's table matches every daemon's links (`stree*`): tables
//! of two daemons on one host say the same thing.

use crate::{Error, LINK_PREFIX, Range, nft};

/// Installs (or replaces) table `name` and turns IPv4 forwarding on.
pub fn install(name: &str, range: Range) -> Result<(), Error> {
    std::fs::write("/proc/sys/net/ipv4/ip_forward", "1")
        .map_err(|e| Error::Io { op: "turning IPv4 forwarding on".into(), source: e })?;
    let links = format!("\"{LINK_PREFIX}*\"");
    let script = format!(
        "table ip {name} {{}}
delete table ip {name}
table ip {name} {{
  chain input {{
    type filter hook input priority filter; policy accept;
    iifname {links} ct state established,related accept
    iifname {links} reject with icmp type admin-prohibited
  }}
  chain forward {{
    type filter hook forward priority filter; policy accept;
    iifname {links} oifname {links} drop
  }}
  chain postrouting {{
    type nat hook postrouting priority srcnat; policy accept;
    ip saddr {range} oifname != {links} masquerade
  }}
}}
"
    );
    nft::apply(&script)
}

/// Removes table `name` (at the daemon's exit).
pub fn remove(name: &str) -> Result<(), Error> {
    nft::apply(&format!("table ip {name} {{}}\ndelete table ip {name}\n"))
}
