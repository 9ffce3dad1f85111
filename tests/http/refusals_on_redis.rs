//! The tests of tests/middleware/refusals.rs that need a Redis server.
use crate::shared::refusals::{negotiating_hook, Log};
use crate::support::redis as redis_support;

use std::time::Duration;

use crate::support::{body_string, header};
use axum::body::Body;
use axum::{routing::get, Extension, Router};
use http::{header::ACCEPT, Request, StatusCode};
use tower::ServiceExt;
use tower_throttle::key::Global;
use tower_throttle::refusal::RefusalKind;
use tower_throttle::{
    policy::RequestDecisions, redis::RedisBackend, OnBackendError, Policy, Quota, ThrottleLayer,
};

/// Redis is dead and the layer fails closed: the hook answers the 503, which keeps its Retry-After.
#[tokio::test]
async fn the_hook_answers_the_503_of_a_dead_redis_under_deny() {
    let mut server = redis_support::RedisServer::start();
    let backend = RedisBackend::builder()
        .url(server.url())
        .timeout(Duration::from_millis(100))
        .connect()
        .await
        .unwrap();
    server.stop();
    let log = Log::default();
    let layer = ThrottleLayer::builder()
        .backend(backend)
        .policy(
            Policy::builder("api")
                .quota(Quota::per_minute(100))
                .key(Global)
                .build()
                .unwrap(),
        )
        .on_backend_error(OnBackendError::Deny)
        .refusal_response(negotiating_hook(log.clone()))
        .build()
        .unwrap();
    let app = Router::new()
        .route("/items", get(|| async { "ok" }))
        .layer(layer);
    for accept in ["text/html", "application/json"] {
        let req = Request::get("/items")
            .header(ACCEPT, accept)
            .body(Body::empty())
            .unwrap();
        let response = tokio::time::timeout(Duration::from_secs(5), app.clone().oneshot(req))
            .await
            .expect("answered within the timeout")
            .unwrap();
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(header(&response, "retry-after"), Some("1"));
        let expected_type = if accept == "text/html" {
            "text/html"
        } else {
            "application/problem+json"
        };
        assert_eq!(header(&response, "content-type"), Some(expected_type));
    }
    let seen = log.lock().unwrap().clone();
    assert_eq!(seen.len(), 2, "{seen:?}");
    for s in &seen {
        assert_eq!(s.kind, RefusalKind::Unavailable);
        assert_eq!(s.status, 503);
        assert_eq!(s.policy.as_deref(), Some("api"));
        assert_eq!(s.retry_after_secs, Some(1));
        assert_eq!(s.key.as_deref(), Some("*"));
    }
}

/// The same on a live Redis (Lua path): the hook answers its 429 with the decision Redis made, and
/// a handler sees every quota of a stack decided there, keyed by a composite of query and path.
#[tokio::test]
async fn on_redis_the_hook_and_the_per_limit_decisions_work_alike() {
    use tower_throttle::key::{Composite, KeySpec, PathParam, QueryParam};

    let server = redis_support::RedisServer::start();
    let backend = RedisBackend::builder()
        .url(server.url())
        .mode(tower_throttle::redis::RedisMode::Lua)
        .connect()
        .await
        .unwrap();
    let key = Composite::new([
        KeySpec::from(QueryParam::new("api_key")),
        KeySpec::from(PathParam::new("/orgs/{org}", "org").unwrap()),
    ])
    .unwrap();
    let log = Log::default();
    let layer = ThrottleLayer::builder()
        .backend(backend)
        .policy(
            Policy::builder("org")
                .quotas([Quota::per_minute(2), Quota::per_day(100)])
                .key(KeySpec::from(key))
                .build()
                .unwrap(),
        )
        .decision_extension(true)
        .refusal_response(negotiating_hook(log.clone()))
        .build()
        .unwrap();
    let app = Router::new()
        .route(
            "/orgs/{org}",
            get(|Extension(all): Extension<RequestDecisions>| async move {
                let d = all.get("org").expect("this layer's decision");
                let limits: Vec<String> = d
                    .limits
                    .iter()
                    .map(|l| format!("{}:{}", l.name, l.decision.remaining))
                    .collect();
                limits.join(",")
            }),
        )
        .layer(layer);
    let call = |uri: &str| {
        Request::get(uri)
            .header(ACCEPT, "text/html")
            .body(Body::empty())
            .unwrap()
    };
    let first = app
        .clone()
        .oneshot(call("/orgs/acme?api_key=k"))
        .await
        .unwrap();
    assert_eq!(body_string(first).await, "org.1m:1,org.1d:99");
    let second = app
        .clone()
        .oneshot(call("/orgs/ac%6De?api_key=k"))
        .await
        .unwrap();
    assert_eq!(body_string(second).await, "org.1m:0,org.1d:98");
    let limited = app
        .clone()
        .oneshot(call("/orgs/acme?api_key=k"))
        .await
        .unwrap();
    assert_eq!(limited.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&limited, "content-type"), Some("text/html"));
    let retry: u64 = header(&limited, "retry-after").unwrap().parse().unwrap();
    assert!((29..=30).contains(&retry), "{retry}");
    let other = app
        .clone()
        .oneshot(call("/orgs/other?api_key=k"))
        .await
        .unwrap();
    assert_eq!(other.status(), StatusCode::OK);
    let seen = log.lock().unwrap().clone();
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(seen[0].kind, RefusalKind::Limited);
    assert_eq!(seen[0].policy.as_deref(), Some("org"));
}
