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
//! Listeners: the unix socket (default `<data-dir>/sandtree.sock`, mode
//! 0600, no token) and, with `--tcp ADDR:PORT`, a TCP listener that requires
//! `Authorization: Bearer <token>` (token in `<data-dir>/token`).
//!
//! On SIGTERM or SIGINT the daemon stops accepting requests, lets running
//! ones finish (up to 10 s), lets the removals of deleted sandboxes' cgroups
//! finish (up to 10 s more) and exits; sandboxes keep running, and the next
//! daemon on the same data directory re-adopts them.

pub mod attach;
pub mod auth;
pub mod error;
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
    /// Bearer token file for the TCP listener, generated if missing [default: <data-dir>/token].
    #[arg(long, env = "SANDTREE_TOKEN_FILE")]
    pub token_file: Option<PathBuf>,
    /// First host uid of the range sandboxes' uids 0..65536 map to.
    #[arg(long, env = "SANDTREE_UID_BASE")]
    pub uid_base: Option<u32>,
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
    let cfg = args.config();
    std::fs::create_dir_all(&cfg.data_dir).with_context(|| format!("creating {}", cfg.data_dir.display()))?;
    let zygote = Zygote::start(cfg.host_config()).context("starting the zygote (the daemon must run as root)")?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("sandtree")
        .build()
        .context("building the tokio runtime")?;
    let result = rt.block_on(server::run(args, cfg, zygote));
    rt.shutdown_timeout(std::time::Duration::from_secs(2));
    result
}
