//! Counting by outcome through the layer (memory backend): a login route that counts only failed
//! attempts, exact with 100 requests in flight; refunds of server errors; responses that never came.

use std::time::Duration;
use tower_throttle::backend::{Charges, Uses};
use tower_throttle::BuildError;

use axum::http::{HeaderMap, StatusCode};
use axum::{routing::get, Router};
use tower::ServiceExt;

use crate::support::{backend, request};
use tower_throttle::key::Header;
use tower_throttle::{
    Algorithm, Backend, Limit, MemoryBackend, Policy, PolicyBuilder, Quota, ThrottleLayer,
};

/// "login": 3 a minute per `x-username`, counting only 401s and 403s.
fn login() -> PolicyBuilder<Header> {
    Policy::builder("login")
        .key(Header::new("x-username"))
        .quota(Quota::per_minute(3))
        .count_only(|status| status == StatusCode::UNAUTHORIZED || status == StatusCode::FORBIDDEN)
}

/// A login handler: 200 for the right password, 401 otherwise, after a short check (so that
/// concurrent attempts are in flight together).
async fn check_password(headers: HeaderMap) -> StatusCode {
    tokio::time::sleep(Duration::from_millis(20)).await;
    match headers.get("x-password").map(|v| v.as_bytes()) {
        Some(b"right") => StatusCode::OK,
        _ => StatusCode::UNAUTHORIZED,
    }
}

pub fn login_app<B: Backend + Clone>(backend: B, policy: Policy<Header>) -> Router {
    Router::new()
        .route("/login", get(check_password))
        .layer(layer_on(backend, policy))
}

/// The status of a login attempt by `user` with `password`.
pub async fn attempt(app: &Router, user: &str, password: &str) -> StatusCode {
    let mut r = request("/login");
    r.headers_mut().insert("x-username", user.parse().unwrap());
    r.headers_mut()
        .insert("x-password", password.parse().unwrap());
    app.clone().oneshot(r).await.unwrap().status()
}

/// Sends `n` attempts at once; how many got each of 200, 401 and 429.
pub async fn at_once(app: &Router, user: &str, password: &str, n: usize) -> [usize; 3] {
    let attempts = (0..n).map(|_| {
        let app = app.clone();
        let (user, password) = (user.to_owned(), password.to_owned());
        tokio::spawn(async move { attempt(&app, &user, &password).await })
    });
    let mut counts = [0; 3];
    for attempt in attempts.collect::<Vec<_>>() {
        match attempt.await.unwrap() {
            StatusCode::OK => counts[0] += 1,
            StatusCode::UNAUTHORIZED => counts[1] += 1,
            StatusCode::TOO_MANY_REQUESTS => counts[2] += 1,
            other => panic!("unexpected {other}"),
        }
    }
    counts
}

#[tokio::test]
async fn a_user_who_logs_in_is_never_limited_and_failures_are_counted() {
    let app = login_app(MemoryBackend::new(), login().build().unwrap());
    for _ in 0..50 {
        assert_eq!(attempt(&app, "alice", "right").await, StatusCode::OK);
    }
    for _ in 0..3 {
        assert_eq!(
            attempt(&app, "mallory", "guess").await,
            StatusCode::UNAUTHORIZED
        );
    }
    assert_eq!(
        attempt(&app, "mallory", "guess").await,
        StatusCode::TOO_MANY_REQUESTS
    );
    // The limit is the key's: even the right password waits now (that is brute-force protection).
    assert_eq!(
        attempt(&app, "mallory", "right").await,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(attempt(&app, "alice", "right").await, StatusCode::OK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_failures_in_flight_admit_exactly_the_quota() {
    for algorithm in [
        Algorithm::Gcra,
        Algorithm::SlidingLog,
        Algorithm::FixedWindow,
        Algorithm::SlidingWindow,
    ] {
        // A manual clock: no window turns over during the run.
        let (memory, clock) = backend();
        let app = login_app(memory, login().algorithm(algorithm).build().unwrap());
        let [ok, failed, limited] = at_once(&app, "mallory", "guess", 100).await;
        assert_eq!((ok, failed, limited), (0, 3, 97), "{algorithm}");
        // Successes in flight hold their unit until they answer, then give it back.
        let [ok, failed, limited] = at_once(&app, "alice", "right", 3).await;
        assert_eq!((ok, failed, limited), (3, 0, 0), "{algorithm}");
        // The GCRA gives back the units less the time since each admission (the most a request
        // that came meanwhile may have absorbed of them): that remainder drains as fast.
        clock.advance(DRAINED);
        let [ok, _, _] = at_once(&app, "alice", "right", 3).await;
        assert_eq!(ok, 3, "{algorithm}: given back after each answer");
    }
}

#[tokio::test]
async fn server_errors_are_refunded() {
    let policy = Policy::builder("api")
        .key(Header::new("x-username"))
        .quota(Quota::per_minute(2))
        .refund_on(|status| status.is_server_error())
        .build()
        .unwrap();
    let (memory, clock) = backend();
    let app = Router::new()
        .route("/fail", get(|| async { StatusCode::BAD_GATEWAY }))
        .route("/ok", get(|| async { "ok" }))
        .layer(layer_on(memory, policy));
    let send = |uri: &'static str| as_bob(&app, uri);
    for _ in 0..10 {
        assert_eq!(send("/fail").await, StatusCode::BAD_GATEWAY);
    }
    clock.advance(DRAINED);
    assert_eq!(send("/ok").await, StatusCode::OK);
    assert_eq!(send("/ok").await, StatusCode::OK);
    assert_eq!(send("/ok").await, StatusCode::TOO_MANY_REQUESTS);
}

/// A stack's server errors are given back in every limit, the longer ones too, however long the
/// response took: each limit bounds its own give-back (the per-second limit's unit has drained by
/// the time the slow 502 comes; the day's has not).
#[tokio::test]
async fn a_slow_server_error_is_refunded_in_a_stacks_longer_limit() {
    let policy = Policy::builder("api")
        .key(Header::new("x-username"))
        .quotas([Quota::per_second(10), Quota::per_day(2)])
        .refund_on(|status| status.is_server_error())
        .build()
        .unwrap();
    let (memory, _clock) = backend();
    let slow_failure = || async {
        tokio::time::sleep(Duration::from_millis(150)).await;
        StatusCode::BAD_GATEWAY
    };
    let app = Router::new()
        .route("/fail", get(slow_failure))
        .layer(layer_on(memory, policy));
    for _ in 0..3 {
        let status = as_bob(&app, "/fail").await;
        assert_eq!(
            status,
            StatusCode::BAD_GATEWAY,
            "the day's two units given back"
        );
    }
}

/// At a thousand a second (one unit a millisecond), every refund comes later than an emission
/// interval after its admission; on a busy key none of the units can have drained meanwhile, and
/// all of them are given back: 600 server errors in a row on a burst of 500 are never limited. (The
/// backend's manual clock stands still: the real time since each admission is what bounds the
/// give-back, and the first refunds, before the key is that busy, give back nothing.)
#[tokio::test]
async fn a_busy_keys_server_errors_are_refunded_at_a_thousand_a_second() {
    let policy = Policy::builder("api")
        .key(Header::new("x-username"))
        .quota(Quota::per_second(1_000).with_max_burst(499))
        .refund_on(|status| status.is_server_error())
        .build()
        .unwrap();
    let (memory, _clock) = backend();
    let app = Router::new()
        .route("/fail", get(|| async { StatusCode::BAD_GATEWAY }))
        .layer(layer_on(memory, policy));
    for n in 0..600 {
        assert_eq!(as_bob(&app, "/fail").await, StatusCode::BAD_GATEWAY, "{n}");
    }
}

/// A sliding log gives back nothing once a period has passed since the admission: the request's
/// own entry has left the log, and what is there is a later request's (real clock: the refund's
/// time since the admission is real).
#[tokio::test]
async fn a_sliding_log_gives_back_nothing_a_period_on() {
    let half_second = Duration::from_millis(500);
    let policy = Policy::builder("api")
        .key(Header::new("x-username"))
        .quotas([Quota::per_period(1, half_second), Quota::per_day(10)])
        .algorithm(Algorithm::SlidingLog)
        .refund_on(|status| status.is_server_error())
        .build()
        .unwrap();
    let slow_failure = || async {
        tokio::time::sleep(Duration::from_millis(600)).await;
        StatusCode::BAD_GATEWAY
    };
    let app = Router::new()
        .route("/fail", get(slow_failure))
        .route("/ok", get(|| async { "ok" }))
        .layer(layer_on(MemoryBackend::new(), policy));
    let send = |uri: &'static str| as_bob(&app, uri);
    let failing = tokio::spawn({
        let app = app.clone();
        async move { as_bob(&app, "/fail").await }
    });
    // Past the half-second log, while the failure is still on its way: admitted, logged.
    tokio::time::sleep(Duration::from_millis(550)).await;
    assert_eq!(send("/ok").await, StatusCode::OK);
    assert_eq!(failing.await.unwrap(), StatusCode::BAD_GATEWAY);
    // The 502's refund took nothing from the log: the last admission still holds it.
    assert_eq!(send("/ok").await, StatusCode::TOO_MANY_REQUESTS);
}

/// The status of a request to `uri` on `app` by `x-username: bob`.
async fn as_bob(app: &Router, uri: &str) -> StatusCode {
    let mut r = request(uri);
    r.headers_mut().insert("x-username", "bob".parse().unwrap());
    app.clone().oneshot(r).await.unwrap().status()
}

/// Longer than the time a refunded GCRA request keeps (the real time since its admission plus the
/// 10 ms clock margin, summed over the refunds of a test: a second per refund leaves room for any
/// machine), and shorter than one emission interval of the quotas here (20 s, 30 s), so that the
/// backend's manual clock advanced by it frees no unit by itself.
const DRAINED: Duration = Duration::from_secs(10);

/// A layer of `policy` on `backend`.
fn layer_on<B: Backend + Clone>(backend: B, policy: Policy<Header>) -> ThrottleLayer<Header, B> {
    ThrottleLayer::builder()
        .backend(backend)
        .policy(policy)
        .build()
        .unwrap()
}

#[tokio::test]
async fn a_response_that_never_comes_counts() {
    let policy = Policy::builder("api")
        .key(Header::new("x-username"))
        .quota(Quota::per_minute(2))
        .refund_on(|status| status.is_server_error())
        .build()
        .unwrap();
    let (memory, clock) = backend();
    let app = Router::new()
        .route("/hang", get(std::future::pending::<&'static str>))
        .route("/ok", get(|| async { "ok" }))
        .layer(layer_on(memory, policy));
    let request_of = |uri: &str| {
        let mut r = request(uri);
        r.headers_mut()
            .insert("x-username", "carol".parse().unwrap());
        r
    };
    // The client gives up on two requests before they answer: each counts (a client cannot escape
    // counting by hanging up), though `refund_on(5xx)` would give back a server error.
    for _ in 0..2 {
        let call = app.clone().oneshot(request_of("/hang"));
        assert!(tokio::time::timeout(Duration::from_millis(10), call)
            .await
            .is_err());
    }
    let status = |uri: &'static str| {
        let call = app.clone().oneshot(request_of(uri));
        async move { call.await.unwrap().status() }
    };
    clock.advance(DRAINED);
    assert_eq!(status("/ok").await, StatusCode::TOO_MANY_REQUESTS);
}

/// A backend that decides as memory does but cannot give units back.
#[derive(Clone)]
struct NoRefunds(MemoryBackend);

impl Backend for NoRefunds {
    type Future = <MemoryBackend as Backend>::Future;

    fn check(&self, charges: Charges<'_>) -> Self::Future {
        self.0.check(charges)
    }

    // Decides as memory does, and refuses refunds.
    fn validate(&self, limits: &[Limit], uses: Uses) -> Result<(), BuildError> {
        match uses.refunds {
            true => Err(BuildError::Invalid("no refunds here".into())),
            false => self.0.validate(limits, uses),
        }
    }
}

#[test]
fn counting_by_outcome_is_refused_where_it_cannot_work() {
    let err = login()
        .algorithm(Algorithm::Concurrency)
        .build()
        .unwrap_err()
        .to_string();
    assert!(err.contains("need a rate"), "{err}");
    let err = ThrottleLayer::builder()
        .backend(NoRefunds(MemoryBackend::new()))
        .policy(login().build().unwrap())
        .build()
        .unwrap_err()
        .to_string();
    assert!(err.contains("cannot give units back"), "{err}");
    // A leased budget's units were charged when the slice was granted: no refund can be exact.
    let err = login()
        .budget(tower_throttle::policy::Budget::new())
        .build()
        .unwrap_err()
        .to_string();
    assert!(err.contains("cannot be used with a budget"), "{err}");
}

#[tokio::test]
async fn the_config_counts_by_status_and_refuses_bad_statuses() {
    let toml = r#"
        [[route]]
        name = "login"
        path = "/login"
        key = "header:x-username"
        count = 3
        period = "1m"
        count_statuses = [401, 403]

        [[route]]
        name = "api"
        key = "header:x-username"
        count = 2
        period = "1m"
        refund_statuses = ["5xx"]
    "#;
    let layer = tower_throttle::config::Config::from_toml(toml)
        .unwrap()
        .memory_layer()
        .unwrap();
    let app = Router::new()
        .route("/login", get(check_password))
        .route("/boom", get(|| async { StatusCode::SERVICE_UNAVAILABLE }))
        .layer(layer);
    for _ in 0..10 {
        assert_eq!(attempt(&app, "alice", "right").await, StatusCode::OK);
    }
    for _ in 0..3 {
        assert_eq!(
            attempt(&app, "mallory", "guess").await,
            StatusCode::UNAUTHORIZED
        );
    }
    assert_eq!(
        attempt(&app, "mallory", "guess").await,
        StatusCode::TOO_MANY_REQUESTS
    );
    for _ in 0..5 {
        let status = as_bob(&app, "/boom").await;
        assert_eq!(
            status,
            StatusCode::SERVICE_UNAVAILABLE,
            "refunded, never 429"
        );
    }
    for (bad, message) in [
        ("count_statuses = [401, 403]", "count_statuses = [700]"),
        ("count_statuses = [401, 403]", "count_statuses = []"),
        ("refund_statuses = [\"5xx\"]", "refund_statuses = [\"5xy\"]"),
    ] {
        let toml = toml.replace(bad, message);
        let err = match tower_throttle::config::Config::from_toml(&toml) {
            Ok(config) => config.memory_layer().unwrap_err().to_string(),
            Err(e) => e.to_string(),
        };
        assert!(err.contains("statuses"), "{message}: {err}");
    }
}

#[tokio::test(start_paused = true)]
async fn a_delayed_request_is_refunded_too() {
    // One every 10 s, no burst, waiting up to 15 s for a turn: without refunds the second request
    // would wait 10 s and the third be refused (20 s). Each failure's slot is given back but for
    // the real time it took (plus a 10 ms margin), so the waits stay that small. Tokio's paused
    // clock measures the waits exactly and sleeps them at once; the backend's clock stands still.
    let policy = Policy::builder("api")
        .key(Header::new("x-username"))
        .quota(Quota::per_minute(6).with_max_burst(0))
        .delay(Duration::from_secs(15))
        .refund_on(|status| status.is_server_error())
        .build()
        .unwrap();
    let (memory, _clock) = backend();
    let app = Router::new()
        .route("/", get(|| async { StatusCode::INTERNAL_SERVER_ERROR }))
        .layer(layer_on(memory, policy));
    let started = tokio::time::Instant::now();
    for _ in 0..5 {
        let mut r = request("/");
        r.headers_mut().insert("x-username", "dan".parse().unwrap());
        let status = app.clone().oneshot(r).await.unwrap().status();
        assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
    }
    let waited = started.elapsed();
    assert!(
        waited < Duration::from_secs(10),
        "no request waited for a refunded slot: {waited:?}"
    );
}

/// A dry run admits what its limit refuses, and the backend took nothing for it: a response that
/// does not count gives nothing back (a refund would leave the key more than its quota).
#[tokio::test]
async fn a_dry_run_gives_back_nothing_for_what_the_backend_refused() {
    let (backend, _clock) = backend();
    let layer = layer_on(backend, login().dry_run(true).build().unwrap());
    let handle = layer.handle();
    let app = Router::new()
        .route("/login", get(check_password))
        .layer(layer);
    let state = || async { handle.peek("login", "mallory").await.unwrap().summary() };
    for _ in 0..3 {
        assert_eq!(
            attempt(&app, "mallory", "guess").await,
            StatusCode::UNAUTHORIZED
        );
    }
    let full = state().await;
    // Three failures fill the quota of 3 a minute: a minute to empty (the clock stands still).
    assert_eq!(
        (full.remaining, full.reset_after),
        (0, Duration::from_secs(60))
    );
    // Over the limit, let through by the dry run, and a success (which does not count): the
    // backend took nothing for it, so nothing is given back.
    assert_eq!(attempt(&app, "mallory", "right").await, StatusCode::OK);
    let after = state().await;
    assert_eq!(
        (after.remaining, after.reset_after),
        (0, Duration::from_secs(60))
    );
}
