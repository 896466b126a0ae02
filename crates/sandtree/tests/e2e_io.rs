//! End-to-end: bytes pass through exec, background processes and sessions
//! unchanged (random data with NUL and invalid UTF-8; 0 B, 1 B, 64 MiB),
//! over the CLI, the JSON API (base64) and the streamed-stdin body, on the
//! unix socket and on TCP; stdin streams with the daemon's memory flat; a
//! JSON body over the limit gets a 413 that names the limit and the way out.

mod common;

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use common::{BIN, Daemon, half_duplex, parse_response, random_bytes, sha256};
use serde_json::{Value, json};

const STDIN_TYPE: &str = "application/vnd.sandtree.exec+stdin";

fn scratch(d: &Daemon, name: &str, data: &[u8]) -> PathBuf {
    let p = d.dir.join(name);
    std::fs::write(&p, data).unwrap();
    p
}

/// `sandtree [global] exec SB -- cmd…` with stdin from `input`; (exit code, stdout, stderr).
fn cli_exec(global: &[&str], sb: &str, cmd: &[&str], input: &Path) -> (i32, Vec<u8>, Vec<u8>) {
    let out = Command::new(BIN)
        .args(global)
        .args(["exec", sb, "--"])
        .args(cmd)
        .stdin(std::fs::File::open(input).unwrap())
        .output()
        .unwrap();
    (out.status.code().unwrap_or(-1), out.stdout, out.stderr)
}

/// One raw HTTP/1.1 exchange on the unix socket, full duplex: `write`
/// sends the body on a thread of its own (its errors are ignored: the
/// daemon may answer before it has read everything) while the answer is
/// read. Returns the status and the (de-chunked) body.
fn exchange(socket: &Path, head: &str, write: impl FnOnce(&mut UnixStream) + Send + 'static) -> (u16, Vec<u8>) {
    exchange_slow(socket, head, write, Duration::ZERO)
}

/// [`exchange`] with a slow reader: `pause` after each MiB read.
fn exchange_slow(
    socket: &Path,
    head: &str,
    write: impl FnOnce(&mut UnixStream) + Send + 'static,
    pause: Duration,
) -> (u16, Vec<u8>) {
    let mut s = UnixStream::connect(socket).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(300))).unwrap();
    s.write_all(head.as_bytes()).unwrap();
    let mut w = s.try_clone().unwrap();
    let writer = std::thread::spawn(move || write(&mut w));
    let mut raw = Vec::new();
    let mut buf = vec![0u8; 64 << 10];
    let mut since_pause = 0;
    loop {
        if since_pause >= 1 << 20 {
            std::thread::sleep(pause);
            since_pause = 0;
        }
        match s.read(&mut buf).unwrap() {
            0 => break,
            n => {
                raw.extend_from_slice(&buf[..n]);
                since_pause += n;
            }
        }
    }
    let _ = writer.join();
    parse_response(&raw)
}

/// A streamed-stdin exec: the JSON line, then `stdin` in chunks of 64 KiB
/// (chunked transfer encoding). Returns the status and body.
fn streamed_exec(socket: &Path, sb: &str, query: &str, req: &Value, stdin: Vec<u8>) -> (u16, Vec<u8>) {
    let head = format!(
        "POST /v1/sandboxes/{sb}/exec{query} HTTP/1.1\r\nHost: sandtree\r\nConnection: close\r\n\
         Content-Type: {STDIN_TYPE}\r\nTransfer-Encoding: chunked\r\n\r\n"
    );
    let mut line = serde_json::to_vec(req).unwrap();
    line.push(b'\n');
    exchange(socket, &head, move |w| {
        let chunk = |w: &mut UnixStream, b: &[u8]| -> std::io::Result<()> {
            write!(w, "{:x}\r\n", b.len())?;
            w.write_all(b)?;
            w.write_all(b"\r\n")
        };
        let _ = (|| {
            chunk(w, &line)?;
            for c in stdin.chunks(64 << 10) {
                chunk(w, c)?;
            }
            w.write_all(b"0\r\n\r\n")
        })();
    })
}

/// The NDJSON events of a streamed exec: (stdout, stderr, exit event), base64 decoded.
fn events(body: &[u8]) -> (Vec<u8>, Vec<u8>, Value) {
    let (mut out, mut err, mut exit) = (Vec::new(), Vec::new(), Value::Null);
    for line in body.split(|&b| b == b'\n').filter(|l| !l.is_empty()) {
        let ev: Value = serde_json::from_slice(line).unwrap();
        match ev["type"].as_str().unwrap() {
            "stdout" => out.extend(BASE64.decode(ev["data"].as_str().unwrap()).unwrap()),
            "stderr" => err.extend(BASE64.decode(ev["data"].as_str().unwrap()).unwrap()),
            "exit" => exit = ev,
            "started" => {}
            other => panic!("unexpected event {other}: {ev}"),
        }
    }
    (out, err, exit)
}

fn b64(v: &Value) -> Vec<u8> {
    BASE64.decode(v.as_str().unwrap_or_else(|| panic!("not a string: {v}"))).unwrap()
}

#[test]
fn exec_stdin_and_output_are_byte_exact() {
    if common::must_skip() {
        return;
    }
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let addr = format!("127.0.0.1:{port}");
    let d = Daemon::start_with("io", &["--image-size", "4G", "--tcp", &addr]);
    let sb = d.create();
    let sock = d.socket.display().to_string();
    let unix = ["--socket", sock.as_str()];

    // The CLI streams its stdin and writes output bytes as they are.
    for (i, n) in [0usize, 1, 100_000, 64 << 20].into_iter().enumerate() {
        let data = random_bytes(n, 7 + i as u64);
        let file = scratch(&d, "in", &data);
        let want = sha256(&data);
        let (code, out, err) = cli_exec(&unix, &sb, &["sha256sum"], &file);
        assert_eq!(code, 0, "{n} B: {}", String::from_utf8_lossy(&err));
        assert_eq!(String::from_utf8_lossy(&out), format!("{want}  -\n"), "sha256sum of {n} B inside");
        let (code, out, err) = cli_exec(&unix, &sb, &["cat"], &file);
        assert_eq!(code, 0, "{n} B: {}", String::from_utf8_lossy(&err));
        assert_eq!(out.len(), n, "cat of {n} B");
        assert_eq!(sha256(&out), want, "cat of {n} B");
        if n == 100_000 {
            let (code, out, err) = cli_exec(&unix, &sb, &["sh", "-c", "cat >&2; exit 3"], &file);
            assert_eq!((code, out.len()), (3, 0));
            assert_eq!(err, data, "stderr");
        }
    }
    // A program that stops reading ends the call; the rest of stdin is not wanted.
    let (code, out, _) = cli_exec(&unix, &sb, &["head", "-c", "10"], Path::new("/dev/zero"));
    assert_eq!((code, out), (0, vec![0u8; 10]));
    // No stdin at all is an empty one (Rust's runtime opens /dev/null on a closed fd 0).
    let out = Command::new("bash")
        .args(["-c", &format!("{BIN} --socket {sock} exec {sb} -- sh -c 'wc -c; echo hi' <&-")])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "0\nhi\n", "{}", String::from_utf8_lossy(&out.stderr));
    // --json: one ExecResponse, output as text; the timeout is reported.
    let mut json_global = unix.to_vec();
    json_global.push("--json");
    let (code, out, _) =
        cli_exec(&json_global, &sb, &["sh", "-c", "head -c 3; echo é; exit 4"], Path::new("/dev/zero"));
    let v: Value = serde_json::from_slice(&out).unwrap();
    assert_eq!((code, v["exit_code"].as_i64(), v["stdout"].as_str()), (4, Some(4), Some("\0\0\0é\n")), "{v}");
    let out = Command::new(BIN)
        .args(["--socket", &sock, "exec", &sb, "--timeout", "300ms", "--", "sleep", "30"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(128 + 9), "{err}");
    assert!(err.contains("timed out"), "{err}");
    // The same over TCP.
    let token = std::fs::read_to_string(d.dir.join("token")).unwrap().trim().to_string();
    let url = format!("http://{addr}");
    let tcp = ["--url", url.as_str(), "--token", token.as_str()];
    let data = random_bytes(8 << 20, 99);
    let file = scratch(&d, "in", &data);
    let (code, out, err) = cli_exec(&tcp, &sb, &["sha256sum"], &file);
    assert_eq!(code, 0, "{}", String::from_utf8_lossy(&err));
    assert_eq!(String::from_utf8_lossy(&out), format!("{}  -\n", sha256(&data)));
    let (code, out, _) = cli_exec(&tcp, &sb, &["cat"], &file);
    assert_eq!((code, out == data), (0, true), "cat over TCP");

    // The JSON API: stdin_base64 in, ?encoding=base64 out, buffered and streamed.
    let exec = format!("/v1/sandboxes/{sb}/exec");
    for n in [0usize, 1, 1 << 20] {
        let data = random_bytes(n, 3);
        let req = json!({"cmd": ["sh", "-c", "cat; cat /dev/null >&2; printf '\\377' >&2"], "stdin_base64": BASE64.encode(&data)});
        let v = d.ok("POST", &format!("{exec}?encoding=base64"), Some(req.clone()));
        assert_eq!(b64(&v["stdout"]), data, "buffered, {n} B");
        assert_eq!(b64(&v["stderr"]), b"\xff");
        let (status, body) = d.req("POST", &format!("{exec}?stream=true&encoding=base64"), Some(req));
        assert_eq!(status, 200);
        let (out, err, exit) = events(body.as_str().unwrap().as_bytes());
        assert_eq!((out == data, err, exit["exit_code"].as_i64()), (true, b"\xff".to_vec(), Some(0)), "{n} B");
    }
    // The default stays text (lossy), and `stdin` stays text.
    let v = d.ok("POST", &exec, Some(json!({"cmd": ["sh", "-c", "cat; printf '\\377'"], "stdin": "héllo "})));
    assert_eq!(v["stdout"], "héllo \u{fffd}");
    // Bad input: both stdins, invalid base64, an unknown encoding.
    let both = json!({"cmd": ["cat"], "stdin": "a", "stdin_base64": "YQ=="});
    let (status, v) = d.req("POST", &exec, Some(both));
    assert_eq!((status, v["error"]["code"].as_str()), (400, Some("invalid_argument")), "{v}");
    assert!(v["error"]["message"].as_str().unwrap().contains("exclusive"), "{v}");
    let (status, v) = d.req("POST", &exec, Some(json!({"cmd": ["cat"], "stdin_base64": "not base64!"})));
    assert_eq!((status, v["error"]["code"].as_str()), (400, Some("invalid_argument")), "{v}");
    assert!(v["error"]["message"].as_str().unwrap().contains("stdin_base64 is not valid base64"), "{v}");
    let (status, v) = d.req("POST", &format!("{exec}?encoding=hex"), Some(json!({"cmd": ["true"]})));
    assert_eq!((status, v["error"]["code"].as_str()), (400, Some("invalid_argument")), "{v}");

    // The streamed-stdin body: full duplex with ?stream=true …
    let data = random_bytes(16 << 20, 5);
    let (status, body) =
        streamed_exec(&d.socket, &sb, "?stream=true&encoding=base64", &json!({"cmd": ["cat"]}), data.clone());
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    let (out, _, exit) = events(&body);
    assert_eq!((out.len(), exit["exit_code"].as_i64()), (data.len(), Some(0)));
    assert!(out == data, "streamed cat");
    // … buffered …
    let (status, body) = streamed_exec(&d.socket, &sb, "", &json!({"cmd": ["sha256sum"]}), data.clone());
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    let v: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(v["stdout"], format!("{}  -\n", sha256(&data)));
    // … answered even when the program stops reading early: the rest is
    // read and dropped, so a client that sends it all before reading gets through …
    let mut body = b"{\"cmd\":[\"head\",\"-c\",\"3\"]}\n".to_vec();
    body.extend_from_slice(&data);
    let head = format!(
        "POST {exec}?encoding=base64 HTTP/1.1\r\nHost: sandtree\r\nConnection: close\r\n\
         Content-Type: {STDIN_TYPE}\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    let (status, body) = half_duplex(&d.socket, &head, &body);
    let v: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!((status, b64(&v["stdout"])), (200, data[..3].to_vec()), "{v}");
    // … and a streamed answer read slowly (the program held back by the
    // bounded output channel) loses nothing.
    let req = br#"{"cmd":["head","-c","12582912","/dev/zero"]}"#;
    let head = format!(
        "POST {exec}?stream=true&encoding=base64 HTTP/1.1\r\nHost: sandtree\r\nConnection: close\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        req.len()
    );
    let write = move |w: &mut UnixStream| {
        let _ = w.write_all(req);
    };
    let (status, body) = exchange_slow(&d.socket, &head, write, Duration::from_millis(100));
    let (out, _, exit) = events(&body);
    assert_eq!((status, out.len(), exit["exit_code"].as_i64()), (200, 12 << 20, Some(0)), "read slowly");
    // … and refused clearly when malformed.
    for (req, needle) in [
        (json!({"cmd": ["cat"], "stdin": "x"}), "leave stdin and stdin_base64 out"),
        (json!({"cmd": ["cat"], "background": true}), "background process cannot take a streamed stdin"),
    ] {
        let (status, body) = streamed_exec(&d.socket, &sb, "", &req, b"data".to_vec());
        let v: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!((status, v["error"]["code"].as_str()), (400, Some("invalid_argument")), "{v}");
        assert!(v["error"]["message"].as_str().unwrap().contains(needle), "{v}");
    }
    let head = format!(
        "POST {exec} HTTP/1.1\r\nHost: sandtree\r\nConnection: close\r\nContent-Type: {STDIN_TYPE}\r\nContent-Length: 12\r\n\r\n"
    );
    let (status, body) = exchange(&d.socket, &head, |w| {
        let _ = w.write_all(br#"{"cmd":["a"]"#);
    });
    let v: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(status, 400, "{v}");
    assert!(v["error"]["message"].as_str().unwrap().contains("ended before the newline"), "{v}");

    // A body that breaks off kills the program: no truncated stdin passes for the whole.
    let head = format!(
        "POST {exec} HTTP/1.1\r\nHost: sandtree\r\nConnection: close\r\nContent-Type: {STDIN_TYPE}\r\nContent-Length: 1000000\r\n\r\n"
    );
    let (status, body) = exchange(&d.socket, &head, |w| {
        let _ = w.write_all(b"{\"cmd\":[\"sh\",\"-c\",\"cat > /tmp/part; echo whole > /tmp/flag\"]}\n");
        let _ = w.write_all(&[7u8; 1000]);
        std::thread::sleep(Duration::from_millis(300));
        let _ = w.shutdown(std::net::Shutdown::Write);
    });
    let v: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!((status, v["signal"].as_i64()), (200, Some(9)), "{v}");
    let (code, out) = d.sh(&sb, "wc -c < /tmp/part; cat /tmp/flag 2>/dev/null || echo killed");
    assert_eq!((code, out.as_str()), (0, "1000\nkilled\n"), "the program of a broken body");

    // A JSON body over the limit: 413 naming the limit and the way out.
    // (Sent whole before the answer is read: the daemon reads the body on.)
    let mut body = br#"{"cmd":["cat"],"stdin_base64":""#.to_vec();
    body.resize(body.len() + (65 << 20), b'A');
    body.extend_from_slice(b"\"}");
    let head = format!(
        "POST {exec} HTTP/1.1\r\nHost: sandtree\r\nConnection: close\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    let (status, body) = half_duplex(&d.socket, &head, &body);
    let v: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!((status, v["error"]["code"].as_str()), (413, Some("payload_too_large")), "{v}");
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(msg.contains("64 MiB") && msg.contains(STDIN_TYPE) && msg.contains("sandtree exec"), "{msg}");
}

#[test]
fn background_output_and_sessions_are_byte_exact() {
    if common::must_skip() {
        return;
    }
    let d = Daemon::start("io-bg");
    let sb = d.create();
    let data = random_bytes(300_000, 11);
    let put = json!({"cmd": ["sh", "-c", "cat > /tmp/r"], "stdin_base64": BASE64.encode(&data)});
    assert_eq!(d.ok("POST", &format!("/v1/sandboxes/{sb}/exec"), Some(put))["exit_code"], 0);

    // A background process's output: ?encoding=base64, and `sandtree logs`.
    let bg = json!({"cmd": ["sh", "-c", "cat /tmp/r; head -c 1000 /tmp/r >&2"], "background": true});
    let pid = d.ok("POST", &format!("/v1/sandboxes/{sb}/exec"), Some(bg))["pid"].as_i64().unwrap();
    let t = Instant::now();
    let v = loop {
        let v = d.ok("GET", &format!("/v1/sandboxes/{sb}/processes/{pid}?encoding=base64"), None);
        if v["process"]["running"] == false || t.elapsed() > Duration::from_secs(30) {
            break v;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(v["process"]["exit_code"], 0, "{}", v["process"]);
    assert!(b64(&v["stdout"]) == data, "background stdout");
    assert_eq!(b64(&v["stderr"]), data[..1000]);
    let out = Command::new(BIN)
        .args(["--socket", d.socket.to_str().unwrap(), "logs", &sb, &pid.to_string()])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.stdout == data, "sandtree logs: stdout");
    assert_eq!(out.stderr, data[..1000], "sandtree logs: stderr");

    // A session run: the bytes as written (no \r added), base64.
    let sid =
        d.ok("POST", &format!("/v1/sandboxes/{sb}/sessions"), Some(json!({})))["id"].as_str().unwrap().to_string();
    let run = format!("/v1/sandboxes/{sb}/sessions/{sid}/run");
    let v = d.ok("POST", &format!("{run}?encoding=base64"), Some(json!({"command": "cat /tmp/r"})));
    assert_eq!(v["exit_code"], 0);
    assert!(b64(&v["output"]) == data, "session run output");
    let v = d.ok("POST", &run, Some(json!({"command": "printf 'a\\r\\nb\\n'"})));
    assert_eq!(v["output"], "a\r\nb\n");
    // `sandtree shell -c` writes those bytes out.
    let out = Command::new(BIN)
        .args(["--socket", d.socket.to_str().unwrap(), "shell", &sb, "-c", "head -c 5000 /tmp/r"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(out.stdout, data[..5000], "sandtree shell -c");

    // The websocket attach: binary frames carry bytes exactly, both ways
    // (the terminal in raw mode, so that the tty itself changes nothing).
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let received = rt.block_on(attach_round_trip(&d.socket, &sb, &sid, &data[..4096]));
    assert!(received == data[..4096], "attach: output bytes");
    let v = d.ok("POST", &format!("{run}?encoding=base64"), Some(json!({"command": "cat /tmp/in"})));
    let got = b64(&v["output"]);
    let first_diff = got.iter().zip(&data[..4096]).position(|(a, b)| a != b);
    assert!(
        got == data[..4096],
        "attach: input bytes ({} B, first difference at {first_diff:?}: {:?} vs {:?})",
        got.len(),
        &got[first_diff.unwrap_or(0)..][..16.min(got.len())],
        &data[first_diff.unwrap_or(0)..][..16]
    );
}

/// Over the attach websocket: types 4096 bytes of `input` into `head -c
/// 4096 > /tmp/in` and reads `head -c 4096 /tmp/r` back; returns what came.
async fn attach_round_trip(socket: &Path, sb: &str, sid: &str, input: &[u8]) -> Vec<u8> {
    use futures_util::{SinkExt, StreamExt};
    use sandtree::cli::client::{Client, Endpoint};
    use tokio_tungstenite::tungstenite::Message;

    let client = Client::new(Endpoint::Unix(socket.to_path_buf()), None);
    let mut ws = client.websocket(&format!("/v1/sandboxes/{sb}/sessions/{sid}/attach")).await.unwrap();
    let mut seen = Vec::new();
    type Ws = tokio_tungstenite::WebSocketStream<sandtree::cli::client::Conn>;
    /// Reads frames into `seen` until it holds `mark`; returns where.
    async fn until(ws: &mut Ws, seen: &mut Vec<u8>, mark: &[u8]) -> usize {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(i) = seen.windows(mark.len()).position(|w| w == mark) {
                return i;
            }
            match tokio::time::timeout_at(deadline, ws.next()).await {
                Ok(Some(Ok(Message::Binary(b)))) => seen.extend_from_slice(&b),
                Ok(Some(Ok(_))) => {}
                other => panic!(
                    "no {:?} from the terminal: {other:?}; saw {:?}",
                    String::from_utf8_lossy(mark),
                    String::from_utf8_lossy(seen)
                ),
            }
        }
    }
    // The markers are typed as octal escapes so that the echo of the command does not contain them.
    let cmd = "stty raw -echo -iexten; printf '\\074IN\\076'; head -c 4096 > /tmp/in; printf '\\074OUT\\076'; \
               head -c 4096 /tmp/r; printf '\\074END\\076'; stty sane\n";
    ws.send(Message::Binary(cmd.as_bytes().to_vec().into())).await.unwrap();
    until(&mut ws, &mut seen, b"<IN>").await;
    for c in input.chunks(1000) {
        ws.send(Message::Binary(c.to_vec().into())).await.unwrap();
    }
    let start = until(&mut ws, &mut seen, b"<OUT>").await + 5;
    seen.drain(..start);
    let end = until(&mut ws, &mut seen, b"<END>").await;
    // Wait for the next prompt (the end of its marker), so that the shell is idle when we leave.
    let mut after = seen.split_off(end);
    until(&mut ws, &mut after, b"\x1b]6973;SE\x07").await;
    let _ = ws.close(None).await;
    seen
}

/// The daemon's resident memory in KiB (`VmRSS` or `VmHWM` of /proc/PID/status).
fn mem_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with(field)).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

#[test]
fn a_gib_of_stdin_streams_through_in_flat_daemon_memory() {
    if common::must_skip() {
        return;
    }
    let d = Daemon::start("io-gib");
    let sb = d.create();
    let pid = d.pid().unwrap();
    // Warm up (first exec, allocator pools), then reset the peak.
    let warm = scratch(&d, "warm", &random_bytes(8 << 20, 1));
    assert_eq!(cli_exec(&["--socket", d.socket.to_str().unwrap()], &sb, &["cksum"], &warm).0, 0);
    let base = mem_kib(pid, "VmRSS:");
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5").unwrap();
    let t = Instant::now();
    // 1 GiB of random bytes: into the sandbox's cksum (CRC and length,
    // cheap enough to keep the pipe the bottleneck) and the host's.
    let script = format!(
        "head -c 1G /dev/urandom | tee >(cksum > {dir}/host.sum) | {BIN} --socket {sock} exec {sb} -- cksum > {dir}/sandbox.sum; wait",
        dir = d.dir.display(),
        sock = d.socket.display(),
    );
    let mut peak = base;
    let mut child = Command::new("bash").args(["-c", &script]).spawn().unwrap();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        peak = peak.max(mem_kib(pid, "VmRSS:"));
        std::thread::sleep(Duration::from_millis(20));
    };
    let elapsed = t.elapsed();
    assert!(status.success());
    std::thread::sleep(Duration::from_millis(200)); // `>(cksum …)` may finish after the pipeline
    let host = std::fs::read_to_string(d.dir.join("host.sum")).unwrap();
    let inside = std::fs::read_to_string(d.dir.join("sandbox.sum")).unwrap();
    assert_eq!(inside.trim(), host.trim(), "cksum (CRC, length) inside vs on the host");
    assert!(host.contains(" 1073741824"), "{host}");
    let hwm = mem_kib(pid, "VmHWM:").max(peak);
    eprintln!("1 GiB in {elapsed:?}; daemon RSS {base} KiB before, peak {hwm} KiB");
    assert!(hwm < base + (64 << 10), "the daemon grew from {base} KiB to {hwm} KiB while 1 GiB streamed through");
}

/// `sandtree exec -n` leaves the caller's stdin alone, as `ssh -n` does: a
/// `while read` loop keeps its input.
#[test]
fn no_stdin_leaves_a_read_loop_its_input() {
    if common::must_skip() {
        return;
    }
    let d = Daemon::start("io-nostdin");
    let sb = d.create();
    let run = |flag: &str| {
        let script = format!(
            "printf 'a\\nb\\nc\\n' | while read l; do {BIN} --socket {} exec {flag} {sb} -- echo \"got $l\"; done",
            d.socket.display()
        );
        let out = Command::new("sh").arg("-c").arg(&script).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    };
    assert_eq!(run("-n"), "got a\ngot b\ngot c\n");
    // (Without it the first exec takes the loop's input, as `ssh` would.)
    assert_eq!(run(""), "got a\n");
}

/// `sandtree --json exec` with a piped stdin keeps at most 1 MiB of each
/// stream, as a buffered answer does, and says what it cut.
#[test]
fn json_exec_with_stdin_keeps_a_bounded_output() {
    if common::must_skip() {
        return;
    }
    let d = Daemon::start("io-jsoncap");
    let sb = d.create();
    let input = scratch(&d, "zeros", &vec![b'z'; 3 << 20]);
    let out = Command::new(BIN)
        .arg("--socket")
        .arg(&d.socket)
        .args(["--json", "exec", &sb, "--", "cat"])
        .stdin(std::fs::File::open(&input).unwrap())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["stdout"].as_str().map(str::len), Some(1 << 20), "kept");
    assert_eq!((v["stdout_truncated"].as_bool(), v["stderr_truncated"].as_bool()), (Some(true), Some(false)));
}
