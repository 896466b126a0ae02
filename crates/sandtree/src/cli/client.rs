//! A small HTTP/1.1 client for the daemon's API, over the unix socket or TCP.
//!
//! Built on hyper 1 (one connection per request, which is cheap on a unix
//! socket) and tokio-tungstenite for the websocket of `attach`. Responses are
//! either one JSON document, or an `application/x-ndjson` stream read line by
//! line; error responses (`{"error": {...}}`) become [`RemoteError`].
//!
//! [`Client::send_stdin`] streams a reader (the CLI's own stdin) as the body
//! of an exec ([`sandtree_api::EXEC_STDIN_CONTENT_TYPE`]) while the answer is
//! read: full duplex, with a few chunks in flight at most.

use std::io;
use std::path::PathBuf;
use std::pin::Pin;
use std::task::{Context as TaskContext, Poll};

use anyhow::{Context, Result, anyhow, bail};
use futures_util::StreamExt;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Bytes, Frame, Incoming};
use hyper::header::{AUTHORIZATION, CONTENT_TYPE, HOST};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use sandtree_api::{ApiError, EXEC_STDIN_CONTENT_TYPE, ErrorBody, ErrorCode};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpStream, UnixStream};
use tokio::sync::{mpsc, oneshot};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

pub use crate::url::enc;

/// An error the daemon answered with; displays as its message only.
#[derive(Debug, Clone)]
pub struct RemoteError(pub ApiError);

impl std::fmt::Display for RemoteError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // (The daemon names request fields; the user typed flags.)
        f.write_str(&self.0.for_cli())
    }
}

impl std::error::Error for RemoteError {}

/// Where the daemon listens.
#[derive(Debug, Clone)]
pub enum Endpoint {
    Unix(PathBuf),
    /// `host:port` of an `http://` URL.
    Tcp(String),
}

impl Endpoint {
    /// Parses `http://host:port[/]` (only plain HTTP; put TLS in front if needed).
    pub fn from_url(url: &str) -> Result<Endpoint> {
        let rest = url
            .strip_prefix("http://")
            .ok_or_else(|| anyhow!("--url must look like http://HOST:PORT (got {url:?})"))?;
        let authority = rest.trim_end_matches('/');
        if authority.is_empty() || authority.contains('/') {
            bail!("--url must look like http://HOST:PORT with no path (got {url:?})");
        }
        Ok(Endpoint::Tcp(authority.to_string()))
    }

    fn describe(&self) -> String {
        match self {
            Endpoint::Unix(p) => format!("unix socket {}", p.display()),
            Endpoint::Tcp(a) => format!("http://{a}"),
        }
    }
}

/// A connection to the daemon.
pub enum Conn {
    Unix(UnixStream),
    Tcp(TcpStream),
}

impl AsyncRead for Conn {
    fn poll_read(self: Pin<&mut Self>, cx: &mut TaskContext<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Conn::Unix(s) => Pin::new(s).poll_read(cx, buf),
            Conn::Tcp(s) => Pin::new(s).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Conn {
    fn poll_write(self: Pin<&mut Self>, cx: &mut TaskContext<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Conn::Unix(s) => Pin::new(s).poll_write(cx, buf),
            Conn::Tcp(s) => Pin::new(s).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Conn::Unix(s) => Pin::new(s).poll_flush(cx),
            Conn::Tcp(s) => Pin::new(s).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Conn::Unix(s) => Pin::new(s).poll_shutdown(cx),
            Conn::Tcp(s) => Pin::new(s).poll_shutdown(cx),
        }
    }
}

/// The API client.
#[derive(Debug, Clone)]
pub struct Client {
    endpoint: Endpoint,
    token: Option<String>,
}

impl Client {
    pub fn new(endpoint: Endpoint, token: Option<String>) -> Client {
        Client { endpoint, token }
    }

    pub fn endpoint(&self) -> &Endpoint {
        &self.endpoint
    }

    async fn connect(&self) -> Result<Conn> {
        let conn = match &self.endpoint {
            Endpoint::Unix(p) => UnixStream::connect(p).await.map(Conn::Unix),
            Endpoint::Tcp(a) => TcpStream::connect(a.as_str()).await.map(Conn::Tcp),
        };
        conn.map_err(|e| {
            anyhow!(
                "cannot connect to the sandtree daemon at {}: {e}; start it with `sandtree daemon` \
                 (or point --socket / SANDTREE_SOCKET, --url / SANDTREE_URL at it)",
                self.endpoint.describe()
            )
        })
    }

    fn host(&self) -> &str {
        match &self.endpoint {
            Endpoint::Unix(_) => "localhost",
            Endpoint::Tcp(a) => a,
        }
    }

    /// Sends one request; the body, if any, is JSON. Returns the raw response.
    pub async fn send<B: Serialize + ?Sized>(
        &self,
        method: Method,
        path: &str,
        body: Option<&B>,
    ) -> Result<Response<Incoming>> {
        let (content_type, bytes) = match body {
            Some(b) => (Some("application/json"), Bytes::from(serde_json::to_vec(b)?)),
            None => (None, Bytes::new()),
        };
        let body = Full::new(bytes).map_err(|never| match never {}).boxed_unsync();
        self.send_body(method, path, content_type, body).await
    }

    /// Sends one request with `body` (of type `content_type`). Returns the
    /// raw response as soon as its head arrives: the body may still be sending.
    pub async fn send_body(
        &self,
        method: Method,
        path: &str,
        content_type: Option<&str>,
        body: UnsyncBoxBody<Bytes, io::Error>,
    ) -> Result<Response<Incoming>> {
        let conn = self.connect().await?;
        let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(conn))
            .await
            .context("HTTP handshake with the daemon")?;
        tokio::spawn(async move {
            let _ = connection.await;
        });
        let mut req = Request::builder().method(method).uri(path).header(HOST, self.host());
        if let Some(t) = &self.token {
            req = req.header(AUTHORIZATION, format!("Bearer {t}"));
        }
        if let Some(ct) = content_type {
            req = req.header(CONTENT_TYPE, ct);
        }
        let req = req.body(body)?;
        let resp = sender.send_request(req).await.context("sending the request to the daemon")?;
        Ok(resp)
    }

    /// Starts `POST path` (an exec) whose body is `head` as one JSON line,
    /// then everything `stdin` yields, read on a thread of its own in
    /// chunks of [`STDIN_CHUNK`] with at most [`STDIN_CHUNKS`] in flight.
    /// Returns the response as soon as its head arrives, and the switch
    /// that ends the body early (once the answer is complete, the rest of
    /// stdin is not wanted).
    pub async fn send_stdin<B: Serialize + ?Sized>(
        &self,
        path: &str,
        head: &B,
        stdin: impl io::Read + Send + 'static,
    ) -> Result<(Response<Incoming>, StdinStop)> {
        let mut line = serde_json::to_vec(head)?;
        line.push(b'\n');
        let (tx, rx) = mpsc::channel::<io::Result<Bytes>>(STDIN_CHUNKS);
        std::thread::Builder::new()
            .name("stdin".into())
            .spawn(move || pump_reader(stdin, tx))
            .context("starting the stdin reader")?;
        // `true`: end the body cleanly; `false` (or the sender dropped):
        // break it off, so that the daemon kills the program rather than
        // give it a cut stdin as the whole.
        let (stop, stopped) = oneshot::channel::<bool>();
        let rest = futures_util::stream::unfold(Some((rx, stopped)), |state| async move {
            let (mut rx, mut stopped) = state?;
            tokio::select! {
                biased;
                clean = &mut stopped => match clean {
                    Ok(true) => None,
                    _ => Some((Err(io::Error::other("the CLI stopped before the end of its stdin")), None)),
                },
                chunk = rx.recv() => chunk.map(|c| (c, Some((rx, stopped)))),
            }
        });
        let chunks =
            futures_util::stream::once(async move { Ok(Bytes::from(line)) }).chain(rest).map(|c| c.map(Frame::data));
        let body = StreamBody::new(chunks).boxed_unsync();
        let resp = self.send_body(Method::POST, path, Some(EXEC_STDIN_CONTENT_TYPE), body).await?;
        Ok((resp, StdinStop(Some(stop))))
    }

    /// Sends a request and returns its JSON body (`null` for 204), or the
    /// daemon's error as [`RemoteError`].
    pub async fn call<B: Serialize + ?Sized>(
        &self,
        method: Method,
        path: &str,
        body: Option<&B>,
    ) -> Result<serde_json::Value> {
        let resp = self.send(method, path, body).await?;
        read_json(resp).await
    }

    /// Like [`Client::call`], decoded to `T`.
    pub async fn call_as<T: DeserializeOwned, B: Serialize + ?Sized>(
        &self,
        method: Method,
        path: &str,
        body: Option<&B>,
    ) -> Result<T> {
        let v = self.call(method, path, body).await?;
        serde_json::from_value(v).context("unexpected response shape from the daemon")
    }

    /// Sends a request answered by an NDJSON stream; calls `on_event` for
    /// each line as it arrives. An error response becomes [`RemoteError`].
    pub async fn stream<T, B, F>(&self, method: Method, path: &str, body: Option<&B>, on_event: F) -> Result<()>
    where
        T: DeserializeOwned,
        B: Serialize + ?Sized,
        F: FnMut(T) -> Result<()>,
    {
        let resp = self.send(method, path, body).await?;
        read_stream(resp, on_event).await
    }

    /// Opens a websocket on `path`.
    /// `GET path` upgraded to raw bytes (`Upgrade: tcp`): a connection
    /// to a port inside a sandbox, through the API.
    pub async fn upgrade_tcp(&self, path: &str) -> Result<TokioIo<hyper::upgrade::Upgraded>> {
        let conn = self.connect().await?;
        let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(conn))
            .await
            .context("HTTP handshake with the daemon")?;
        tokio::spawn(async move {
            let _ = connection.with_upgrades().await;
        });
        let mut req = Request::builder()
            .method(Method::GET)
            .uri(path)
            .header(HOST, self.host())
            .header(hyper::header::CONNECTION, "Upgrade")
            .header(hyper::header::UPGRADE, "tcp");
        if let Some(t) = &self.token {
            req = req.header(AUTHORIZATION, format!("Bearer {t}"));
        }
        let empty = Full::new(Bytes::new()).map_err(|never| match never {}).boxed_unsync();
        let resp = sender.send_request(req.body(empty)?).await.context("sending the request to the daemon")?;
        if resp.status() != StatusCode::SWITCHING_PROTOCOLS {
            let status = resp.status();
            let body = resp.into_body().collect().await.map(|b| b.to_bytes()).unwrap_or_default();
            return Err(error_of(status, &body).into());
        }
        Ok(TokioIo::new(hyper::upgrade::on(resp).await.context("upgrading the connection")?))
    }

    pub async fn websocket(&self, path: &str) -> Result<WebSocketStream<Conn>> {
        let conn = self.connect().await?;
        let mut req = format!("ws://{}{path}", self.host()).into_client_request()?;
        if let Some(t) = &self.token {
            req.headers_mut().insert(AUTHORIZATION, format!("Bearer {t}").parse()?);
        }
        match tokio_tungstenite::client_async(req, conn).await {
            Ok((ws, _)) => Ok(ws),
            Err(tokio_tungstenite::tungstenite::Error::Http(resp)) => {
                let status = resp.status();
                let body = resp.body().clone().unwrap_or_default();
                Err(error_of(status, &body).into())
            }
            Err(e) => Err(anyhow!("websocket to the daemon failed: {e}")),
        }
    }
}

/// Chunk size of a streamed stdin.
pub const STDIN_CHUNK: usize = 256 << 10;
/// Chunks of a streamed stdin read ahead of the connection.
pub const STDIN_CHUNKS: usize = 4;

/// Ends a body started by [`Client::send_stdin`]: cleanly with
/// [`StdinStop::stop`] (the program's answer is in), or, dropped without
/// it (an error on the way), by breaking the body off.
pub struct StdinStop(Option<oneshot::Sender<bool>>);

impl StdinStop {
    pub fn stop(&mut self) {
        if let Some(s) = self.0.take() {
            let _ = s.send(true);
        }
    }
}

impl Drop for StdinStop {
    fn drop(&mut self) {
        if let Some(s) = self.0.take() {
            let _ = s.send(false);
        }
    }
}

/// Reads `r` to its end into `tx` (a read error is passed on: it aborts
/// the request, so the daemon kills the program instead of giving it a
/// truncated stdin). Stops when the receiver is gone.
fn pump_reader(mut r: impl io::Read, tx: mpsc::Sender<io::Result<Bytes>>) {
    loop {
        let mut buf = vec![0u8; STDIN_CHUNK];
        let n = match r.read(&mut buf) {
            Ok(0) => return,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => {
                let _ = tx.blocking_send(Err(io::Error::new(e.kind(), format!("reading stdin: {e}"))));
                return;
            }
        };
        buf.truncate(n);
        if tx.blocking_send(Ok(Bytes::from(buf))).is_err() {
            return;
        }
    }
}

/// Reads an NDJSON response; calls `on_event` for each line as it arrives.
/// An error response becomes [`RemoteError`].
pub async fn read_stream<T, F>(resp: Response<Incoming>, mut on_event: F) -> Result<()>
where
    T: DeserializeOwned,
    F: FnMut(T) -> Result<()>,
{
    let status = resp.status();
    let mut body = resp.into_body();
    if !status.is_success() {
        let bytes = body.collect().await?.to_bytes();
        return Err(error_of(status, &bytes).into());
    }
    let mut buf: Vec<u8> = Vec::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.context("reading the daemon's stream")?;
        let Ok(data) = frame.into_data() else {
            continue;
        };
        buf.extend_from_slice(&data);
        while let Some(nl) = buf.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = buf.drain(..=nl).collect();
            let line = &line[..line.len() - 1];
            if line.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            let ev: T = serde_json::from_slice(line).context("invalid line in the daemon's stream")?;
            on_event(ev)?;
        }
    }
    if !buf.iter().all(u8::is_ascii_whitespace) {
        on_event(serde_json::from_slice(&buf).context("invalid last line in the daemon's stream")?)?;
    }
    Ok(())
}

/// Reads a JSON response (`null` for an empty body); an error response
/// becomes [`RemoteError`].
pub async fn read_json(resp: Response<Incoming>) -> Result<serde_json::Value> {
    let status = resp.status();
    let bytes = resp.into_body().collect().await.context("reading the daemon's response")?.to_bytes();
    if !status.is_success() {
        return Err(error_of(status, &bytes).into());
    }
    if bytes.is_empty() {
        return Ok(serde_json::Value::Null);
    }
    serde_json::from_slice(&bytes).with_context(|| format!("the daemon answered invalid JSON ({status})"))
}

/// The [`RemoteError`] of an error response (JSON error body, or its status).
pub fn error_of(status: StatusCode, body: &[u8]) -> RemoteError {
    match serde_json::from_slice::<ErrorBody>(body) {
        Ok(b) => RemoteError(b.error),
        Err(_) => {
            let text = String::from_utf8_lossy(body);
            let code = if status == StatusCode::UNAUTHORIZED { ErrorCode::Unauthorized } else { ErrorCode::Internal };
            RemoteError(ApiError::new(code, format!("the daemon answered {status}: {}", text.trim())))
        }
    }
}
