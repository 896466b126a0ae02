//! Running commands: one-shot exec (buffered or streamed) and background processes.
//!
//! Bytes: stdin goes in as `stdin` (UTF-8 text), `stdin_base64` (any bytes)
//! or, for data of any size, as the raw request body after one line of
//! `ExecRequest` JSON ([`EXEC_STDIN_CONTENT_TYPE`]). Output comes back as
//! JSON strings in the [`OutputEncoding`] the query asks for (`?encoding=`):
//! lossy UTF-8 text by default, or base64 for the exact bytes.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// `POST /v1/sandboxes/{id}/exec`
#[derive(Clone, Debug, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ExecRequest {
    /// Program and arguments; the program is looked up in `PATH`.
    pub cmd: Vec<String>,
    /// Environment added to the sandbox default (PATH, HOME=/root, LANG;
    /// with `user`, HOME, USER and LOGNAME are the user's).
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Working directory inside the sandbox (default `/root`, or the
    /// home directory of `user`).
    #[serde(default)]
    pub cwd: Option<String>,
    /// Run as this user of the sandbox: a name from its `/etc/passwd`, or
    /// a numeric uid (its group then the same number unless `/etc/passwd`
    /// names one). Its groups are those `/etc/group` lists it in. Default:
    /// root.
    #[serde(default)]
    pub user: Option<String>,
    /// Text written to the program's stdin (UTF-8); stdin is closed afterwards.
    #[serde(default)]
    pub stdin: Option<String>,
    /// Bytes written to the program's stdin, base64-encoded (standard
    /// alphabet, padded): for binary data. Exclusive with `stdin`. For more
    /// than a few MiB, stream stdin in the body instead
    /// (`Content-Type: application/vnd.sandtree.exec+stdin`).
    #[serde(default)]
    pub stdin_base64: Option<String>,
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

/// The `Content-Type` of an exec whose stdin streams in the request body:
/// the body is one line of `ExecRequest` JSON (without `stdin`,
/// `stdin_base64` or `background`), a newline (`\n`), then the raw stdin
/// bytes up to the end of the body, fed to the program as they arrive (the
/// daemon never holds the whole body). With `?stream=true` the NDJSON
/// answer streams while the body is still being sent (full duplex: read it
/// as you write); without, the daemon reads the body to its end and then
/// answers one `ExecResponse`.
pub const EXEC_STDIN_CONTENT_TYPE: &str = "application/vnd.sandtree.exec+stdin";

/// How output bytes are put into JSON strings: the `?encoding=` query
/// parameter of exec, of a background process's output and of a session run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum OutputEncoding {
    /// Text: the bytes decoded as UTF-8, invalid sequences replaced by
    /// U+FFFD (lossy; fine for text, wrong for binary data).
    #[default]
    Utf8,
    /// The exact bytes, base64-encoded (standard alphabet, padded).
    Base64,
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
    /// Output in the requested `?encoding=` (default lossy UTF-8 text).
    pub stdout: String,
    pub stderr: String,
    pub stdout_truncated: bool,
    pub stderr_truncated: bool,
    pub timed_out: bool,
    pub duration_ms: f64,
}

/// One line of a streamed exec (`?stream=true`, `application/x-ndjson`);
/// `data` is in the requested `?encoding=`.
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
    /// The last MiB of output, in the requested `?encoding=`.
    pub stdout: String,
    pub stderr: String,
}
