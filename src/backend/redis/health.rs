//! [`RedisHealth`]: what a Redis backend can say about its connection, for readiness checks.

use std::fmt;
use std::time::SystemTime;

use super::mode::RedisMode;

/// The state of a [`RedisBackend`](crate::RedisBackend)'s connection, from
/// [`RedisBackend::health`](crate::RedisBackend::health).
///
/// A backend is [healthy](Self::is_healthy) when decisions come from Redis: connected, the
/// circuit breaker closed, and decisions not [failing](Self::decisions_failing). Otherwise requests
/// follow the layer's failure policy. On a Cluster and with a user's connection manager, which
/// reconnect by themselves, "connected" comes from the calls: not after three calls in a row failed
/// to reach Redis, or calls failing with no answer in the last second (and `last_error` is the last
/// such failure).
///
/// Decisions are failing from the first call to Redis that ends in an error (any error: a refused
/// or lost connection, a timeout, `OOM command not allowed` from a Redis that is out of memory, a
/// script error) until the next call that succeeds; meanwhile `last_error` is the error of the last
/// failed call, and the gauge `throttle_backend_up{backend, path}` is 0. With no requests, the backend
/// probes a failing Redis every 250 ms with a decision that writes nothing, so the first success
/// (and a healthy report) comes within a second of Redis recovering, whether traffic asks or not.
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
/// assert_eq!(health.reason(), Some("not connected"));
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
    /// While connected and decisions are [failing](Self::decisions_failing): the error of the last
    /// failed call (for example `OOM command not allowed when used memory > 'maxmemory'`).
    /// Otherwise the last error that cost the connection or a connection attempt (a configuration error among them: a
    /// wrong password, missing ACL permissions, a replica), and when it happened.
    pub last_error: Option<(String, SystemTime)>,
    /// Whether the last call to Redis failed (no call has succeeded since): see above.
    pub decisions_failing: bool,
    /// The address connected to last (the primary Sentinel named, for Sentinel), password hidden.
    pub address: Option<String>,
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
        super::mode::path_name(self.path)
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
        f.write_str(")")
    }
}
