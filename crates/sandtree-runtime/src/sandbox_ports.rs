//! Ports of a sandbox reachable from the host (`sandtree port SB 8000`).
//!
//! An exposed port is a listener of the daemon's on `127.0.0.1:<ephemeral>`
//! (the daemon's host alone: off the host, the API's authenticated tunnel
//! is the way in). Each connection it accepts is carried to the port inside
//! the sandbox by a socket the daemon makes at that moment: from the
//! sandbox's router to its address (a server bound to every address or to
//! that one; to the sandbox, a peer outside), else in the sandbox's network
//! namespace to `127.0.0.1:<port>` (a server bound to loopback alone, or a
//! sandbox without a network), then to its own address. Being made at each connection, it reaches
//! whatever init the sandbox has then: an exposure outlives a rollback, a
//! stop and start, and works for sandboxes without a network too.
//!
//! Exposures are the daemon's memory: a deleted sandbox's close, and a
//! restarted daemon has none (expose again).
//!
//! A connection from the router is, to the sandbox's processes, one to the
//! outside: a checkpoint takes it, a rollback resets it (`tcp.rs`). One
//! made on the sandbox's loopback has its other end in no process of the
//! sandbox: a checkpoint while one is open refuses it by name.

use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use sandtree_api::{PortInfo, PortList};
use tokio::net::{TcpListener, TcpStream};

use crate::{Engine, Error, Result};

/// One exposed port.
pub(crate) struct Exposure {
    address: SocketAddr,
    connections: Arc<AtomicU64>,
    task: tokio::task::AbortHandle,
}

impl Drop for Exposure {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Engine {
    /// Makes `port` of sandbox `id` reachable from the host (the same
    /// address again if it already is).
    pub async fn expose_port(&self, id: &str, port: u16) -> Result<PortInfo> {
        self.record(id)?;
        if port == 0 {
            return Err(Error::InvalidArgument("port 0 is not a port a server listens on".into()));
        }
        if let Some(info) = self.port_info(id, port) {
            return Ok(info);
        }
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .await
            .map_err(|e| Error::Internal(format!("cannot listen on the host for port {port}: {e}")))?;
        let address = listener.local_addr().map_err(|e| Error::Internal(e.to_string()))?;
        let connections = Arc::new(AtomicU64::new(0));
        let (this, sandbox, counter) = (self.this.clone(), id.to_string(), connections.clone());
        let task = tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else { continue };
                let Some(engine) = this.upgrade() else { return };
                counter.fetch_add(1, Ordering::Relaxed);
                let sandbox = sandbox.clone();
                tokio::spawn(async move {
                    match engine.connect_port(&sandbox, port).await {
                        Ok(inside) => carry(client, inside).await,
                        Err(e) => tracing::debug!(sandbox, port, "an exposed port's connection found no server: {e}"),
                    }
                });
            }
        })
        .abort_handle();
        let exposure = Exposure { address, connections, task };
        self.ports.lock().unwrap_or_else(|p| p.into_inner()).entry(id.to_string()).or_default().insert(port, exposure);
        Ok(self.port_info(id, port).expect("just exposed"))
    }

    /// A sandbox's exposed ports.
    pub fn list_ports(&self, id: &str) -> Result<PortList> {
        self.record(id)?;
        let ports = self.ports.lock().unwrap_or_else(|p| p.into_inner());
        let mut list: Vec<PortInfo> =
            ports.get(id).map(|m| m.iter().map(|(p, e)| info(*p, e)).collect()).unwrap_or_default();
        list.sort_by_key(|p| p.port);
        Ok(PortList { ports: list })
    }

    /// Closes an exposed port (connections carried so far go on).
    pub fn close_port(&self, id: &str, port: u16) -> Result<()> {
        self.record(id)?;
        let mut ports = self.ports.lock().unwrap_or_else(|p| p.into_inner());
        match ports.get_mut(id).and_then(|m| m.remove(&port)) {
            Some(_) => Ok(()),
            None => Err(Error::InvalidArgument(format!("port {port} of sandbox {id} is not exposed"))),
        }
    }

    /// Forgets a deleted sandbox's exposures.
    pub(crate) fn close_ports(&self, id: &str) {
        self.ports.lock().unwrap_or_else(|p| p.into_inner()).remove(id);
    }

    fn port_info(&self, id: &str, port: u16) -> Option<PortInfo> {
        let ports = self.ports.lock().unwrap_or_else(|p| p.into_inner());
        ports.get(id).and_then(|m| m.get(&port)).map(|e| info(port, e))
    }

    /// A connection to `port` inside sandbox `id` (started if stopped).
    pub async fn connect_port(&self, id: &str, port: u16) -> Result<TcpStream> {
        let sb = self.running(id).await?;
        // From its router first: to the sandbox, a peer outside (a
        // checkpoint takes it as such, a rollback resets it).
        let router = self.attachment(id).map(|a| a.router());
        let init = sb.init_pid();
        let stream = tokio::task::spawn_blocking(move || {
            if let Some(Ok(s)) = router.map(|r| r.connect(port)) {
                return Ok(s);
            }
            let net = ("net", rustix::thread::LinkNameSpaceType::Network);
            sandtree_sys::process::on_thread_in_namespace(init, net, || {
                let mut last = None;
                for addr in [Ipv4Addr::LOCALHOST, sandtree_api::SANDBOX_ADDRESS] {
                    match std::net::TcpStream::connect(SocketAddrV4::new(addr, port)) {
                        Ok(s) => return Ok(s),
                        Err(e) => last = Some(e),
                    }
                }
                Err(last.expect("tried"))
            })?
        })
        .await?
        .map_err(|e| {
            Error::InvalidArgument(format!("nothing accepts connections on port {port} in sandbox {id}: {e}"))
        })?;
        stream.set_nonblocking(true).map_err(|e| Error::Internal(e.to_string()))?;
        TcpStream::from_std(stream).map_err(|e| Error::Internal(e.to_string()))
    }
}

fn info(port: u16, e: &Exposure) -> PortInfo {
    PortInfo {
        port,
        address: e.address.to_string(),
        url: format!("http://{}/", e.address),
        connections: e.connections.load(Ordering::Relaxed),
    }
}

/// Copies both ways until both sides are done.
async fn carry(mut a: TcpStream, mut b: TcpStream) {
    let _ = a.set_nodelay(true);
    let _ = b.set_nodelay(true);
    let _ = tokio::io::copy_bidirectional(&mut a, &mut b).await;
}

/// Exposed ports by sandbox, then by port inside.
pub(crate) type Ports = std::sync::Mutex<HashMap<String, HashMap<u16, Exposure>>>;
