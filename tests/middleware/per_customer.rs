//! Limits per customer through the layer: a quota from the request (a closure, and an async
//! resolver that may fail or be slow), async keys (validated first, or from an axum extractor).

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::FromRequestParts;
use axum::{routing::get, Router};
use http::request::Parts;
use tower::ServiceExt;

use crate::support::{body_string, header, request};
use tower_throttle::key::{AsyncKey, Header};
use tower_throttle::{Key, MemoryBackend, Policy, PolicyBuilder, Quota, ThrottleLayer};

/// How many of `n` requests from `user` pass, in turn.
async fn passes(app: &Router, user: &str, n: u32) -> u32 {
    let mut passed = 0;
    for _ in 0..n {
        let mut r = request("/");
        r.headers_mut().insert("x-user-id", user.parse().unwrap());
        if app.clone().oneshot(r).await.unwrap().status() == 200 {
            passed += 1;
        }
    }
    passed
}

fn app(policy: Policy<Header>) -> Router {
    app_of(ThrottleLayer::new(policy))
}

fn app_of<B: tower_throttle::Backend>(layer: ThrottleLayer<Header, B>) -> Router {
    Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer)
}

/// "api": 2 a minute by default, keyed by `x-user-id`.
fn api() -> PolicyBuilder<Header> {
    Policy::builder("api")
        .key(Header::new("x-user-id"))
        .quota(Quota::per_minute(2))
}

#[tokio::test]
async fn two_customers_on_two_plans_get_their_own_quota_from_a_closure() {
    let policy = api()
        .quota_from(|_parts: &Parts, key: &Key| {
            key.to_string()
                .starts_with("pro-")
                .then(|| Quota::per_minute(5))
        })
        .build()
        .unwrap();
    let app = app(policy);
    assert_eq!(passes(&app, "free-1", 10).await, 2);
    assert_eq!(passes(&app, "pro-1", 10).await, 5);
    // State is per key: another customer of either plan starts full.
    assert_eq!(passes(&app, "pro-2", 10).await, 5);
    assert_eq!(passes(&app, "free-2", 10).await, 2);
    // The fields name the quota that applied.
    let mut r = request("/");
    r.headers_mut()
        .insert("x-user-id", "pro-3".parse().unwrap());
    let res = app.clone().oneshot(r).await.unwrap();
    assert_eq!(header(&res, "ratelimit-policy"), Some(r#""api";q=5;w=60"#));
}

#[tokio::test]
async fn a_plan_from_an_extension_set_by_the_authentication_layer() {
    #[derive(Clone, Copy)]
    struct Plan(u64);
    let policy = api()
        .quota_from(|parts: &Parts, _: &Key| {
            parts
                .extensions
                .get::<Plan>()
                .map(|p| Quota::per_minute(p.0))
        })
        .build()
        .unwrap();
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(ThrottleLayer::new(policy))
        .layer(axum::middleware::from_fn(
            |mut req: axum::extract::Request, next: axum::middleware::Next| async move {
                let user = req.headers()["x-user-id"].to_str().unwrap().to_owned();
                if user == "big" {
                    req.extensions_mut().insert(Plan(7));
                }
                next.run(req).await
            },
        ));
    assert_eq!(passes(&app, "big", 10).await, 7);
    assert_eq!(passes(&app, "small", 10).await, 2);
}

#[tokio::test]
async fn an_async_resolver_is_asked_and_its_failures_get_the_default_quota() {
    let asked = Arc::new(AtomicU32::new(0));
    let counter = asked.clone();
    let policy = api()
        .quota_resolver(move |_: &Parts, key: &Key| {
            counter.fetch_add(1, Ordering::SeqCst);
            let customer = key.to_string();
            async move {
                // The plans table, a little slow.
                tokio::time::sleep(Duration::from_millis(5)).await;
                match customer.as_str() {
                    "broken" => Err("the plans database is down".into()),
                    "slow" => {
                        tokio::time::sleep(Duration::from_secs(5)).await;
                        Ok(Some(Quota::per_minute(50)))
                    }
                    c if c.starts_with("pro") => Ok(Some(Quota::per_minute(4))),
                    _ => Ok::<_, Box<dyn std::error::Error + Send + Sync>>(None),
                }
            }
        })
        .resolver_timeout(Duration::from_millis(50))
        .build()
        .unwrap();
    let app = app(policy);
    assert_eq!(passes(&app, "pro-a", 6).await, 4);
    assert_eq!(passes(&app, "free-a", 6).await, 2);
    assert_eq!(asked.load(Ordering::SeqCst), 12, "asked for every request");
    // A failing or slow resolver neither lifts the limit nor stops the API: the default applies.
    assert_eq!(passes(&app, "broken", 4).await, 2);
    let started = std::time::Instant::now();
    assert_eq!(passes(&app, "slow", 3).await, 2);
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "each waited the timeout, not the resolver: {:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn a_quota_that_cannot_be_enforced_falls_back_to_the_default() {
    let policy = api()
        .cost(2)
        .quota_from(|_: &Parts, key: &Key| match key.to_string().as_str() {
            "zero" => Some(Quota::per_minute(0)),
            "tiny" => Some(Quota::per_minute(1)),
            _ => None,
        })
        .build()
        .unwrap();
    let app = app(policy);
    // Cost 2 under the default (2 a minute): one request.
    assert_eq!(passes(&app, "zero", 3).await, 1);
    assert_eq!(passes(&app, "tiny", 3).await, 1);
}

#[tokio::test]
async fn a_changed_plan_keeps_the_keys_state_rebased_on_the_new_quota() {
    let plan = Arc::new(AtomicU32::new(2));
    let current = plan.clone();
    let policy = api()
        .quota_from(move |_: &Parts, _: &Key| {
            Some(Quota::per_minute(current.load(Ordering::SeqCst).into()))
        })
        .build()
        .unwrap();
    let (backend, clock) = crate::support::backend();
    let app = Router::new().route("/", get(|| async { "ok" })).layer(
        ThrottleLayer::builder()
            .backend(backend)
            .policy(policy)
            .build()
            .unwrap(),
    );
    assert_eq!(passes(&app, "u", 5).await, 2);
    // Upgraded from 2 to 10 a minute. The GCRA keeps the key's backlog (a minute: a full bucket
    // under either quota), and drains it at the new rate: 2 more after 12 s, where the old plan
    // would have given none.
    plan.store(10, Ordering::SeqCst);
    assert_eq!(passes(&app, "u", 5).await, 0);
    clock.advance(Duration::from_secs(12));
    assert_eq!(passes(&app, "u", 5).await, 2);
    // Another key on the same plan starts full.
    assert_eq!(passes(&app, "v", 12).await, 10);
}

#[tokio::test]
async fn an_async_key_is_validated_before_it_is_counted() {
    let key = AsyncKey::new(|parts: &Parts| {
        let api_key = parts
            .headers
            .get("x-api-key")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        async move {
            tokio::time::sleep(Duration::from_millis(2)).await;
            let api_key = api_key?;
            match api_key.as_str() {
                "live_slow" => {
                    tokio::time::sleep(Duration::from_secs(5)).await;
                    Some(Key::from(api_key))
                }
                k if k.starts_with("live_") => Some(Key::from(api_key)),
                _ => None,
            }
        }
    })
    .describe("a known x-api-key")
    .timeout(Duration::from_millis(50));
    let policy = Policy::builder("api")
        .quota(Quota::per_minute(2))
        .async_key(key)
        .build()
        .unwrap();
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(ThrottleLayer::new(policy));
    let send = |api_key: Option<&'static str>| {
        let app = app.clone();
        async move {
            let mut r = request("/");
            if let Some(k) = api_key {
                r.headers_mut().insert("x-api-key", k.parse().unwrap());
            }
            app.oneshot(r).await.unwrap()
        }
    };
    assert_eq!(send(Some("live_a")).await.status(), 200);
    assert_eq!(send(Some("live_a")).await.status(), 200);
    assert_eq!(send(Some("live_a")).await.status(), 429);
    assert_eq!(send(Some("live_b")).await.status(), 200);
    // Unknown or missing: the missing-key answer, naming what was expected.
    let unknown = send(Some("stolen")).await;
    assert_eq!(unknown.status(), 400);
    assert!(body_string(unknown)
        .await
        .contains("expected a known x-api-key"));
    assert_eq!(send(None).await.status(), 400);
    // Too slow: the application's key service is late, not the client wrong: the failure policy
    // answers (the default, allow, lets it through unlimited).
    for _ in 0..3 {
        assert_eq!(send(Some("live_slow")).await.status(), 200);
    }
}

/// Under `OnBackendError::Deny`, a key that does not come in time is a 503, not a 400.
#[tokio::test]
async fn a_late_async_key_follows_the_failure_policy() {
    let key = AsyncKey::new(|_: &Parts| async {
        tokio::time::sleep(Duration::from_secs(5)).await;
        Some(Key::from("late"))
    })
    .timeout(Duration::from_millis(20));
    let policy = Policy::builder("api")
        .quota(Quota::per_minute(2))
        .async_key(key)
        .build()
        .unwrap();
    let layer = ThrottleLayer::builder()
        .policy(policy)
        .on_backend_error(tower_throttle::OnBackendError::Deny)
        .build()
        .unwrap();
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer);
    let response = app.oneshot(request("/")).await.unwrap();
    assert_eq!(response.status(), 503);
    assert_eq!(header(&response, "retry-after"), Some("1"));
}

/// The application's own extractor: the signed-in user, from a session header.
struct User(String);

impl<S: Sync> FromRequestParts<S> for User {
    type Rejection = http::StatusCode;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        tokio::time::sleep(Duration::from_millis(1)).await;
        let session = parts.headers.get("x-session").and_then(|v| v.to_str().ok());
        match session {
            Some(s) if s.starts_with("valid:") => Ok(User(s["valid:".len()..].to_owned())),
            _ => Err(http::StatusCode::UNAUTHORIZED),
        }
    }
}

#[tokio::test]
async fn keys_from_an_axum_extractor_the_app_already_has() {
    let policy = Policy::builder("api")
        .quota(Quota::per_minute(1))
        .async_key(AsyncKey::from_extractor(|User(name): User| {
            Some(Key::from(name))
        }))
        .build()
        .unwrap();
    let app = Router::new().route("/", get(|| async { "ok" })).layer(
        ThrottleLayer::builder()
            .backend(MemoryBackend::new())
            .policy(policy)
            .build()
            .unwrap(),
    );
    let send = |session: &'static str| {
        let app = app.clone();
        async move {
            let mut r = request("/");
            r.headers_mut()
                .insert("x-session", session.parse().unwrap());
            app.oneshot(r).await.unwrap().status()
        }
    };
    assert_eq!(send("valid:alice").await, 200);
    assert_eq!(send("valid:alice").await, 429);
    // Another session of the same user is the same key; another user is not.
    assert_eq!(send("valid:alice").await, 429);
    assert_eq!(send("valid:bob").await, 200);
    assert_eq!(send("forged").await, 400);
}

#[test]
fn per_customer_settings_are_checked_when_the_policy_is_built() {
    let err = |b: PolicyBuilder<Header>| b.build().unwrap_err().to_string();
    let both = api()
        .quota_from(|_: &Parts, _: &Key| None)
        .quota_resolver(|_: &Parts, _: &Key| async { Ok::<_, std::io::Error>(None) });
    assert!(err(both).contains("use one"));
    assert!(err(api().resolver_timeout(Duration::from_millis(5))).contains("no quota_resolver"));
    let instant = AsyncKey::new(|_: &Parts| async { None }).timeout(Duration::ZERO);
    assert!(err(api().async_key(instant)).contains("timeout must be more than 0"));
}

/// A per-customer quota the backend cannot enforce (its `validate` refuses the limit) falls back
/// to the policy's own quota, as one that is invalid does.
#[tokio::test]
async fn a_quota_the_backend_refuses_falls_back_to_the_default() {
    use tower_throttle::backend::{Charges, Uses};
    use tower_throttle::{Backend, BuildError, Limit};

    /// Memory, refusing limits of more than 50 a period.
    struct AtMost50(MemoryBackend);

    impl Backend for AtMost50 {
        type Future = <MemoryBackend as Backend>::Future;

        fn check(&self, charges: Charges<'_>) -> Self::Future {
            self.0.check(charges)
        }

        fn validate(&self, limits: &[Limit], uses: Uses) -> Result<(), BuildError> {
            match limits.iter().any(|l| l.quota().count() > 50) {
                true => Err(BuildError::Invalid("at most 50 here".into())),
                false => self.0.validate(limits, uses),
            }
        }
    }

    let policy = api()
        .quota_from(|_: &Parts, key: &Key| match key.to_string().as_str() {
            "big" => Some(Quota::per_minute(100)),
            "small" => Some(Quota::per_minute(5)),
            _ => None,
        })
        .build()
        .unwrap();
    let layer = tower_throttle::ThrottleLayerBuilder::with_backend(AtMost50(MemoryBackend::new()))
        .policy(policy)
        .build()
        .unwrap();
    let app = app_of(layer);
    assert_eq!(
        passes(&app, "small", 7).await,
        5,
        "a quota it can enforce applies"
    );
    assert_eq!(
        passes(&app, "big", 4).await,
        2,
        "one it cannot: the default, 2 a minute"
    );
}
