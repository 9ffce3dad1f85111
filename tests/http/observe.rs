//! The on_limited hook (the log events are in tests/observability/logs.rs, the metrics in
//! tests/http/example_server.rs).

use std::sync::{Arc, Mutex};

use crate::support::{from_user as from, per_user_policy as policy, status_of};
use axum::{routing::get, Router};
use http::Method;
use tower_throttle::{Limited, ThrottleLayer};

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
