//! Mode `auto` with coalescing on (both the defaults) takes the Lua path whether the redis-cell
//! module is loaded or not, so connecting asks nothing about the module: no `COMMAND INFO` round
//! trip at connect, eager, in the background or on the user's connection manager, on a server with
//! the module or without. With coalescing off, `auto` still looks for the module (it picks
//! `CL.THROTTLE` where it is loaded).

use crate::backend::calls;
use crate::support::redis::{RedisCluster, RedisServer};

use std::time::{Duration, Instant};

use crate::support::asks::Asks;
use tower_throttle::key::Key;
use tower_throttle::{
    redis::{RedisBackend, RedisBackendBuilder, RedisMode},
    Limit, Quota,
};

fn limit() -> Limit {
    Limit::new("nocommand", Quota::per_minute(10)).unwrap()
}

/// `builder` (mode `auto`, coalescing on) connected at once: on the Lua path, and deciding.
async fn decides_on_lua(builder: RedisBackendBuilder) {
    let backend = builder.connect().await.unwrap();
    assert_eq!(backend.active_path(), Some(RedisMode::Lua));
    let decision = backend
        .check_one(&limit(), &Key::from("k"), 1)
        .await
        .unwrap();
    assert!(decision.allowed);
}

#[tokio::test]
async fn auto_with_coalescing_sends_no_command_info() {
    let key = Key::from("k");
    for server in [RedisServer::start(), RedisServer::start_with_cell()] {
        decides_on_lua(RedisBackend::builder().url(server.url())).await;

        // Connected in the background.
        let lazy = RedisBackend::builder().url(server.url()).build().unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while !lazy.health().is_healthy() {
            assert!(Instant::now() < deadline, "{}", lazy.health());
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(lazy.check_one(&limit(), &key, 1).await.unwrap().allowed);

        // On a connection manager of the user's (set up as a Cluster is: builder.rs's open_other).
        let manager = redis::Client::open(server.url())
            .unwrap()
            .get_connection_manager()
            .await
            .unwrap();
        decides_on_lua(RedisBackend::builder().connection_manager(manager)).await;
        assert_eq!(calls(&server, "command|info"), 0);

        // Without coalescing, `auto` looks for the module.
        let detecting = RedisBackend::builder()
            .url(server.url())
            .coalesce(false)
            .connect()
            .await
            .unwrap();
        assert!(
            detecting
                .check_one(&limit(), &key, 1)
                .await
                .unwrap()
                .allowed
        );
        assert!(calls(&server, "command|info") > 0);
    }
}

/// On a Cluster too: connected at once (builder.rs) or in the background (reconnect.rs).
#[tokio::test]
async fn auto_with_coalescing_sends_no_command_info_to_a_cluster() {
    let cluster = RedisCluster::start();
    let key = Key::from("k");
    decides_on_lua(RedisBackend::builder().cluster_urls(cluster.urls())).await;
    let lazy = RedisBackend::builder()
        .cluster_urls(cluster.urls())
        .build()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while lazy.check_one(&limit(), &key, 1).await.is_err() {
        assert!(Instant::now() < deadline, "{}", lazy.health());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for node in cluster.nodes() {
        assert_eq!(calls(node, "command|info"), 0, "{}", node.url());
    }
}
