//! The background task that connects a Cluster started by [`build`](crate::redis::RedisBackendBuilder::build)
//! ([`LazyCluster`]): it tries every 50 ms, backing off to 500 ms, until the Cluster has formed
//! (`CLUSTER INFO` says `cluster_state:ok`: every slot assigned and served) and is set up as
//! `connect` sets it up (set_up.rs: a failure there fails the attempt), then puts the connection
//! in service and ends: from then on redis-rs reconnects the Cluster's nodes by its own rules, as
//! after [`connect`](crate::redis::RedisBackendBuilder::connect).

use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::RedisError;

use super::backoff::CONNECTING;
use super::connection::RedisConnection;
use super::lazy_cluster::LazyCluster;
use super::server::{attempt_budget, configuration_error};
use super::set_up::{set_up, Fresh};
use crate::backend::redis::health::attempts::Misconfigured;
use crate::backend::redis::state::RedisState;
use crate::backend::redis::wire::mode::path_name;

/// While the Cluster stays down, "still unreachable" is logged at most this often.
const STILL_DOWN_EVERY: Duration = Duration::from_secs(10);
/// After a configuration error (a wrong password, missing ACL permissions), attempts go on this
/// slowly: someone has to fix something first.
const MISCONFIGURED_BACKOFF: Duration = Duration::from_secs(5);

/// Why one attempt failed, and whether retrying alone can fix it.
struct Failure {
    message: String,
    misconfigured: bool,
}

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
        let mut backoff = CONNECTING;
        let mut last_said: Option<Instant> = None;
        loop {
            let Some(budget) = state.upgrade().map(|s| attempt_budget(s.timeout)) else {
                return;
            };
            let attempt = async {
                let conn = formed(&client, &lazy.target).await?;
                let Some(strong) = state.upgrade() else {
                    return Ok(None);
                };
                let mut fresh = RedisConnection::Cluster(conn.clone(), None);
                set_up(Fresh::Other(&mut fresh), &strong)
                    .await
                    .map_err(|e| {
                        let (message, misconfigured) = e.describe(&lazy.target);
                        Failure {
                            message,
                            misconfigured,
                        }
                    })?;
                Ok(Some((conn, strong)))
            };
            let failure = match tokio::time::timeout(budget, attempt).await {
                Ok(Ok(Some((conn, strong)))) => {
                    lazy.install(conn);
                    tracing::info!(
                        redis = %lazy.target,
                        path = path_name(strong.detector.active_path()),
                        "connected to the Redis Cluster"
                    );
                    strong
                        .breaker
                        .recorder
                        .connected(strong.detector.active_path());
                    return;
                }
                Ok(Ok(None)) => return,
                Ok(Err(failure)) => failure,
                Err(_) => Failure {
                    message: format!(
                        "the Redis Cluster ({}) did not complete a connection within {budget:?}",
                        lazy.target
                    ),
                    misconfigured: false,
                },
            };
            if last_said.is_none_or(|t| t.elapsed() >= STILL_DOWN_EVERY) {
                tracing::warn!(
                    redis = %lazy.target,
                    error = %failure.message,
                    "the Redis Cluster is not reachable or not formed yet; retrying (requests follow the failure policy meanwhile)"
                );
                last_said = Some(Instant::now());
            }
            let wait = backoff.wait();
            let wait = if failure.misconfigured {
                MISCONFIGURED_BACKOFF
            } else {
                wait
            };
            let misconfigured = failure
                .misconfigured
                .then(|| Misconfigured::Fatal(failure.message.clone()));
            lazy.attempts.failed(failure.message, misconfigured);
            tokio::time::sleep(wait).await;
        }
    });
}

/// A connection to the Cluster once it has formed. The slot map of a connection made before the
/// slots were assigned is empty, so the connection that goes into service is a second one, made
/// after `CLUSTER INFO` said `cluster_state:ok`.
async fn formed(client: &ClusterClient, target: &str) -> Result<ClusterConnection, Failure> {
    let failed = |doing: &str, e: RedisError| Failure {
        misconfigured: configuration_error(&e, target, doing).is_some(),
        message: configuration_error(&e, target, doing)
            .unwrap_or_else(|| format!("cannot {doing} the Redis Cluster ({target}): {e}")),
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
        return Err(Failure {
            message: format!(
                "the Redis Cluster ({target}) has not formed yet (CLUSTER INFO does not say cluster_state:ok)"
            ),
            misconfigured: false,
        });
    }
    client
        .get_async_connection()
        .await
        .map_err(|e| failed("connect to", e))
}
