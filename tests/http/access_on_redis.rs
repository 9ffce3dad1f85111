//! The tests of tests/middleware/access.rs that need a Redis server.
use crate::shared::access::{app, statuses};
use crate::support::redis as redis_support;

use std::time::Duration;

use crate::support::failover::{wait_until, Logs};
use tower_throttle::ops::{AccessList, RedisAccessSync};

/// Every process mirrors the same Redis sets: an operator's SADD reaches a running layer.
#[tokio::test]
async fn redis_sets_are_mirrored_into_running_layers() {
    let (logs, _guard) = Logs::capture();
    let server = redis_support::RedisServer::start();
    let lists = AccessList::new();
    let client = redis::Client::open(server.url()).unwrap();
    let conn = client.get_multiplexed_async_connection().await.unwrap();
    RedisAccessSync::new("acl")
        .every(Duration::from_millis(20))
        .spawn(conn, &lists)
        .await
        .unwrap();
    let app = app(&lists, None);
    assert_eq!(statuses(&app, "192.0.2.1:1", "k", 1).await, [200]);
    server.cli(&["SADD", "{acl}:deny:key", "k"]);
    server.cli(&[
        "SADD",
        "{acl}:allow:net",
        "198.51.100.0/24",
        "not-a-network",
    ]);
    // The layer sees them at a refresh (every 20 ms): polled with a deadline. The allow list was
    // written last; a fresh key each time, so that a poll before the refresh spends nothing.
    let mut polls = 0;
    wait_until(
        Duration::from_secs(10),
        "the allow list never arrived",
        || {
            polls += 1;
            let (app, key) = (&app, format!("x{polls}"));
            async move { statuses(app, "198.51.100.3:1", &key, 4).await == [200; 4] }
        },
    )
    .await;
    assert_eq!(statuses(&app, "192.0.2.1:1", "k", 1).await, [403]);
    // The member that is no network is logged once, not at every read (ten more here).
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        logs.count("skipping an access-list entry"),
        1,
        "{:?}",
        logs.lines()
    );
    server.cli(&["SREM", "{acl}:deny:key", "k"]);
    // A denied request spends nothing: "k" still has one of its two.
    wait_until(Duration::from_secs(10), "the deny stayed", || async {
        statuses(&app, "192.0.2.1:1", "k", 1).await == [200]
    })
    .await;
}

/// A Redis Cluster's own connection, given as it is (access.rs wraps it to follow redirections):
/// the sets are read through it, and an operator's SADD reaches the running layer.
#[tokio::test]
async fn a_cluster_connection_mirrors_the_sets_too() {
    let cluster = redis_support::RedisCluster::start();
    let lists = AccessList::new();
    let client = redis::cluster::ClusterClient::new(cluster.urls()).unwrap();
    let mut conn = client.get_async_connection().await.unwrap();
    RedisAccessSync::new("acl")
        .every(Duration::from_millis(20))
        .spawn(conn.clone(), &lists)
        .await
        .unwrap();
    let app = app(&lists, None);
    assert_eq!(statuses(&app, "192.0.2.1:1", "k", 1).await, [200]);
    let added: i64 = redis::cmd("SADD")
        .arg("{acl}:deny:key")
        .arg("k")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(added, 1);
    wait_until(
        Duration::from_secs(10),
        "the deny never arrived",
        || async { statuses(&app, "192.0.2.1:1", "k", 1).await == [403] },
    )
    .await;
}
