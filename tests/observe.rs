//! The on_limited hook (the log events are in tests/logs.rs, the metrics in tests/example_server.rs).

mod common;

use std::sync::{Arc, Mutex};

use axum::{routing::get, Router};
use common::{request, status_of};
use http::Method;
use tower_throttle::key::Header;
use tower_throttle::{Limited, Policy, Quota, ThrottleLayer};

fn policy() -> Policy<Header> {
    Policy::builder("api")
        .quota(Quota::per_minute(1))
        .key(Header::new("x-user"))
        .build()
        .unwrap()
}

fn from(user: &str) -> http::Request<axum::body::Body> {
    let mut r = request("/items?page=2");
    r.headers_mut().insert("x-user", user.parse().unwrap());
    r
}

#[tokio::test]
async fn the_hook_sees_each_limited_request_with_its_parts() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let record = seen.clone();
    let layer = ThrottleLayer::builder()
        .policy(policy())
        .on_limited(move |l: &Limited<'_>| {
            record.lock().unwrap().push((
                l.policy.to_owned(),
                l.key.to_string(),
                l.method.clone(),
                l.uri.to_string(),
                l.decision.retry_after_secs(),
                l.headers.contains_key("x-user"),
            ));
        })
        .build()
        .unwrap();
    let app = Router::new()
        .route("/items", get(|| async { "ok" }))
        .layer(layer);
    for _ in 0..3 {
        status_of(&app, from("carol")).await;
    }
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 2, "only the limited ones");
    assert_eq!(
        seen[0],
        (
            "api".to_owned(),
            "carol".to_owned(),
            Method::GET,
            "/items?page=2".to_owned(),
            60,
            true
        )
    );
}
