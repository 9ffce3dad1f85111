//! Rolling a limit out on a real Redis server, by the Lua script and by redis-cell's `CL.THROTTLE`:
//! a shadow limit never refuses, the policy's own limit still refuses at its quota, and the
//! would-limits are counted exactly; staged enforcement refuses for the same keys on both paths
//! (two backends, two connections) as in memory.
//!
//! Quotas are per hour, so no unit refills while a test runs on the real clock: counts are exact.

use std::collections::BTreeSet;
use std::time::Duration;

use axum::body::Body;
use axum::routing::get;
use axum::Router;
use http::{Request, StatusCode};
use tower::ServiceExt;
use tower_throttle::key::Header;
use tower_throttle::{
    redis::{RedisBackend, RedisMode},
    Backend, Key, Policy, Quota,
};

use crate::support::redis::RedisServer;
use crate::support::{layer_on, sample_or_zero as sample, with_metrics};

fn app<B: Backend>(backend: B, policy: Policy<Header>) -> Router {
    Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer_on(backend, policy))
}

fn from(user: &str) -> Request<Body> {
    Request::get("/")
        .header("x-user", user)
        .body(Body::empty())
        .unwrap()
}

async fn connect(server: &RedisServer, mode: RedisMode) -> RedisBackend {
    RedisBackend::builder()
        .url(server.url())
        .mode(mode)
        .prefix(format!("rollout-{}", mode.as_str()))
        .timeout(Duration::from_secs(2))
        .connect()
        .await
        .unwrap()
}

/// Enforce 20 an hour, shadow 5 an hour; 60 requests of one key, one at a time.
async fn shadow_never_refuses(backend: RedisBackend) -> Vec<StatusCode> {
    let policy = Policy::builder("api")
        .quota(Quota::per_hour(20))
        .shadow(Quota::per_hour(5))
        .key(Header::new("x-user"))
        .build()
        .unwrap();
    let app = app(backend, policy);
    let mut statuses = Vec::new();
    for _ in 0..60 {
        statuses.push(app.clone().oneshot(from("ann")).await.unwrap().status());
    }
    statuses
}

/// The users (of 1,000) whose second request is refused under 10 % staged enforcement.
async fn staged_refusals<B: Backend>(backend: B) -> BTreeSet<u32> {
    let policy = Policy::builder("staged")
        .quota(Quota::per_hour(1))
        .enforce_fraction(0.10)
        .key(Header::new("x-user"))
        .build()
        .unwrap();
    let app = app(backend, policy);
    let mut refused = BTreeSet::new();
    for user in 0..1000u32 {
        let name = format!("user-{user}");
        assert_eq!(
            app.clone().oneshot(from(&name)).await.unwrap().status(),
            StatusCode::OK
        );
        match app.clone().oneshot(from(&name)).await.unwrap().status() {
            StatusCode::OK => {}
            StatusCode::TOO_MANY_REQUESTS => {
                refused.insert(user);
            }
            other => panic!("{other}"),
        }
    }
    refused
}

#[test]
fn shadow_limits_and_staged_enforcement_on_lua_and_cl_throttle() {
    let server = RedisServer::start_with_cell();
    let modes = [RedisMode::Lua, RedisMode::Cell];
    let ((shadowed, staged), page) = with_metrics(async {
        let mut shadowed = Vec::new();
        let mut staged = Vec::new();
        for mode in modes {
            shadowed.push(shadow_never_refuses(connect(&server, mode).await).await);
            staged.push(staged_refusals(connect(&server, mode).await).await);
        }
        (shadowed, staged)
    });
    for statuses in &shadowed {
        assert!(statuses[..20].iter().all(|s| *s == StatusCode::OK));
        assert!(statuses[20..]
            .iter()
            .all(|s| *s == StatusCode::TOO_MANY_REQUESTS));
    }
    // Each path: 60 requests, 5 within the shadow quota.
    let would = "throttle_requests_would_limit_total{policy=\"api\",limit=\"api.shadow.1h\"}";
    assert_eq!(sample(&page, would), 2.0 * 55.0, "{page}");
    // The same keys on both paths, and those the policy says it enforces (as in memory).
    assert_eq!(staged[0], staged[1]);
    assert!((70..=130).contains(&staged[0].len()), "{}", staged[0].len());
    let policy = Policy::builder("staged")
        .key(tower_throttle::key::PeerIp::new())
        .quota(Quota::per_hour(1))
        .enforce_fraction(0.10)
        .build()
        .unwrap();
    let expected: BTreeSet<u32> = (0..1000)
        .filter(|u| policy.enforces(&Key::from(format!("user-{u}"))))
        .collect();
    assert_eq!(staged[0], expected);
    let staged_would = "throttle_requests_would_limit_total{policy=\"staged\",limit=\"staged\"}";
    assert_eq!(
        sample(&page, staged_would),
        2.0 * (1000 - expected.len()) as f64
    );
    // The shadow limit kept its own state in Redis, beside the policy's.
    let keys = server.cli(&["--scan", "--pattern", "rollout-lua*"]);
    assert!(keys.contains("api.shadow.1h"), "{keys}");
}
