//! `limits.lua` coalesced (src/backend/redis/speedup/batch.rs, limits_batch.lua): concurrent checks of every
//! other algorithm than the GCRA, and stacks, share script calls and still admit exactly the limit,
//! with the decisions the memory backend makes, on one server and on a Cluster; the batch script
//! decides every item as `limits.lua` decides it alone and leaves the same state
//! (limits_batch_parity.rs). (`limits.lua` alone against `window.rs` and `gcra.rs`: algorithms.rs.)

use crate::support::redis as redis_support;

use std::sync::Arc;
use std::time::Duration;

use redis_support::{RedisCluster, RedisServer};
use tower_throttle::{
    redis::{RedisBackend, RedisBackendBuilder, RedisMode},
    Algorithm, Backend, Decision, Key, Limit, MemoryBackend, Quota,
};

use crate::algorithms::within_one_window;
use crate::backend::calls;
use crate::batch::evalsha_calls;
use crate::support::asks::Asks;

const CHECKS: usize = 200;
const QUOTA: u64 = 50;

/// What the flood runs: one limit of each algorithm but the GCRA, and a stack.
fn cases(prefix: &str) -> Vec<(String, Vec<Limit>)> {
    let hourly = |name: String, algorithm| {
        Limit::with_algorithm(name, algorithm, Quota::per_hour(QUOTA)).unwrap()
    };
    let mut cases: Vec<(String, Vec<Limit>)> = [
        Algorithm::SlidingLog,
        Algorithm::FixedWindow,
        Algorithm::SlidingWindow,
        Algorithm::Concurrency,
    ]
    .into_iter()
    .map(|a| {
        let name = format!("{prefix}-{a}");
        (name.clone(), vec![hourly(name, a)])
    })
    .collect();
    let stack = format!("{prefix}-stack");
    cases.push((
        stack.clone(),
        vec![
            Limit::new(format!("{stack}-gcra"), Quota::per_hour(QUOTA + 30)).unwrap(),
            hourly(format!("{stack}-log"), Algorithm::SlidingLog),
            hourly(format!("{stack}-fixed"), Algorithm::FixedWindow),
            Limit::with_algorithm(
                format!("{stack}-sliding"),
                Algorithm::SlidingWindow,
                Quota::per_hour(QUOTA + 10),
            )
            .unwrap(),
        ],
    ));
    cases
}

/// One check of one unit: `check` for one limit, `check_all` for a stack; the decision that binds
/// (a stack's combined one) as `(allowed, remaining)`.
async fn one<B: Backend>(backend: &B, limits: &[Limit], key: &Key) -> (bool, u64) {
    let decision = if let [limit] = limits {
        backend.check_one(limit, key, 1).await.unwrap()
    } else {
        let decisions = backend.check_all(limits, key, 1).await.unwrap();
        Decision::combine(&decisions).unwrap()
    };
    (decision.allowed, decision.remaining)
}

/// `CHECKS` checks on one key, all at once; each decision's `(allowed, remaining)`, sorted.
async fn flood(backend: &RedisBackend, limits: &[Limit], key: &str) -> Vec<(bool, u64)> {
    let limits = Arc::new(limits.to_vec());
    let key = Key::from(key);
    let tasks: Vec<_> = (0..CHECKS)
        .map(|_| {
            let (backend, limits, key) = (backend.clone(), limits.clone(), key.clone());
            tokio::spawn(async move { one(&backend, &limits, &key).await })
        })
        .collect();
    let mut decisions = Vec::new();
    for task in tasks {
        decisions.push(task.await.unwrap());
    }
    decisions.sort_unstable();
    decisions
}

/// The same checks one after the other on the memory backend: the decisions a limiter that decides
/// one check at a time makes.
async fn on_memory(limits: &[Limit], key: &str) -> Vec<(bool, u64)> {
    let memory = MemoryBackend::new();
    let key = Key::from(key);
    let mut decisions = Vec::new();
    for _ in 0..CHECKS {
        decisions.push(one(&memory, limits, &key).await);
    }
    decisions.sort_unstable();
    decisions
}

/// Every case: exactly the limit admitted, each admitted check with its own `remaining` (49 down
/// to 0: each saw the state the one before it left), the same decisions as the memory backend's,
/// in fewer script calls than checks (coalesced).
async fn every_case_through_batches(
    backend: &RedisBackend,
    prefix: &str,
    evalsha: impl Fn() -> u64,
    zcard: impl Fn(&str) -> u64,
) {
    for (name, limits) in cases(prefix) {
        let before = evalsha();
        let got = flood(backend, &limits, &format!("{name}-key")).await;
        let calls = evalsha() - before;
        let admitted = got.iter().filter(|(allowed, _)| *allowed).count();
        assert_eq!(admitted, QUOTA as usize, "{name}: {admitted} admitted");
        let remaining: Vec<u64> = got.iter().filter(|d| d.0).map(|d| d.1).collect();
        assert_eq!(remaining, (0..QUOTA).collect::<Vec<_>>(), "{name}");
        assert_eq!(
            got,
            on_memory(&limits, &name).await,
            "{name}: against memory"
        );
        assert!(
            calls < (CHECKS / 2) as u64,
            "{name}: {CHECKS} concurrent checks took {calls} script calls: not coalesced"
        );
        // A concurrency slot per admitted check, each under its own token, no more.
        if limits[0].concurrency().is_some() {
            let state = backend.state_key(&limits[0], &Key::from(format!("{name}-key")));
            assert_eq!(zcard(&state), QUOTA, "{name}");
        }
    }
}

/// The backend of `builder` in Lua mode without the deny cache (every check reaches Redis), once
/// the server at `url` is at least 30 s from an hour's boundary (the floods run in one window).
async fn on_lua(builder: RedisBackendBuilder, url: &str) -> RedisBackend {
    let backend = builder
        .mode(RedisMode::Lua)
        .deny_cache(false)
        .timeout(Duration::from_secs(2))
        .connect()
        .await
        .unwrap();
    within_one_window(url, Duration::from_secs(3600), Duration::from_secs(30)).await;
    backend
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_checks_of_every_algorithm_share_calls_and_admit_exactly_the_limit() {
    let server = RedisServer::start();
    let backend = on_lua(RedisBackend::builder().url(server.url()), &server.url()).await;
    let zcard = |key: &str| server.cli(&["ZCARD", key]).parse().unwrap();
    every_case_through_batches(&backend, "batched", || evalsha_calls(&server), zcard).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_checks_of_every_algorithm_on_a_cluster_admit_exactly_the_limit() {
    let cluster = RedisCluster::start();
    let builder = RedisBackend::builder().cluster_urls(cluster.urls());
    let backend = on_lua(builder, &cluster.urls()[0]).await;
    let evalsha = || cluster.nodes().iter().map(evalsha_calls).sum::<u64>();
    // The node that owns the key answers; the others redirect (an error here).
    let zcard = |key: &str| {
        cluster
            .nodes()
            .iter()
            .filter_map(|n| n.cli_result(&["ZCARD", key]).ok()?.parse::<u64>().ok())
            .sum()
    };
    every_case_through_batches(&backend, "batched-cluster", evalsha, zcard).await;
}

/// `CHECKS` GCRA checks at once on one key, quota `QUOTA`: exactly the quota admitted. Returns the
/// script calls and `CL.THROTTLE` calls they took.
async fn flood_gcra(server: &RedisServer, backend: RedisBackend, name: &str) -> (u64, u64) {
    let limit = Limit::new(name, Quota::per_hour(QUOTA)).unwrap();
    let (evals, cells) = (evalsha_calls(server), calls(server, "cl.throttle"));
    let got = flood(&backend, &[limit], name).await;
    let admitted = got.iter().filter(|(allowed, _)| *allowed).count();
    assert_eq!(admitted, QUOTA as usize, "{name}");
    (
        evalsha_calls(server) - evals,
        calls(server, "cl.throttle") - cells,
    )
}

/// `Auto`'s rule where the module is loaded: the coalesced Lua path (fewer script calls than checks,
/// no `CL.THROTTLE`), exactly the limit; `Cell` still forces `CL.THROTTLE`; `Auto` without
/// coalescing takes `CL.THROTTLE`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_with_the_module_loaded_takes_the_coalesced_lua_path() {
    let server = RedisServer::start_with_cell();
    let connect = |mode: RedisMode, coalesce: bool| {
        RedisBackend::builder()
            .url(server.url())
            .mode(mode)
            .coalesce(coalesce)
            .deny_cache(false)
            .timeout(Duration::from_secs(2))
            .connect()
    };
    let auto = connect(RedisMode::Auto, true).await.unwrap();
    assert_eq!(auto.active_path(), Some(RedisMode::Lua));
    let (evals, cells) = flood_gcra(&server, auto, "auto").await;
    assert_eq!(cells, 0, "auto: no CL.THROTTLE");
    assert!(evals < (CHECKS / 2) as u64, "auto: {evals} script calls");

    let cell = connect(RedisMode::Cell, true).await.unwrap();
    assert_eq!(cell.active_path(), Some(RedisMode::Cell));
    let (evals, cells) = flood_gcra(&server, cell, "cell").await;
    assert_eq!(
        (evals, cells),
        (0, CHECKS as u64),
        "cell: one CL.THROTTLE a check"
    );

    let alone = connect(RedisMode::Auto, false).await.unwrap();
    assert_eq!(alone.active_path(), Some(RedisMode::Cell));
    let (evals, cells) = flood_gcra(&server, alone, "auto-alone").await;
    assert_eq!((evals, cells), (0, CHECKS as u64), "auto, not coalesced");
}

/// On a Cluster, checks of keys in different slots that wait at the same time are batched by their
/// first key's slot, never together (one script call must not span slots): every case's flood at
/// once, and each case admits exactly its limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn floods_of_keys_in_different_slots_at_once_on_a_cluster_each_admit_their_limit() {
    let cluster = RedisCluster::start();
    let builder = RedisBackend::builder().cluster_urls(cluster.urls());
    let backend = on_lua(builder, &cluster.urls()[0]).await;
    let floods: Vec<_> = cases("slots")
        .into_iter()
        .map(|(name, limits)| {
            let backend = backend.clone();
            tokio::spawn(async move {
                let got = flood(&backend, &limits, &format!("{name}-key")).await;
                (name, got)
            })
        })
        .collect();
    for flood in floods {
        let (name, got) = flood.await.unwrap();
        let admitted = got.iter().filter(|(allowed, _)| *allowed).count();
        assert_eq!(admitted, QUOTA as usize, "{name}: {admitted} admitted");
    }
}
