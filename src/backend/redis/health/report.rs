//! [`RedisHealth`]: what a Redis backend can say about its connection, for readiness checks.

use std::fmt;
use std::time::SystemTime;

use super::circuit::CircuitState;
use crate::backend::redis::wire::mode::RedisMode;

/// The state of a [`RedisBackend`](crate::redis::RedisBackend)'s connection, from
/// [`RedisBackend::health`](crate::redis::RedisBackend::health), for readiness checks.
///
/// A backend is [healthy](Self::is_healthy) when decisions come from Redis: connected, the
/// circuit breaker closed, and decisions not [failing](Self::decisions_failing); otherwise requests
/// follow the layer's failure policy. On a Cluster and with a user's connection manager, which
/// reconnect by themselves, "connected" comes from the calls: not after three calls in a row failed
/// to reach Redis, or calls failing with no answer in the last second.
///
/// Decisions are failing from the first call that ends in an error (any: a lost connection, a
/// timeout, `OOM command not allowed` from a full Redis, a script error) until the next that
/// succeeds; meanwhile `last_error` is the last failed call's error and the gauge
/// `throttle_backend_up{backend, path}` is 0. With no requests, the backend probes a failing Redis
/// every 250 ms with a decision that writes nothing, so a recovery shows within a second.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// use tower_throttle::redis::{RedisBackend, RedisMode};
///
/// // Nothing listens on port 1: the backend starts anyway and keeps connecting in the background.
/// let redis = RedisBackend::builder().url("redis://127.0.0.1:1/").build().unwrap();
/// let health = redis.health();
/// assert!(!health.is_healthy());
/// assert!(!health.connected);
/// assert_eq!(health.reason(), Some("not connected"));
/// // Mode auto takes the coalesced Lua script, known before Redis ever answered.
/// assert_eq!(health.path, Some(RedisMode::Lua));
/// # }
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct RedisHealth {
    /// Whether a connection to a primary is up.
    pub connected: bool,
    /// The path decisions take: `Some(Cell)`, `Some(Lua)`, or `None` before detection (mode
    /// `auto` with coalescing off, which looks for the redis-cell module).
    pub path: Option<RedisMode>,
    /// Whether the circuit breaker is open: calls fail fast (but for an occasional probe) until
    /// one gets through or the background probe finds Redis again.
    pub breaker_open: bool,
    /// While connected and decisions are [failing](Self::decisions_failing): the error of the last
    /// failed call (for example `OOM command not allowed when used memory > 'maxmemory'`).
    /// Otherwise the last error that cost the connection or a connection attempt (a configuration error among them: a
    /// wrong password, missing ACL permissions, a replica), and when it happened.
    pub last_error: Option<(String, SystemTime)>,
    /// Whether the last call to Redis failed (no call has succeeded since): see above.
    pub decisions_failing: bool,
    /// The address connected to last (the primary Sentinel named, for Sentinel), password hidden.
    pub address: Option<String>,
    /// On a Redis Cluster, each primary of the slot map and its own circuit breaker (empty on one
    /// server, and before the map is first read): see [`RedisNodeHealth`]. A node's breaker does
    /// not make the backend unhealthy by itself, as the other primaries' keys are decided.
    pub nodes: Vec<RedisNodeHealth>,
}

/// One Redis Cluster primary, in [`RedisHealth::nodes`]: its slots and its circuit breaker.
///
/// A call that cannot reach the primary of its key's slot (a refused or lost connection, a
/// timeout, or a slot that no node serves: `MOVED` back to a dead primary, `CLUSTERDOWN`) opens
/// that primary's breaker: its slots' decisions then fail at once (the failure policy answers, with
/// no round trip) but for one probe after 50 ms, then after up to 500 ms, until the primary answers
/// again or the slot map (read every second, every 100 ms while a breaker is open) names another
/// primary for the slots, such as its promoted replica, whose breaker starts closed. Keys on the
/// other primaries are not affected. The gauge `throttle_cluster_node_up{backend, node}` follows
/// the breaker (1 closed, 0 otherwise).
///
/// ```
/// use tower_throttle::redis::{CircuitState, RedisBackend};
///
/// # async fn run(redis: RedisBackend) {
/// for node in redis.health().nodes {
///     if node.state != CircuitState::Closed {
///         eprintln!("{} ({} slots) is {}", node.address, node.slot_count(), node.state.name());
///     }
/// }
/// # }
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct RedisNodeHealth {
    /// The primary's `host:port`, as the Cluster names it.
    pub address: String,
    /// The slot ranges it owns (inclusive), from the backend's last read of the slot map.
    pub slots: Vec<(u16, u16)>,
    /// Its breaker: closed, open (its slots fail fast), or half-open (one call probes).
    pub state: CircuitState,
    /// The last error a call met on it, and when (kept after it recovers).
    pub last_error: Option<(String, SystemTime)>,
}

impl RedisNodeHealth {
    /// How many slots it owns.
    pub fn slot_count(&self) -> u32 {
        self.slots
            .iter()
            .map(|&(start, end)| u32::from(end) - u32::from(start) + 1)
            .sum()
    }

    /// Whether `slot` is one of its slots.
    pub fn owns(&self, slot: u16) -> bool {
        self.slots
            .iter()
            .any(|&(start, end)| (start..=end).contains(&slot))
    }
}

impl RedisHealth {
    /// Connected, the breaker closed and decisions not failing: decisions come from Redis.
    pub fn is_healthy(&self) -> bool {
        self.reason().is_none()
    }

    /// Why the backend is not healthy, in a few words (`None` when it is): `"not connected"`,
    /// `"circuit breaker open"` or `"decisions failing"`, the first that holds; `last_error` says
    /// more.
    pub fn reason(&self) -> Option<&'static str> {
        if !self.connected {
            Some("not connected")
        } else if self.breaker_open {
            Some("circuit breaker open")
        } else if self.decisions_failing {
            Some("decisions failing")
        } else {
            None
        }
    }

    /// The path's name: `"cell"`, `"lua"` or `"unknown"`.
    pub fn path_name(&self) -> &'static str {
        crate::backend::redis::wire::mode::path_name(self.path)
    }
}

impl fmt::Display for RedisHealth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} (path {}, breaker {}",
            self.reason()
                .map_or("up".into(), |why| format!("down: {why}")),
            self.path_name(),
            if self.breaker_open { "open" } else { "closed" }
        )?;
        if let Some(address) = &self.address {
            write!(f, ", address {address}")?;
        }
        if let Some((error, _)) = &self.last_error {
            write!(f, ", last error: {error}")?;
        }
        for node in self
            .nodes
            .iter()
            .filter(|n| n.state != CircuitState::Closed)
        {
            write!(f, ", node {} {}", node.address, node.state.name())?;
        }
        f.write_str(")")
    }
}
