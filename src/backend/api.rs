//! The [`Backend`] trait, apart from the backends that implement it, so that each of them imports
//! it from below.

use std::future::Future;
use std::sync::Arc;

use crate::error::{BackendError, BuildError};
use crate::limit::Limit;

use super::charge::{Adjustment, Charges, Decisions, Uses};
use super::key_state::{PeekFuture, ResetFuture};
use super::records::Records;

/// Decides whether a request may pass, and records it if so.
///
/// A request asks in one shape: a list of [`Charges`] (a limit, the key it counts against and the
/// quantity, one per limit) decided all or nothing, answered with one decision per charge; what
/// happens to them after the response (a refund, a settlement, a concurrency slot given back) is
/// one [`adjust`](Backend::adjust)ing call. A new request shape is a property of a charge or a
/// limit, not a method here.
///
/// Implementations must be atomic per key: concurrent checks for one key admit no more than the
/// limit. A backend that answers without waiting (such as the memory backend) returns a ready
/// future; the middleware then decides and calls the inner service without any extra allocation
/// or task switch.
pub trait Backend: Send + Sync + 'static {
    /// The future of a decision. It owns what it needs (it is `'static`).
    type Future: Future<Output = Result<Decisions, BackendError>> + Send + Unpin + 'static;

    /// Asks whether every one of `charges` may pass, atomically: the request passes only if every
    /// charge is admitted, and then it is recorded by all of them; a refusal by one records nothing
    /// in any. Answers one decision per charge, in order; a lone charge as [`Decisions::One`].
    fn check(&self, charges: Charges<'_>) -> Self::Future;

    /// Whether this backend can decide charges against `limits` (one limit, or a stack) used as
    /// `uses` says (keys apart, quantities settled after the response, refunds). Called for every
    /// policy when a layer is built, so that what a backend cannot do is an error at start-up, not
    /// at the first request. The default accepts one limit used alone and refuses the rest.
    fn validate(&self, limits: &[Limit], uses: Uses) -> Result<(), BuildError> {
        match limits {
            [_] if uses == Uses::NOTHING_MORE => Ok(()),
            [_] => Err(BuildError::Invalid(format!(
                "this backend cannot refund, settle or key apart its charges ({uses:?})"
            ))),
            all => Err(BuildError::Invalid(format!(
                "this backend cannot enforce stacked quotas ({} limits)",
                all.len()
            ))),
        }
    }

    /// Changes charges a request was admitted with, after its response: a refund, a settlement, a
    /// concurrency slot given back ([`Adjustment`]). `charges` are as the request was checked.
    /// Must not block and never refuses. The default does nothing (and
    /// [`validate`](Backend::validate) should then refuse refunds and settlements).
    fn adjust(&self, charges: Charges<'_>, adjustment: Adjustment<'_>) {
        let _ = (charges, adjustment);
    }

    /// Reads the state of each charge's key under its limit, as [`check`](Backend::check) keeps it
    /// for such a list (a stack may keep its state apart from the same limits alone), without
    /// consuming or writing anything: one [`KeyState`](super::KeyState) per charge, in order. The
    /// quantities are not read. A backend that [keeps penalties](Backend::keeps_penalties) reports
    /// the ban of the first limit's penalty. The default fails.
    fn peek(&self, charges: Charges<'_>) -> PeekFuture {
        let _ = charges;
        Box::pin(std::future::ready(Err(BackendError::new(
            "this backend cannot peek at a key's state",
        ))))
    }

    /// Forgets the state of each charge's key under its limit (as in [`peek`](Backend::peek)), and
    /// the strikes and ban of the first limit's penalty if this backend keeps them: the key starts
    /// again with its full quota. Under a concurrency limit that frees the slots of the key's
    /// requests in flight (an operator's way out of slots that leaked): until those requests end,
    /// the key may have up to twice its limit in flight. The default fails.
    fn reset(&self, charges: Charges<'_>) -> ResetFuture {
        let _ = charges;
        Box::pin(std::future::ready(Err(BackendError::new(
            "this backend cannot reset a key",
        ))))
    }

    /// Whether this backend keeps [`Penalty`](crate::policy::Penalty) strikes and bans itself
    /// (shared by every process, as the Redis backend does). When it does not (the default), the
    /// layer keeps them in process.
    fn keeps_penalties(&self) -> bool {
        false
    }

    /// Told by a [reload](crate::ops::ThrottleHandle::reload) the names of the limits it changed or
    /// removed: a backend that caches decisions drops those it cached under them (the Redis
    /// backend: its deny cache's entries and its leased budgets' slices, in this process and, told
    /// through Redis, in every other process sharing it). The state kept per key is not touched.
    /// Must not block; the default does nothing.
    fn reloaded(&self, changed: &[&str]) {
        let _ = changed;
    }

    /// The tables this backend keeps for every process sharing it ([`Records`]): the layer keeps
    /// its overrides and timed bans there, so that every process hears a change and it outlives
    /// restarts. `None` (the default): the layer keeps them in process.
    fn records(&self) -> Option<Arc<dyn Records>> {
        None
    }
}

/// The methods of [`Backend`] but `check` (whose future is each type's own), each forwarded by
/// `$to!(self, method, arguments…)` to the backend behind: for a type that wraps one or more.
macro_rules! forward_backend {
    ($to:ident) => {
        fn validate(&self, limits: &[Limit], uses: Uses) -> Result<(), BuildError> {
            $to!(self, validate, limits, uses)
        }

        fn adjust(&self, charges: Charges<'_>, adjustment: Adjustment<'_>) {
            $to!(self, adjust, charges, adjustment)
        }

        fn peek(&self, charges: Charges<'_>) -> PeekFuture {
            $to!(self, peek, charges)
        }

        fn reset(&self, charges: Charges<'_>) -> ResetFuture {
            $to!(self, reset, charges)
        }

        fn keeps_penalties(&self) -> bool {
            $to!(self, keeps_penalties)
        }

        fn reloaded(&self, changed: &[&str]) {
            $to!(self, reloaded, changed)
        }

        fn records(&self) -> Option<Arc<dyn Records>> {
            $to!(self, records)
        }
    };
}

// For `configured.rs`, the other type that wraps backends.
#[cfg(all(feature = "config", feature = "redis"))]
pub(super) use forward_backend;

/// `Backend::method` of what an `Arc` points to.
macro_rules! pointee {
    ($this:ident, $method:ident $(, $arg:expr)*) => {
        Backend::$method(&**$this $(, $arg)*)
    };
}

impl<B: Backend> Backend for Arc<B> {
    type Future = B::Future;

    #[inline]
    fn check(&self, charges: Charges<'_>) -> Self::Future {
        (**self).check(charges)
    }

    forward_backend!(pointee);
}
