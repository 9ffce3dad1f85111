//! What tests/middleware/admin_handle.rs and tests/http/admin_handle_on_redis.rs share.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::routing::get;
use axum::Router;
use http::{Request, StatusCode};
use tower::ServiceExt;
use tower_throttle::key::Header;
use tower_throttle::{ops::HandleError, policy::Penalty, Backend, Policy, Quota, ThrottleLayer};

/// `other` changes its quota with `n`, and `extra` comes and goes.
pub(crate) fn table(n: u64) -> Vec<Policy<Header>> {
    let mut policies = vec![
        policy("api", "/api", Quota::per_hour(1).with_max_burst(49)),
        policy("other", "/other", Quota::per_minute(n)),
    ];
    if n.is_multiple_of(2) {
        policies.push(policy("extra", "/extra", Quota::per_second(n)));
    }
    policies
}

/// 100 concurrent requests of one user while another task reloads the table 200 times: none is
/// dropped, each is admitted with the `api` policy's fields or refused with a `Retry-After`, and
/// exactly the 50 of the unchanged policy's limit are admitted.
pub(crate) async fn reload_under_load<B: Backend + Clone>(backend: B) {
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

/// Peeks consume nothing, a reset restores the full quota and lifts a ban (the layer's penalty box
/// on memory, Redis's own keys on Redis), all through the layer.
pub(crate) async fn peek_and_reset_through_the_layer<B: Backend + Clone>(backend: B) {
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

/// A peek shows every tier (each counts under limits of its own) and every limit of a stack; a
/// reset forgets the key in all of them.
pub(crate) async fn tiers_and_stacks<B: Backend + Clone>(backend: B) {
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

/// The `RateLimit-Policy` field of `api`: 50, refilling one an hour (a window of 50 hours).
pub(crate) const API_FIELD: &str = r#""api";q=50;w=180000"#;

pub(crate) fn policy(name: &str, route: &str, quota: Quota) -> Policy<Header> {
    Policy::builder(name)
        .route(route)
        .quota(quota)
        .key(Header::new("x-user-id"))
        .build()
        .unwrap()
}

pub(crate) fn app<B: Backend + Clone>(layer: ThrottleLayer<Header, B>) -> Router {
    Router::new()
        .route("/api", get(|| async { "ok" }))
        .route("/other", get(|| async { "ok" }))
        .route("/extra", get(|| async { "ok" }))
        .layer(layer)
}

pub(crate) async fn get_as(app: &Router, path: &str, user: &str) -> http::Response<Body> {
    let request = Request::get(path)
        .header("x-user-id", user)
        .body(Body::empty())
        .unwrap();
    app.clone().oneshot(request).await.unwrap()
}
