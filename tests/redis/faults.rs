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
//! - 1,000 resets leave no connection, descriptor or task behind;
//! - one process of two cut off under `local` (a black hole, refused connections): the fleet
//!   admits at most 2 × the quota, and after the heal the cut-off process refuses a key the other
//!   used up within [`RECOVERY`].
//!
//! src/guide/failure.md is the contract these tests prove, with the figures they print
//! (`cargo test --all-features --test redis faults:: -- --nocapture`).

use crate::support::asks::Asks;
use crate::support::fault_proxy::{Direction, FaultProxy};
use crate::support::redis as redis_support;

use std::collections::BTreeSet;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use axum::{body::Body, routing::get, Router};
use http::{Request, StatusCode};
use redis_support::RedisServer;
use tokio::time::Instant;
use tower::ServiceExt;
use tower_throttle::key::Header;
use tower_throttle::{
    policy::Penalty,
    redis::{RedisBackend, RedisMode},
    Algorithm, Key, Limit, OnBackendError, Policy, Quota, ThrottleLayer,
};

/// The backend's timeout.
const TIMEOUT: Duration = Duration::from_millis(100);
/// The contract: every request is answered within the timeout and this margin.
const MARGIN: Duration = Duration::from_millis(50);
const BOUND: Duration = TIMEOUT.saturating_add(MARGIN);
/// How long a request may take before the test calls it a hang (and fails) rather than wait.
const HANG: Duration = Duration::from_secs(5);
/// How long after the heal Redis must decide again (measured: see each test's output).
const RECOVERY: Duration = Duration::from_secs(3);
/// The pause of a client between two requests.
const PACE: Duration = Duration::from_millis(10);
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

/// A backend that reaches Redis through `proxy` on `path`.
async fn backend(proxy: &FaultProxy, path: Path) -> RedisBackend {
    let (mode, coalesce) = match path {
        Path::Coalesced => (RedisMode::Lua, true),
        Path::Alone => (RedisMode::Lua, false),
        Path::Cell => (RedisMode::Cell, true),
    };
    connect(proxy.url(), mode, coalesce).await
}

/// A backend on `url`. The eager start fails fast when setting up the connection (connect,
/// `HELLO`, the path's probe, loading the batch script: several round trips) takes longer than
/// the timeout, as it should; on a machine loaded beside the tests it sometimes does, so the start
/// is tried up to 5 times. The faults come after it.
async fn connect(url: String, mode: RedisMode, coalesce: bool) -> RedisBackend {
    let mut tries = 0;
    loop {
        let started = RedisBackend::builder()
            .url(url.clone())
            .mode(mode)
            .coalesce(coalesce)
            .timeout(TIMEOUT)
            .connect()
            .await;
        match started {
            Ok(backend) => return backend,
            Err(e) if tries < 4 => {
                tries += 1;
                eprintln!("connecting to {url}, try {tries}: {e}");
            }
            Err(e) => panic!("cannot start a backend on {url} in 5 tries: {e}"),
        }
    }
}

/// The layer of one policy `name` of `quota` per `x-user` on `backend`.
fn app_on(backend: RedisBackend, name: &str, quota: Quota, on_error: OnBackendError) -> Router {
    let policy = Policy::builder(name)
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

/// The layer of the policy `api` of `quota` per `x-user`, on a backend through `proxy`.
async fn app(proxy: &FaultProxy, path: Path, on_error: OnBackendError, quota: Quota) -> Router {
    app_on(backend(proxy, path).await, "api", quota, on_error)
}

/// The Redis key of `user` under the policy `policy` (the default prefix).
fn redis_key(policy: &str, user: &str) -> String {
    format!("throttle:{policy}:{{{user}}}")
}

#[derive(Debug)]
struct Answer {
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

/// How many units Redis admitted for `user` under the policy `policy` of `per_day` a day (the
/// GCRA's state: its TAT is one interval ahead per unit admitted, less the seconds a test takes,
/// far shorter than an interval; expired: none).
fn admitted_by_redis(server: &RedisServer, policy: &str, user: &str, per_day: u64) -> u64 {
    let pttl: i64 = server
        .cli(&["PTTL", &redis_key(policy, user)])
        .parse()
        .unwrap();
    let interval_ms = 86_400_000 / per_day as i64;
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
        Quota::per_day(10),
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
        assert_eq!(admitted_by_redis(&server, "api", &user, 10), 10);
        assert!(slowest <= BOUND, "{answers:?}");
    }
}

/// More checks at once than two batches hold, over a link whose replies take 25 ms: every one is decided
/// by Redis within the timeout. Before, a lane sent at most two batches (256 checks) a round trip,
/// and the checks queued behind them waited round trips until they timed out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn more_checks_than_two_batches_hold_are_decided_over_a_slow_link() {
    let (_server, proxy) = server_and_proxy(Path::Coalesced);
    let backend = backend(&proxy, Path::Coalesced).await;
    proxy.latency(
        Direction::ToClient,
        Duration::from_millis(25),
        Duration::ZERO,
    );
    let limit = Limit::new("wide", Quota::per_second(1_000_000)).unwrap();
    let checks: Vec<_> = (0..2_500)
        .map(|i| {
            let (backend, limit) = (backend.clone(), limit.clone());
            tokio::spawn(async move {
                let sent = Instant::now();
                let decided = backend.check_one(&limit, &Key::from(i as u64), 1).await;
                (decided.map(|d| d.allowed), sent.elapsed())
            })
        })
        .collect();
    let mut failed = Vec::new();
    let mut slowest = Duration::ZERO;
    for check in checks {
        let (decided, took) = check.await.unwrap();
        slowest = slowest.max(took);
        match decided {
            Ok(true) => {}
            other => failed.push(other),
        }
    }
    eprintln!("2,500 checks at once over 25 ms: slowest {slowest:?}");
    assert!(
        failed.is_empty(),
        "{} of 2,500 not decided: {:?}",
        failed.len(),
        &failed[..failed.len().min(3)]
    );
}

/// The first check to queue behind two batches in flight ends the wait of those that queue after
/// it when the window ends; if its client goes away first, the window still ends theirs. Before,
/// they waited for a batch ahead to answer, then their own round trip: past a timeout of 200 ms
/// with replies taking 120 ms (about 125 ms now, 240 before).
#[tokio::test]
async fn checks_queued_behind_a_dropped_check_still_leave_at_the_window() {
    let (_server, proxy) = server_and_proxy(Path::Coalesced);
    let backend = RedisBackend::builder()
        .url(proxy.url())
        .mode(RedisMode::Lua)
        .timeout(Duration::from_millis(200))
        .connect()
        .await
        .unwrap();
    proxy.latency(
        Direction::ToClient,
        Duration::from_millis(120),
        Duration::ZERO,
    );
    let limit = Limit::new("window", Quota::per_second(1_000_000)).unwrap();
    let check = |i: u64| {
        let (backend, limit) = (backend.clone(), limit.clone());
        tokio::spawn(async move {
            let sent = Instant::now();
            let decided = backend.check_one(&limit, &Key::from(i), 1).await;
            (decided.map(|d| d.allowed), sent.elapsed())
        })
    };
    // Two batches in flight (one check each), then the first to queue, gone at once.
    let ahead = [check(0), check(1)];
    tokio::task::yield_now().await;
    let first = check(2);
    tokio::task::yield_now().await;
    first.abort();
    tokio::task::yield_now().await;
    let behind = [check(3), check(4)];
    for task in behind.into_iter().chain(ahead) {
        let (decided, took) = task.await.unwrap();
        assert!(matches!(decided, Ok(true)), "{decided:?} after {took:?}");
    }
}

/// The faults of the contract.
#[derive(Clone, Copy, Debug)]
enum Fault {
    /// Each reply held 150 ± 20 ms: past the timeout.
    Slow,
    /// Every connection silent for good, new ones too while it lasts.
    BlackHole,
    /// Open connections cut after 7 to 86 more bytes of replies and reset, every 10 ms.
    Torn,
    /// Replies in 1-byte writes.
    Sliced,
    /// Every connection reset every 10 ms.
    Reset,
    /// Connections reset, and new ones refused.
    Refused,
    /// Open connections cut after 150 to 1,050 more bytes of replies, in 1-byte slices every other
    /// 20 ms, every connection reset every 100 ms: some decisions get through.
    Mixed,
}

/// A concurrency check that failed without reaching Redis (no connection, a circuit failing fast)
/// took no slot: it gives nothing back, where each spawned a release retried for a whole lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrency_checks_that_never_left_give_nothing_back() {
    let (server, proxy) = server_and_proxy(Path::Alone);
    let backend = backend(&proxy, Path::Alone).await;
    let limit = Limit::with_algorithm("slots", Algorithm::Concurrency, Quota::per_second(5))
        .unwrap()
        .with_lease(Duration::from_secs(5))
        .unwrap();
    let key = Key::from("k");
    assert!(backend.check_one(&limit, &key, 1).await.unwrap().allowed);
    proxy.refuse(true).await;
    proxy.reset_all();
    tokio::time::sleep(Duration::from_millis(300)).await;
    server.cli(&["CONFIG", "RESETSTAT"]);
    for _ in 0..200 {
        assert!(backend.check_one(&limit, &key, 1).await.is_err());
    }
    proxy.heal().await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let stats = server.cli(&["INFO", "commandstats"]);
    let zrem = stats.lines().find(|l| l.starts_with("cmdstat_zrem:"));
    assert_eq!(
        zrem, None,
        "slots given back that were never taken: {zrem:?}"
    );
}

/// In `Auto` mode the module is detected again every 30 s: by one decision, while those arriving
/// meanwhile take the path known (each ran a detection of its own, and on a slow link waited for
/// it). Waits out the 30 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_mode_detects_once_for_decisions_arriving_together() {
    let (server, proxy) = server_and_proxy(Path::Cell);
    let backend = connect(proxy.url(), RedisMode::Auto, false).await;
    let limit = Limit::new("detect", Quota::per_second(1_000)).unwrap();
    let key = Key::from("k");
    assert!(backend.check_one(&limit, &key, 1).await.is_ok());
    tokio::time::sleep(Duration::from_millis(30_500)).await;
    proxy.latency(
        Direction::ToClient,
        Duration::from_millis(20),
        Duration::ZERO,
    );
    server.cli(&["CONFIG", "RESETSTAT"]);
    let checks: Vec<_> = (0..50)
        .map(|_| {
            let (backend, limit, key) = (backend.clone(), limit.clone(), key.clone());
            tokio::spawn(async move { backend.check_one(&limit, &key, 1).await.is_ok() })
        })
        .collect();
    for check in checks {
        assert!(check.await.unwrap());
    }
    let stats = server.cli(&["INFO", "commandstats"]);
    let detections = stats
        .lines()
        .find(|l| l.starts_with("cmdstat_command|info:"));
    let calls: u64 = detections.map_or(0, |l| {
        let calls = l.split_once("calls=").unwrap().1;
        calls.split(',').next().unwrap().parse().unwrap()
    });
    assert_eq!(calls, 1, "{detections:?}");
}

/// A check that timed out makes the module be detected again (a failover may have changed the
/// server), beside the checks: on a link slow enough that a detection and a check together
/// outlast the timeout, the check that carried it would time out, and each after it in turn
/// (the breaker opened by each, its probe carrying the next detection).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn detecting_again_after_a_slow_reply_fails_no_check() {
    let (_server, proxy) = server_and_proxy(Path::Cell);
    // A timeout of 300 ms and replies of 180: a check alone has 120 ms to spare on a loaded
    // machine, a detection and a check together outlast it.
    let backend = RedisBackend::builder()
        .url(proxy.url())
        .mode(RedisMode::Auto)
        .coalesce(false)
        .timeout(Duration::from_millis(300))
        .connect()
        .await
        .unwrap();
    let limit = Limit::new("redetect", Quota::per_second(1_000)).unwrap();
    let key = Key::from("k");
    assert!(backend.check_one(&limit, &key, 1).await.is_ok());
    let slow = |ms| {
        proxy.latency(
            Direction::ToClient,
            Duration::from_millis(ms),
            Duration::ZERO,
        )
    };
    slow(400);
    assert!(
        backend.check_one(&limit, &key, 1).await.is_err(),
        "past the timeout"
    );
    slow(180);
    // The one check failing let nothing answer: the breaker opened, and its probe is a check.
    let waited = Instant::now();
    while backend.check_one(&limit, &key, 1).await.is_err() {
        assert!(
            waited.elapsed() < Duration::from_secs(10),
            "no check passed in 10 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for i in 0..8 {
        let check = backend.check_one(&limit, &key, 1).await;
        assert!(check.is_ok(), "check {i}: {:?}", check.err());
    }
    assert_eq!(backend.active_path(), Some(RedisMode::Cell));
}

/// A link fast enough for decisions but slow for the set-up's scripts (about 90 KB, loaded at once
/// on every connection) still connects: the set-up has the connection attempt's budget, not one
/// decision's timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_link_too_slow_to_load_the_scripts_in_one_timeout_connects() {
    let (_server, proxy) = server_and_proxy(Path::Alone);
    proxy.bandwidth(Direction::ToServer, Some(400_000));
    let started = RedisBackend::builder()
        .url(proxy.url())
        .mode(RedisMode::Lua)
        .coalesce(false)
        .timeout(TIMEOUT)
        .connect()
        .await;
    let backend = started.expect("connected");
    let limit = Limit::new("slow-setup", Quota::per_second(10)).unwrap();
    assert!(
        backend
            .check_one(&limit, &Key::from("k"), 1)
            .await
            .unwrap()
            .allowed
    );
}

/// A connection idle for longer than the stall limit is not dropped for one slow reply: it
/// answered nothing meanwhile only because nothing was asked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_connections_one_slow_reply_keeps_it() {
    let (_server, proxy) = server_and_proxy(Path::Alone);
    let app = app(
        &proxy,
        Path::Alone,
        OnBackendError::Allow,
        Quota::per_day(10),
    )
    .await;
    assert!(ask(&app, "idle").await.remaining.is_some());
    let connections = proxy.accepted();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    proxy.latency(
        Direction::ToClient,
        Duration::from_millis(150),
        Duration::ZERO,
    );
    assert_eq!(ask(&app, "idle").await.remaining, None, "timed out");
    proxy.latency(Direction::ToClient, Duration::ZERO, Duration::ZERO);
    until_redis_decides(&app, "idle").await;
    assert_eq!(
        proxy.accepted(),
        connections,
        "the connection was made again"
    );
}

/// A link that decides within the timeout connects too, though connecting takes more round trips
/// than a call: TLS (its handshake, then logging in) over a 70 ms round trip, timeout 100 ms.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_link_that_decides_within_the_timeout_connects() {
    let server = RedisServer::start_tls();
    let proxy = FaultProxy::start(server.port(), SEED);
    for direction in [Direction::ToServer, Direction::ToClient] {
        proxy.latency(direction, Duration::from_millis(35), Duration::ZERO);
    }
    let url = server.url().replace(
        &format!(":{}/", server.port()),
        &format!(":{}/", proxy.addr().port()),
    );
    let ca = std::fs::read(server.ca_cert_path().unwrap()).unwrap();
    let certificates = redis::TlsCertificates {
        client_tls: None,
        root_cert: Some(ca),
    };
    let client = redis::Client::build_with_tls(url, certificates).unwrap();
    let backend = RedisBackend::builder()
        .client(client)
        .mode(RedisMode::Lua)
        .timeout(TIMEOUT)
        .connect()
        .await
        .expect("a link that decides within the timeout connects");
    let limit = Limit::new("tls-slow", Quota::per_minute(1)).unwrap();
    let key = Key::from("k");
    assert!(backend.check_one(&limit, &key, 1).await.unwrap().allowed);
    assert!(!backend.check_one(&limit, &key, 1).await.unwrap().allowed);
}

/// Runs `work` while `fault` holds on `proxy` (kept up by a storm where it must be repeated), then
/// ends the fault and returns what `work` returned.
async fn under<T>(proxy: &FaultProxy, fault: Fault, work: impl Future<Output = T>) -> T {
    match fault {
        Fault::Slow => proxy.latency(
            Direction::ToClient,
            Duration::from_millis(150),
            Duration::from_millis(20),
        ),
        Fault::BlackHole => proxy.black_hole(true),
        Fault::Sliced => proxy.slice_replies(true),
        Fault::Refused => {
            proxy.refuse(true).await;
            proxy.reset_all();
        }
        Fault::Torn | Fault::Reset | Fault::Mixed => {}
    }
    let done = AtomicBool::new(false);
    let storm = async {
        let mut round = 0;
        while !done.load(Ordering::SeqCst) {
            match fault {
                Fault::Torn => proxy.cut_replies_after(Some(7 + round * 13 % 80)),
                Fault::Reset => proxy.reset_all(),
                Fault::Mixed if round % 2 == 0 => {
                    proxy.cut_replies_after(Some(150 + round * 37 % 900));
                    proxy.slice_replies(round % 4 == 0);
                    if round % 10 == 0 {
                        proxy.reset_all();
                    }
                }
                _ => {}
            }
            round += 1;
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    let work = async {
        let out = work.await;
        done.store(true, Ordering::SeqCst);
        out
    };
    let (out, ()) = tokio::join!(work, storm);
    proxy.heal().await;
    out
}

/// `workers` clients at once, each sending `each` requests one after another as `{prefix}-{i}`.
async fn clients(app: &Router, prefix: &str, workers: usize, each: usize) -> Vec<Answer> {
    let users: Vec<String> = (0..workers).map(|i| format!("{prefix}-{i}")).collect();
    clients_as(app, &users, each).await
}

/// A client per entry of `users`, all at once, each sending `each` requests one after another,
/// [`PACE`] apart.
async fn clients_as(app: &Router, users: &[String], each: usize) -> Vec<Answer> {
    let tasks: Vec<_> = users
        .iter()
        .map(|user| {
            let (app, user) = (app.clone(), user.clone());
            tokio::spawn(async move {
                let mut answers = Vec::new();
                for _ in 0..each {
                    answers.push(ask(&app, &user).await);
                    tokio::time::sleep(PACE).await;
                }
                answers
            })
        })
        .collect();
    let mut answers = Vec::new();
    for task in tasks {
        answers.extend(task.await.unwrap());
    }
    answers
}

/// Asks as `user` until Redis decides (under `deny`, a 200 is Redis' admission); returns how long
/// that took. Fails after [`RECOVERY`].
async fn until_redis_decides(app: &Router, user: &str) -> Duration {
    let healed = Instant::now();
    loop {
        let answer = ask(app, user).await;
        if answer.status == StatusCode::OK && answer.remaining.is_some() {
            return healed.elapsed();
        }
        assert!(
            healed.elapsed() < RECOVERY,
            "Redis did not decide {RECOVERY:?} after the heal; last: {answer:?}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Under `fault`, on each path, under `deny`: 8 clients of 10 requests each are all answered
/// within [`BOUND`], by Redis (200 or 429 with `RateLimit`) or by the failure policy (503), never
/// otherwise; the answers the fault cannot disturb (slices) all come from Redis, those it must
/// (beyond the timeout, silent, refused) all from the policy. After the heal, Redis decides again
/// within [`RECOVERY`].
async fn every_request_is_answered_within_the_bound(fault: Fault) {
    for path in PATHS {
        let (_server, proxy) = server_and_proxy(path);
        let app = app(&proxy, path, OnBackendError::Deny, Quota::per_day(1000)).await;
        let user = format!("{fault:?}");
        assert_eq!(ask(&app, &user).await.status, StatusCode::OK);
        let answers = under(&proxy, fault, clients(&app, &user, 8, 10)).await;
        let recovered = until_redis_decides(&app, &user).await;
        let slowest = answers.iter().map(|a| a.took).max().unwrap();
        let by_redis = answers.iter().filter(|a| a.remaining.is_some()).count();
        eprintln!(
            "{fault:?} on {path:?}: slowest answer {slowest:?}, {by_redis} of {} decided by Redis; Redis decided again {recovered:?} after the heal",
            answers.len()
        );
        for answer in &answers {
            match (answer.status, answer.remaining) {
                (StatusCode::OK | StatusCode::TOO_MANY_REQUESTS, Some(_)) => {}
                (StatusCode::SERVICE_UNAVAILABLE, None) => {}
                _ => panic!("{fault:?} on {path:?}: {answer:?}"),
            }
            assert!(
                answer.took <= BOUND,
                "{fault:?} on {path:?}: answered after {:?}, beyond {BOUND:?}",
                answer.took
            );
        }
        match fault {
            Fault::Sliced => assert_eq!(by_redis, answers.len(), "{fault:?} on {path:?}"),
            Fault::Slow | Fault::BlackHole | Fault::Refused => {
                assert_eq!(by_redis, 0, "{fault:?} on {path:?}")
            }
            Fault::Torn | Fault::Reset | Fault::Mixed => {}
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_link_slower_than_the_timeout_costs_each_request_the_timeout_at_most() {
    every_request_is_answered_within_the_bound(Fault::Slow).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_black_hole_costs_each_request_the_timeout_at_most() {
    every_request_is_answered_within_the_bound(Fault::BlackHole).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn torn_replies_cost_each_request_the_timeout_at_most() {
    every_request_is_answered_within_the_bound(Fault::Torn).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replies_in_one_byte_slices_are_decided() {
    every_request_is_answered_within_the_bound(Fault::Sliced).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resets_cost_each_request_the_timeout_at_most() {
    every_request_is_answered_within_the_bound(Fault::Reset).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_connections_cost_each_request_the_timeout_at_most() {
    every_request_is_answered_within_the_bound(Fault::Refused).await;
}

/// The admissions (their `remaining`) among `answers`, which must each come from a decision.
fn admissions(answers: &[Answer]) -> Vec<u64> {
    answers
        .iter()
        .filter(|a| a.status == StatusCode::OK)
        .map(|a| a.remaining.expect("under deny, an admission is a decision"))
        .collect()
}

/// Torn, sliced and reset replies, on each path, under `deny`: two policies share one backend
/// (its batches mix them), `hot` (10 a day) and `cold` (1,000 a day), 6 clients each on one key
/// each. No more is admitted than Redis admitted, nor than the limit; no caller gets another's
/// reply (a `hot` caller never sees `cold`'s `remaining`, no two callers the same); and once the link
/// heals, decisions go on exactly where Redis' state is (no connection desynchronized by a torn
/// reply is used again).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn torn_and_reset_replies_never_admit_more_than_the_limit_nor_mix_replies() {
    for path in PATHS {
        let (server, proxy) = server_and_proxy(path);
        let backend = backend(&proxy, path).await;
        let hot = app_on(
            backend.clone(),
            "hot",
            Quota::per_day(10),
            OnBackendError::Deny,
        );
        let cold = app_on(backend, "cold", Quota::per_day(1000), OnBackendError::Deny);
        let accepted = proxy.accepted();
        let key = vec!["k".to_owned(); 6];
        let (hot_answers, cold_answers) = under(&proxy, Fault::Mixed, async {
            tokio::join!(clients_as(&hot, &key, 15), clients_as(&cold, &key, 15))
        })
        .await;
        until_redis_decides(&cold, "probe").await;
        let reconnects = proxy.accepted() - accepted;
        let (hot_admitted, cold_admitted) = (admissions(&hot_answers), admissions(&cold_answers));
        let (hot_redis, cold_redis) = (
            admitted_by_redis(&server, "hot", "k", 10),
            admitted_by_redis(&server, "cold", "k", 1000),
        );
        eprintln!(
            "{path:?}: {reconnects} connections; hot: {} admitted of {} decided, Redis counts {hot_redis}; cold: {} admitted, Redis counts {cold_redis}",
            hot_admitted.len(),
            hot_answers.iter().filter(|a| a.remaining.is_some()).count(),
            cold_admitted.len(),
        );
        assert!(reconnects > 1, "{path:?}: the faults cut no connection");
        assert!(
            hot_admitted.len() as u64 <= hot_redis && hot_redis <= 10,
            "{path:?}"
        );
        assert!(cold_admitted.len() as u64 <= cold_redis, "{path:?}");
        let distinct: BTreeSet<u64> = hot_admitted.iter().copied().collect();
        assert_eq!(
            distinct.len(),
            hot_admitted.len(),
            "{path:?}: {hot_admitted:?}"
        );
        assert!(
            distinct.iter().all(|r| *r < 10),
            "{path:?}: {hot_admitted:?}"
        );
        let distinct: BTreeSet<u64> = cold_admitted.iter().copied().collect();
        assert_eq!(
            distinct.len(),
            cold_admitted.len(),
            "{path:?}: {cold_admitted:?}"
        );
        assert!(distinct.iter().all(|r| *r >= 1000 - cold_redis), "{path:?}");
        // Healed: the rest of the hot key's limit, exactly, counting down from where Redis is.
        let after = clients_as(&hot, &["k".to_owned()], 12).await;
        let expected: Vec<u64> = (0..10 - hot_redis).rev().collect();
        assert_eq!(admissions(&after), expected, "{path:?}: {after:?}");
        assert!(
            after.iter().all(|a| a.remaining.is_some()),
            "{path:?}: {after:?}"
        );
        assert_eq!(admitted_by_redis(&server, "hot", "k", 10), 10, "{path:?}");
    }
}

/// Set in the child process of [`a_thousand_resets_leave_no_connection_descriptor_or_task_behind`].
const ALONE: &str = "TOWER_THROTTLE_FAULTS_ALONE";

/// Open file descriptors of this process.
fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

/// Resident memory of this process, in bytes.
fn resident_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
    let pages: u64 = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
    pages * 4096
}

/// 1,000 times: every connection reset, then a request until Redis decides again. Afterwards the
/// process holds no more descriptors than before (but 8 for a busy runtime), the proxy sees two
/// connections at most (decisions, reset listener), the runtime runs no more tasks than before (but 8), and resident memory grew less
/// than 16 MiB. In a process of its own (the test runs itself again), where the descriptors and
/// tasks counted are this test's only.
#[test]
fn a_thousand_resets_leave_no_connection_descriptor_or_task_behind() {
    const NAME: &str = "faults::a_thousand_resets_leave_no_connection_descriptor_or_task_behind";
    if std::env::var_os(ALONE).is_none() {
        let status = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", NAME, "--nocapture", "--test-threads", "1"])
            .env(ALONE, "1")
            .status()
            .unwrap();
        assert!(status.success(), "the test alone in its process: {status}");
        return;
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let (_server, proxy) = server_and_proxy(Path::Coalesced);
        let app = app(
            &proxy,
            Path::Coalesced,
            OnBackendError::Deny,
            Quota::per_day(1_000_000),
        )
        .await;
        // Warm: every lazily made thing (connections, the runtime's threads, buffers) made once.
        for _ in 0..3 {
            proxy.reset_all();
            until_redis_decides(&app, "warm").await;
        }
        let (fds, rss) = (open_fds(), resident_bytes());
        let tasks = tokio::runtime::Handle::current().metrics().num_alive_tasks();
        let started = Instant::now();
        let accepted = proxy.accepted();
        let mut slowest = Duration::ZERO;
        for _ in 0..1000 {
            proxy.reset_all();
            slowest = slowest.max(until_redis_decides(&app, "u").await);
        }
        let reconnects = proxy.accepted() - accepted;
        let took = started.elapsed();
        // What the last reset ended may close a moment later.
        let deadline = Instant::now() + Duration::from_secs(5);
        let alive = || tokio::runtime::Handle::current().metrics().num_alive_tasks();
        while (proxy.open_connections() > 2 || open_fds() > fds + 8 || alive() > tasks + 8)
            && Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let grown = resident_bytes().saturating_sub(rss);
        eprintln!(
            "1000 resets in {took:?} ({reconnects} connections made; Redis decided again after {slowest:?} at most): descriptors {fds} -> {}, tasks {tasks} -> {}, resident memory +{} KiB, {} connections open",
            open_fds(),
            alive(),
            grown / 1024,
            proxy.open_connections(),
        );
        assert!(reconnects >= 1000, "{reconnects} connections for 1000 resets");
        // The decisions' connection, and the reset listener's if it is back.
        assert!(proxy.open_connections() <= 2, "{}", proxy.open_connections());
        assert!(open_fds() <= fds + 8, "descriptors {fds} -> {}", open_fds());
        assert!(alive() <= tasks + 8, "tasks {tasks} -> {}", alive());
        assert!(grown < 16 << 20, "resident memory grew {grown} bytes");
    });
}

/// How many keys the process that reaches Redis uses up for the heal's probes: the cut-off process
/// asks for each once, one every [`PACE`] or more, so they last [`RECOVERY`] and then some.
const USED_KEYS: usize = 400;
/// Refusals in a row that show the cut-off process back on Redis.
const STREAK: usize = 10;
/// What each answer of the partition test may take: two processes' layers share the test's two
/// worker threads, and the cut-off one's first request waits the whole timeout, so a stall of the
/// loaded machine adds to it in full (2 runs in 12 under stress-ng took 169 and 190 ms). The
/// per-fault tests above hold the contract's [`BOUND`]; this one is about admissions.
const SHARED_BOUND: Duration = TIMEOUT.saturating_add(Duration::from_millis(150));

/// Which of `users` (under the policy `api` of 10 a day) Redis counts as used up: 10 admitted.
/// One script, not a `redis-cli` per key.
fn used_up(server: &RedisServer, users: &[String]) -> BTreeSet<String> {
    const SCRIPT: &str = "local out = {} \
        for _, key in ipairs(ARGV) do \
          if redis.call('PTTL', 'throttle:api:{' .. key .. '}') > 9 * 8640000 then \
            table.insert(out, key) \
          end \
        end \
        return out";
    let mut args = vec!["EVAL", SCRIPT, "0"];
    args.extend(users.iter().map(String::as_str));
    let reply = server.cli(&args);
    reply
        .lines()
        .filter(|l| !l.is_empty())
        .map(str::to_owned)
        .collect()
}

/// `app` uses up each of `users` on Redis: 10 requests each, again for those Redis has not
/// counted 10 of (on a loaded machine, a request may time out and be decided by `app`'s local
/// limiter instead), until Redis counts 10 for every one; fails after 20 s.
async fn use_up(server: &RedisServer, app: &Router, users: &[String]) {
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut left: Vec<String> = users.to_vec();
    loop {
        clients_as(app, &left, 10).await;
        let done = used_up(server, &left);
        left.retain(|u| !done.contains(u));
        if left.is_empty() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{} keys not used up on Redis after 20 s",
            left.len()
        );
    }
}

/// One process of two cut off from Redis (a black hole, then refused connections) under `local`:
/// two layers on two backends (two processes) share one Redis, `a` directly, `b` through the proxy;
/// the quota is 10 a day.
///
/// While `b` is cut off: 15 requests from each process for one key are all answered within
/// [`SHARED_BOUND`]; `a`'s are decided by Redis (exactly 10 admitted), `b`'s by its local limiter (10 at
/// most): the fleet admits at most N × the quota (N = 2, 20), and Redis counts only `a`'s 10.
/// Meanwhile `a` uses up [`USED_KEYS`] more keys on Redis.
///
/// After the heal, `b` asks for each used-up key once, in turn (its local limiter has never seen
/// them, so it admits each; only Redis refuses): `b` refuses one within [`RECOVERY`] of the heal,
/// and every one after it (it is back on Redis for good), and its Redis refuses the shared key too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_process_of_two_cut_off_under_local_admits_at_most_twice_the_quota() {
    for fault in [Fault::BlackHole, Fault::Refused] {
        let (server, proxy) = server_and_proxy(Path::Coalesced);
        let direct = connect(server.url(), RedisMode::Lua, true).await;
        let quota = Quota::per_day(10);
        let a = app_on(direct, "api", quota, OnBackendError::Local);
        let b = app(&proxy, Path::Coalesced, OnBackendError::Local, quota).await;
        // Both decide on Redis: its key exists once a decision was made there.
        for (app, user) in [(&a, "warm-a"), (&b, "warm-b")] {
            assert_eq!(ask(app, user).await.status, StatusCode::OK);
            assert_eq!(admitted_by_redis(&server, "api", user, 10), 1, "{fault:?}");
        }
        let used: Vec<String> = (0..USED_KEYS).map(|i| format!("used-{i}")).collect();
        let (a_shared, b_shared) = under(&proxy, fault, async {
            let shared = ["shared".to_owned()];
            let both = tokio::join!(clients_as(&a, &shared, 15), clients_as(&b, &shared, 15));
            use_up(&server, &a, &used).await;
            both
        })
        .await;
        let healed = Instant::now();
        let count = |answers: &[Answer]| {
            answers
                .iter()
                .filter(|a| a.status == StatusCode::OK)
                .count()
        };
        let (a_admitted, b_admitted) = (count(&a_shared), count(&b_shared));
        let slowest = b_shared.iter().map(|a| a.took).max().unwrap();
        eprintln!(
            "{fault:?}: the shared key admitted {a_admitted} times by a (Redis), {b_admitted} by b (local), fleet {}; b's slowest answer {slowest:?}",
            a_admitted + b_admitted
        );
        for answer in a_shared.iter().chain(&b_shared) {
            assert!(answer.remaining.is_some(), "{fault:?}: {answer:?}");
            assert!(
                matches!(
                    answer.status,
                    StatusCode::OK | StatusCode::TOO_MANY_REQUESTS
                ),
                "{fault:?}: {answer:?}"
            );
            assert!(answer.took <= SHARED_BOUND, "{fault:?}: {answer:?}");
        }
        assert_eq!(a_admitted, 10, "{fault:?}: a decides on Redis");
        assert!(
            b_admitted <= 10,
            "{fault:?}: b's local limiter: {b_shared:?}"
        );
        assert!(a_admitted + b_admitted <= 2 * 10, "{fault:?}");
        assert_eq!(admitted_by_redis(&server, "api", "shared", 10), 10);

        // Healed: b asks for each used-up key once until Redis refuses one.
        let mut keys = used.iter();
        let mut let_through = 0;
        // The first refusal, then [`STREAK`] in a row: a request that times out on a loaded
        // machine is answered by the local limiter, rightly, and breaks a streak, not the test.
        let (mut first, mut streak) = (None, 0);
        while streak < STREAK {
            let user = keys.next().unwrap_or_else(|| {
                panic!(
                    "{fault:?}: b asked for all {USED_KEYS} used-up keys ({let_through} admitted), for {:?} after the heal",
                    healed.elapsed()
                )
            });
            let answer = ask(&b, user).await;
            if answer.status == StatusCode::TOO_MANY_REQUESTS {
                first.get_or_insert(healed.elapsed());
                streak += 1;
                continue;
            }
            // Its local limiter's first admission of the key; Redis would refuse it.
            assert_eq!(
                (answer.status, answer.remaining),
                (StatusCode::OK, Some(9)),
                "{fault:?}: {user}: {answer:?}"
            );
            let_through += 1;
            streak = 0;
            assert!(
                healed.elapsed() < RECOVERY,
                "{fault:?}: b still decides alone {RECOVERY:?} after the heal (first refusal: {first:?})"
            );
            tokio::time::sleep(PACE).await;
        }
        let back = healed.elapsed();
        eprintln!(
            "{fault:?}: b refused a key a used up {:?} after the heal, {STREAK} in a row by {back:?}, having let {let_through} used-up keys through meanwhile",
            first.unwrap()
        );
        let answer = ask(&b, "shared").await;
        assert_eq!(answer.status, StatusCode::TOO_MANY_REQUESTS, "{answer:?}");
        assert_eq!(admitted_by_redis(&server, "api", "shared", 10), 10);
    }
}

/// The first decisions of a limit on the limits script (a fixed window; a GCRA limit with a penalty
/// box), on a link slow from the start, are made by Redis: the script was loaded at the connect,
/// so no `NOSCRIPT` (two more round trips, past the timeout) sends them to the failure policy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_decisions_on_the_limits_script_over_a_slow_link_come_from_redis() {
    let penalty = Penalty::new(100, Duration::from_secs(60), Duration::from_secs(60)).unwrap();
    let limits = [
        Limit::with_algorithm("window", Algorithm::FixedWindow, Quota::per_day(10)).unwrap(),
        Limit::new("penalty", Quota::per_day(10))
            .unwrap()
            .with_penalty(penalty),
    ];
    for path in [Path::Coalesced, Path::Alone] {
        for limit in &limits {
            let (_server, proxy) = server_and_proxy(path);
            let backend = backend(&proxy, path).await;
            // 50 ± 10 ms a reply: a round trip of at most 60 ms, 40 under the timeout (30 failed
            // one check in a full parallel run on 2 cores); a `NOSCRIPT`'s two more round trips
            // would still take it past the timeout.
            proxy.latency(
                Direction::ToClient,
                Duration::from_millis(50),
                Duration::from_millis(10),
            );
            let checks: Vec<_> = (0..12)
                .map(|_| {
                    let (backend, limit) = (backend.clone(), limit.clone());
                    tokio::spawn(
                        async move { backend.check_one(&limit, &Key::from("first"), 1).await },
                    )
                })
                .collect();
            let mut admitted = 0;
            for (i, check) in checks.into_iter().enumerate() {
                let name = limit.name();
                let decision = check.await.unwrap();
                let decision =
                    decision.unwrap_or_else(|e| panic!("{path:?} {name}: check {i}: {e}"));
                admitted += usize::from(decision.allowed);
            }
            assert_eq!(admitted, 10, "{path:?} {}", limit.name());
        }
    }
}
