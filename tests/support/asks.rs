//! The shapes the tests ask a backend in — one limit, a stack, a quantity per limit, a refund, a
//! settlement, a slot given back — each written as the one list of charges that
//! [`Backend::check`] and [`Backend::adjust`] take, so that a test reads as what it asks.
#![allow(dead_code)]

use std::future::Future;
use std::time::Duration;

use tower_throttle::backend::{Adjustment, Charges, Decisions, KeyState, Uses};
use tower_throttle::{Backend, BuildError, Decision, Key, Limit, Quota};

type Answer<T> = Result<T, tower_throttle::backend::BackendError>;

/// The tests' ways of asking, on every backend.
pub trait Asks: Backend {
    /// One charge: `quantity` units of `limit` for `key`.
    fn check_one(
        &self,
        limit: &Limit,
        key: &Key,
        quantity: u64,
    ) -> impl Future<Output = Answer<Decision>> + Send + 'static {
        let decided = self.check(Charges::one(limit, key, quantity));
        async move { decided.await.map(|all| all[0]) }
    }

    /// A stack: `quantity` units of each of `limits` for `key`, all or nothing.
    fn check_all(
        &self,
        limits: &[Limit],
        key: &Key,
        quantity: u64,
    ) -> impl Future<Output = Answer<Vec<Decision>>> + Send + 'static {
        let decided = self.check(Charges::stack(limits, key, quantity));
        async move { decided.await.map(Decisions::into_vec) }
    }

    /// A stack with a quantity per limit (a metered reservation beside the cost).
    fn check_each(
        &self,
        limits: &[Limit],
        key: &Key,
        quantities: &[u64],
    ) -> impl Future<Output = Answer<Vec<Decision>>> + Send + 'static {
        let decided = self.check(Charges::stack(limits, key, 0).with_quantities(quantities));
        async move { decided.await.map(Decisions::into_vec) }
    }

    /// Quotas with keys of their own: `limits[i]` under `keys[i]`, all or nothing.
    fn check_keyed(
        &self,
        limits: &[Limit],
        keys: &[Key],
        quantity: u64,
    ) -> impl Future<Output = Answer<Vec<Decision>>> + Send + 'static {
        let decided = self.check(Charges::keyed(limits, keys, quantity));
        async move { decided.await.map(Decisions::into_vec) }
    }

    /// `key`'s state under `limits` (one limit or a stack).
    fn peek_all(
        &self,
        limits: &[Limit],
        key: &Key,
    ) -> impl Future<Output = Answer<Vec<KeyState>>> + Send + 'static {
        self.peek(Charges::stack(limits, key, 0))
    }

    /// Forgets `key`'s state under `limits` (one limit or a stack).
    fn reset_all(
        &self,
        limits: &[Limit],
        key: &Key,
    ) -> impl Future<Output = Answer<()>> + Send + 'static {
        self.reset(Charges::stack(limits, key, 0))
    }

    /// Gives back `quantity` units of each of `limits` for `key`, admitted within `since`.
    fn refund(&self, limits: &[Limit], key: &Key, quantity: u64, since: Duration) {
        self.refund_told(limits, key, quantity, (since, &[]));
    }

    /// [`Self::refund`], told each limit's decision when the units were admitted.
    fn refund_told(
        &self,
        limits: &[Limit],
        key: &Key,
        quantity: u64,
        (since, admitted): (Duration, &[Decision]),
    ) {
        let charges = Charges::stack(limits, key, quantity);
        self.adjust(charges, Adjustment::Refund { since, admitted });
    }

    /// Settles a metered request: `deltas[i]` more (or fewer) units under `limits[i]`.
    fn settle(&self, limits: &[Limit], key: &Key, deltas: &[i64], since: Duration) {
        self.settle_told(limits, key, deltas, (since, &[]));
    }

    /// [`Self::settle`], told each limit's decision when the reservation was admitted.
    fn settle_told(
        &self,
        limits: &[Limit],
        key: &Key,
        deltas: &[i64],
        (since, admitted): (Duration, &[Decision]),
    ) {
        let charges = Charges::stack(limits, key, 0);
        let adjustment = Adjustment::Settle {
            deltas,
            since,
            admitted,
        };
        self.adjust(charges, adjustment);
    }

    /// Gives back a concurrency slot of `quantity` units, taken under `lease`.
    fn release(&self, limit: &Limit, key: &Key, quantity: u64, lease: u64) {
        self.adjust(
            Charges::one(limit, key, quantity),
            Adjustment::Release { lease },
        );
    }

    /// Whether the backend can enforce `limit` alone.
    fn validate_one(&self, limit: &Limit) -> Result<(), BuildError> {
        self.validate(std::slice::from_ref(limit), Uses::NOTHING_MORE)
    }

    /// Whether the backend can enforce `limits` as a stack on one key.
    fn validate_all(&self, limits: &[Limit]) -> Result<(), BuildError> {
        self.validate(limits, Uses::NOTHING_MORE)
    }

    /// Whether the backend gives units back (a GCRA limit, refunded).
    fn can_refund(&self) -> bool {
        let limit = Limit::new("refunded", Quota::per_second(1)).expect("a valid limit");
        self.validate(&[limit], Uses::NOTHING_MORE.refunds())
            .is_ok()
    }

    /// Whether the backend settles a metered cost (a GCRA limit, settled).
    fn can_settle(&self) -> bool {
        let limit = Limit::new("settled", Quota::per_second(1)).expect("a valid limit");
        self.validate(&[limit], Uses::NOTHING_MORE.settles())
            .is_ok()
    }
}

impl<B: Backend> Asks for B {}
