//! [`ConfiguredBackend`]: the backend a [`Config`](crate::config::Config) names, memory or Redis,
//! as one type (features `config` and `redis`).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use super::api::{forward_backend, Backend};
use super::charge::{Adjustment, Charges, Decisions, Uses};
use super::key_state::{PeekFuture, ResetFuture};
use super::memory::MemoryBackend;
use super::records::Records;
use super::redis::{RedisBackend, RedisFuture, RedisHealth};
use crate::error::{BackendError, BuildError};
use crate::limit::Limit;

/// The backend a [`Config`](crate::config::Config) names: memory or Redis, one type for both.
#[derive(Clone, Debug)]
pub enum ConfiguredBackend {
    /// `kind = "memory"`.
    Memory(MemoryBackend),
    /// `kind = "redis"`.
    Redis(RedisBackend),
}

impl ConfiguredBackend {
    /// Where the backend stands, for readiness checks: memory is always healthy; Redis reports
    /// [`RedisBackend::health`].
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    /// use tower_throttle::config::{BackendHealth, ConfiguredBackend};
    /// use tower_throttle::MemoryBackend;
    ///
    /// let backend = ConfiguredBackend::Memory(MemoryBackend::new());
    /// assert!(backend.health().is_healthy());
    /// assert_eq!(backend.health().to_string(), "memory: up");
    /// # Ok(())
    /// # }
    /// ```
    pub fn health(&self) -> BackendHealth {
        match self {
            ConfiguredBackend::Memory(_) => BackendHealth::Memory,
            ConfiguredBackend::Redis(redis) => BackendHealth::Redis(redis.health()),
        }
    }
}

/// What [`ConfiguredBackend::health`] reports.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum BackendHealth {
    /// The memory backend: always up.
    Memory,
    /// The Redis backend's state.
    Redis(RedisHealth),
}

impl BackendHealth {
    /// Whether decisions come from the backend (memory: always; Redis: connected, breaker closed).
    pub fn is_healthy(&self) -> bool {
        match self {
            BackendHealth::Memory => true,
            BackendHealth::Redis(redis) => redis.is_healthy(),
        }
    }
}

impl fmt::Display for BackendHealth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BackendHealth::Memory => f.write_str("memory: up"),
            BackendHealth::Redis(redis) => write!(f, "redis: {redis}"),
        }
    }
}

/// `Backend::method` of the backend a [`ConfiguredBackend`] is.
macro_rules! either {
    ($this:ident, $method:ident $(, $arg:expr)*) => {
        match $this {
            ConfiguredBackend::Memory(memory) => Backend::$method(memory $(, $arg)*),
            ConfiguredBackend::Redis(redis) => Backend::$method(redis $(, $arg)*),
        }
    };
}

impl Backend for ConfiguredBackend {
    type Future = ConfiguredFuture;

    #[inline]
    fn check(&self, charges: Charges<'_>) -> Self::Future {
        match self {
            // Decided here and now: the layer sees a ready future and skips the pending path.
            ConfiguredBackend::Memory(memory) => {
                ConfiguredFuture(DecisionSource::Ready(Some(memory.decide_charges(charges))))
            }
            ConfiguredBackend::Redis(redis) => {
                ConfiguredFuture(DecisionSource::Redis(redis.check(charges)))
            }
        }
    }

    forward_backend!(either);
}

/// The future of [`ConfiguredBackend`]: ready at once for memory, Redis's answer otherwise.
pub struct ConfiguredFuture(DecisionSource);

/// Where the decision comes from: already made (memory), or Redis's answer to wait for.
enum DecisionSource {
    Ready(Option<Result<Decisions, BackendError>>),
    Redis(RedisFuture),
}

impl fmt::Debug for ConfiguredFuture {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self.0 {
            DecisionSource::Ready(_) => "ConfiguredFuture(ready)",
            DecisionSource::Redis(_) => "ConfiguredFuture(redis)",
        })
    }
}

impl Future for ConfiguredFuture {
    type Output = Result<Decisions, BackendError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match &mut self.get_mut().0 {
            DecisionSource::Ready(result) => Poll::Ready(
                result
                    .take()
                    .expect("ConfiguredFuture polled after completion"),
            ),
            DecisionSource::Redis(future) => Pin::new(future).poll(cx),
        }
    }
}

#[cfg(feature = "config")]
impl crate::backend::memory::state_file::AsMemory for ConfiguredBackend {
    fn as_memory(&self) -> Option<&MemoryBackend> {
        match self {
            ConfiguredBackend::Memory(memory) => Some(memory),
            ConfiguredBackend::Redis(_) => None,
        }
    }
}
