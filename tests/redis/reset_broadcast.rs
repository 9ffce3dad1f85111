//! A reset through one process is heard by every process sharing the Redis (three backends here,
//! each with its deny cache): each drops the key's cached rejection within 200 ms; a process whose
//! subscription was dropped (so it may have missed resets) drops its whole deny cache when it
//! subscribes again. Backends on Sentinel and on a user's connection manager (with
//! `listen_with`) hear them too, and a reload through one process makes the others forget what
//! they cached under the limits it changed.
//!
//! `cargo test --all-features --test redis -- reset_broadcast --nocapture` prints the figures.

use crate::support::redis as redis_support;

use std::time::{Duration, Instant};

use crate::support::asks::Asks;
use crate::support::failover::{Sentinels, SERVICE};
use crate::support::fault_proxy::FaultProxy;
use redis_support::{RedisCluster, RedisServer};
use tower_throttle::backend::Charges;
use tower_throttle::key::Key;
use tower_throttle::{
    redis::{RedisBackend, RedisMode},
    Limit, Policy, Quota, ThrottleLayer,
};

const HEARD_WITHIN: Duration = Duration::from_millis(200);

/// Three "processes" on `urls` (a server, or a Cluster's seed nodes).
async fn three(urls: &[String], cluster: bool) -> Vec<RedisBackend> {
    let mut backends = Vec::new();
    for _ in 0..3 {
        let builder = RedisBackend::builder().mode(RedisMode::Lua);
        let builder = if cluster {
            builder.cluster_urls(urls.to_vec())
        } else {
            builder.url(urls[0].clone())
        };
        backends.push(builder.connect().await.unwrap());
    }
    backends
}

/// Whether `backend` admits one unit of `key` now.
async fn admits(backend: &RedisBackend, limit: &Limit, key: &Key) -> bool {
    backend.check_one(limit, key, 1).await.unwrap().allowed
}

/// Limits `key` everywhere, proves the deny caches of the second and third hold it (the key deleted
/// behind their backs still refuses), resets it through the first, and returns how long each of
/// the other two took to admit it again.
async fn propagation(backends: &[RedisBackend], delete: impl Fn(&str)) -> Vec<Duration> {
    let limit = Limit::new("broadcast", Quota::per_hour(3)).unwrap();
    let key = Key::from("bob");
    cached_everywhere(backends, &limit, &key, delete).await;
    // The key was deleted already: the reset only has to reach the other processes.
    let started = Instant::now();
    backends[0]
        .reset_all(std::slice::from_ref(&limit), &key)
        .await
        .unwrap();
    admitted_again(backends, &limit, &key, started).await
}

/// Limits `key` under `limit` (slow: a rejection is cached for 20 minutes, far past the test) and
/// deletes it behind the backs of the second and third backend, whose deny caches still refuse it.
async fn cached_everywhere(
    backends: &[RedisBackend],
    limit: &Limit,
    key: &Key,
    delete: impl Fn(&str),
) {
    while admits(&backends[0], limit, key).await {}
    for backend in &backends[1..] {
        assert!(!admits(backend, limit, key).await);
    }
    delete(&backends[0].redis_key(limit.name(), key));
    for backend in &backends[1..] {
        assert!(
            !admits(backend, limit, key).await,
            "the deny cache did not answer (the test proves nothing)"
        );
    }
}

/// How long after `started` each of the second and third backend admitted `key` again.
async fn admitted_again(
    backends: &[RedisBackend],
    limit: &Limit,
    key: &Key,
    started: Instant,
) -> Vec<Duration> {
    let mut heard = Vec::new();
    for backend in &backends[1..] {
        while !admits(backend, limit, key).await {
            assert!(
                started.elapsed() < Duration::from_secs(5),
                "a process still refuses {:?} after the reset or reload",
                started.elapsed()
            );
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        heard.push(started.elapsed());
    }
    heard
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_is_heard_by_every_process_on_one_server() {
    let redis = RedisServer::start();
    let backends = three(&[redis.url()], false).await;
    // Subscriptions are made in the background: wait until all three listen.
    wait_for_subscribers(|| redis.cli(&["PUBSUB", "NUMSUB", "throttle:resets"]), 3).await;
    let heard = propagation(&backends, |k| {
        redis.cli(&["DEL", k]);
    })
    .await;
    println!("reset_broadcast (one server): heard by the other two processes after {heard:?}");
    assert!(heard.iter().all(|d| *d < HEARD_WITHIN), "{heard:?}");

    // A dropped subscription: the process may have missed resets, so it forgets its deny cache
    // when it subscribes again.
    let dropped = missed_reset(
        &backends[1],
        |k| {
            redis.cli(&["DEL", k]);
        },
        || {
            redis.cli(&["CLIENT", "KILL", "TYPE", "pubsub"]);
        },
    )
    .await;
    println!("reset_broadcast: deny cache dropped {dropped:?} after the subscription was killed");
}

/// A subscription whose connection goes silent without a word (a NAT's idle timeout, a
/// partition) is found out by its keep-alive ping and made again: the process hears resets again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscription_silenced_without_a_word_is_made_again() {
    let redis = RedisServer::start();
    let proxy = FaultProxy::start(redis.port(), 7);
    let mut backends = Vec::new();
    for url in [redis.url(), proxy.url()] {
        let builder = RedisBackend::builder().mode(RedisMode::Lua).url(url);
        backends.push(builder.connect().await.unwrap());
    }
    wait_for_subscribers(|| redis.cli(&["PUBSUB", "NUMSUB", "throttle:resets"]), 2).await;
    // Every connection of the proxied process is silenced for good; its requests' connection is
    // made again by its keeper, its subscription only if it finds the silence out.
    proxy.black_hole(true);
    tokio::time::sleep(Duration::from_millis(300)).await;
    proxy.black_hole(false);
    let limit = Limit::new("keep-alive", Quota::per_hour(3)).unwrap();
    let (key, started) = (Key::from("bob"), Instant::now());
    while backends[1].check_one(&limit, &key, 0).await.is_err() {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "no reconnection"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let delete = |k: &str| drop(redis.cli(&["DEL", k]));
    cached_everywhere(&backends, &limit, &key, delete).await;
    let reset = Instant::now();
    let limits = std::slice::from_ref(&limit);
    backends[0].reset_all(limits, &key).await.unwrap();
    while !admits(&backends[1], &limit, &key).await {
        assert!(
            reset.elapsed() < Duration::from_secs(15),
            "the reset was never heard"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    println!(
        "reset_broadcast: a silenced subscription heard again {:?} after the reset",
        reset.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_is_heard_by_every_process_on_a_cluster() {
    let cluster = RedisCluster::start();
    let backends = three(&cluster.urls(), true).await;
    // Sharded pub/sub: every listener subscribes on the node that owns the channel's slot.
    let shard_subscribers = || {
        let counts: Vec<String> = cluster
            .nodes()
            .iter()
            .map(|n| n.cli(&["PUBSUB", "SHARDNUMSUB", "throttle:resets"]))
            .collect();
        let total: usize = counts
            .iter()
            .filter_map(|c| c.lines().nth(1)?.trim().parse::<usize>().ok())
            .sum();
        format!("throttle:resets\n{total}")
    };
    wait_for_subscribers(shard_subscribers, 3).await;
    let node = &cluster.nodes()[0];
    let heard = propagation(&backends, |k| {
        node.cli(&["-c", "DEL", k]);
    })
    .await;
    println!("reset_broadcast (Cluster): heard by the other two processes after {heard:?}");
    assert!(heard.iter().all(|d| *d < HEARD_WITHIN), "{heard:?}");

    // A subscription killed: redis-rs subscribes again, and the process forgets its deny cache.
    let kill_listeners = || {
        let mut killed = 0;
        for node in cluster.nodes() {
            for client in node.cli(&["CLIENT", "LIST"]).lines() {
                if client.contains("cmd=ssubscribe") {
                    let id = client.split(' ').find_map(|f| f.strip_prefix("id="));
                    node.cli(&["CLIENT", "KILL", "ID", id.unwrap()]);
                    killed += 1;
                }
            }
        }
        assert_eq!(killed, 3, "the listeners' connections");
    };
    let delete = |k: &str| {
        node.cli(&["-c", "DEL", k]);
    };
    let dropped = missed_reset(&backends[1], delete, kill_listeners).await;
    println!(
        "reset_broadcast (Cluster): deny cache dropped {dropped:?} after the subscription was killed"
    );
}

/// A reshard that moves the channel's slot ends every process's subscription on the node that had
/// it (`sunsubscribe`): each subscribes again on the slot's new owner, and hears resets again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_listener_follows_its_channel_to_another_node() {
    use crate::support::cluster::{key_slot, owner, Migration};
    let cluster = RedisCluster::start();
    let backends = three(&cluster.urls(), true).await;
    let subscribers_on = |node: usize| shard_subscribers(&cluster, node);
    let slot = key_slot(&cluster, "throttle:resets");
    let from = owner(&cluster, slot);
    let to = (from + 1) % 3;
    wait_until_true(|| subscribers_on(from) == Some(3), "subscribed").await;
    // The slot holds the channel, no key: it moves without a MIGRATE.
    Migration::begin(&cluster, slot, to).finish(&cluster);
    wait_until_true(
        || subscribers_on(to) == Some(3),
        "subscribed again on the new owner",
    )
    .await;
    let node = &cluster.nodes()[0];
    let heard = propagation(&backends, |k| {
        node.cli(&["-c", "DEL", k]);
    })
    .await;
    assert!(heard.iter().all(|d| *d < HEARD_WITHIN), "{heard:?}");
}

/// A frozen node that owns the channel's slot (SIGSTOP: its connections stay open, silent) and
/// is replaced by its replica: each process's listener finds the silence by its ping, and
/// subscribes again on the new primary, where the resets are published now.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_listener_leaves_a_frozen_node_for_its_replica() {
    use crate::support::cluster::{
        cluster_ready_to_fail_over, is_primary, key_slot, owner, replica_of,
    };
    let cluster = cluster_ready_to_fail_over();
    let backends = three(&cluster.urls(), true).await;
    let subscribers_on = |node: usize| shard_subscribers(&cluster, node);
    let slot = key_slot(&cluster, "throttle:resets");
    let from = owner(&cluster, slot);
    let replica = replica_of(&cluster, from);
    wait_until_true(|| subscribers_on(from) == Some(3), "subscribed").await;
    let frozen = crate::failure::freeze(&cluster.nodes()[from]);
    cluster.nodes()[replica].cli(&["CLUSTER", "FAILOVER", "TAKEOVER"]);
    let port = cluster.nodes()[replica].port();
    wait_until_true(|| is_primary(port), "the replica promoted").await;
    // Within two keep-alives (a ping, its timeout) and a new subscription.
    let deadline = Instant::now() + Duration::from_secs(30);
    while subscribers_on(replica) != Some(3) {
        assert!(
            Instant::now() < deadline,
            "the listeners stayed on the frozen node: {:?} on the new primary",
            subscribers_on(replica)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The decisions follow the slot too (they time out on the frozen node until then): peeked
    // until they answer, five times in a row.
    let limit = Limit::new("broadcast", Quota::per_hour(3)).unwrap();
    let key = Key::from("bob");
    for backend in &backends {
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut answered = 0;
        while answered < 5 {
            let peeked = tower_throttle::Backend::peek(backend, Charges::one(&limit, &key, 1));
            answered = if peeked.await.is_ok() {
                answered + 1
            } else {
                0
            };
            assert!(Instant::now() < deadline, "decisions never moved");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    let node = &cluster.nodes()[replica];
    let heard = propagation(&backends, |k| {
        node.cli(&["-c", "DEL", k]);
    })
    .await;
    assert!(heard.iter().all(|d| *d < HEARD_WITHIN), "{heard:?}");
    drop(frozen);
}

/// How many subscribe to the resets channel on Cluster node `node` (`PUBSUB SHARDNUMSUB`).
fn shard_subscribers(cluster: &RedisCluster, node: usize) -> Option<usize> {
    let reply = cluster.nodes()[node].cli(&["PUBSUB", "SHARDNUMSUB", "throttle:resets"]);
    reply
        .lines()
        .nth(1)
        .and_then(|c| c.trim().parse::<usize>().ok())
}

/// Waits (up to 10 s) until `done`, or fails saying `what`.
async fn wait_until_true(done: impl Fn() -> bool, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(Instant::now() < deadline, "never {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_and_user_connections_listen_too() {
    let redis = RedisServer::start();
    let sentinels = Sentinels::start(redis.port()).await;
    let manager = redis::Client::open(redis.url())
        .unwrap()
        .get_connection_manager()
        .await
        .unwrap();
    let builder = || RedisBackend::builder().mode(RedisMode::Lua);
    let backends = vec![
        builder().url(redis.url()).connect().await.unwrap(),
        builder()
            .sentinel(sentinels.urls(), SERVICE)
            .connect()
            .await
            .unwrap(),
        builder()
            .connection_manager(manager)
            .listen_with(redis::Client::open(redis.url()).unwrap())
            .connect()
            .await
            .unwrap(),
    ];
    wait_for_subscribers(|| redis.cli(&["PUBSUB", "NUMSUB", "throttle:resets"]), 3).await;
    let heard = propagation(&backends, |k| {
        redis.cli(&["DEL", k]);
    })
    .await;
    println!("reset_broadcast (Sentinel, a connection manager): heard after {heard:?}");
    assert!(heard.iter().all(|d| *d < HEARD_WITHIN), "{heard:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_is_heard_by_every_process() {
    let redis = RedisServer::start();
    let backends = three(&[redis.url()], false).await;
    wait_for_subscribers(|| redis.cli(&["PUBSUB", "NUMSUB", "throttle:resets"]), 3).await;
    let policy = |count| {
        Policy::builder("reloaded")
            .key(tower_throttle::key::PeerIp::new())
            .quota(Quota::per_hour(count))
            .build()
            .unwrap()
    };
    let layer = ThrottleLayer::builder()
        .backend(backends[0].clone())
        .policy(policy(3))
        .build()
        .unwrap();
    let handle = layer.handle();
    let (limit, key) = (layer.policies()[0].limit().clone(), Key::from("dave"));
    let untouched = Limit::new("untouched", Quota::per_hour(1)).unwrap();
    cached_everywhere(&backends, &limit, &key, |k| {
        redis.cli(&["DEL", k]);
    })
    .await;
    cached_everywhere(&backends, &untouched, &key, |k| {
        redis.cli(&["DEL", k]);
    })
    .await;
    // The same policies again change no limit: nothing to forget, nothing published.
    handle.reload([policy(3)]).unwrap();
    // Another quota: the others forget what they decided under the old one.
    let started = Instant::now();
    handle.reload([policy(6)]).unwrap();
    let heard = admitted_again(&backends, &limit, &key, started).await;
    println!("reset_broadcast (reload): heard by the other two processes after {heard:?}");
    assert!(heard.iter().all(|d| *d < HEARD_WITHIN), "{heard:?}");
    for backend in &backends[1..] {
        assert!(
            !admits(backend, &untouched, &key).await,
            "a limit the reload did not change was forgotten"
        );
    }
}

/// A reset nobody heard (the key deleted by `delete`, behind `backend`'s deny cache), then its
/// subscription killed by `kill`: how long until the backend admits the key again, having dropped
/// its deny cache when it subscribed again.
async fn missed_reset(
    backend: &RedisBackend,
    delete: impl Fn(&str),
    kill: impl FnOnce(),
) -> Duration {
    let limit = Limit::new("missed", Quota::per_hour(1)).unwrap();
    let key = Key::from("carol");
    assert!(admits(backend, &limit, &key).await);
    assert!(!admits(backend, &limit, &key).await);
    delete(&backend.redis_key("missed", &key));
    assert!(!admits(backend, &limit, &key).await, "not cached");
    kill();
    let started = Instant::now();
    while !admits(backend, &limit, &key).await {
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "the deny cache outlived a new subscription"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    started.elapsed()
}

/// Waits (up to 5 s) until `numsub` (a `PUBSUB NUMSUB` reply: the channel, then the count) counts
/// `wanted` subscribers.
async fn wait_for_subscribers(numsub: impl Fn() -> String, wanted: usize) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let reply = numsub();
        let count = reply
            .lines()
            .nth(1)
            .and_then(|c| c.trim().parse::<usize>().ok());
        if count == Some(wanted) {
            return;
        }
        assert!(Instant::now() < deadline, "subscribers: {reply:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
