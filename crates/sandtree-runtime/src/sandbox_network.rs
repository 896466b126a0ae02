//! A sandbox's network (`sandtree-net`): attached at every boot, changed
//! by `PUT /v1/sandboxes/{id}/network`, shown in the sandbox's info.
//!
//! The record keeps the sandbox's `NetworkSpec` (mode and policy) as JSON;
//! the router itself is runtime state, one per init like a tracer: a boot
//! attaches a new one (after the init connected, before anything runs in
//! the sandbox), and a halt, stop or delete drops it with the init
//! (`Engine::live_set`). A fork gets a router of its own with the policy
//! of the sandbox it was forked from.
//!
//! In-place rollback keeps the init, its namespace and router: listening
//! sockets and the policy stay.

use std::os::fd::OwnedFd;
use std::sync::Arc;

use sandtree_api::{GATEWAY_ADDRESS, NetworkInfo, NetworkMode, NetworkPolicy, NetworkSpec, SANDBOX_ADDRESS};
use sandtree_meta::SandboxRecord;
use sandtree_net::{Attachment, Network, Policy};

use crate::{Config, Engine, Error, Result};

/// Starts the daemon's network, or none (`Config::network` unset).
pub(crate) fn start(cfg: &Config) -> Result<Option<Arc<Network>>> {
    let Some(net) = &cfg.network else { return Ok(None) };
    let network = Network::start(sandtree_net::Config {
        run_dir: cfg.run_dir(),
        table: host_table_name(&cfg.cgroup_name),
        range: net.range,
        upstream: net.upstream.clone(),
        pool: net.pool,
    })?;
    Ok(Some(network))
}

/// The name of the host's nftables table of the daemon whose cgroup is
/// `cgroup_name` (nftables names take letters, digits and `_`).
pub fn host_table_name(cgroup_name: &str) -> String {
    let name: String = cgroup_name.chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '_' }).collect();
    format!("t_{name}")
}

/// A policy checked, or an `invalid_argument` error saying what is wrong.
pub(crate) fn checked(policy: &NetworkPolicy) -> Result<Policy> {
    Policy::parse(policy).map_err(|e| Error::InvalidArgument(format!("invalid network policy: {e}")))
}

impl Engine {
    /// Whether this engine gives sandboxes networks.
    pub fn has_network(&self) -> bool {
        self.network.is_some()
    }

    /// What a new sandbox's record keeps of a create request's `network`:
    /// the mode made explicit (the daemon's default filled in), the
    /// policy checked.
    pub(crate) fn network_for_create(&self, spec: &NetworkSpec) -> Result<serde_json::Value> {
        let mode = match spec.mode {
            Some(m) => m,
            None if self.network.is_some() => NetworkMode::Egress,
            None => NetworkMode::None,
        };
        if mode == NetworkMode::Egress && self.network.is_none() {
            return Err(Error::InvalidArgument(
                "this daemon gives sandboxes no network (it runs with `--network none`): create with \"mode\": \"none\"".into(),
            ));
        }
        if mode == NetworkMode::None && !(spec.allow.is_empty() && spec.deny.is_empty()) {
            return Err(Error::InvalidArgument("a network policy needs \"mode\": \"egress\"".into()));
        }
        checked(&spec.policy())?;
        let spec = NetworkSpec { mode: Some(mode), ..spec.clone() };
        serde_json::to_value(spec).map_err(|e| Error::Internal(e.to_string()))
    }

    /// The record's network (rows older than networks: none).
    pub(crate) fn network_spec(rec: &SandboxRecord) -> NetworkSpec {
        let spec: NetworkSpec = serde_json::from_value(rec.network.clone()).unwrap_or_default();
        NetworkSpec { mode: Some(spec.mode.unwrap_or(NetworkMode::None)), ..spec }
    }

    /// Attaches a router to the sandbox whose init is `init_pid`, if its
    /// record asks for a network.
    pub(crate) async fn attach_network(&self, rec: &SandboxRecord, init_pid: i32) -> Result<Option<Attachment>> {
        let spec = Engine::network_spec(rec);
        if spec.mode != Some(NetworkMode::Egress) {
            return Ok(None);
        }
        let Some(network) = &self.network else {
            return Err(Error::InvalidArgument(format!(
                "sandbox {} has a network, and this daemon runs with `--network none`: start the daemon with networking",
                rec.id
            )));
        };
        let policy = checked(&spec.policy())?;
        let ns = open_netns(init_pid)?;
        Ok(Some(network.attach(&rec.id, ns, policy).await?))
    }

    /// Adopts the router of a sandbox whose processes outlived a daemon.
    pub(crate) async fn adopt_network(&self, rec: &SandboxRecord) {
        let spec = Engine::network_spec(rec);
        let (Some(network), Some(NetworkMode::Egress)) = (&self.network, spec.mode) else { return };
        let Ok(policy) = checked(&spec.policy()) else { return };
        match network.adopt(&rec.id, policy).await {
            Some(a) => {
                self.networks.lock().unwrap_or_else(|p| p.into_inner()).insert(rec.id.clone(), Arc::new(a));
            }
            None => tracing::warn!(
                sandbox = rec.id,
                "its router did not survive the daemon: it has no network until restarted"
            ),
        }
    }

    /// Sets a sandbox's policy: on its router now (if it runs), and in its
    /// record (for its next boot and its forks).
    pub async fn set_network_policy(&self, id: &str, policy: NetworkPolicy) -> Result<NetworkInfo> {
        let _lock = self.lock_sandbox(id).await;
        let rec = self.record(id)?;
        let spec = Engine::network_spec(&rec);
        if spec.mode != Some(NetworkMode::Egress) {
            return Err(Error::InvalidArgument(format!(
                "sandbox {id} has no network (it was created with \"mode\": \"none\"): it has no policy to change"
            )));
        }
        let checked = checked(&policy)?;
        let spec = NetworkSpec { mode: spec.mode, allow: policy.allow, deny: policy.deny };
        // (Not under the map's lock: an nftables run takes milliseconds.)
        if let Some(a) = self.attachment(id) {
            tokio::task::block_in_place(|| a.set_policy(checked))?;
        }
        let value = serde_json::to_value(&spec).map_err(|e| Error::Internal(e.to_string()))?;
        self.meta.set_sandbox_network(id, &value)?;
        Ok(self.network_info(&self.record(id)?))
    }

    /// The router attached to running sandbox `id`, if it has one.
    pub(crate) fn attachment(&self, id: &str) -> Option<Arc<Attachment>> {
        self.networks.lock().unwrap_or_else(|p| p.into_inner()).get(id).cloned()
    }

    /// The API view of a sandbox's network.
    pub(crate) fn network_info(&self, rec: &SandboxRecord) -> NetworkInfo {
        let spec = Engine::network_spec(rec);
        let mut info = NetworkInfo {
            mode: spec.mode.unwrap_or(NetworkMode::None),
            allow: spec.allow,
            deny: spec.deny,
            ..NetworkInfo::default()
        };
        if let Some(a) = self.attachment(&rec.id) {
            info.address = Some(SANDBOX_ADDRESS.to_string());
            info.gateway = Some(GATEWAY_ADDRESS.to_string());
            info.outward_address = Some(a.outward().to_string());
            (info.rx_bytes, info.tx_bytes) = a.counters();
        }
        info
    }
}

fn open_netns(pid: i32) -> Result<OwnedFd> {
    let path = format!("/proc/{pid}/ns/net");
    rustix::fs::open(&path, rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::CLOEXEC, rustix::fs::Mode::empty())
        .map_err(|e| Error::Internal(format!("opening {path}: {e}")))
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_process_engine_judges_peers_by_the_sandboxes_address() {
        assert_eq!(sandtree_proc::SANDBOX_ADDRESS, sandtree_api::SANDBOX_ADDRESS);
    }
}
