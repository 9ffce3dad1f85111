//! `WindowStart::PerKey` on Redis: the scripts put each key's fixed window where the memory backend
//! does (the shift is computed in Rust and sent with the call), alone and coalesced, on a single
//! server and on a Cluster; refunds land in the key's own window.

use std::collections::BTreeSet;
use std::time::Duration;

use tower_throttle::redis::{RedisBackend, RedisMode};
use tower_throttle::window::WindowStart;
use tower_throttle::{Algorithm, Backend, Key, Limit, MemoryBackend, Quota};

use crate::support::asks::Asks;
use crate::support::redis::{RedisCluster, RedisServer};

const PERIOD: Duration = Duration::from_secs(60);

fn per_key(name: &str) -> Limit {
    Limit::with_algorithm(name, Algorithm::FixedWindow, Quota::per_period(3, PERIOD))
        .unwrap()
        .with_window_start(WindowStart::PerKey)
        .unwrap()
}

/// The wait of `key`'s refusal once its quota is spent on `backend`.
async fn wait_of<B: Backend>(backend: &B, limit: &Limit, key: &Key) -> Duration {
    for _ in 0..3 {
        assert!(
            backend.check_one(limit, key, 1).await.unwrap().allowed,
            "{key}"
        );
    }
    let refused = backend.check_one(limit, key, 1).await.unwrap();
    assert!(!refused.allowed, "{key}");
    refused.retry_after.unwrap()
}

/// 40 keys on `redis` and in memory: each refusal waits for the same boundary (within the two
/// clocks' skew and the calls' time), the boundaries spread over the period, and a refund gives one
/// unit back on both.
async fn agrees_with_memory(redis: RedisBackend, name: &str) {
    let memory = MemoryBackend::new();
    let limit = per_key(name);
    let mut seconds = BTreeSet::new();
    let mut compared = 0;
    for i in 0..40 {
        let key = Key::from(format!("user-{i}"));
        let in_memory = wait_of(&memory, &limit, &key).await;
        // A boundary within the next seconds could fall between the two backends' calls.
        if in_memory < Duration::from_secs(2) || in_memory > PERIOD - Duration::from_secs(2) {
            continue;
        }
        let on_redis = wait_of(&redis, &limit, &key).await;
        let skew = in_memory.abs_diff(on_redis);
        assert!(
            skew < Duration::from_millis(250),
            "{key}: {in_memory:?} in memory, {on_redis:?} on Redis"
        );
        seconds.insert(on_redis.as_secs());
        // Given back in the key's window: one more passes, on both.
        memory.refund(std::slice::from_ref(&limit), &key, 1, Duration::ZERO);
        redis.refund(std::slice::from_ref(&limit), &key, 1, Duration::ZERO);
        assert!(memory.check_one(&limit, &key, 1).await.unwrap().allowed);
        let mut allowed = false;
        // The refund is sent in the background: give it a moment.
        for _ in 0..100 {
            let state = redis
                .peek_all(std::slice::from_ref(&limit), &key)
                .await
                .unwrap();
            if state[0].remaining > 0 {
                allowed = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(
            allowed,
            "{key}: the refund did not land in its window on Redis"
        );
        assert!(
            redis.check_one(&limit, &key, 1).await.unwrap().allowed,
            "{key}"
        );
        compared += 1;
    }
    assert!(compared >= 30, "only {compared} keys compared");
    assert!(
        seconds.len() >= 15,
        "the boundaries do not spread: {seconds:?}"
    );
}

#[tokio::test]
async fn per_key_windows_on_redis_fall_where_memory_puts_them() {
    let server = RedisServer::start();
    for (coalesce, name) in [(true, "fixed-coalesced"), (false, "fixed-alone")] {
        let redis = RedisBackend::builder()
            .url(server.url())
            .mode(RedisMode::Lua)
            .coalesce(coalesce)
            .timeout(Duration::from_secs(2))
            .connect()
            .await
            .unwrap();
        agrees_with_memory(redis, name).await;
    }
}

#[tokio::test]
async fn per_key_windows_on_a_cluster_fall_where_memory_puts_them() {
    let cluster = RedisCluster::start();
    let redis = RedisBackend::builder()
        .cluster_urls(cluster.urls())
        .mode(RedisMode::Lua)
        .timeout(Duration::from_secs(2))
        .connect()
        .await
        .unwrap();
    agrees_with_memory(redis, "fixed-cluster").await;
}
