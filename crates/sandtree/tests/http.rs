//! The HTTP layer without an engine: bearer-token auth over real TCP, the
//! JSON error shape of bad request bodies, and the client's NDJSON reader.

use axum::routing::post;
use axum::{Json, Router};
use http_body_util::BodyExt;
use hyper::{Method, StatusCode};
use sandtree::cli::client::{Client, Endpoint, RemoteError};
use sandtree::daemon::auth::{Token, constant_time_eq};
use sandtree::daemon::error::ApiJson;
use sandtree::daemon::server::app;
use sandtree_api::{CreateSandboxRequest, ErrorCode, ExecEvent};

async fn serve(router: Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    addr.to_string()
}

fn remote(e: anyhow::Error) -> RemoteError {
    e.downcast::<RemoteError>().expect("an error answered by the server")
}

#[test]
fn constant_time_compare() {
    assert!(constant_time_eq(b"0123456789abcdef", b"0123456789abcdef"));
    assert!(!constant_time_eq(b"0123456789abcdef", b"0123456789abcdeg"));
    assert!(!constant_time_eq(b"short", b"longer"));
    let t = Token::new("secret");
    assert!(t.matches("secret"));
    assert!(!t.matches("Secret"));
    assert!(!t.matches(""));
}

#[tokio::test]
async fn tcp_listener_requires_the_bearer_token() {
    let addr = serve(app(None, Some(Token::new("s3cret")))).await;
    // No token.
    let anon = Client::new(Endpoint::Tcp(addr.clone()), None);
    let e = remote(anon.call(Method::GET, "/v1/openapi.json", None::<&()>).await.unwrap_err());
    assert_eq!(e.0.code, ErrorCode::Unauthorized);
    let resp = anon.send(Method::GET, "/v1/info", None::<&()>).await.unwrap();
    assert_eq!(resp.status(), StatusCode::UNAUTHORIZED);
    // Unknown routes are not revealed either.
    let resp = anon.send(Method::GET, "/v1/nope", None::<&()>).await.unwrap();
    assert_eq!(resp.status(), StatusCode::UNAUTHORIZED);
    // Wrong token.
    let wrong = Client::new(Endpoint::Tcp(addr.clone()), Some("s3cres".into()));
    let e = remote(wrong.call(Method::GET, "/v1/openapi.json", None::<&()>).await.unwrap_err());
    assert_eq!(e.0.code, ErrorCode::Unauthorized);
    // Right token.
    let ok = Client::new(Endpoint::Tcp(addr), Some("s3cret".into()));
    let doc = ok.call(Method::GET, "/v1/openapi.json", None::<&()>).await.unwrap();
    assert_eq!(doc["info"]["title"], "Sandtree API");
}

#[tokio::test]
async fn bad_json_bodies_are_invalid_argument_with_the_serde_message() {
    let router =
        Router::new().route("/x", post(|ApiJson(r): ApiJson<CreateSandboxRequest>| async move { Json(r.image) }));
    let client = Client::new(Endpoint::Tcp(serve(router).await), None);
    let cases: [(&str, serde_json::Value); 3] = [
        ("unknown field", serde_json::json!({"imag": "x"})),
        ("invalid type", serde_json::json!({"image": 5})),
        ("invalid type", serde_json::json!([1])),
    ];
    for (needle, body) in cases {
        let resp = client.send(Method::POST, "/x", Some(&body)).await.unwrap();
        assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
        let bytes = resp.into_body().collect().await.unwrap().to_bytes();
        let v: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(v["error"]["code"], "invalid_argument", "{v}");
        let msg = v["error"]["message"].as_str().unwrap();
        assert!(msg.contains(needle), "{msg}");
    }
    let ok = client.call(Method::POST, "/x", Some(&serde_json::json!({"image": "alpine"}))).await.unwrap();
    assert_eq!(ok, "alpine");
}

#[tokio::test]
async fn ndjson_streams_are_read_line_by_line() {
    let router = Router::new().route(
        "/s",
        post(|| async {
            let lines = concat!(
                r#"{"type":"started","pid":7}"#,
                "\n",
                r#"{"type":"stdout","data":"hi\n"}"#,
                "\n\n",
                r#"{"type":"exit","pid":7,"exit_code":3,"signal":null,"stdout":"","stderr":"","stdout_truncated":false,"stderr_truncated":false,"timed_out":false,"duration_ms":1.0}"#,
                "\n"
            );
            ([("content-type", "application/x-ndjson")], lines)
        }),
    );
    let client = Client::new(Endpoint::Tcp(serve(router).await), None);
    let mut events = Vec::new();
    client
        .stream(Method::POST, "/s", None::<&()>, |e: ExecEvent| {
            events.push(e);
            Ok(())
        })
        .await
        .unwrap();
    assert_eq!(events.len(), 3);
    assert!(matches!(events[0], ExecEvent::Started { pid: 7 }));
    assert!(matches!(&events[1], ExecEvent::Stdout { data } if data == "hi\n"));
    assert!(matches!(&events[2], ExecEvent::Exit(r) if r.exit_code == Some(3)));
}

#[tokio::test]
async fn cannot_connect_names_the_socket_and_the_daemon() {
    let client = Client::new(Endpoint::Unix("/nonexistent/sandtree.sock".into()), None);
    let e = client.call(Method::GET, "/v1/info", None::<&()>).await.unwrap_err().to_string();
    assert!(e.contains("/nonexistent/sandtree.sock"), "{e}");
    assert!(e.contains("sandtree daemon"), "{e}");
}
