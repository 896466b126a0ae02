//! A minimal blocking HTTP/1.1 client over the daemon's unix socket, for
//! tools that want no async runtime: the `demo` command and the end-to-end
//! tests. One request per connection (`Connection: close`); chunked
//! responses (NDJSON streams) are de-chunked and returned whole.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use serde_json::Value;

/// Sends one request; returns the status and the body parsed as JSON (or,
/// when it is not JSON, e.g. an NDJSON stream, as a JSON string).
pub fn request(socket: &Path, method: &str, path: &str, body: Option<&Value>) -> std::io::Result<(u16, Value)> {
    let mut s = UnixStream::connect(socket)?;
    s.set_read_timeout(Some(Duration::from_secs(300)))?;
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: sandtree\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw)?;
    let text = String::from_utf8_lossy(&raw);
    let (head, rest) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::UnexpectedEof, format!("no response: {text:?}")))?;
    let status = head.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    let body =
        if head.to_ascii_lowercase().contains("transfer-encoding: chunked") { dechunk(rest) } else { rest.to_string() };
    Ok((status, serde_json::from_str(body.trim()).unwrap_or(Value::String(body))))
}

/// Joins the chunks of a `Transfer-Encoding: chunked` body.
fn dechunk(mut s: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = s.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        s = rest[n..].trim_start_matches("\r\n");
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn dechunk_joins_chunks_and_stops_at_the_last() {
        assert_eq!(super::dechunk("3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"), "abcde");
        assert_eq!(super::dechunk(""), "");
    }
}
