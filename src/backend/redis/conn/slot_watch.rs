//! The task that keeps a Cluster backend's slot map ([`ClusterNodes`]) fresh, off the request
//! path: `CLUSTER SLOTS` every second, every 100 ms while a breaker is not closed (a promoted
//! replica takes its slots within ~100 ms of the announcement), at once when a call found a node
//! unreachable. Asked with random routing, which redis-rs answers on a connected node without
//! refreshing its own map. With seed URLs it also probes open nodes (cluster_nodes.rs says why).

use std::sync::Arc;
use std::time::Duration;

use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use redis::{Client, ConnectionInfo, RedisError};

use super::cluster_nodes::{parse_slots, ClusterNodes};
use super::server::{attempt_budget, open};
use crate::backend::redis::state::RedisState;

/// The map is read this often while every breaker is closed...
const EVERY: Duration = Duration::from_secs(1);
/// ...and this often while one is not, or after a failure woke the task.
const WHILE_TRIPPED: Duration = Duration::from_millis(100);
/// Questions that failed in a row (each on a random node) before the task waits again.
const TRIES: usize = 3;

/// Starts the task for a Cluster backend (nothing on one server); it ends with the backend.
pub(crate) fn spawn(state: &Arc<RedisState>) {
    let Some(nodes) = state.breaker.nodes.clone() else {
        return;
    };
    let weak = Arc::downgrade(state);
    crate::timer::spawn(async move {
        let mut woken = false;
        while let Some(state) = weak.upgrade() {
            // A Cluster started by `build` has no connection at first.
            let read = match state.conn.cluster() {
                Some(Ok(conn)) => refresh(conn, &nodes, &state.prefix, state.timeout).await,
                _ => false,
            };
            probe_open_nodes(&nodes, attempt_budget(state.timeout)).await;
            let wait = if !read || woken || !nodes.tripped().is_empty() {
                WHILE_TRIPPED
            } else {
                EVERY
            };
            // Woken by a failure, or at the next period; the backend is not held meanwhile (and
            // looked up again either way).
            drop(state);
            if weak.strong_count() == 0 {
                return;
            }
            woken = tokio::time::timeout(wait, nodes.stale.notified())
                .await
                .is_ok();
            if woken {
                // A burst of failures wakes the task once per period at most.
                tokio::time::sleep(WHILE_TRIPPED / 2).await;
            }
        }
    });
}

/// Reads the slot map and installs it; whether it was read. A slot that changed primary
/// [nudges](super::cluster_nodes::Nudge) redis-rs's own map.
async fn refresh(
    mut conn: ClusterConnection,
    nodes: &ClusterNodes,
    prefix: &str,
    timeout: Duration,
) -> bool {
    for _ in 0..TRIES {
        let mut cmd = redis::cmd("CLUSTER");
        cmd.arg("SLOTS");
        let routing = RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random);
        let asked = tokio::time::timeout(timeout, conn.route_command(cmd, routing)).await;
        if let Ok(Ok(reply)) = asked
            && let Some(shards) = parse_slots(&reply).filter(|s| !s.is_empty())
        {
            if let Some(nudge) = nodes.install(shards) {
                // A script that does not exist, on a key of the slot: `MOVED` from a node
                // that does not own it, before anything runs (`NOSCRIPT` if it does).
                let mut cmd = redis::cmd("EVALSHA");
                cmd.arg("0".repeat(40)).arg(1).arg(nudge.key(prefix));
                let (host, port) = nudge.to;
                let to = RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress { host, port });
                let _ = tokio::time::timeout(timeout, conn.route_command(cmd, to)).await;
            }
            return true;
        }
    }
    false
}

/// Probes each open node whose wait is over (seed URLs only): `PING` on a new connection.
async fn probe_open_nodes(nodes: &ClusterNodes, budget: Duration) {
    for node in nodes.tripped() {
        let Some((info, admission)) = nodes.probe(&node) else {
            continue;
        };
        match tokio::time::timeout(budget, ping(info, budget)).await {
            Ok(Ok(())) => nodes.answered(&node),
            Ok(Err(e)) => nodes.failed(&node, true, &e),
            Err(_) => nodes.failed(
                &node,
                true,
                &format_args!("no answer to PING within {budget:?}"),
            ),
        }
        drop(admission);
    }
}

async fn ping(info: ConnectionInfo, timeout: Duration) -> Result<(), RedisError> {
    let mut conn = open(&Client::open(info)?, timeout).await?;
    redis::cmd("PING").query_async::<()>(&mut conn).await
}
