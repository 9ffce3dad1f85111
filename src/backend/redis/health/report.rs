//! [`RedisHealth`]: what a Redis backend can say about its connection, for readiness checks.

use std::fmt;
use std::time::SystemTime;

use super::circuit::CircuitState;
use crate::backend::redis::wire::mode::RedisMode;

/// The state of a [`RedisBackend`](crate::redis::RedisBackend)'s connection, from
/// [`RedisBackend::health`](crate::redis::RedisBackend::health), for readiness checks: healthy when
/// decisions come from Redis ([guide](crate::guide::redis#health-in-detail)).
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
    /// The path decisions take: `Some(Cell)`, `Some(Lua)`, or `None` before detection.
    pub path: Option<RedisMode>,
    /// Whether the circuit breaker is open: calls fail fast until a probe gets through.
    pub breaker_open: bool,
    /// The last failed call's error while connected and [failing](Self::decisions_failing), else
    /// the last that cost the connection or an attempt (a wrong password, a replica...); and when.
    pub last_error: Option<(String, SystemTime)>,
    /// Whether the last call to Redis failed (no call has succeeded since): see above.
    pub decisions_failing: bool,
    /// The address connected to last (the primary Sentinel named, for Sentinel), password hidden.
    pub address: Option<String>,
    /// On a Redis Cluster, each primary of the slot map (empty on one server, and before the map
    /// is first read). A node's breaker does not make the backend unhealthy by itself.
    pub nodes: Vec<RedisNodeHealth>,
}

/// One Redis Cluster primary, in [`RedisHealth::nodes`]: its slots and its circuit breaker, which
/// opens when a call cannot reach it ([guide](crate::guide::redis#health-in-detail)).
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

    /// Why the backend is not healthy (`None` when it is): `"not connected"`, `"circuit breaker
    /// open"` or `"decisions failing"`, the first that holds; `last_error` says more.
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
