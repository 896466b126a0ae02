//! `sandtree mcp`: the MCP server on stdin and stdout, one JSON-RPC
//! message per line (no embedded newlines, as MCP's stdio transport
//! says). Requests are answered in the order they come; stdout carries
//! nothing but answers. It ends when stdin ends.

use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

use super::{Backend, Server, codes, error_response};

/// Serves MCP on stdin/stdout until stdin ends.
pub async fn serve<B: Backend>(server: Server<B>) -> std::io::Result<()> {
    let mut lines = BufReader::new(tokio::io::stdin()).lines();
    let mut out = tokio::io::stdout();
    while let Some(line) = lines.next_line().await? {
        if line.trim().is_empty() {
            continue;
        }
        let answer = match serde_json::from_str::<Value>(&line) {
            Ok(msg) => server.handle(msg).await,
            Err(e) => Some(error_response(Value::Null, codes::PARSE_ERROR, format!("not JSON: {e}"))),
        };
        if let Some(answer) = answer {
            let mut bytes = serde_json::to_vec(&answer).unwrap_or_default();
            bytes.push(b'\n');
            out.write_all(&bytes).await?;
            out.flush().await?;
        }
    }
    Ok(())
}
