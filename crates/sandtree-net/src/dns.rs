//! The DNS forwarder of one sandbox: a UDP socket and a TCP listener on
//! `10.0.2.2:53` in its router (every query of the sandbox to port 53,
//! whatever the address, is turned to them), served by the daemon, which
//! asks the host's resolvers from the host's namespace (over UDP; over TCP
//! again for a truncated answer a TCP client asked for).
//!
//! Per query: read the question (one, as every stub resolver sends);
//! under the policy ([`NameVerdict`]) answer `NXDOMAIN` at once, or pass
//! it upstream (each server in turn, 2 s each) and relay the answer.
//! For an allowed name under deny-by-default, the answer's `A` addresses
//! are let through the router (for their TTL, at least a minute) before
//! the sandbox gets the answer, so its connection cannot outrun them.
//!
//! Message format (RFC 1035 §4): a 12-byte header (id, flags, four
//! counts), then questions (name as length-prefixed labels, type, class),
//! then resource records (name — possibly a 2-byte pointer `0xC0..` —,
//! type, class, TTL u32, length u16, data).

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use tokio::net::UdpSocket;

use crate::policy::{NameVerdict, Policy};
use crate::router::Router;

/// How long one upstream server is given.
const UPSTREAM_TIMEOUT: Duration = Duration::from_secs(2);
/// How long a TCP connection of the sandbox's may stay open.
const TCP_IDLE: Duration = Duration::from_secs(30);
/// Shortest time an allowed name's addresses stay let through.
const MIN_ALLOW_TTL: u32 = 60;

/// Serves `socket` (UDP) and `listener` (TCP: each query and answer
/// prefixed by its length, RFC 1035 §4.2.2) until the task is aborted.
pub async fn serve(
    socket: UdpSocket,
    listener: tokio::net::TcpListener,
    router: Arc<Router>,
    policy: Arc<RwLock<Policy>>,
    upstream: Arc<Vec<SocketAddr>>,
) {
    let streams = {
        let (router, policy, upstream) = (router.clone(), policy.clone(), upstream.clone());
        async move {
            loop {
                let Ok((conn, _)) = listener.accept().await else {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                };
                let (router, policy, upstream) = (router.clone(), policy.clone(), upstream.clone());
                tokio::spawn(async move {
                    let _ = tokio::time::timeout(TCP_IDLE, serve_stream(conn, &router, &policy, &upstream)).await;
                });
            }
        }
    };
    let datagrams = async move {
        let socket = Arc::new(socket);
        let mut buf = vec![0u8; 4096];
        loop {
            let Ok((n, from)) = socket.recv_from(&mut buf).await else {
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            };
            let query = buf[..n].to_vec();
            let (socket, router, policy, upstream) = (socket.clone(), router.clone(), policy.clone(), upstream.clone());
            tokio::spawn(async move {
                if let Some(answer) = answer(&query, &router, &policy, &upstream, false).await {
                    let _ = socket.send_to(&answer, from).await;
                }
            });
        }
    };
    tokio::join!(streams, datagrams);
}

/// One TCP connection's queries, answered in turn.
async fn serve_stream(
    mut conn: tokio::net::TcpStream,
    router: &Arc<Router>,
    policy: &RwLock<Policy>,
    upstream: &[SocketAddr],
) -> std::io::Result<()> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    loop {
        let mut len = [0u8; 2];
        if conn.read_exact(&mut len).await.is_err() {
            return Ok(());
        }
        let mut query = vec![0u8; u16::from_be_bytes(len) as usize];
        conn.read_exact(&mut query).await?;
        let Some(answer) = answer(&query, router, policy, upstream, true).await else { return Ok(()) };
        let mut out = (answer.len() as u16).to_be_bytes().to_vec();
        out.extend_from_slice(&answer);
        conn.write_all(&out).await?;
    }
}

/// The answer to `query` (`stream`: it came over TCP, and may be long).
async fn answer(
    query: &[u8],
    router: &Arc<Router>,
    policy: &RwLock<Policy>,
    upstream: &[SocketAddr],
    stream: bool,
) -> Option<Vec<u8>> {
    let (qname, _) = question(query)?;
    let verdict = policy.read().map(|p| p.name_verdict(&qname)).unwrap_or(NameVerdict::Refuse);
    if verdict == NameVerdict::Refuse {
        return Some(error_answer(query, 3));
    }
    let mut answer = None;
    for server in upstream {
        // Over UDP first; a truncated answer (TC) is asked again over TCP
        // for a client that came over TCP.
        let got = match ask(query, *server).await {
            Some(a) if stream && a.len() >= 3 && a[2] & 0x02 != 0 => ask_stream(query, *server).await.or(Some(a)),
            other => other,
        };
        if let Some(a) = got {
            answer = Some(a);
            break;
        }
    }
    let Some(answer) = answer else {
        return Some(error_answer(query, 2)); // SERVFAIL
    };
    if verdict == NameVerdict::AllowAddresses {
        let (addrs, ttl) = a_records(&answer);
        if !addrs.is_empty() {
            let router = router.clone();
            let ttl = ttl.max(MIN_ALLOW_TTL);
            let done = tokio::task::spawn_blocking(move || router.allow_learned(&addrs, ttl)).await;
            if !matches!(done, Ok(Ok(()))) {
                tracing::warn!(name = qname, "cannot let an allowed name's addresses through: {done:?}");
                return Some(error_answer(query, 2));
            }
        }
    }
    Some(answer)
}

async fn ask(query: &[u8], server: SocketAddr) -> Option<Vec<u8>> {
    let bind: SocketAddr = if server.is_ipv4() { "0.0.0.0:0" } else { "[::]:0" }.parse().ok()?;
    let sock = UdpSocket::bind(bind).await.ok()?;
    sock.connect(server).await.ok()?;
    sock.send(query).await.ok()?;
    let mut buf = vec![0u8; 4096];
    let deadline = tokio::time::Instant::now() + UPSTREAM_TIMEOUT;
    loop {
        let n = tokio::time::timeout_at(deadline, sock.recv(&mut buf)).await.ok()?.ok()?;
        // Only the answer to this query (same id) counts.
        if n >= 12 && buf[..2] == query[..2] {
            return Some(buf[..n].to_vec());
        }
    }
}

async fn ask_stream(query: &[u8], server: SocketAddr) -> Option<Vec<u8>> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let exchange = async {
        let mut conn = tokio::net::TcpStream::connect(server).await.ok()?;
        let mut out = (query.len() as u16).to_be_bytes().to_vec();
        out.extend_from_slice(query);
        conn.write_all(&out).await.ok()?;
        let mut len = [0u8; 2];
        conn.read_exact(&mut len).await.ok()?;
        let mut answer = vec![0u8; u16::from_be_bytes(len) as usize];
        conn.read_exact(&mut answer).await.ok()?;
        Some(answer)
    };
    tokio::time::timeout(UPSTREAM_TIMEOUT, exchange).await.ok()?
}

/// The first question's name (lowercase, no trailing dot) and the offset
/// after it.
pub fn question(msg: &[u8]) -> Option<(String, usize)> {
    if msg.len() < 12 || u16::from_be_bytes([msg[4], msg[5]]) == 0 {
        return None;
    }
    let (name, at) = read_name(msg, 12)?;
    (at + 4 <= msg.len()).then_some((name, at + 4))
}

/// A name at `at`: labels, maybe ending in a pointer. Answers the name and
/// the offset after it (after the pointer, if any).
fn read_name(msg: &[u8], mut at: usize) -> Option<(String, usize)> {
    let mut labels: Vec<String> = Vec::new();
    let mut end = None;
    for _ in 0..128 {
        let len = *msg.get(at)? as usize;
        if len & 0xC0 == 0xC0 {
            let ptr = ((len & 0x3F) << 8) | *msg.get(at + 1)? as usize;
            end.get_or_insert(at + 2);
            at = ptr;
            continue;
        }
        if len == 0 {
            return Some((labels.join(".").to_ascii_lowercase(), end.unwrap_or(at + 1)));
        }
        labels.push(String::from_utf8_lossy(msg.get(at + 1..at + 1 + len)?).into_owned());
        at += 1 + len;
    }
    None
}

/// The `A` records of an answer and their smallest TTL.
pub fn a_records(msg: &[u8]) -> (Vec<Ipv4Addr>, u32) {
    let mut out = Vec::new();
    let mut ttl = u32::MAX;
    let mut parse = || -> Option<()> {
        let qd = u16::from_be_bytes([msg[4], msg[5]]) as usize;
        let an = u16::from_be_bytes([msg[6], msg[7]]) as usize;
        let mut at = 12;
        for _ in 0..qd {
            at = read_name(msg, at)?.1 + 4;
        }
        for _ in 0..an {
            at = read_name(msg, at)?.1;
            let head = msg.get(at..at + 10)?;
            let (kind, class) = (u16::from_be_bytes([head[0], head[1]]), u16::from_be_bytes([head[2], head[3]]));
            let rr_ttl = u32::from_be_bytes([head[4], head[5], head[6], head[7]]);
            let len = u16::from_be_bytes([head[8], head[9]]) as usize;
            let data = msg.get(at + 10..at + 10 + len)?;
            if kind == 1 && class == 1 && len == 4 {
                out.push(Ipv4Addr::new(data[0], data[1], data[2], data[3]));
                ttl = ttl.min(rr_ttl);
            }
            at += 10 + len;
        }
        Some(())
    };
    if msg.len() >= 12 {
        let _ = parse();
    }
    (out, if ttl == u32::MAX { 0 } else { ttl })
}

/// An answer to `query` with no records and response code `rcode`.
pub fn error_answer(query: &[u8], rcode: u8) -> Vec<u8> {
    let end = question(query).map(|(_, end)| end).unwrap_or(12.min(query.len()));
    let mut a = query[..end].to_vec();
    if a.len() >= 12 {
        a[2] = 0x80 | (query[2] & 0x79); // QR, opcode and RD kept
        a[3] = 0x80 | (rcode & 0x0F); // RA
        a[6..12].fill(0); // no answer, authority or additional records
    }
    a
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A query for `name` type A, and an answer with `addrs` (TTL 30) whose
    /// names point back at the question.
    pub fn query(name: &str) -> Vec<u8> {
        let mut q = vec![0x12, 0x34, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0];
        for label in name.split('.') {
            q.push(label.len() as u8);
            q.extend_from_slice(label.as_bytes());
        }
        q.extend_from_slice(&[0, 0, 1, 0, 1]);
        q
    }

    #[test]
    fn questions_and_addresses_are_read_through_name_pointers() {
        let mut a = query("Example.COM");
        a[2] = 0x81;
        a[3] = 0x80;
        a[7] = 2;
        for (ip, ttl) in [([192, 0, 2, 1], 300u32), ([192, 0, 2, 2], 30)] {
            a.extend_from_slice(&[0xC0, 12, 0, 1, 0, 1]);
            a.extend_from_slice(&ttl.to_be_bytes());
            a.extend_from_slice(&[0, 4]);
            a.extend_from_slice(&ip);
        }
        assert_eq!(question(&a).unwrap().0, "example.com");
        let (addrs, ttl) = a_records(&a);
        assert_eq!(addrs, vec![Ipv4Addr::new(192, 0, 2, 1), Ipv4Addr::new(192, 0, 2, 2)]);
        assert_eq!(ttl, 30);
        // Truncated messages give nothing rather than a panic.
        for n in 0..a.len() {
            let _ = a_records(&a[..n]);
            let _ = question(&a[..n]);
        }
    }

    #[test]
    fn a_refusal_echoes_the_question_with_nxdomain() {
        let q = query("blocked.example");
        let a = error_answer(&q, 3);
        assert_eq!(&a[..2], &q[..2]);
        assert_eq!(a[2] & 0x80, 0x80);
        assert_eq!(a[3] & 0x0F, 3);
        assert_eq!(u16::from_be_bytes([a[4], a[5]]), 1);
        assert_eq!(question(&a).unwrap().0, "blocked.example");
        assert_eq!(a.len(), q.len());
    }
}
