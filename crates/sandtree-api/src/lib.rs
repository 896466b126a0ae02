#![forbid(unsafe_code)]
//! `sandtree-api`: the types that cross the wire between the daemon and its
//! clients (the CLI, the MCP server; the Python SDK in `python/` mirrors them).
//!
//! Everything here is plain data: serde (JSON) + utoipa schemas, no I/O. The
//! runtime returns these types directly, the daemon serialises them, and the
//! OpenAPI document (`openapi.json` at the repository root) is generated from
//! them, so the three cannot drift apart.
//!
//! Conventions:
//! - ids are short lowercase strings with a kind prefix: `sb-…` sandboxes,
//!   `ck-…` checkpoints; sessions are `s<pid>` (their shell's pid in the
//!   sandbox);
//! - times are RFC 3339 strings in UTC, durations are `*_ms` floats;
//! - errors are [`ApiError`] with a stable snake_case [`ErrorCode`] and a
//!   message that says what to do next.

mod checkpoint;
mod error;
mod exec;
mod files;
mod image;
mod info;
mod network;
mod sandbox;
mod session;

pub use checkpoint::*;
pub use error::*;
pub use exec::*;
pub use files::*;
pub use image::*;
pub use info::*;
pub use network::*;
pub use sandbox::*;
pub use session::*;

/// The API version prefix of every route.
pub const API_PREFIX: &str = "/v1";
