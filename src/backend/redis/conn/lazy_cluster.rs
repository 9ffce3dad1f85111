//! A Redis Cluster's connection: made at once (`connect`, a connection given as it is), or by
//! [`build`](crate::redis::RedisBackendBuilder::build)'s background task (reconnect.rs), and
//! until then an error at once for every call, so that requests follow the failure policy.
//! Why not redis-rs 1.8.1's pending connection (`get_pending_async_connection_with_config`,
//! src/cluster_handling/client.rs:1010): its calls wait for the Cluster, and it logs an error per
//! failed slot refresh. This can go once it fails calls at once until the Cluster has formed.

use std::sync::{Arc, OnceLock};

use redis::cluster_async::ClusterConnection;
use redis::RedisError;

use super::cluster_nodes::ClusterNodes;
use crate::backend::redis::health::attempts::Attempts;

/// The Cluster's connection, once made; the attempts and the last error meanwhile.
pub(crate) struct LazyCluster {
    conn: OnceLock<ClusterConnection>,
    pub(crate) attempts: Attempts,
    /// The seed nodes, password hidden: for messages.
    pub(crate) target: String,
    /// The backend's slot map and breakers, told about `TRYAGAIN` (redirect.rs).
    pub(crate) nodes: OnceLock<Arc<ClusterNodes>>,
}

impl LazyCluster {
    /// Not connected yet; `target` names the seed nodes (password hidden).
    pub(crate) fn new(target: String) -> Self {
        LazyCluster {
            conn: OnceLock::new(),
            attempts: Attempts::default(),
            target,
            nodes: OnceLock::new(),
        }
    }

    /// A handle on the Cluster's connection, once it is made.
    pub(crate) fn get(&self) -> Option<ClusterConnection> {
        self.conn.get().cloned()
    }

    pub(crate) fn connected(&self) -> bool {
        self.conn.get().is_some()
    }

    /// Puts the connection in service; from now on redis-rs reconnects it by its own rules.
    pub(crate) fn install(&self, conn: ClusterConnection) {
        let _ = self.conn.set(conn);
        self.attempts.connected(None);
    }

    /// The error of every call before the Cluster is connected.
    pub(crate) fn not_connected(&self) -> RedisError {
        RedisError::from(std::io::Error::new(
            std::io::ErrorKind::NotConnected,
            format!("the Redis Cluster is not connected yet ({})", self.target),
        ))
    }
}
