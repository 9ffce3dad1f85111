//! Overrides and timed bans through the layer: a key's own quota, unlimited, blocked, patterns, the
//! policy-wide `*`, and a ban with an exact `Retry-After`. Shared by `tests/middleware/overrides.rs`
//! (memory) and `tests/http/overrides_on_redis.rs` (Redis, where two layers stand for two
//! processes).

use std::time::{Duration, Instant};

use axum::body::Body;
use axum::routing::get;
use axum::Router;
use http::{Request, StatusCode};
use tower::ServiceExt;
use tower_throttle::key::Header;
use tower_throttle::ops::{Override, ThrottleHandle};
use tower_throttle::{Backend, Policy, Quota, ThrottleLayer};

/// An app of one policy, `api`: 2 a minute per `x-user`; and its handle.
pub fn app<B: Backend>(backend: B) -> (Router, ThrottleHandle<Header, B>) {
    app_of(backend, Policy::builder("api").quota(Quota::per_minute(2)))
}

/// An app of one policy, `policy` keyed by `x-user`, on `/`; and its handle.
fn app_of<B: Backend>(
    backend: B,
    policy: tower_throttle::PolicyBuilder<tower_throttle::policy::NoKey>,
) -> (Router, ThrottleHandle<Header, B>) {
    let policy = policy.key(Header::new("x-user")).build().unwrap();
    let layer = ThrottleLayer::builder()
        .backend(backend)
        .policy(policy)
        .build()
        .unwrap();
    let handle = layer.handle();
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer);
    (app, handle)
}

/// One request of `user`: its status and `Retry-After`.
pub async fn send(app: &Router, user: &str) -> (StatusCode, Option<u64>) {
    let request = Request::get("/")
        .header("x-user", user)
        .body(Body::empty())
        .unwrap();
    let response = app.clone().oneshot(request).await.unwrap();
    let retry = response
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap().parse().unwrap());
    (response.status(), retry)
}

/// How many of `n` requests of `user` pass.
pub async fn passed(app: &Router, user: &str, n: usize) -> usize {
    let mut ok = 0;
    for _ in 0..n {
        ok += usize::from(send(app, user).await.0 == StatusCode::OK);
    }
    ok
}

/// Every override and the ban, on one layer.
pub async fn overrides_and_bans_apply<B: Backend>(backend: B) {
    let (app, handle) = app(backend);
    // Unlimited lets a refused key through at once.
    assert_eq!(passed(&app, "bob", 3).await, 2);
    handle
        .set_override("api", "bob", Override::Unlimited)
        .await
        .unwrap();
    assert_eq!(passed(&app, "bob", 20).await, 20);
    // A key's own quota: 5 a minute in place of 2.
    let five = Override::Quota(Quota::per_minute(5));
    handle.set_override("api", "carol", five).await.unwrap();
    assert_eq!(passed(&app, "carol", 8).await, 5);
    assert_eq!(
        handle.peek("api", "carol").await.unwrap().override_in_force,
        Some(five)
    );
    assert_eq!(
        handle.peek("api", "carol").await.unwrap().summary().limit,
        5
    );
    // A pattern: every matching key, and no other.
    handle
        .set_override("api", "premium_*", Override::Unlimited)
        .await
        .unwrap();
    for user in ["premium_a", "premium_b", "premium_"] {
        assert_eq!(passed(&app, user, 5).await, 5, "{user}");
    }
    assert_eq!(passed(&app, "premiu", 5).await, 2);
    // Blocked: 403, as a deny list answers.
    handle
        .set_override("api", "mallory", Override::Blocked)
        .await
        .unwrap();
    assert_eq!(send(&app, "mallory").await.0, StatusCode::FORBIDDEN);
    // The policy-wide `*`: every other key's quota; a key's own override still wins.
    let ten = Override::Quota(Quota::per_minute(10));
    handle.set_override("api", "*", ten).await.unwrap();
    assert_eq!(passed(&app, "dave", 12).await, 10);
    assert_eq!(passed(&app, "premium_c", 12).await, 12);
    handle.remove_override("api", "*").await.unwrap();
    assert_eq!(passed(&app, "erin", 4).await, 2);
    let mut listed: Vec<String> = handle
        .overrides("api")
        .unwrap()
        .into_iter()
        .map(|(k, _)| k)
        .collect();
    listed.sort();
    assert_eq!(listed, ["bob", "carol", "mallory", "premium_*"]);
    // A 2 s ban: refused with Retry-After 2, before the key's unlimited override; passes after.
    handle
        .ban("api", "bob", Duration::from_secs(2))
        .await
        .unwrap();
    let banned_at = Instant::now();
    assert_eq!(
        send(&app, "bob").await,
        (StatusCode::TOO_MANY_REQUESTS, Some(2))
    );
    assert_eq!(handle.bans("api").unwrap().len(), 1);
    while banned_at.elapsed() < Duration::from_millis(2_100) {
        let (status, _) = send(&app, "bob").await;
        if banned_at.elapsed() < Duration::from_millis(1_900) {
            assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(passed(&app, "bob", 5).await, 5);
    assert!(handle.bans("api").unwrap().is_empty());
    // Lifted before its end.
    handle
        .ban("api", "frank", Duration::from_secs(3600))
        .await
        .unwrap();
    assert_eq!(send(&app, "frank").await.1, Some(3600));
    handle.lift_ban("api", "frank").await.unwrap();
    assert_eq!(send(&app, "frank").await.0, StatusCode::OK);
    // What cannot be: refused, nothing kept.
    assert!(handle
        .set_override("api", "a*b", Override::Blocked)
        .await
        .is_err());
    assert!(handle
        .set_override("nope", "a", Override::Blocked)
        .await
        .is_err());
    assert!(handle.ban("api", "a", Duration::ZERO).await.is_err());
    let ages = Duration::from_secs(500_000 * 365 * 86_400);
    let longer = handle.ban("api", "a", ages).await.unwrap_err().to_string();
    assert!(longer.contains("at most 146 years"), "{longer}");
    let zero = Override::Quota(Quota::per_minute(0));
    assert!(handle.set_override("api", "a", zero).await.is_err());
    assert_eq!(handle.overrides("api").unwrap().len(), 4);
    // Messages inside a stream (`ThrottleHandle::check`) meet the same overrides and bans.
    for _ in 0..5 {
        assert!(handle.check("api", "premium_m", 1).await.unwrap().allowed);
    }
    let blocked = handle.check("api", "mallory", 1).await.unwrap();
    assert!(!blocked.allowed && blocked.retry_after.is_none());
    handle
        .ban("api", "gina", Duration::from_secs(60))
        .await
        .unwrap();
    let banned = handle.check("api", "gina", 1).await.unwrap();
    assert!(!banned.allowed && banned.retry_after.unwrap() <= Duration::from_secs(60));
    let four = Override::Quota(Quota::per_minute(4));
    handle.set_override("api", "hal", four).await.unwrap();
    let mut allowed = 0;
    for _ in 0..6 {
        allowed += usize::from(handle.check("api", "hal", 1).await.unwrap().allowed);
    }
    assert_eq!(allowed, 4);
}

/// A concurrency policy whose key has its own quota: each request's slot is given back under the
/// override's limit it was taken under, so requests one after another all pass, however many.
pub async fn an_overridden_concurrency_slot_is_given_back<B: Backend>(backend: B) {
    let policy = Policy::builder("api")
        .quota(Quota::per_second(5))
        .algorithm(tower_throttle::Algorithm::Concurrency);
    let (app, handle) = app_of(backend, policy);
    let one = Override::Quota(Quota::per_second(1));
    handle.set_override("api", "alice", one).await.unwrap();
    // Each response is dropped before the next request is sent.
    assert_eq!(passed(&app, "alice", 4).await, 4);
    assert_eq!(passed(&app, "bob", 7).await, 7);
}
