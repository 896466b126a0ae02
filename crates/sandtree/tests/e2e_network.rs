//! Sandboxes' networks, end to end: egress through the host's NAT, DNS,
//! the policy (addresses and names), isolation from the host, the daemon
//! and other sandboxes, a sandbox's root unable to change its policy, and
//! networks across rollback and fork.
//!
//! Traffic goes only to addresses on this machine: each test makes its own
//! "internet", a network namespace linked to the host (198.18.0.0/15, the
//! benchmarking range) with a TCP server that answers the address it sees
//! a connection come from, and a DNS server that knows `peer.test`.

mod common;

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::os::fd::AsFd;

use common::*;
use sandtree_net::peer::{HTTP_PORT, Peer};
use sandtree_sys::netlink::in_netns;
use serde_json::{Value, json};

/// The test's outside world (see `sandtree_net::peer`).
struct Internet {
    host: Ipv4Addr,
    peer: Ipv4Addr,
    p: Peer,
}

const PORT: u16 = HTTP_PORT;

impl Internet {
    fn new() -> Internet {
        let p = Peer::new().expect("a peer namespace");
        Internet { host: p.host, peer: p.peer, p }
    }

    /// Connections of the peer's echo server that ended in a reset.
    fn resets(&self) -> u32 {
        self.p.echo_resets.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Daemon flags: its resolver is the peer's.
    fn daemon_args(&self) -> Vec<String> {
        vec!["--image-size".into(), "4G".into(), "--dns".into(), format!("{}:53", self.peer)]
    }
}

fn start(name: &str, net: &Internet) -> Daemon {
    let args = net.daemon_args();
    Daemon::start_with(name, &args.iter().map(String::as_str).collect::<Vec<_>>())
}

fn create_with(d: &Daemon, network: Value) -> String {
    d.ok("POST", "/v1/sandboxes", Some(json!({ "network": network })))["sandbox"]["id"].as_str().unwrap().to_string()
}

/// `curl` of the peer's server from `sb`: its answer, or `Err(exit code)`.
fn fetch(d: &Daemon, sb: &str, url: &str) -> Result<String, i64> {
    let (code, out) = d.sh(sb, &format!("curl -sS --max-time 3 {url} 2>&1"));
    if code == 0 { Ok(out) } else { Err(code) }
}

/// The network info of `sb`.
fn network(d: &Daemon, sb: &str) -> Value {
    d.ok("GET", &format!("/v1/sandboxes/{sb}/network"), None)
}

/// Forks `n` sandboxes of `ck`; their ids.
fn forks(d: &Daemon, ck: &str, n: u32) -> Vec<String> {
    let v = d.ok("POST", &format!("/v1/checkpoints/{ck}/fork"), Some(json!({"count": n})));
    v["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["sandbox"]["id"].as_str().unwrap_or_else(|| panic!("a fork failed: {r}")).to_string())
        .collect()
}

fn set_policy(d: &Daemon, sb: &str, allow: &[&str], deny: &[&str]) -> (u16, Value) {
    d.req("PUT", &format!("/v1/sandboxes/{sb}/network"), Some(json!({"allow": allow, "deny": deny})))
}

#[test]
fn a_sandbox_reaches_the_outside_through_nat_and_resolves_names() {
    if must_skip() {
        return;
    }
    let net = Internet::new();
    let d = start("net-egress", &net);
    let sb = d.create();
    let info = network(&d, &sb);
    assert_eq!(info["mode"], "egress", "{info}");
    assert_eq!(info["address"], "10.0.2.15");
    // Its own interface, address and route, as the sandbox sees them.
    let routes = d.sh_ok(&sb, "cat /proc/net/route");
    assert!(routes.lines().any(|l| l.starts_with("eth0\t00000000\t0202000A")), "{routes}");
    assert_eq!(d.sh_ok(&sb, "cat /etc/resolv.conf"), "nameserver 10.0.2.2\n");

    // By address: the peer sees the host's address (masqueraded).
    let got = fetch(&d, &sb, &format!("http://{}:{PORT}/", net.peer)).expect("egress by address");
    assert!(got.starts_with(&format!("from {}:", net.host)), "{got}");
    // By name, through the sandbox's DNS server and the host's resolver.
    let hosts = d.sh_ok(&sb, "getent hosts peer.test");
    assert!(hosts.starts_with(&net.peer.to_string()), "{hosts}");
    let got = fetch(&d, &sb, &format!("http://www.peer.test:{PORT}/")).expect("egress by name");
    assert!(got.starts_with("from "), "{got}");
    // Over TCP too (for long answers): a query for peer.test, by hand.
    let tcp_query = "import socket, struct\n\
        q = b'\\x12\\x34\\x01\\x00\\x00\\x01' + bytes(6) + b'\\x04peer\\x04test\\x00\\x00\\x01\\x00\\x01'\n\
        s = socket.create_connection(('10.0.2.2', 53))\n\
        s.sendall(struct.pack('>H', len(q)) + q)\n\
        n = struct.unpack('>H', s.recv(2))[0]\n\
        a = b''\n\
        while len(a) < n: a += s.recv(n - len(a))\n\
        print(socket.inet_ntoa(a[-4:]), a[3] & 15)\n";
    let (code, out) = d.sh(&sb, &format!("python3 -c \"{tcp_query}\""));
    assert_eq!((code, out.trim()), (0, format!("{} 0", net.peer).as_str()), "DNS over TCP");
    // A resolver the sandbox names itself is the sandbox's DNS server too
    // (queries to port 53 anywhere go to it).
    let (code, out) = d.sh(&sb, "echo 'nameserver 192.0.2.53' > /etc/resolv.conf && getent hosts peer.test");
    assert_eq!(code, 0, "{out}");
    // Bytes are counted.
    let info = network(&d, &sb);
    assert!(info["rx_bytes"].as_u64().unwrap() > 0 && info["tx_bytes"].as_u64().unwrap() > 0, "{info}");

    // `none`: loopback alone.
    let alone = create_with(&d, json!({"mode": "none"}));
    assert_eq!(network(&d, &alone)["mode"], "none");
    assert!(!d.sh_ok(&alone, "cat /proc/net/dev").contains("eth0"));
    assert!(fetch(&d, &alone, &format!("http://{}:{PORT}/", net.peer)).is_err());
}

#[test]
fn the_policy_allows_and_denies_addresses_and_names_and_changes_on_a_running_sandbox() {
    if must_skip() {
        return;
    }
    let net = Internet::new();
    let d = start("net-policy", &net);
    let url = format!("http://{}:{PORT}/", net.peer);
    let peer_cidr = format!("{}/30", Ipv4Addr::from(u32::from(net.peer) - 2));

    // Denied at create: refused at once (not a timeout).
    let sb = create_with(&d, json!({"deny": [peer_cidr]}));
    let t = std::time::Instant::now();
    assert!(fetch(&d, &sb, &url).is_err(), "a denied network was reached");
    assert!(t.elapsed() < std::time::Duration::from_secs(2), "refusal took {:?}", t.elapsed());

    // Changed on the running sandbox: reached.
    let (status, v) = set_policy(&d, &sb, &[], &[]);
    assert_eq!(status, 200, "{v}");
    fetch(&d, &sb, &url).expect("allowed after the policy changed");

    // Deny everything but one name: the name resolves and is reached (its
    // address let through); other names do not resolve; an address not
    // allowed is refused.
    let (status, v) = set_policy(&d, &sb, &["*.peer.test"], &["0.0.0.0/0"]);
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["deny"], json!(["0.0.0.0/0"]));
    fetch(&d, &sb, &format!("http://api.peer.test:{PORT}/")).expect("an allowed name");
    let (code, _) = d.sh(&sb, "getent hosts peer.test");
    assert_ne!(code, 0, "peer.test is not under *.peer.test, and nothing else is allowed");
    let (status, _) = set_policy(&d, &sb, &[], &["0.0.0.0/0"]);
    assert_eq!(status, 200);
    assert!(fetch(&d, &sb, &url).is_err(), "everything is denied");

    // A denied name does not resolve; others do.
    set_policy(&d, &sb, &[], &["api.peer.test"]);
    assert_ne!(d.sh(&sb, "getent hosts api.peer.test").0, 0);
    assert_eq!(d.sh(&sb, "getent hosts www.peer.test").0, 0);

    // The policy outlives a stop and start, and a fork inherits it.
    set_policy(&d, &sb, &[], &[&peer_cidr]);
    d.ok("POST", &format!("/v1/sandboxes/{sb}/stop"), None);
    d.ok("POST", &format!("/v1/sandboxes/{sb}/start"), None);
    assert!(fetch(&d, &sb, &url).is_err(), "the policy was lost in a restart");
    let ck = d.checkpoint(&sb, "denied");
    let fork = forks(&d, &ck, 1).remove(0);
    assert_eq!(network(&d, &fork)["deny"], json!([peer_cidr]));
    assert!(fetch(&d, &fork, &url).is_err(), "the fork lost its policy");
}

#[test]
fn malformed_policies_are_refused_whole_with_the_reason() {
    if must_skip() {
        return;
    }
    let net = Internet::new();
    let d = start("net-bad", &net);
    let sb = d.create();
    for (allow, deny, why) in [
        (json!(["10.0.0.0/33"]), json!([]), "prefix"),
        (json!(["10.0.0.1/8"]), json!([]), "host bits"),
        (json!([""]), json!([]), "empty"),
        (json!(["a..b"]), json!([]), "domain"),
        (json!(["pypi.org"]), json!(["PyPI.org"]), "both allow and deny"),
        (json!(["1.2.3.4", "1.2.3.4/32"]), json!([]), "twice"),
        (json!(["2001:db8::/32"]), json!([]), "IPv6"),
    ] {
        let (status, v) =
            d.req("PUT", &format!("/v1/sandboxes/{sb}/network"), Some(json!({"allow": allow, "deny": deny})));
        assert_eq!(status, 400, "{allow} {deny}: {v}");
        assert_eq!(v["error"]["code"], "invalid_argument");
        assert!(v["error"]["message"].as_str().unwrap().contains(why), "{why}: {v}");
        let (status, v) = d.req("POST", "/v1/sandboxes", Some(json!({"network": {"allow": allow, "deny": deny}})));
        assert_eq!(status, 400, "create {allow} {deny}: {v}");
    }
    // Nothing was changed by the refusals.
    assert_eq!(network(&d, &sb)["allow"], json!([]));
    let (status, v) = d.req("POST", "/v1/sandboxes", Some(json!({"network": {"mode": "none", "deny": ["0.0.0.0/0"]}})));
    assert_eq!(status, 400, "{v}");
    let (status, v) = d.req("POST", "/v1/sandboxes", Some(json!({"network": {"mode": "bridged"}})));
    assert_eq!(status, 400, "{v}");
    let none = create_with(&d, json!({"mode": "none"}));
    let (status, v) = set_policy(&d, &none, &["1.2.3.4"], &[]);
    assert_eq!(status, 400, "{v}");
    assert!(v["error"]["message"].as_str().unwrap().contains("no network"), "{v}");
    let (status, _) = set_policy(&d, "sb-nope", &[], &[]);
    assert_eq!(status, 404);
}

#[test]
fn a_sandbox_reaches_neither_the_host_nor_the_daemon_nor_another_sandbox() {
    if must_skip() {
        return;
    }
    let net = Internet::new();
    let mut args = net.daemon_args();
    let api = TcpListener::bind("0.0.0.0:0").unwrap();
    let api_port = api.local_addr().unwrap().port();
    drop(api);
    args.extend(["--tcp".into(), format!("0.0.0.0:{api_port}")]);
    let d = Daemon::start_with("net-isolation", &args.iter().map(String::as_str).collect::<Vec<_>>());
    // A service of the host's, on every address.
    let host_service = TcpListener::bind("0.0.0.0:0").unwrap();
    let host_port = host_service.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for mut c in host_service.incoming().flatten() {
            let mut buf = [0u8; 1024];
            let _ = c.set_read_timeout(Some(std::time::Duration::from_millis(500)));
            let _ = c.read(&mut buf);
            let _ = c.write_all(b"HTTP/1.0 200 OK\r\n\r\nhost\n");
        }
    });
    let a = d.create();
    let b = d.create();
    // b serves on its own address.
    d.ok(
        "POST",
        &format!("/v1/sandboxes/{b}/exec"),
        Some(json!({"cmd": ["python3", "-m", "http.server", "8000"], "background": true})),
    );
    d.sh_ok(
        &b,
        "for i in $(seq 50); do curl -s -o /dev/null http://127.0.0.1:8000/ && exit 0; sleep 0.1; done; exit 1",
    );
    let b_out = network(&d, &b)["outward_address"].as_str().unwrap().to_string();
    let router_host = {
        let o: Ipv4Addr = network(&d, &a)["outward_address"].as_str().unwrap().parse().unwrap();
        Ipv4Addr::from(u32::from(o) - 1)
    };
    for target in [
        format!("http://{}:{host_port}/", net.host),
        format!("http://{router_host}:{host_port}/"),
        format!("http://{}:{api_port}/v1/info", net.host),
        format!("http://{b_out}:8000/"),
        format!("http://10.0.2.2:{host_port}/"),
    ] {
        assert!(fetch(&d, &a, &target).is_err(), "{target} was reachable from a sandbox");
    }
    // (The peer is reachable: the refusals above are the policy's.)
    fetch(&d, &a, &format!("http://{}:{PORT}/", net.peer)).expect("the outside");
}

#[test]
fn a_sandboxs_root_cannot_change_its_policy_from_inside() {
    if must_skip() {
        return;
    }
    let net = Internet::new();
    let d = start("net-inside", &net);
    let url = format!("http://{}:{PORT}/", net.peer);
    let sb = create_with(&d, json!({"deny": [format!("{}", net.peer)]}));
    assert!(fetch(&d, &sb, &url).is_err());
    // Its own firewall, routes and addresses are its own: none is the policy.
    let script = "nft flush ruleset; nft add table ip mine; \
                  ip route replace default via 10.0.2.2 dev eth0; \
                  ip addr add 10.0.2.99/24 dev eth0; true";
    d.sh_ok(&sb, script);
    assert!(fetch(&d, &sb, &url).is_err(), "the sandbox lifted its own policy");
    // A spoofed source address gets nowhere either.
    let (code, _) = d.sh(&sb, &format!("curl -sS --max-time 2 --interface 10.0.2.99 http://{}:{PORT}/", net.host));
    assert_ne!(code, 0);
    // The policy is visible only from outside: the sandbox sees no rules of it.
    let rules = d.sh_ok(&sb, "nft list ruleset");
    assert!(!rules.contains(&net.peer.to_string()), "{rules}");
    // (Metadata-style addresses are denied by default: read in the
    // router's rules, never tried.)
    let out: Ipv4Addr = network(&d, &sb)["outward_address"].as_str().unwrap().parse().unwrap();
    let slot = (u32::from(out) - u32::from(Ipv4Addr::new(10, 213, 0, 0))) / 4;
    let mount = d.dir.join(format!("run/net/stree{slot}"));
    let ns = std::fs::File::open(&mount).unwrap();
    let ruleset = in_netns(ns.as_fd(), || {
        let o = std::process::Command::new("nft").args(["list", "set", "ip", "sandtree", "deny"]).output()?;
        Ok(String::from_utf8_lossy(&o.stdout).into_owned())
    })
    .unwrap();
    assert!(ruleset.contains("169.254.0.0/16"), "{ruleset}");
    assert!(ruleset.contains(&net.peer.to_string()), "{ruleset}");
}

#[test]
fn rollback_keeps_a_server_serving_and_forks_connect_out_side_by_side_from_their_own_addresses() {
    if must_skip() {
        return;
    }
    let net = Internet::new();
    let d = start("net-fork", &net);
    let sb = d.create();
    d.ok(
        "POST",
        &format!("/v1/sandboxes/{sb}/exec"),
        Some(json!({"cmd": ["python3", "-m", "http.server", "8000", "--bind", "10.0.2.15"], "background": true})),
    );
    let probe = "for i in $(seq 50); do curl -s -o /dev/null http://10.0.2.15:8000/ && exit 0; sleep 0.1; done; exit 1";
    d.sh_ok(&sb, probe);
    let ck = d.checkpoint(&sb, "serving");
    d.sh_ok(&sb, "pkill -f 'http[.]server'; true");
    d.rollback(&sb, &ck);
    d.sh_ok(&sb, "curl -sS --max-time 3 -o /dev/null http://10.0.2.15:8000/");
    fetch(&d, &sb, &format!("http://{}:{PORT}/", net.peer)).expect("egress after a rollback");

    // 16 forks: each serves on the same inside address, each has its own
    // outward address, and all connect out at once.
    let forks = forks(&d, &ck, 16);
    assert_eq!(forks.len(), 16);
    let outward: std::collections::BTreeSet<String> =
        forks.iter().map(|f| network(&d, f)["outward_address"].as_str().unwrap().to_string()).collect();
    assert_eq!(outward.len(), 16, "forks share outward addresses: {outward:?}");
    let seen: Vec<String> = std::thread::scope(|s| {
        let handles: Vec<_> = forks
            .iter()
            .map(|f| {
                let d = &d;
                s.spawn(move || {
                    d.sh_ok(f, "curl -sS --max-time 3 -o /dev/null http://10.0.2.15:8000/");
                    fetch(d, f, &format!("http://{}:{PORT}/", net.peer)).expect("a fork's egress")
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let sources: std::collections::BTreeSet<SocketAddr> =
        seen.iter().map(|s| s.trim().trim_start_matches("from ").parse().unwrap()).collect();
    assert_eq!(sources.len(), 16, "{seen:?}");
}

/// `GET /` of an HTTP server at `addr`; its status line.
fn http_get(addr: &str) -> std::io::Result<String> {
    let mut c = std::net::TcpStream::connect(addr)?;
    c.set_read_timeout(Some(std::time::Duration::from_secs(5)))?;
    c.write_all(b"GET / HTTP/1.0\r\nHost: x\r\n\r\n")?;
    let mut out = String::new();
    c.read_to_string(&mut out)?;
    Ok(out.lines().next().unwrap_or("").to_string())
}

#[test]
fn a_port_inside_is_reachable_from_the_host_and_through_the_api_with_its_token() {
    if must_skip() {
        return;
    }
    let net = Internet::new();
    let api = TcpListener::bind("127.0.0.1:0").unwrap();
    let api_port = api.local_addr().unwrap().port();
    drop(api);
    let mut args = net.daemon_args();
    args.extend(["--tcp".into(), format!("127.0.0.1:{api_port}")]);
    let d = Daemon::start_with("net-ports", &args.iter().map(String::as_str).collect::<Vec<_>>());
    let serve = |sb: &str, args: &[&str], url: &str| {
        let mut cmd = vec!["python3", "-m", "http.server"];
        cmd.extend_from_slice(args);
        d.ok("POST", &format!("/v1/sandboxes/{sb}/exec"), Some(json!({"cmd": cmd, "background": true})));
        d.sh_ok(sb, &format!("for i in $(seq 50); do curl -s -o /dev/null {url} && exit 0; sleep 0.1; done; exit 1"));
    };
    let sb = d.create();
    serve(&sb, &["8000"], "http://127.0.0.1:8000/");
    serve(&sb, &["8001", "--bind", "10.0.2.15"], "http://10.0.2.15:8001/");
    let alone = create_with(&d, json!({"mode": "none"}));
    serve(&alone, &["8002", "--bind", "127.0.0.1"], "http://127.0.0.1:8002/");

    // Exposed on the host's loopback: any-address, own-address and
    // loopback-only servers, with a network or without.
    let expose = |sb: &str, port: u16| -> String {
        let v = d.ok("POST", &format!("/v1/sandboxes/{sb}/ports"), Some(json!({"port": port})));
        assert!(v["address"].as_str().unwrap().starts_with("127.0.0.1:"), "{v}");
        v["address"].as_str().unwrap().to_string()
    };
    let a8000 = expose(&sb, 8000);
    assert_eq!(expose(&sb, 8000), a8000, "exposing again answers the same address");
    assert_eq!(http_get(&a8000).unwrap(), "HTTP/1.0 200 OK");
    assert_eq!(http_get(&expose(&sb, 8001)).unwrap(), "HTTP/1.0 200 OK");
    assert_eq!(http_get(&expose(&alone, 8002)).unwrap(), "HTTP/1.0 200 OK");
    let list = d.ok("GET", &format!("/v1/sandboxes/{sb}/ports"), None);
    assert_eq!(list["ports"].as_array().unwrap().len(), 2, "{list}");
    assert!(list["ports"][0]["connections"].as_u64().unwrap() >= 1, "{list}");

    // It keeps serving across a rollback (the server is restored). A
    // connection held open through it comes from the sandbox's router: the
    // checkpoint takes it as one to the outside, the rollback resets it.
    let mut held = std::net::TcpStream::connect(&a8000).unwrap();
    d.sh_ok(&sb, "for i in $(seq 50); do grep -q ':1F40 0202000A' /proc/net/tcp && exit 0; sleep 0.05; done; exit 1");
    let ck = d.checkpoint(&sb, "serving");
    d.sh_ok(&sb, "pkill -f 'http[.]server 8000'; true");
    let r = d.rollback(&sb, &ck);
    assert!(r["connections_reset"].to_string().contains("10.0.2.2"), "{r}");
    held.set_read_timeout(Some(std::time::Duration::from_secs(5))).unwrap();
    assert!(matches!(held.read(&mut [0u8; 16]), Ok(0) | Err(_)), "the held connection outlived the rollback");
    assert_eq!(http_get(&a8000).unwrap(), "HTTP/1.0 200 OK");

    // Through the API: a local port served by `sandtree port --listen`,
    // over TCP with the token; without it, refused.
    let token = std::fs::read_to_string(d.dir.join("token")).unwrap().trim().to_string();
    let local = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let url = format!("http://127.0.0.1:{api_port}");
    let mut tunnel = std::process::Command::new(BIN)
        .args(["--url", &url, "--token", &token, "port", &sb, "8000", "--listen", &local.to_string()])
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut got = Err(std::io::Error::other("not tried"));
    for _ in 0..50 {
        got = http_get(&local.to_string());
        if got.is_ok() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let _ = tunnel.kill();
    let _ = tunnel.wait();
    assert_eq!(got.unwrap(), "HTTP/1.0 200 OK");
    let mut c = std::net::TcpStream::connect(("127.0.0.1", api_port)).unwrap();
    c.write_all(
        format!("GET /v1/sandboxes/{sb}/ports/8000/connect HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: tcp\r\n\r\n")
            .as_bytes(),
    )
    .unwrap();
    let mut head = [0u8; 12];
    c.read_exact(&mut head).unwrap();
    assert_eq!(&head, b"HTTP/1.1 401", "a tunnel without the token");

    // Closed: nothing listens any more; a port nobody serves is refused
    // at connect time, the exposure itself is not.
    d.ok("DELETE", &format!("/v1/sandboxes/{sb}/ports/8000"), None);
    assert!(http_get(&a8000).is_err());
    let (status, v) = d.req("DELETE", &format!("/v1/sandboxes/{sb}/ports/8000"), None);
    assert_eq!(status, 400, "{v}");
    let (status, v) = d.req("POST", &format!("/v1/sandboxes/{sb}/ports"), Some(json!({"port": 0})));
    assert_eq!(status, 400, "{v}");
    let (status, _) = d.req("POST", "/v1/sandboxes/sb-nope/ports", Some(json!({"port": 80})));
    assert_eq!(status, 404);
}

#[test]
fn a_connection_to_the_outside_is_reset_by_a_rollback_and_in_a_fork_and_reported() {
    if must_skip() {
        return;
    }
    let net = Internet::new();
    let d = start("net-outside", &net);
    let sb = d.create();
    // A client holding a connection to the peer's echo server; at each
    // /tmp/go it sends a byte and writes how that went to /tmp/result.
    let script = format!(
        "import socket, time, os\n\
         s = socket.create_connection(('{}', {}))\n\
         s.sendall(b'hi'); assert s.recv(2) == b'hi'\n\
         open('/tmp/up', 'w').close()\n\
         while True:\n\
         \x20   while not os.path.exists('/tmp/go'): time.sleep(0.02)\n\
         \x20   os.remove('/tmp/go')\n\
         \x20   try:\n\
         \x20       s.sendall(b'x'); res = 'ok' if s.recv(1) == b'x' else 'closed'\n\
         \x20   except Exception as e: res = type(e).__name__\n\
         \x20   open('/tmp/result', 'w').write(res)\n",
        net.peer,
        sandtree_net::peer::ECHO_PORT
    );
    let (status, v) = d.req(
        "POST",
        &format!("/v1/sandboxes/{sb}/exec"),
        Some(json!({"cmd": ["python3", "-c", script], "background": true})),
    );
    assert_eq!(status, 200, "{v}");
    d.sh_ok(&sb, "for i in $(seq 100); do [ -e /tmp/up ] && exit 0; sleep 0.05; done; exit 1");
    let ask = |sb: &str| -> String {
        d.sh_ok(
            sb,
            "rm -f /tmp/result; touch /tmp/go; \
             for i in $(seq 100); do [ -s /tmp/result ] && cat /tmp/result && exit 0; sleep 0.05; done; exit 1",
        )
    };
    assert_eq!(ask(&sb), "ok");
    // The checkpoint takes it and changes nothing.
    let ck = d.checkpoint(&sb, "connected");
    assert_eq!(ask(&sb), "ok", "the checkpoint disturbed the connection");
    let resets_before = net.resets();

    // A fork: its copy of the client finds its connection reset, and says
    // so; the original's connection goes on.
    let r = d.ok("POST", &format!("/v1/checkpoints/{ck}/fork"), Some(json!({"count": 1})));
    let fork = r["results"][0]["sandbox"]["id"].as_str().unwrap_or_else(|| panic!("{r}")).to_string();
    let reported = r["results"][0]["connections_reset"].to_string();
    assert!(reported.contains(&format!("{}:{}", net.peer, sandtree_net::peer::ECHO_PORT)), "{r}");
    let got = ask(&fork);
    assert!(got == "ConnectionResetError" || got == "BrokenPipeError", "the fork's connection: {got}");
    assert_eq!(ask(&sb), "ok", "a fork disturbed the original's connection");
    assert_eq!(net.resets(), resets_before, "a fork reset the original's peer");

    // A rollback: reset for the process, and the peer sees a reset.
    let r = d.rollback(&sb, &ck);
    assert!(r["connections_reset"].to_string().contains(&net.peer.to_string()), "{r}");
    let got = ask(&sb);
    assert!(got == "ConnectionResetError" || got == "BrokenPipeError", "after the rollback: {got}");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while net.resets() == resets_before {
        assert!(std::time::Instant::now() < deadline, "the peer saw no reset");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

#[test]
fn a_sandbox_kept_running_through_a_daemon_restart_keeps_its_network_and_policy() {
    if must_skip() {
        return;
    }
    let net = Internet::new();
    let mut args = net.daemon_args();
    args.push("--keep-sandboxes".into());
    let mut d = Daemon::start_with("net-restart", &args.iter().map(String::as_str).collect::<Vec<_>>());
    let url = format!("http://{}:{PORT}/", net.peer);
    let sb = create_with(&d, json!({"deny": [net.peer.to_string(), "denied.peer.test"]}));
    assert!(fetch(&d, &sb, &url).is_err());
    let before = network(&d, &sb);
    let status = d.stop_with(nix::sys::signal::Signal::SIGTERM, std::time::Duration::from_secs(30));
    assert!(status.success(), "{status}");
    d.spawn();
    let after = network(&d, &sb);
    assert_eq!(after["outward_address"], before["outward_address"], "its router: {after}");
    // The policy still holds, and names resolve through a new forwarder
    // that knows it.
    assert!(fetch(&d, &sb, &url).is_err(), "the policy was lost");
    assert_eq!(d.sh(&sb, "getent hosts www.peer.test").0, 0);
    assert_ne!(d.sh(&sb, "getent hosts denied.peer.test").0, 0);
    // Changeable as before.
    set_policy(&d, &sb, &[], &[]);
    fetch(&d, &sb, &url).expect("the new policy");
    // Deleting it removes its router.
    let slot = {
        let out: Ipv4Addr = after["outward_address"].as_str().unwrap().parse().unwrap();
        (u32::from(out) - u32::from(Ipv4Addr::new(10, 213, 0, 0))) / 4
    };
    d.ok("DELETE", &format!("/v1/sandboxes/{sb}"), None);
    let link = format!("/sys/class/net/stree{slot}");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while std::path::Path::new(&link).exists() {
        assert!(std::time::Instant::now() < deadline, "{link} outlived its sandbox");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}
