//! What a request asks of a backend ([`Charges`]) and what comes back ([`Decisions`]). A lone
//! limit, a stack of quotas, keys apart and a metered estimate are all lists of charges: the
//! backend tells them apart by what the list holds, not by a method of its own.

use std::ops::Deref;
use std::time::Duration;

use crate::decision::Decision;
use crate::key::Key;
use crate::limit::{Limit, MAX_STACKED_QUOTAS};

/// The charges a request makes, decided together and atomically by
/// [`Backend::check`](crate::Backend::check): the request passes only if every charge is
/// admitted, and then every one is recorded; a refusal by one records nothing in any.
///
/// Charge `i` counts [`quantity(i)`](Self::quantity) units against [`limits()[i]`](Self::limits)
/// under [`key(i)`](Self::key). Most requests make one charge; a stack of quotas (10 a second and
/// 1,000 a day) makes one per quota on one key, which a backend may keep apart from the same limits
/// checked alone; quotas with keys of their own (per user and per organisation) make one per quota
/// on each quota's key; a metered limit reserves its estimate beside the request's cost. The
/// list borrows what the caller holds: building it allocates nothing.
///
/// ```
/// use tower_throttle::backend::Charges;
/// use tower_throttle::{Key, Limit, Quota};
///
/// let stack = [
///     Limit::new("second", Quota::per_second(10)).unwrap(),
///     Limit::new("day", Quota::per_day(1000)).unwrap(),
/// ];
/// let key = Key::from("alice");
/// let charges = Charges::stack(&stack, &key, 1);
/// assert_eq!(charges.limits().len(), 2);
/// assert_eq!((charges.key(1), charges.quantity(1)), (Some(&key), 1));
/// assert_eq!(charges.key(2), None);
///
/// let tokens = [3, 250];
/// let metered = charges.with_quantities(&tokens);
/// assert_eq!(metered.quantity(1), 250);
/// assert_eq!(metered.same_quantity(), None);
/// ```
#[derive(Clone, Copy, Debug)]
pub struct Charges<'a> {
    limits: &'a [Limit],
    keys: Keys<'a>,
    quantities: Quantities<'a>,
}

/// One key for every charge, or one each.
#[derive(Clone, Copy, Debug)]
enum Keys<'a> {
    Same(&'a Key),
    Each(&'a [Key]),
}

/// One quantity for every charge, or one each.
#[derive(Clone, Copy, Debug)]
enum Quantities<'a> {
    Same(u64),
    Each(&'a [u64]),
}

impl<'a> Charges<'a> {
    /// One charge: `quantity` units against `limit` under `key`.
    #[inline]
    pub fn one(limit: &'a Limit, key: &'a Key, quantity: u64) -> Self {
        Self::stack(std::slice::from_ref(limit), key, quantity)
    }

    /// A charge of `quantity` units against each of `limits`, all under `key` (a stack of quotas).
    #[inline]
    pub const fn stack(limits: &'a [Limit], key: &'a Key, quantity: u64) -> Self {
        Charges {
            limits,
            keys: Keys::Same(key),
            quantities: Quantities::Same(quantity),
        }
    }

    /// A charge of `quantity` units against each of `limits`, `limits[i]` under `keys[i]` (quotas
    /// with keys of their own). A backend refuses a list whose keys and limits differ in number.
    #[inline]
    pub const fn keyed(limits: &'a [Limit], keys: &'a [Key], quantity: u64) -> Self {
        Charges {
            limits,
            keys: Keys::Each(keys),
            quantities: Quantities::Same(quantity),
        }
    }

    /// The same charges, `quantities[i]` units against `limits()[i]` (a metered limit's estimate
    /// beside the request's cost). A backend refuses a list whose quantities and limits differ in
    /// number.
    #[inline]
    pub const fn with_quantities(self, quantities: &'a [u64]) -> Self {
        Charges {
            quantities: Quantities::Each(quantities),
            ..self
        }
    }

    /// The limits charged, in order.
    #[inline]
    pub const fn limits(&self) -> &'a [Limit] {
        self.limits
    }

    /// The key of charge `i`; `None` past the keys given.
    pub fn key(&self, i: usize) -> Option<&'a Key> {
        match self.keys {
            Keys::Same(key) => (i < self.limits.len()).then_some(key),
            Keys::Each(keys) => keys.get(i),
        }
    }

    /// The quantity of charge `i` (0 past the quantities given).
    pub fn quantity(&self, i: usize) -> u64 {
        match self.quantities {
            Quantities::Same(quantity) => quantity,
            Quantities::Each(quantities) => quantities.get(i).copied().unwrap_or(0),
        }
    }

    /// The one key every charge is under, or `None` when the charges have keys of their own.
    #[inline]
    pub const fn same_key(&self) -> Option<&'a Key> {
        match self.keys {
            Keys::Same(key) => Some(key),
            Keys::Each(_) => None,
        }
    }

    /// The keys of the charges, one each, when they were given one each.
    pub const fn keys(&self) -> Option<&'a [Key]> {
        match self.keys {
            Keys::Same(_) => None,
            Keys::Each(keys) => Some(keys),
        }
    }

    /// The one quantity every charge counts, or `None` when they were given one each.
    #[inline]
    pub const fn same_quantity(&self) -> Option<u64> {
        match self.quantities {
            Quantities::Same(quantity) => Some(quantity),
            Quantities::Each(_) => None,
        }
    }

    /// The quantities of the charges, one each, when they were given one each.
    pub const fn quantities(&self) -> Option<&'a [u64]> {
        match self.quantities {
            Quantities::Same(_) => None,
            Quantities::Each(quantities) => Some(quantities),
        }
    }
}

/// One decision per charge, in the order of the [`Charges`] decided: what
/// [`Backend::check`](crate::Backend::check) answers. One charge's answer is held in place (no
/// allocation on the commonest path); it reads as a slice either way.
///
/// ```
/// use std::time::Duration;
/// use tower_throttle::backend::Decisions;
/// use tower_throttle::Decision;
///
/// let one = Decisions::One(Decision::allowed(10, 9, Duration::from_secs(1)));
/// assert_eq!(one.len(), 1);
/// assert!(one[0].allowed);
/// assert!(one.combined().unwrap().allowed);
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decisions {
    /// The decision of a lone charge.
    One(Decision),
    /// The decisions of several charges (or of one, where the backend answered it as a list).
    Many(Vec<Decision>),
}

impl Decisions {
    /// The charges' decisions taken together ([`Decision::combine`]); `None` for none.
    pub fn combined(&self) -> Option<Decision> {
        match self {
            Decisions::One(decision) => Some(*decision),
            Decisions::Many(all) => Decision::combine(all),
        }
    }

    /// The decisions as a vector.
    pub fn into_vec(self) -> Vec<Decision> {
        match self {
            Decisions::One(decision) => vec![decision],
            Decisions::Many(all) => all,
        }
    }
}

impl Deref for Decisions {
    type Target = [Decision];

    fn deref(&self) -> &[Decision] {
        match self {
            Decisions::One(decision) => std::slice::from_ref(decision),
            Decisions::Many(all) => all,
        }
    }
}

/// Adjusts, after its response, what an admitted request was charged: gives it back (`None`: the
/// response does not count) or settles each charge's delta (`Some`: a metered cost), `since`
/// bounding the time since the admission. Made by the engine, which knows where the units were
/// taken (the backend, or the local limiter in its stead); called by the feature that decides.
pub(crate) type AdjustLater =
    Box<dyn FnOnce(Option<&[i64; MAX_STACKED_QUOTAS]>, Duration) + Send + Sync>;

/// Added to the time measured since the backend was asked, so that `since` bounds the time between
/// the admission and the backend reading its clock for the adjustment, a moment after the measure
/// (the Redis backend adds its timeout too: the network may hold a call that long). Too much only
/// gives back less; too little could give back a unit of a window that has ended.
pub(crate) const CLOCK_MARGIN: Duration = Duration::from_millis(10);

/// What changes charges already admitted, after the response
/// ([`Backend::adjust`](crate::Backend::adjust)): never refused, never blocking.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Adjustment<'a> {
    /// Gives back each charge's quantity: the response does not count
    /// ([`PolicyBuilder::count_only`](crate::PolicyBuilder::count_only)). `since` bounds the time
    /// since the backend admitted the request, so a refund may give back less, never more: the
    /// state becomes at most what it would be had the request never come. Per algorithm: the GCRA
    /// moves the TAT back by the quantity's emission intervals less `since`; the fixed window takes
    /// the units out of the window that admitted them if it is still the current one (known only
    /// when `now - since` falls in it too); the sliding window out of the window that admitted
    /// them (or, within `since` of a boundary, the one before); the sliding log removes units
    /// logged at the admission or after the earliest time it may have been, the oldest first, and
    /// nothing once `since` reaches its period (the request's own have left the log: what is there
    /// is later requests'). A concurrency limit has nothing to refund
    /// ([`Release`](Adjustment::Release) gives its slot back). A stack's refund comes while any of
    /// its limits may hold the units, so each limit bounds its own give-back by `since`.
    ///
    /// Told the decisions, a GCRA gives back more: while the key stayed busy without the request's
    /// units (its decision's `reset_after` less those units' emission intervals), none of them can
    /// have drained, so only `since` beyond that is taken off. A key near its limit gets its units
    /// back whole, however short its emission interval and however long the response took. What
    /// else moves the key's state is not seen: after a reset or an eviction of the key, another
    /// request's give-back, or a metered charge clipped at its debt cap, a give-back may return
    /// what the key no longer held (at most `since`'s worth more than untold).
    Refund {
        /// An upper bound on the time since the admission.
        since: Duration,
        /// Each charge's decision when it was admitted, or empty if not known.
        admitted: &'a [Decision],
    },
    /// Settles what a metered request really cost: `deltas[i]` is the actual cost less the
    /// reservation under charge `i` (0: nothing to do). A positive delta charges that many more
    /// units with no admission test (for the GCRA the TAT moves on, from now if the key was idle,
    /// by at most [`max_debt`](Limit::max_debt) units past the burst: the key is in debt); a
    /// negative one gives units back as [`Refund`](Adjustment::Refund) does.
    Settle {
        /// Actual cost less reservation, per charge.
        deltas: &'a [i64],
        /// An upper bound on the time since the admission.
        since: Duration,
        /// Each charge's decision when it was admitted, or empty if not known.
        admitted: &'a [Decision],
    },
    /// Gives back the slot a request admitted under a
    /// [concurrency](crate::Algorithm::Concurrency) limit holds, once its response has been sent,
    /// failed or been dropped; `lease` is the decision's [`lease`](Decision::lease) (0 if none).
    /// A request whose check was dropped before it completed never learns whether it took a slot:
    /// a backend that decides asynchronously must let such slots expire (the Redis backend's
    /// leases do).
    Release {
        /// The decision's lease token.
        lease: u64,
    },
}

/// What a layer will ask of a backend for a policy, beyond one charge decided alone: told to
/// [`Backend::validate`](crate::Backend::validate) when the layer is built, so that what a backend
/// cannot do is an error at start-up, not at the first request.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Uses {
    /// The charges have keys of their own ([`Charges::keyed`]).
    pub keys_apart: bool,
    /// The charges have quantities of their own ([`Charges::with_quantities`]) and are
    /// [settled](Adjustment::Settle) after the response.
    pub settles: bool,
    /// Admitted charges are [refunded](Adjustment::Refund) when the response does not count.
    pub refunds: bool,
}

impl Uses {
    /// One charge per limit under one key, neither refunded nor settled.
    pub const NOTHING_MORE: Uses = Uses {
        keys_apart: false,
        settles: false,
        refunds: false,
    };

    /// The same, with keys of their own for the charges.
    pub const fn keys_apart(self) -> Self {
        Uses {
            keys_apart: true,
            ..self
        }
    }

    /// The same, with quantities of their own, settled after the response.
    pub const fn settles(self) -> Self {
        Uses {
            settles: true,
            ..self
        }
    }

    /// The same, refunded when the response does not count.
    pub const fn refunds(self) -> Self {
        Uses {
            refunds: true,
            ..self
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quota::Quota;

    fn limits() -> [Limit; 3] {
        ["second", "minute", "day"].map(|name| Limit::new(name, Quota::per_second(5)).unwrap())
    }

    fn names(charges: &Charges<'_>) -> Vec<String> {
        charges
            .limits()
            .iter()
            .map(|l| l.name().to_owned())
            .collect()
    }

    #[test]
    fn one_and_a_stack_charge_one_key_one_quantity() {
        let limits = limits();
        let alice = Key::from("alice");
        let one = Charges::one(&limits[1], &alice, 3);
        assert_eq!(names(&one), ["minute"]);
        assert_eq!((one.key(0), one.quantity(0)), (Some(&alice), 3));
        // Past the charges: no key.
        assert_eq!(one.key(1), None);
        let stack = Charges::stack(&limits, &alice, 2);
        assert_eq!(names(&stack), ["second", "minute", "day"]);
        assert_eq!((stack.key(2), stack.quantity(2)), (Some(&alice), 2));
        assert_eq!(stack.key(3), None);
        assert_eq!(stack.same_key(), Some(&alice));
        assert_eq!(stack.keys(), None);
        assert_eq!(stack.same_quantity(), Some(2));
        assert_eq!(stack.quantities(), None);
        let none = Charges::stack(&[], &alice, 1);
        assert_eq!((none.limits().len(), none.key(0)), (0, None));
    }

    #[test]
    fn keyed_charges_have_a_key_each_and_metered_ones_a_quantity_each() {
        let limits = limits();
        let keys = [Key::from("user"), Key::from("org")];
        let keyed = Charges::keyed(&limits[..2], &keys, 4);
        assert_eq!(keyed.same_key(), None);
        assert_eq!(keyed.keys(), Some(&keys[..]));
        assert_eq!(
            (keyed.key(0), keyed.key(1)),
            (Some(&keys[0]), Some(&keys[1]))
        );
        // Fewer keys than limits: none past the keys given.
        let short = Charges::keyed(&limits, &keys, 4);
        assert_eq!(short.key(2), None);
        assert_eq!(keyed.quantity(1), 4);
        let tokens = [1, 250];
        let metered = keyed.with_quantities(&tokens);
        assert_eq!((metered.quantity(0), metered.quantity(1)), (1, 250));
        // Past the quantities given: nothing.
        assert_eq!(metered.quantity(2), 0);
        assert_eq!(metered.same_quantity(), None);
        assert_eq!(metered.quantities(), Some(&tokens[..]));
        assert_eq!(metered.keys(), Some(&keys[..]));
        assert_eq!(names(&metered), ["second", "minute"]);
    }

    #[test]
    fn decisions_read_as_a_slice_and_combine() {
        let second = Duration::from_secs(1);
        let admitted = Decision::allowed(10, 9, second);
        let refused = Decision::limited(5, 0, Some(Duration::from_secs(3)), Duration::from_secs(4));
        let one = Decisions::One(admitted);
        assert_eq!(&*one, &[admitted]);
        assert_eq!(one.combined(), Some(admitted));
        assert_eq!(one.clone().into_vec(), [admitted]);
        let many = Decisions::Many(vec![admitted, refused]);
        assert_eq!(&*many, &[admitted, refused]);
        let both = many.combined().unwrap();
        assert!(!both.allowed);
        assert_eq!(both.retry_after, Some(Duration::from_secs(3)));
        assert_eq!(many.into_vec(), [admitted, refused]);
        assert_eq!(Decisions::Many(Vec::new()).combined(), None);
    }

    #[test]
    fn uses_say_each_thing_asked_beyond_one_charge() {
        let nothing = Uses::NOTHING_MORE;
        assert_eq!(nothing, Uses::default());
        let keys = nothing.keys_apart();
        assert!(keys.keys_apart && !keys.settles && !keys.refunds);
        let settles = keys.settles();
        assert!(settles.keys_apart && settles.settles && !settles.refunds);
        let all = settles.refunds();
        assert!(all.keys_apart && all.settles && all.refunds);
        assert!(nothing.refunds().refunds && !nothing.refunds().keys_apart);
    }
}
