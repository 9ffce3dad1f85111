//! [`ConfiguredBackend`]: the backend a [`Config`](crate::config::Config) names, memory or Redis,
//! as one type (features `config` and `redis`).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use super::api::Backend;
use super::charge::{Adjustment, Charges, Decisions, Uses};
use super::key_state::{PeekFuture, ResetFuture};
use super::memory::MemoryBackend;
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

    fn validate(&self, limits: &[Limit], uses: Uses) -> Result<(), BuildError> {
        self.as_backend().validate(limits, uses)
    }

    fn adjust(&self, charges: Charges<'_>, adjustment: Adjustment<'_>) {
        self.as_backend().adjust(charges, adjustment)
    }

    fn peek(&self, charges: Charges<'_>) -> PeekFuture {
        self.as_backend().peek(charges)
    }

    fn reset(&self, charges: Charges<'_>) -> ResetFuture {
        self.as_backend().reset(charges)
    }

    fn keeps_penalties(&self) -> bool {
        self.as_backend().keeps_penalties()
    }

    fn reloaded(&self, changed: &[&str]) {
        self.as_backend().reloaded(changed)
    }

    fn records(&self) -> Option<Arc<dyn crate::backend::Records>> {
        self.as_backend().records()
    }
}

impl ConfiguredBackend {
    /// The backend behind, for every call but `check` (whose future is this type's own).
    fn as_backend(&self) -> &dyn Forwarded {
        match self {
            ConfiguredBackend::Memory(memory) => memory,
            ConfiguredBackend::Redis(redis) => redis,
        }
    }
}

/// [`Backend`] without its future: what [`ConfiguredBackend`] forwards to either backend.
trait Forwarded {
    fn validate(&self, limits: &[Limit], uses: Uses) -> Result<(), BuildError>;
    fn adjust(&self, charges: Charges<'_>, adjustment: Adjustment<'_>);
    fn peek(&self, charges: Charges<'_>) -> PeekFuture;
    fn reset(&self, charges: Charges<'_>) -> ResetFuture;
    fn keeps_penalties(&self) -> bool;
    fn reloaded(&self, changed: &[&str]);
    fn records(&self) -> Option<Arc<dyn crate::backend::Records>>;
}

impl<B: Backend> Forwarded for B {
    fn validate(&self, limits: &[Limit], uses: Uses) -> Result<(), BuildError> {
        Backend::validate(self, limits, uses)
    }

    fn adjust(&self, charges: Charges<'_>, adjustment: Adjustment<'_>) {
        Backend::adjust(self, charges, adjustment)
    }

    fn peek(&self, charges: Charges<'_>) -> PeekFuture {
        Backend::peek(self, charges)
    }

    fn reset(&self, charges: Charges<'_>) -> ResetFuture {
        Backend::reset(self, charges)
    }

    fn keeps_penalties(&self) -> bool {
        Backend::keeps_penalties(self)
    }

    fn reloaded(&self, changed: &[&str]) {
        Backend::reloaded(self, changed)
    }

    fn records(&self) -> Option<Arc<dyn crate::backend::Records>> {
        Backend::records(self)
    }
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
