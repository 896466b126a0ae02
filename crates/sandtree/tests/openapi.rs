//! The OpenAPI document: the checked-in copy is current, and the document and
//! the router serve exactly the same (method, path) pairs.

use std::collections::BTreeSet;

use axum::extract::{MatchedPath, Request};
use axum::http::{Method, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use http_body_util::BodyExt;
use sandtree::cli::client::{Client, Endpoint};
use sandtree::daemon::{openapi, routes};

fn doc_operations() -> BTreeSet<(String, String)> {
    let doc: serde_json::Value = serde_json::from_str(&openapi::document_json()).unwrap();
    let mut ops = BTreeSet::new();
    for (path, item) in doc["paths"].as_object().expect("paths") {
        for method in item.as_object().unwrap().keys() {
            if ["get", "post", "put", "delete", "patch", "head", "options"].contains(&method.as_str()) {
                ops.insert((method.to_uppercase(), path.clone()));
            }
        }
    }
    ops
}

#[test]
fn checked_in_document_is_current() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../openapi.json");
    let checked_in = std::fs::read_to_string(path).unwrap_or_default();
    let generated = openapi::document_json();
    assert!(
        checked_in == generated,
        "openapi.json at the repository root is stale: run `cargo run -p sandtree -- openapi > openapi.json`"
    );
}

#[test]
fn route_table_and_document_agree() {
    let table: BTreeSet<(String, String)> =
        routes::table().iter().map(|r| (r.method.to_string(), r.path.to_string())).collect();
    assert_eq!(table.len(), routes::table().len(), "the route table has duplicates");
    let doc = doc_operations();
    let undocumented: Vec<_> = table.difference(&doc).collect();
    let unrouted: Vec<_> = doc.difference(&table).collect();
    assert!(
        undocumented.is_empty(),
        "routes missing from the OpenAPI document (add #[utoipa::path] and list them in ApiDoc): {undocumented:?}"
    );
    assert!(unrouted.is_empty(), "documented operations the router does not serve: {unrouted:?}");
}

/// A middleware that only matched routes reach: answers with the matched
/// pattern instead of running the handler (which would need an engine).
async fn echo_match(req: Request, _next: Next) -> Response {
    let matched = req.extensions().get::<MatchedPath>().map(|m| m.as_str().to_string()).unwrap_or_default();
    (StatusCode::IM_A_TEAPOT, format!("{} {matched}", req.method())).into_response()
}

/// Serves `router` on a loopback port; returns a client for it.
async fn serve(router: axum::Router) -> Client {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    Client::new(Endpoint::Tcp(addr.to_string()), None)
}

async fn send(client: &Client, method: Method, uri: &str) -> (StatusCode, String) {
    let resp = client.send(method, uri, None::<&()>).await.unwrap();
    let status = resp.status();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&bytes).into_owned())
}

/// Fills `{param}` placeholders with a sample value.
fn concrete(path: &str) -> String {
    let mut out = String::new();
    let mut in_param = false;
    for c in path.chars() {
        match c {
            '{' => in_param = true,
            '}' => {
                in_param = false;
                out.push('1');
            }
            _ if in_param => {}
            _ => out.push(c),
        }
    }
    out
}

#[tokio::test]
async fn every_documented_operation_reaches_its_route() {
    let router = serve(routes::api_router().route_layer(middleware::from_fn(echo_match))).await;
    for (method, path) in doc_operations() {
        let m = Method::from_bytes(method.as_bytes()).unwrap();
        let (status, body) = send(&router, m, &concrete(&path)).await;
        assert_eq!(status, StatusCode::IM_A_TEAPOT, "{method} {path} did not reach a route: {status} {body}");
        assert_eq!(body, format!("{method} {path}"), "{method} {path} reached another route");
    }
}

#[tokio::test]
async fn unknown_routes_and_methods_are_json_errors() {
    let router = serve(routes::api_router()).await;
    let (status, body) = send(&router, Method::GET, "/v1/nope").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["error"]["code"], "route_not_found");
    assert!(v["error"]["message"].as_str().unwrap().contains("/v1/nope"));

    let (status, body) = send(&router, Method::PATCH, "/v1/sandboxes").await;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["error"]["code"], "method_not_allowed");
}

#[tokio::test]
async fn openapi_route_serves_the_document() {
    let router = serve(routes::api_router()).await;
    let (status, body) = send(&router, Method::GET, "/v1/openapi.json").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body, openapi::document_json());
}
