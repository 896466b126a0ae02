//! `sandtree daemon`: the engine behind an HTTP/1.1 JSON API.
//!
//! - [`routes`]: the route table and handlers (the module docs list every
//!   route and the NDJSON stream format);
//! - [`attach`]: the websocket bridge of `GET …/sessions/{sid}/attach`;
//! - [`auth`]: the bearer token of the TCP listener;
//! - [`error`]: JSON error responses and extractors;
//! - [`openapi`]: the generated OpenAPI 3 document;
//! - [`server`]: listeners (unix socket, TCP), logging, graceful shutdown;
//! - [`stdin`]: the body of an exec whose stdin streams in the request.
//!
//! Host uids: each data dir has a range of its own, recorded in
//! `<data-dir>/uid-range` and claimed host-wide while the daemon runs
//! (`sandtree_runtime::uid_range`); a start on a range another running
//! daemon holds is refused.
//!
//! Listeners: the unix socket (default `<data-dir>/sandtree.sock`, mode
//! 0600, no token) and, with `--tcp ADDR:PORT`, a TCP listener that requires
//! `Authorization: Bearer <token>` (token in `<data-dir>/token`).
//!
//! # Stopping
//! On SIGTERM or SIGINT the daemon stops accepting requests, lets running
//! ones finish (up to 10 s), removes its socket and closes the engine
//! (`sandtree_runtime::Engine::shutdown`, each step bounded by 10 s): it
//! stops every sandbox and removes its cgroup and run directory, removes
//! its parent cgroup (`--cgroup-name`) if no other daemon's sandboxes are
//! in it, unmounts the idmapped host directories under `<data-dir>/run/lower`,
//! unmounts the btrfs image and waits for its loop device to go. Nothing of
//! the data directory stays mounted, attached or in a cgroup; files on disk
//! (image, metadata, token) stay for the next start. That start boots the
//! sandboxes that were running again from their filesystems (their
//! processes from before are gone, and their status says so); sandboxes,
//! checkpoints and images are all kept. Whatever could not be removed is
//! logged with what to do. One thing no daemon can remove: a process that
//! made a mount namespace in another user namespace while the store was
//! mounted (another daemon's pre-cloned init, a rootless container) keeps
//! a locked copy of the mount, and with it the loop device, until it lets
//! go; the log names it.
//!
//! With `--keep-sandboxes` the daemon instead leaves its sandboxes running,
//! and with them the store's mount, its loop device, their cgroups and the
//! idmapped mounts: the next daemon on the same data directory re-adopts
//! them with their processes (e.g. to upgrade the daemon). A daemon killed
//! with SIGKILL leaves the same, and its next start copes likewise.

pub mod attach;
pub mod auth;
pub mod error;
pub mod mcp_http;
pub mod openapi;
pub mod routes;
pub mod server;
pub mod stdin;

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;
use sandtree_api::Limits;
use sandtree_runtime::{Config, Zygote};

use crate::units;

/// Flags of `sandtree daemon` (each also readable from the environment).
#[derive(Args, Debug, Clone)]
pub struct DaemonArgs {
    /// Root of Sandtree's state (btrfs image, metadata, token, socket).
    #[arg(long, env = "SANDTREE_DATA_DIR", default_value = "/var/lib/sandtree")]
    pub data_dir: PathBuf,
    /// Use this existing btrfs mount instead of a loop-mounted image file.
    #[arg(long, env = "SANDTREE_BTRFS_MOUNT")]
    pub btrfs_mount: Option<PathBuf>,
    /// Size of the sparse btrfs image file created on first start (e.g. 64G).
    #[arg(long, env = "SANDTREE_IMAGE_SIZE", default_value = "64G", value_parser = units::parse_size)]
    pub image_size: u64,
    /// Unix socket to listen on: the global `--socket` (`SANDTREE_SOCKET`),
    /// filled in by `main` [default: <data-dir>/sandtree.sock].
    #[arg(skip)]
    pub socket: Option<PathBuf>,
    /// Also listen on TCP (ADDR:PORT); requests there need the bearer token.
    #[arg(long, env = "SANDTREE_TCP")]
    pub tcp: Option<SocketAddr>,
    /// Also serve the E2B API (control plane and envd) on ADDR:PORT, for
    /// the official e2b SDK: E2B_API_URL=E2B_SANDBOX_URL=http://ADDR:PORT,
    /// E2B_API_KEY=<the token>.
    #[arg(long, env = "SANDTREE_E2B", value_name = "ADDR:PORT")]
    pub e2b: Option<SocketAddr>,
    /// Bearer token file for the TCP listener, generated if missing [default: <data-dir>/token].
    #[arg(long, env = "SANDTREE_TOKEN_FILE")]
    pub token_file: Option<PathBuf>,
    /// First host uid of the range sandboxes' uids 0..65536 map to, for a
    /// new data dir (kept in <data-dir>/uid-range; a data dir keeps its
    /// range) [default: the first range no other data dir claims]
    #[arg(long, env = "SANDTREE_UID_BASE")]
    pub uid_base: Option<u32>,
    /// Host-wide directory of the uid ranges' claims (one file per range,
    /// locked by the daemon that runs on it).
    #[arg(long, env = "SANDTREE_UID_REGISTRY", default_value = sandtree_runtime::uid_range::DEFAULT_REGISTRY)]
    pub uid_registry: PathBuf,
    /// Name of the cgroup that holds the sandboxes' cgroups.
    #[arg(long, env = "SANDTREE_CGROUP", default_value = "sandtree")]
    pub cgroup_name: String,
    /// Default memory limit of a sandbox (e.g. 4G).
    #[arg(long, env = "SANDTREE_MEMORY", value_parser = units::parse_size)]
    pub memory: Option<u64>,
    /// Default task limit of a sandbox.
    #[arg(long, env = "SANDTREE_PIDS")]
    pub pids: Option<u64>,
    /// Default CPU limit of a sandbox, in cores (e.g. 1.5).
    #[arg(long, env = "SANDTREE_CPUS", value_parser = units::parse_cpus)]
    pub cpus: Option<u64>,
    /// On SIGTERM/SIGINT leave the sandboxes running (with the store mounted)
    /// for the next daemon to re-adopt with their processes, instead of
    /// stopping them and leaving nothing behind.
    #[arg(long, env = "SANDTREE_KEEP_SANDBOXES")]
    pub keep_sandboxes: bool,
    /// Sandboxes' network by default: `egress` (an interface, NAT out
    /// through the host, DNS, a policy) or `none` (loopback alone; the
    /// daemon then sets up no networking at all).
    #[arg(long, env = "SANDTREE_NETWORK", default_value = "egress", value_parser = ["egress", "none"])]
    pub network: String,
    /// Host-side addresses of the sandboxes' routers (a /30 each).
    #[arg(long, env = "SANDTREE_NETWORK_RANGE", default_value = "10.213.0.0/16", value_parser = sandtree_net::Range::parse)]
    pub network_range: sandtree_net::Range,
    /// Resolver the sandboxes' DNS server asks (ADDR or ADDR:PORT,
    /// repeatable) [default: the host's /etc/resolv.conf nameservers].
    #[arg(long = "dns", env = "SANDTREE_DNS", value_delimiter = ',', value_parser = parse_resolver)]
    pub dns: Vec<SocketAddr>,
}

fn parse_resolver(s: &str) -> Result<SocketAddr, String> {
    if let Ok(a) = s.parse::<SocketAddr>() {
        return Ok(a);
    }
    s.parse::<std::net::IpAddr>()
        .map(|ip| SocketAddr::new(ip, 53))
        .map_err(|_| format!("{s:?} is not an address (ADDR or ADDR:PORT)"))
}

impl DaemonArgs {
    pub fn socket_path(&self) -> PathBuf {
        self.socket.clone().unwrap_or_else(|| self.data_dir.join("sandtree.sock"))
    }

    pub fn token_path(&self) -> PathBuf {
        self.token_file.clone().unwrap_or_else(|| self.data_dir.join("token"))
    }

    /// The engine configuration these flags describe.
    pub fn config(&self) -> Config {
        let mut cfg = Config::with_data_dir(&self.data_dir);
        cfg.btrfs_mount = self.btrfs_mount.clone();
        cfg.image_size = self.image_size;
        if let Some(u) = self.uid_base {
            cfg.uid_base = u;
        }
        cfg.cgroup_name = self.cgroup_name.clone();
        let d = &cfg.default_limits;
        cfg.default_limits = Limits {
            memory_bytes: self.memory.or(d.memory_bytes),
            pids: self.pids.or(d.pids),
            cpu_millicores: self.cpus.or(d.cpu_millicores),
        };
        cfg.network = (self.network == "egress").then(|| {
            let mut n = sandtree_runtime::NetworkConfig { range: self.network_range, ..Default::default() };
            if !self.dns.is_empty() {
                n.upstream = self.dns.clone();
            }
            n
        });
        cfg
    }
}

/// Installs the tracing subscriber (`RUST_LOG`, default `info`).
pub fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).try_init();
}

/// Runs the daemon until SIGTERM/SIGINT. Must be called while the process is
/// single-threaded: it starts the zygote, then builds the tokio runtime.
pub fn main(args: DaemonArgs) -> Result<()> {
    init_logging();
    let socket = args.socket_path();
    server::check_socket_free(&socket)?;
    let mut cfg = args.config();
    std::fs::create_dir_all(&cfg.data_dir).with_context(|| format!("creating {}", cfg.data_dir.display()))?;
    cfg.data_dir =
        std::fs::canonicalize(&cfg.data_dir).with_context(|| format!("resolving {}", cfg.data_dir.display()))?;
    // Held until the daemon exits (and by its zygote, which dies with it).
    let uid_claim = cfg.claim_uid_range(args.uid_base, &args.uid_registry)?;
    tracing::info!(
        range = sandtree_runtime::uid_range::range_text(uid_claim.base()),
        claim = %uid_claim.path().display(),
        "host uid range"
    );
    let zygote = Zygote::start(cfg.host_config()).context("starting the zygote (the daemon must run as root)")?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("sandtree")
        .build()
        .context("building the tokio runtime")?;
    let result = rt.block_on(server::run(args, cfg, zygote));
    rt.shutdown_timeout(std::time::Duration::from_secs(2));
    drop(uid_claim);
    result
}
