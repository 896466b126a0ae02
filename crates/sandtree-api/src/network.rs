//! A sandbox's network: whether it has one, and its egress policy.
//!
//! A sandbox made with `"network": {"mode": "egress"}` (the default) has an
//! interface `eth0` with the address [`SANDBOX_ADDRESS`], a default route
//! and a DNS server at [`GATEWAY_ADDRESS`], and reaches the outside through
//! the host's NAT. `"mode": "none"` leaves it its loopback alone.
//!
//! The policy ([`NetworkPolicy`]) is two lists of rules, each an IPv4
//! address or CIDR (`10.0.0.0/8`) or a domain name (`pypi.org`, or
//! `*.github.com` for every name under it). A destination in `allow` is
//! reached whatever `deny` says; one in `deny` is refused; anything else is
//! reached, unless `deny` holds `0.0.0.0/0` (deny everything not allowed).
//! Names are matched when the sandbox resolves them through its DNS server:
//! the addresses an allowed name resolves to are let through, a denied name
//! does not resolve, and under `0.0.0.0/0` in `deny` only allowed names
//! resolve (queries would otherwise carry data out). A denied name stops
//! the name, not an address the sandbox learned elsewhere: deny addresses
//! by CIDR. A policy change applies to new connections. Link-local addresses (`169.254.0.0/16`, where clouds
//! serve instance metadata) are denied unless allowed; other sandboxes, the
//! host and the daemon are never reachable.

use std::net::Ipv4Addr;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// The sandbox's own address on `eth0` (every sandbox has the same: forks
/// of a server bound to it keep serving; each reaches the outside from an
/// outward address of its own).
pub const SANDBOX_ADDRESS: Ipv4Addr = Ipv4Addr::new(10, 0, 2, 15);
/// The sandbox's gateway and DNS server.
pub const GATEWAY_ADDRESS: Ipv4Addr = Ipv4Addr::new(10, 0, 2, 2);

/// Whether a sandbox has a network interface.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum NetworkMode {
    /// `eth0`, a route out through the host, DNS; the policy applies.
    #[default]
    Egress,
    /// Loopback only.
    None,
}

/// What may be reached from a sandbox (see the module documentation).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NetworkPolicy {
    /// Addresses, CIDRs or names always reachable.
    #[serde(default)]
    pub allow: Vec<String>,
    /// Addresses, CIDRs or names refused (`0.0.0.0/0`: all but `allow`).
    #[serde(default)]
    pub deny: Vec<String>,
}

/// `network` of `POST /v1/sandboxes`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NetworkSpec {
    /// The daemon's default when absent (egress, unless the daemon runs
    /// with `--network none`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<NetworkMode>,
    /// As [`NetworkPolicy::allow`].
    #[serde(default)]
    pub allow: Vec<String>,
    /// As [`NetworkPolicy::deny`].
    #[serde(default)]
    pub deny: Vec<String>,
}

impl NetworkSpec {
    /// Its policy part.
    pub fn policy(&self) -> NetworkPolicy {
        NetworkPolicy { allow: self.allow.clone(), deny: self.deny.clone() }
    }
}

/// A sandbox's network as the API shows it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct NetworkInfo {
    pub mode: NetworkMode,
    pub allow: Vec<String>,
    pub deny: Vec<String>,
    /// Its address inside (`eth0`), while it runs with a network.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    /// Its gateway and DNS server, while it runs with a network.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway: Option<String>,
    /// The address its traffic leaves its router with, before the host's NAT
    /// (one per sandbox: forks each have their own).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outward_address: Option<String>,
    /// Bytes the sandbox received from outside, since it started.
    #[serde(default)]
    pub rx_bytes: u64,
    /// Bytes the sandbox sent outside, since it started.
    #[serde(default)]
    pub tx_bytes: u64,
}

/// `POST /v1/sandboxes/{id}/ports`: make a port of the sandbox reachable
/// from the host.
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ExposePortRequest {
    /// The port a process listens on inside the sandbox.
    pub port: u16,
}

/// A port of a sandbox reachable from the host: connections to `address`
/// are carried by the daemon to the port inside (to `127.0.0.1`, or to the
/// sandbox's address for a server bound to it alone).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct PortInfo {
    /// The port inside the sandbox.
    pub port: u16,
    /// `127.0.0.1:<host port>`: on the daemon's host only.
    pub address: String,
    /// `http://<address>/`, for servers that speak HTTP.
    pub url: String,
    /// Connections carried so far.
    pub connections: u64,
}

/// `GET /v1/sandboxes/{id}/ports`
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema)]
pub struct PortList {
    pub ports: Vec<PortInfo>,
}
