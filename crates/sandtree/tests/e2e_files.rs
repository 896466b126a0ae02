//! End-to-end: the files API (`/v1/sandboxes/{id}/files…`) reads and writes
//! a sandbox's files byte for byte, as the sandbox sees them (owners in its
//! numbering, relative paths from the user's home), never out of it
//! (symlinks, `..` and `/proc` magic links stay inside), wholly before or
//! after a checkpoint (an upload in flight is not half in it), and says
//! clearly what is wrong with bad input.

mod common;

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use common::{Daemon, half_duplex, parse_response, random_bytes, sha256};
use serde_json::{Value, json};

/// `path` percent-encoded for a query.
fn q(path: &str) -> String {
    path.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'/' | b'.' | b'-' | b'_' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

fn put(d: &Daemon, sb: &str, query: &str, data: &[u8]) -> (u16, Value) {
    let head = format!(
        "PUT /v1/sandboxes/{sb}/files?{query} HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        data.len()
    );
    let (status, body) = half_duplex(&d.socket, &head, data);
    (status, serde_json::from_slice(&body).unwrap_or(Value::Null))
}

fn get(d: &Daemon, sb: &str, path: &str) -> (u16, Vec<u8>) {
    let head =
        format!("GET /v1/sandboxes/{sb}/files?path={} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", q(path));
    half_duplex(&d.socket, &head, b"")
}

fn read_ok(d: &Daemon, sb: &str, path: &str) -> Vec<u8> {
    let (status, body) = get(d, sb, path);
    assert_eq!(status, 200, "read {path}: {}", String::from_utf8_lossy(&body));
    body
}

fn error_code(v: &Value) -> &str {
    v["error"]["code"].as_str().unwrap_or_default()
}

#[test]
fn files_pass_byte_for_byte_with_the_sandboxs_owners() {
    if common::must_skip() {
        return;
    }
    let d = Daemon::start("files-bytes");
    let sb = d.create();
    for (n, name) in [(0usize, "empty"), (1, "one"), (5 << 20, "five-mib")] {
        let data = random_bytes(n, n as u64 + 7);
        let (status, info) = put(&d, &sb, &format!("path=/root/data/{name}.bin"), &data);
        assert_eq!(status, 200, "{info}");
        assert_eq!(info["size"], n as u64);
        assert_eq!(info["kind"], "file");
        assert_eq!(read_ok(&d, &sb, &format!("/root/data/{name}.bin")), data, "{name}");
        // The sandbox's own programs see the same bytes.
        let inside = d.sh_ok(&sb, &format!("sha256sum < /root/data/{name}.bin"));
        assert_eq!(
            inside.split_whitespace().next(),
            Some(sha256(&data).as_str()),
            "{name}: the sandbox reads other bytes"
        );
    }
    // Relative paths start at the user's home; a mode and an owner are the sandbox's.
    d.sh_ok(&sb, "useradd -m -u 1234 alice");
    let (status, info) = put(&d, &sb, "path=notes.txt&user=alice&mode=600", b"hi");
    assert_eq!(status, 200, "{info}");
    assert_eq!(info["path"], "/home/alice/notes.txt");
    assert_eq!((info["uid"].as_u64(), info["mode"].as_str()), (Some(1234), Some("600")));
    // (Named as the sandbox's /etc/passwd and /etc/group name them.)
    assert_eq!((info["owner"].as_str(), info["group"].as_str()), (Some("alice"), Some("alice")), "{info}");
    assert_eq!(d.sh_ok(&sb, "stat -c '%U %a' /home/alice/notes.txt").trim(), "alice 600");
    // A file replaced keeps its owner and mode.
    let (status, info) = put(&d, &sb, "path=/home/alice/notes.txt", b"hello again");
    assert_eq!(status, 200, "{info}");
    assert_eq!(d.sh_ok(&sb, "stat -c '%U %a %s' /home/alice/notes.txt").trim(), "alice 600 11");
    // A file the sandbox wrote reads back as it wrote it.
    d.sh_ok(&sb, "printf 'from inside' > /tmp/inside.txt");
    assert_eq!(read_ok(&d, &sb, "/tmp/inside.txt"), b"from inside");
    // A stopped sandbox is started for a read, as for an exec.
    d.ok("POST", &format!("/v1/sandboxes/{sb}/stop"), None);
    assert_eq!(read_ok(&d, &sb, "/tmp/inside.txt"), b"from inside");
}

#[test]
fn paths_never_leave_the_sandbox() {
    if common::must_skip() {
        return;
    }
    let d = Daemon::start("files-escape");
    let sb = d.create();
    let marker = format!("/var/tmp/sandtree-escape-{}", std::process::id());
    let _ = std::fs::remove_dir_all(&marker);
    std::fs::create_dir_all(&marker).unwrap();
    std::fs::write(format!("{marker}/secret"), "host secret").unwrap();
    d.sh_ok(
        &sb,
        &format!(
            "mkdir -p /root/w {marker} && ln -s {marker} /root/w/abs && ln -s ../../../../../..{marker} /root/w/rel \
             && ln -s /proc/self/root{marker} /root/w/magic && echo inside > /root/w/plain"
        ),
    );
    // Through an absolute, a relative and a /proc link: never the host's file.
    for path in
        ["/root/w/abs/secret", "/root/w/rel/secret", "/root/w/magic/secret", &format!("/../../..{marker}/secret")]
    {
        let (status, body) = get(&d, &sb, path);
        assert!(status != 200 && !body.windows(4).any(|w| w == b"host"), "{path}: {status} {body:?}");
    }
    for path in ["/root/w/abs/planted", "/root/w/rel/planted", "/root/w/magic/planted"] {
        put(&d, &sb, &format!("path={}", q(path)), b"planted");
        assert!(!std::path::Path::new(&format!("{marker}/planted")).exists(), "{path} wrote on the host");
    }
    // An absolute link resolves in the sandbox: what it wrote is the sandbox's.
    assert_eq!(d.sh_ok(&sb, &format!("cat {marker}/planted")).trim(), "planted");
    // Removing through a link removes the link, never what it points to.
    let (status, _) = d.req("DELETE", &format!("/v1/sandboxes/{sb}/files?path=/root/w/abs&recursive=true"), None);
    assert_eq!(status, 204);
    assert!(std::path::Path::new(&format!("{marker}/secret")).exists());
    assert_eq!(d.sh_ok(&sb, &format!("cat {marker}/planted")).trim(), "planted");
    std::fs::remove_dir_all(&marker).unwrap();
}

#[test]
fn listing_making_moving_and_removing_say_what_is_wrong() {
    if common::must_skip() {
        return;
    }
    let d = Daemon::start("files-verbs");
    let sb = d.create();
    let base = format!("/v1/sandboxes/{sb}/files");
    let made = d.ok("POST", &format!("{base}/mkdir"), Some(json!({"path": "/srv/app/static", "mode": "750"})));
    assert_eq!((made["kind"].as_str(), made["mode"].as_str()), (Some("dir"), Some("750")));
    put(&d, &sb, "path=/srv/app/main.py", b"print(1)\n");
    put(&d, &sb, "path=/srv/app/static/index.html", b"<p>");
    let list = d.ok("GET", &format!("{base}/list?path=/srv&depth=3"), None);
    let paths: Vec<&str> = list["entries"].as_array().unwrap().iter().map(|e| e["path"].as_str().unwrap()).collect();
    assert_eq!(paths, ["/srv/app", "/srv/app/main.py", "/srv/app/static", "/srv/app/static/index.html"]);
    let one = d.ok("GET", &format!("{base}/list?path=/srv"), None);
    assert_eq!(one["entries"].as_array().unwrap().len(), 1);
    // mkdir without parents of an existing path; a move onto an existing file.
    let (status, v) = d.req("POST", &format!("{base}/mkdir"), Some(json!({"path": "/srv/app", "parents": false})));
    assert_eq!((status, error_code(&v)), (409, "already_exists"), "{v}");
    put(&d, &sb, "path=/srv/app/other.py", b"print(2)\n");
    let (status, v) =
        d.req("POST", &format!("{base}/move"), Some(json!({"from": "/srv/app/other.py", "to": "/srv/app/main.py"})));
    assert_eq!((status, error_code(&v)), (409, "already_exists"), "{v}");
    assert!(v["error"]["message"].as_str().unwrap().contains("overwrite"), "{v}");
    let moved = d.ok(
        "POST",
        &format!("{base}/move"),
        Some(json!({"from": "/srv/app/other.py", "to": "/srv/app/main.py", "overwrite": true})),
    );
    assert_eq!(moved["size"], 9);
    assert_eq!(read_ok(&d, &sb, "/srv/app/main.py"), b"print(2)\n");
    // Stat, and what is not there.
    let st = d.ok("GET", &format!("{base}/stat?path=/srv/app/main.py"), None);
    assert_eq!((st["name"].as_str(), st["uid"].as_u64()), (Some("main.py"), Some(0)));
    assert_eq!(st["owner"], "root", "{st}");
    // The default image's account for programs that should not run as
    // root: E2B's `user`, with its home.
    let home = d.ok("GET", &format!("{base}/stat?path=/home/user"), None);
    assert_eq!(
        (home["owner"].as_str(), home["group"].as_str(), home["mode"].as_str()),
        (Some("user"), Some("user"), Some("750")),
        "{home}"
    );
    let (status, v) = d.req("GET", &format!("{base}/stat?path=/srv/nope"), None);
    assert_eq!((status, error_code(&v)), (404, "file_not_found"), "{v}");
    assert!(v["error"]["message"].as_str().unwrap().contains("/srv/nope"), "{v}");
    let (status, body) = get(&d, &sb, "/srv");
    assert_eq!(status, 400, "reading a directory: {}", String::from_utf8_lossy(&body));
    let (status, v) = d.req("GET", "/v1/sandboxes/sb-nope/files/stat?path=/", None);
    assert_eq!((status, error_code(&v)), (404, "sandbox_not_found"), "{v}");
    let (status, v) = put(&d, &sb, "path=/srv/x&mode=999", b"");
    assert_eq!((status, error_code(&v)), (400, "invalid_argument"), "{v}");
    // Removing: a non-empty directory needs recursive; the root never goes.
    let (status, v) = d.req("DELETE", &format!("{base}?path=/srv/app"), None);
    assert_eq!((status, error_code(&v)), (400, "invalid_argument"), "{v}");
    assert!(v["error"]["message"].as_str().unwrap().contains("recursive"), "{v}");
    let (status, _) = d.req("DELETE", &format!("{base}?path=/srv/app&recursive=true"), None);
    assert_eq!(status, 204);
    assert_eq!(d.sh_ok(&sb, "ls -A /srv | wc -l").trim(), "0");
    let (status, v) = d.req("DELETE", &format!("{base}?path=/&recursive=true"), None);
    assert_eq!((status, error_code(&v)), (400, "invalid_argument"), "{v}");
}

#[test]
fn a_write_is_wholly_before_or_after_a_checkpoint() {
    if common::must_skip() {
        return;
    }
    let d = Daemon::start("files-checkpoint");
    let sb = d.create();
    put(&d, &sb, "path=/root/state.txt", b"version 1");
    let ck1 = d.checkpoint(&sb, "v1");
    put(&d, &sb, "path=/root/state.txt", b"version 2");
    d.rollback(&sb, &ck1);
    assert_eq!(read_ok(&d, &sb, "/root/state.txt"), b"version 1");

    // An upload in flight while a checkpoint is taken: the checkpoint has
    // the old file, whole; the upload lands whole after it.
    let new = random_bytes(4 << 20, 3);
    let head = format!(
        "PUT /v1/sandboxes/{sb}/files?path=/root/state.txt HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        new.len()
    );
    let mut s = UnixStream::connect(&d.socket).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    s.write_all(head.as_bytes()).unwrap();
    s.write_all(&new[..new.len() / 2]).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let ck2 = d.checkpoint(&sb, "during the upload");
    s.write_all(&new[new.len() / 2..]).unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap();
    let (status, body) = parse_response(&raw);
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    assert_eq!(read_ok(&d, &sb, "/root/state.txt"), new);
    d.rollback(&sb, &ck2);
    assert_eq!(read_ok(&d, &sb, "/root/state.txt"), b"version 1", "the checkpoint holds the file as before the upload");
    assert_eq!(d.sh_ok(&sb, "ls -A /root | grep -c sandtree-write || true").trim(), "0", "no temporary file left");
}
