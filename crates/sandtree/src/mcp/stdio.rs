//! `sandtree mcp`: the MCP server on stdin and stdout, one JSON-RPC
//! message per line (no embedded newlines, as MCP's stdio transport
//! says); stdout carries nothing but answers.
//!
//! Requests run side by side, each in a task of its own, and are answered
//! as they finish (JSON-RPC matches answers by id): a long `run_command`
//! does not hold up a `list_sandboxes`. `notifications/cancelled` ends the
//! named request's task (its answer is then never sent, as MCP says). When
//! stdin ends, the requests still running finish and are answered, then
//! the server exits.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::task::{AbortHandle, JoinSet};

use super::{Backend, Server, codes, error_response};

/// The requests running, by their id's JSON text.
type Running = Arc<Mutex<HashMap<String, AbortHandle>>>;

/// Serves MCP on stdin/stdout until stdin ends.
pub async fn serve<B: Backend>(server: Server<B>) -> std::io::Result<()> {
    let server = Arc::new(server);
    let out = Arc::new(tokio::sync::Mutex::new(tokio::io::stdout()));
    let running: Running = Arc::default();
    let mut tasks = JoinSet::new();
    let mut lines = BufReader::new(tokio::io::stdin()).lines();
    while let Some(line) = lines.next_line().await? {
        while tasks.try_join_next().is_some() {}
        if line.trim().is_empty() {
            continue;
        }
        let msg = match serde_json::from_str::<Value>(&line) {
            Ok(msg) => msg,
            Err(e) => {
                write(&out, &error_response(Value::Null, codes::PARSE_ERROR, format!("not JSON: {e}"))).await?;
                continue;
            }
        };
        if msg.get("method").and_then(Value::as_str) == Some("notifications/cancelled") {
            let key = msg.pointer("/params/requestId").map(Value::to_string).unwrap_or_default();
            if let Some(task) = running.lock().unwrap_or_else(|p| p.into_inner()).remove(&key) {
                task.abort();
            }
            continue;
        }
        let key = msg.get("id").map(Value::to_string);
        let (server, out, done) = (server.clone(), out.clone(), running.clone());
        let done_key = key.clone();
        // (Registered before the task can end and unregister itself.)
        let mut registry = running.lock().unwrap_or_else(|p| p.into_inner());
        let task = tasks.spawn(async move {
            if let Some(answer) = server.handle(msg).await {
                let _ = write(&out, &answer).await;
            }
            if let Some(k) = done_key {
                done.lock().unwrap_or_else(|p| p.into_inner()).remove(&k);
            }
        });
        if let Some(k) = key {
            registry.insert(k, task);
        }
        drop(registry);
    }
    while tasks.join_next().await.is_some() {}
    Ok(())
}

/// Writes one message as a line.
async fn write(out: &tokio::sync::Mutex<tokio::io::Stdout>, msg: &Value) -> std::io::Result<()> {
    let mut bytes = serde_json::to_vec(msg).unwrap_or_default();
    bytes.push(b'\n');
    let mut out = out.lock().await;
    out.write_all(&bytes).await?;
    out.flush().await
}
