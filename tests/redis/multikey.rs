//! Several keys in one atomic decision on Redis (`tests/shared/multikey.rs`): the limits script
//! alone and coalesced, in `Cell` mode (where the stack runs on the limits script, as every stack
//! does) and on a 3-node Cluster (users and organisation on different nodes when keyed apart),
//! each admitting exactly what the tightest key allows under 200 concurrent requests, with
//! refusals charging no limit.

use std::time::Duration;

use tower_throttle::redis::{RedisBackend, RedisMode};

use crate::multikey_shared::{one_user_in_one_org, several_users_in_one_org};
use crate::support::cluster::{key_slot, owner};
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

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn on_a_cluster_keys_of_different_slots_are_decided_together_on_the_policy_s_slot() {
    let cluster = RedisCluster::start();
    // Keyed apart, the user's and the organisation's keys would be in different slots (on
    // different nodes): a keyed stack's keys take one tag, its first limit's name.
    let (user, org) = (key_slot(&cluster, "{user-0}"), key_slot(&cluster, "{acme}"));
    assert_ne!(owner(&cluster, user), owner(&cluster, org));
    for coalesce in [false, true] {
        let connect = || {
            RedisBackend::builder()
                .cluster_urls(cluster.urls())
                .coalesce(coalesce)
                .prefix(format!("multikey-cluster-{coalesce}"))
                .timeout(Duration::from_secs(2))
                .connect()
        };
        several_users_in_one_org(connect().await.unwrap()).await;
        one_user_in_one_org(connect().await.unwrap()).await;
    }
}

/// A Cluster client or connection the application made itself (`cluster_client`,
/// `cluster_connection`), given as it is: the same decisions as from the nodes' addresses.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cluster_client_or_connection_given_as_it_is_decides_the_same() {
    let cluster = RedisCluster::start();
    for given in ["client", "connection"] {
        let connect = || async {
            let client = redis::cluster::ClusterClient::new(cluster.urls()).unwrap();
            let builder = match given {
                "client" => RedisBackend::builder().cluster_client(client),
                _ => {
                    let connection = client.get_async_connection().await.unwrap();
                    RedisBackend::builder().cluster_connection(connection)
                }
            };
            builder
                .prefix(format!("multikey-given-{given}"))
                .timeout(Duration::from_secs(2))
                .connect()
                .await
                .unwrap_or_else(|e| panic!("connect the given {given}: {e:?}"))
        };
        several_users_in_one_org(connect().await).await;
        one_user_in_one_org(connect().await).await;
    }
}
