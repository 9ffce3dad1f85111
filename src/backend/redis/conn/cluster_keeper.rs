//! The background task that connects a Cluster started by [`build`](crate::redis::RedisBackendBuilder::build)
//! ([`LazyCluster`]): it tries every 50 ms, backing off to 500 ms, until the Cluster has formed
//! (`CLUSTER INFO` says `cluster_state:ok`: every slot assigned and served), then puts the
//! connection in service, loads the script or detects the module (as `connect` would), and ends: from then on redis-rs
//! reconnects the Cluster's nodes by its own rules, as after [`connect`](crate::redis::RedisBackendBuilder::connect).

use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::RedisError;

use super::backoff::CONNECTING;
use super::connection::cell_loaded;
use super::lazy_cluster::LazyCluster;
use super::server::{attempt_budget, configuration_error};
use crate::backend::redis::state::RedisState;
use crate::backend::redis::wire::mode::{path_name, RedisMode};
use crate::backend::redis::wire::scripts;

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
            let failure = match tokio::time::timeout(budget, formed(&client, &lazy.target)).await
            {
                Ok(Ok(conn)) => {
                    lazy.install(conn);
                    let Some(strong) = state.upgrade() else { return };
                    ready(&strong, &lazy).await;
                    return;
                }
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
            lazy.failed(failure.message, failure.misconfigured);
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

/// The connection is in service: load the script (`Lua` mode, `Auto` with coalescing on) or detect
/// the module (`Cell`, `Auto` without coalescing), as `connect` does before it returns. A failure here only logs: the first decisions
/// load or detect again.
async fn ready(state: &RedisState, lazy: &LazyCluster) {
    let mut conn = state.conn.clone();
    let prepared = match state.detector.set_up_mode() {
        RedisMode::Lua => scripts::load_gcra(&mut conn).await,
        RedisMode::Cell | RedisMode::Auto => cell_loaded(&mut conn).await.map(|loaded| {
            if state.detector.mode() == RedisMode::Cell && !loaded {
                tracing::error!(
                    redis = %lazy.target,
                    "mode \"cell\" needs the redis-cell module (CL.THROTTLE) on every primary, which this Cluster has not loaded; use mode \"lua\" or \"auto\""
                );
            }
            state.detector.detected(loaded, &state.breaker);
        }),
    };
    if let Err(e) = prepared {
        tracing::warn!(redis = %lazy.target, error = %e, "the Redis Cluster is connected, but the limiter's set-up failed; decisions will retry it");
    }
    tracing::info!(
        redis = %lazy.target,
        path = path_name(state.detector.active_path()),
        "connected to the Redis Cluster"
    );
    state
        .breaker
        .failing
        .connected(state.detector.active_path());
}
