//! Redis goes away in the middle of a stream of requests, or stops answering: every request is answered
//! within the timeout (bounded generously: a busy machine can stall a request, never make it wait for Redis), as the layer's failure policy says; once Redis is back,
//! decisions come from Redis again, without restarting anything.

use crate::support::redis as redis_support;

use std::time::Duration;

use crate::support::asks::Asks;
use axum::{body::Body, routing::get, Router};
use http::{Request, StatusCode};
use redis_support::RedisServer;
use tokio::time::Instant;
use tower::ServiceExt;
use tower_throttle::key::Global;
use tower_throttle::{
    redis::{RedisBackend, RedisMode},
    OnBackendError, Policy, Quota, ThrottleLayer,
};

const LARGE_BURST: Quota = Quota::cl_throttle(10_000, 1, Duration::from_secs(60));
const TIMEOUT: Duration = Duration::from_millis(100);
/// What a request may take beyond the timeout: scheduling on a loaded 2-core machine, with room to
/// spare. A request that waited for Redis instead of its timeout would wait until Redis is back,
/// which here is only after every request of the outage or freeze has been answered: forever.
const STALL: Duration = Duration::from_secs(2);
/// How long Redis may take to decide again once it is back: the breaker opens for 500 ms at most,
/// and the rest is room for a loaded machine.
const RECOVERY: Duration = Duration::from_secs(10);

#[derive(Debug)]
struct Answer {
    status: StatusCode,
    took: Duration,
    /// `RateLimit` was sent: a limiter decided (Redis, or the local one).
    decided: bool,
    retry_after: Option<String>,
}

async fn app(server: &RedisServer, on_error: OnBackendError, quota: Quota) -> Router {
    let backend = RedisBackend::builder()
        .url(server.url())
        .mode(RedisMode::Auto)
        .timeout(TIMEOUT)
        .connect()
        .await
        .unwrap();
    let layer = ThrottleLayer::builder()
        .backend(backend)
        .policy(
            Policy::builder("api")
                .quota(quota)
                .key(Global)
                .build()
                .unwrap(),
        )
        .on_backend_error(on_error)
        .build()
        .unwrap();
    Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer)
}

/// One request, which must be answered within the timeout (and [`STALL`]).
async fn ask(app: &Router) -> Answer {
    let start = Instant::now();
    let request = app
        .clone()
        .oneshot(Request::get("/").body(Body::empty()).unwrap());
    let response = tokio::time::timeout(TIMEOUT + STALL, request)
        .await
        .unwrap_or_else(|_| panic!("no answer within {:?}", TIMEOUT + STALL))
        .unwrap();
    Answer {
        status: response.status(),
        took: start.elapsed(),
        decided: response.headers().contains_key("ratelimit"),
        retry_after: response
            .headers()
            .get("retry-after")
            .map(|v| v.to_str().unwrap().to_owned()),
    }
}

/// `count` requests, one every 10 ms or more.
async fn stream(app: &Router, count: usize) -> Vec<Answer> {
    let mut answers = Vec::new();
    for _ in 0..count {
        answers.push(ask(app).await);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    answers
}

/// How many of `answers` waited for the timeout: a request that fails fast takes a few ms, one
/// that waits takes the timeout at least (a timer never fires early), so only a machine stalled
/// for most of a stream could make fast ones look like waiting.
fn waited(answers: &[Answer]) -> usize {
    answers.iter().filter(|a| a.took >= TIMEOUT).count()
}

/// Stops Redis mid-stream, checks the answers during the outage with `during`, starts Redis again on
/// the same port and waits (at most [`RECOVERY`]) for a decision that Redis made.
async fn outage(on_error: OnBackendError, during: impl Fn(&Answer)) {
    let mut server = RedisServer::start();
    // A burst of 10,000, one more a minute: nothing is limited, and each admission keeps the key a
    // minute longer, so the key exists exactly when Redis has admitted a request.
    let app = app(&server, on_error, LARGE_BURST).await;
    let before = stream(&app, 20).await;
    assert!(before
        .iter()
        .all(|a| a.status == StatusCode::OK && a.decided));

    server.stop();
    let down = stream(&app, 40).await;
    let mut took: Vec<Duration> = down.iter().map(|a| a.took).collect();
    took.sort();
    eprintln!(
        "{} answers while down; median {:?}, max {:?}",
        down.len(),
        took[took.len() / 2],
        took[took.len() - 1]
    );
    // A stopped Redis refuses connections at once, and the breaker answers while it is open: the
    // outage costs the requests nothing beyond the failure policy.
    assert!(waited(&down) * 2 < down.len(), "{down:?}");
    for answer in &down {
        during(answer);
    }

    server.restart();
    assert_eq!(server.cli(&["EXISTS", "throttle:api:{*}"]), "0");
    let back = Instant::now();
    loop {
        let answer = ask(&app).await;
        // The key exists again only because Redis admitted a request.
        if answer.status == StatusCode::OK && server.cli(&["EXISTS", "throttle:api:{*}"]) == "1" {
            break;
        }
        assert!(
            back.elapsed() < RECOVERY,
            "no decision from Redis {RECOVERY:?} after it came back; last: {answer:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fail_open_admits_while_redis_is_down() {
    outage(OnBackendError::Allow, |a| {
        assert_eq!(a.status, StatusCode::OK, "{a:?}");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fail_closed_answers_503_with_retry_after() {
    outage(OnBackendError::Deny, |a| {
        assert_eq!(a.status, StatusCode::SERVICE_UNAVAILABLE, "{a:?}");
        assert_eq!(a.retry_after.as_deref(), Some("1"), "{a:?}");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_limiter_takes_over_while_redis_is_down() {
    outage(OnBackendError::Local, |a| {
        assert_eq!(a.status, StatusCode::OK, "{a:?}");
        assert!(a.decided, "the local limiter sends RateLimit: {a:?}");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_limiter_enforces_the_quota() {
    let mut server = RedisServer::start();
    let app = app(&server, OnBackendError::Local, Quota::per_minute(5)).await;
    server.stop();
    let mut statuses = Vec::new();
    for _ in 0..8 {
        statuses.push(ask(&app).await.status);
    }
    assert_eq!(
        statuses.iter().filter(|s| **s == StatusCode::OK).count(),
        5,
        "{statuses:?}"
    );
    assert!(statuses[5..]
        .iter()
        .all(|s| *s == StatusCode::TOO_MANY_REQUESTS));
}

/// Freezes the server's process (SIGSTOP) until dropped (SIGCONT): a frozen Redis keeps its
/// connections open and answers nothing.
pub(crate) struct Frozen(String);

pub(crate) fn freeze(server: &RedisServer) -> Frozen {
    let info = server.cli(&["INFO", "server"]);
    let pid = info
        .lines()
        .find_map(|l| l.strip_prefix("process_id:"))
        .unwrap()
        .trim()
        .to_owned();
    kill("-STOP", &pid);
    Frozen(pid)
}

impl Drop for Frozen {
    fn drop(&mut self) {
        kill("-CONT", &self.0);
    }
}

fn kill(sig: &str, pid: &str) {
    let status = std::process::Command::new("kill")
        .args([sig, pid])
        .status()
        .unwrap();
    assert!(status.success(), "kill {sig} {pid}");
}

/// A Redis that accepts connections but does not answer (stopped with SIGSTOP): requests wait no
/// longer than the timeout, and most not at all; when it answers again, so do the decisions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_redis_costs_each_request_at_most_the_timeout() {
    let server = RedisServer::start();
    let app = app(&server, OnBackendError::Deny, LARGE_BURST).await;
    assert_eq!(ask(&app).await.status, StatusCode::OK);

    let freezing = freeze(&server);
    let frozen = stream(&app, 40).await;
    drop(freezing);
    assert!(frozen
        .iter()
        .all(|a| a.status == StatusCode::SERVICE_UNAVAILABLE));
    // The first call waits for the timeout; later ones fail fast, but for the probes (a few: the
    // breaker stays open 50, 100, 200, 400 ms between them).
    assert!(frozen[0].took >= TIMEOUT, "{frozen:?}");
    eprintln!(
        "{} of {} waited for the timeout",
        waited(&frozen),
        frozen.len()
    );
    assert!(waited(&frozen) * 2 < frozen.len(), "{frozen:?}");

    let back = Instant::now();
    while ask(&app).await.status != StatusCode::OK {
        assert!(back.elapsed() < RECOVERY, "Redis never decided again");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Many requests in flight when Redis freezes all fail, but they do not stretch the breaker: once
/// Redis answers again, decisions come back within the shortest open time and a probe, not seconds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_in_flight_during_a_freeze_do_not_delay_recovery() {
    let server = RedisServer::start();
    let app = app(&server, OnBackendError::Deny, LARGE_BURST).await;
    assert_eq!(ask(&app).await.status, StatusCode::OK);
    // From the last failure to the first decision from Redis: the 50 ms the breaker opens for,
    // the unfreeze and one probe; a breaker stretched by the 64 failures stays open 500 ms after
    // the last one. The fastest of three rounds tells them apart even when a busy machine stalls
    // one or two.
    let mut recoveries = Vec::new();
    for _ in 0..3 {
        let freezing = freeze(&server);
        let in_flight: Vec<_> = (0..64)
            .map(|_| {
                let app = app.clone();
                tokio::spawn(async move {
                    let answer = ask(&app).await;
                    (answer, Instant::now())
                })
            })
            .collect();
        let mut last_failure = None;
        for task in in_flight {
            let (answer, at) = task.await.unwrap();
            assert_eq!(answer.status, StatusCode::SERVICE_UNAVAILABLE, "{answer:?}");
            last_failure = last_failure.max(Some(at));
        }
        drop(freezing);
        let last_failure = last_failure.unwrap();
        while ask(&app).await.status != StatusCode::OK {
            assert!(
                last_failure.elapsed() < RECOVERY,
                "Redis never decided again"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        recoveries.push(last_failure.elapsed());
    }
    eprintln!("recovered {recoveries:?} after the last failure");
    let fastest = *recoveries.iter().min().unwrap();
    assert!(fastest < Duration::from_millis(400), "{recoveries:?}");
}

/// While the circuit is open, checks fail at once; a caller that retries at once on a one-thread
/// runtime still lets the runtime's other tasks run (a fast failure spends the task's cooperative
/// budget), the probe that closes the circuit among them. Before, a load task of the resharding
/// test spun on its node's fast failures while the background probe waited to be polled, and the
/// test hung with every server idle.
#[tokio::test]
async fn a_caller_retrying_fast_failures_at_once_lets_other_tasks_run() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use tower_throttle::{Key, Limit};

    let server = RedisServer::start();
    let backend = RedisBackend::builder()
        .url(server.url())
        .mode(RedisMode::Lua)
        .timeout(Duration::from_millis(100))
        .connect()
        .await
        .unwrap();
    let (limit, key) = (
        Limit::new("spin", Quota::per_second(10)).unwrap(),
        Key::from("spin"),
    );
    assert!(backend.check_one(&limit, &key, 1).await.unwrap().allowed);
    let frozen = freeze(&server);
    // Times out: the circuit opens, and the next checks fail at once.
    assert!(backend.check_one(&limit, &key, 1).await.is_err());
    let ran = Arc::new(AtomicBool::new(false));
    tokio::spawn({
        let ran = ran.clone();
        async move { ran.store(true, Ordering::SeqCst) }
    });
    let mut failures = 0;
    while !ran.load(Ordering::SeqCst) {
        assert!(backend.check_one(&limit, &key, 1).await.is_err());
        failures += 1;
        assert!(
            failures <= 1000,
            "{failures} failures in a row let no other task run"
        );
    }
    drop(frozen);
}

/// Redis stops while no request comes: readiness checks still find out (the resets subscription
/// ends, and the backend probes), and find it back once Redis is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_says_down_without_traffic_and_up_again() {
    let mut server = RedisServer::start();
    let backend = crate::backend::connect(&server.url(), RedisMode::Lua).await;
    assert!(backend.health().is_healthy(), "{}", backend.health());
    server.stop();
    let deadline = Instant::now() + RECOVERY;
    while backend.health().is_healthy() {
        assert!(
            Instant::now() < deadline,
            "still healthy {RECOVERY:?} after Redis stopped: {}",
            backend.health()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    server.restart();
    let deadline = Instant::now() + RECOVERY;
    while !backend.health().is_healthy() {
        assert!(
            Instant::now() < deadline,
            "not healthy {RECOVERY:?} after Redis came back: {}",
            backend.health()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
