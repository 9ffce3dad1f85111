//! Counting by outcome on Redis: refunds by `refund.lua` for every algorithm (the GCRA on the Lua
//! path and on `CL.THROTTLE`'s own key), and a login route shared by two processes that counts only
//! failures: exact with 100 attempts in flight.

use crate::algorithms::server_clock;
use crate::support::failover::wait_until;
use crate::support::redis as redis_support;

use std::time::Duration;

use crate::support::asks::Asks;
use axum::http::{HeaderMap, StatusCode};
use axum::{routing::get, Router};
use tower::ServiceExt;
use tower_throttle::key::Header;
use tower_throttle::{
    redis::{RedisBackend, RedisMode},
    Algorithm, Key, Limit, Policy, Quota, ThrottleLayer,
};

async fn connect(server: &redis_support::RedisServer, mode: RedisMode) -> RedisBackend {
    RedisBackend::builder()
        .url(server.url())
        .mode(mode)
        // Not a test of timeouts: the default 100 ms timed a peek out on a loaded machine. A GCRA
        // refund gives back less this timeout (see `drained`), so it stays short.
        .timeout(Duration::from_secs(1))
        .connect()
        .await
        .unwrap()
}

/// A refund is sent on a spawned task: this gives it time to land, where nothing shows that it has
/// (a refund that must change nothing; a layer's refund, whose backend the test does not hold).
async fn settle() {
    tokio::time::sleep(Duration::from_millis(50)).await;
}

/// The units each limit has left for `key`, as a peek sees them.
async fn remaining(backend: &RedisBackend, limits: &[Limit], key: &Key) -> Vec<u64> {
    let states = backend.peek_all(limits, key).await.unwrap();
    states.iter().map(|s| s.remaining).collect()
}

/// Gives `quantity` back, admitted `since` ago, and waits (polling, with a deadline) until the
/// refund, sent on a spawned task, has landed: until what the key has left changed.
async fn refund(
    backend: &RedisBackend,
    limits: &[Limit],
    key: &Key,
    quantity: u64,
    since: Duration,
) {
    let before = remaining(backend, limits, key).await;
    backend.refund(limits, key, quantity, since);
    wait_until(
        Duration::from_secs(10),
        "the refund never landed",
        || async { remaining(backend, limits, key).await != before },
    )
    .await;
}

/// Waits (polling, with a deadline) until the first limit has `units` left for `key`: a GCRA refund
/// gives the units back less the time since the admission and the backend's timeout (the admission
/// may have been made that long before its answer), and that remainder drains as fast.
async fn drained(backend: &RedisBackend, limits: &[Limit], key: &Key, units: u64) {
    wait_until(
        Duration::from_secs(10),
        "the refund's remainder never drained",
        || async { remaining(backend, limits, key).await[0] >= units },
    )
    .await;
}

async fn admitted(backend: &RedisBackend, limits: &[Limit], key: &Key, n: u32) -> u32 {
    let mut passed = 0;
    for _ in 0..n {
        let decisions = match limits {
            [one] => vec![backend.check_one(one, key, 1).await.unwrap()],
            all => backend.check_all(all, key, 1).await.unwrap(),
        };
        passed += u32::from(decisions.iter().all(|d| d.allowed));
    }
    passed
}

#[tokio::test]
async fn every_algorithm_gives_back_what_a_request_took() {
    let server = redis_support::RedisServer::start_with_cell();
    for mode in [RedisMode::Lua, RedisMode::Cell] {
        let backend = connect(&server, mode).await;
        assert!(backend.can_refund());
        for algorithm in [
            Algorithm::Gcra,
            Algorithm::SlidingLog,
            Algorithm::FixedWindow,
            Algorithm::SlidingWindow,
        ] {
            let limit = [Limit::with_algorithm("r", algorithm, Quota::per_hour(3)).unwrap()];
            let key = Key::from(format!("alice-{mode}-{algorithm}"));
            assert_eq!(
                admitted(&backend, &limit, &key, 5).await,
                3,
                "{mode} {algorithm}"
            );
            refund(&backend, &limit, &key, 2, Duration::from_millis(100)).await;
            drained(&backend, &limit, &key, 2).await;
            assert_eq!(
                admitted(&backend, &limit, &key, 5).await,
                2,
                "{mode} {algorithm}"
            );
            // More than the key holds: back to full, never beyond.
            refund(&backend, &limit, &key, 50, Duration::from_millis(500)).await;
            assert_eq!(
                admitted(&backend, &limit, &key, 5).await,
                3,
                "{mode} {algorithm}"
            );
        }
        // A stack: each limit gives its unit back, in one call.
        let stack = [
            Limit::new("s.1m", Quota::per_minute(2)).unwrap(),
            Limit::with_algorithm("s.1h", Algorithm::FixedWindow, Quota::per_hour(3)).unwrap(),
        ];
        let key = Key::from(format!("bob-{mode}"));
        assert_eq!(admitted(&backend, &stack, &key, 3).await, 2);
        refund(&backend, &stack, &key, 2, Duration::from_millis(100)).await;
        drained(&backend, &stack, &key, 2).await;
        assert_eq!(
            admitted(&backend, &stack, &key, 3).await,
            2,
            "{mode}: two more, then 1h is full"
        );
    }
}

/// Told its decision, a GCRA refund on a busy key gives its units back whole, on the Lua path and
/// on `CL.THROTTLE`'s (whose whole seconds it allows for): untold, it would keep
/// the time since the admission and the backend's timeout (1.1 s of a 10 s unit: 2 of 3 back).
#[tokio::test]
async fn a_gcra_refund_told_its_reset_after_gives_a_busy_keys_units_back_whole() {
    let server = redis_support::RedisServer::start_with_cell();
    for mode in [RedisMode::Lua, RedisMode::Cell] {
        let backend = connect(&server, mode).await;
        // One unit every 10 s, six at once.
        let limit = [Limit::new("busy", Quota::per_minute(6)).unwrap()];
        let key = Key::from(format!("busy-{mode}"));
        let mut last = None;
        for _ in 0..6 {
            let decision = backend.check_one(&limit[0], &key, 1).await.unwrap();
            assert!(decision.allowed, "{mode}");
            last = Some(decision);
        }
        let told = [last.unwrap()];
        let before = remaining(&backend, &limit, &key).await;
        let since = Duration::from_millis(100);
        backend.refund_told(&limit, &key, 3, (since, &told));
        wait_until(
            Duration::from_secs(10),
            "the refund never landed",
            || async { remaining(&backend, &limit, &key).await != before },
        )
        .await;
        assert_eq!(remaining(&backend, &limit, &key).await, vec![3], "{mode}");
    }
}

/// A key busy for two seconds, at one unit every 100 ms: `CL.THROTTLE`'s whole seconds alone would
/// leave one second of it, less than the refund's bound on its time since admission (1.1 s with the
/// timeout), and nothing would come back; its `remaining` bounds the time within two units, and the
/// five units come back whole (more may drain meanwhile: the machine's time passes).
#[tokio::test]
async fn a_gcra_refund_on_a_key_busy_for_seconds_comes_back_whole_on_either_path() {
    let server = redis_support::RedisServer::start_with_cell();
    for mode in [RedisMode::Lua, RedisMode::Cell] {
        let backend = connect(&server, mode).await;
        let limit = [Limit::new("seconds", Quota::per_second(10).with_max_burst(19)).unwrap()];
        let key = Key::from(format!("seconds-{mode}"));
        let mut last = None;
        for _ in 0..20 {
            last = Some(backend.check_one(&limit[0], &key, 1).await.unwrap());
        }
        let told = [last.unwrap()];
        assert!(told[0].allowed && told[0].remaining < 3, "{mode}: {told:?}");
        let before = remaining(&backend, &limit, &key).await[0];
        let since = Duration::from_millis(100);
        backend.refund_told(&limit, &key, 5, (since, &told));
        // The first change seen is the refund's (one unit drains by itself every 100 ms).
        wait_until(
            Duration::from_secs(10),
            "the refund never landed",
            || async { remaining(&backend, &limit, &key).await[0] != before },
        )
        .await;
        let after = remaining(&backend, &limit, &key).await[0];
        assert!(after >= before + 5, "{mode}: {before} then {after}");
    }
}

/// A sliding log's refund of more entries than Lua can unpack at once (about 8,000) gives them all
/// back, and a stack's other limit with them (the script failed half-way).
#[tokio::test]
async fn a_sliding_log_gives_back_thousands_of_units() {
    let server = redis_support::RedisServer::start();
    let backend = connect(&server, RedisMode::Lua).await;
    let log = Algorithm::SlidingLog;
    let stack = [
        Limit::new("big.s", Quota::per_second(10_000)).unwrap(),
        Limit::with_algorithm("big.m", log, Quota::per_minute(9_000)).unwrap(),
    ];
    let key = Key::from("erin");
    let taken = backend.check_all(&stack, &key, 8_500).await.unwrap();
    assert!(taken.iter().all(|d| d.allowed), "{taken:?}");
    refund(&backend, &stack, &key, 8_500, Duration::from_millis(1)).await;
    assert_eq!(remaining(&backend, &stack[1..], &key).await, [9_000]);
}

#[tokio::test]
async fn a_refund_never_gives_back_units_of_an_ended_window() {
    let server = redis_support::RedisServer::start();
    let backend = connect(&server, RedisMode::Lua).await;
    let limit = [Limit::with_algorithm("w", Algorithm::FixedWindow, Quota::per_hour(2)).unwrap()];
    let key = Key::from("carol");
    assert_eq!(admitted(&backend, &limit, &key, 2).await, 2);
    // Admitted "two hours ago": another window, whatever the clock says now.
    backend.refund(&limit, &key, 2, Duration::from_secs(7200));
    settle().await;
    assert_eq!(admitted(&backend, &limit, &key, 1).await, 0);
}

/// A sliding log gives back nothing for a request admitted a period ago or more: its own entry has
/// left the log, and the entries there are later requests'.
#[tokio::test]
async fn a_sliding_log_gives_back_nothing_a_period_on() {
    let server = redis_support::RedisServer::start();
    let backend = connect(&server, RedisMode::Lua).await;
    let log = Algorithm::SlidingLog;
    let limit = [Limit::with_algorithm("l", log, Quota::per_hour(2)).unwrap()];
    let key = Key::from("dave");
    assert_eq!(admitted(&backend, &limit, &key, 2).await, 2);
    backend.refund(&limit, &key, 1, Duration::from_secs(3600));
    settle().await;
    assert_eq!(admitted(&backend, &limit, &key, 1).await, 0);
}

/// 200 for the right password, 401 otherwise, after a short check.
async fn check_password(headers: HeaderMap) -> StatusCode {
    tokio::time::sleep(Duration::from_millis(20)).await;
    match headers.get("x-password").map(|v| v.as_bytes()) {
        Some(b"right") => StatusCode::OK,
        _ => StatusCode::UNAUTHORIZED,
    }
}

fn login_app(backend: RedisBackend, algorithm: Algorithm, quota: Quota) -> Router {
    let login = Policy::builder("login")
        .key(Header::new("x-username"))
        .quota(quota)
        .algorithm(algorithm)
        .count_only(|status| status == StatusCode::UNAUTHORIZED)
        .build()
        .unwrap();
    Router::new().route("/login", get(check_password)).layer(
        ThrottleLayer::builder()
            .backend(backend)
            .policy(login)
            .build()
            .unwrap(),
    )
}

async fn attempt(app: Router, user: String, password: &'static str) -> StatusCode {
    let mut r = axum::http::Request::get("/login")
        .body(axum::body::Body::empty())
        .unwrap();
    r.headers_mut().insert("x-username", user.parse().unwrap());
    r.headers_mut()
        .insert("x-password", password.parse().unwrap());
    app.oneshot(r).await.unwrap().status()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_counting_failures_admit_exactly_the_quota_with_100_in_flight() {
    let server = redis_support::RedisServer::start_with_cell();
    for (mode, algorithm, quota) in [
        (RedisMode::Lua, Algorithm::Gcra, Quota::per_minute(3)),
        (RedisMode::Cell, Algorithm::Gcra, Quota::per_minute(3)),
        (RedisMode::Lua, Algorithm::SlidingLog, Quota::per_minute(3)),
        // Hourly windows: the run fits in one, clear of its start (see `clear_of_boundaries`).
        (RedisMode::Lua, Algorithm::FixedWindow, Quota::per_hour(3)),
    ] {
        // A timeout a loaded machine does not reach (a call that timed out would be admitted by
        // the failure policy, fail open: this test is about exact counting), and short enough:
        // a refund keeps the timeout's worth of a unit (10 successes × 2 s fit in the 40 s left).
        let patient = || async {
            RedisBackend::builder()
                .url(server.url())
                .mode(mode)
                .timeout(Duration::from_secs(2))
                .connect()
                .await
                .unwrap()
        };
        if algorithm == Algorithm::FixedWindow {
            clear_of_boundaries(&server.url(), quota.period()).await;
        }
        let apps = [
            login_app(patient().await, algorithm, quota),
            login_app(patient().await, algorithm, quota),
        ];
        let user = format!("mallory-{mode}-{algorithm}");
        let attempts: Vec<_> = (0..100)
            .map(|i| tokio::spawn(attempt(apps[i % 2].clone(), user.clone(), "guess")))
            .collect();
        let mut failed = 0;
        for a in attempts {
            match a.await.unwrap() {
                StatusCode::UNAUTHORIZED => failed += 1,
                StatusCode::TOO_MANY_REQUESTS => {}
                other => panic!("{other}"),
            }
        }
        assert_eq!(
            failed, 3,
            "{mode} {algorithm}: at most the quota of failures"
        );
        // What the layers' limit has left, seen by a third process (the same limit and key).
        let peeker = patient().await;
        let limit = [Limit::with_algorithm("login", algorithm, quota).unwrap()];
        let left = |user: &str| {
            let (peeker, limit, key) = (&peeker, &limit, Key::from(user));
            async move { remaining(peeker, limit, &key).await[0] }
        };
        assert_eq!(left(&user).await, 0, "{mode} {algorithm}: the peek sees it");
        // A user who logs in is never limited: each success is given back. The layer refunds on
        // a spawned task; wait until the key has two units left again (it would have one left
        // after the second success, and none after the third, had nothing been given back).
        let alice = format!("alice-{mode}-{algorithm}");
        for i in 0..10 {
            let status = attempt(apps[i % 2].clone(), alice.clone(), "right").await;
            assert_eq!(status, StatusCode::OK, "{mode} {algorithm}: success {i}");
            wait_until(
                Duration::from_secs(10),
                "a success was never given back",
                || async { left(&alice).await >= 2 },
            )
            .await;
        }
    }
}

/// Waits until the server's clock is at least 5 s past the start of a window of `period` and 60 s
/// before its end. Counting by outcome on fixed windows then holds as the test says however slowly
/// it runs: the 100 attempts fall in one window, and every success is given back. A fixed window's
/// refund gives back only units certainly admitted in the current window: admitted at most the time
/// since the layer asked plus the backend's timeout (2 s here) before the refund ran. A success
/// within that of the window's start is not given back (never more than was taken, so maybe less),
/// and two of them left a user one unit of three (how a loaded run at b974e8d failed, at 04:56:00).
async fn clear_of_boundaries(url: &str, period: Duration) {
    let (after_start, before_end) = (Duration::from_secs(5), Duration::from_secs(60));
    let (now, local) = server_clock(url).await;
    let period = period.as_nanos() as u64;
    let into = Duration::from_nanos(now % period);
    let left = Duration::from_nanos(period) - into;
    if into < after_start {
        tokio::time::sleep_until(local + (after_start - into)).await;
    } else if left < before_end {
        tokio::time::sleep_until(local + left + after_start).await;
    }
}
