//! `mcp`: the MCP server on stdin and stdout ([`crate::mcp::stdio`]), its
//! tools reaching the daemon through this client.

use anyhow::Result;
use http_body_util::{BodyExt, Full};
use hyper::Method;
use hyper::body::Bytes;

use crate::cli::client::Client;
use crate::mcp::{Backend, Body, Reply, Server};

impl Backend for Client {
    async fn request(&self, method: &'static str, path: String, body: Body) -> Result<Reply, String> {
        let (content_type, bytes) = match body {
            Body::None => (None, Bytes::new()),
            Body::Json(v) => (Some("application/json"), Bytes::from(serde_json::to_vec(&v).unwrap_or_default())),
            Body::Bytes(b) => (Some("application/octet-stream"), Bytes::from(b)),
        };
        let method = Method::from_bytes(method.as_bytes()).map_err(|e| e.to_string())?;
        let body = Full::new(bytes).map_err(|never| match never {}).boxed_unsync();
        let resp = self.send_body(method, &path, content_type, body).await.map_err(|e| format!("{e:#}"))?;
        let status = resp.status().as_u16();
        let body = resp.into_body().collect().await.map_err(|e| format!("reading the daemon's answer: {e}"))?;
        Ok(Reply { status, body: body.to_bytes().to_vec() })
    }
}

pub async fn serve(client: Client) -> Result<i32> {
    crate::mcp::stdio::serve(Server::new(client)).await?;
    Ok(0)
}
