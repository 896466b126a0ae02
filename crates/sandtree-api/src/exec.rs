//! Running commands: one-shot exec (buffered or streamed) and background processes.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// `POST /v1/sandboxes/{id}/exec`
#[derive(Clone, Debug, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ExecRequest {
    /// Program and arguments; the program is looked up in `PATH`.
    pub cmd: Vec<String>,
    /// Environment added to the sandbox default (PATH, HOME=/root, LANG).
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Working directory inside the sandbox (default `/root`).
    #[serde(default)]
    pub cwd: Option<String>,
    /// Bytes written to the program's stdin (UTF-8); stdin is closed afterwards.
    #[serde(default)]
    pub stdin: Option<String>,
    /// Kill the program (SIGKILL) after this many milliseconds.
    #[serde(default)]
    pub timeout_ms: Option<u64>,
    /// Keep at most this many bytes of each of stdout and stderr (default 1 MiB);
    /// the rest is read and dropped so the program never blocks.
    #[serde(default)]
    pub max_output_bytes: Option<usize>,
    /// Start in the background and return at once with its pid; output is kept
    /// in a ring buffer readable with `GET /processes/{pid}`.
    #[serde(default)]
    pub background: bool,
}

/// Result of a finished command.
#[derive(Clone, Debug, Default, Serialize, Deserialize, ToSchema)]
pub struct ExecResponse {
    /// Pid inside the sandbox.
    pub pid: i32,
    /// Exit status, when the program exited normally.
    pub exit_code: Option<i32>,
    /// Terminating signal, when it was killed.
    pub signal: Option<i32>,
    /// Output decoded as UTF-8 (invalid bytes replaced).
    pub stdout: String,
    pub stderr: String,
    pub stdout_truncated: bool,
    pub stderr_truncated: bool,
    pub timed_out: bool,
    pub duration_ms: f64,
}

/// One line of a streamed exec (`?stream=true`, `application/x-ndjson`).
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ExecEvent {
    Started { pid: i32 },
    Stdout { data: String },
    Stderr { data: String },
    Exit(ExecResponse),
    Error(crate::ApiError),
}

/// A process started through the API (`background: true`).
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema)]
pub struct ProcessInfo {
    pub pid: i32,
    pub cmd: Vec<String>,
    pub started_at: String,
    pub running: bool,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
}

/// `GET /v1/sandboxes/{id}/processes`
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema)]
pub struct ProcessList {
    pub processes: Vec<ProcessInfo>,
}

/// `GET /v1/sandboxes/{id}/processes/{pid}`: state plus buffered output.
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema)]
pub struct ProcessOutput {
    pub process: ProcessInfo,
    pub stdout: String,
    pub stderr: String,
}
