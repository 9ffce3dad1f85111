//! The layer's modes and policy shapes, in memory: delay, dry run, concurrency slots (released
//! however a request ends), stacked quotas, tiers, and their TOML.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::support::*;
use axum::routing::get;
use axum::{Extension, Router};
use http::StatusCode;
use tower::ServiceExt;
use tower_throttle::key::{Global, Header};
use tower_throttle::{
    policy::{PolicyDecision, Tier},
    Algorithm, Policy, Quota, ThrottleLayer,
};

/// `policy` on `backend`, with the layer's defaults.
fn layer_of<K, B: tower_throttle::Backend>(backend: B, policy: Policy<K>) -> ThrottleLayer<K, B> {
    ThrottleLayer::builder()
        .backend(backend)
        .policy(policy)
        .build()
        .unwrap()
}

/// An app that answers "ok" at `/`, behind `layer`.
fn answering_ok<K, B>(layer: ThrottleLayer<K, B>) -> Router
where
    K: tower_throttle::key::KeyExtractor<axum::body::Body>,
    B: tower_throttle::Backend,
{
    Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer)
}

/// A handler that answers with what the layer decided: "allowed remaining enforced delayed_ms".
async fn show(Extension(d): Extension<PolicyDecision>) -> String {
    format!(
        "{} {} {} {}",
        d.decision.allowed,
        d.decision.remaining,
        d.enforced,
        d.delayed.as_millis()
    )
}

#[tokio::test(start_paused = true)]
async fn delay_mode_waits_for_the_slot_instead_of_rejecting() {
    let (backend, clock) = backend();
    // Bursts of 2, one more every 500 ms, and up to 2 s of waiting.
    let policy = Policy::builder("slow")
        .quota(Quota::per_second(2))
        .delay(Duration::from_secs(2))
        .key(Global)
        .build()
        .unwrap();
    let layer = layer_of(backend, policy);
    let app = Router::new()
        .route("/", get(show))
        .layer(layer)
        .route("/free", get(|| async { "free" }));

    // The memory backend's clock stands still; tokio's (paused) clock runs the waits.
    let timed = |app: Router| async move {
        let started = tokio::time::Instant::now();
        let res = app.oneshot(request("/")).await.unwrap();
        let status = res.status();
        let retry = header(&res, "retry-after").map(str::to_owned);
        (status, body_string(res).await, started.elapsed(), retry)
    };
    for _ in 0..2 {
        let (status, body, waited, _) = timed(app.clone()).await;
        assert_eq!(status, StatusCode::OK);
        assert!(body.ends_with(" true 0"), "{body}");
        assert_eq!(waited, Duration::ZERO);
    }
    for n in 1..=4u64 {
        let (status, body, waited, _) = timed(app.clone()).await;
        assert_eq!(status, StatusCode::OK, "delayed request {n}");
        assert_eq!(body, format!("true 0 true {}", n * 500));
        assert_eq!(waited, Duration::from_millis(n * 500));
    }
    // Beyond the burst and the delay: rejected at once.
    let (status, _, waited, retry) = timed(app.clone()).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(waited, Duration::ZERO);
    assert_eq!(retry.as_deref(), Some("1"));

    // A waiting request holds no thread: on this single-threaded runtime another request is
    // answered while it waits.
    clock.advance(Duration::from_secs(3));
    for _ in 0..2 {
        assert_eq!(timed(app.clone()).await.0, StatusCode::OK);
    }
    let waiting = tokio::spawn(timed(app.clone()));
    tokio::task::yield_now().await;
    let free = app.clone().oneshot(request("/free")).await.unwrap();
    assert_eq!(free.status(), StatusCode::OK);
    assert!(!waiting.is_finished());
    let (status, body, waited, _) = waiting.await.unwrap();
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body, "true 0 true 500");
    assert_eq!(waited, Duration::from_millis(500));

    // Each wait took its slot once: after 3 s (6 slots) more, the burst is whole again and the
    // next delay is exactly one interval.
    clock.advance(Duration::from_secs(3) / 2);
    for _ in 0..2 {
        assert_eq!(timed(app.clone()).await.2, Duration::ZERO);
    }
    assert_eq!(timed(app.clone()).await.2, Duration::from_millis(500));
}

/// Delay mode counts what remains against the quota's own burst, not against the wait it allows
/// on top: a burst's requests show the fields they show without delay mode, and a request that
/// waits shows none left.
#[tokio::test(start_paused = true)]
async fn delay_mode_shows_what_remains_of_the_quota_not_of_the_wait() {
    let fields = |delay: Option<Duration>| async move {
        let (backend, _clock) = backend();
        let mut policy = Policy::builder("slow")
            .quota(Quota::per_second(4))
            .key(Global);
        if let Some(delay) = delay {
            policy = policy.delay(delay);
        }
        let app = answering_ok(layer_of(backend, policy.build().unwrap()));
        let mut shown = Vec::new();
        for n in 0..5 {
            let res = app.clone().oneshot(request("/")).await.unwrap();
            shown.push((res.status(), header(&res, "ratelimit").map(str::to_owned)));
            assert!(shown[n].1.is_some(), "request {n}: {:?}", shown[n]);
        }
        shown
    };
    let plain = fields(None).await;
    let delaying = fields(Some(Duration::from_secs(2))).await;
    // The burst of 4: the same fields, what remains going down to none.
    assert_eq!(delaying[..4], plain[..4]);
    let remaining: Vec<_> = plain[..4]
        .iter()
        .map(|(_, field)| field.as_deref().unwrap().split(';').nth(1).unwrap())
        .collect();
    assert_eq!(remaining, ["r=3", "r=2", "r=1", "r=0"]);
    // The fifth: refused without delay mode, admitted after a wait with it; nothing left either way.
    assert_eq!(plain[4].0, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(delaying[4].0, StatusCode::OK);
    assert!(
        delaying[4].1.as_deref().unwrap().contains(";r=0;"),
        "{:?}",
        delaying[4]
    );
}

/// A peek in delay mode shows what remains of the quota, as the fields do, not the wait's room.
#[tokio::test(start_paused = true)]
async fn a_peek_in_delay_mode_shows_what_remains_of_the_quota() {
    let (backend, _clock) = backend();
    let policy = Policy::builder("slow")
        .quota(Quota::per_second(4))
        .delay(Duration::from_secs(2))
        .key(Header::new("x-user"))
        .build()
        .unwrap();
    let layer = layer_of(backend, policy);
    let handle = layer.handle();
    let app = Router::new()
        .route("/items", get(|| async { "ok" }))
        .layer(layer);
    let remaining = || async {
        let state = handle.peek("slow", "ann").await.unwrap();
        let (_, state) = &state.tiers[0].limits[0];
        (state.limit, state.remaining)
    };
    assert_eq!(remaining().await, (4, 4));
    for n in 0..6 {
        let res = app.clone().oneshot(from_user("ann")).await.unwrap();
        assert_eq!(res.status(), StatusCode::OK, "request {n}");
    }
    // Four of the burst and two that waited: nothing left of the quota.
    assert_eq!(remaining().await, (4, 0));
}

#[test]
fn delay_mode_is_refused_for_window_algorithms() {
    let err = Policy::builder("w")
        .key(tower_throttle::key::PeerIp::new())
        .quota(Quota::per_second(2))
        .algorithm(Algorithm::FixedWindow)
        .delay(Duration::from_secs(1))
        .build()
        .unwrap_err();
    assert!(
        err.to_string().contains("needs algorithm \"gcra\""),
        "{err}"
    );
}

#[tokio::test]
async fn dry_run_decides_and_reports_but_never_rejects() {
    let (backend, _clock) = backend();
    let policy = Policy::builder("trial")
        .quota(Quota::per_minute(1))
        .key(Global)
        .dry_run(true)
        .build()
        .unwrap();
    let layer = layer_of(backend, policy);
    let app = Router::new().route("/", get(show)).layer(layer);
    let first = app.clone().oneshot(request("/")).await.unwrap();
    assert_eq!(first.status(), StatusCode::OK);
    assert_eq!(body_string(first).await, "true 0 false 0");
    for _ in 0..3 {
        let res = app.clone().oneshot(request("/")).await.unwrap();
        assert_eq!(res.status(), StatusCode::OK);
        assert_eq!(header(&res, "retry-after"), None);
        assert_eq!(header(&res, "ratelimit"), Some(r#""trial";r=0;t=60"#));
        // The handler sees that this request would have been limited.
        assert_eq!(body_string(res).await, "false 0 false 0");
    }
}

/// A handler that holds its request until the test lets it go, counting the requests inside.
#[derive(Clone)]
struct Gate {
    inside: Arc<AtomicUsize>,
    open: Arc<tokio::sync::Semaphore>,
}

impl Default for Gate {
    fn default() -> Self {
        Gate {
            inside: Arc::default(),
            open: Arc::new(tokio::sync::Semaphore::new(0)),
        }
    }
}

impl Gate {
    fn router(&self, policy: Policy<Global>) -> Router {
        let (backend, _) = backend();
        let layer = layer_of(backend, policy);
        let gate = self.clone();
        Router::new()
            .route(
                "/",
                get(move || {
                    let gate = gate.clone();
                    async move {
                        gate.inside.fetch_add(1, Ordering::SeqCst);
                        gate.open.acquire().await.unwrap().forget();
                        "done"
                    }
                }),
            )
            .layer(layer)
    }

    /// Waits until `n` requests have entered the handler, for 10 s at most: a pipeline that never
    /// lets them in fails here instead of hanging.
    async fn until_inside(&self, n: usize) {
        let inside = async {
            while self.inside.load(Ordering::SeqCst) < n {
                tokio::task::yield_now().await;
            }
        };
        let waited = tokio::time::timeout(std::time::Duration::from_secs(10), inside).await;
        assert!(waited.is_ok(), "{n} requests never all reached the handler");
    }
}

fn two_in_flight() -> Policy<Global> {
    Policy::builder("downloads")
        .quota(Quota::per_second(2))
        .algorithm(Algorithm::Concurrency)
        .key(Global)
        .build()
        .unwrap()
}

#[tokio::test]
async fn concurrency_slots_are_given_back_however_the_request_ends() {
    let gate = Gate::default();
    let app = gate.router(two_in_flight());
    let first = tokio::spawn(app.clone().oneshot(request("/")));
    let second = tokio::spawn(app.clone().oneshot(request("/")));
    gate.until_inside(2).await;
    let third = app.clone().oneshot(request("/")).await.unwrap();
    assert_eq!(third.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&third, "retry-after"), Some("1"));
    assert_eq!(
        header(&third, "ratelimit-policy"),
        Some(r#""downloads";q=2"#)
    );

    // Cancelled while the handler runs: the slot comes back.
    second.abort();
    assert!(second.await.unwrap_err().is_cancelled());
    let replacement = tokio::spawn(app.clone().oneshot(request("/")));
    gate.until_inside(3).await;

    // Answered, but the body is not read yet: the slot is still held...
    gate.open.add_permits(1);
    let answered = first.await.unwrap().unwrap();
    assert_eq!(answered.status(), StatusCode::OK);
    let refused = app.clone().oneshot(request("/")).await.unwrap();
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    // ...until the body has been sent.
    assert_eq!(body_string(answered).await, "done");
    let admitted = tokio::spawn(app.clone().oneshot(request("/")));
    gate.until_inside(4).await;

    // A response dropped unread gives its slot back too.
    gate.open.add_permits(1);
    let dropped = replacement.await.unwrap().unwrap();
    drop(dropped);
    let last = tokio::spawn(app.clone().oneshot(request("/")));
    gate.until_inside(5).await;
    gate.open.add_permits(2);
    for handle in [admitted, last] {
        let res = handle.await.unwrap().unwrap();
        assert_eq!(res.status(), StatusCode::OK);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrency_never_admits_more_than_the_limit_under_load() {
    let (backend, _) = backend();
    let layer = ThrottleLayer::builder()
        .backend(backend)
        .policy(
            Policy::builder("busy")
                .quota(Quota::per_second(3))
                .algorithm(Algorithm::Concurrency)
                .key(Global)
                .build()
                .unwrap(),
        )
        .build()
        .unwrap();
    let current = Arc::new(AtomicUsize::new(0));
    let peak = Arc::new(AtomicUsize::new(0));
    let (c, p) = (current.clone(), peak.clone());
    // After the load, requests to `/held` stay inside until the gate opens.
    let gate = Gate::default();
    let g = gate.clone();
    let app = Router::new()
        .route(
            "/held",
            get(move || {
                let gate = g.clone();
                async move {
                    gate.inside.fetch_add(1, Ordering::SeqCst);
                    gate.open.acquire().await.unwrap().forget();
                    "held"
                }
            }),
        )
        .route(
            "/",
            get(move || {
                let (current, peak) = (c.clone(), p.clone());
                async move {
                    let now = current.fetch_add(1, Ordering::SeqCst) + 1;
                    peak.fetch_max(now, Ordering::SeqCst);
                    for _ in 0..20 {
                        tokio::task::yield_now().await;
                    }
                    current.fetch_sub(1, Ordering::SeqCst);
                    "done"
                }
            }),
        )
        .layer(layer);
    // 400 requests from 400 tasks on two threads: the handler never runs more than 3 at once.
    let tasks: Vec<_> = (0..400)
        .map(|_| {
            let app = app.clone();
            tokio::spawn(async move {
                let res = app.oneshot(request("/")).await.unwrap();
                let status = res.status();
                body_string(res).await;
                status
            })
        })
        .collect();
    let mut admitted = 0;
    for task in tasks {
        match task.await.unwrap() {
            StatusCode::OK => admitted += 1,
            other => assert_eq!(other, StatusCode::TOO_MANY_REQUESTS),
        }
    }
    assert!(peak.load(Ordering::SeqCst) <= 3, "{peak:?} in flight");
    assert!(admitted >= 3, "{admitted}");
    // Every slot of the busy app came back: three held at once pass, a fourth does not. (A
    // leaked slot would refuse one of the three: it finishes without ever getting inside.)
    let held: Vec<_> = (0..3)
        .map(|_| tokio::spawn(app.clone().oneshot(request("/held"))))
        .collect();
    while gate.inside.load(Ordering::SeqCst) < 3 {
        assert!(
            !held.iter().any(|h| h.is_finished()),
            "a slot was not given back after the load"
        );
        tokio::task::yield_now().await;
    }
    let refused = app.clone().oneshot(request("/held")).await.unwrap();
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    gate.open.add_permits(3);
    for h in held {
        let res = h.await.unwrap().unwrap();
        assert_eq!(res.status(), StatusCode::OK);
        assert_eq!(body_string(res).await, "held");
    }
}

#[tokio::test]
async fn stacked_quotas_must_all_pass_and_a_rejection_consumes_none() {
    let (backend, clock) = backend();
    let policy = Policy::builder("api")
        .quotas([Quota::per_second(2), Quota::per_minute(3)])
        .key(Global)
        .build()
        .unwrap();
    let layer = ThrottleLayer::builder()
        .backend(backend)
        .policy(policy)
        .legacy_headers(true)
        .build()
        .unwrap();
    let app = answering_ok(layer);
    let send = || async { app.clone().oneshot(request("/")).await.unwrap() };
    let res = send().await;
    assert_eq!(
        header(&res, "ratelimit-policy"),
        Some(r#""api.1s";q=2;w=1, "api.1m";q=3;w=60"#)
    );
    assert_eq!(
        header(&res, "ratelimit"),
        Some(r#""api.1s";r=1;t=1, "api.1m";r=2;t=20"#)
    );
    assert_eq!(send().await.status(), StatusCode::OK);
    // The per-second quota rejects; the per-minute one keeps its last unit.
    let res = send().await;
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        header(&res, "ratelimit"),
        Some(r#""api.1s";r=0;t=1, "api.1m";r=1;t=40"#)
    );
    assert_eq!(header(&res, "x-ratelimit-remaining"), Some("0"));
    clock.advance(Duration::from_secs(1));
    assert_eq!(send().await.status(), StatusCode::OK);
    // Now the per-minute quota rejects, and says when.
    clock.advance(Duration::from_secs(1));
    let res = send().await;
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&res, "retry-after"), Some("18"));
}

#[tokio::test]
async fn tiers_choose_the_quota_per_request() {
    let (backend, _clock) = backend();
    let policy = Policy::builder("api")
        .quota(Quota::per_minute(1))
        .tier("paid", [Quota::per_minute(3)])
        .tier_header("x-plan")
        .key(Header::new("x-user"))
        .build()
        .unwrap();
    let layer = layer_of(backend, policy);
    let app = answering_ok(layer);
    let admitted =
        |user: &'static str, plan: &'static [&'static str], tier: Option<&'static str>| {
            let app = app.clone();
            async move {
                // A bound, not a loop: a broken pipeline that never refuses fails here, not by hanging.
                for n in 0..100 {
                    let mut req = from_user(user);
                    *req.uri_mut() = "/".parse().unwrap();
                    for plan in plan {
                        req.headers_mut().append("x-plan", plan.parse().unwrap());
                    }
                    if let Some(tier) = tier {
                        req.extensions_mut().insert(Tier::new(tier));
                    }
                    let res = app.clone().oneshot(req).await.unwrap();
                    if res.status() != StatusCode::OK {
                        assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
                        return (n, header(&res, "ratelimit-policy").map(str::to_owned));
                    }
                }
                panic!("{user}: 100 requests and none refused")
            }
        };
    assert_eq!(admitted("free", &[], None).await.0, 1);
    let (n, policy) = admitted("payer", &["paid"], None).await;
    assert_eq!(n, 3);
    assert_eq!(policy.as_deref(), Some(r#""api.paid";q=3;w=60"#));
    assert_eq!(admitted("app", &[], Some("paid")).await.0, 3);
    // The extension wins over the header; an unknown tier gets the default quota.
    assert_eq!(admitted("liar", &["paid"], Some("free")).await.0, 1);
    assert_eq!(admitted("gold", &["gold"], None).await.0, 1);
    // A header sent twice (the client's own before the one a gateway appends) names no tier.
    assert_eq!(admitted("twice", &["paid", "free"], None).await.0, 1);
}

#[tokio::test]
async fn every_new_key_works_from_the_config() {
    // "api" has no path, so it decides every request the others do not: it comes last.
    let config = tower_throttle::config::Config::from_toml(
        r#"
        [[route]]
        name = "search"
        path = "/search"
        key = "ip"
        algorithm = "sliding-log"
        count = 3
        period = "1m"

        [[route]]
        name = "downloads"
        path = "/download"
        key = "ip"
        algorithm = "concurrency"
        count = 2
        lease = "30s"

        [[route]]
        name = "slow"
        path = "/slow"
        key = "global"
        count = 5
        period = "1s"
        mode = "delay"
        max_delay = "2s"

        [[route]]
        name = "trial"
        path = "/trial"
        key = "global"
        algorithm = "fixed-window"
        count = 100
        period = "1m"
        mode = "dry-run"

        [[route]]
        name = "smooth"
        path = "/smooth"
        key = "global"
        algorithm = "sliding-window"
        count = 100
        period = "1m"

        [[route]]
        name = "api"
        key = "header:x-api-key"
        quotas = [{ max_burst = 9, count = 10, period = "1s" }, { max_burst = 999, count = 1000, period = "1d" }]
        tier_header = "x-plan"
        [route.tiers.paid]
        quotas = [{ count = 100, period = "1s" }, { count = 100000, period = "1d" }]
        "#,
    )
    .unwrap();
    let policies = config.policies().unwrap();
    let algorithms: Vec<Algorithm> = policies.iter().map(|p| p.limit().algorithm()).collect();
    assert_eq!(
        algorithms,
        [
            Algorithm::SlidingLog,
            Algorithm::Concurrency,
            Algorithm::Gcra,
            Algorithm::FixedWindow,
            Algorithm::SlidingWindow,
            Algorithm::Gcra,
        ]
    );
    let api = &policies[5];
    assert_eq!(api.limits().len(), 2);
    assert_eq!(api.tier_limits("paid").unwrap()[1].name(), "api.paid.1d");
    assert_eq!(policies[1].limit().lease(), Some(Duration::from_secs(30)));
    assert_eq!(policies[2].limit().delay(), Some(Duration::from_secs(2)));
    assert!(policies[3].is_dry_run());
    let layer = config.memory_layer().unwrap();
    assert_eq!(layer.policies().len(), 6);

    // What the parsed config does, through its layer (on the system clock: counts that a busy
    // machine could shift get generous bounds, not thresholds).
    let app = Router::new()
        .route("/search", get(|| async { "ok" }))
        .route("/download", get(|| async { "ok" }))
        .route("/slow", get(|| async { "ok" }))
        .route("/trial", get(|| async { "ok" }))
        .route("/smooth", get(|| async { "ok" }))
        .route("/items", get(|| async { "ok" }))
        .layer(layer);
    let send = |path: &'static str, peer: &'static str, headers: &'static [(&str, &str)]| {
        let mut req = from_peer(request(path), peer);
        for (name, value) in headers {
            req.headers_mut().insert(*name, value.parse().unwrap());
        }
        app.clone().oneshot(req)
    };
    let ok_then_refused = |path: &'static str, peer, headers, cap: usize| async move {
        for n in 0..cap {
            let res = send(path, peer, headers).await.unwrap();
            if res.status() != StatusCode::OK {
                assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS, "{path}");
                return n;
            }
        }
        panic!("{path}: never refused in {cap} requests");
    };

    // Sliding log, per IP: exactly 3 a minute, and another IP has its own.
    assert_eq!(ok_then_refused("/search", "10.0.0.1:1", &[], 10).await, 3);
    assert_eq!(ok_then_refused("/search", "10.0.0.2:1", &[], 10).await, 3);

    // Concurrency, per IP: two answered responses whose bodies are not read hold both slots.
    let held = [
        send("/download", "10.0.0.1:1", &[]).await.unwrap(),
        send("/download", "10.0.0.1:1", &[]).await.unwrap(),
    ];
    assert!(held.iter().all(|r| r.status() == StatusCode::OK));
    let refused = send("/download", "10.0.0.1:1", &[]).await.unwrap();
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        send("/download", "10.0.0.2:1", &[]).await.unwrap().status(),
        StatusCode::OK
    );
    drop(held);
    assert_eq!(
        send("/download", "10.0.0.1:1", &[]).await.unwrap().status(),
        StatusCode::OK
    );

    // Delay: a burst of 5 at once, then the 6th waits for its turn (due 200 ms after the burst
    // began: a bound that slowness can only make easier to meet) instead of being refused.
    let started = std::time::Instant::now();
    for _ in 0..6 {
        let res = send("/slow", "10.0.0.1:1", &[]).await.unwrap();
        assert_eq!(res.status(), StatusCode::OK);
    }
    assert!(
        started.elapsed() >= Duration::from_millis(190),
        "{:?}",
        started.elapsed()
    );

    // Dry run: never refuses, but counts and says so in its headers.
    for n in 0..101 {
        let res = send("/trial", "10.0.0.1:1", &[]).await.unwrap();
        assert_eq!(res.status(), StatusCode::OK, "request {n}");
        assert_eq!(
            header(&res, "ratelimit-policy"),
            Some(r#""trial";q=100;w=60"#)
        );
    }

    // Sliding window: 100 at once from nothing (one more if a minute boundary falls inside).
    let passed = ok_then_refused("/smooth", "10.0.0.1:1", &[], 102).await;
    assert!((100..=101).contains(&passed), "{passed}");

    // Everything else: the stacked quotas per API key, 10 at once (a few more if the machine
    // is slow enough for the per-second quota to refill), and the paid tier's own quotas.
    let free = ok_then_refused("/items", "10.0.0.1:1", &[("x-api-key", "k1")], 1000).await;
    assert!((10..100).contains(&free), "{free}");
    let res = send("/items", "10.0.0.1:1", &[("x-api-key", "k2")])
        .await
        .unwrap();
    assert_eq!(
        header(&res, "ratelimit-policy"),
        Some(r#""api.1s";q=10;w=1, "api.1d";q=1000;w=86400"#)
    );
    let paid = send(
        "/items",
        "10.0.0.1:1",
        &[("x-api-key", "k1"), ("x-plan", "paid")],
    )
    .await
    .unwrap();
    assert_eq!(paid.status(), StatusCode::OK);
    assert_eq!(
        header(&paid, "ratelimit-policy"),
        Some(r#""api.paid.1s";q=100;w=1, "api.paid.1d";q=100000;w=86400"#)
    );
}

#[test]
fn config_mistakes_are_clear_errors() {
    let err = |route: &str| {
        let text = format!("[[route]]\nname = \"r\"\nkey = \"ip\"\n{route}");
        match tower_throttle::config::Config::from_toml(&text) {
            Err(e) => e.to_string(),
            Ok(c) => c.memory_layer().unwrap_err().to_string(),
        }
    };
    let cases = [
        ("count = 5\nperiod = \"1s\"\nalgorithm = \"leaky\"", "unknown algorithm \"leaky\""),
        ("count = 5\nperiod = \"1s\"\nalgorithm = \"fixed-window\"\nmax_burst = 3", "max_burst is only used"),
        ("count = 5\nperiod = \"1s\"\nmode = \"delay\"", "needs max_delay"),
        ("count = 5\nperiod = \"1s\"\nmax_delay = \"1s\"", "only used with mode = \"delay\""),
        ("count = 5\nperiod = \"1s\"\nmode = \"panic\"", "mode \"panic\""),
        ("count = 5\nperiod = \"1s\"\nalgorithm = \"sliding-log\"\nmode = \"delay\"\nmax_delay = \"1s\"", "needs algorithm \"gcra\""),
        ("count = 5", "period is required"),
        ("", "a quota is required"),
        ("count = 5\nperiod = \"1s\"\nquotas = [{ count = 1, period = \"1m\" }]", "not both"),
        ("quotas = []", "quotas is empty"),
        ("quotas = [{ count = 1, period = \"1m\" }, { count = 2, period = \"60s\" }]", "have the period 60s"),
        ("algorithm = \"concurrency\"\nquotas = [{ count = 1, period = \"1m\" }, { count = 2, period = \"1s\" }]", "not a stack"),
        ("count = 5\nperiod = \"1s\"\nlease = \"10s\"", "only for algorithm \"concurrency\""),
        ("algorithm = \"concurrency\"\ncount = 2\nperiod = \"1m\"", "period is not for algorithm \"concurrency\""),
        ("period = \"1m\"\nmetered = { unit = \"tokens\", count = 10, period = \"1m\", estimate = 1 }", "period and max_burst go with count"),
        ("algorithm = \"sliding-log\"\ncount = 20000\nperiod = \"1h\"", "at most 10000"),
        ("count = 5\nperiod = \"1s\"\ntier_header = \"x-plan\"", "no tier is defined"),
        ("count = 5\nperiod = \"1s\"\n[route.tiers.\"bad tier\"]\ncount = 1\nperiod = \"1s\"", "tier"),
        ("count = 5\nperiod = \"1s\"\ncost = 3\n[route.tiers.small]\ncount = 2\nperiod = \"1s\"", "exceeds the limit 2"),
    ];
    for (route, expected) in cases {
        let message = err(route);
        assert!(
            message.contains(expected),
            "{route:?}: {message:?} should say {expected:?}"
        );
    }
}

#[tokio::test]
async fn a_dry_run_passes_requests_without_a_key_and_through_backend_failures() {
    use tower_throttle::OnBackendError;
    let (backend, _clock) = backend();
    let policy = Policy::builder("trial")
        .quota(Quota::per_minute(1))
        .key(Header::new("x-user"))
        .dry_run(true)
        .build()
        .unwrap();
    let layer = layer_of(backend, policy);
    let app = answering_ok(layer);
    assert_eq!(status_of(&app, request("/")).await, StatusCode::OK);

    // A backend that always fails, with OnBackendError::Deny: still no rejection in a dry run.
    #[derive(Clone)]
    struct Down;
    impl tower_throttle::Backend for Down {
        type Future = std::future::Ready<
            Result<tower_throttle::backend::Decisions, tower_throttle::backend::BackendError>,
        >;
        fn check(&self, _: tower_throttle::backend::Charges<'_>) -> Self::Future {
            std::future::ready(Err(tower_throttle::backend::BackendError::new("down")))
        }
    }
    let layer = ThrottleLayer::builder()
        .backend(Down)
        .policy(
            Policy::builder("trial")
                .quota(Quota::per_minute(1))
                .key(Global)
                .dry_run(true)
                .build()
                .unwrap(),
        )
        .on_backend_error(OnBackendError::Deny)
        .build()
        .unwrap();
    let app = answering_ok(layer);
    assert_eq!(status_of(&app, request("/")).await, StatusCode::OK);
}

#[tokio::test(start_paused = true)]
async fn a_waiting_request_does_not_hold_what_the_inner_service_reserved() {
    use tower::{Service, ServiceBuilder};
    let (backend, _clock) = backend();
    let policy = Policy::builder("slow")
        .quota(Quota::per_second(1))
        .delay(Duration::from_secs(30))
        .key(Header::new("x-user"))
        .build()
        .unwrap();
    let layer = layer_of(backend, policy);
    // One request at a time in the service behind the limiter.
    let mut service = ServiceBuilder::new()
        .layer(layer)
        .concurrency_limit(1)
        .service_fn(|_req: http::Request<axum::body::Body>| async {
            Ok::<_, std::convert::Infallible>(http::Response::new(axum::body::Body::from("ok")))
        });
    let user = |u: &str| from_user(u);
    // The abuser's second request waits a second for its turn...
    let first = service
        .ready()
        .await
        .unwrap()
        .call(user("abuser"))
        .await
        .unwrap();
    assert_eq!(first.status(), StatusCode::OK);
    let waiting = service.ready().await.unwrap().call(user("abuser"));
    let waiting = tokio::spawn(waiting);
    tokio::task::yield_now().await;
    // ...without the inner permit: another user is served at once (no time passes).
    let started = tokio::time::Instant::now();
    let other = service
        .ready()
        .await
        .unwrap()
        .call(user("other"))
        .await
        .unwrap();
    assert_eq!(other.status(), StatusCode::OK);
    assert_eq!(started.elapsed(), Duration::ZERO);
    assert_eq!(waiting.await.unwrap().unwrap().status(), StatusCode::OK);
    // Nor leaves it to the caller, which may keep its service readied until its next request (a
    // `Buffer`'s worker): with no other request to take the permit, the next one waiting is
    // served after its wait.
    let waiting = service.ready().await.unwrap().call(user("abuser"));
    let served = tokio::time::timeout(Duration::from_secs(60), waiting).await;
    assert_eq!(
        served.expect("still waiting").unwrap().status(),
        StatusCode::OK
    );
}

#[test]
fn a_runtime_without_timers_gets_503_for_a_delayed_request_never_a_panic() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    runtime.block_on(async {
        let (backend, _clock) = backend();
        let policy = Policy::builder("slow")
            .quota(Quota::per_second(1))
            .delay(Duration::from_secs(5))
            .key(Global)
            .build()
            .unwrap();
        let layer = layer_of(backend, policy);
        let app = answering_ok(layer);
        assert_eq!(status_of(&app, request("/")).await, StatusCode::OK);
        let delayed = app.clone().oneshot(request("/")).await.unwrap();
        assert_eq!(delayed.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(header(&delayed, "retry-after"), Some("1"));
    });
}

#[test]
fn limits_that_share_a_name_must_share_every_rule_and_stack() {
    let build = |a: Policy<Global>, b: Policy<Global>| {
        ThrottleLayer::builder()
            .policies([a, b])
            .build()
            .map(|_| ())
            .map_err(|e| e.to_string())
    };
    let policy = |route: &str| {
        Policy::builder("api")
            .quota(Quota::per_second(10))
            .key(Global)
            .route(route)
    };
    // Same rules on two routes: one shared limit.
    build(policy("/a").build().unwrap(), policy("/b").build().unwrap()).unwrap();
    let delayed = policy("/a").delay(Duration::from_secs(2)).build().unwrap();
    let err = build(delayed, policy("/b").build().unwrap()).unwrap_err();
    assert!(err.contains("different rules"), "{err}");
    // "api.paid" as a policy and as the tier "paid" of "api": accepted when their rules and stacks
    // are the same, as one limit that both share (see the next test); refused when they differ.
    let stacked = Policy::builder("api")
        .quota(Quota::per_second(10))
        .tier("paid", [Quota::per_second(100)])
        .key(Global)
        .build()
        .unwrap();
    let named = Policy::builder("api.paid")
        .quota(Quota::per_second(100))
        .key(Global)
        .route("/x")
        .build()
        .unwrap();
    // The route-less policy last: before them, it would leave the others nothing to match.
    build(named, stacked.clone()).unwrap();
    let other_rules = Policy::builder("api.paid")
        .quota(Quota::per_second(50))
        .key(Global)
        .route("/x")
        .build()
        .unwrap();
    let err = build(other_rules, stacked.clone()).unwrap_err();
    assert!(err.contains("different rules"), "{err}");
    let stack_named = Policy::builder("api.paid")
        .quotas([Quota::per_second(100), Quota::per_day(1000)])
        .key(Global)
        .route("/y")
        .build()
        .unwrap();
    let paid_stack = Policy::builder("api")
        .quota(Quota::per_second(10))
        .tier("paid", [Quota::per_second(100), Quota::per_day(1000)])
        .key(Global)
        .build()
        .unwrap();
    build(stack_named, paid_stack.clone()).unwrap();
    // Its per-second member alone, or another stack under that name: refused.
    let member_alone = Policy::builder("api.paid.1s")
        .quota(Quota::per_second(100))
        .key(Global)
        .route("/y")
        .build()
        .unwrap();
    let err = build(member_alone, paid_stack.clone()).unwrap_err();
    assert!(err.contains("two different stacks"), "{err}");
    let other_stack = Policy::builder("api.paid")
        .quotas([Quota::per_second(100), Quota::per_hour(1000)])
        .key(Global)
        .route("/y")
        .build()
        .unwrap();
    let err = build(other_stack, paid_stack).unwrap_err();
    assert!(err.contains("two different stacks"), "{err}");
    // A lone "api.1s" and the per-second member of a stacked "api": different state, refused.
    let lone = Policy::builder("api.1s")
        .quota(Quota::per_second(10))
        .key(Global)
        .route("/z")
        .build()
        .unwrap();
    let stack = Policy::builder("api")
        .quotas([Quota::per_second(10), Quota::per_day(1000)])
        .key(Global)
        .build()
        .unwrap();
    let err = build(lone, stack).unwrap_err();
    assert!(err.contains("two different stacks"), "{err}");
    let err = Policy::builder("api")
        .key(tower_throttle::key::PeerIp::new())
        .quota(Quota::per_second(1))
        .tier("paid.1s", [Quota::per_second(2)])
        .build()
        .unwrap_err()
        .to_string();
    assert!(err.contains("may not contain '.'"), "{err}");
    // A tier "override" would count where the policy's override quotas count.
    let err = Policy::builder("api")
        .key(Global)
        .quota(Quota::per_second(1))
        .tier("override", [Quota::per_second(2)])
        .build()
        .unwrap_err()
        .to_string();
    assert!(err.contains("tier \"override\" is reserved"), "{err}");
}

/// What sharing a name means: the tier "paid" of "api" and the policy "api.paid" count in one
/// limit, so what one route spends the other no longer has.
#[tokio::test]
async fn a_tier_and_a_policy_of_the_same_name_share_one_limit() {
    let (backend, _clock) = backend();
    let layer = ThrottleLayer::builder()
        .backend(backend)
        .policies([
            Policy::builder("api.paid")
                .quota(Quota::per_minute(2))
                .key(Global)
                .route("/x")
                .build()
                .unwrap(),
            Policy::builder("api")
                .quota(Quota::per_minute(10))
                .tier("paid", [Quota::per_minute(2)])
                .key(Global)
                .build()
                .unwrap(),
        ])
        .build()
        .unwrap();
    let app = Router::new()
        .route("/x", get(|| async { "x" }))
        .route("/", get(|| async { "ok" }))
        .layer(layer);
    let paid = || {
        let mut req = request("/");
        req.extensions_mut().insert(Tier::new("paid"));
        req
    };
    assert_eq!(status_of(&app, request("/x")).await, StatusCode::OK);
    assert_eq!(status_of(&app, paid()).await, StatusCode::OK);
    // Both units are spent, one on each route.
    assert_eq!(
        status_of(&app, request("/x")).await,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(status_of(&app, paid()).await, StatusCode::TOO_MANY_REQUESTS);
    // "api" itself is another limit.
    assert_eq!(status_of(&app, request("/")).await, StatusCode::OK);
}
