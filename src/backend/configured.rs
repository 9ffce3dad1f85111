//! [`ConfiguredBackend`]: the backend a [`Config`](crate::config::Config) names, memory or Redis,
//! as one type (features `config` and `redis`).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use super::api::{Backend, StackFuture};
use super::key_state::{PeekFuture, ResetFuture};
use super::memory::MemoryBackend;
use super::redis::{RedisBackend, RedisFuture, RedisHealth};
use crate::decision::Decision;
use crate::error::{BackendError, BuildError};
use crate::key::Key;
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

    fn check(&self, limit: &Limit, key: &Key, quantity: u64) -> Self::Future {
        match self {
            // Decided here and now: the layer sees a ready future and skips the pending path.
            ConfiguredBackend::Memory(memory) => ConfiguredFuture(DecisionSource::Ready(Some(
                memory.decide(limit, key, quantity),
            ))),
            ConfiguredBackend::Redis(redis) => {
                ConfiguredFuture(DecisionSource::Redis(redis.check(limit, key, quantity)))
            }
        }
    }

    fn validate(&self, limit: &Limit) -> Result<(), BuildError> {
        match self {
            ConfiguredBackend::Memory(memory) => memory.validate(limit),
            ConfiguredBackend::Redis(redis) => redis.validate(limit),
        }
    }

    fn keeps_penalties(&self) -> bool {
        match self {
            ConfiguredBackend::Memory(memory) => memory.keeps_penalties(),
            ConfiguredBackend::Redis(redis) => redis.keeps_penalties(),
        }
    }

    fn check_all(&self, limits: &[Limit], key: &Key, quantity: u64) -> StackFuture {
        match self {
            ConfiguredBackend::Memory(memory) => memory.check_all(limits, key, quantity),
            ConfiguredBackend::Redis(redis) => redis.check_all(limits, key, quantity),
        }
    }

    fn validate_all(&self, limits: &[Limit]) -> Result<(), BuildError> {
        match self {
            ConfiguredBackend::Memory(memory) => memory.validate_all(limits),
            ConfiguredBackend::Redis(redis) => redis.validate_all(limits),
        }
    }

    fn check_keyed(&self, limits: &[Limit], keys: &[Key], quantity: u64) -> StackFuture {
        match self {
            ConfiguredBackend::Memory(memory) => memory.check_keyed(limits, keys, quantity),
            ConfiguredBackend::Redis(redis) => redis.check_keyed(limits, keys, quantity),
        }
    }

    fn validate_keyed(&self, limits: &[Limit]) -> Result<(), BuildError> {
        match self {
            ConfiguredBackend::Memory(memory) => memory.validate_keyed(limits),
            ConfiguredBackend::Redis(redis) => redis.validate_keyed(limits),
        }
    }

    fn peek_keyed(&self, limits: &[Limit], keys: &[Key]) -> PeekFuture {
        match self {
            ConfiguredBackend::Memory(memory) => memory.peek_keyed(limits, keys),
            ConfiguredBackend::Redis(redis) => redis.peek_keyed(limits, keys),
        }
    }

    fn reset_keyed(&self, limits: &[Limit], keys: &[Key]) -> ResetFuture {
        match self {
            ConfiguredBackend::Memory(memory) => memory.reset_keyed(limits, keys),
            ConfiguredBackend::Redis(redis) => redis.reset_keyed(limits, keys),
        }
    }

    fn release(&self, limit: &Limit, key: &Key, quantity: u64, lease: u64) {
        match self {
            ConfiguredBackend::Memory(memory) => memory.release(limit, key, quantity, lease),
            ConfiguredBackend::Redis(redis) => redis.release(limit, key, quantity, lease),
        }
    }

    fn peek(&self, limits: &[Limit], key: &Key) -> PeekFuture {
        match self {
            ConfiguredBackend::Memory(memory) => memory.peek(limits, key),
            ConfiguredBackend::Redis(redis) => redis.peek(limits, key),
        }
    }

    fn reset(&self, limits: &[Limit], key: &Key) -> ResetFuture {
        match self {
            ConfiguredBackend::Memory(memory) => memory.reset(limits, key),
            ConfiguredBackend::Redis(redis) => redis.reset(limits, key),
        }
    }

    // Counting by outcome.
    fn refund(&self, limits: &[Limit], key: &Key, quantity: u64, since: std::time::Duration) {
        match self {
            ConfiguredBackend::Memory(memory) => memory.refund(limits, key, quantity, since),
            ConfiguredBackend::Redis(redis) => redis.refund(limits, key, quantity, since),
        }
    }

    fn can_refund(&self) -> bool {
        match self {
            ConfiguredBackend::Memory(memory) => memory.can_refund(),
            ConfiguredBackend::Redis(redis) => redis.can_refund(),
        }
    }

    // Metered limits.
    fn check_each(&self, limits: &[Limit], key: &Key, quantities: &[u64]) -> StackFuture {
        match self {
            ConfiguredBackend::Memory(memory) => memory.check_each(limits, key, quantities),
            ConfiguredBackend::Redis(redis) => redis.check_each(limits, key, quantities),
        }
    }

    fn settle(&self, limits: &[Limit], key: &Key, deltas: &[i64], since: std::time::Duration) {
        match self {
            ConfiguredBackend::Memory(memory) => memory.settle(limits, key, deltas, since),
            ConfiguredBackend::Redis(redis) => redis.settle(limits, key, deltas, since),
        }
    }

    fn can_settle(&self) -> bool {
        match self {
            ConfiguredBackend::Memory(memory) => memory.can_settle(),
            ConfiguredBackend::Redis(redis) => redis.can_settle(),
        }
    }

    fn reloaded(&self, changed: &[&str]) {
        match self {
            ConfiguredBackend::Memory(memory) => memory.reloaded(changed),
            ConfiguredBackend::Redis(redis) => redis.reloaded(changed),
        }
    }

    fn records(&self) -> Option<Arc<dyn crate::backend::Records>> {
        match self {
            ConfiguredBackend::Memory(memory) => memory.records(),
            ConfiguredBackend::Redis(redis) => redis.records(),
        }
    }
}

/// The future of [`ConfiguredBackend`]: ready at once for memory, Redis's answer otherwise.
pub struct ConfiguredFuture(DecisionSource);

/// Where the decision comes from: already made (memory), or Redis's answer to wait for.
enum DecisionSource {
    Ready(Option<Result<Decision, BackendError>>),
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
    type Output = Result<Decision, BackendError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match &mut self.get_mut().0 {
            DecisionSource::Ready(result) => Poll::Ready(
                result
                    .take()
                    .expect("ConfiguredFuture polled after completion"),
            ),
            DecisionSource::Redis(future) => future.as_mut().poll(cx),
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
