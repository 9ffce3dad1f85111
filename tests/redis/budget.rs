//! Leased budgets for hot keys: three backends (separate connections, as three processes) share one
//! limit and admit at most what the GCRA allows over a sustained window, and nearly all of it; a hot
//! key calls Redis rarely, a cold key per request; what cannot lease is refused.
//!
//! `cargo test --all-features --test redis -- budget --nocapture` prints the figures.

use crate::support::redis as redis_support;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::support::asks::Asks;
use redis_support::{RedisCluster, RedisServer};
use tower_throttle::key::Key;
use tower_throttle::{
    policy::{Budget, Penalty},
    redis::RedisBackend,
    Limit, Quota,
};

const TIMEOUT: Duration = Duration::from_millis(500);
/// The shared limit: 2,000 a second in bursts of 100.
const PER_SECOND: u64 = 2000;
const MAX_BURST: u64 = 99;
/// How long the three processes hammer the key.
const WINDOW: Duration = Duration::from_secs(3);
/// Concurrent requests per process.
const TASKS: usize = 4;

fn leased_limit() -> Limit {
    Limit::new(
        "shared",
        Quota::per_second(PER_SECOND).with_max_burst(MAX_BURST),
    )
    .unwrap()
    .with_budget(Budget::new().slice_ttl(Duration::from_millis(100)))
    .unwrap()
}

/// At most what the GCRA admits in `elapsed` from a full bucket: the burst, one, and the rate.
fn gcra_bound(elapsed: Duration) -> u64 {
    MAX_BURST + 1 + (PER_SECOND as f64 * elapsed.as_secs_f64()).ceil() as u64
}

/// Runs `TASKS` loops of checks on each backend for `WINDOW`; returns the admitted units per
/// backend and the time from before the first check to after the last answer.
async fn hammer(backends: Vec<RedisBackend>) -> (Vec<u64>, Duration) {
    let limit = leased_limit();
    let key = Key::from("hot-client");
    let stop = Arc::new(AtomicBool::new(false));
    let errors = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let mut handles = Vec::new();
    for backend in &backends {
        let admitted = Arc::new(AtomicU64::new(0));
        for _ in 0..TASKS {
            let (backend, limit, key) = (backend.clone(), limit.clone(), key.clone());
            let (stop, errors, admitted) = (stop.clone(), errors.clone(), admitted.clone());
            handles.push(tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    match backend.check_one(&limit, &key, 1).await {
                        Ok(d) if d.allowed => {
                            admitted.fetch_add(1, Ordering::Relaxed);
                        }
                        Ok(_) => tokio::task::yield_now().await,
                        Err(_) => {
                            errors.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
                admitted
            }));
        }
    }
    tokio::time::sleep(WINDOW).await;
    stop.store(true, Ordering::Relaxed);
    let mut per_backend = Vec::new();
    for (i, handle) in handles.into_iter().enumerate() {
        let admitted = handle.await.unwrap();
        if i % TASKS == 0 {
            per_backend.push(admitted.load(Ordering::Relaxed));
        }
    }
    let elapsed = start.elapsed();
    assert_eq!(errors.load(Ordering::Relaxed), 0, "no check may fail");
    (per_backend, elapsed)
}

fn judge(topology: &str, per_backend: &[u64], elapsed: Duration) {
    let total: u64 = per_backend.iter().sum();
    let bound = gcra_bound(elapsed);
    let share = total as f64 / bound as f64 * 100.0;
    println!(
        "{topology}: three processes admitted {total} ({per_backend:?}) of at most {bound} in \
         {elapsed:?}: {share:.1} %"
    );
    assert!(total <= bound, "{total} admitted, more than {bound}");
    // How much of the limit is used is a speed, not a correctness, figure: a slice that expires
    // while its process is starved of CPU is lost (by design: the limit is never exceeded), and
    // on a 2-core machine beside other builds the share fell to 83 %. BENCHMARKS.md gives the
    // share on a quiet machine (≥ 97.7 %); the test asserts only what no load can explain away:
    // most of the limit is used, so slices are credited and not wasted wholesale.
    assert!(share >= 50.0, "only {share:.1} % of the limit admitted");
    assert!(
        per_backend.iter().all(|&n| n > 0),
        "every process admits some"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_processes_share_a_leased_limit_exactly_on_one_server() {
    let server = RedisServer::start();
    let mut backends = Vec::new();
    for _ in 0..3 {
        backends.push(
            RedisBackend::builder()
                .url(server.url())
                .timeout(TIMEOUT)
                .connect()
                .await
                .unwrap(),
        );
    }
    let (per_backend, elapsed) = hammer(backends).await;
    judge("single server", &per_backend, elapsed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_processes_share_a_leased_limit_exactly_on_a_cluster() {
    let cluster = RedisCluster::start();
    let mut backends = Vec::new();
    for _ in 0..3 {
        backends.push(
            RedisBackend::builder()
                .cluster_urls(cluster.urls())
                .timeout(TIMEOUT)
                .connect()
                .await
                .unwrap(),
        );
    }
    let (per_backend, elapsed) = hammer(backends).await;
    judge("cluster", &per_backend, elapsed);
}

/// Script calls so far (`EVALSHA` and `EVAL`), from `INFO commandstats`.
fn script_calls(server: &RedisServer) -> u64 {
    server
        .cli(&["INFO", "commandstats"])
        .lines()
        .filter(|l| l.starts_with("cmdstat_evalsha:") || l.starts_with("cmdstat_eval:"))
        .filter_map(|l| {
            l.split([':', ','])
                .find_map(|f| f.strip_prefix("calls="))
                .and_then(|n| n.parse::<u64>().ok())
        })
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hot_key_calls_redis_rarely_and_a_cold_key_per_request() {
    let server = RedisServer::start();
    let redis = RedisBackend::builder()
        .url(server.url())
        .timeout(TIMEOUT)
        .connect()
        .await
        .unwrap();
    let limit = Limit::new("hot", Quota::per_second(1_000_000))
        .unwrap()
        .with_budget(Budget::new().hot_after(8).max_slice(500))
        .unwrap();

    // Cold: fewer decisions than `hot_after`, each one call.
    let before = script_calls(&server);
    for _ in 0..5 {
        assert!(
            redis
                .check_one(&limit, &Key::from("cold"), 1)
                .await
                .unwrap()
                .allowed
        );
    }
    assert_eq!(script_calls(&server) - before, 5);

    // Hot: slices of up to 500.
    let before = script_calls(&server);
    let requests = 5000;
    for _ in 0..requests {
        let decision = redis.check_one(&limit, &Key::from("hot"), 1).await.unwrap();
        assert!(decision.allowed);
        assert!(decision.remaining <= decision.limit);
    }
    let calls = script_calls(&server) - before;
    let per_request = calls as f64 / requests as f64;
    println!(
        "hot key: {calls} script calls for {requests} requests ({per_request:.4} per request)"
    );
    assert!(per_request <= 0.05, "{per_request} calls per request");
}

/// A backend on `server` whose timeout a loaded machine cannot reach: a fetch that times out after
/// Redis granted its units loses them, which would make the counts below fall short.
async fn patient(server: &RedisServer) -> RedisBackend {
    RedisBackend::builder()
        .url(server.url())
        .timeout(Duration::from_secs(5))
        .connect()
        .await
        .unwrap()
}

/// `name` with `quota`, leased in slices living `slice_ttl`, hot from its first unit.
fn hot_at_once(name: &str, quota: Quota, slice_ttl: Duration) -> Limit {
    let budget = Budget::new().hot_after(1).slice_ttl(slice_ttl);
    Limit::new(name, quota)
        .unwrap()
        .with_budget(budget)
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slice_never_outlives_what_redis_granted() {
    // 10 a minute: the slice can hold at most the 10 Redis grants, whatever is asked.
    let server = RedisServer::start();
    let redis = patient(&server).await;
    let limit = hot_at_once("tiny", Quota::per_minute(10), Duration::from_secs(10));
    let key = Key::from("k");
    // At least 300 checks, 1 ms apart: a slice refilled in the background lands between them, and
    // every unit Redis granted is admitted, within the 10 s lease; never one more. On a machine too
    // busy for the refills to land in those 300, the checks go on (up to 8 s) until 10 passed.
    let deadline = Instant::now() + Duration::from_secs(8);
    let (mut admitted, mut checks) = (0, 0);
    while checks < 300 || (admitted < 10 && Instant::now() < deadline) {
        if redis.check_one(&limit, &key, 1).await.unwrap().allowed {
            admitted += 1;
        }
        checks += 1;
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    assert_eq!(admitted, 10, "after {checks} checks");
    // Another process sees the budget spent.
    let other = RedisBackend::builder()
        .url(server.url())
        .timeout(TIMEOUT)
        .connect()
        .await
        .unwrap();
    assert!(!other.check_one(&limit, &key, 1).await.unwrap().allowed);
}

/// A request decided per request while its key's slice is on its way, refused because the grant
/// took the room, is not cached as a refusal that then refuses the units the slice holds.
#[tokio::test]
async fn a_refusal_made_while_a_slice_was_fetched_does_not_hide_the_slice() {
    let server = RedisServer::start();
    let redis = patient(&server).await;
    // 3 an hour, in one burst: the second fetch asks for 2 (the key's count so far), all that is
    // left after the first.
    let limit = hot_at_once("three", Quota::per_hour(3), Duration::from_secs(60));
    let key = Key::from("k");
    assert!(redis.check_one(&limit, &key, 1).await.unwrap().allowed);
    // A fetch of 2 (one for itself, one for the slice), and a check sent behind it while it is on
    // its way: per request, it finds the room taken.
    let (fetched, behind) = tokio::join!(
        redis.check_one(&limit, &key, 1),
        redis.check_one(&limit, &key, 1)
    );
    assert!(fetched.unwrap().allowed);
    assert!(!behind.unwrap().allowed);
    // The slice's unit: Redis granted it to this process.
    assert!(redis.check_one(&limit, &key, 1).await.unwrap().allowed);
    assert!(!redis.check_one(&limit, &key, 1).await.unwrap().allowed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_cannot_lease_is_refused() {
    let server = RedisServer::start();
    let redis = RedisBackend::builder()
        .url(server.url())
        .connect()
        .await
        .unwrap();
    let penalty = Penalty::new(3, Duration::from_secs(60), Duration::from_secs(60)).unwrap();
    // A penalty added after the budget: the backend refuses it.
    let banned = Limit::new("p", Quota::per_second(10))
        .unwrap()
        .with_budget(Budget::new())
        .unwrap()
        .with_penalty(penalty);
    assert!(redis.validate_one(&banned).is_err());
    let stack = [
        Limit::new("a", Quota::per_second(10))
            .unwrap()
            .with_budget(Budget::new())
            .unwrap(),
        Limit::new("b", Quota::per_day(1000)).unwrap(),
    ];
    assert!(redis.validate_all(&stack).is_err());
    assert!(Limit::new("d", Quota::per_second(10))
        .unwrap()
        .with_delay(Duration::from_secs(1))
        .unwrap()
        .with_budget(Budget::new())
        .is_err());
}

/// A reload that changes nothing keeps what the process holds of Redis's decisions (its cached
/// refusals, its leased slices): every policy's overrides and bans are read again after a reload,
/// and a table read as it was drops nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_that_changes_nothing_keeps_the_cached_refusals() {
    use axum::{routing::get, Router};
    use tower::ServiceExt;
    use tower_throttle::{key::Header, Policy, ThrottleLayer};
    let server = RedisServer::start();
    let backend = RedisBackend::builder()
        .url(server.url())
        .timeout(TIMEOUT)
        .connect()
        .await
        .unwrap();
    let policy = || {
        Policy::builder("api")
            .key(Header::new("x-user"))
            .quota(Quota::per_hour(1))
            .build()
            .unwrap()
    };
    let layer = ThrottleLayer::builder()
        .backend(backend)
        .policy(policy())
        .build()
        .unwrap();
    let handle = layer.handle();
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer);
    let status = || {
        let request = http::Request::get("/").header("x-user", "ann");
        let request = request.body(axum::body::Body::empty()).unwrap();
        let app = app.clone();
        async move { app.oneshot(request).await.unwrap().status().as_u16() }
    };
    assert_eq!(status().await, 200);
    assert_eq!(status().await, 429);
    let reads = || {
        let stats = server.cli(&["INFO", "commandstats"]);
        let line = stats.lines().find(|l| l.starts_with("cmdstat_hgetall:"));
        line.and_then(|l| l.split([':', ',']).find_map(|f| f.strip_prefix("calls=")))
            .and_then(|n| n.parse::<u64>().ok())
            .unwrap_or(0)
    };
    let (before, calls) = (reads(), script_calls(&server));
    handle.reload([policy()]).unwrap();
    // Its tables (overrides, bans) read again.
    let deadline = Instant::now() + Duration::from_secs(5);
    while reads() < before + 2 {
        assert!(Instant::now() < deadline, "the tables were not read again");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(status().await, 429);
    assert_eq!(script_calls(&server), calls, "the refusal was still cached");
}
