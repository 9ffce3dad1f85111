//! A Cluster primary killed under load (3 primaries + 3 replicas, `cluster-node-timeout` 1000 ms):
//! keys on the other primaries keep their latency (nothing shared stalls them: there is no circuit
//! breaker on a Cluster), keys on the dead primary's slots fail within the timeout, and come back
//! once its replica is promoted.
//!
//! `cargo test --all-features --test redis -- cluster_failover --nocapture` prints the figures.

use crate::support::cluster::{is_primary, key_on, replica_of, wait_for_replicas, LogLines, Tally};
use crate::support::redis as redis_support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis_support::RedisCluster;
use tokio::task::spawn_blocking;
use tower_throttle::key::Key;
use tower_throttle::{Backend, Limit, Quota, RedisBackend, RedisMode};
use tracing::Level;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

/// The backend's default timeout: what a request waits at most for Redis.
const TIMEOUT: Duration = RedisBackend::DEFAULT_TIMEOUT;
/// How long a failover may take to be noticed, voted and announced with a 1000 ms node timeout.
const FAILOVER_WITHIN: Duration = Duration::from_secs(15);

#[tokio::test(flavor = "current_thread")]
async fn a_killed_primary_fails_only_its_slots_and_they_recover_after_promotion() {
    let logs = LogLines::default();
    let _logging = tracing_subscriber::registry()
        .with(logs.clone())
        .set_default();
    let mut cluster = RedisCluster::start_with_replicas();
    for node in cluster.nodes() {
        node.cli(&["CONFIG", "SET", "cluster-node-timeout", "1000"]);
        // Otherwise every node refuses every key (CLUSTERDOWN) while one slot has no primary.
        node.cli(&["CONFIG", "SET", "cluster-require-full-coverage", "no"]);
    }
    wait_for_replicas(&cluster);
    let backend = RedisBackend::builder()
        .cluster_urls(cluster.urls())
        .mode(RedisMode::Lua)
        .timeout(TIMEOUT)
        .deny_cache(false)
        .connect()
        .await
        .unwrap();
    // Never limited: every decision is Redis's answer, or a failure.
    let limit = Limit::new("failover", Quota::per_second(1_000_000)).unwrap();
    let redis_key = |k: &str| backend.redis_key("failover", &Key::from(k));
    let (victim, others) = (0, [1, 2]);
    let victim_key = key_on(&cluster, victim, "victim", redis_key);
    let other_keys: Vec<String> = others
        .iter()
        .map(|&n| key_on(&cluster, n, &format!("other{n}"), redis_key))
        .collect();
    let replica = replica_of(&cluster, victim);
    let replica_port = cluster.nodes()[replica].port();

    let halt = Arc::new(AtomicBool::new(false));
    let (victim_tally, other_tally) = (Tally::new(), Tally::new());
    let mut workers = Vec::new();
    for (key, tally) in std::iter::once((&victim_key, &victim_tally))
        .chain(other_keys.iter().map(|k| (k, &other_tally)))
    {
        for _ in 0..4 {
            let (backend, limit, key, tally, halt) = (
                backend.clone(),
                limit.clone(),
                Key::from(key.as_str()),
                tally.clone(),
                halt.clone(),
            );
            workers.push(tokio::spawn(async move {
                while !halt.load(Ordering::Relaxed) {
                    let sent = Instant::now();
                    let outcome = backend.check(&limit, &key, 1).await.map(|d| d.allowed);
                    tally.record(outcome, sent.elapsed());
                    // A failure comes back at once: pace the retries as clients would.
                    if sent.elapsed() < Duration::from_millis(1) {
                        tokio::time::sleep(Duration::from_millis(1)).await;
                    }
                }
            }));
        }
    }

    tokio::time::sleep(Duration::from_millis(500)).await;
    println!("before the kill (500 ms):\n  dead primary's key: {victim_tally}\n  other primaries' keys: {other_tally}");
    assert_eq!(victim_tally.failed() + other_tally.failed(), 0);
    victim_tally.reset();
    other_tally.reset();
    let log_mark = (logs.at_least(Level::INFO), logs.quiet_filter());

    let killed = Instant::now();
    cluster.nodes_mut()[victim].kill();
    let promoted = loop {
        if spawn_blocking(move || is_primary(replica_port))
            .await
            .unwrap()
        {
            break killed.elapsed();
        }
        assert!(
            killed.elapsed() < FAILOVER_WITHIN,
            "the replica (node {replica}) was not promoted:\n{}\n{}",
            cluster.nodes()[others[0]].cli(&["CLUSTER", "NODES"]),
            cluster.nodes()[replica].log()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    // Until the failures stop (or 5 s), then one more second of load.
    let settle = Instant::now();
    while victim_tally
        .last_failure()
        .is_some_and(|t| t.elapsed() < Duration::from_millis(500))
        && settle.elapsed() < Duration::from_secs(5)
    {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let succeeded_before = victim_tally.allowed();
    tokio::time::sleep(Duration::from_secs(1)).await;
    halt.store(true, Ordering::Relaxed);
    for worker in workers {
        worker.await.unwrap();
    }
    let span = killed.elapsed();
    let recovered = victim_tally
        .last_failure()
        .map(|t| t.duration_since(killed))
        .unwrap_or_default();
    let info_lines = logs.at_least(Level::INFO) - log_mark.0;
    let quiet_lines = logs.quiet_filter() - log_mark.1;

    println!("primary killed; replica promoted (ROLE master) after {promoted:?}; last failure of its keys {recovered:?} after the kill; {span:?} of load after the kill:");
    println!("  dead primary's key: {victim_tally}");
    println!("  other primaries' keys: {other_tally}");
    let per_second = |n: u64| n as f64 / span.as_secs_f64();
    println!(
        "  log lines since the kill: {info_lines} at INFO or above ({:.1}/s), {quiet_lines} through \
         `info,redis=error` ({:.1}/s); by level and target over the run: {:?}",
        per_second(info_lines),
        per_second(quiet_lines),
        logs.by_target()
    );

    assert_eq!(other_tally.failed(), 0, "{other_tally}");
    // Their latency: what it was (a few ms on a loaded test machine), never the failover's.
    assert!(
        other_tally.max_latency() < TIMEOUT,
        "other primaries stalled: {other_tally}"
    );
    // Every decision on the dead slots is answered (a failure) within the timeout...
    assert!(
        victim_tally.max_latency() < TIMEOUT + Duration::from_millis(50),
        "{victim_tally}"
    );
    // ...and they recover once the replica is promoted.
    assert!(
        recovered < promoted + Duration::from_secs(2),
        "recovered {recovered:?} after the kill, promoted after {promoted:?}"
    );
    assert!(
        victim_tally.allowed() > succeeded_before,
        "no decision after recovery"
    );
    // redis-rs warns at each slot refresh, and refreshes at each MOVED: while the primary is
    // down, about one per request on its slots. The example server's filter keeps its errors only.
    assert!(
        quiet_lines <= 5,
        "log lines during the failover: {:?}",
        logs.by_target()
    );
}
