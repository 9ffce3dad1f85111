//! Several keys in one atomic decision on Redis (`tests/shared/multikey.rs`): the limits script
//! alone and coalesced, and in `Cell` mode (where the stack runs on the limits script, as every
//! stack does), each admitting exactly what the tightest key allows under 200 concurrent requests
//! with refusals charging no limit; a Cluster is refused when the layer is built.

use std::time::Duration;

use tower_throttle::config::Config;
use tower_throttle::redis::{RedisBackend, RedisMode};
use tower_throttle::ThrottleLayer;

use crate::multikey_shared::{one_user_in_one_org, several_users_in_one_org, TOML};
use crate::support::redis::{RedisCluster, RedisServer};

async fn connect(url: &str, mode: RedisMode, coalesce: bool, prefix: &str) -> RedisBackend {
    RedisBackend::builder()
        .url(url)
        .mode(mode)
        .coalesce(coalesce)
        .prefix(prefix)
        .timeout(Duration::from_secs(2))
        .connect()
        .await
        .unwrap_or_else(|e| panic!("connect {url}: {e:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn on_lua_alone_and_coalesced_the_tightest_key_admits_and_refusals_charge_none() {
    let server = RedisServer::start();
    for coalesce in [false, true] {
        let prefix = format!("multikey-{coalesce}");
        let backend = connect(&server.url(), RedisMode::Lua, coalesce, &prefix).await;
        several_users_in_one_org(backend).await;
        let backend = connect(&server.url(), RedisMode::Lua, coalesce, &prefix).await;
        one_user_in_one_org(backend).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn in_cell_mode_quotas_keyed_apart_run_on_the_limits_script() {
    let server = RedisServer::start_with_cell();
    let backend = connect(&server.url(), RedisMode::Cell, true, "multikey-cell").await;
    several_users_in_one_org(backend).await;
    let backend = connect(&server.url(), RedisMode::Cell, true, "multikey-cell").await;
    one_user_in_one_org(backend).await;
}

#[tokio::test]
async fn a_cluster_refuses_quotas_keyed_apart_when_the_layer_is_built() {
    let cluster = RedisCluster::start();
    let backend = RedisBackend::builder()
        .cluster_urls(cluster.urls())
        .timeout(Duration::from_secs(2))
        .connect()
        .await
        .unwrap();
    let built = ThrottleLayer::builder()
        .backend(backend)
        .policies(Config::from_toml(TOML).unwrap().policies().unwrap())
        .build();
    let why = match built {
        Ok(_) => panic!("a Cluster is refused"),
        Err(e) => e.to_string(),
    };
    assert!(
        why.contains("one Redis server or Sentinel, not a Cluster"),
        "{why}"
    );
}
