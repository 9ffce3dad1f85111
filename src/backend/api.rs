//! The [`Backend`] trait (and [`StackFuture`]), apart from the backends that implement it, so that
//! each of them imports it from below.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use crate::decision::Decision;
use crate::error::{BackendError, BuildError};
use crate::key::Key;
use crate::limit::Limit;

use super::key_state::{PeekFuture, ResetFuture};
use super::records::Records;

/// The future of [`Backend::check_all`]: one decision per limit, in order.
pub type StackFuture = Pin<Box<dyn Future<Output = Result<Vec<Decision>, BackendError>> + Send>>;

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

    /// Asks whether `quantity` units may pass for `key` under every one of `limits` (a stack of
    /// quotas, such as 10 a second and 1,000 a day), atomically: the request passes only if every
    /// limit admits it, and then it is recorded by all of them; a rejection by one records nothing
    /// in any. Returns one decision per limit, in order. The default fails: a backend that implements
    /// it says so in [`validate_all`](Backend::validate_all).
    fn check_all(&self, limits: &[Limit], key: &Key, quantity: u64) -> StackFuture {
        let _ = (key, quantity);
        let error = BackendError::new(format!(
            "this backend cannot decide {} stacked limits together",
            limits.len()
        ));
        Box::pin(std::future::ready(Err(error)))
    }

    /// Whether this backend can enforce `limits` together with [`check_all`](Backend::check_all).
    /// The default refuses.
    fn validate_all(&self, limits: &[Limit]) -> Result<(), BuildError> {
        Err(BuildError::Invalid(format!(
            "this backend cannot enforce stacked quotas ({} limits)",
            limits.len()
        )))
    }

    // --- Several keys in one decision: one block (see `PolicyBuilder::quota_keyed`). ---

    /// Like [`check_all`](Backend::check_all), with a key per limit (`keys[i]` for `limits[i]`,
    /// such as 10 a minute per user and 1,000 a minute per organisation): atomically, the request
    /// passes only if every limit admits it under its own key, and a refusal by one records
    /// nothing under any. Each limit keeps its state under its own key, apart from a stack that
    /// shares one key (and from the same limit checked alone on backends that say so). The
    /// default fails: a backend that implements it says so in
    /// [`validate_keyed`](Backend::validate_keyed).
    fn check_keyed(&self, limits: &[Limit], keys: &[Key], quantity: u64) -> StackFuture {
        let _ = (keys, quantity);
        let error = BackendError::new(format!(
            "this backend cannot decide {} limits with keys of their own together",
            limits.len()
        ));
        Box::pin(std::future::ready(Err(error)))
    }

    /// Whether this backend can enforce `limits` together with
    /// [`check_keyed`](Backend::check_keyed). The default refuses.
    fn validate_keyed(&self, limits: &[Limit]) -> Result<(), BuildError> {
        let _ = limits;
        Err(BuildError::Invalid(
            "this backend cannot decide limits with keys of their own (quotas with a key) in one \
             decision"
                .into(),
        ))
    }

    /// Reads each limit's state under its own key, as [`check_keyed`](Backend::check_keyed) keeps
    /// it, without consuming anything: one [`KeyState`](super::KeyState) per limit, in order. The
    /// default fails.
    fn peek_keyed(&self, limits: &[Limit], keys: &[Key]) -> PeekFuture {
        let _ = (limits, keys);
        Box::pin(std::future::ready(Err(BackendError::new(
            "this backend cannot peek at limits with keys of their own",
        ))))
    }

    /// Forgets each limit's state under its own key, as [`check_keyed`](Backend::check_keyed)
    /// keeps it. The default fails.
    fn reset_keyed(&self, limits: &[Limit], keys: &[Key]) -> ResetFuture {
        let _ = (limits, keys);
        Box::pin(std::future::ready(Err(BackendError::new(
            "this backend cannot reset limits with keys of their own",
        ))))
    }

    /// Gives back the slot of a request admitted under a
    /// [concurrency](crate::Algorithm::Concurrency) limit, when its response has been sent, failed
    /// or been dropped. `lease` is the decision's [`lease`](Decision::lease) (0 if it had none).
    /// Must not block; the default does nothing.
    ///
    /// A request whose [`check`](Backend::check) future is dropped before it completes (the client
    /// went away while the backend was deciding) never learns whether it took a slot, so it cannot
    /// give it back: a backend that decides asynchronously must let such slots expire (the Redis
    /// backend's leases do).
    fn release(&self, limit: &Limit, key: &Key, quantity: u64, lease: u64) {
        let _ = (limit, key, quantity, lease);
    }

    /// Whether this backend keeps [`Penalty`](crate::policy::Penalty) strikes and bans itself (shared by every
    /// process, as the Redis backend does). When it does not (the default), the layer keeps them in
    /// process.
    fn keeps_penalties(&self) -> bool {
        false
    }

    // Peek and reset (the operator's view of one key): one block, after everything else.

    /// Reads `key`'s state under `limits` (one limit, or a stack as [`check_all`](Backend::check_all)
    /// takes it: a stack may keep its state apart from the same limits alone) without consuming
    /// anything or writing anything: one [`KeyState`](super::KeyState) per limit, in order. A backend that
    /// [keeps penalties](Backend::keeps_penalties) reports the ban of the first limit's penalty.
    /// The default fails.
    fn peek(&self, limits: &[Limit], key: &Key) -> PeekFuture {
        let _ = (limits, key);
        Box::pin(std::future::ready(Err(BackendError::new(
            "this backend cannot peek at a key's state",
        ))))
    }

    /// Forgets `key`'s state under `limits` (one limit or a stack, as in [`peek`](Backend::peek)),
    /// and the strikes and ban of the first limit's penalty if this backend keeps them: the key
    /// starts again with its full quota. Under a concurrency limit that frees the slots of the key's
    /// requests in flight (an operator's way out of slots that leaked): until those requests end,
    /// the key may have up to twice its limit in flight (on Redis their releases then remove
    /// nothing; in memory, which counts slots without tokens, they give back slots taken since the
    /// reset). The default fails.
    fn reset(&self, limits: &[Limit], key: &Key) -> ResetFuture {
        let _ = (limits, key);
        Box::pin(std::future::ready(Err(BackendError::new(
            "this backend cannot reset a key",
        ))))
    }

    // --- Counting by outcome: refunds (one block; see `PolicyBuilder::count_only`). ---

    /// Gives back `quantity` units that a request admitted `since` ago was charged for `key` under
    /// `limits` (one limit, or a stack as [`check_all`](Backend::check_all) decided it), because its
    /// response does not count ([`PolicyBuilder::count_only`](crate::PolicyBuilder::count_only),
    /// [`refund_on`](crate::PolicyBuilder::refund_on)). Must not block and must never give back
    /// more than the request took: the state becomes at most what it would be had the request never
    /// come. `since` is an upper bound on the time since the backend admitted the request (the
    /// middleware measures it from before it asked), so a refund may give back less, never more.
    ///
    /// Per algorithm: the GCRA moves the TAT back by `quantity` emission intervals less `since` (a
    /// later request that would have found the bucket idle without this one absorbed up to the time
    /// between them, so giving back the whole amount could give back more than was taken; the
    /// middleware only asks while the units still count, `since` < the decision's `reset_after`);
    /// the fixed window takes the units out of the window that admitted
    /// them if it is still the current one (known only when `now - since` falls in it too: a
    /// request admitted within `since` of the window's start is not given back, it may have been
    /// counted in the window before); the sliding window out of the window that admitted them
    /// (or, within `since` of a boundary, the one before, which weighs less); the sliding log removes
    /// `quantity` units logged at the admission or after the earliest time it may have been, the
    /// oldest first. A concurrency limit has nothing to refund (its slot is given back by
    /// [`release`](Backend::release)). The default does nothing; a backend that refunds says so in
    /// [`can_refund`](Backend::can_refund).
    fn refund(&self, limits: &[Limit], key: &Key, quantity: u64, since: Duration) {
        let _ = (limits, key, quantity, since);
    }

    /// Whether [`refund`](Backend::refund) gives units back. A layer refuses to build a policy that
    /// counts by outcome on a backend that cannot (it would count every response). The default: no.
    fn can_refund(&self) -> bool {
        false
    }

    // --- Metered limits: a cost settled after the response (one block). ---

    /// Like [`check_all`](Backend::check_all), with one quantity per limit (`quantities[i]` for
    /// `limits[i]`): in a stack such as "60 requests and 100,000 tokens a minute" a metered limit
    /// reserves its estimate while the others take the request's cost. Atomic as `check_all` is.
    /// The default passes a stack whose quantities are all equal to `check_all` and fails otherwise:
    /// a backend that implements it says so in [`can_settle`](Backend::can_settle).
    fn check_each(&self, limits: &[Limit], key: &Key, quantities: &[u64]) -> StackFuture {
        match quantities {
            [first, rest @ ..]
                if limits.len() == quantities.len() && rest.iter().all(|q| q == first) =>
            {
                self.check_all(limits, key, *first)
            }
            _ => Box::pin(std::future::ready(Err(BackendError::new(
                "this backend cannot decide a stack with a quantity per limit",
            )))),
        }
    }

    /// Settles what a metered request really cost, once its response has ended (or was dropped):
    /// `deltas[i]` is the actual cost less the reservation under `limits[i]` (0: nothing to do).
    /// `limits` and `key` are as the request was decided: one limit as [`check`](Backend::check)
    /// decided it, or a stack as [`check_each`](Backend::check_each) did. Must not block, and
    /// never refuses (the response has been sent).
    ///
    /// A positive delta charges that many more units: for the GCRA the theoretical arrival time
    /// moves on by `delta` emission intervals, from now if the key was idle, and may pass the burst
    /// tolerance (the key is in debt: its next requests are refused until it is paid back) by at
    /// most [`max_debt`](Limit::max_debt) units. A negative delta gives units back exactly as
    /// [`refund`](Backend::refund) does (`since` bounds the time since the admission). The
    /// default does nothing; a backend that settles says so in [`can_settle`](Backend::can_settle).
    fn settle(&self, limits: &[Limit], key: &Key, deltas: &[i64], since: Duration) {
        let _ = (limits, key, deltas, since);
    }

    /// Whether [`settle`](Backend::settle) and [`check_each`](Backend::check_each) work on this
    /// backend for GCRA limits (metered limits are GCRA). A layer refuses to build a metered policy
    /// on a backend that cannot. The default: no.
    fn can_settle(&self) -> bool {
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

    // --- What an operator changes at run time (overrides, timed bans): one block. ---

    /// The tables this backend keeps for every process sharing it ([`Records`]): the layer keeps
    /// its overrides and timed bans there, so that every process hears a change and it outlives
    /// restarts. `None` (the default): the layer keeps them in process.
    fn records(&self) -> Option<Arc<dyn Records>> {
        None
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

    fn check_all(&self, limits: &[Limit], key: &Key, quantity: u64) -> StackFuture {
        (**self).check_all(limits, key, quantity)
    }

    fn validate_all(&self, limits: &[Limit]) -> Result<(), BuildError> {
        (**self).validate_all(limits)
    }

    // Several keys in one decision.
    fn check_keyed(&self, limits: &[Limit], keys: &[Key], quantity: u64) -> StackFuture {
        (**self).check_keyed(limits, keys, quantity)
    }

    fn validate_keyed(&self, limits: &[Limit]) -> Result<(), BuildError> {
        (**self).validate_keyed(limits)
    }

    fn peek_keyed(&self, limits: &[Limit], keys: &[Key]) -> PeekFuture {
        (**self).peek_keyed(limits, keys)
    }

    fn reset_keyed(&self, limits: &[Limit], keys: &[Key]) -> ResetFuture {
        (**self).reset_keyed(limits, keys)
    }

    fn release(&self, limit: &Limit, key: &Key, quantity: u64, lease: u64) {
        (**self).release(limit, key, quantity, lease)
    }

    fn peek(&self, limits: &[Limit], key: &Key) -> PeekFuture {
        (**self).peek(limits, key)
    }

    fn reset(&self, limits: &[Limit], key: &Key) -> ResetFuture {
        (**self).reset(limits, key)
    }

    // Counting by outcome.
    fn refund(&self, limits: &[Limit], key: &Key, quantity: u64, since: Duration) {
        (**self).refund(limits, key, quantity, since)
    }

    fn can_refund(&self) -> bool {
        (**self).can_refund()
    }

    // Metered limits.
    fn check_each(&self, limits: &[Limit], key: &Key, quantities: &[u64]) -> StackFuture {
        (**self).check_each(limits, key, quantities)
    }

    fn settle(&self, limits: &[Limit], key: &Key, deltas: &[i64], since: Duration) {
        (**self).settle(limits, key, deltas, since)
    }

    fn can_settle(&self) -> bool {
        (**self).can_settle()
    }

    fn reloaded(&self, changed: &[&str]) {
        (**self).reloaded(changed)
    }

    fn records(&self) -> Option<Arc<dyn Records>> {
        (**self).records()
    }
}
