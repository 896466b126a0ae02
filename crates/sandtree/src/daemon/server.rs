//! Listeners and lifecycle: the unix socket, the optional TCP listener,
//! request logging and graceful shutdown.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use axum::extract::Request;
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::serve::{Listener, ListenerExt};
use axum::{Extension, Router};
use sandtree_runtime::{Config, Engine, Zygote};
use tokio::sync::watch;

use super::DaemonArgs;
use super::auth::{self, Token};
use super::routes::api_router;

/// Largest JSON request body accepted (`stdin`/`stdin_base64` of an exec
/// travel in it). A streamed stdin ([`sandtree_api::EXEC_STDIN_CONTENT_TYPE`])
/// has no limit: the daemon never holds it whole.
pub const MAX_BODY_BYTES: usize = 64 << 20;

/// How long shutdown waits for in-flight requests (attached shells included).
const DRAIN: Duration = Duration::from_secs(10);

/// Refuses to start when another daemon answers on `socket`; removes a stale socket file.
pub fn check_socket_free(socket: &Path) -> Result<()> {
    if std::fs::symlink_metadata(socket).is_err() {
        return Ok(());
    }
    if std::os::unix::net::UnixStream::connect(socket).is_ok() {
        bail!(
            "another sandtree daemon is already listening on {}: stop it first, or pass --socket (and --data-dir) for a second one",
            socket.display()
        );
    }
    std::fs::remove_file(socket).with_context(|| format!("removing stale socket {}", socket.display()))?;
    Ok(())
}

/// The whole application: routes, engine, request log; with a token,
/// every request must carry it. (JSON bodies are limited by their
/// extractor, [`super::error::ApiJson`]; a streamed stdin is not.)
pub fn app(engine: Option<Arc<Engine>>, token: Option<Token>) -> Router {
    let mut router = api_router().route(
        "/mcp",
        axum::routing::post(super::mcp_http::post)
            .get(super::mcp_http::not_offered)
            .delete(super::mcp_http::not_offered),
    );
    if let Some(engine) = engine {
        // (The MCP server, with the router its tools call, made once.)
        let mcp = Arc::new(super::mcp_http::server(engine.clone()));
        router = router.layer(Extension(engine)).layer(Extension(mcp));
    }
    if let Some(token) = token {
        router = router.layer(middleware::from_fn_with_state(token, auth::require_token));
    }
    router.layer(middleware::from_fn(log_request))
}

async fn log_request(req: Request, next: Next) -> Response {
    let (method, path) = (req.method().clone(), req.uri().path().to_string());
    let t0 = Instant::now();
    let resp = next.run(req).await;
    let ms = t0.elapsed().as_secs_f64() * 1000.0;
    let status = resp.status().as_u16();
    if status >= 500 {
        tracing::warn!(%method, %path, status, ms, "request");
    } else {
        tracing::info!(%method, %path, status, ms, "request");
    }
    resp
}

fn bind_unix(socket: &Path) -> Result<tokio::net::UnixListener> {
    if let Some(dir) = socket.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    check_socket_free(socket)?;
    // Created 0600 from the start: no window where others could connect.
    let old = nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o177));
    let listener = tokio::net::UnixListener::bind(socket);
    nix::sys::stat::umask(old);
    let listener = listener.with_context(|| format!("binding unix socket {}", socket.display()))?;
    std::fs::set_permissions(socket, std::fs::Permissions::from_mode(0o600))?;
    Ok(listener)
}

async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = match signal(SignalKind::terminate()) {
        Ok(s) => s,
        Err(e) => {
            tracing::error!("cannot listen for SIGTERM: {e}");
            std::future::pending::<()>().await;
            unreachable!()
        }
    };
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM: shutting down"),
        _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT: shutting down"),
    }
}

/// Sends each write at once (`TCP_NODELAY`) on a TCP connection: a
/// streamed answer is many small writes (Connect frames, NDJSON lines),
/// which Nagle's algorithm would otherwise hold back until the client's
/// delayed acknowledgement (40 ms each).
pub fn no_delay(tcp: &mut tokio::net::TcpStream) {
    if let Err(e) = tcp.set_nodelay(true) {
        tracing::debug!("TCP_NODELAY: {e}");
    }
}

/// Opens the engine, serves until a signal, then drains.
pub async fn run(args: DaemonArgs, cfg: Config, zygote: Zygote) -> Result<()> {
    let t0 = Instant::now();
    let engine = Engine::open(cfg, zygote).await.map_err(|e| anyhow::anyhow!(e.to_api().message))?;
    tracing::info!(ms = t0.elapsed().as_millis() as u64, data_dir = %args.data_dir.display(), "engine ready");

    let (stop_tx, stop_rx) = watch::channel(false);
    let stopped = |mut rx: watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };

    // The token file and the TCP listener first: a client that sees the
    // unix socket answer may read the token at once (the auth test did,
    // and found no file in one CI run).
    let tcp = match args.tcp {
        Some(addr) => {
            let token = auth::load_or_create_token(&args.token_path())?;
            let tcp = tokio::net::TcpListener::bind(addr).await.with_context(|| format!("binding TCP {addr}"))?;
            Some((tcp, token))
        }
        None => None,
    };
    let e2b = match args.e2b {
        Some(addr) => {
            let token = auth::load_or_create_token(&args.token_path())?;
            let listener =
                tokio::net::TcpListener::bind(addr).await.with_context(|| format!("binding the E2B door {addr}"))?;
            Some((listener, token))
        }
        None => None,
    };
    let socket = args.socket_path();
    let unix = bind_unix(&socket)?;
    tracing::info!(socket = %socket.display(), "listening on the unix socket (no token)");
    let unix_app = app(Some(engine.clone()), None);
    let mut servers = tokio::task::JoinSet::new();
    let rx = stop_rx.clone();
    servers.spawn(async move {
        axum::serve(unix, unix_app).with_graceful_shutdown(stopped(rx)).await.context("unix socket server")
    });

    if let Some((tcp, token)) = tcp {
        let tcp = tcp.tap_io(no_delay);
        tracing::info!(addr = %tcp.local_addr()?, token_file = %args.token_path().display(), "listening on TCP (bearer token required)");
        let tcp_app = app(Some(engine.clone()), Some(token));
        let rx = stop_rx.clone();
        servers.spawn(async move {
            axum::serve(tcp, tcp_app).with_graceful_shutdown(stopped(rx)).await.context("TCP server")
        });
    }

    if let Some((listener, token)) = e2b {
        let listener = listener.tap_io(no_delay);
        tracing::info!(addr = %listener.local_addr()?, "serving the E2B API (E2B_API_KEY: the token)");
        let door = crate::e2b::router(crate::e2b::E2b::open(engine.clone(), token).await)
            .layer(middleware::from_fn(log_request));
        let rx = stop_rx.clone();
        servers.spawn(async move {
            axum::serve(listener, door).with_graceful_shutdown(stopped(rx)).await.context("E2B server")
        });
    }

    let failed = tokio::select! {
        _ = shutdown_signal() => None,
        r = servers.join_next() => r,
    };
    let _ = stop_tx.send(true);
    if let Some(r) = failed {
        let _ = std::fs::remove_file(&socket);
        r.context("server task")??;
        bail!("a listener stopped unexpectedly");
    }
    // A second signal cuts the clean-up short: the next start copes with
    // what is left, as after a SIGKILL.
    let clean_up = async {
        let drained = tokio::time::timeout(DRAIN, async {
            while let Some(r) = servers.join_next().await {
                if let Ok(Err(e)) = r {
                    tracing::warn!("{e:#}");
                }
            }
        })
        .await;
        if drained.is_err() {
            tracing::warn!("requests still running after {DRAIN:?}; exiting anyway");
        }
        let _ = std::fs::remove_file(&socket);
        engine.shutdown(args.keep_sandboxes).await
    };
    let report = tokio::select! {
        report = clean_up => report,
        _ = shutdown_signal() => {
            let _ = std::fs::remove_file(&socket);
            bail!("a second signal: exited before the clean-up ended; the next start reuses or removes what was left");
        }
    };
    for left in &report.left_behind {
        tracing::warn!("left behind: {left}");
    }
    if args.keep_sandboxes {
        tracing::info!("stopped; sandboxes keep running and are re-adopted on the next start");
    } else {
        tracing::info!(
            sandboxes_stopped = report.sandboxes_stopped,
            "stopped; the next start boots the sandboxes that were running again from their filesystems"
        );
    }
    drop(engine);
    Ok(())
}
