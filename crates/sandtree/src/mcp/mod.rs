//! The MCP server: Sandtree's sandboxes as tools an agent calls for itself
//! (create a sandbox, run a command, read and write files, checkpoint,
//! roll back, fork, show the tree, delete).
//!
//! Two transports serve the same [`Server`]:
//! - **stdio** (`sandtree mcp`): JSON-RPC 2.0 messages, one per line, on
//!   stdin and stdout (logs go to stderr); the tools reach the daemon as
//!   the CLI does (unix socket, or `--url` and `--token`);
//! - **streamable HTTP** on the daemon (`POST /mcp`, see
//!   `daemon::mcp_http`): one JSON-RPC message per request, answered with
//!   one `application/json` response (`202` for a notification); no
//!   server-initiated stream (`GET /mcp` is `405`), no session id. The
//!   tools call the daemon's API in-process. On TCP the request needs the
//!   daemon's bearer token, like every route.
//!
//! # Protocol
//! The `initialize` handshake of MCP revisions 2024-11-05 to 2025-11-25:
//! the server answers the client's `protocolVersion` when it knows it,
//! else its newest ([`PROTOCOL_VERSIONS`]). Methods: `initialize`, `ping`,
//! `tools/list`, `tools/call`; notifications (`notifications/initialized`,
//! `notifications/cancelled`) are accepted and need no answer. Any other
//! method is `-32601` (a client probing `server/discover`, the stateless
//! revision, then falls back to the handshake).
//!
//! # Tools
//! Each tool ([`tools`]) has a JSON Schema for its input and its output,
//! a title and the `readOnlyHint` / `destructiveHint` / `idempotentHint` /
//! `openWorldHint` annotations. A result carries `structuredContent` (the
//! output object) and a text copy of it in `content`. A failure the agent
//! can act on (bad arguments, an API error such as `sandbox_not_found` or
//! `process_not_restorable`) is a tool result with `isError: true` whose
//! text is the API's code and message; an unknown tool is a JSON-RPC error
//! (`-32602`).

pub mod stdio;
pub mod tools;

use std::future::Future;

use serde_json::{Value, json};

/// MCP revisions this server speaks, newest first.
pub const PROTOCOL_VERSIONS: [&str; 4] = ["2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05"];

/// JSON-RPC error codes.
pub mod codes {
    pub const PARSE_ERROR: i64 = -32700;
    pub const INVALID_REQUEST: i64 = -32600;
    pub const METHOD_NOT_FOUND: i64 = -32601;
    pub const INVALID_PARAMS: i64 = -32602;
}

/// The body of a request to the daemon's API.
pub enum Body {
    None,
    Json(Value),
    /// Raw bytes (a file's content).
    Bytes(Vec<u8>),
}

/// A response of the daemon's API: its status and raw body.
pub struct Reply {
    pub status: u16,
    pub body: Vec<u8>,
}

/// How the tools reach the daemon's API: over a socket (stdio server) or
/// in-process (the daemon's own endpoint). `path` includes the query.
pub trait Backend: Send + Sync + 'static {
    fn request(
        &self,
        method: &'static str,
        path: String,
        body: Body,
    ) -> impl Future<Output = Result<Reply, String>> + Send;
}

/// The MCP server over a [`Backend`].
pub struct Server<B> {
    backend: B,
}

/// A JSON-RPC error answer to request `id`.
pub fn error_response(id: Value, code: i64, message: impl Into<String>) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message.into()}})
}

impl<B: Backend> Server<B> {
    pub fn new(backend: B) -> Server<B> {
        Server { backend }
    }

    /// Handles one JSON-RPC message; `None` for a notification or a
    /// response (nothing to answer).
    pub async fn handle(&self, msg: Value) -> Option<Value> {
        let invalid = |id: Value, why: &str| Some(error_response(id, codes::INVALID_REQUEST, why));
        let Some(obj) = msg.as_object() else {
            return invalid(Value::Null, "expected one JSON-RPC 2.0 message (an object); batches are not supported");
        };
        let id = obj.get("id").cloned();
        // (An id MCP accepts: a string or an integer, never null.)
        let id_ok = id.as_ref().is_none_or(|i| i.is_string() || i.is_i64() || i.is_u64());
        if obj.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
            return invalid(id.filter(|_| id_ok).unwrap_or(Value::Null), "\"jsonrpc\" must be \"2.0\"");
        }
        if !id_ok {
            return invalid(Value::Null, "\"id\" must be a string or an integer");
        }
        let Some(method) = obj.get("method").and_then(Value::as_str) else {
            // A response to us (we send no requests): nothing to answer.
            if id.is_some() && (obj.contains_key("result") || obj.contains_key("error")) {
                return None;
            }
            return invalid(id.unwrap_or(Value::Null), "a request needs \"method\"");
        };
        let Some(id) = id else {
            return None; // a notification
        };
        let params = obj.get("params").cloned().unwrap_or(Value::Null);
        let result = match method {
            "initialize" => Ok(initialize(&params)),
            "ping" => Ok(json!({})),
            "tools/list" => Ok(json!({"tools": tools::definitions()})),
            "tools/call" => self.call_tool(&params).await,
            other => Err((codes::METHOD_NOT_FOUND, format!("method {other:?} is not supported by this server"))),
        };
        Some(match result {
            Ok(result) => json!({"jsonrpc": "2.0", "id": id, "result": result}),
            Err((code, message)) => error_response(id, code, message),
        })
    }

    async fn call_tool(&self, params: &Value) -> Result<Value, (i64, String)> {
        let name = params
            .get("name")
            .and_then(Value::as_str)
            .ok_or((codes::INVALID_PARAMS, "tools/call needs \"name\"".to_string()))?;
        if !tools::exists(name) {
            return Err((codes::INVALID_PARAMS, format!("unknown tool {name:?}: tools/list names the tools")));
        }
        let args = params.get("arguments").cloned().unwrap_or_else(|| json!({}));
        Ok(match tools::call(&self.backend, name, &args).await {
            Ok(out) => json!({
                "content": [{"type": "text", "text": out.text}],
                "structuredContent": out.structured,
                "isError": false,
            }),
            Err(message) => json!({
                "content": [{"type": "text", "text": message}],
                "isError": true,
            }),
        })
    }
}

/// The `initialize` result: the version agreed, what the server offers.
fn initialize(params: &Value) -> Value {
    let asked = params.get("protocolVersion").and_then(Value::as_str).unwrap_or_default();
    let version = PROTOCOL_VERSIONS.iter().find(|v| **v == asked).copied().unwrap_or(PROTOCOL_VERSIONS[0]);
    json!({
        "protocolVersion": version,
        "capabilities": {"tools": {"listChanged": false}},
        "serverInfo": {"name": "sandtree", "title": "Sandtree", "version": env!("CARGO_PKG_VERSION")},
        "instructions": "Sandtree sandboxes: isolated Linux machines whose files and running processes can be \
            checkpointed, rolled back and forked in milliseconds. Create a sandbox, run commands and edit files \
            in it; checkpoint before a risky step and roll back if it goes wrong; fork a checkpoint to try \
            several variants side by side. Delete sandboxes you no longer need.",
    })
}
