//! The daemon's network: its configuration, a pool of routers made ahead,
//! and the attachment of a router to a sandbox.
//!
//! Slots (a router's /30 and host link name) are claimed in order; a slot
//! whose host link exists belongs to another daemon on this host and is
//! skipped. An attachment's router is recorded in `<run_dir>/net/<sandbox>`
//! (its slot number), beside the router namespace's mount
//! `<run_dir>/net/stree<slot>`: a restarted daemon adopts the routers of
//! the sandboxes that kept running ([`Network::adopt`]) and removes the
//! others ([`Network::sweep`]).

use std::collections::BTreeSet;
use std::net::{Ipv4Addr, SocketAddr};
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, RwLock};

use tokio::sync::Notify;

use crate::policy::Policy;
use crate::router::Router;
use crate::{Error, LINK_PREFIX, Range, dns, host};

/// How long the pool waits before making a router to replace one taken.
const REFILL_DELAY: std::time::Duration = std::time::Duration::from_millis(5);

/// Settings of a daemon's network.
#[derive(Clone, Debug)]
pub struct Config {
    /// The daemon's runtime directory (routers are mounted under `net/`).
    pub run_dir: PathBuf,
    /// Name of the host's nftables table (one per daemon).
    pub table: String,
    pub range: Range,
    /// Resolvers the DNS forwarder asks.
    pub upstream: Vec<SocketAddr>,
    /// Routers kept made ahead.
    pub pool: usize,
}

impl Config {
    /// The `nameserver`s of `/etc/resolv.conf` (port 53).
    pub fn host_resolvers() -> Vec<SocketAddr> {
        std::fs::read_to_string("/etc/resolv.conf")
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().strip_prefix("nameserver"))
            .filter_map(|a| a.trim().parse::<std::net::IpAddr>().ok())
            .map(|ip| SocketAddr::new(ip, 53))
            .collect()
    }
}

/// A daemon's network.
pub struct Network {
    cfg: Config,
    net_dir: PathBuf,
    upstream: Arc<Vec<SocketAddr>>,
    state: Mutex<State>,
    wanted: Arc<Notify>,
}

#[derive(Default)]
struct State {
    ready: Vec<Router>,
    /// Slots of this daemon (ready or attached).
    held: BTreeSet<u32>,
    /// Slots whose host link another daemon holds.
    foreign: BTreeSet<u32>,
    /// Where the next claim starts looking.
    cursor: u32,
    /// Shut down: nothing more goes into `ready` (a router made ahead
    /// after that is removed at once).
    closed: bool,
}

impl Network {
    /// Installs the host's table and starts the pool. Fails (with what to
    /// install) where the host cannot give sandboxes a network.
    pub fn start(cfg: Config) -> Result<Arc<Network>, Error> {
        if !crate::nft::available() {
            return Err(Error::Nft(
                "sandbox networking needs nftables (`apt-get install nftables`), or start the daemon with `--network none`"
                    .into(),
            ));
        }
        let net_dir = cfg.run_dir.join("net");
        std::fs::create_dir_all(&net_dir)
            .map_err(|e| Error::Io { op: format!("creating {}", net_dir.display()), source: e })?;
        host::install(&cfg.table, cfg.range)?;
        if let Some(chain) = host::forward_dropped_elsewhere(&cfg.table) {
            tracing::warn!(
                chain,
                "another firewall drops forwarded packets by default (Docker does): sandboxes' traffic out will be \
                 dropped; let it through, e.g. `nft insert rule ip filter FORWARD iifname \"stree*\" accept` and \
                 `nft insert rule ip filter FORWARD oifname \"stree*\" ct state established,related accept`"
            );
        }
        let upstream = Arc::new(cfg.upstream.clone());
        let net = Arc::new(Network {
            cfg,
            net_dir,
            upstream,
            state: Mutex::new(State::default()),
            wanted: Arc::new(Notify::new()),
        });
        let weak = Arc::downgrade(&net);
        let wanted = net.wanted.clone();
        tokio::spawn(async move {
            loop {
                let Some(net) = weak.upgrade() else { return };
                let need = {
                    let s = net.state.lock().expect("network state");
                    if s.closed {
                        return;
                    }
                    s.ready.len() < net.cfg.pool
                };
                if need {
                    // After the operation that took one is done with the CPUs.
                    drop(net);
                    tokio::time::sleep(REFILL_DELAY).await;
                    let Some(net) = weak.upgrade() else { return };
                    let n = net.clone();
                    match tokio::task::spawn_blocking(move || n.make().map(|r| n.keep_ready(r))).await {
                        Ok(Ok(())) => {}
                        Ok(Err(e)) => {
                            tracing::warn!("cannot make a router ahead: {e}");
                            drop(net);
                            tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                        }
                        Err(_) => return,
                    }
                    continue;
                }
                drop(net);
                wanted.notified().await;
            }
        });
        Ok(net)
    }

    /// Makes a router on the next free slot (blocking).
    fn make(&self) -> Result<Router, Error> {
        let slots = self.cfg.range.slots();
        for _ in 0..slots {
            let slot = {
                let mut s = self.state.lock().expect("network state");
                let mut slot = s.cursor % slots;
                let mut tries = 0;
                while (s.held.contains(&slot) || s.foreign.contains(&slot)) && tries < slots {
                    slot = (slot + 1) % slots;
                    tries += 1;
                }
                if tries == slots {
                    return Err(Error::Full(self.cfg.range));
                }
                s.cursor = slot + 1;
                s.held.insert(slot);
                slot
            };
            match Router::make(slot, self.cfg.range, &self.net_dir) {
                Ok(Some(router)) => return Ok(router),
                Ok(None) => {
                    // Another daemon's: not tried again.
                    let mut s = self.state.lock().expect("network state");
                    s.held.remove(&slot);
                    s.foreign.insert(slot);
                }
                Err(e) => {
                    self.state.lock().expect("network state").held.remove(&slot);
                    return Err(e);
                }
            }
        }
        Err(Error::Full(self.cfg.range))
    }

    /// Puts a router made ahead in the pool; removes it if the network was
    /// shut down while it was being made (no one would release it).
    fn keep_ready(&self, router: Router) {
        let mut s = self.state.lock().expect("network state");
        if !s.closed {
            s.ready.push(router);
            return;
        }
        drop(s);
        self.release(&router);
    }

    /// Gives sandbox `id` (whose namespace `sandbox_ns` is) a router with
    /// `policy`, and starts its DNS forwarder.
    pub async fn attach(self: &Arc<Self>, id: &str, sandbox_ns: OwnedFd, policy: Policy) -> Result<Attachment, Error> {
        let ready = self.state.lock().expect("network state").ready.pop();
        self.wanted.notify_one();
        let net = self.clone();
        let id2 = id.to_string();
        let followed = policy.clone();
        let t0 = std::time::Instant::now();
        let pooled = ready.is_some();
        let router = tokio::task::spawn_blocking(move || -> Result<Router, Error> {
            let router = match ready {
                Some(r) => r,
                None => net.make()?,
            };
            let done = router
                .attach(std::os::fd::AsFd::as_fd(&sandbox_ns))
                .and_then(|()| if policy != Policy::default() { router.set_policy(&policy) } else { Ok(()) })
                .and_then(|()| net.record(&id2, router.slot));
            match done {
                Ok(()) => Ok(router),
                Err(e) => {
                    net.release(&router);
                    Err(e)
                }
            }
        })
        .await
        .map_err(|e| Error::Io { op: "attaching a network".into(), source: std::io::Error::other(e) })??;
        let a = self.serve(id, router)?;
        a.follow(followed);
        tracing::debug!(pooled, us = t0.elapsed().as_micros() as u64, "network attached");
        Ok(a)
    }

    fn serve(self: &Arc<Self>, id: &str, router: Router) -> Result<Attachment, Error> {
        let router = Arc::new(router);
        let (sock, listener) =
            router.dns_sockets().map_err(|e| Error::Io { op: "binding the DNS forwarder".into(), source: e })?;
        let listener = tokio::net::TcpListener::from_std(listener)
            .map_err(|e| Error::Io { op: "DNS listener".into(), source: e })?;
        let sock =
            tokio::net::UdpSocket::from_std(sock).map_err(|e| Error::Io { op: "DNS socket".into(), source: e })?;
        let policy = Arc::new(RwLock::new(Policy::default()));
        let dns = tokio::spawn(dns::serve(sock, listener, router.clone(), policy.clone(), self.upstream.clone()))
            .abort_handle();
        Ok(Attachment { kept: Default::default(), id: id.to_string(), router, policy, dns, network: self.clone() })
    }

    /// The router a previous daemon attached to sandbox `id` (still
    /// running), with `policy`; `None` if there is none.
    pub async fn adopt(self: &Arc<Self>, id: &str, policy: Policy) -> Option<Attachment> {
        let slot: u32 = std::fs::read_to_string(self.net_dir.join(id)).ok()?.trim().parse().ok()?;
        let router = Router::reopen(slot, self.cfg.range, &self.net_dir)?;
        self.state.lock().expect("network state").held.insert(slot);
        let a = self.serve(id, router).ok()?;
        a.follow(policy);
        Some(a)
    }

    /// Removes routers under `net/` that no attachment holds (left by a
    /// daemon that died), and their records.
    pub fn sweep(&self) {
        let held = self.state.lock().expect("network state").held.clone();
        let Ok(dir) = std::fs::read_dir(&self.net_dir) else { return };
        for e in dir.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if let Some(slot) = name.strip_prefix(LINK_PREFIX).and_then(|s| s.parse::<u32>().ok()) {
                if !held.contains(&slot)
                    && let Some(r) = Router::reopen(slot, self.cfg.range, &self.net_dir)
                {
                    r.remove();
                }
            } else if let Ok(slot) = std::fs::read_to_string(e.path()).unwrap_or_default().trim().parse::<u32>()
                && !held.contains(&slot)
            {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }

    fn record(&self, id: &str, slot: u32) -> Result<(), Error> {
        let path = self.net_dir.join(id);
        std::fs::write(&path, format!("{slot}\n"))
            .map_err(|e| Error::Io { op: format!("writing {}", path.display()), source: e })
    }

    /// Removes `router` and frees its slot.
    fn release(&self, router: &Router) {
        router.remove();
        self.state.lock().expect("network state").held.remove(&router.slot);
    }

    /// Removes the routers made ahead and the host's table, once the
    /// routers being removed are gone (daemon exit, sandboxes stopped).
    pub fn shutdown(&self) {
        let ready = {
            let mut s = self.state.lock().expect("network state");
            s.closed = true;
            std::mem::take(&mut s.ready)
        };
        // (The refill task sees `closed` and ends; one it is making now is
        // removed by `keep_ready`, and waited for below.)
        self.wanted.notify_one();
        for r in ready {
            self.release(&r);
        }
        // The routers of the sandboxes just stopped are being removed.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while !self.state.lock().expect("network state").held.is_empty() && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let left = self.state.lock().expect("network state").held.clone();
        if !left.is_empty() {
            tracing::warn!(?left, "routers still held at shutdown: their links and mounts under net/ stay");
        }
        if let Err(e) = host::remove(&self.cfg.table) {
            tracing::warn!("cannot remove the host's network table: {e}");
        }
    }
}

/// A sandbox's router, attached; dropping it removes the router.
pub struct Attachment {
    /// Left to the next daemon ([`Attachment::keep`]): dropping it then
    /// removes nothing.
    kept: std::sync::atomic::AtomicBool,
    id: String,
    router: Arc<Router>,
    policy: Arc<RwLock<Policy>>,
    dns: tokio::task::AbortHandle,
    network: Arc<Network>,
}

impl Attachment {
    /// Sets a new policy (blocking: one nftables transaction).
    pub fn set_policy(&self, policy: Policy) -> Result<(), Error> {
        self.router.set_policy(&policy)?;
        *self.policy.write().expect("policy") = policy;
        Ok(())
    }

    /// Sets the policy the DNS forwarder follows, without touching the
    /// router (right after [`Network::attach`], which set it there).
    pub fn follow(&self, policy: Policy) {
        *self.policy.write().expect("policy") = policy;
    }

    /// Leaves the router to the next daemon (the sandbox keeps running):
    /// its mount and record stay for [`Network::adopt`].
    pub fn keep(&self) {
        self.kept.store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// Its router (to work with it without holding the attachment).
    pub fn router(&self) -> Arc<Router> {
        self.router.clone()
    }

    pub fn outward(&self) -> Ipv4Addr {
        self.router.outward()
    }

    /// (received, sent) bytes.
    pub fn counters(&self) -> (u64, u64) {
        self.router.counters()
    }
}

impl Drop for Attachment {
    /// The router is removed on a thread of its own: deleting a link
    /// waits for RCU grace periods (20-50 ms here), which a delete or a
    /// stop need not wait for. Its slot is free once it is gone.
    fn drop(&mut self) {
        self.dns.abort();
        if self.kept.load(std::sync::atomic::Ordering::SeqCst) {
            return;
        }
        let _ = std::fs::remove_file(self.network.net_dir.join(&self.id));
        let (router, network) = (self.router.clone(), self.network.clone());
        let removal = move || network.release(&router);
        if std::thread::Builder::new().name("router-removal".into()).spawn(removal.clone()).is_err() {
            removal();
        }
    }
}
