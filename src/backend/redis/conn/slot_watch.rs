//! The task that keeps a Cluster backend's slot map ([`ClusterNodes`]) fresh, off the request
//! path: `CLUSTER SLOTS` every second, every 100 ms while a breaker is not closed (a promoted
//! replica takes its slots within ~100 ms of the announcement), at once when a call found a node
//! unreachable. Asked with random routing, which redis-rs answers on a connected node without
//! refreshing its own map. With seed URLs it also probes open nodes (cluster_nodes.rs says why).

use std::sync::Arc;
use std::time::Duration;

use redis::aio::ConnectionLike;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use redis::{Client, ConnectionInfo, RedisError};

use super::cluster_nodes::{parse_slots, ClusterNodes, Nudge};
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
        let mut moved: Option<Nudge> = None;
        let mut probing: Option<tokio::task::JoinHandle<()>> = None;
        while let Some(state) = weak.upgrade() {
            // A Cluster started by `build` has no connection at first.
            let read = match state.conn.cluster() {
                Some(Ok(conn)) => {
                    let (read, slot) = refresh(conn.clone(), &nodes, state.timeout).await;
                    if let Some(slot) = slot {
                        moved = Some(Nudge::new(slot, &state.prefix));
                    }
                    if let Some(nudge) = &moved
                        && nudged(conn, &nodes, nudge, state.timeout).await
                    {
                        moved = None;
                    }
                    read
                }
                _ => false,
            };
            nodes.tell_flaps();
            // On a task of their own: a probe of a silent node (a frozen primary) waits out its
            // budget (up to 5 s), and the map must not wait for it, nor a moved slot's nudge.
            if probing.as_ref().is_none_or(|p| p.is_finished()) {
                let budget = attempt_budget(state.timeout);
                probing = crate::timer::spawn(probe_open_nodes(nodes.clone(), budget));
            }
            let wait = if !read || woken || moved.is_some() || !nodes.tripped().is_empty() {
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

/// Reads the slot map and installs it: whether it was read, and a slot that changed primary.
async fn refresh(
    mut conn: ClusterConnection,
    nodes: &ClusterNodes,
    timeout: Duration,
) -> (bool, Option<u16>) {
    for _ in 0..TRIES {
        let mut cmd = redis::cmd("CLUSTER");
        cmd.arg("SLOTS");
        let routing = RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random);
        let asked = tokio::time::timeout(timeout, conn.route_command(cmd, routing)).await;
        if let Ok(Ok(reply)) = asked
            && let Some(shards) = parse_slots(&reply).filter(|s| !s.is_empty())
        {
            return (true, nodes.install(shards));
        }
    }
    (false, None)
}

/// How long a [`Nudge`] is tried before it is given up (a Cluster that never settles).
const NUDGE_FOR: Duration = Duration::from_secs(30);

/// Whether redis-rs sends `nudge`'s slot to a node that answers, else sends another primary a key
/// of it (see [`Nudge`]). A script that does not exist, on a key of the slot: the owner answers
/// `NOSCRIPT` (nothing runs), another node `MOVED` or `ASK`, which redis-rs follows by itself (a
/// reshard's moves are left to it). Only silence means it sends the slot where no one answers.
async fn nudged(
    mut conn: ClusterConnection,
    nodes: &ClusterNodes,
    nudge: &Nudge,
    timeout: Duration,
) -> bool {
    let mut cmd = redis::cmd("EVALSHA");
    cmd.arg("0".repeat(40)).arg(1).arg(&nudge.key);
    let routed = tokio::time::timeout(timeout, conn.req_packed_command(&cmd)).await;
    let silent = match &routed {
        Ok(Err(e)) => e.is_timeout() || e.is_io_error() || e.is_connection_dropped(),
        Ok(Ok(_)) => false,
        Err(_) => true,
    };
    if !silent || nudge.since.elapsed() > NUDGE_FOR {
        return true;
    }
    if let Some((host, port)) = nodes.other_than_owner(nudge.slot) {
        let to = RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress { host, port });
        let _ = tokio::time::timeout(timeout, conn.route_command(cmd, to)).await;
    }
    false
}

/// Probes each open node whose wait is over (seed URLs only): `PING` on a new connection, all at
/// once (a silent node's probe waits out its budget, and a live one's must not wait for it).
async fn probe_open_nodes(nodes: Arc<ClusterNodes>, budget: Duration) {
    let probes: Vec<_> = (nodes.tripped().into_iter())
        .filter_map(|node| {
            let (info, admission) = nodes.probe(&node)?;
            let nodes = nodes.clone();
            crate::timer::spawn(async move {
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
            })
        })
        .collect();
    for probe in probes {
        let _ = probe.await;
    }
}

async fn ping(info: ConnectionInfo, timeout: Duration) -> Result<(), RedisError> {
    let mut conn = open(&Client::open(info)?, timeout).await?;
    redis::cmd("PING").query_async::<()>(&mut conn).await
}
