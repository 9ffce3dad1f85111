//! `ThrottleLayer::handle`: peek, reset and reload through a running layer, on memory and Redis.
//! Exact counts while the policy table is swapped under 100 concurrent requests; an invalid reload
//! leaves the running table in force; a request in flight finishes with the table it started with.

use crate::support::redis as redis_support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::routing::get;
use axum::Router;
use http::{Request, StatusCode};
use http_body_util::BodyExt;
use tower::ServiceExt;
use tower_throttle::config::Config;
use tower_throttle::key::{Header, PeerIp};
use tower_throttle::{
    ops::HandleError,
    policy::Penalty,
    redis::{RedisBackend, RedisMode},
    Algorithm, Backend, MemoryBackend, Policy, Quota, ThrottleLayer,
};

async fn redis(url: &str) -> RedisBackend {
    RedisBackend::builder()
        .url(url)
        .mode(RedisMode::Lua)
        .timeout(Duration::from_secs(2))
        .connect()
        .await
        .unwrap()
}

/// The `RateLimit-Policy` field of `api`: 50, refilling one an hour (a window of 50 hours).
const API_FIELD: &str = r#""api";q=50;w=180000"#;

fn policy(name: &str, route: &str, quota: Quota) -> Policy<Header> {
    Policy::builder(name)
        .route(route)
        .quota(quota)
        .key(Header::new("x-user-id"))
        .build()
        .unwrap()
}

/// The table of the reload test: `api` never changes (limit 50, no refill during the test);
/// `other` changes its quota with `n`, and `extra` comes and goes.
fn table(n: u64) -> Vec<Policy<Header>> {
    let mut policies = vec![
        policy("api", "/api", Quota::per_hour(1).with_max_burst(49)),
        policy("other", "/other", Quota::per_minute(n)),
    ];
    if n.is_multiple_of(2) {
        policies.push(policy("extra", "/extra", Quota::per_second(n)));
    }
    policies
}

fn app<B: Backend + Clone>(layer: ThrottleLayer<Header, B>) -> Router {
    Router::new()
        .route("/api", get(|| async { "ok" }))
        .route("/other", get(|| async { "ok" }))
        .route("/extra", get(|| async { "ok" }))
        .layer(layer)
}

async fn get_as(app: &Router, path: &str, user: &str) -> http::Response<Body> {
    let request = Request::get(path)
        .header("x-user-id", user)
        .body(Body::empty())
        .unwrap();
    app.clone().oneshot(request).await.unwrap()
}

/// 100 concurrent requests of one user while another task reloads the table 200 times: none is
/// dropped, each is admitted with the `api` policy's fields or refused with a `Retry-After`, and
/// exactly the 50 of the unchanged policy's limit are admitted.
async fn reload_under_load<B: Backend + Clone>(backend: B) {
    let layer = ThrottleLayer::builder()
        .backend(backend)
        .policies(table(1))
        .build()
        .unwrap();
    let handle = layer.handle();
    let app = app(layer);
    let barrier = Arc::new(tokio::sync::Barrier::new(101));
    // Reloads from the moment the requests start until every one has answered.
    let done = Arc::new(AtomicBool::new(false));
    let reloader = {
        let (handle, barrier, done) = (handle.clone(), barrier.clone(), done.clone());
        tokio::spawn(async move {
            barrier.wait().await;
            let mut reloads = 0;
            while reloads < 200 || !done.load(Ordering::Relaxed) {
                handle.reload(table(1 + reloads % 5)).unwrap();
                reloads += 1;
                tokio::task::yield_now().await;
            }
            reloads
        })
    };
    let requests: Vec<_> = (0..100)
        .map(|_| {
            let (app, barrier) = (app.clone(), barrier.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                get_as(&app, "/api", "u").await
            })
        })
        .collect();
    let (mut ok, mut limited) = (0, 0);
    for request in requests {
        let response = request.await.expect("no request is dropped");
        let headers = response.headers();
        match response.status() {
            StatusCode::OK => {
                ok += 1;
                let policy = headers["ratelimit-policy"].to_str().unwrap();
                assert_eq!(policy, API_FIELD);
            }
            StatusCode::TOO_MANY_REQUESTS => {
                limited += 1;
                assert!(headers.contains_key("retry-after"), "{headers:?}");
                let policy = headers["ratelimit-policy"].to_str().unwrap();
                assert_eq!(policy, API_FIELD);
            }
            other => panic!("unexpected {other}"),
        }
    }
    done.store(true, Ordering::Relaxed);
    let reloads = reloader.await.unwrap();
    // The last table set `other` to this many a minute.
    let other = 1 + (reloads - 1) % 5;
    assert_eq!(
        (ok, limited),
        (50, 50),
        "the unchanged policy's count carried over"
    );
    let state = handle.peek("api", "u").await.unwrap().summary();
    assert_eq!((state.limit, state.remaining), (50, 0));
    assert_eq!(
        get_as(&app, "/api", "u").await.status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    // The changed policy runs with the last table's quota.
    assert_eq!(handle.policies()[1].limit().quota().count(), other);
    for _ in 0..other {
        assert_eq!(get_as(&app, "/other", "u").await.status(), StatusCode::OK);
    }
    assert_eq!(
        get_as(&app, "/other", "u").await.status(),
        StatusCode::TOO_MANY_REQUESTS
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn memory_reload_under_load_keeps_exact_counts() {
    reload_under_load(MemoryBackend::new()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_reload_under_load_keeps_exact_counts() {
    let server = redis_support::RedisServer::start();
    reload_under_load(redis(&server.url()).await).await;
}

/// Peeks consume nothing, a reset restores the full quota and lifts a ban (the layer's penalty box
/// on memory, Redis's own keys on Redis), all through the layer.
async fn peek_and_reset_through_the_layer<B: Backend + Clone>(backend: B) {
    let login = Policy::builder("login")
        .route("/api")
        .quota(Quota::per_hour(1).with_max_burst(2))
        .key(Header::new("x-user-id"))
        .penalty(Penalty::new(1, Duration::from_secs(60), Duration::from_secs(600)).unwrap())
        .build()
        .unwrap();
    let layer = ThrottleLayer::builder()
        .backend(backend)
        .policy(login)
        .build()
        .unwrap();
    let handle = layer.handle();
    let app = app(layer);
    for _ in 0..20 {
        let state = handle.peek("login", "alice").await.unwrap().summary();
        assert_eq!((state.limit, state.remaining, state.banned), (3, 3, None));
    }
    for _ in 0..3 {
        assert_eq!(get_as(&app, "/api", "alice").await.status(), StatusCode::OK);
    }
    // Over the limit: the first strike bans.
    assert_eq!(
        get_as(&app, "/api", "alice").await.status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    let state = handle.peek("login", "alice").await.unwrap().summary();
    let ban = state.banned.expect("banned");
    assert!(ban > Duration::from_secs(590), "{ban:?}");
    assert_eq!(state.remaining, 0);
    assert!(state.retry_after.unwrap() >= ban);
    assert_eq!(
        get_as(&app, "/api", "alice").await.status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    // Another user is untouched.
    assert_eq!(get_as(&app, "/api", "bob").await.status(), StatusCode::OK);

    handle.reset("login", "alice").await.unwrap();
    let state = handle.peek("login", "alice").await.unwrap().summary();
    assert_eq!(
        (state.remaining, state.banned, state.retry_after),
        (3, None, None)
    );
    for _ in 0..3 {
        assert_eq!(get_as(&app, "/api", "alice").await.status(), StatusCode::OK);
    }
    assert_eq!(
        get_as(&app, "/api", "alice").await.status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(
        handle
            .peek("login", "bob")
            .await
            .unwrap()
            .summary()
            .remaining,
        2
    );

    assert!(matches!(
        handle.peek("logon", "alice").await,
        Err(HandleError::UnknownPolicy(name)) if name == "logon"
    ));
    assert!(matches!(
        handle.reset("logon", "alice").await,
        Err(HandleError::UnknownPolicy(_))
    ));
}

#[tokio::test]
async fn memory_peek_and_reset_through_the_layer() {
    peek_and_reset_through_the_layer(MemoryBackend::new()).await;
}

#[tokio::test]
async fn redis_peek_and_reset_through_the_layer() {
    let server = redis_support::RedisServer::start();
    peek_and_reset_through_the_layer(redis(&server.url()).await).await;
}

#[tokio::test]
async fn an_invalid_reload_leaves_the_running_table_in_force() {
    let layer = ThrottleLayer::builder().policies(table(1)).build().unwrap();
    let handle = layer.handle();
    let app = app(layer);
    assert_eq!(get_as(&app, "/other", "u").await.status(), StatusCode::OK);
    // Two policies of one name with different quotas; a policy that can never apply; nothing.
    let mut twice = table(3);
    twice.push(policy("other", "/elsewhere", Quota::per_minute(9)));
    let err = handle.reload(twice).unwrap_err();
    assert!(err.to_string().contains("appears twice"), "{err}");
    let mut shadowed = table(3);
    shadowed.push(policy("again", "/api", Quota::per_minute(9)));
    assert!(handle.reload(shadowed).is_err());
    assert!(handle.reload(Vec::new()).is_err());
    // Still the first table: `other` at 1 a minute, already spent.
    assert_eq!(handle.policies().len(), 2);
    assert_eq!(
        get_as(&app, "/other", "u").await.status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    let response = get_as(&app, "/api", "u").await;
    assert_eq!(response.headers()["ratelimit-policy"], API_FIELD);
}

#[tokio::test]
async fn a_redis_backend_refuses_what_it_cannot_enforce_in_a_reload() {
    let server = redis_support::RedisServer::start();
    let layer = ThrottleLayer::builder()
        .backend(redis(&server.url()).await)
        .policies(table(1))
        .build()
        .unwrap();
    let handle = layer.handle();
    // A sliding window whose count × period is beyond what the Redis script computes exactly.
    let mut too_big = table(1);
    too_big.push(
        Policy::builder("huge")
            .route("/extra")
            .quota(Quota::per_day(1_000_000))
            .algorithm(Algorithm::SlidingWindow)
            .key(Header::new("x-user-id"))
            .build()
            .unwrap(),
    );
    let err = handle.reload(too_big).unwrap_err();
    assert!(err.to_string().contains("sliding window"), "{err}");
    assert_eq!(handle.policies().len(), 2);
}

/// A request admitted under one table finishes under it: its concurrency slot is given back to the
/// limit that gave it, though a reload removed the policy meanwhile.
#[tokio::test]
async fn a_request_in_flight_finishes_with_the_table_it_started_with() {
    let downloads = || {
        Policy::builder("downloads")
            .route("/download")
            .quota(Quota::per_second(1))
            .algorithm(Algorithm::Concurrency)
            .key(Header::new("x-user-id"))
            .build()
            .unwrap()
    };
    let layer = ThrottleLayer::builder()
        .policy(downloads())
        .build()
        .unwrap();
    let handle = layer.handle();
    let (release, released) = tokio::sync::oneshot::channel::<()>();
    let released = Arc::new(tokio::sync::Mutex::new(Some(released)));
    let app = Router::new()
        .route(
            "/download",
            get(move || {
                let released = released.clone();
                async move {
                    if let Some(wait) = released.lock().await.take() {
                        wait.await.ok();
                    }
                    "done"
                }
            }),
        )
        .layer(layer);
    let in_flight = tokio::spawn({
        let app = app.clone();
        async move { get_as(&app, "/download", "u").await }
    });
    // Wait until the slot is taken.
    while handle
        .peek("downloads", "u")
        .await
        .unwrap()
        .summary()
        .remaining
        != 0
    {
        tokio::task::yield_now().await;
    }
    handle
        .reload([policy("api", "/api", Quota::per_second(5))])
        .unwrap();
    release.send(()).unwrap();
    let response = in_flight.await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.headers()["ratelimit-policy"], r#""downloads";q=1"#);
    assert_eq!(
        response.into_body().collect().await.unwrap().to_bytes(),
        "done"
    );
    // Back under the old policy's limit: reloading it finds its slot free.
    handle.reload([downloads()]).unwrap();
    assert_eq!(
        handle
            .peek("downloads", "u")
            .await
            .unwrap()
            .summary()
            .remaining,
        1
    );
    assert_eq!(
        get_as(&app, "/download", "u").await.status(),
        StatusCode::OK
    );
}

#[tokio::test]
async fn keys_are_given_as_the_text_the_policy_extracts() {
    let by_ip = Policy::builder("by-ip")
        .quota(Quota::per_minute(3))
        .key(PeerIp::new())
        .build()
        .unwrap();
    let layer = ThrottleLayer::new(by_ip);
    let handle = layer.handle();
    let backend = layer.backend().clone();
    let key = PeerIp::new().key_for("2001:db8::1".parse().unwrap());
    assert!(
        backend
            .check(&layer.policies()[0].limit().clone(), &key, 1)
            .await
            .unwrap()
            .allowed
    );
    // Any address of the /64 names the key.
    for text in ["2001:db8::1", "2001:db8::ffff"] {
        assert_eq!(
            handle
                .peek("by-ip", text)
                .await
                .unwrap()
                .summary()
                .remaining,
            2
        );
    }
    assert!(matches!(
        handle.peek("by-ip", "alice").await,
        Err(HandleError::InvalidKey { .. })
    ));
}

#[tokio::test]
async fn a_config_reload_applies_routes_and_refuses_what_needs_a_restart() {
    let text = |count: u64| {
        format!(
            "[[route]]\nname = \"api\"\npath = \"/api\"\nkey = \"header:x-user-id\"\n\
             count = {count}\nperiod = \"1h\"\n"
        )
    };
    let running = Config::from_toml(&text(2)).unwrap();
    let layer = running.memory_layer().unwrap();
    let handle = layer.handle();
    let app = Router::new()
        .route("/api", get(|| async { "ok" }))
        .layer(layer);
    assert_eq!(get_as(&app, "/api", "u").await.status(), StatusCode::OK);
    let running = handle.reload_toml(&running, &text(4)).unwrap();
    // The state carries over as the GCRA keeps it, as time: one request at 2 an hour is half an
    // hour of backlog, which at 4 an hour is two requests, so 2 of 4 remain.
    let state = handle.peek("api", "u").await.unwrap().summary();
    assert_eq!((state.limit, state.remaining), (4, 2));
    for _ in 0..2 {
        assert_eq!(get_as(&app, "/api", "u").await.status(), StatusCode::OK);
    }
    assert_eq!(
        get_as(&app, "/api", "u").await.status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    for (bad, says) in [
        ("[[route]]\nname = \"api\"".to_owned(), "missing field"),
        (text(0), "count must be at least 1"),
        (
            format!("legacy_headers = true\n{}", text(9)),
            "legacy_headers",
        ),
        (
            format!("[backend]\nkind = \"memory\"\nmax_keys = 5\n{}", text(9)),
            "[backend]",
        ),
    ] {
        let err = handle.reload_toml(&running, &bad).unwrap_err().to_string();
        assert!(err.contains(says), "{err}");
    }
    assert_eq!(handle.policies()[0].limit().quota().count(), 4);
    handle.reset("api", "u").await.unwrap();
    assert_eq!(get_as(&app, "/api", "u").await.status(), StatusCode::OK);
}

/// A peek shows every tier (each counts under limits of its own) and every limit of a stack; a
/// reset forgets the key in all of them.
async fn tiers_and_stacks<B: Backend + Clone>(backend: B) {
    let api = Policy::builder("plans")
        .route("/api")
        .quotas([Quota::per_minute(3), Quota::per_day(5)])
        .tier("paid", [Quota::per_minute(10)])
        .tier_header("x-plan")
        .key(Header::new("x-user-id"))
        .build()
        .unwrap();
    let layer = ThrottleLayer::builder()
        .backend(backend)
        .policy(api)
        .build()
        .unwrap();
    let handle = layer.handle();
    let app = app(layer);
    let paid = || {
        Request::get("/api")
            .header("x-user-id", "carol")
            .header("x-plan", "paid")
            .body(Body::empty())
            .unwrap()
    };
    assert_eq!(get_as(&app, "/api", "carol").await.status(), StatusCode::OK);
    for _ in 0..2 {
        assert_eq!(
            app.clone().oneshot(paid()).await.unwrap().status(),
            StatusCode::OK
        );
    }
    let state = handle.peek("plans", "carol").await.unwrap();
    assert_eq!(state.tiers.len(), 2);
    let default = &state.tiers[0];
    assert_eq!(default.tier, None);
    let remaining: Vec<(&str, u64)> = default
        .limits
        .iter()
        .map(|(name, s)| (name.as_str(), s.remaining))
        .collect();
    assert_eq!(remaining, [("plans.1m", 2), ("plans.1d", 4)]);
    assert_eq!(state.summary().remaining, 2);
    assert_eq!(state.tiers[1].tier.as_deref(), Some("paid"));
    assert_eq!(state.tiers[1].combined().remaining, 8);

    handle.reset("plans", "carol").await.unwrap();
    let state = handle.peek("plans", "carol").await.unwrap();
    assert_eq!(state.summary().remaining, 3);
    assert_eq!(state.tiers[0].limits[1].1.remaining, 5);
    assert_eq!(state.tiers[1].combined().remaining, 10);
}

#[tokio::test]
async fn memory_peek_and_reset_cover_every_tier_and_stacked_limit() {
    tiers_and_stacks(MemoryBackend::new()).await;
}

#[tokio::test]
async fn redis_peek_and_reset_cover_every_tier_and_stacked_limit() {
    let server = redis_support::RedisServer::start();
    tiers_and_stacks(redis(&server.url()).await).await;
}
