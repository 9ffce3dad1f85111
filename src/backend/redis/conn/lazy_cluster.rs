//! A Redis Cluster started by [`build`](crate::redis::RedisBackendBuilder::build): the Cluster's
//! connection once the background task (`cluster_keeper.rs`) has made it, and until then an error at
//! once for every call, so that requests follow the failure policy instead of waiting.
//!
//! Why not redis-rs 1.8.1's pending connection (`get_pending_async_connection_with_config`,
//! src/cluster_handling/client.rs:1010): its calls wait for the Cluster (each up to redis-rs' own
//! timeouts) and it logs an error per failed slot refresh; here a call before the Cluster has
//! formed costs nothing, and the task logs one line per transition. This can go once redis-rs'
//! pending connection fails calls at once until the Cluster has formed.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant, SystemTime};

use redis::cluster_async::ClusterConnection;
use redis::{ErrorKind, RedisError};

use super::cluster_nodes::ClusterNodes;

/// The Cluster's connection, once made; the attempts and the last error meanwhile.
pub(crate) struct LazyCluster {
    conn: OnceLock<ClusterConnection>,
    /// Attempts ended (connected or not), so that `first_attempt` knows when to stop waiting.
    attempts: AtomicU64,
    /// Why the last attempt failed, and when; and whether it was a configuration error that
    /// retrying alone will not fix (a wrong password, missing ACL permissions).
    last_error: Mutex<Option<(String, SystemTime, bool)>>,
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
            attempts: AtomicU64::new(0),
            last_error: Mutex::new(None),
            target,
            nodes: OnceLock::new(),
        }
    }

    /// A handle on the Cluster's connection, once it is made.
    pub(crate) fn get(&self) -> Option<ClusterConnection> {
        self.conn.get().cloned()
    }

    /// Puts the connection in service; from now on redis-rs reconnects it by its own rules.
    pub(crate) fn install(&self, conn: ClusterConnection) {
        let _ = self.conn.set(conn);
        self.attempts.fetch_add(1, Ordering::Release);
    }

    /// An attempt failed: `error`, and whether it is a configuration error.
    pub(crate) fn failed(&self, error: String, misconfigured: bool) {
        *self.last_error.lock().unwrap_or_else(|e| e.into_inner()) =
            Some((error, SystemTime::now(), misconfigured));
        self.attempts.fetch_add(1, Ordering::Release);
    }

    /// The last attempt's error, and when it happened.
    pub(crate) fn last_error(&self) -> Option<(String, SystemTime)> {
        self.last_error
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .map(|(e, t, _)| (e.clone(), *t))
    }

    /// The error of every call before the Cluster is connected.
    pub(crate) fn not_connected(&self) -> RedisError {
        RedisError::from((
            ErrorKind::Io,
            "the Redis Cluster is not connected yet",
            self.target.clone(),
        ))
    }

    /// Waits until the Cluster is connected or the first attempt has ended (at most `budget`);
    /// whether it is connected, or the configuration error the attempt failed on.
    pub(crate) async fn first_attempt(&self, budget: Duration) -> Result<bool, String> {
        let deadline = Instant::now() + budget;
        while self.conn.get().is_none()
            && self.attempts.load(Ordering::Acquire) == 0
            && Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        if self.conn.get().is_some() {
            return Ok(true);
        }
        match &*self.last_error.lock().unwrap_or_else(|e| e.into_inner()) {
            Some((error, _, true)) => Err(error.clone()),
            _ => Ok(false),
        }
    }
}
