//! Backends: where decisions are made and key state lives.
//!
//! A [`Backend`] answers one question, asynchronously: may `quantity` units pass for `key` under
//! `limit` now? The [`Limit`] carries the algorithm and the quota, so that one backend serves every
//! policy of an application and later algorithms fit without changing the trait.

#[cfg(feature = "memory")]
mod memory;

#[cfg(feature = "memory")]
pub use memory::{MemoryBackend, MemoryBackendBuilder};

#[cfg(feature = "redis")]
mod redis;

#[cfg(feature = "redis")]
pub use self::redis::{RedisBackend, RedisBackendBuilder, RedisFuture, RedisMode};

use std::future::Future;
use std::sync::Arc;

use crate::{BackendError, BuildError, Decision, Key, Limit};

/// Decides whether a request may pass, and records it if so.
///
/// Implementations must be atomic per key: concurrent calls for one key admit no more than the limit.
/// A backend that answers without waiting (such as the memory backend) returns a ready future; the
/// middleware then decides and calls the inner service without any extra allocation or task switch.
pub trait Backend: Send + Sync + 'static {
    /// The future of a decision. It owns what it needs (it is `'static`).
    type Future: Future<Output = Result<Decision, BackendError>> + Send + Unpin + 'static;

    /// Asks whether `quantity` units (the request's cost) may pass for `key` under `limit`.
    fn check(&self, limit: &Limit, key: &Key, quantity: u64) -> Self::Future;

    /// Whether this backend can enforce `limit` (its algorithm, its precision). Called for every policy
    /// when a layer is built, so that what a backend cannot do is an error at start-up, not at the
    /// first request. The default accepts everything.
    fn validate(&self, limit: &Limit) -> Result<(), BuildError> {
        let _ = limit;
        Ok(())
    }

    /// Whether this backend keeps [`Penalty`](crate::Penalty) strikes and bans itself (shared by every
    /// process, as the Redis backend does). When it does not (the default), the layer keeps them in
    /// process.
    fn keeps_penalties(&self) -> bool {
        false
    }
}

impl<B: Backend> Backend for Arc<B> {
    type Future = B::Future;

    fn check(&self, limit: &Limit, key: &Key, quantity: u64) -> Self::Future {
        (**self).check(limit, key, quantity)
    }

    fn validate(&self, limit: &Limit) -> Result<(), BuildError> {
        (**self).validate(limit)
    }

    fn keeps_penalties(&self) -> bool {
        (**self).keeps_penalties()
    }
}
