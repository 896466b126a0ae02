//! Persistent pty-backed shells that keep cwd, env and variables between calls.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// `POST /v1/sandboxes/{id}/sessions`
#[derive(Clone, Debug, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateSessionRequest {
    /// Working directory (default `/root`, or the home of `user`).
    #[serde(default)]
    pub cwd: Option<String>,
    /// Run the shell as this user of the sandbox (as `ExecRequest::user`;
    /// default root).
    #[serde(default)]
    pub user: Option<String>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    #[serde(default)]
    pub cols: Option<u16>,
    #[serde(default)]
    pub rows: Option<u16>,
}

#[derive(Clone, Debug, Serialize, Deserialize, ToSchema)]
pub struct SessionInfo {
    pub id: String,
    pub sandbox_id: String,
    /// The shell (sessions run `/bin/bash`).
    /// Pid of the shell inside the sandbox.
    pub pid: i32,
    pub shell: String,
    pub created_at: String,
    pub running: bool,
}

#[derive(Clone, Debug, Serialize, Deserialize, ToSchema)]
pub struct SessionList {
    pub sessions: Vec<SessionInfo>,
}

/// `POST /v1/sandboxes/{id}/sessions/{sid}/run`
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SessionRunRequest {
    /// One shell command line, run in the session's shell.
    pub command: String,
    #[serde(default)]
    pub timeout_ms: Option<u64>,
}

#[derive(Clone, Debug, Serialize, Deserialize, ToSchema)]
pub struct SessionRunResponse {
    /// What the command printed on the terminal (stdout and stderr
    /// interleaved, the bytes as written: no `\r` added), in the requested
    /// `?encoding=` (default lossy UTF-8 text).
    pub output: String,
    pub exit_code: Option<i32>,
    pub timed_out: bool,
    pub duration_ms: f64,
}
