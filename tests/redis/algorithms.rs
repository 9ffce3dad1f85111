//! The Redis backend's sliding log, fixed window, sliding window and concurrency limits, and stacks
//! of limits, against real servers: the decisions of `src/window.rs` on the server's clock, exact
//! admission under concurrency (one server and a Cluster), keys and their expiry, leases.
//!
//! The servers come from `tests/support/redis.rs`; `bash scripts/test.sh` installs what they need.
//! The memory backend cannot share Redis' clock, so parity is checked against the pure functions of
//! `tower_throttle::window` (which the memory backend calls), fed the server's time.

use crate::support::redis as redis_support;

use std::collections::{HashSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use crate::support::asks::Asks;
use redis_support::{RedisCluster, RedisServer};
use tokio::time::Instant;
use tower_throttle::window::{self, FixedState, SlidingState};
use tower_throttle::{
    policy::Penalty,
    redis::{RedisBackend, RedisMode},
    Algorithm, Decision, Key, Limit, MemoryBackend, Quota,
};

async fn connect(url: &str) -> RedisBackend {
    RedisBackend::builder()
        .url(url)
        .mode(RedisMode::Lua)
        .timeout(Duration::from_secs(2))
        .connect()
        .await
        .unwrap_or_else(|e| panic!("connect {url}: {e:?}"))
}

async fn cluster(urls: Vec<String>) -> RedisBackend {
    RedisBackend::builder()
        .cluster_urls(urls)
        .mode(RedisMode::Lua)
        .timeout(Duration::from_secs(2))
        .connect()
        .await
        .unwrap_or_else(|e| panic!("connect cluster: {e:?}"))
}

fn limit(name: &str, algorithm: Algorithm, quota: Quota) -> Limit {
    Limit::with_algorithm(name, algorithm, quota).unwrap()
}

const WINDOWS: [Algorithm; 3] = [
    Algorithm::SlidingLog,
    Algorithm::FixedWindow,
    Algorithm::SlidingWindow,
];

/// The server's clock (`TIME`) in nanoseconds, and the local instant no earlier than that reading:
/// a local instant mapped through it is never ahead of the server.
pub(crate) async fn server_clock(url: &str) -> (u64, Instant) {
    let client = redis::Client::open(url).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let (secs, micros): (u64, u64) = redis::cmd("TIME").query_async(&mut conn).await.unwrap();
    (secs * 1_000_000_000 + micros * 1000, Instant::now())
}

/// Waits until the server's clock is `offset` past a multiple of `period`, and returns that
/// boundary (server ns) with the local instant the server reaches it at (or a little before).
async fn align(url: &str, period: Duration, offset: Duration) -> (u64, Instant) {
    let (now, local) = server_clock(url).await;
    let period = period.as_nanos() as u64;
    let boundary = (now / period + 1) * period;
    let at = local + Duration::from_nanos(boundary - now);
    tokio::time::sleep_until(at + offset).await;
    (boundary, at)
}

/// Waits until the server's clock is at least `clear` away from the next multiple of `period`, so
/// that a test of that length runs within one window.
pub(crate) async fn within_one_window(url: &str, period: Duration, clear: Duration) {
    let (now, _) = server_clock(url).await;
    let period_ns = period.as_nanos() as u64;
    let to_boundary = Duration::from_nanos(period_ns - now % period_ns);
    if to_boundary < clear {
        tokio::time::sleep(to_boundary + Duration::from_millis(50)).await;
    }
}

fn cli_int(server: &RedisServer, args: &[&str]) -> i64 {
    let out = server.cli(args);
    out.trim()
        .parse()
        .unwrap_or_else(|_| panic!("{args:?}: {out:?}"))
}

/// The pure decision of `algorithm` with its state, for the parity schedules.
enum Model {
    Log(VecDeque<u64>),
    Fixed(Option<FixedState>),
    Sliding(Option<SlidingState>),
}

impl Model {
    fn new(algorithm: Algorithm) -> Model {
        match algorithm {
            Algorithm::SlidingLog => Model::Log(VecDeque::new()),
            Algorithm::FixedWindow => Model::Fixed(None),
            _ => Model::Sliding(None),
        }
    }

    fn decide(&mut self, now: u64, params: &window::WindowParams, quantity: u64) -> Decision {
        match self {
            Model::Log(log) => window::sliding_log(log, now, params, quantity),
            Model::Fixed(state) => {
                let (d, s) = window::fixed_window(*state, now, params, quantity);
                *state = s;
                d
            }
            Model::Sliding(state) => {
                let (d, s) = window::sliding_window(*state, now, params, quantity);
                *state = s;
                d
            }
        }
    }
}

/// Within `slack` of the model's duration: Redis decides a little after the model's instant (and
/// recorded earlier units a little after theirs, which moves a sliding log's times the other way).
fn close(model: Duration, redis: Duration, slack: Duration) -> bool {
    model.abs_diff(redis) <= slack
}

/// Requests at (ms from a window boundary, quantity).
type Schedule = &'static [(u64, u64)];

/// Each schedule's requests are at least 50 ms from any point where a decision or `remaining` would
/// change (see the comments), so Redis, deciding up to a few ms after the model's instant, must give
/// the same `allowed` and `remaining`, and retry / reset times within that much.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_window_algorithm_computes_window_rs_on_the_server_clock() {
    let server = RedisServer::start();
    let backend = connect(&server.url()).await;
    let period = Duration::from_secs(1);
    let ms = Duration::from_millis;
    // (ms from a window boundary, quantity)
    let schedules: [(Algorithm, u64, Schedule); 3] = [
        (
            Algorithm::FixedWindow,
            4,
            // 3 pass, 2 do not fit (1 left), 1 does, then nothing until the boundary; 5 never fit.
            &[
                (100, 1),
                (100, 1),
                (100, 1),
                (100, 2),
                (100, 1),
                (100, 1),
                (1100, 4),
                (1100, 5),
                (1100, 1),
                (2300, 1),
            ],
        ),
        (
            Algorithm::SlidingWindow,
            4,
            // Window 0: 4 pass. At 25% of window 1 they weigh 3: one more passes. At 80% they weigh
            // 0.8 + 1: two more. At 50% of window 2, 3 weigh 1.5: 3 more do not fit, 2 do.
            &[
                (100, 1),
                (100, 1),
                (100, 1),
                (100, 1),
                (100, 1),
                (1250, 1),
                (1250, 1),
                (1800, 2),
                (2500, 3),
                (2500, 2),
                (2500, 5),
            ],
        ),
        (
            Algorithm::SlidingLog,
            3,
            // 1 at 50 ms, 2 at 400 ms; at 1100 the first has left; at 1500 the two have.
            &[
                (50, 1),
                (400, 2),
                (900, 1),
                (1100, 2),
                (1100, 1),
                (1500, 2),
                (1500, 1),
                (1500, 4),
            ],
        ),
    ];
    for (algorithm, count, steps) in schedules {
        let name = format!("parity-{algorithm}");
        let limit = limit(&name, algorithm, Quota::per_period(count, period));
        let params = *limit.window().unwrap();
        let key = Key::from("client");
        let mut model = Model::new(algorithm);
        let (boundary, at) = align(&server.url(), period, Duration::ZERO).await;
        let (mut admitted, mut rejected) = (0, 0);
        for (i, &(offset, quantity)) in steps.iter().enumerate() {
            tokio::time::sleep_until(at + ms(offset)).await;
            // On a loaded machine the step starts late, by up to seconds: the model decides when
            // the check was sent, not when it was due, and Redis at most the call's time after.
            let sent = tokio::time::Instant::now().saturating_duration_since(at);
            let redis = backend.check_one(&limit, &key, quantity).await.unwrap();
            let took = tokio::time::Instant::now().saturating_duration_since(at) - sent;
            let margin = ms(50) + took;
            let sent_ns = u64::try_from(sent.as_nanos()).unwrap();
            let expected = model.decide(boundary + sent_ns, &params, quantity);
            let context = format!("{algorithm} step {i} at {offset} ms (sent at {sent:?}, took {took:?}), quantity {quantity}:\n redis {redis:?}\n model {expected:?}");
            assert_eq!(redis.allowed, expected.allowed, "{context}");
            assert_eq!(redis.limit, expected.limit, "{context}");
            assert_eq!(redis.remaining, expected.remaining, "{context}");
            assert_eq!(
                redis.retry_after.is_some(),
                expected.retry_after.is_some(),
                "{context}"
            );
            if let (Some(r), Some(e)) = (redis.retry_after, expected.retry_after) {
                assert!(close(e, r, margin), "{context}");
            }
            assert!(
                close(expected.reset_after, redis.reset_after, margin),
                "{context}"
            );
            assert!(redis.lease.is_none() && !redis.banned, "{context}");
            if redis.allowed {
                admitted += 1;
            } else {
                rejected += 1;
            }
        }
        assert!(admitted >= 4 && rejected >= 3, "{algorithm}");
    }
}

/// A fixed window's counter and its expiry are one write; the count starts again at the boundary,
/// where `Retry-After` points.
#[tokio::test]
async fn fixed_window_resets_at_the_boundary_it_names() {
    let server = RedisServer::start();
    let backend = connect(&server.url()).await;
    let period = Duration::from_secs(2);
    let limit = limit(
        "fixed",
        Algorithm::FixedWindow,
        Quota::per_period(3, period),
    );
    let key = Key::from("k");
    let redis_key = backend.state_key(&limit, &key);
    let (boundary, at) = align(&server.url(), period, Duration::from_millis(300)).await;
    for left in [2, 1, 0] {
        let d = backend.check_one(&limit, &key, 1).await.unwrap();
        assert_eq!((d.allowed, d.remaining), (true, left), "{d:?}");
    }
    let stored = server.cli(&["GET", &redis_key]);
    let window = boundary / period.as_nanos() as u64;
    assert_eq!(stored, format!("{window}:3"));
    let ttl = cli_int(&server, &["PTTL", &redis_key]);
    assert!(ttl > 0 && ttl <= 1700, "{ttl}");
    let rejected = backend.check_one(&limit, &key, 1).await.unwrap();
    assert!(!rejected.allowed && rejected.remaining == 0, "{rejected:?}");
    let retry = rejected.retry_after.unwrap();
    // The next boundary is 2 s after `at` (give or take the latency of reading the server's
    // clock), 1.7 s or less from now.
    let expected = (at + period).saturating_duration_since(Instant::now());
    assert!(
        close(expected, retry, Duration::from_millis(100)),
        "{retry:?} vs {expected:?}"
    );
    assert_eq!(rejected.reset_after, retry);
    assert_eq!(
        server.cli(&["GET", &redis_key]),
        stored,
        "rejections write nothing"
    );
    tokio::time::sleep(retry + Duration::from_millis(10)).await;
    let d = backend.check_one(&limit, &key, 1).await.unwrap();
    assert_eq!((d.allowed, d.remaining), (true, 2), "{d:?}");
    assert_eq!(
        server.cli(&["GET", &redis_key]),
        format!("{}:1", window + 1)
    );
}

/// The seeds' ZSET limiter done right: 50 requests sent at once (one pipelined burst, most within
/// the same millisecond) are 50 distinct members; rejected requests add none; the key never holds
/// more than the limit and expires.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sliding_log_counts_every_request_of_a_burst_and_stays_bounded() {
    let server = RedisServer::start();
    let backend = connect(&server.url()).await;
    let limit = limit(
        "log",
        Algorithm::SlidingLog,
        Quota::per_period(100, Duration::from_secs(10)),
    );
    let key = Key::from("burst");
    let redis_key = backend.state_key(&limit, &key);
    let burst = |n: usize| {
        let calls: Vec<_> = (0..n).map(|_| backend.check_one(&limit, &key, 1)).collect();
        async move {
            let mut admitted = 0;
            for call in calls {
                admitted += usize::from(call.await.unwrap().allowed);
            }
            admitted
        }
    };
    assert_eq!(burst(50).await, 50);
    assert_eq!(cli_int(&server, &["ZCARD", &redis_key]), 50);
    assert_eq!(burst(60).await, 50);
    assert_eq!(cli_int(&server, &["ZCARD", &redis_key]), 100);
    let members = server.cli(&["ZRANGE", &redis_key, "0", "-1"]);
    let unique: HashSet<&str> = members.lines().collect();
    assert_eq!(unique.len(), 100);
    // A request of several units adds as many members, or none.
    let d = backend.check_one(&limit, &key, 3).await.unwrap();
    assert!(!d.allowed);
    assert_eq!(cli_int(&server, &["ZCARD", &redis_key]), 100);
    let ttl = cli_int(&server, &["PTTL", &redis_key]);
    assert!(ttl > 9000 && ttl <= 10_000, "{ttl}");

    // Units leave the log as they leave the window: ZCARD stays within the limit.
    let short = self::limit(
        "log-short",
        Algorithm::SlidingLog,
        Quota::per_period(5, Duration::from_millis(300)),
    );
    let short_key = backend.state_key(&short, &key);
    for _ in 0..4 {
        for _ in 0..8 {
            backend.check_one(&short, &key, 2).await.unwrap();
        }
        assert!(cli_int(&server, &["ZCARD", &short_key]) <= 5);
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    // Idle, the key expires.
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(server.cli(&["EXISTS", &short_key]), "0");
}

/// `tasks` clients on each backend, `requests` each, one key: exactly the limit passes.
async fn admits_exactly(backends: &[RedisBackend], limits: Vec<Limit>, key: &str, expected: usize) {
    const TASKS_PER_BACKEND: usize = 4;
    const REQUESTS: usize = 40;
    let limits = Arc::new(limits);
    let key = Key::from(key);
    let mut tasks = Vec::new();
    for backend in backends {
        for _ in 0..TASKS_PER_BACKEND {
            let (backend, limits, key) = (backend.clone(), limits.clone(), key.clone());
            tasks.push(tokio::spawn(async move {
                let mut admitted = 0;
                for _ in 0..REQUESTS {
                    let allowed = if limits.len() == 1 {
                        backend
                            .check_one(&limits[0], &key, 1)
                            .await
                            .unwrap()
                            .allowed
                    } else {
                        let decisions = backend.check_all(&limits, &key, 1).await.unwrap();
                        Decision::combine(&decisions).unwrap().allowed
                    };
                    admitted += usize::from(allowed);
                }
                admitted
            }));
        }
    }
    let mut admitted = 0;
    for task in tasks {
        admitted += task.await.unwrap();
    }
    let sent = backends.len() * TASKS_PER_BACKEND * REQUESTS;
    assert_eq!(admitted, expected, "{key:?}: {admitted} of {sent} admitted");
}

fn hourly(name: &str, algorithm: Algorithm, count: u64) -> Limit {
    limit(name, algorithm, Quota::per_hour(count))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_algorithm_admits_exactly_the_limit_under_concurrency() {
    let server = RedisServer::start();
    let mut backends = Vec::new();
    for _ in 0..4 {
        backends.push(connect(&server.url()).await);
    }
    within_one_window(
        &server.url(),
        Duration::from_secs(3600),
        Duration::from_secs(20),
    )
    .await;
    for algorithm in WINDOWS.into_iter().chain([Algorithm::Concurrency]) {
        let name = format!("exact-{algorithm}");
        let limits = vec![hourly(&name, algorithm, 100)];
        admits_exactly(&backends, limits, &name, 100).await;
    }
    // A stack: every one of its limits is held to its count.
    let stack = vec![
        limit("stack-gcra", Algorithm::Gcra, Quota::per_hour(150)),
        hourly("stack-log", Algorithm::SlidingLog, 120),
        hourly("stack-fixed", Algorithm::FixedWindow, 100),
        hourly("stack-sliding", Algorithm::SlidingWindow, 130),
    ];
    admits_exactly(&backends, stack, "stack", 100).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_admits_exactly_and_keeps_a_clients_keys_on_one_slot() {
    let servers = RedisCluster::start();
    let mut backends = Vec::new();
    for _ in 0..3 {
        backends.push(cluster(servers.urls()).await);
    }
    let url = servers.urls()[0].clone();
    within_one_window(&url, Duration::from_secs(3600), Duration::from_secs(20)).await;
    for algorithm in [Algorithm::FixedWindow, Algorithm::SlidingLog] {
        let name = format!("cluster-{algorithm}");
        admits_exactly(&backends, vec![hourly(&name, algorithm, 100)], &name, 100).await;
    }
    let stack = vec![
        hourly("cstack-sliding", Algorithm::SlidingWindow, 120),
        hourly("cstack-fixed", Algorithm::FixedWindow, 100),
        limit("cstack-gcra", Algorithm::Gcra, Quota::per_hour(200)),
    ];
    admits_exactly(&backends, stack.clone(), "cstack", 100).await;

    // Every key of one client, whatever the algorithm, lives on the node that owns its slot; a
    // rejection by one limit of a stack consumes nothing in the others, here too.
    for i in 0..12 {
        let key = Key::from(format!("user-{i}"));
        let tight = vec![
            hourly("c-log", Algorithm::SlidingLog, 10),
            hourly("c-fixed", Algorithm::FixedWindow, 1),
        ];
        let first = backends[0].check_all(&tight, &key, 1).await.unwrap();
        assert!(first.iter().all(|d| d.allowed), "{first:?}");
        let second = backends[1].check_all(&tight, &key, 1).await.unwrap();
        assert!(second[0].allowed && !second[1].allowed, "{second:?}");
        assert_eq!(
            second[0].remaining, 9,
            "the log was not charged: {second:?}"
        );
        let keys: Vec<String> = tight
            .iter()
            .map(|l| backends[0].state_key(l, &key))
            .collect();
        let holders: Vec<u16> = servers
            .nodes()
            .iter()
            .filter(|node| {
                keys.iter()
                    .all(|k| node.cli_result(&["EXISTS", k]).as_deref() == Ok("1"))
            })
            .map(|node| node.port())
            .collect();
        assert_eq!(holders.len(), 1, "{keys:?} on {holders:?}");
        let log = servers
            .nodes()
            .iter()
            .find(|n| n.port() == holders[0])
            .unwrap();
        assert_eq!(log.cli(&["ZCARD", &keys[0]]), "1");
    }
}

/// A stack passes only when every limit admits; a rejection by one records nothing in any, and the
/// limits that would have admitted report their state as it stands. A GCRA limit in a stack shares
/// its state with the same limit checked alone.
#[tokio::test]
async fn a_stack_rejected_by_one_limit_consumes_none_of_the_others() {
    let server = RedisServer::start();
    let backend = connect(&server.url()).await;
    let gcra = limit("s-gcra", Algorithm::Gcra, Quota::per_hour(10));
    let log = hourly("s-log", Algorithm::SlidingLog, 5);
    let fixed = hourly("s-fixed", Algorithm::FixedWindow, 3);
    let sliding = hourly("s-sliding", Algorithm::SlidingWindow, 4);
    let stack = vec![gcra.clone(), log.clone(), fixed.clone(), sliding.clone()];
    let key = Key::from("stacked");
    within_one_window(
        &server.url(),
        Duration::from_secs(3600),
        Duration::from_secs(10),
    )
    .await;
    for i in 1..=3u64 {
        let d = backend.check_all(&stack, &key, 1).await.unwrap();
        assert!(d.iter().all(|d| d.allowed), "{d:?}");
        let remaining: Vec<u64> = d.iter().map(|d| d.remaining).collect();
        assert_eq!(remaining, vec![10 - i, 5 - i, 3 - i, 4 - i]);
    }
    let snapshot = |backend: &RedisBackend| {
        stack
            .iter()
            .map(|l| {
                let k = backend.state_key(l, &key);
                let kind = server.cli(&["TYPE", &k]);
                let value = if kind == "zset" {
                    server.cli(&["ZRANGE", &k, "0", "-1", "WITHSCORES"])
                } else {
                    server.cli(&["GET", &k])
                };
                (k, value)
            })
            .collect::<Vec<_>>()
    };
    let before = snapshot(&backend);
    for _ in 0..5 {
        let d = backend.check_all(&stack, &key, 1).await.unwrap();
        assert_eq!(
            d.iter().map(|d| d.allowed).collect::<Vec<_>>(),
            vec![true, true, false, true],
            "{d:?}"
        );
        // As they stand: nothing was taken from the GCRA, the log or the sliding window.
        assert_eq!(
            d.iter().map(|d| d.remaining).collect::<Vec<_>>(),
            vec![7, 2, 0, 1]
        );
        let combined = Decision::combine(&d).unwrap();
        assert!(!combined.allowed && combined.remaining == 0, "{combined:?}");
    }
    assert_eq!(snapshot(&backend), before);
    // 2 units fit everything but the fixed window... still nothing.
    assert!(
        !Decision::combine(&backend.check_all(&stack, &key, 2).await.unwrap())
            .unwrap()
            .allowed
    );
    assert_eq!(snapshot(&backend), before);
    // The same GCRA limit alone reads the stack's state (3 taken).
    let alone = backend.check_one(&gcra, &key, 1).await.unwrap();
    assert_eq!((alone.allowed, alone.remaining), (true, 6), "{alone:?}");
    // Without the full limit, the rest of the stack still passes.
    let d = backend
        .check_all(&[log.clone(), sliding.clone()], &key, 1)
        .await
        .unwrap();
    assert!(d.iter().all(|d| d.allowed), "{d:?}");
    assert_eq!((d[0].remaining, d[1].remaining), (1, 0));
}

/// A stack's penalty box is its first limit's: strikes for rejections, then a ban for every limit.
#[tokio::test]
async fn windows_and_stacks_keep_the_penalty_box() {
    let server = RedisServer::start();
    let backend = connect(&server.url()).await;
    let penalty = Penalty::new(2, Duration::from_secs(60), Duration::from_secs(30)).unwrap();
    let first = hourly("p-fixed", Algorithm::FixedWindow, 1).with_penalty(penalty);
    let second = hourly("p-log", Algorithm::SlidingLog, 10);
    let stack = vec![first.clone(), second.clone()];
    let key = Key::from("offender");
    within_one_window(
        &server.url(),
        Duration::from_secs(3600),
        Duration::from_secs(10),
    )
    .await;
    assert!(backend.check_all(&stack, &key, 1).await.unwrap()[0].allowed);
    let strike = backend.check_all(&stack, &key, 1).await.unwrap();
    assert!(!strike[0].allowed && !strike[0].banned, "{strike:?}");
    let banned = backend.check_all(&stack, &key, 1).await.unwrap();
    for d in &banned {
        assert!(!d.allowed && d.banned, "{banned:?}");
        assert!(d.retry_after.unwrap() > Duration::from_secs(29), "{d:?}");
    }
    // The ban is the policy's, whatever the algorithm: the first limit checked alone is banned too.
    let alone = backend.check_one(&first, &key, 1).await.unwrap();
    assert!(alone.banned, "{alone:?}");
    let ban_key = format!("{}:ban", backend.redis_key("p-fixed", &key));
    assert!(cli_int(&server, &["PTTL", &ban_key]) > 29_000);
    // The log recorded only the one admitted request.
    assert_eq!(
        server.cli(&["ZCARD", &backend.state_key(&second, &key)]),
        "1"
    );
}

/// Slots are taken up to the limit, with a distinct lease each; a release gives one back; a lease
/// never released (its process died) ends by itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrency_leases_are_released_or_expire() {
    let server = RedisServer::start();
    let backend = connect(&server.url()).await;
    let limit = limit("conc", Algorithm::Concurrency, Quota::per_second(3));
    let key = Key::from("downloader");
    let redis_key = backend.state_key(&limit, &key);
    let mut leases = Vec::new();
    for left in [2, 1, 0] {
        let d = backend.check_one(&limit, &key, 1).await.unwrap();
        assert_eq!((d.allowed, d.remaining), (true, left), "{d:?}");
        leases.push(d.lease.expect("an admitted request has a lease"));
    }
    assert_eq!(leases.iter().collect::<HashSet<_>>().len(), 3);
    let full = backend.check_one(&limit, &key, 1).await.unwrap();
    assert!(!full.allowed && full.lease.is_none(), "{full:?}");
    assert_eq!(full.retry_after, Some(window::CONCURRENCY_RETRY));
    assert_eq!(
        backend
            .check_one(&limit, &key, 4)
            .await
            .unwrap()
            .retry_after,
        None
    );
    let ttl = cli_int(&server, &["PTTL", &redis_key]);
    assert!(ttl > 55_000 && ttl <= 60_000, "{ttl}");

    // A release is fire-and-forget (spawned): poll, bounded, until the slot is free.
    backend.release(&limit, &key, 1, leases[0]);
    let mut freed = None;
    let deadline = Instant::now() + Duration::from_secs(2);
    while Instant::now() < deadline {
        let d = backend.check_one(&limit, &key, 1).await.unwrap();
        if d.allowed {
            freed = Some(d);
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let freed = freed.expect("the released slot was never free again");
    assert_eq!(freed.remaining, 0);
    assert_eq!(cli_int(&server, &["ZCARD", &redis_key]), 3);
    // Releasing an unknown lease, or twice, frees nothing.
    backend.release(&limit, &key, 1, leases[0]);
    backend.release(&limit, &key, 1, 12345);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(cli_int(&server, &["ZCARD", &redis_key]), 3);

    // Requests of several units: one lease, as many slots.
    let multi = self::limit("conc-multi", Algorithm::Concurrency, Quota::per_second(3));
    let two = backend.check_one(&multi, &key, 2).await.unwrap();
    assert_eq!((two.allowed, two.remaining), (true, 1));
    assert!(!backend.check_one(&multi, &key, 2).await.unwrap().allowed);
    backend.release(&multi, &key, 2, two.lease.unwrap());
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        let d = backend.check_one(&multi, &key, 3).await.unwrap();
        if d.allowed {
            break;
        }
        assert!(Instant::now() < deadline, "two slots were never given back");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    // A dead process: leases of 1 s, never released, and no longer renewed once its backend is
    // gone (a live backend renews a lease until it is released).
    let short = self::limit("conc-dead", Algorithm::Concurrency, Quota::per_second(2))
        .with_lease(Duration::from_secs(1))
        .unwrap();
    let short_key = backend.state_key(&short, &key);
    let dead = connect(&server.url()).await;
    for _ in 0..2 {
        assert!(dead.check_one(&short, &key, 1).await.unwrap().allowed);
    }
    drop(dead);
    let started = Instant::now();
    assert!(!backend.check_one(&short, &key, 1).await.unwrap().allowed);
    let mut back = None;
    while started.elapsed() < Duration::from_secs(4) {
        // The server's clock before the check: a lease that ended by then has ended for it.
        let (before_ns, _) = server_clock(&server.url()).await;
        let d = backend.check_one(&short, &key, 1).await.unwrap();
        if d.allowed {
            back = Some((started.elapsed(), d.lease.unwrap(), before_ns / 1000));
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let (back, lease, before_us) = back.expect("an expired lease never gave its slot back");
    assert!(back >= Duration::from_millis(800), "{back:?}");
    // The leases that had ended were dropped when the new one was taken. (Not "one lease left":
    // a renewal the dead backend had sent just before it was dropped may still extend one of its
    // leases once, and that lease then ends a second later.)
    let ended = cli_int(
        &server,
        &["ZCOUNT", &short_key, "-inf", &before_us.to_string()],
    );
    assert_eq!(ended, 0, "ended leases left in {short_key}");
    assert!(cli_int(&server, &["ZCARD", &short_key]) <= 2);
    // The live lease outlives its second: its process renews it...
    tokio::time::sleep(Duration::from_millis(1300)).await;
    let (now_ns, _) = server_clock(&server.url()).await;
    let live = format!("({}", now_ns / 1000);
    assert_eq!(cli_int(&server, &["ZCOUNT", &short_key, &live, "+inf"]), 1);
    // ...until it is released; the empty key is then gone.
    backend.release(&short, &key, 1, lease);
    let deadline = Instant::now() + Duration::from_secs(2);
    while server.cli(&["EXISTS", &short_key]) != "0" {
        assert!(Instant::now() < deadline, "the released lease stayed");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn hostile_keys_stay_inside_their_namespace_for_every_algorithm() {
    let server = RedisServer::start();
    let backend = RedisBackend::builder()
        .url(server.url())
        .prefix("app1")
        .mode(RedisMode::Lua)
        .connect()
        .await
        .unwrap();
    let hostile: Vec<Key> = vec![
        Key::from("}:other{x"),
        Key::from("app2:api:{victim}"),
        Key::from_bytes(b"\r\n*1\r\n$8\r\nFLUSHALL\r\n"),
        Key::from_bytes(&[0xff, 0x00, b'{', b'}']),
        Key::from("x".repeat(10_000)),
    ];
    let algorithms = WINDOWS.into_iter().chain([Algorithm::Concurrency]);
    let limits: Vec<Limit> = algorithms.map(|a| hourly("api", a, 10)).collect();
    for key in &hostile {
        for limit in &limits {
            assert!(backend.check_one(limit, key, 1).await.unwrap().allowed);
        }
    }
    let keys = server.cli(&["--raw", "KEYS", "*"]);
    let keys: Vec<&str> = keys.lines().collect();
    assert_eq!(keys.len(), hostile.len() * limits.len(), "{keys:?}");
    for k in keys {
        assert!(k.starts_with("app1:api:{"), "{k}");
        let (tag, suffix) = k["app1:api:{".len()..].split_once('}').unwrap();
        assert!(!tag.contains('{'), "{k}");
        assert!(
            [":log", ":fixed", ":sliding", ":concurrency"].contains(&suffix),
            "{k}"
        );
        assert!(k.len() <= 120, "{k} is {} bytes", k.len());
        assert!(k.bytes().all(|b| b.is_ascii_graphic()), "{k:?}");
        // Every key expires.
        assert!(cli_int(&server, &["PTTL", k]) > 0, "{k}");
    }
}

/// A policy whose algorithm changes reads a key of its own: never a WRONGTYPE error.
#[tokio::test]
async fn changing_a_policys_algorithm_never_hits_another_type() {
    let server = RedisServer::start();
    let backend = connect(&server.url()).await;
    let key = Key::from("k");
    for algorithm in [
        Algorithm::Gcra,
        Algorithm::SlidingLog,
        Algorithm::FixedWindow,
        Algorithm::SlidingWindow,
        Algorithm::Concurrency,
        Algorithm::SlidingLog,
        Algorithm::Gcra,
    ] {
        let limit = hourly("changing", algorithm, 5);
        let d = backend.check_one(&limit, &key, 1).await.unwrap();
        assert!(d.allowed, "{algorithm}: {d:?}");
    }
}

#[tokio::test]
async fn limits_the_script_cannot_keep_exact_are_refused_when_the_layer_is_built() {
    let server = RedisServer::start();
    let backend = connect(&server.url()).await;
    let refused = |limit: &Limit| backend.validate_one(limit).unwrap_err().to_string();
    for algorithm in WINDOWS {
        let fine = limit(
            "ok",
            algorithm,
            Quota::per_period(10, Duration::from_millis(1500)),
        );
        assert!(backend.validate_one(&fine).is_ok(), "{algorithm}");
        let nanos = limit(
            "ns",
            algorithm,
            Quota::per_period(10, Duration::from_nanos(1500)),
        );
        assert!(refused(&nanos).contains("microseconds"), "{algorithm}");
        let long = limit(
            "long",
            algorithm,
            Quota::per_period(1, Duration::from_secs(60 * 86_400)),
        );
        assert!(refused(&long).contains("52 days"), "{algorithm}");
    }
    let huge = limit(
        "huge",
        Algorithm::SlidingWindow,
        Quota::per_period(1 << 42, Duration::from_micros(100)),
    );
    assert!(refused(&huge).contains("2^41"), "{}", refused(&huge));
    let busy = limit("busy", Algorithm::SlidingWindow, Quota::per_day(100_000));
    assert!(refused(&busy).contains("2^51"), "{}", refused(&busy));
    assert!(backend
        .validate_one(&limit(
            "day",
            Algorithm::SlidingWindow,
            Quota::per_day(20_000)
        ))
        .is_ok());
    assert!(backend
        .validate_one(&limit(
            "day",
            Algorithm::FixedWindow,
            Quota::per_day(100_000)
        ))
        .is_ok());
    let conc = limit("c", Algorithm::Concurrency, Quota::per_second(5));
    assert!(backend.validate_one(&conc).is_ok());

    // Stacks: 1 to 16 limits, no concurrency, no limit twice.
    let a = hourly("a", Algorithm::FixedWindow, 5);
    let b = limit("b", Algorithm::Gcra, Quota::per_second(5));
    assert!(backend.validate_all(&[a.clone(), b.clone()]).is_ok());
    let err = backend
        .validate_all(&[a.clone(), conc.clone()])
        .unwrap_err();
    assert!(err.to_string().contains("concurrency"), "{err}");
    let err = backend.validate_all(&[a.clone(), a.clone()]).unwrap_err();
    assert!(err.to_string().contains("twice"), "{err}");
    let many: Vec<Limit> = (0..17)
        .map(|i| hourly(&format!("l{i}"), Algorithm::FixedWindow, 5))
        .collect();
    assert!(backend.validate_all(&many).is_err());
    assert!(backend.validate_all(&many[..16]).is_ok());
    assert!(backend.validate_all(&[]).is_err());
    // And a request that skipped validation is an error, not a wrong answer.
    let key = Key::from("k");
    assert!(backend.check_all(&[a, conc], &key, 1).await.is_err());
    assert!(backend.check_all(&many, &key, 1).await.is_err());
}

/// The new calls go through the same failure handling: a server that is gone is an error (the
/// layer's failure policy answers), a concurrency rejection is never served locally, and a
/// release without Redis does not block.
#[tokio::test]
async fn failures_reach_the_caller_and_releases_never_block() {
    let mut server = RedisServer::start();
    let backend = RedisBackend::builder()
        .url(server.url())
        .mode(RedisMode::Lua)
        .timeout(Duration::from_millis(200))
        .connect()
        .await
        .unwrap();
    let conc = limit("f-conc", Algorithm::Concurrency, Quota::per_second(1));
    let fixed = hourly("f-fixed", Algorithm::FixedWindow, 1);
    let key = Key::from("k");
    let held = backend.check_one(&conc, &key, 1).await.unwrap();
    assert!(held.allowed);
    assert!(!backend.check_one(&conc, &key, 1).await.unwrap().allowed);
    server.stop();
    for limit in [&conc, &fixed] {
        assert!(backend.check_one(limit, &key, 1).await.is_err());
    }
    assert!(backend
        .check_all(std::slice::from_ref(&fixed), &key, 1)
        .await
        .is_err());
    // The failures opened the circuit breaker: the next calls fail at once, without a round trip.
    let fail_fast =
        |e: tower_throttle::backend::BackendError| format!("{e:?}").contains("failing fast");
    let mut fast = (false, false);
    for _ in 0..20 {
        fast.0 |= backend
            .check_one(&fixed, &key, 1)
            .await
            .is_err_and(fail_fast);
        fast.1 |= backend
            .check_all(std::slice::from_ref(&fixed), &key, 1)
            .await
            .is_err_and(fail_fast);
    }
    assert_eq!(fast, (true, true), "the breaker never answered");
    // The release retries until Redis answers or the lease (a minute) ends: it must do so on a task
    // of its own. Waiting inline would take that minute; anything else, however loaded the
    // machine, is far below the bound.
    let started = std::time::Instant::now();
    backend.release(&conc, &key, 1, held.lease.unwrap());
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    // Outside a runtime a release does nothing (the lease expires).
    let b2 = backend.clone();
    let (c2, k2) = (conc.clone(), key.clone());
    std::thread::spawn(move || b2.release(&c2, &k2, 1, 1))
        .join()
        .unwrap();
    // Redis comes back (empty: nothing persists): decisions come from it again.
    server.restart();
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match backend.check_one(&conc, &key, 1).await {
            Ok(d) => {
                assert!(d.allowed && d.lease.is_some(), "{d:?}");
                break;
            }
            Err(e) => assert!(
                Instant::now() < deadline,
                "Redis never decided again: {e:?}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Calls of `command` the server has executed (`INFO commandstats`).
fn calls(server: &RedisServer, command: &str) -> u64 {
    let stats = server.cli(&["INFO", "commandstats"]);
    let prefix = format!("cmdstat_{command}:calls=");
    stats
        .lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()))
        .map_or(0, |rest| rest.split(',').next().unwrap().parse().unwrap())
}

/// The deny cache holds a fixed window's rejection until the boundary, and a full sliding log's
/// for one unit until its oldest unit leaves: no round trips, the same numbers aged, and Redis
/// decides again in time. Everything else (a sliding window, a log asked for several units, a
/// concurrency limit) reaches Redis every time.
#[tokio::test]
async fn the_deny_cache_holds_only_rejections_that_last_until_their_retry_time() {
    let server = RedisServer::start();
    let backend = connect(&server.url()).await;
    let period = Duration::from_secs(2);
    let key = Key::from("flooder");
    let fixed = limit(
        "d-fixed",
        Algorithm::FixedWindow,
        Quota::per_period(2, period),
    );
    let log = limit("d-log", Algorithm::SlidingLog, Quota::per_period(2, period));
    align(&server.url(), period, Duration::from_millis(200)).await;
    let mut open_again = Vec::new();
    for limit in [&fixed, &log] {
        for _ in 0..2 {
            assert!(backend.check_one(limit, &key, 1).await.unwrap().allowed);
        }
        let first = backend.check_one(limit, &key, 1).await.unwrap();
        assert!(!first.allowed, "{first:?}");
        open_again.push(Instant::now() + first.retry_after.unwrap());
        let before = calls(&server, "evalsha");
        for _ in 0..100 {
            let d = backend.check_one(limit, &key, 1).await.unwrap();
            assert!(!d.allowed);
            assert_eq!((d.limit, d.remaining), (first.limit, first.remaining));
            assert!(d.retry_after.unwrap() <= first.retry_after.unwrap());
        }
        assert_eq!(calls(&server, "evalsha"), before, "{}", limit.name());
    }
    // Several units from a full log: its room may grow before the retry time, so Redis decides.
    let before = calls(&server, "evalsha");
    for _ in 0..10 {
        assert!(!backend.check_one(&log, &key, 2).await.unwrap().allowed);
    }
    assert_eq!(calls(&server, "evalsha"), before + 10);
    // The fixed window opens again at the boundary, the log when its first unit leaves: the
    // retry times Redis gave, which the cache did not outlast.
    for (limit, at) in [&fixed, &log].into_iter().zip(open_again) {
        tokio::time::sleep_until(at + Duration::from_millis(20)).await;
        assert!(
            backend.check_one(limit, &key, 1).await.unwrap().allowed,
            "{}",
            limit.name()
        );
    }

    let sliding = limit(
        "d-sliding",
        Algorithm::SlidingWindow,
        Quota::per_period(2, period),
    );
    let conc = limit("d-conc", Algorithm::Concurrency, Quota::per_second(1));
    let held = backend.check_one(&conc, &key, 1).await.unwrap();
    assert!(held.allowed);
    for _ in 0..2 {
        assert!(backend.check_one(&sliding, &key, 1).await.unwrap().allowed);
    }
    let before = calls(&server, "evalsha");
    for _ in 0..10 {
        assert!(!backend.check_one(&sliding, &key, 1).await.unwrap().allowed);
        assert!(!backend.check_one(&conc, &key, 1).await.unwrap().allowed);
    }
    assert_eq!(calls(&server, "evalsha"), before + 20);
    // A released slot is admitted at once: no cached rejection stands in the way.
    backend.release(&conc, &key, 1, held.lease.unwrap());
    let deadline = Instant::now() + Duration::from_secs(2);
    while !backend.check_one(&conc, &key, 1).await.unwrap().allowed {
        assert!(
            Instant::now() < deadline,
            "the released slot was never free"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A delaying GCRA limit's tolerance includes its delay, which `CL.THROTTLE`'s whole seconds cannot
/// express: in Cell mode it is accepted and runs on Lua, with exact times.
#[tokio::test]
async fn delayed_gcra_limits_never_take_the_cell_path() {
    let server = RedisServer::start_with_cell();
    let cell = RedisBackend::builder()
        .url(server.url())
        .mode(RedisMode::Cell)
        .connect()
        .await
        .unwrap();
    let delayed = Limit::new("delayed", Quota::per_second(2))
        .unwrap()
        .with_delay(Duration::from_millis(1500))
        .unwrap();
    cell.validate_one(&delayed).unwrap();
    let key = Key::from("k");
    let mut last = None;
    for _ in 0..5 {
        let d = cell.check_one(&delayed, &key, 1).await.unwrap();
        assert!(d.allowed, "{d:?}");
        last = Some(d);
    }
    // The TAT is 2.5 s ahead, to the nanosecond on the server's clock, not a whole second.
    let reset = last.unwrap().reset_after;
    assert!(
        reset > Duration::from_millis(2400) && reset <= Duration::from_millis(2500),
        "{reset:?}"
    );
    assert!(!cell.check_one(&delayed, &key, 1).await.unwrap().allowed);
    assert_eq!(calls(&server, "cl.throttle"), 0);
    // The same quota without a delay still takes CL.THROTTLE.
    let plain = Limit::new("plain", Quota::per_second(2)).unwrap();
    assert!(cell.check_one(&plain, &key, 1).await.unwrap().allowed);
    assert_eq!(calls(&server, "cl.throttle"), 1);
}

/// The limits script exactly as the backend loads it, but for its clock: `TIME` is replaced by a
/// hash the test sets, so its arithmetic can be compared with `window.rs` and `gcra.rs` to the
/// nanosecond, on any instant and any stored state, at the precision bounds the backend accepts.
fn script_on_a_test_clock() -> redis::Script {
    const SOURCE: &str = crate::lua::LIMITS;
    const CLOCK: &str = "local time = redis.call('TIME')";
    assert_eq!(
        SOURCE.matches(CLOCK).count(),
        1,
        "limits.lua must read the clock on exactly one line: {CLOCK}"
    );
    redis::Script::new(&SOURCE.replace(
        CLOCK,
        "local time = redis.call('HMGET', 'test-clock', 's', 'us')",
    ))
}

/// A small deterministic generator (no dependency, reproducible failures); metered_parity.rs uses
/// it too.
pub(crate) struct Rng(pub(crate) u64);

impl Rng {
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let x = self.0 ^ (self.0 >> 29);
        if n == 0 {
            0
        } else {
            x.wrapping_mul(0x2545_f491_4f6c_dd1d) % n
        }
    }

    pub(crate) fn pick<T: Copy>(&mut self, from: &[T]) -> T {
        from[self.below(from.len() as u64) as usize]
    }

    /// Mostly small, sometimes at the bounds.
    fn count(&mut self, max: u64) -> u64 {
        match self.below(4) {
            0 => max,
            1 => 1 + self.below(max),
            _ => 1 + self.below(max.min(12)),
        }
    }
}

#[tokio::test]
async fn the_script_computes_window_rs_and_gcra_rs_exactly() {
    let server = RedisServer::start();
    let client = redis::Client::open(server.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let script = script_on_a_test_clock();
    let mut rng = Rng(0x5eed);
    // Periods in µs: the finest, odd ones, a second, a day, the longest accepted (< 2^52 ns).
    let periods = [
        1,
        3,
        1000,
        7919,
        1_000_000,
        86_400_000_000,
        (1 << 52) / 1000 - 1,
    ];
    let mut admitted = [0u32; 4];
    let mut rejected = [0u32; 4];
    for case in 0..3000u32 {
        let now_s = 1_600_000_000 + rng.below(400_000_000);
        let now_us = now_s * 1_000_000 + rng.below(1_000_000);
        let now = now_us * 1000;
        let kind = rng.below(4);
        let period_us = rng.pick(&periods);
        let (algorithm, count) = match kind {
            0 => (Algorithm::SlidingLog, rng.count(40)),
            1 => (Algorithm::FixedWindow, rng.count(1 << 51)),
            2 => {
                let max = (1u64 << 41).min((1u64 << 51) / period_us);
                (Algorithm::SlidingWindow, rng.count(max))
            }
            _ => (Algorithm::Gcra, rng.count(1000)),
        };
        let quantity = match rng.below(8) {
            0 => 0,
            1 => count + 1,
            2 => u64::MAX,
            3 => count,
            _ => 1 + rng.below(count.min(4)),
        };
        let key = "k";
        let mut pipe = redis::pipe();
        pipe.del(key)
            .ignore()
            .hset_multiple("test-clock", &[("s", now_s), ("us", now_us % 1_000_000)])
            .ignore();
        // The stored state, in Redis and in the model.
        // `None` for the GCRA, whose model is `gcra::decide` on `tat`.
        let (limit, model_state, a, b): (Limit, Option<Model>, u64, u64);
        let mut tat = None;
        if algorithm == Algorithm::Gcra {
            let period = Duration::from_millis(rng.pick(&[1, 1000, 3_600_000, 86_400_000]));
            let quota = Quota::per_period(count, period).with_max_burst(rng.below(2 * count));
            limit = Limit::new("gcra", quota).unwrap();
            let params = *limit.gcra().unwrap();
            if params.tolerance() + params.emission_interval() > 1 << 52 {
                continue; // refused by the backend
            }
            if rng.below(4) != 0 {
                // Anywhere from a while ago to past the tolerance (another quota's state).
                let ahead = rng.below(2 * params.tolerance() + params.emission_interval());
                let t = (now - params.emission_interval()) + ahead;
                pipe.set(key, t.to_string()).ignore();
                tat = Some(t);
            }
            model_state = None;
            (a, b) = (params.emission_interval(), params.tolerance());
        } else {
            let quota = Quota::per_period(count, Duration::from_micros(period_us));
            limit = Limit::with_algorithm("w", algorithm, quota).unwrap();
            let window = now_us / period_us;
            model_state = Some(match algorithm {
                Algorithm::SlidingLog => {
                    let mut log = VecDeque::new();
                    let mut times: Vec<u64> = (0..rng.below(count + 1))
                        .map(|_| now_us - rng.below(period_us.min(now_us)))
                        .collect();
                    // Some that have left the window: trimmed, never counted.
                    times.extend((0..rng.below(3)).map(|_| now_us - period_us - rng.below(5)));
                    times.sort_unstable();
                    for (i, t) in times.iter().enumerate() {
                        pipe.zadd(key, format!("old:{i}"), *t).ignore();
                        log.push_back(t * 1000);
                    }
                    Model::Log(log)
                }
                Algorithm::FixedWindow => {
                    let state = (rng.below(3) != 0).then(|| FixedState {
                        window: window - rng.pick(&[0, 0, 1, 5]),
                        // Up to thrice the limit: kept under a larger quota.
                        count: rng.below(3 * count) + 1,
                    });
                    if let Some(s) = state {
                        pipe.set(key, format!("{}:{}", s.window, s.count)).ignore();
                    }
                    Model::Fixed(state)
                }
                _ => {
                    let state = (rng.below(4) != 0).then(|| SlidingState {
                        window: window - rng.pick(&[0, 0, 1, 1, 2]),
                        current: rng.below(3 * count + 1),
                        previous: rng.below(3 * count + 1),
                    });
                    if let Some(s) = state {
                        let v = format!("{}:{}:{}", s.window, s.current, s.previous);
                        pipe.set(key, v).ignore();
                    }
                    Model::Sliding(state)
                }
            });
            (a, b) = (period_us, 0);
        }
        let () = pipe.query_async(&mut conn).await.unwrap();
        let reply: Vec<i64> = script
            .key(key)
            .arg(1)
            .arg(quantity)
            .arg(4242)
            .arg(0)
            .arg(0)
            .arg(0)
            .arg(kind_of(algorithm))
            .arg(limit.max_cost())
            .arg(a)
            .arg(b)
            .invoke_async(&mut conn)
            .await
            .unwrap_or_else(|e| panic!("case {case}: {e}"));
        let (expected, stored) = match model_state {
            Some(Model::Log(mut log)) => {
                let d = window::sliding_log(&mut log, now, limit.window().unwrap(), quantity);
                let mut scores: Vec<String> = log.iter().map(|t| (t / 1000).to_string()).collect();
                scores.sort();
                (d, scores.join(","))
            }
            None => {
                let out = tower_throttle::gcra::decide(tat, now, limit.gcra().unwrap(), quantity);
                let stored = out.new_tat.map(|t| t.to_string()).unwrap_or_default();
                (out.decision, stored)
            }
            Some(mut model) => {
                let d = model.decide(now, limit.window().unwrap(), quantity);
                let stored = match model {
                    Model::Fixed(Some(s)) => format!("{}:{}", s.window, s.count),
                    Model::Sliding(Some(s)) => {
                        format!("{}:{}:{}", s.window, s.current, s.previous)
                    }
                    _ => String::new(),
                };
                (d, stored)
            }
        };
        let context = format!(
            "case {case}: {algorithm} {count} per {period_us} µs, now {now}, quantity {quantity}\n \
             script {reply:?}\n model  {expected:?}"
        );
        let retry = expected
            .retry_after
            .map_or(-1, |r| i64::try_from(r.as_nanos()).unwrap());
        let want = [
            0,
            i64::from(!expected.allowed),
            expected.limit as i64,
            expected.remaining as i64,
            if expected.allowed { -1 } else { retry },
            i64::try_from(expected.reset_after.as_nanos()).unwrap(),
        ];
        assert_eq!(reply, want, "{context}");
        let slot = kind_of(algorithm) as usize % 4;
        if expected.allowed {
            admitted[slot] += 1;
        } else {
            rejected[slot] += 1;
        }
        // What an admission stored is what the model stores, with an expiry. Expiries run on the
        // real clock, where a key whose state lasts a few ms (about `reset_after`) may be gone.
        if expected.allowed && quantity > 0 {
            let (value, ttl): (Option<String>, i64) = if algorithm == Algorithm::SlidingLog {
                let (pairs, ttl): (Vec<(String, String)>, i64) = redis::pipe()
                    .cmd("ZRANGE")
                    .arg(key)
                    .arg(0)
                    .arg(-1)
                    .arg("WITHSCORES")
                    .pttl(key)
                    .query_async(&mut conn)
                    .await
                    .unwrap();
                let mut scores: Vec<String> = pairs.into_iter().map(|(_, s)| s).collect();
                scores.sort();
                ((!scores.is_empty()).then(|| scores.join(",")), ttl)
            } else {
                redis::pipe()
                    .get(key)
                    .pttl(key)
                    .query_async(&mut conn)
                    .await
                    .unwrap()
            };
            match value {
                Some(value) => {
                    assert_eq!(value, stored, "{context}");
                    // -1 would be a key without expiry; 0 or -2 (gone since), a short-lived one.
                    let short = expected.reset_after <= Duration::from_millis(20);
                    assert!(ttl > 0 || (short && ttl != -1), "{context}: PTTL {ttl}");
                }
                None => assert!(
                    expected.reset_after <= Duration::from_millis(20),
                    "{context}: the state is gone"
                ),
            }
        }
    }
    for slot in 0..4 {
        assert!(
            admitted[slot] > 100 && rejected[slot] > 100,
            "{admitted:?} {rejected:?}"
        );
    }
}

/// `gcra.lua` (the single-limit GCRA script) exactly as the backend loads it, but for its clock, as
/// [`script_on_a_test_clock`] does for the limits script.
fn gcra_script_on_a_test_clock() -> redis::Script {
    const SOURCE: &str = crate::lua::GCRA;
    const CLOCK: &str = "local time = redis.call('TIME')";
    assert_eq!(
        SOURCE.matches(CLOCK).count(),
        1,
        "gcra.lua must read the clock on exactly one line: {CLOCK}"
    );
    redis::Script::new(&SOURCE.replace(
        CLOCK,
        "local time = redis.call('HMGET', 'test-clock', 's', 'us')",
    ))
}

/// What gcra.lua's state counts as: a TAT (decimal ns, as the script parses it) ahead of `now`, or
/// nothing (no key, a TAT that has passed, a value that is not a TAT).
fn backlog_of(stored: Option<&str>, now: u64) -> Option<u64> {
    stored
        .filter(|s| (10..30).contains(&s.len()) && s.bytes().all(|b| b.is_ascii_digit()))
        .and_then(|s| s.parse::<u64>().ok())
        .filter(|tat| *tat > now)
        .map(|tat| tat - now)
}

/// gcra.lua on a test clock computes `gcra::decide` to the nanosecond, reply decoded as the backend
/// decodes it, on random instants, quotas (up to the 2^52 ns the backend accepts, delays included)
/// and stored states: none, passed, within the tolerance, beyond it (another quota's TAT, rebased to
/// a full bucket and stored so), and values that are not TATs; for quantities 0, within the burst,
/// the whole burst, one more than it and beyond any arithmetic. The state it leaves is the model's,
/// expiring when the TAT passes; a rejection writes nothing (but a rebase).
#[tokio::test]
async fn the_gcra_script_computes_gcra_rs_exactly() {
    let server = RedisServer::start();
    let client = redis::Client::open(server.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let script = gcra_script_on_a_test_clock();
    let mut rng = Rng(0x6c2a);
    const MS: u64 = 1_000_000;
    // Periods in ns: a µs, a ms, odd ones, a second, an hour, a day, 52 days, and 2^51 ns (with
    // max_burst 0 its interval plus tolerance is exactly the 2^52 ns bound).
    let periods = [
        1000,
        MS,
        7919 * 1000,
        1000 * MS + 7,
        1000 * MS,
        3_600_000 * MS,
        86_400_000 * MS,
        52 * 86_400_000 * MS,
        1 << 51,
    ];
    let mut seen = std::collections::BTreeMap::<&str, u32>::new();
    for case in 0..4000u32 {
        let now_s = 1_600_000_000 + rng.below(400_000_000);
        let now_us = now_s * 1_000_000 + rng.below(1_000_000);
        let now = now_us * 1000;
        let count = rng.count(1000);
        let period = Duration::from_nanos(rng.pick(&periods));
        let quota = match rng.below(20) {
            // One per 2^51 ns, no burst: interval plus tolerance exactly at the bound.
            0 => Quota::per_period(1, Duration::from_nanos(1 << 51)).with_max_burst(0),
            1 => Quota::per_period(count, period).with_max_burst(0),
            _ => Quota::per_period(count, period).with_max_burst(rng.below(2 * count)),
        };
        let Ok(mut limit) = Limit::new("gcra", quota) else {
            continue; // a rate finer than a nanosecond, or a burst beyond any bound
        };
        if rng.below(5) == 0 {
            let delay = Duration::from_millis(1 + rng.below(3_600_000));
            limit = limit.with_delay(delay).unwrap();
        }
        let params = *limit.gcra().unwrap();
        let (t, tau) = (params.emission_interval(), params.tolerance());
        if tau.checked_add(t).is_none_or(|w| w > 1 << 52) {
            continue; // refused when the layer is built
        }
        // The stored value, and what the model is given for it.
        let (stored, tat): (Option<String>, Option<u64>) = match rng.below(8) {
            0 => (None, None),
            // Passed: long ago, or just.
            1 => {
                let at = now - rng.pick(&[1, 1000, t, 365 * 86_400_000 * MS]);
                (Some(at.to_string()), Some(at))
            }
            // Another quota's TAT, beyond this tolerance: just beyond, or far.
            2 => {
                let beyond = [1, 1 + rng.below(t), 1 + rng.below(2 * tau)];
                let at = now + tau + rng.pick(&beyond);
                (Some(at.to_string()), Some(at))
            }
            // Not a TAT: counts as no state.
            3 => (
                Some(
                    rng.pick(&["", "x", "12", "-5", "1.7e18", "17000000000000000000a"])
                        .to_owned(),
                ),
                None,
            ),
            // At the bounds of the tolerance.
            4 => {
                let at = now + rng.pick(&[0, tau, tau - t]);
                (Some(at.to_string()), Some(at))
            }
            _ => {
                let at = now + rng.below(tau + 1);
                (Some(at.to_string()), Some(at))
            }
        };
        let limit_units = params.limit();
        let quantity = match rng.below(9) {
            0 => 0,
            1 => limit_units,
            2 => limit_units + 1,
            3 => u64::MAX,
            4 => (u64::MAX / t).saturating_add(1), // the increment overflows u64
            _ => 1 + rng.below(limit_units.min(4)),
        };
        let key = "k";
        let mut pipe = redis::pipe();
        pipe.del(key)
            .ignore()
            .hset_multiple("test-clock", &[("s", now_s), ("us", now_us % 1_000_000)])
            .ignore();
        if let Some(value) = &stored {
            pipe.set(key, value).ignore();
        }
        let () = pipe.query_async(&mut conn).await.unwrap();
        // The arguments the backend sends (`RedisBackend::check`).
        let reply: Vec<i64> = script
            .key(key)
            .arg(t)
            .arg(tau)
            .arg(limit_units)
            .arg(quantity)
            .invoke_async(&mut conn)
            .await
            .unwrap_or_else(|e| panic!("case {case}: {e}"));
        let out = tower_throttle::gcra::decide(tat, now, &params, quantity);
        let expected = out.decision;
        let context = format!(
            "case {case}: {quota} {:?}, now {now}, stored {stored:?}, quantity {quantity}\n \
             script {reply:?}\n model  {expected:?}",
            limit.delay()
        );
        let nanos = |d: Duration| i64::try_from(d.as_nanos()).unwrap();
        let want = vec![
            i64::from(!expected.allowed),
            expected.limit as i64,
            expected.remaining as i64,
            expected.retry_after.map_or(-1, nanos),
            nanos(expected.reset_after),
        ];
        assert_eq!(reply, want, "{context}");
        // Decoded as the backend decodes it (`from_reply` in nanoseconds).
        let [limited, limit_value, remaining, retry, reset] = reply[..] else {
            panic!("{context}: a reply of {} values", reply.len());
        };
        let reset_after = Duration::from_nanos(reset.max(0) as u64);
        let decoded = if limited == 0 {
            Decision::allowed(
                limit_value.max(0) as u64,
                remaining.max(0) as u64,
                reset_after,
            )
        } else {
            let retry_after = u64::try_from(retry).ok().map(Duration::from_nanos);
            Decision::limited(
                limit_value.max(0) as u64,
                remaining.max(0) as u64,
                retry_after,
                reset_after,
            )
        };
        assert_eq!(decoded, expected, "{context}");

        // The state left behind.
        let (value, ttl): (Option<String>, i64) = redis::pipe()
            .get(key)
            .pttl(key)
            .query_async(&mut conn)
            .await
            .unwrap();
        let rebased = tat.is_some_and(|tat| tat > now + tau);
        let ahead = out.new_tat.filter(|n| *n > now).map(|n| n - now);
        let written = ahead.is_some() && (expected.allowed || rebased);
        if written {
            let ahead = ahead.unwrap();
            // Expiries run on the real clock: a TAT a few ms ahead may be gone already.
            let short = ahead <= 20 * MS;
            match value {
                Some(v) => {
                    assert_eq!(Some(v), out.new_tat.map(|n| n.to_string()), "{context}");
                    // A short expiry may run out between GET and PTTL (-2: gone; 0: under 1 ms).
                    assert!(
                        (ttl > 0 && ttl as u64 <= ahead.div_ceil(MS))
                            || (short && (ttl == -2 || ttl == 0)),
                        "{context}: PTTL {ttl}, the TAT {ahead} ns ahead"
                    );
                }
                None => assert!(short, "{context}: the state is gone"),
            }
        } else {
            assert_eq!(value, stored, "{context}: wrote");
            assert_eq!(backlog_of(value.as_deref(), now), ahead, "{context}");
        }

        let mut note = |what| *seen.entry(what).or_default() += 1;
        note(if expected.allowed {
            "admitted"
        } else {
            "rejected"
        });
        if expected.retry_after.is_none() && !expected.allowed {
            note("never");
        }
        if rebased {
            note(if expected.allowed {
                "rebased, admitted"
            } else {
                "rebased, rejected"
            });
        }
        if tat.is_some_and(|tat| tat < now) {
            note("passed");
        }
        if quantity == 0 {
            note("quantity 0");
        }
        if stored.is_some() && tat.is_none() {
            note("not a TAT");
        }
        if limit.delay().is_some() {
            note("delayed");
        }
        if tau + t == 1 << 52 {
            note("at the bound");
        }
    }
    for what in [
        "admitted",
        "rejected",
        "never",
        "rebased, admitted",
        "rebased, rejected",
        "passed",
        "quantity 0",
        "not a TAT",
        "delayed",
        "at the bound",
    ] {
        assert!(
            seen.get(what).copied().unwrap_or(0) >= 20,
            "{what}: {seen:?}"
        );
    }
}

/// The script's number for each algorithm (see limits.lua).
fn kind_of(algorithm: Algorithm) -> u64 {
    match algorithm {
        Algorithm::Gcra => 0,
        Algorithm::SlidingLog => 1,
        Algorithm::FixedWindow => 2,
        Algorithm::SlidingWindow => 3,
        _ => 4,
    }
}

/// Stalls the server for `ms` (`CLIENT PAUSE`): it holds every client's commands, unanswered,
/// and runs them in order when the pause ends. Returns once the pause is in force.
fn pause_server(server: &RedisServer, ms: u64) {
    server.cli(&["CLIENT", "PAUSE", &ms.to_string(), "ALL"]);
}

async fn with_timeout(url: &str, timeout: Duration) -> RedisBackend {
    RedisBackend::builder()
        .url(url)
        .mode(RedisMode::Lua)
        .timeout(timeout)
        .connect()
        .await
        .unwrap()
}

/// Polls until `key` holds no member, for at most 10 s (far more than a stall and a few retries).
async fn until_empty(server: &RedisServer, key: &str, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while cli_int(server, &["ZCARD", key]) != 0 {
        assert!(Instant::now() < deadline, "{what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Checks that time out while Redis stalls may still have run there; their slots come back once
/// Redis answers again, instead of staying taken for the whole lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrency_checks_that_time_out_give_their_slots_back() {
    let server = RedisServer::start();
    let backend = with_timeout(&server.url(), Duration::from_millis(100)).await;
    let conc = limit("c", Algorithm::Concurrency, Quota::per_second(3));
    let key = Key::from("k");
    let state = backend.state_key(&conc, &key);
    // Load the script first, so that the stalled calls are the decisions themselves.
    let d = backend.check_one(&conc, &key, 1).await.unwrap();
    backend.release(&conc, &key, 1, d.lease.unwrap());
    until_empty(&server, &state, "the first slot never came back").await;

    // Long enough that the checks time out (100 ms) however late this task runs after the pause
    // began; when it ends, Redis runs them all the same.
    pause_server(&server, 1000);
    let (a, b, c) = tokio::join!(
        backend.check_one(&conc, &key, 1),
        backend.check_one(&conc, &key, 1),
        backend.check_one(&conc, &key, 1)
    );
    assert!(a.is_err() && b.is_err() && c.is_err(), "{a:?} {b:?} {c:?}");
    until_empty(&server, &state, "slots taken by unanswered checks stayed").await;
    assert!(backend.check_one(&conc, &key, 3).await.unwrap().allowed);
}

/// A release while the circuit breaker is open (Redis just timed out) is retried, not lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_release_while_the_breaker_is_open_still_gives_the_slot_back() {
    let server = RedisServer::start();
    let backend = with_timeout(&server.url(), Duration::from_millis(100)).await;
    let conc = limit("c", Algorithm::Concurrency, Quota::per_second(1));
    let fixed = limit("f", Algorithm::FixedWindow, Quota::per_hour(100));
    let key = Key::from("k");
    let state = backend.state_key(&conc, &key);
    let held = backend.check_one(&conc, &key, 1).await.unwrap();
    assert!(held.allowed);
    // Long enough that the check times out (100 ms) however late this task runs after the pause
    // began; the release comes while the breaker that timeout opened is still open.
    pause_server(&server, 1000);
    let timed_out = backend.check_one(&fixed, &key, 1).await;
    assert!(timed_out.is_err(), "{timed_out:?}");
    backend.release(&conc, &key, 1, held.lease.unwrap());
    until_empty(&server, &state, "a release during the outage was lost").await;
    // The breaker lets calls through again after a probe.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !matches!(backend.check_one(&conc, &key, 1).await, Ok(d) if d.allowed) {
        assert!(Instant::now() < deadline, "the slot never came back");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// One check of an hourly limit of 5 named `name`, on a key whose Redis state is `state`, and
/// the key's name.
async fn decide_on(
    server: &RedisServer,
    backend: &RedisBackend,
    name: &str,
    algorithm: Algorithm,
    state: &str,
) -> (Decision, String) {
    let limit = hourly(name, algorithm, 5);
    let key = Key::from("stepped");
    let redis_key = backend.state_key(&limit, &key);
    server.cli(&["SET", &redis_key, state, "PX", "7200000"]);
    (backend.check_one(&limit, &key, 1).await.unwrap(), redis_key)
}

/// A window newer than the server's clock (it stepped back across a boundary: a failover to a
/// replica whose clock runs behind, an NTP step) still holds: the key is decided in it, not
/// afresh in the older window, which would erase its count.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_window_newer_than_the_servers_clock_still_holds() {
    let server = RedisServer::start();
    let backend = connect(&server.url()).await;
    let time = server.cli(&["TIME"]);
    let seconds: u64 = time.lines().next().unwrap().trim().parse().unwrap();
    let next = seconds / 3600 + 1;
    for (algorithm, state) in [
        (Algorithm::FixedWindow, format!("{next}:5")),
        (Algorithm::SlidingWindow, format!("{next}:5:0")),
    ] {
        let (d, redis_key) = decide_on(
            &server,
            &backend,
            &format!("newer-{algorithm}"),
            algorithm,
            &state,
        )
        .await;
        assert!(!d.allowed, "{algorithm}: {d:?}");
        assert_eq!(server.cli(&["GET", &redis_key]), state, "{algorithm}");
    }
    // Counted in the newer window, the key lives until that window's count no longer counts:
    // with the server's window's expiry, its count would be gone when the server's clock got
    // there, and as many again admitted.
    for (algorithm, state, counts_until) in [
        (Algorithm::FixedWindow, format!("{next}:2"), next + 1),
        (Algorithm::SlidingWindow, format!("{next}:2:0"), next + 2),
    ] {
        let (d, redis_key) = decide_on(
            &server,
            &backend,
            &format!("newer-ttl-{algorithm}"),
            algorithm,
            &state,
        )
        .await;
        assert!(d.allowed && d.remaining == 2, "{algorithm}: {d:?}");
        let ttl_ms: u64 = server.cli(&["PTTL", &redis_key]).parse().unwrap();
        // Less a minute: the test's own time (the old expiry fell an hour or more short).
        let needed_ms = (counts_until * 3600 - seconds - 60) * 1000;
        assert!(
            ttl_ms >= needed_ms,
            "{algorithm}: {ttl_ms} ms < {needed_ms} ms"
        );
        if algorithm == Algorithm::FixedWindow {
            // The count resets when that window ends, and the reply says so.
            let reset_ms = d.reset_after.as_millis() as u64;
            assert!(reset_ms >= needed_ms, "{reset_ms} ms < {needed_ms} ms");
        }
    }
    // A window further on was numbered under another period (here a minute's: the quota was
    // changed): it counts for nothing, and the key lives no longer than the server's windows.
    for (algorithm, state) in [
        (Algorithm::FixedWindow, format!("{}:5", next * 60)),
        (Algorithm::SlidingWindow, format!("{}:5:0", next * 60)),
    ] {
        let (d, redis_key) = decide_on(
            &server,
            &backend,
            &format!("renumbered-{algorithm}"),
            algorithm,
            &state,
        )
        .await;
        assert!(d.allowed && d.remaining == 4, "{algorithm}: {d:?}");
        let ttl_ms: u64 = server.cli(&["PTTL", &redis_key]).parse().unwrap();
        assert!(ttl_ms <= 2 * 3_600_000, "{algorithm}: {ttl_ms} ms");
    }
}

/// A GCRA limit's state stored under a larger quota (its route was changed in a shared store) is
/// rebased to the smaller quota's ceiling when that quota decides. Alone, at once (gcra.lua, as
/// memory's GCRA table); in a stack, only when the stack admits: a rejected stack writes nothing,
/// on Redis as in memory, so the larger quota still finds the units it took.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rejected_stack_leaves_another_quotas_state_as_memory_does() {
    let server = RedisServer::start();
    let redis = connect(&server.url()).await;
    let memory = MemoryBackend::new();
    // A unit drips back a minute, so the test's own time changes nothing.
    let wide = Limit::new("rebased", Quota::per_hour(60)).unwrap();
    let narrow = Limit::new("rebased", Quota::per_minute(2)).unwrap();
    let other = hourly("rebased-other", Algorithm::FixedWindow, 100);
    let key = Key::from("moved");
    let stacks = [vec![wide, other.clone()], vec![narrow, other]];
    let remaining = [
        taken_refused_taken(&redis, &stacks, &key).await,
        taken_refused_taken(&memory, &stacks, &key).await,
    ];
    // 60 less the 50 taken and this one.
    assert_eq!(remaining, [9, 9], "redis, memory");
}

/// 50 units of `stacks[0]`, refused 1 of `stacks[1]`, and what 1 more of `stacks[0]` leaves.
async fn taken_refused_taken<B: Asks>(backend: &B, stacks: &[Vec<Limit>; 2], key: &Key) -> u64 {
    let taken = backend.check_all(&stacks[0], key, 50).await.unwrap()[0];
    assert!(taken.allowed, "{taken:?}");
    let refused = backend.check_all(&stacks[1], key, 1).await.unwrap()[0];
    assert!(!refused.allowed, "{refused:?}");
    backend.check_all(&stacks[0], key, 1).await.unwrap()[0].remaining
}
