//! The MCP tools: what each takes and answers (JSON Schemas), and how each
//! maps onto the daemon's API (`/v1/...`, see `daemon::routes`).
//!
//! | tool | API | hints |
//! |------|-----|-------|
//! | `create_sandbox` | `POST /v1/sandboxes` | — |
//! | `list_sandboxes` | `GET /v1/sandboxes` | read-only |
//! | `run_command` | `POST /v1/sandboxes/{id}/exec` (`/bin/sh -c`) | destructive |
//! | `read_file` | `GET /v1/sandboxes/{id}/files` | read-only |
//! | `write_file` | `PUT /v1/sandboxes/{id}/files` | destructive, idempotent |
//! | `list_files` | `GET /v1/sandboxes/{id}/files/list` | read-only |
//! | `checkpoint` | `POST /v1/sandboxes/{id}/checkpoints` | — |
//! | `rollback` | `POST /v1/sandboxes/{id}/rollback` | destructive, idempotent |
//! | `fork` | `POST /v1/checkpoints/{id}/fork` | — |
//! | `show_tree` | `GET /v1/sandboxes/{id}/checkpoints`, `GET /v1/sandboxes` | read-only |
//! | `delete_sandbox` | `DELETE /v1/sandboxes/{id}` | destructive, idempotent |
//!
//! None reaches outside the host (`openWorldHint: false`).

use std::collections::{BTreeMap, HashMap};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use sandtree_api::{
    ApiError, CheckpointInfo, CheckpointList, CheckpointResponse, CreateSandboxResponse, DeleteSandboxResponse,
    ErrorBody, ExecResponse, FileInfo, FileList, ForkResponse, RollbackResponse, SandboxList,
};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use super::{Backend, Body};
use crate::url::enc;

/// A tool's answer: the structured output and its text copy.
pub struct Output {
    pub text: String,
    pub structured: Value,
}

/// Output of a command kept per stream (the agent reads it all).
const MAX_OUTPUT_BYTES: u64 = 256 << 10;
/// Largest file `read_file` answers.
const MAX_READ_BYTES: u64 = 4 << 20;
/// Most forks one call makes.
const MAX_FORKS: u64 = 64;
/// Default time limit of a command.
const DEFAULT_TIMEOUT_MS: u64 = 120_000;

struct Hints {
    read_only: bool,
    destructive: bool,
    idempotent: bool,
}

const READ_ONLY: Hints = Hints { read_only: true, destructive: false, idempotent: true };
const ADDITIVE: Hints = Hints { read_only: false, destructive: false, idempotent: false };
const DESTRUCTIVE: Hints = Hints { read_only: false, destructive: true, idempotent: false };
const DESTRUCTIVE_IDEMPOTENT: Hints = Hints { read_only: false, destructive: true, idempotent: true };

struct Tool {
    name: &'static str,
    title: &'static str,
    description: &'static str,
    hints: Hints,
    input: fn() -> Value,
    output: fn() -> Value,
}

fn object(properties: Value, required: &[&str]) -> Value {
    json!({"type": "object", "properties": properties, "required": required})
}

fn sandbox_id() -> Value {
    json!({"type": "string", "description": "A sandbox id (sb-…), as create_sandbox or fork answered"})
}

fn checkpoint_id() -> Value {
    json!({"type": "string", "description": "A checkpoint id (ck-…), as checkpoint answered or show_tree lists"})
}

fn file_info_schema() -> Value {
    object(
        json!({
            "path": {"type": "string"}, "name": {"type": "string"},
            "kind": {"type": "string", "enum": ["file", "dir", "symlink", "other"]},
            "size": {"type": "integer"}, "mode": {"type": "string"},
            "uid": {"type": "integer"}, "gid": {"type": "integer"},
            "modified_at": {"type": "string"}, "symlink_target": {"type": "string"},
        }),
        &["path", "kind", "size"],
    )
}

const TOOLS: &[Tool] = &[
    Tool {
        name: "create_sandbox",
        title: "Create a sandbox",
        description: "Create and start a new sandbox: an isolated Linux machine (bash, coreutils, python3, gcc, git) \
            whose files and processes can be checkpointed, rolled back and forked. Answers its id.",
        hints: ADDITIVE,
        input: || {
            object(
                json!({
                    "image": {"type": "string", "description": "Image name (default: the built-in image)"},
                    "labels": {"type": "object", "additionalProperties": {"type": "string"},
                               "description": "Free-form labels kept with the sandbox"},
                }),
                &[],
            )
        },
        output: || {
            object(
                json!({"sandbox_id": {"type": "string"}, "image": {"type": "string"},
                       "status": {"type": "string"}, "duration_ms": {"type": "number"}}),
                &["sandbox_id", "image", "status"],
            )
        },
    },
    Tool {
        name: "list_sandboxes",
        title: "List sandboxes",
        description: "List the sandboxes with their status, labels and the checkpoint each stands on.",
        hints: READ_ONLY,
        input: || object(json!({}), &[]),
        output: || {
            object(
                json!({"sandboxes": {"type": "array", "items": object(json!({
                    "sandbox_id": {"type": "string"}, "image": {"type": "string"}, "status": {"type": "string"},
                    "created_at": {"type": "string"}, "labels": {"type": "object"},
                    "base_checkpoint": {"type": ["string", "null"]},
                }), &["sandbox_id", "status"])}}),
                &["sandboxes"],
            )
        },
    },
    Tool {
        name: "run_command",
        title: "Run a command",
        description: "Run a shell command (/bin/sh -c) in a sandbox and wait for it: answers its exit code, stdout \
            and stderr (each cut at 256 KiB). Default working directory /root, time limit 120 s.",
        hints: DESTRUCTIVE,
        input: || {
            object(
                json!({
                    "sandbox_id": sandbox_id(),
                    "command": {"type": "string", "description": "A shell command line"},
                    "cwd": {"type": "string", "description": "Working directory (default /root, or the user's home)"},
                    "user": {"type": "string", "description": "Run as this user of the sandbox (default root)"},
                    "env": {"type": "object", "additionalProperties": {"type": "string"}},
                    "stdin": {"type": "string", "description": "Text given to the command on stdin"},
                    "timeout_ms": {"type": "integer", "minimum": 1, "description": "Kill it after this long (default 120000)"},
                }),
                &["sandbox_id", "command"],
            )
        },
        output: || {
            object(
                json!({
                    "exit_code": {"type": ["integer", "null"]}, "signal": {"type": ["integer", "null"]},
                    "stdout": {"type": "string"}, "stderr": {"type": "string"},
                    "stdout_truncated": {"type": "boolean"}, "stderr_truncated": {"type": "boolean"},
                    "timed_out": {"type": "boolean"}, "duration_ms": {"type": "number"},
                }),
                &["exit_code", "stdout", "stderr", "timed_out"],
            )
        },
    },
    Tool {
        name: "read_file",
        title: "Read a file",
        description: "Read a file of a sandbox (at most 4 MiB). Text comes back as UTF-8; other bytes as base64 \
            (encoding says which). Relative paths start at /root.",
        hints: READ_ONLY,
        input: || object(json!({"sandbox_id": sandbox_id(), "path": {"type": "string"}}), &["sandbox_id", "path"]),
        output: || {
            object(
                json!({"path": {"type": "string"}, "size": {"type": "integer"},
                       "encoding": {"type": "string", "enum": ["utf-8", "base64"]}, "content": {"type": "string"}}),
                &["path", "size", "encoding", "content"],
            )
        },
    },
    Tool {
        name: "write_file",
        title: "Write a file",
        description: "Write a file of a sandbox, replacing it whole (missing directories are made). Content is \
            UTF-8 text, or base64 with encoding \"base64\". Relative paths start at /root.",
        hints: DESTRUCTIVE_IDEMPOTENT,
        input: || {
            object(
                json!({
                    "sandbox_id": sandbox_id(), "path": {"type": "string"}, "content": {"type": "string"},
                    "encoding": {"type": "string", "enum": ["utf-8", "base64"], "description": "Default utf-8"},
                    "mode": {"type": "string", "description": "Permission bits in octal, e.g. \"755\" (default 644)"},
                }),
                &["sandbox_id", "path", "content"],
            )
        },
        output: file_info_schema,
    },
    Tool {
        name: "list_files",
        title: "List a directory",
        description: "List a directory of a sandbox: each entry's path, kind, size and mode; depth > 1 lists \
            subdirectories too.",
        hints: READ_ONLY,
        input: || {
            object(
                json!({"sandbox_id": sandbox_id(), "path": {"type": "string", "description": "Default /root"},
                       "depth": {"type": "integer", "minimum": 1, "maximum": 64, "description": "Default 1"}}),
                &["sandbox_id"],
            )
        },
        output: || {
            object(
                json!({"path": {"type": "string"}, "entries": {"type": "array", "items": file_info_schema()}}),
                &["path", "entries"],
            )
        },
    },
    Tool {
        name: "checkpoint",
        title: "Checkpoint a sandbox",
        description: "Save the whole state of a sandbox, its files and its running processes, in milliseconds. \
            Answers a checkpoint id to roll back to or fork from. Refused, naming the process, when a process \
            cannot be saved exactly (best_effort saves the rest).",
        hints: ADDITIVE,
        input: || {
            object(
                json!({"sandbox_id": sandbox_id(), "label": {"type": "string", "description": "A name for it"},
                       "best_effort": {"type": "boolean", "description": "Save even if a process cannot be"}}),
                &["sandbox_id"],
            )
        },
        output: || {
            object(
                json!({
                    "checkpoint_id": {"type": "string"}, "sandbox_id": {"type": "string"},
                    "label": {"type": ["string", "null"]}, "process_state": {"type": "string"},
                    "processes": {"type": "array", "items": {"type": "integer"}},
                    "frozen_ms": {"type": "number"}, "duration_ms": {"type": "number"}, "note": {"type": "string"},
                }),
                &["checkpoint_id", "sandbox_id", "process_state"],
            )
        },
    },
    Tool {
        name: "rollback",
        title: "Roll a sandbox back",
        description: "Bring a sandbox back to a checkpoint of its tree: its files, and its processes as they were \
            (same pids, memory, open files). What happened since is lost.",
        hints: DESTRUCTIVE_IDEMPOTENT,
        input: || {
            object(
                json!({"sandbox_id": sandbox_id(), "checkpoint_id": checkpoint_id(),
                       "allow_restart": {"type": "boolean",
                           "description": "If its processes cannot come back, restore the files alone and restart"}}),
                &["sandbox_id", "checkpoint_id"],
            )
        },
        output: || {
            object(
                json!({
                    "sandbox_id": {"type": "string"}, "checkpoint_id": {"type": "string"},
                    "processes": {"type": "string"}, "restored_pids": {"type": "array", "items": {"type": "integer"}},
                    "note": {"type": "string"}, "duration_ms": {"type": "number"},
                }),
                &["sandbox_id", "checkpoint_id", "processes"],
            )
        },
    },
    Tool {
        name: "fork",
        title: "Fork a checkpoint",
        description: "Make count new sandboxes from a checkpoint, each with its files and running copies of its \
            processes, to try variants side by side. Answers their ids.",
        hints: ADDITIVE,
        input: || {
            object(
                json!({"checkpoint_id": checkpoint_id(),
                       "count": {"type": "integer", "minimum": 1, "maximum": MAX_FORKS},
                       "files_only": {"type": "boolean", "description": "Copy the files alone, not the processes"}}),
                &["checkpoint_id", "count"],
            )
        },
        output: || {
            object(
                json!({
                    "checkpoint_id": {"type": "string"},
                    "sandbox_ids": {"type": "array", "items": {"type": "string"}},
                    "errors": {"type": "array", "items": {"type": "string"}},
                    "processes": {"type": "string"}, "note": {"type": "string"}, "duration_ms": {"type": "number"},
                }),
                &["checkpoint_id", "sandbox_ids"],
            )
        },
    },
    Tool {
        name: "show_tree",
        title: "Show the checkpoint tree",
        description: "Show the checkpoints of a sandbox's tree (or of all sandboxes): each with its parent, label \
            and the sandboxes standing on it.",
        hints: READ_ONLY,
        input: || object(json!({"sandbox_id": sandbox_id()}), &[]),
        output: || {
            object(
                json!({"checkpoints": {"type": "array", "items": object(json!({
                    "checkpoint_id": {"type": "string"}, "parent": {"type": ["string", "null"]},
                    "label": {"type": ["string", "null"]}, "sandbox_id": {"type": "string"},
                    "created_at": {"type": "string"}, "process_state": {"type": "string"},
                    "sandboxes_on_it": {"type": "array", "items": {"type": "string"}},
                }), &["checkpoint_id", "parent"])}}),
                &["checkpoints"],
            )
        },
    },
    Tool {
        name: "delete_sandbox",
        title: "Delete a sandbox",
        description: "Delete a sandbox: its processes end and its files go. Its checkpoints are kept (they can \
            still be forked) unless delete_checkpoints.",
        hints: DESTRUCTIVE_IDEMPOTENT,
        input: || {
            object(json!({"sandbox_id": sandbox_id(), "delete_checkpoints": {"type": "boolean"}}), &["sandbox_id"])
        },
        output: || {
            object(
                json!({"sandbox_id": {"type": "string"},
                       "checkpoints_deleted": {"type": "array", "items": {"type": "string"}},
                       "checkpoints_kept": {"type": "array", "items": {"type": "string"}},
                       "note": {"type": "string"}}),
                &["sandbox_id"],
            )
        },
    },
];

/// The `tools/list` entries.
pub fn definitions() -> Vec<Value> {
    TOOLS
        .iter()
        .map(|t| {
            json!({
                "name": t.name,
                "title": t.title,
                "description": t.description,
                "inputSchema": (t.input)(),
                "outputSchema": (t.output)(),
                "annotations": {
                    "title": t.title,
                    "readOnlyHint": t.hints.read_only,
                    "destructiveHint": t.hints.destructive,
                    "idempotentHint": t.hints.idempotent,
                    "openWorldHint": false,
                },
            })
        })
        .collect()
}

pub fn exists(name: &str) -> bool {
    TOOLS.iter().any(|t| t.name == name)
}

/// Runs tool `name`; `Err` is the message of a tool error.
pub async fn call<B: Backend>(b: &B, name: &str, args: &Value) -> Result<Output, String> {
    let a = Args(args.as_object().ok_or("invalid_argument: arguments must be an object")?);
    match name {
        "create_sandbox" => create_sandbox(b, a).await,
        "list_sandboxes" => list_sandboxes(b).await,
        "run_command" => run_command(b, a).await,
        "read_file" => read_file(b, a).await,
        "write_file" => write_file(b, a).await,
        "list_files" => list_files(b, a).await,
        "checkpoint" => checkpoint(b, a).await,
        "rollback" => rollback(b, a).await,
        "fork" => fork(b, a).await,
        "show_tree" => show_tree(b, a).await,
        "delete_sandbox" => delete_sandbox(b, a).await,
        other => Err(format!("unknown tool {other:?}")),
    }
}

/// A tool's arguments, read with clear errors.
#[derive(Clone, Copy)]
struct Args<'a>(&'a serde_json::Map<String, Value>);

impl Args<'_> {
    fn opt_str(&self, name: &str) -> Result<Option<String>, String> {
        match self.0.get(name) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(_) => Err(format!("invalid_argument: argument {name} must be a string")),
        }
    }

    fn str(&self, name: &str) -> Result<String, String> {
        self.opt_str(name)?.ok_or_else(|| format!("invalid_argument: argument {name} is required"))
    }

    fn opt_u64(&self, name: &str) -> Result<Option<u64>, String> {
        match self.0.get(name) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => v
                .as_u64()
                .map(Some)
                .ok_or_else(|| format!("invalid_argument: argument {name} must be a non-negative integer")),
        }
    }

    fn bool(&self, name: &str) -> Result<bool, String> {
        match self.0.get(name) {
            None | Some(Value::Null) => Ok(false),
            Some(Value::Bool(b)) => Ok(*b),
            Some(_) => Err(format!("invalid_argument: argument {name} must be true or false")),
        }
    }

    fn strings(&self, name: &str) -> Result<BTreeMap<String, String>, String> {
        match self.0.get(name) {
            None | Some(Value::Null) => Ok(BTreeMap::new()),
            Some(v) => serde_json::from_value(v.clone())
                .map_err(|_| format!("invalid_argument: argument {name} must be an object of strings")),
        }
    }

    /// An id argument (`sb-…`, `ck-…`): only the characters ids have.
    fn id(&self, name: &str) -> Result<String, String> {
        let id = self.str(name)?;
        if id.is_empty() || !id.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'-' || c == b'_') {
            return Err(format!("invalid_argument: argument {name} is not an id: {id:?}"));
        }
        Ok(id)
    }
}

/// Calls the API and decodes its JSON answer; an API error becomes the
/// tool error `code: message`.
async fn api<B: Backend, T: DeserializeOwned>(
    b: &B,
    method: &'static str,
    path: String,
    body: Body,
) -> Result<T, String> {
    let reply = raw(b, method, path, body).await?;
    let body = if reply.is_empty() { b"null".to_vec() } else { reply };
    serde_json::from_slice(&body).map_err(|e| format!("internal: unexpected answer from the daemon: {e}"))
}

/// Calls the API; the raw body of a success.
async fn raw<B: Backend>(b: &B, method: &'static str, path: String, body: Body) -> Result<Vec<u8>, String> {
    let reply = b.request(method, path, body).await?;
    if reply.status >= 400 {
        let e: ApiError = serde_json::from_slice::<ErrorBody>(&reply.body).map(|b| b.error).unwrap_or_else(|_| {
            ApiError::new(
                sandtree_api::ErrorCode::Internal,
                format!("HTTP {}: {}", reply.status, String::from_utf8_lossy(&reply.body)),
            )
        });
        return Err(format!("{}: {}", e.code, e.message));
    }
    Ok(reply.body)
}

async fn create_sandbox<B: Backend>(b: &B, a: Args<'_>) -> Result<Output, String> {
    let body = json!({"image": a.opt_str("image")?, "labels": a.strings("labels")?});
    let r: CreateSandboxResponse = api(b, "POST", "/v1/sandboxes".into(), Body::Json(body)).await?;
    let s = &r.sandbox;
    Ok(Output {
        text: format!("Created sandbox {} (image {}) in {:.1} ms.", s.id, s.image, r.duration_ms),
        structured: json!({"sandbox_id": s.id, "image": s.image, "status": s.status, "duration_ms": r.duration_ms}),
    })
}

async fn list_sandboxes<B: Backend>(b: &B) -> Result<Output, String> {
    let l: SandboxList = api(b, "GET", "/v1/sandboxes".into(), Body::None).await?;
    let rows: Vec<Value> = l
        .sandboxes
        .iter()
        .map(|s| {
            json!({"sandbox_id": s.id, "image": s.image, "status": s.status, "created_at": s.created_at,
                   "labels": s.labels, "base_checkpoint": s.base_checkpoint})
        })
        .collect();
    let text = if rows.is_empty() {
        "No sandboxes.".to_string()
    } else {
        l.sandboxes
            .iter()
            .map(|s| {
                let status = serde_json::to_value(s.status).unwrap_or_default();
                format!("{}  {}  image {}  created {}", s.id, status.as_str().unwrap_or(""), s.image, s.created_at)
            })
            .collect::<Vec<_>>()
            .join("\n")
    };
    Ok(Output { text, structured: json!({"sandboxes": rows}) })
}

async fn run_command<B: Backend>(b: &B, a: Args<'_>) -> Result<Output, String> {
    let id = a.id("sandbox_id")?;
    let command = a.str("command")?;
    let body = json!({
        "cmd": ["/bin/sh", "-c", command],
        "cwd": a.opt_str("cwd")?,
        "user": a.opt_str("user")?,
        "env": a.strings("env")?,
        "stdin": a.opt_str("stdin")?,
        "timeout_ms": match a.opt_u64("timeout_ms")? {
            Some(0) => return Err("invalid_argument: argument timeout_ms must be at least 1".into()),
            t => t.unwrap_or(DEFAULT_TIMEOUT_MS),
        },
        "max_output_bytes": MAX_OUTPUT_BYTES,
    });
    let r: ExecResponse = api(b, "POST", format!("/v1/sandboxes/{}/exec", enc(&id)), Body::Json(body)).await?;
    let mut text = r.stdout.clone();
    if !r.stderr.is_empty() {
        if !text.is_empty() && !text.ends_with('\n') {
            text.push('\n');
        }
        text.push_str(&format!("[stderr]\n{}", r.stderr));
    }
    if !text.is_empty() && !text.ends_with('\n') {
        text.push('\n');
    }
    text.push_str(&match (r.exit_code, r.signal, r.timed_out) {
        (_, _, true) => format!("[timed out after {:.0} ms; killed]", r.duration_ms),
        (Some(c), _, _) => format!("[exit code {c}]"),
        (None, Some(s), _) => format!("[killed by signal {s}]"),
        _ => "[ended]".to_string(),
    });
    Ok(Output {
        text,
        structured: json!({
            "exit_code": r.exit_code, "signal": r.signal, "stdout": r.stdout, "stderr": r.stderr,
            "stdout_truncated": r.stdout_truncated, "stderr_truncated": r.stderr_truncated,
            "timed_out": r.timed_out, "duration_ms": r.duration_ms,
        }),
    })
}

async fn read_file<B: Backend>(b: &B, a: Args<'_>) -> Result<Output, String> {
    let id = a.id("sandbox_id")?;
    let path = a.str("path")?;
    let base = format!("/v1/sandboxes/{}/files", enc(&id));
    let st: FileInfo = api(b, "GET", format!("{base}/stat?path={}&follow=true", enc(&path)), Body::None).await?;
    if st.size > MAX_READ_BYTES {
        return Err(format!(
            "invalid_argument: {} is {} bytes, more than read_file answers ({MAX_READ_BYTES}); read a part with \
             run_command (head -c, tail, grep)",
            st.path, st.size
        ));
    }
    let bytes = raw(b, "GET", format!("{base}?path={}", enc(&path)), Body::None).await?;
    let (encoding, content) = match String::from_utf8(bytes) {
        Ok(text) => ("utf-8", text),
        Err(e) => ("base64", BASE64.encode(e.as_bytes())),
    };
    let size = content.len();
    let text = match encoding {
        _ if size == 0 => format!("({} is empty: 0 bytes)", st.path),
        "utf-8" => content.clone(),
        _ => format!("({} is binary: {size} base64 characters in structuredContent.content)", st.path),
    };
    Ok(Output { text, structured: json!({"path": st.path, "size": st.size, "encoding": encoding, "content": content}) })
}

async fn write_file<B: Backend>(b: &B, a: Args<'_>) -> Result<Output, String> {
    let id = a.id("sandbox_id")?;
    let path = a.str("path")?;
    let content = a.str("content")?;
    let bytes = match a.opt_str("encoding")?.as_deref() {
        None | Some("utf-8") | Some("utf8") => content.into_bytes(),
        Some("base64") => BASE64
            .decode(content.trim_ascii())
            .map_err(|e| format!("invalid_argument: content is not valid base64 ({e})"))?,
        Some(other) => return Err(format!("invalid_argument: encoding {other:?} is neither \"utf-8\" nor \"base64\"")),
    };
    let mut query = format!("path={}", enc(&path));
    if let Some(mode) = a.opt_str("mode")? {
        query.push_str(&format!("&mode={}", enc(&mode)));
    }
    let info: FileInfo = api(b, "PUT", format!("/v1/sandboxes/{}/files?{query}", enc(&id)), Body::Bytes(bytes)).await?;
    Ok(Output {
        text: format!("Wrote {} bytes to {} (mode {}).", info.size, info.path, info.mode),
        structured: serde_json::to_value(&info).unwrap_or_default(),
    })
}

async fn list_files<B: Backend>(b: &B, a: Args<'_>) -> Result<Output, String> {
    let id = a.id("sandbox_id")?;
    let path = a.opt_str("path")?.unwrap_or_else(|| "/root".into());
    let depth = a.opt_u64("depth")?.unwrap_or(1);
    let l: FileList =
        api(b, "GET", format!("/v1/sandboxes/{}/files/list?path={}&depth={depth}", enc(&id), enc(&path)), Body::None)
            .await?;
    let mut text = format!("{} ({} entries)\n", l.path, l.entries.len());
    for e in &l.entries {
        let kind = match e.kind {
            sandtree_api::FileKind::Dir => "dir ",
            sandtree_api::FileKind::File => "file",
            sandtree_api::FileKind::Symlink => "link",
            sandtree_api::FileKind::Other => "othr",
        };
        text.push_str(&format!("{kind} {:>5} {:>10}  {}", e.mode, e.size, e.path));
        if let Some(t) = &e.symlink_target {
            text.push_str(&format!(" -> {t}"));
        }
        text.push('\n');
    }
    Ok(Output { text, structured: serde_json::to_value(&l).unwrap_or_default() })
}

async fn checkpoint<B: Backend>(b: &B, a: Args<'_>) -> Result<Output, String> {
    let id = a.id("sandbox_id")?;
    let body = json!({"label": a.opt_str("label")?, "best_effort": a.bool("best_effort")?});
    let r: CheckpointResponse =
        api(b, "POST", format!("/v1/sandboxes/{}/checkpoints", enc(&id)), Body::Json(body)).await?;
    let c = &r.checkpoint;
    let mut text = format!(
        "Checkpoint {} of {}: {} process(es) saved, frozen {:.1} ms, {:.1} ms in all.",
        c.id,
        c.sandbox_id,
        c.processes.len(),
        c.frozen_ms,
        c.duration_ms
    );
    if !r.note.is_empty() {
        text.push_str(&format!(" {}", r.note));
    }
    Ok(Output {
        text,
        structured: json!({
            "checkpoint_id": c.id, "sandbox_id": c.sandbox_id, "label": c.label, "process_state": c.process_state,
            "processes": c.processes, "frozen_ms": c.frozen_ms, "duration_ms": c.duration_ms, "note": r.note,
        }),
    })
}

async fn rollback<B: Backend>(b: &B, a: Args<'_>) -> Result<Output, String> {
    let id = a.id("sandbox_id")?;
    let ck = a.id("checkpoint_id")?;
    let body = json!({"checkpoint": ck, "allow_restart": a.bool("allow_restart")?});
    let r: RollbackResponse = api(b, "POST", format!("/v1/sandboxes/{}/rollback", enc(&id)), Body::Json(body)).await?;
    let processes = serde_json::to_value(r.processes).unwrap_or_default();
    let mut text = format!(
        "Rolled {} back to {} in {:.1} ms; processes: {}.",
        id,
        r.checkpoint,
        r.duration_ms,
        processes.as_str().unwrap_or("")
    );
    if !r.note.is_empty() {
        text.push_str(&format!(" {}", r.note));
    }
    Ok(Output {
        text,
        structured: json!({
            "sandbox_id": id, "checkpoint_id": r.checkpoint, "processes": processes,
            "restored_pids": r.restored_pids, "note": r.note, "duration_ms": r.duration_ms,
        }),
    })
}

async fn fork<B: Backend>(b: &B, a: Args<'_>) -> Result<Output, String> {
    let ck = a.id("checkpoint_id")?;
    let count = a.opt_u64("count")?.ok_or("invalid_argument: argument count is required")?;
    if !(1..=MAX_FORKS).contains(&count) {
        return Err(format!("invalid_argument: count must be between 1 and {MAX_FORKS}"));
    }
    let body = json!({"count": count, "files_only": a.bool("files_only")?});
    let r: ForkResponse = api(b, "POST", format!("/v1/checkpoints/{}/fork", enc(&ck)), Body::Json(body)).await?;
    let ids: Vec<String> = r.results.iter().filter_map(|f| f.sandbox.as_ref().map(|s| s.id.clone())).collect();
    let errors: Vec<String> = r.results.iter().filter_map(|f| f.error.as_ref().map(|e| e.to_string())).collect();
    let processes = serde_json::to_value(r.processes).unwrap_or_default();
    let mut text = format!(
        "Forked {} into {} sandbox(es) in {:.1} ms: {}.",
        r.checkpoint,
        ids.len(),
        r.duration_ms,
        ids.join(", ")
    );
    if !errors.is_empty() {
        text.push_str(&format!(" {} failed: {}.", errors.len(), errors.join("; ")));
    }
    if !r.note.is_empty() {
        text.push_str(&format!(" {}", r.note));
    }
    Ok(Output {
        text,
        structured: json!({
            "checkpoint_id": r.checkpoint, "sandbox_ids": ids, "errors": errors,
            "processes": processes, "note": r.note, "duration_ms": r.duration_ms,
        }),
    })
}

async fn show_tree<B: Backend>(b: &B, a: Args<'_>) -> Result<Output, String> {
    let path = match a.0.get("sandbox_id").filter(|v| !v.is_null()) {
        Some(_) => format!("/v1/sandboxes/{}/checkpoints", enc(&a.id("sandbox_id")?)),
        None => "/v1/checkpoints".to_string(),
    };
    let l: CheckpointList = api(b, "GET", path, Body::None).await?;
    let sbs: SandboxList = api(b, "GET", "/v1/sandboxes".into(), Body::None).await?;
    let mut on: HashMap<String, Vec<String>> = HashMap::new();
    for s in sbs.sandboxes {
        if let Some(base) = s.base_checkpoint {
            on.entry(base).or_default().push(s.id);
        }
    }
    let rows: Vec<Value> = l
        .checkpoints
        .iter()
        .map(|c| {
            json!({
                "checkpoint_id": c.id, "parent": c.parent, "label": c.label, "sandbox_id": c.sandbox_id,
                "created_at": c.created_at, "process_state": c.process_state,
                "sandboxes_on_it": on.get(&c.id).cloned().unwrap_or_default(),
            })
        })
        .collect();
    let text = if l.checkpoints.is_empty() { "No checkpoints.".to_string() } else { tree_text(&l.checkpoints, &on) };
    Ok(Output { text, structured: json!({"checkpoints": rows}) })
}

/// The checkpoints as an indented forest: a checkpoint's only child stays
/// in its column (a linear run reads as a list), siblings are indented
/// under their parent with `- `.
fn tree_text(cks: &[CheckpointInfo], on: &HashMap<String, Vec<String>>) -> String {
    let index: HashMap<&str, usize> = cks.iter().enumerate().map(|(i, c)| (c.id.as_str(), i)).collect();
    let mut children: Vec<Vec<usize>> = vec![Vec::new(); cks.len()];
    let mut roots = Vec::new();
    for (i, c) in cks.iter().enumerate() {
        match c.parent.as_deref().and_then(|p| index.get(p)) {
            Some(&p) if p != i => children[p].push(i),
            _ => roots.push(i),
        }
    }
    let mut out = String::new();
    let mut seen = vec![false; cks.len()];
    let mut stack: Vec<(usize, usize, bool)> = roots.iter().rev().map(|&r| (r, 0, false)).collect();
    while let Some((i, indent, dash)) = stack.pop() {
        if std::mem::replace(&mut seen[i], true) {
            continue;
        }
        let c = &cks[i];
        let pad = " ".repeat(indent);
        let mut line = format!("{pad}{}{}", if dash { "- " } else { "" }, c.id);
        if let Some(l) = &c.label {
            line.push_str(&format!(" {l:?}"));
        }
        line.push_str(&format!("  (of {}, {})", c.sandbox_id, c.created_at));
        if let Some(sbs) = on.get(&c.id) {
            line.push_str(&format!("  <- {}", sbs.join(", ")));
        }
        out.push_str(&line);
        out.push('\n');
        let kids = &children[i];
        let base = indent + if dash { 2 } else { 0 };
        let (next_indent, next_dash) = if kids.len() == 1 { (base, false) } else { (base + 2, true) };
        for &k in kids.iter().rev() {
            stack.push((k, next_indent, next_dash));
        }
    }
    out
}

async fn delete_sandbox<B: Backend>(b: &B, a: Args<'_>) -> Result<Output, String> {
    let id = a.id("sandbox_id")?;
    let with = a.bool("delete_checkpoints")?;
    let r: DeleteSandboxResponse =
        api(b, "DELETE", format!("/v1/sandboxes/{}?checkpoints={with}", enc(&id)), Body::None).await?;
    let kept: Vec<String> = r.checkpoints_kept.iter().map(|k| k.id.clone()).collect();
    let mut text = format!("Deleted {}", r.id);
    if !r.note.is_empty() {
        text.push_str(&format!("; {}", r.note));
    }
    if !text.ends_with('.') {
        text.push('.');
    }
    Ok(Output {
        text,
        structured: json!({"sandbox_id": r.id, "checkpoints_deleted": r.checkpoints_deleted,
                           "checkpoints_kept": kept, "note": r.note}),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_tool_has_object_schemas_and_annotations() {
        for t in definitions() {
            assert_eq!(t["inputSchema"]["type"], "object", "{}", t["name"]);
            assert_eq!(t["outputSchema"]["type"], "object", "{}", t["name"]);
            for req in t["inputSchema"]["required"].as_array().unwrap() {
                assert!(t["inputSchema"]["properties"].get(req.as_str().unwrap()).is_some(), "{}: {req}", t["name"]);
            }
            assert!(t["annotations"]["readOnlyHint"].is_boolean());
        }
    }
}
