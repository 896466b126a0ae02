//! The `sandtree` command line.
//!
//! Every verb except `daemon`, `openapi` and `bench` talks to a running
//! daemon through [`client::Client`]: over the unix socket by default
//! (`--socket`, `SANDTREE_SOCKET`, default `/var/lib/sandtree/sandtree.sock`),
//! or over TCP with `--url http://HOST:PORT` and `--token` (`SANDTREE_URL`,
//! `SANDTREE_TOKEN`). Output is for humans unless `--json` is given, which
//! prints the daemon's JSON response as is. Errors print `error: <message>`
//! and exit 1; `exec` exits with the command's exit code.

pub mod client;
pub mod commands;
pub mod output;

use std::path::PathBuf;

use anyhow::Result;
use clap::{Args, Parser, Subcommand};

use crate::daemon::DaemonArgs;
use crate::units;
use client::{Client, Endpoint};

/// The default unix socket of the daemon (that of the default data directory).
pub const DEFAULT_SOCKET: &str = "/var/lib/sandtree/sandtree.sock";

/// Options shared by every verb.
#[derive(Args, Debug, Clone)]
pub struct GlobalArgs {
    /// The daemon's unix socket [default: /var/lib/sandtree/sandtree.sock;
    /// for `sandtree daemon`, the socket to listen on, default <data-dir>/sandtree.sock].
    #[arg(long, global = true, env = "SANDTREE_SOCKET")]
    pub socket: Option<PathBuf>,
    /// Talk to the daemon over TCP instead (http://HOST:PORT).
    #[arg(long, global = true, env = "SANDTREE_URL")]
    pub url: Option<String>,
    /// Bearer token for --url (the daemon's <data-dir>/token).
    #[arg(long, global = true, env = "SANDTREE_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// Print the daemon's JSON responses instead of human output.
    #[arg(long, global = true)]
    pub json: bool,
}

impl GlobalArgs {
    pub fn client(&self) -> Result<Client> {
        let endpoint = match &self.url {
            Some(url) => Endpoint::from_url(url)?,
            None => Endpoint::Unix(self.socket.clone().unwrap_or_else(|| PathBuf::from(DEFAULT_SOCKET))),
        };
        Ok(Client::new(endpoint, self.token.clone()))
    }
}

/// `sandtree` without the lead's `bench` verb (the binary adds it); used by tests.
#[derive(Parser, Debug)]
#[command(name = "sandtree", version, about = "Sandboxes for AI agents with millisecond checkpoint, rollback and fork")]
pub struct Cli {
    #[command(flatten)]
    pub global: GlobalArgs,
    #[command(subcommand)]
    pub command: Command,
}

/// The verbs.
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run the daemon (as root).
    Daemon(Box<DaemonArgs>),
    /// Print the OpenAPI document of the daemon's API.
    Openapi,
    /// Serve MCP on stdin and stdout: the daemon's sandboxes as tools for an
    /// agent (create, run, read and write files, checkpoint, rollback, fork,
    /// tree, delete). Add `{"command": "sandtree", "args": ["mcp"]}` to an
    /// MCP client's servers.
    Mcp,
    /// Create and start a sandbox; prints its id.
    Create(CreateArgs),
    /// Run a command in a sandbox, streaming its output; exits with its exit code.
    ///
    /// Stdin, when it is not a terminal, streams to the command (any size);
    /// stdin, stdout and stderr pass byte for byte.
    Exec(ExecArgs),
    /// Interactive shell in a sandbox (or run one command in a session with -c).
    Shell(ShellArgs),
    /// Checkpoint a sandbox; prints the checkpoint id. (`checkpoint inspect
    /// CK` shows a checkpoint's process image.)
    #[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
    Checkpoint {
        #[command(subcommand)]
        action: Option<CheckpointCommand>,
        #[arg(required = true)]
        sandbox: Option<String>,
        /// A label for the checkpoint.
        #[arg(long, short)]
        label: Option<String>,
        /// Checkpoint even if a process cannot be captured (it is then marked
        /// not restorable instead of failing the checkpoint).
        #[arg(long)]
        best_effort: bool,
        /// Return once the checkpoint's process image is written to disk
        /// (it then outlives the daemon); by default it is written after.
        #[arg(long)]
        durable: bool,
    },
    /// Roll a sandbox back to one of its checkpoints.
    Rollback {
        sandbox: String,
        checkpoint: String,
        /// When the checkpoint's processes cannot be restored (their copies
        /// were killed, evicted or lost in a daemon restart), restore the
        /// files alone and restart the sandbox with only its init, instead
        /// of failing.
        #[arg(long)]
        allow_restart: bool,
    },
    /// Create sandboxes from a checkpoint; prints their ids.
    Fork {
        checkpoint: String,
        /// How many sandboxes.
        #[arg(short = 'n', long = "count", default_value_t = 1)]
        count: u32,
        /// Label of the new sandboxes (k=v, repeatable).
        #[arg(long = "label", value_parser = parse_kv)]
        labels: Vec<(String, String)>,
        /// Copy the files alone: each fork runs only its init (by default
        /// each runs copies of the checkpoint's processes).
        #[arg(long)]
        files_only: bool,
    },
    /// List sandboxes.
    Ls,
    /// Describe a sandbox (with usage), or the daemon without an argument.
    Info { sandbox: Option<String> },
    /// Make a port a process listens on inside a sandbox reachable from
    /// the host: prints `127.0.0.1:<port>` on the daemon's host. With
    /// --listen, serve it on a local address instead, through the API (from
    /// anywhere the API reaches, with its token). Without a port, list the
    /// exposed ones.
    Port {
        sandbox: String,
        port: Option<u16>,
        /// Close the exposed port.
        #[arg(long, requires = "port")]
        close: bool,
        /// Serve the port here (ADDR:PORT), each connection carried through
        /// the API, until interrupted.
        #[arg(long, requires = "port", conflicts_with = "close")]
        listen: Option<std::net::SocketAddr>,
    },
    /// Show a sandbox's network, or replace its policy (with --allow,
    /// --deny or --clear): on the running sandbox at once, for new
    /// connections, and for its next start and its forks.
    Network {
        sandbox: String,
        /// Always reachable: an IPv4 address, a CIDR or a domain name
        /// (`*.example.com`); repeatable.
        #[arg(long = "allow", value_name = "RULE")]
        allow: Vec<String>,
        /// Refused (`0.0.0.0/0`: everything not allowed); repeatable.
        #[arg(long = "deny", value_name = "RULE")]
        deny: Vec<String>,
        /// Set an empty policy (everything reachable but metadata addresses).
        #[arg(long, conflicts_with_all = ["allow", "deny"])]
        clear: bool,
    },
    /// Show checkpoints as a tree (of one sandbox, or all); `◀ sb-…` marks
    /// where each sandbox stands.
    Tree {
        sandbox: Option<String>,
        /// Show every checkpoint of long linear runs (folded to their ends
        /// and the checkpoints sandboxes stand on by default).
        #[arg(long)]
        all: bool,
    },
    /// Delete sandboxes (ids starting with `ck-` are deleted as checkpoints).
    /// A sandbox's checkpoints outlive it (they can still seed forks): rm
    /// says how many remain, their size, and how to delete them.
    Rm {
        #[arg(required = true)]
        ids: Vec<String>,
        /// Also delete the sandboxes' checkpoints, except those another
        /// sandbox stands on (a fork's base) and their ancestors (named).
        #[arg(long)]
        checkpoints: bool,
        /// For checkpoints: delete even if others depend on them.
        #[arg(long)]
        force: bool,
    },
    /// Delete a checkpoint.
    RmCheckpoint {
        checkpoint: String,
        /// Delete even if children or sandboxes depend on it.
        #[arg(long)]
        force: bool,
    },
    /// Start a stopped sandbox.
    Start { sandbox: String },
    /// Stop a sandbox's processes (its filesystem stays).
    Stop { sandbox: String },
    /// List, import or remove images.
    Images {
        #[command(subcommand)]
        action: Option<ImagesCommand>,
    },
    /// Delete orphaned state (subvolumes no metadata names, runtime
    /// leftovers of deleted sandboxes) and report the space freed; counts,
    /// but never deletes, checkpoints of deleted sandboxes.
    Gc,
    /// List the background processes of a sandbox.
    Ps { sandbox: String },
    /// Print the buffered output of a background process (its last MiB of
    /// stdout and of stderr, byte for byte).
    Logs { sandbox: String, pid: i32 },
    /// Signal a background process.
    Kill {
        sandbox: String,
        pid: i32,
        /// Signal number.
        #[arg(long, short, default_value_t = 9)]
        signal: i32,
    },
}

#[derive(Subcommand, Debug)]
pub enum CheckpointCommand {
    /// Show a checkpoint's durable process image: its processes, and its
    /// pages (stored in it, in its parents' images, zeros). The image is
    /// read and checked whole (checksums, format version).
    Inspect { checkpoint: String },
}

#[derive(Subcommand, Debug)]
pub enum ImagesCommand {
    /// List images.
    Ls,
    /// Import a rootfs from a directory or tarball (.tar, .tar.gz, .tgz).
    Import { name: String, path: PathBuf },
    /// Remove an image.
    Rm { name: String },
}

#[derive(Args, Debug)]
pub struct CreateArgs {
    /// Image name (default: the built-in `default`).
    #[arg(long)]
    pub image: Option<String>,
    /// Label (k=v, repeatable).
    #[arg(long = "label", value_parser = parse_kv)]
    pub labels: Vec<(String, String)>,
    /// Memory limit (e.g. 2G).
    #[arg(long, value_parser = units::parse_size)]
    pub memory: Option<u64>,
    /// Task limit.
    #[arg(long)]
    pub pids: Option<u64>,
    /// CPU limit in cores (e.g. 1.5).
    #[arg(long, value_parser = units::parse_cpus)]
    pub cpus: Option<u64>,
    /// Network: `egress` (the daemon's default) or `none` (loopback alone).
    #[arg(long, value_parser = ["egress", "none"])]
    pub network: Option<String>,
    /// Always reachable: an IPv4 address, a CIDR or a domain name
    /// (`*.example.com` for the names under it); repeatable.
    #[arg(long = "allow", value_name = "RULE")]
    pub allow: Vec<String>,
    /// Refused: as --allow; `0.0.0.0/0` refuses everything not allowed.
    #[arg(long = "deny", value_name = "RULE")]
    pub deny: Vec<String>,
}

#[derive(Args, Debug)]
pub struct ExecArgs {
    pub sandbox: String,
    /// Environment variable (K=V, repeatable).
    #[arg(long = "env", short = 'e', value_parser = parse_kv)]
    pub env: Vec<(String, String)>,
    /// Working directory inside the sandbox.
    #[arg(long)]
    pub cwd: Option<String>,
    /// Run as this user of the sandbox (a name or a uid; default root).
    #[arg(long, short = 'u')]
    pub user: Option<String>,
    /// Kill the command after this long (e.g. 10s, 500ms).
    #[arg(long, value_parser = units::parse_duration)]
    pub timeout: Option<std::time::Duration>,
    /// Start in the background; prints the pid (see `ps`, `logs`, `kill`).
    #[arg(long, short = 'd')]
    pub background: bool,
    /// Give the command an empty stdin instead of this one's (as `ssh -n`:
    /// for use inside `while read` loops, which would lose their input).
    #[arg(long, short = 'n')]
    pub no_stdin: bool,
    /// The command and its arguments (after `--`).
    #[arg(last = true, required = true)]
    pub cmd: Vec<String>,
}

#[derive(Args, Debug)]
pub struct ShellArgs {
    pub sandbox: String,
    /// Attach to (or run -c in) this existing session.
    #[arg(long)]
    pub session: Option<String>,
    /// Run this command line in the session and print its output.
    #[arg(short = 'c')]
    pub command: Option<String>,
    /// Timeout of -c (e.g. 30s).
    #[arg(long, value_parser = units::parse_duration)]
    pub timeout: Option<std::time::Duration>,
    /// Run a new session's shell as this user of the sandbox (a name or a
    /// uid; default root).
    #[arg(long, short = 'u')]
    pub user: Option<String>,
}

/// Parses `k=v`.
pub fn parse_kv(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
        _ => Err(format!("expected KEY=VALUE, got {s:?}")),
    }
}

/// Runs a client verb; returns the process exit code.
pub async fn run(global: GlobalArgs, command: Command) -> Result<i32> {
    commands::run(global, command).await
}
