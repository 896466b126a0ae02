//! Egress policies: parsed, checked, and written as nftables set elements.
//!
//! The rules' meaning is documented in `sandtree_api::network`. Here a
//! [`Policy`] is the checked form of a `NetworkPolicy`: CIDRs and names
//! apart, each list free of duplicates, no rule in both lists.

use std::collections::BTreeSet;
use std::net::Ipv4Addr;

use sandtree_api::NetworkPolicy;

/// Most rules a policy may hold (each list).
pub const MAX_RULES: usize = 1000;

/// Addresses denied unless allowed: link-local, where clouds serve
/// instance metadata (`169.254.169.254`).
pub const DENIED_BY_DEFAULT: &[Cidr] = &[Cidr { addr: Ipv4Addr::new(169, 254, 0, 0), prefix: 16 }];

/// An IPv4 network.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Cidr {
    pub addr: Ipv4Addr,
    pub prefix: u8,
}

impl Cidr {
    /// All of IPv4.
    pub fn is_everything(&self) -> bool {
        self.prefix == 0
    }
}

impl std::fmt::Display for Cidr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

/// A domain rule: `name` exactly, or (`*.name`) every name under it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Domain {
    /// Lowercase, no trailing dot.
    pub name: String,
    pub subdomains: bool,
}

impl Domain {
    /// Whether it matches `qname` (lowercase, no trailing dot).
    pub fn matches(&self, qname: &str) -> bool {
        if self.subdomains {
            qname.len() > self.name.len() + 1
                && qname.ends_with(&self.name)
                && qname.as_bytes()[qname.len() - self.name.len() - 1] == b'.'
        } else {
            qname == self.name
        }
    }
}

/// A checked policy.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Policy {
    pub allow_cidrs: Vec<Cidr>,
    pub allow_names: Vec<Domain>,
    pub deny_cidrs: Vec<Cidr>,
    pub deny_names: Vec<Domain>,
}

/// What a name query may do under a policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NameVerdict {
    /// Resolve it; its addresses must be let through (the policy denies
    /// by default, the name is allowed).
    AllowAddresses,
    /// Resolve it; nothing to let through (reachable anyway, or not).
    Resolve,
    /// Answer that it does not exist.
    Refuse,
}

impl Policy {
    /// Checks `p`: every rule an IPv4 address, CIDR or domain name; no
    /// duplicates; no rule in both lists.
    pub fn parse(p: &NetworkPolicy) -> Result<Policy, String> {
        let mut out = Policy::default();
        let mut seen = [BTreeSet::new(), BTreeSet::new()];
        for (i, (list, which)) in [(&p.allow, "allow"), (&p.deny, "deny")].into_iter().enumerate() {
            if list.len() > MAX_RULES {
                return Err(format!("{which} has {} rules; at most {MAX_RULES}", list.len()));
            }
            for raw in list {
                let rule = Rule::parse(raw).map_err(|e| format!("{which} rule {raw:?}: {e}"))?;
                if !seen[i].insert(rule.clone()) {
                    return Err(format!("{which} rule {raw:?} is given twice"));
                }
                match (i, rule) {
                    (0, Rule::Cidr(c)) => out.allow_cidrs.push(c),
                    (0, Rule::Domain(d)) => out.allow_names.push(d),
                    (_, Rule::Cidr(c)) => out.deny_cidrs.push(c),
                    (_, Rule::Domain(d)) => out.deny_names.push(d),
                }
            }
        }
        if let Some(both) = seen[0].intersection(&seen[1]).next() {
            return Err(format!("{both} is in both allow and deny"));
        }
        Ok(out)
    }

    /// Whether everything not allowed is denied.
    pub fn denies_by_default(&self) -> bool {
        self.deny_cidrs.iter().any(Cidr::is_everything)
    }

    /// What to do with a query for `qname` (lowercase, no trailing dot).
    pub fn name_verdict(&self, qname: &str) -> NameVerdict {
        if self.allow_names.iter().any(|d| d.matches(qname)) {
            return if self.denies_by_default() { NameVerdict::AllowAddresses } else { NameVerdict::Resolve };
        }
        if self.deny_names.iter().any(|d| d.matches(qname)) {
            return NameVerdict::Refuse;
        }
        // Under deny-by-default, only allowed names resolve: queries for
        // others would carry data out through the upstream resolver.
        if self.denies_by_default() {
            return NameVerdict::Refuse;
        }
        NameVerdict::Resolve
    }

    /// The nftables statements that set the router's sets to this policy
    /// (one transaction with the rest of the script it goes in).
    pub fn nft_sets(&self, table: &str) -> String {
        let mut s = String::new();
        for set in ["allow", "deny", "allow_names"] {
            s.push_str(&format!("flush set ip {table} {set}\n"));
        }
        let deny: Vec<Cidr> = self
            .deny_cidrs
            .iter()
            .copied()
            .chain(DENIED_BY_DEFAULT.iter().copied())
            .filter(|c| !c.is_everything())
            .collect();
        for (set, cidrs) in [("allow", &self.allow_cidrs), ("deny", &deny)] {
            if !cidrs.is_empty() {
                let elems: Vec<String> = cidrs.iter().map(Cidr::to_string).collect();
                s.push_str(&format!("add element ip {table} {set} {{ {} }}\n", elems.join(", ")));
            }
        }
        s
    }

    /// The verdict for traffic matching no set: `accept`, or a reject
    /// (a refused connection fails at once instead of timing out).
    pub fn nft_default(&self) -> &'static str {
        if self.denies_by_default() { REJECT } else { "accept" }
    }
}

/// How a refused packet is answered.
pub const REJECT: &str = "reject with icmp type admin-prohibited";

/// One rule of a list.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum Rule {
    Cidr(Cidr),
    Domain(Domain),
}

impl std::fmt::Display for Rule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Rule::Cidr(c) => write!(f, "{c}"),
            Rule::Domain(d) if d.subdomains => write!(f, "*.{}", d.name),
            Rule::Domain(d) => write!(f, "{}", d.name),
        }
    }
}

impl Rule {
    fn parse(raw: &str) -> Result<Rule, String> {
        let s = raw.trim();
        if s.is_empty() {
            return Err("empty".into());
        }
        if s.contains(':') {
            return Err("IPv6 is not supported: sandboxes reach the outside over IPv4 only".into());
        }
        let looks_numeric = s.bytes().all(|b| b.is_ascii_digit() || b == b'.' || b == b'/');
        if looks_numeric {
            let (addr, prefix) = match s.split_once('/') {
                Some((a, p)) => {
                    (a, p.parse::<u8>().ok().filter(|p| *p <= 32).ok_or("the prefix length is not 0 to 32")?)
                }
                None => (s, 32),
            };
            let addr: Ipv4Addr = addr.parse().map_err(|_| "not an IPv4 address or CIDR".to_string())?;
            let net = Cidr { addr: Ipv4Addr::from(u32::from(addr) & mask(prefix)), prefix };
            if net.addr != addr {
                return Err(format!("host bits are set (the network is {net})"));
            }
            return Ok(Rule::Cidr(net));
        }
        let (name, subdomains) = match s.strip_prefix("*.") {
            Some(rest) => (rest, true),
            None => (s, false),
        };
        let name = name.strip_suffix('.').unwrap_or(name).to_ascii_lowercase();
        if name.is_empty() || name.len() > 253 {
            return Err("not a domain name (empty or longer than 253)".into());
        }
        for label in name.split('.') {
            let ok = !label.is_empty()
                && label.len() <= 63
                && label.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
                && !label.starts_with('-')
                && !label.ends_with('-');
            if !ok {
                return Err(format!("not a domain name (label {label:?}); a wildcard is only `*.` in front"));
            }
        }
        Ok(Rule::Domain(Domain { name, subdomains }))
    }
}

fn mask(prefix: u8) -> u32 {
    if prefix == 0 { 0 } else { u32::MAX << (32 - prefix) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(allow: &[&str], deny: &[&str]) -> Result<Policy, String> {
        Policy::parse(&NetworkPolicy {
            allow: allow.iter().map(|s| s.to_string()).collect(),
            deny: deny.iter().map(|s| s.to_string()).collect(),
        })
    }

    #[test]
    fn rules_are_addresses_networks_or_names() {
        let p = policy(&["10.0.0.0/8", "PyPI.org.", "*.github.com", "1.2.3.4"], &["0.0.0.0/0"]).unwrap();
        assert_eq!(p.allow_cidrs.len(), 2);
        assert_eq!(p.allow_cidrs[1], Cidr { addr: Ipv4Addr::new(1, 2, 3, 4), prefix: 32 });
        assert_eq!(p.allow_names[0].name, "pypi.org");
        assert!(p.denies_by_default());
        assert_eq!(p.name_verdict("pypi.org"), NameVerdict::AllowAddresses);
        assert_eq!(p.name_verdict("api.github.com"), NameVerdict::AllowAddresses);
        assert_eq!(p.name_verdict("github.com"), NameVerdict::Refuse);
        assert_eq!(p.name_verdict("evilpypi.org"), NameVerdict::Refuse);
        let q = policy(&[], &["0.0.0.0/0"]).unwrap();
        assert_eq!(q.name_verdict("example.com"), NameVerdict::Refuse);
        let r = policy(&[], &["example.com"]).unwrap();
        assert_eq!(r.name_verdict("example.com"), NameVerdict::Refuse);
        assert_eq!(r.name_verdict("www.example.com"), NameVerdict::Resolve);
    }

    #[test]
    fn malformed_rules_are_refused_with_the_reason() {
        for (rule, why) in [
            ("", "empty"),
            ("  ", "empty"),
            ("10.0.0.0/33", "prefix"),
            ("10.0.0.1/8", "host bits"),
            ("300.1.1.1", "IPv4"),
            ("fe80::/10", "IPv6"),
            ("exa mple.com", "domain"),
            ("a..b", "domain"),
            ("*", "domain"),
            ("foo.*.com", "domain"),
        ] {
            let e = policy(&[rule], &[]).unwrap_err();
            assert!(e.contains(why), "{rule:?}: {e}");
        }
        assert!(policy(&["1.2.3.4", "1.2.3.4/32"], &[]).unwrap_err().contains("twice"));
        assert!(policy(&["a.com"], &["A.com"]).unwrap_err().contains("both"));
    }

    #[test]
    fn sets_hold_the_rules_and_metadata_addresses_are_denied_by_default() {
        let p = policy(&["10.1.0.0/16"], &["0.0.0.0/0", "192.0.2.7"]).unwrap();
        let s = p.nft_sets("t");
        assert!(s.contains("add element ip t allow { 10.1.0.0/16 }"), "{s}");
        assert!(s.contains("add element ip t deny { 192.0.2.7/32, 169.254.0.0/16 }"), "{s}");
        assert_eq!(p.nft_default(), REJECT);
        assert_eq!(Policy::default().nft_default(), "accept");
        assert!(Policy::default().nft_sets("t").contains("deny { 169.254.0.0/16 }"));
    }
}
