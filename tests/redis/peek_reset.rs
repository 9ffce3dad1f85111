//! `Backend::peek` and `Backend::reset` on Redis (Lua, `CL.THROTTLE`, Cluster), every algorithm
//! and a stack: a peek consumes and writes nothing (many peeks, then the full quota still passes),
//! a reset gives the full quota back and lifts a ban, in Redis and in this process's deny cache.

use crate::support::redis as redis_support;

use std::time::Duration;

use crate::support::asks::Asks;
use redis_support::{RedisCluster, RedisServer};
use tower_throttle::{
    backend::KeyState,
    policy::Penalty,
    redis::{RedisBackend, RedisMode},
    Algorithm, Backend, Key, Limit, Quota,
};

async fn connect(url: &str, mode: RedisMode) -> RedisBackend {
    RedisBackend::builder()
        .url(url)
        .mode(mode)
        .timeout(Duration::from_secs(2))
        .connect()
        .await
        .unwrap_or_else(|e| panic!("connect {url}: {e:?}"))
}

async fn peek<B: Backend>(backend: &B, limits: &[Limit], key: &Key) -> Vec<KeyState> {
    let states = backend.peek_all(limits, key).await.unwrap();
    assert_eq!(states.len(), limits.len());
    states
}

/// Admits one request of cost 1 (through `check` for one limit, `check_all` for a stack).
async fn admitted<B: Backend>(backend: &B, limits: &[Limit], key: &Key) -> bool {
    match limits {
        [one] => backend.check_one(one, key, 1).await.unwrap().allowed,
        stack => backend
            .check_all(stack, key, 1)
            .await
            .unwrap()
            .iter()
            .all(|d| d.allowed),
    }
}

/// The whole story for one limit or stack: fresh state, peeks that consume nothing, the quota spent,
/// the peek of a limited key, a reset, and the quota again.
async fn peek_then_reset<B: Backend>(backend: &B, limits: &[Limit], key: &Key) {
    let quota = limits.iter().map(|l| l.max_cost()).min().unwrap();
    for (limit, state) in limits.iter().zip(peek(backend, limits, key).await) {
        assert_eq!(state.limit, limit.max_cost(), "{}", limit.name());
        assert_eq!(state.remaining, limit.max_cost(), "{}", limit.name());
        assert_eq!(state.retry_after, None, "{}", limit.name());
        assert_eq!(state.banned, None);
        assert!(!state.is_limited());
    }
    for _ in 0..25 {
        peek(backend, limits, key).await;
    }
    for i in 0..quota {
        assert!(
            admitted(backend, limits, key).await,
            "request {i} of {quota}"
        );
        let states = peek(backend, limits, key).await;
        let remaining = states.iter().map(|s| s.remaining).min().unwrap();
        assert_eq!(remaining, quota - i - 1, "after request {i}");
    }
    assert!(!admitted(backend, limits, key).await, "over the quota");
    let states = peek(backend, limits, key).await;
    let tight = states
        .iter()
        .find(|s| s.remaining == 0)
        .expect("a limit is spent");
    assert!(tight.retry_after.is_some(), "{tight:?}");
    assert!(tight.is_limited());
    // Peeking at a limited key does not change it either (the server's clock moves on meanwhile).
    let again = peek(backend, limits, key).await;
    let counts = |s: &[KeyState]| s.iter().map(|s| (s.limit, s.remaining)).collect::<Vec<_>>();
    assert_eq!(counts(&again), counts(&states));
    assert!(again
        .iter()
        .zip(&states)
        .all(|(a, b)| a.reset_after <= b.reset_after));

    backend.reset_all(limits, key).await.unwrap();
    for (limit, state) in limits.iter().zip(peek(backend, limits, key).await) {
        assert_eq!(
            state.remaining,
            limit.max_cost(),
            "{} after reset",
            limit.name()
        );
        assert_eq!(state.retry_after, None);
    }
    for i in 0..quota {
        assert!(
            admitted(backend, limits, key).await,
            "request {i} after reset"
        );
    }
    assert!(!admitted(backend, limits, key).await);
}

/// Windows of a day (aligned on UTC midnight on the server's clock), so that none turns over during
/// a test.
fn every_algorithm() -> Vec<Vec<Limit>> {
    let one = |name: &str, algorithm| {
        vec![Limit::with_algorithm(name, algorithm, Quota::per_day(5)).unwrap()]
    };
    vec![
        one("gcra", Algorithm::Gcra),
        one("log", Algorithm::SlidingLog),
        one("fixed", Algorithm::FixedWindow),
        one("sliding", Algorithm::SlidingWindow),
        one("conc", Algorithm::Concurrency),
        vec![
            Limit::new("stack.1m", Quota::per_minute(4)).unwrap(),
            Limit::with_algorithm("stack.1d", Algorithm::FixedWindow, Quota::per_day(6)).unwrap(),
        ],
        vec![
            Limit::with_algorithm("stack2.1h", Algorithm::SlidingLog, Quota::per_hour(7)).unwrap(),
            Limit::new("stack2.1m", Quota::per_minute(3)).unwrap(),
        ],
    ]
}

async fn every_algorithm_on(backend: &RedisBackend) {
    for limits in every_algorithm() {
        for key in [
            Key::from("alice"),
            Key::from_ip("192.0.2.7".parse().unwrap()),
        ] {
            peek_then_reset(backend, &limits, &key).await;
        }
    }
}

#[tokio::test]
async fn lua_peek_consumes_nothing_and_reset_restores_the_quota_for_every_algorithm() {
    let server = RedisServer::start();
    let backend = connect(&server.url(), RedisMode::Lua).await;
    every_algorithm_on(&backend).await;
}

#[tokio::test]
async fn cell_peek_reads_the_state_cl_throttle_writes() {
    let server = RedisServer::start_with_cell();
    let backend = connect(&server.url(), RedisMode::Cell).await;
    // The GCRA limit alone runs on CL.THROTTLE here; the peek reads its key.
    every_algorithm_on(&backend).await;
}

#[tokio::test]
async fn cluster_peek_and_reset_route_to_the_key_slot() {
    let cluster = RedisCluster::start();
    let backend = RedisBackend::builder()
        .cluster_urls(cluster.urls())
        .mode(RedisMode::Lua)
        .timeout(Duration::from_secs(2))
        .connect()
        .await
        .unwrap();
    every_algorithm_on(&backend).await;
}

#[tokio::test]
async fn a_peek_writes_nothing() {
    let server = RedisServer::start();
    let backend = connect(&server.url(), RedisMode::Lua).await;
    let key = Key::from("k");
    for limits in every_algorithm() {
        peek(&backend, &limits, &key).await;
    }
    assert_eq!(
        server.cli(&["DBSIZE"]).trim(),
        "0",
        "peeks at unknown keys store nothing"
    );
    let gcra = &every_algorithm()[0];
    assert!(admitted(&backend, gcra, &key).await);
    let redis_key = backend.state_key(&gcra[0], &key);
    let before = server.cli(&["GET", &redis_key]);
    for _ in 0..5 {
        assert_eq!(peek(&backend, gcra, &key).await[0].remaining, 4);
    }
    assert_eq!(
        server.cli(&["GET", &redis_key]),
        before,
        "the TAT is untouched"
    );
}

#[tokio::test]
async fn reset_lifts_a_ban_in_redis_and_in_the_deny_cache() {
    let server = RedisServer::start();
    let backend = connect(&server.url(), RedisMode::Lua).await;
    let penalty = Penalty::new(1, Duration::from_secs(60), Duration::from_secs(600)).unwrap();
    let stacks = [
        vec![Limit::new("ban-gcra", Quota::per_day(2))
            .unwrap()
            .with_penalty(penalty)],
        vec![
            Limit::with_algorithm("ban-fixed", Algorithm::FixedWindow, Quota::per_day(2))
                .unwrap()
                .with_penalty(penalty),
        ],
    ];
    let key = Key::from("mallory");
    for limits in &stacks {
        assert!(admitted(&backend, limits, &key).await);
        assert!(admitted(&backend, limits, &key).await);
        // The rejection is the first strike, and `after` is 1: banned.
        let decision = backend.check_one(&limits[0], &key, 1).await.unwrap();
        assert!(decision.banned, "{decision:?}");
        let state = peek(&backend, limits, &key).await[0];
        let ban = state.banned.expect("banned");
        assert!(
            ban > Duration::from_secs(590) && ban <= Duration::from_secs(600),
            "{ban:?}"
        );
        assert_eq!(state.remaining, 0);
        assert!(state.retry_after.unwrap() >= ban);
        // Answered from the deny cache now, which a reset must clear too.
        assert!(backend.check_one(&limits[0], &key, 1).await.unwrap().banned);

        backend.reset_all(limits, &key).await.unwrap();
        let state = peek(&backend, limits, &key).await[0];
        assert_eq!(
            (state.banned, state.remaining, state.retry_after),
            (None, 2, None)
        );
        assert!(
            admitted(&backend, limits, &key).await,
            "admitted after the reset"
        );
    }
}
