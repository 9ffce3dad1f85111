//! The task that connects a Cluster started by [`build`](crate::redis::RedisBackendBuilder::build)
//! ([`LazyCluster`]): the keepers' retry loop (reconnect.rs) until the Cluster has formed (`CLUSTER
//! INFO` says `cluster_state:ok`) and is set up (set_up.rs); then it installs the connection and
//! ends: redis-rs reconnects the nodes from then on, as after `connect`.

use std::sync::{Arc, Weak};

use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::RedisError;

use super::connection::RedisConnection;
use super::lazy_cluster::LazyCluster;
use super::reconnect::{connect_with_backoff, Attempt};
use super::server::{attempt_budget, configuration_error, within, AttemptError};
use super::set_up::{in_service, set_up, Fresh};
use crate::backend::redis::state::RedisState;
use crate::backend::redis::wire::mode::path_name;

/// Connects `lazy` in the background for as long as the backend (`state`) lives.
pub(crate) fn spawn_cluster_keeper(
    client: ClusterClient,
    lazy: Arc<LazyCluster>,
    state: Weak<RedisState>,
) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    runtime.spawn(async move {
        let mut keep = (client, lazy.clone());
        let connected = connect_with_backoff(
            &lazy.target,
            &lazy.attempts,
            &state,
            &mut true,
            &mut keep,
            attempt_cluster,
        )
        .await;
        let (Some((conn, _)), Some(strong)) = (connected, state.upgrade()) else {
            return;
        };
        lazy.install(conn);
        tracing::info!(
            redis = %lazy.target,
            path = path_name(strong.detector.active_path()),
            "connected to the Redis Cluster"
        );
        in_service(&strong);
    });
}

/// One attempt: the Cluster, once formed, set up.
fn attempt_cluster(
    (client, lazy): &mut (ClusterClient, Arc<LazyCluster>),
    state: Arc<RedisState>,
) -> Attempt<'_, ClusterConnection> {
    Box::pin(async move {
        let budget = attempt_budget(state.timeout);
        let attempt = async {
            let conn = formed(client, &lazy.target).await?;
            let mut fresh = RedisConnection::cluster_of(conn.clone());
            set_up(Fresh::Other(&mut fresh), &state)
                .await
                .map_err(|e| AttemptError::described(e.describe(&lazy.target)))?;
            Ok(conn)
        };
        let target = || format!("the Redis Cluster ({})", lazy.target);
        within(budget, target, attempt).await
    })
}

/// A connection to the Cluster once formed: a second one, made after `CLUSTER INFO` said so (the
/// slot map of one made before the slots were assigned is empty).
async fn formed(client: &ClusterClient, target: &str) -> Result<ClusterConnection, AttemptError> {
    let failed = |doing: &str, e: RedisError| {
        AttemptError::described(match configuration_error(&e, target, doing) {
            Some(message) => (message, true),
            None => (
                format!("cannot {doing} the Redis Cluster ({target}): {e}"),
                false,
            ),
        })
    };
    let mut probe = client
        .get_async_connection()
        .await
        .map_err(|e| failed("connect to", e))?;
    let info: String = redis::cmd("CLUSTER")
        .arg("INFO")
        .query_async(&mut probe)
        .await
        .map_err(|e| failed("ask", e))?;
    if !info.lines().any(|l| l.trim() == "cluster_state:ok") {
        return Err(AttemptError::described((
            format!(
                "the Redis Cluster ({target}) has not formed yet (CLUSTER INFO does not say cluster_state:ok)"
            ),
            false,
        )));
    }
    client
        .get_async_connection()
        .await
        .map_err(|e| failed("connect to", e))
}
