//! A stack whose slot migrates with its keys split between the two nodes: Redis Cluster answers
//! `TRYAGAIN` until the slot has moved, and the backend retries until its timeout. The decision
//! fails (the failure policy answers it), but the node answered every try: it is alive, and its
//! breaker must stay closed, so the other keys it holds keep their decisions from Redis. (Before,
//! the timeout opened the node's breaker as if the node were dead: every key of a third of the
//! Cluster failed fast for 50 ms or more, with a warning that the node was unreachable.)

use crate::support::cluster::{key_on, key_slot, owner, LogLines, Migration};
use crate::support::redis::RedisCluster;

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::support::asks::Asks;
use tokio::task::spawn_blocking;
use tower_throttle::key::Key;
use tower_throttle::{
    redis::{CircuitState, RedisBackend, RedisMode},
    Algorithm, Limit, Quota,
};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

/// Short, so that the stack's retries run out while the slot still migrates.
const TIMEOUT: Duration = Duration::from_millis(300);

/// A Lua backend on `cluster`, every decision from Redis (no cached refusal).
async fn lua_backend(cluster: &RedisCluster) -> RedisBackend {
    RedisBackend::builder()
        .cluster_urls(cluster.urls())
        .mode(RedisMode::Lua)
        .timeout(TIMEOUT)
        .deny_cache(false)
        .connect()
        .await
        .unwrap()
}

// One thread: the subscriber that counts log lines is this thread's, and every task runs here.
#[tokio::test(flavor = "current_thread")]
async fn a_timeout_while_the_slot_migrates_leaves_the_nodes_breaker_closed() {
    let logs = LogLines::default();
    let _logging = tracing_subscriber::registry()
        .with(logs.clone())
        .set_default();
    let cluster = Arc::new(RedisCluster::start());
    let backend = lua_backend(&cluster).await;
    let stack = vec![
        Limit::with_algorithm("tlog", Algorithm::SlidingLog, Quota::per_hour(50)).unwrap(),
        // Slow enough that its key outlives the test (a GCRA key expires once refilled).
        Limit::new("tgcra", Quota::per_day(100)).unwrap(),
    ];
    let key = Key::from("mig");
    // Both of the stack's keys exist, on the slot's owner.
    assert!(backend.check_all(&stack, &key, 1).await.unwrap()[0].allowed);
    let c = cluster.clone();
    let (migration, keys, from) = spawn_blocking(move || {
        let slot = key_slot(&c, "{mig}");
        let from = owner(&c, slot);
        let migration = Migration::begin(&c, slot, (from + 1) % 3);
        let keys = migration.keys_left(&c);
        // One key moves: the stack's keys are split, and both nodes answer TRYAGAIN.
        migration.move_keys(&c, &keys[..1]);
        (migration, keys, from)
    })
    .await
    .unwrap();
    assert_eq!(keys.len(), 2, "the stack's keys: {keys:?}");
    let c = cluster.clone();
    let cold_key =
        spawn_blocking(move || key_on(&c, from, "cold", |k| format!("throttle:cold:{{{k}}}")))
            .await
            .unwrap();
    let cold = Limit::new("cold", Quota::per_second(1_000)).unwrap();
    let warnings = logs.at_least(tracing::Level::WARN);

    let started = Instant::now();
    let failed = backend.check_all(&stack, &key, 1).await;
    assert!(failed.is_err(), "the split stack was decided: {failed:?}");
    assert!(
        started.elapsed() < TIMEOUT * 3,
        "the stack took {:?}",
        started.elapsed()
    );
    // The node answered TRYAGAIN all along: alive, its breaker closed, its other keys decided.
    let health = backend.health();
    let node = health
        .nodes
        .iter()
        .find(|n| {
            n.address
                .ends_with(&format!(":{}", cluster.nodes()[from].port()))
        })
        .expect("the source node is in the slot map");
    assert_eq!(node.state, CircuitState::Closed, "{node:?}");
    let decided = backend
        .check_one(&cold, &Key::from(cold_key.as_str()), 1)
        .await;
    assert!(
        decided.is_ok_and(|d| d.allowed),
        "a key of the live node failed"
    );
    assert_eq!(
        logs.at_least(tracing::Level::WARN),
        warnings,
        "warnings: {:?}",
        logs.by_target()
    );

    // Once the slot has moved, the stack is decided again.
    let c = cluster.clone();
    spawn_blocking(move || {
        migration.move_keys(&c, &keys[1..]);
        migration.finish(&c);
    })
    .await
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while backend.check_all(&stack, &key, 1).await.is_err() {
        assert!(Instant::now() < deadline, "the stack failed after the move");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A decision on a sorted set (a sliding log, leases) adds its members before it removes the old
/// ones. Removed first, the key would be gone for a moment: a node whose slot is migrating then
/// refuses the rest of the script the key (Redis would ask for it on the target), after part of
/// it was written. A set whose members have all ended while the key lives on (a period of an hour
/// made a second, a lease of a minute made a second: the key keeps its old expiry) meets that on
/// its next decision, and a stack whose other limit was written first would be charged twice if
/// the decision were sent again.
#[tokio::test]
async fn a_sorted_set_whose_members_all_ended_is_decided_while_its_slot_migrates() {
    let cluster = Arc::new(RedisCluster::start());
    let backend = lua_backend(&cluster).await;
    let gcra = Limit::new("egcra", Quota::per_day(100)).unwrap();
    let log = Limit::with_algorithm("elog", Algorithm::SlidingLog, Quota::per_second(5)).unwrap();
    let leases =
        Limit::with_algorithm("eleases", Algorithm::Concurrency, Quota::per_second(5)).unwrap();
    // The GCRA is written before the log: a log that failed after it would leave it charged.
    let stack = vec![gcra.clone(), log.clone()];
    let key = Key::from("ended");
    assert!(backend.check_all(&stack, &key, 1).await.unwrap()[0].allowed);
    let sets = [
        backend.state_key(&log, &key),
        backend.state_key(&leases, &key),
    ];
    let c = cluster.clone();
    let migration = spawn_blocking(move || {
        let slot = key_slot(&c, &sets[0]);
        let node = &c.nodes()[owner(&c, slot)];
        // Each set holds only an ended member (1 µs after the epoch), and lives on for an hour.
        for set in &sets {
            node.cli(&["DEL", set]);
            node.cli(&["ZADD", set, "1", "ended:0"]);
            node.cli(&["PEXPIRE", set, "3600000"]);
        }
        Migration::begin(&c, slot, (owner(&c, slot) + 1) % 3)
    })
    .await
    .unwrap();

    let decided = backend.check_all(&stack, &key, 1).await;
    let decided = decided.expect("the stack failed on the migrating node");
    assert!(decided.iter().all(|d| d.allowed), "{decided:?}");
    assert_eq!(
        decided[0].remaining,
        100 - 2,
        "the GCRA charged once a decision"
    );
    let lease = backend.check_one(&leases, &key, 1).await;
    assert!(
        lease.as_ref().is_ok_and(|d| d.allowed && d.remaining == 4),
        "the lease: {lease:?}"
    );
    let c = cluster.clone();
    spawn_blocking(move || migration.finish(&c)).await.unwrap();
}
