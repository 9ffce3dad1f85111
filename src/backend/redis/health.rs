//! [`RedisHealth`]: what a Redis backend can say about its connection, for readiness checks.

use std::fmt;
use std::time::SystemTime;

use super::mode::RedisMode;

/// The state of a [`RedisBackend`](crate::RedisBackend)'s connection, from
/// [`RedisBackend::health`](crate::RedisBackend::health).
///
/// A backend is [healthy](Self::is_healthy) when decisions come from Redis: connected and the
/// circuit breaker closed. Otherwise requests follow the layer's failure policy. On a Cluster and
/// with a user's connection manager, which reconnect by themselves, "connected" comes from the
/// calls: not after three calls in a row failed to reach Redis, or calls failing with no answer in
/// the last second (and `last_error` is the last such failure).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// use tower_throttle::RedisBackend;
///
/// // Nothing listens on port 1: the backend starts anyway and keeps connecting in the background.
/// let redis = RedisBackend::builder().url("redis://127.0.0.1:1/").build().unwrap();
/// let health = redis.health();
/// assert!(!health.is_healthy());
/// assert!(!health.connected);
/// assert_eq!(health.path, None);
/// # }
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct RedisHealth {
    /// Whether a connection to a primary is up.
    pub connected: bool,
    /// The path decisions take: `Some(Cell)`, `Some(Lua)`, or `None` before detection.
    pub path: Option<RedisMode>,
    /// Whether the circuit breaker is open: calls fail fast (but for an occasional probe) until
    /// one gets through or the background probe finds Redis again.
    pub breaker_open: bool,
    /// The last error that cost the connection or a connection attempt (a configuration error
    /// among them: a wrong password, missing ACL permissions, a replica), and when it happened.
    pub last_error: Option<(String, SystemTime)>,
    /// The address connected to last (the primary Sentinel named, for Sentinel), password hidden.
    pub address: Option<String>,
}

impl RedisHealth {
    /// Connected and the breaker closed: decisions come from Redis.
    pub fn is_healthy(&self) -> bool {
        self.connected && !self.breaker_open
    }

    /// The path's name: `"cell"`, `"lua"` or `"unknown"`.
    pub fn path_name(&self) -> &'static str {
        super::mode::path_name(self.path)
    }
}

impl fmt::Display for RedisHealth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} (path {}, breaker {}",
            if self.is_healthy() { "up" } else { "down" },
            self.path_name(),
            if self.breaker_open { "open" } else { "closed" }
        )?;
        if let Some(address) = &self.address {
            write!(f, ", address {address}")?;
        }
        if let Some((error, _)) = &self.last_error {
            write!(f, ", last error: {error}")?;
        }
        f.write_str(")")
    }
}
