//! 1,000 concurrent requests against a limit of 16 admit exactly 16.

use axum::body::Body;
use axum::routing::get;
use axum::Router;
use http::{Request, StatusCode};
use tower::ServiceExt;
use tower_throttle::key::Header;
use tower_throttle::{Policy, Quota, ThrottleLayer};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_thousand_concurrent_requests_admit_exactly_the_limit() {
    let policy = Policy::builder("burst")
        // Limit 16, refilling one an hour: no refill during the test.
        .quota(Quota::per_hour(1).with_max_burst(15))
        .key(Header::new("x-user-id"))
        .build()
        .unwrap();
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(ThrottleLayer::new(policy));
    let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(1_000));
    let tasks: Vec<_> = (0..1_000)
        .map(|_| {
            let (app, barrier) = (app.clone(), barrier.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                let req = Request::get("/")
                    .header("x-user-id", "7")
                    .body(Body::empty())
                    .unwrap();
                app.oneshot(req).await.unwrap().status()
            })
        })
        .collect();
    let mut ok = 0;
    let mut limited = 0;
    for t in tasks {
        match t.await.unwrap() {
            StatusCode::OK => ok += 1,
            StatusCode::TOO_MANY_REQUESTS => limited += 1,
            other => panic!("unexpected {other}"),
        }
    }
    assert_eq!((ok, limited), (16, 984));
}

/// Only a request that holds a concurrency slot gives one back: a rate-limited request releases
/// nothing, and a concurrency-limited one releases its slot once, when its response ends; whether
/// the backend decides at once (memory) or later (as Redis does: the response future waits for
/// the decision, and the slot's release is made before it).
#[tokio::test]
async fn only_a_held_slot_is_given_back() {
    use std::future::Future;
    use std::pin::Pin;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::task::Poll;
    use tower_throttle::backend::{Adjustment, BackendError, Charges, Decisions};
    use tower_throttle::key::Global;
    use tower_throttle::{Algorithm, Backend, MemoryBackend};

    /// The memory backend, counting the slots given back; `deferred`: its decisions are pending
    /// when first polled.
    #[derive(Clone)]
    struct Counting {
        inner: MemoryBackend,
        releases: Arc<AtomicUsize>,
        deferred: bool,
    }

    type Deciding = Pin<Box<dyn Future<Output = Result<Decisions, BackendError>> + Send>>;

    impl Backend for Counting {
        type Future = Deciding;

        fn check(&self, charges: Charges<'_>) -> Deciding {
            let decided = self.inner.check(charges);
            let mut pending = self.deferred;
            let mut decided = Box::pin(decided);
            Box::pin(std::future::poll_fn(move |cx| {
                if std::mem::take(&mut pending) {
                    cx.waker().wake_by_ref();
                    return Poll::Pending;
                }
                decided.as_mut().poll(cx)
            }))
        }

        fn adjust(&self, charges: Charges<'_>, adjustment: Adjustment<'_>) {
            if let Adjustment::Release { .. } = adjustment {
                self.releases.fetch_add(1, Ordering::SeqCst);
            }
            self.inner.adjust(charges, adjustment);
        }
    }

    let releases_after = |algorithm: Algorithm, deferred: bool, near: Option<f64>| {
        let releases = Arc::new(AtomicUsize::new(0));
        let backend = Counting {
            inner: MemoryBackend::new(),
            releases: releases.clone(),
            deferred,
        };
        let mut policy = Policy::builder("api")
            .key(Global)
            .quota(Quota::per_second(100))
            .algorithm(algorithm);
        if let Some(ratio) = near {
            policy = policy.near_limit(ratio);
        }
        let policy = policy.build().unwrap();
        let layer = ThrottleLayer::builder()
            .backend(backend)
            .policy(policy)
            .build()
            .unwrap();
        let app = Router::new()
            .route("/", get(|| async { "ok" }))
            .layer(layer);
        async move {
            for _ in 0..3 {
                let response = app
                    .clone()
                    .oneshot(Request::get("/").body(Body::empty()).unwrap());
                let response = response.await.unwrap();
                assert_eq!(response.status(), StatusCode::OK);
                // The slot is held by the body until it ends.
                let _ = http_body_util::BodyExt::collect(response.into_body()).await;
            }
            releases.load(Ordering::SeqCst)
        }
    };
    // `near`: a near-limit rule, which no request comes near, makes every admission one the judge
    // makes a verdict for (not a plain one): still no slot for a rate-limited request.
    for deferred in [false, true] {
        for near in [None, Some(0.9)] {
            let gcra = releases_after(Algorithm::Gcra, deferred, near).await;
            assert_eq!(gcra, 0, "rate-limited, decided later: {deferred}, {near:?}");
            let concurrency = releases_after(Algorithm::Concurrency, deferred, near).await;
            assert_eq!(
                concurrency, 3,
                "concurrency-limited, decided later: {deferred}, {near:?}"
            );
        }
    }
}

/// A concurrency limit's 429 tells the client no sooner a reset than its `Retry-After`: `t=0`
/// (or `X-RateLimit-Reset: 0`) reads as "the quota is back now", and a client that follows the
/// fields would retry at once.
#[tokio::test]
async fn a_concurrency_refusal_resets_no_sooner_than_it_retries() {
    use std::sync::Arc;
    use tokio::sync::Notify;
    use tower_throttle::Algorithm;

    let policy = Policy::builder("uploads")
        .quota(Quota::per_second(1))
        .algorithm(Algorithm::Concurrency)
        .key(Header::new("x-user-id"))
        .build()
        .unwrap();
    let done = Arc::new(Notify::new());
    let held = done.clone();
    let app = Router::new()
        .route(
            "/",
            get(move || {
                let held = held.clone();
                async move { held.notified().await }
            }),
        )
        .layer(
            ThrottleLayer::builder()
                .policy(policy)
                .legacy_headers(true)
                .build()
                .unwrap(),
        );
    let request = || {
        let request = Request::get("/").header("x-user-id", "7");
        request.body(Body::empty()).unwrap()
    };
    let first = tokio::spawn(app.clone().oneshot(request()));
    tokio::task::yield_now().await;
    let refused = app.oneshot(request()).await.unwrap();
    done.notify_one();
    assert_eq!(first.await.unwrap().unwrap().status(), StatusCode::OK);
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    let field = |name: &str| refused.headers()[name].to_str().unwrap().to_owned();
    assert_eq!(field("retry-after"), "1");
    assert_eq!(field("ratelimit"), "\"uploads\";r=0;t=1");
    assert_eq!(field("x-ratelimit-reset"), "1");
}
