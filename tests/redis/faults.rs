//! The failure contract on a faulty link (issue 50): a real `redis-server` behind the fault proxy
//! (`tests/support/fault_proxy.rs`), reached through the layer as users reach it (an axum `Router`
//! with a `ThrottleLayer` on a `RedisBackend` pointed at the proxy, timeout 100 ms).
//!
//! What each test holds to:
//! - every request is answered within [`BOUND`] (the timeout + 50 ms), by Redis or by the failure
//!   policy; never a 500, a panic or a hang: under a slow link (beyond the timeout), a black hole,
//!   torn replies, 1-byte slices, resets and refused connections; on the coalesced Lua path, the Lua
//!   path alone and `CL.THROTTLE`;
//! - torn and reset replies never make the layer admit more than the limit, and a batch never hands
//!   one caller another's reply: the admissions and `remaining` values seen are checked against
//!   Redis' own state afterwards;
//! - a slow link below the timeout decides exactly: 40 concurrent requests for a key of 10 get 10
//!   admissions and 30 refusals from Redis, none from the failure policy;
//! - once the link heals, Redis decides again within [`RECOVERY`];
//! - 1,000 resets leave no connection, descriptor or task behind.

use crate::support::fault_proxy::{Direction, FaultProxy};
use crate::support::redis as redis_support;

use std::collections::BTreeSet;
use std::time::Duration;

use axum::{body::Body, routing::get, Router};
use http::{Request, StatusCode};
use redis_support::RedisServer;
use tokio::time::Instant;
use tower::ServiceExt;
use tower_throttle::key::Header;
use tower_throttle::{
    redis::{RedisBackend, RedisMode},
    OnBackendError, Policy, Quota, ThrottleLayer,
};

/// The backend's timeout.
const TIMEOUT: Duration = Duration::from_millis(100);
/// The contract: every request is answered within the timeout and this margin.
const MARGIN: Duration = Duration::from_millis(50);
const BOUND: Duration = Duration::from_millis(150);
/// How long a request may take before the test calls it a hang (and fails) rather than wait.
const HANG: Duration = Duration::from_secs(5);
/// How long after the heal Redis must decide again (measured: see each test's output).
const RECOVERY: Duration = Duration::from_secs(3);
/// The proxy's seed: jitter is reproducible.
const SEED: u64 = 50;

/// Which of the users' paths a backend takes.
#[derive(Clone, Copy, Debug)]
enum Path {
    /// `mode = "lua"`, checks coalesced into batches (the default).
    Coalesced,
    /// `mode = "lua"`, each check its own call.
    Alone,
    /// `CL.THROTTLE` (redis-cell), pipelined batches.
    Cell,
}

const PATHS: [Path; 3] = [Path::Coalesced, Path::Alone, Path::Cell];

/// A server for `path`, and the proxy in front of it.
fn server_and_proxy(path: Path) -> (RedisServer, FaultProxy) {
    let server = match path {
        Path::Cell => RedisServer::start_with_cell(),
        _ => RedisServer::start(),
    };
    let proxy = FaultProxy::start(server.port(), SEED);
    (server, proxy)
}

/// The layer on a backend that reaches Redis through `proxy`, one policy `api` of `quota` per
/// `x-user`.
async fn app(proxy: &FaultProxy, path: Path, on_error: OnBackendError, quota: Quota) -> Router {
    let (mode, coalesce) = match path {
        Path::Coalesced => (RedisMode::Lua, true),
        Path::Alone => (RedisMode::Lua, false),
        Path::Cell => (RedisMode::Cell, true),
    };
    let backend = RedisBackend::builder()
        .url(proxy.url())
        .mode(mode)
        .coalesce(coalesce)
        .timeout(TIMEOUT)
        .connect()
        .await
        .unwrap();
    let policy = Policy::builder("api")
        .quota(quota)
        .key(Header::new("x-user"))
        .build()
        .unwrap();
    let layer = ThrottleLayer::builder()
        .backend(backend)
        .policy(policy)
        .on_backend_error(on_error)
        .build()
        .unwrap();
    Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer)
}

/// The Redis key of `user` under the policy `api` (the default prefix).
fn redis_key(user: &str) -> String {
    format!("throttle:api:{{{user}}}")
}

#[derive(Debug)]
struct Answer {
    user: String,
    status: StatusCode,
    took: Duration,
    /// `RateLimit`'s `r`: sent when a limiter decided (Redis or the local one), not by `allow` or
    /// `deny` in its stead.
    remaining: Option<u64>,
}

/// One request as `user`; fails the test if it takes [`HANG`].
async fn ask(app: &Router, user: &str) -> Answer {
    let start = Instant::now();
    let request = Request::get("/")
        .header("x-user", user)
        .body(Body::empty())
        .unwrap();
    let response = tokio::time::timeout(HANG, app.clone().oneshot(request))
        .await
        .unwrap_or_else(|_| panic!("a request hung: no answer within {HANG:?}"))
        .unwrap();
    let remaining = response.headers().get("ratelimit").map(|v| {
        let v = v.to_str().unwrap();
        let r = v.split(';').find_map(|f| f.strip_prefix("r=")).unwrap();
        r.parse().unwrap()
    });
    Answer {
        user: user.to_owned(),
        status: response.status(),
        took: start.elapsed(),
        remaining,
    }
}

/// One request per entry of `users`, all at once.
async fn at_once(app: &Router, users: &[String]) -> Vec<Answer> {
    let tasks: Vec<_> = users
        .iter()
        .map(|user| {
            let (app, user) = (app.clone(), user.clone());
            tokio::spawn(async move { ask(&app, &user).await })
        })
        .collect();
    let mut answers = Vec::new();
    for task in tasks {
        answers.push(task.await.unwrap());
    }
    answers
}

/// How many units Redis admitted for `user` under `per_hour` (the GCRA's state: its TAT is one
/// interval ahead per unit admitted, less the few seconds a test takes; expired: none).
fn admitted_by_redis(server: &RedisServer, user: &str, per_hour: u64) -> u64 {
    let pttl: i64 = server.cli(&["PTTL", &redis_key(user)]).parse().unwrap();
    let interval_ms = 3_600_000 / per_hour as i64;
    if pttl <= 0 {
        0
    } else {
        ((pttl + interval_ms - 1) / interval_ms) as u64
    }
}

/// A slow link below the timeout decides every request exactly: each reply is held 30 ± 15 ms,
/// then a steady 60 ± 10 ms (a round trip of at most 70 ms, 30 under the timeout); 40 concurrent
/// requests for a key with a limit of 10, under `allow`, get exactly 10 admissions and 30 refusals
/// from Redis, and Redis counts 10. Before, checks queued behind the batch in flight waited for it,
/// took two round trips, timed out, and `allow` let all 40 through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_link_below_the_timeout_decides_exactly() {
    let (server, proxy) = server_and_proxy(Path::Coalesced);
    let app = app(
        &proxy,
        Path::Coalesced,
        OnBackendError::Allow,
        Quota::per_hour(10),
    )
    .await;
    let rounds = [
        (Duration::from_millis(30), Duration::from_millis(15)),
        (Duration::from_millis(30), Duration::from_millis(15)),
        (Duration::from_millis(30), Duration::from_millis(15)),
        (Duration::from_millis(60), Duration::from_millis(10)),
        (Duration::from_millis(60), Duration::from_millis(10)),
    ];
    for (round, (base, jitter)) in rounds.into_iter().enumerate() {
        proxy.latency(Direction::ToClient, base, jitter);
        let user = format!("slow-{round}");
        let answers = at_once(&app, &vec![user.clone(); 40]).await;
        let slowest = answers.iter().map(|a| a.took).max().unwrap();
        eprintln!("replies held {base:?} ± {jitter:?}: slowest answer {slowest:?}");
        let fallback: Vec<&Answer> = answers.iter().filter(|a| a.remaining.is_none()).collect();
        assert!(
            fallback.is_empty(),
            "{base:?} ± {jitter:?}: {} of 40 answered by the failure policy, not Redis: {fallback:?}",
            fallback.len()
        );
        let admitted: Vec<u64> = answers
            .iter()
            .filter(|a| a.status == StatusCode::OK)
            .filter_map(|a| a.remaining)
            .collect();
        let refused = answers
            .iter()
            .filter(|a| a.status == StatusCode::TOO_MANY_REQUESTS)
            .count();
        assert_eq!((admitted.len(), refused), (10, 30), "{answers:?}");
        // Each admission saw the state the one before it left.
        let distinct: BTreeSet<u64> = admitted.into_iter().collect();
        assert_eq!(distinct, (0..10).collect(), "{answers:?}");
        assert_eq!(admitted_by_redis(&server, &user, 10), 10);
        assert!(slowest <= BOUND, "{answers:?}");
    }
}
