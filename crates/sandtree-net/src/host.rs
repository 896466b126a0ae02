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

/// Whether another table's `forward` hook drops by default (Docker sets
/// iptables' `FORWARD` policy to `DROP`): a packet must pass every base
/// chain at a hook, so sandboxes' traffic would then be dropped whatever
/// this daemon's table says. Read from `nft list ruleset`; iptables-legacy
/// rules are not visible there.
pub fn forward_dropped_elsewhere(own_table: &str) -> Option<String> {
    let out = std::process::Command::new(crate::nft::nft_path()).args(["list", "ruleset"]).output().ok()?;
    dropping_forward_chain(&String::from_utf8_lossy(&out.stdout), own_table)
}

/// The first `table … chain …` of `ruleset` (as `nft list ruleset` prints
/// it) hooked on forward with policy drop, other than in `own_table`.
fn dropping_forward_chain(ruleset: &str, own_table: &str) -> Option<String> {
    let (mut table, mut chain) = (String::new(), String::new());
    for line in ruleset.lines().map(str::trim) {
        if let Some(rest) = line.strip_prefix("table ") {
            table = rest.trim_end_matches(" {").to_string();
        } else if let Some(rest) = line.strip_prefix("chain ") {
            chain = rest.trim_end_matches(" {").to_string();
        } else if line.contains("hook forward")
            && line.contains("policy drop")
            && table.split_whitespace().nth(1) != Some(own_table)
        {
            return Some(format!("table {table} chain {chain}"));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_forward_chain_dropping_by_default_elsewhere_is_found() {
        let docker = "table ip filter {\n\tchain FORWARD {\n\t\ttype filter hook forward priority filter; policy drop;\n\t}\n}\n";
        assert_eq!(dropping_forward_chain(docker, "t_sandtree").as_deref(), Some("table ip filter chain FORWARD"));
        let ours = "table ip t_sandtree {\n\tchain forward {\n\t\ttype filter hook forward priority filter; policy drop;\n\t}\n}\n";
        assert_eq!(dropping_forward_chain(ours, "t_sandtree"), None);
        let accepting = docker.replace("policy drop", "policy accept");
        assert_eq!(dropping_forward_chain(&accepting, "t_sandtree"), None);
    }
}
