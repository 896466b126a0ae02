#![forbid(unsafe_code)]
//! `sandtree`: the daemon and the command-line client.
//!
//! - [`daemon`] serves the HTTP/1.1 JSON API (routes under `/v1`, see
//!   [`daemon::routes`] for the table) on a unix socket (no token, mode 0600)
//!   and optionally on TCP (bearer token);
//! - [`cli`] is the `sandtree` command: it talks to the daemon through
//!   [`cli::client::Client`], over the unix socket by default.
//!
//! The binary (`src/main.rs`) parses the command line, starts the zygote
//! *before* any thread exists when it runs the daemon, and only then builds
//! the tokio runtime.

pub mod cli;
pub mod daemon;
pub mod e2b;
pub mod mcp;
pub mod rfc3339;
pub mod units;
pub mod unix_http;
pub mod upload;
pub mod url;
