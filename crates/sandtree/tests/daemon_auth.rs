//! The real daemon (real engine) on TCP: requests without or with a wrong
//! bearer token are refused with 401 `unauthorized`; the right token (read
//! from `<data-dir>/token`, mode 0600) is accepted; the unix socket needs none
//! and is mode 0600. Skipped when not root (the daemon needs root).

mod common;

use std::os::unix::fs::PermissionsExt;

use common::Daemon;
use hyper::{Method, StatusCode};
use sandtree::cli::client::{Client, Endpoint, RemoteError};
use sandtree_api::ErrorCode;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tcp_needs_the_token_and_the_unix_socket_does_not() {
    if common::must_skip() {
        return;
    }
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let addr = format!("127.0.0.1:{port}");
    let d = tokio::task::spawn_blocking({
        let addr = addr.clone();
        move || Daemon::start_with("auth", &["--image-size", "2G", "--tcp", &addr])
    })
    .await
    .unwrap();
    let token_file = d.dir.join("token");
    let token = std::fs::read_to_string(&token_file).unwrap().trim().to_string();
    assert_eq!(token.len(), 64);
    assert_eq!(std::fs::metadata(&token_file).unwrap().permissions().mode() & 0o777, 0o600);
    assert_eq!(std::fs::metadata(&d.socket).unwrap().permissions().mode() & 0o777, 0o600);

    for presented in [None, Some("wrong".to_string()), Some(format!("{token}x"))] {
        let c = Client::new(Endpoint::Tcp(addr.clone()), presented.clone());
        let resp = c.send(Method::GET, "/v1/sandboxes", None::<&()>).await.unwrap();
        assert_eq!(resp.status(), StatusCode::UNAUTHORIZED, "token {presented:?}");
        let e = c.call(Method::GET, "/v1/info", None::<&()>).await.unwrap_err();
        assert_eq!(e.downcast::<RemoteError>().unwrap().0.code, ErrorCode::Unauthorized);
    }
    let tcp = Client::new(Endpoint::Tcp(addr), Some(token));
    let info = tcp.call(Method::GET, "/v1/info", None::<&()>).await.unwrap();
    assert_eq!(info["data_dir"], d.dir.display().to_string());
    let unix = Client::new(Endpoint::Unix(d.socket.clone()), None);
    let list = unix.call(Method::GET, "/v1/sandboxes", None::<&()>).await.unwrap();
    assert!(list["sandboxes"].is_array());
    // Error shapes from the real router: unknown route, bad JSON.
    let e = unix.call(Method::GET, "/v1/nope", None::<&()>).await.unwrap_err();
    assert_eq!(e.downcast::<RemoteError>().unwrap().0.code, ErrorCode::RouteNotFound);
    let bad = serde_json::json!({"cmd": "not-a-list"});
    let e = unix.call(Method::POST, "/v1/sandboxes/sb-x/exec", Some(&bad)).await.unwrap_err();
    let e = e.downcast::<RemoteError>().unwrap().0;
    assert_eq!(e.code, ErrorCode::InvalidArgument);
    assert!(e.message.contains("invalid type"), "{}", e.message);
    tokio::task::spawn_blocking(move || drop(d)).await.unwrap();
}
