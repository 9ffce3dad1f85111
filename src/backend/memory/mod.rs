//! The in-memory backend: [`MemoryBackend`] hands each decision to one of two stores, the
//! [GCRA table](gcra_table) for a lone GCRA limit and the [general store](general) for the rest.
//! Why two, and how the cap evicts, is told on [`MemoryBackend`].

mod entries;
mod gcra_table;
mod general;
mod general_shard;
mod general_state;
mod keyed;
pub(crate) mod state_file;
mod tuning;

use std::future::{ready, Ready};
use std::slice;
use std::sync::Arc;

use crate::backend::api::Backend;
use crate::backend::charge::{Adjustment, Charges, Decisions, Uses};
use crate::backend::key_state::{KeyState, PeekFuture, ResetFuture};
use crate::clock::{Clock, QuantaClock};
use crate::decision::Decision;
use crate::error::{BackendError, BuildError};
use crate::gcra;
use crate::key::Key;
use crate::limit::{check_stack, Limit, MAX_STACKED_QUOTAS};
use crate::or_default::OrDefault;

use entries::PLACEHOLDER;
use gcra_table::GcraTable;
use general::GeneralStore;

/// The default cap on live keys.
const DEFAULT_MAX_KEYS: usize = 1_000_000;

/// The most shards a backend may have.
const MAX_SHARDS: usize = 1024;

/// The in-memory backend: one process, every [`Algorithm`](crate::Algorithm), bounded memory.
///
/// It keeps two stores. A lone GCRA limit (the common case) has a table of its own, described
/// first; everything else, described under **Other algorithms and stacks**, shares a general one.
/// [`len`](Self::len) counts the keys of both.
///
/// **The GCRA table.** Exact `CL.THROTTLE` decisions.
/// State is one 64-bit TAT per live key, in a map split into shards behind read-write locks. A
/// decision for a key already in the map takes its shard's read lock and updates the TAT with a
/// compare-and-swap, so decisions in one shard run in parallel; a new key takes the write lock for a
/// few dozen nanoseconds. It never waits on I/O. A key that many threads decide on at once (one
/// client or one NAT flooding a many-core server) moves out of its shard's map into a slot of its
/// own, where a decision takes no lock at all: only its TAT's compare-and-swap is shared between
/// the threads. Shards sit on cache lines of their own.
///
/// **Eviction and the cap** ([the guide](crate::guide::performance#the-in-memory-backend) says
/// more): a key whose TAT has passed is the same as a key never seen; each shard drops those that
/// refilled over a second ago (the grace keeps a returning client under the read lock) when it has
/// doubled in size since its last sweep, and at most once a second otherwise, during the calls that
/// use it: no background task. At [`max_keys`](MemoryBackendBuilder::max_keys) (default 1,000,000,
/// split over the shards) a full shard forgets about an eighth of its keys, those that used the
/// smallest share of their own limit's tolerance: a client being limited is forgotten last. An
/// entry is 16 bytes for an IPv4 key, 32 for IPv6, 40 for any other (whose bytes, at most 64, or a
/// longer key's SHA-256, are on the heap): about 36 MB a million IPv4 keys (`--bench footprint`).
///
/// **Other algorithms and stacks.** The [window algorithms](crate::window), the concurrency limit
/// and [stacks of limits](crate::backend::Charges::stack) (whose GCRA limits keep their TAT here,
/// apart from the same limits checked alone) live in a second map with as many shards, each behind
/// a mutex: one entry per key and stack (or lone limit), holding one state per limit, so that a
/// stack is decided under one lock and recorded only if every limit admits it. Windows are aligned
/// on Unix time ([`Clock::unix_origin_nanos`]), as in Redis. Memory per key, on 64-bit targets: an
/// 80-byte entry (plus hashbrown's control byte and spare capacity, and a byte-string key's own
/// bytes) holds the state of one limit in place; a stack keeps its states on the heap instead, 48
/// bytes per limit. The state itself is O(1) for the GCRA (a TAT), the fixed window (a window
/// number and a count), the sliding window (two counts) and the concurrency limit (a count); the
/// sliding log is O(`count`): 8 bytes per unit admitted within the last `period` (a `VecDeque`, so
/// up to twice that in spare capacity), never more than `count` of them.
///
/// Entries are dropped when their state expires (the end of the window that still counts, the
/// newest logged unit's `period`, the TAT), by the same sweeps as the GCRA table, and a concurrency
/// entry as soon as its last request is [released](crate::backend::Adjustment::Release). The
/// general map has a cap of `max_keys` entries of its own, and forgets as the GCRA table does, by
/// the share of its limit an entry uses (for a stack, its most used limit's): a client being
/// limited last, an entry with requests in flight never (a shard full of them grows past the cap).
///
/// Clones share the same state, so one backend can serve several layers.
///
/// ```
/// use std::time::Duration;
/// use tower_throttle::backend::Charges;
/// use tower_throttle::{Backend, Key, Limit, MemoryBackend, Quota};
/// use tower_throttle::clock::ManualClock;
///
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// let clock = ManualClock::new();
/// let backend = MemoryBackend::builder().clock(clock.clone()).build().unwrap();
/// let limit = Limit::new("api", Quota::per_second(2)).unwrap();
/// let key = Key::from("alice");
/// let alice = Charges::one(&limit, &key, 1);
/// assert!(backend.check(alice).await.unwrap()[0].allowed);
/// assert!(backend.check(alice).await.unwrap()[0].allowed);
/// let third = backend.check(alice).await.unwrap()[0];
/// assert!(!third.allowed);
/// assert_eq!(third.retry_after, Some(Duration::from_millis(500)));
/// clock.advance(Duration::from_millis(500));
/// assert!(backend.check(alice).await.unwrap()[0].allowed);
/// # });
/// ```
pub struct MemoryBackend<C = QuantaClock> {
    stores: Arc<SharedStores<C>>,
}

impl<C> Clone for MemoryBackend<C> {
    fn clone(&self) -> Self {
        MemoryBackend {
            stores: self.stores.clone(),
        }
    }
}

impl<C> std::fmt::Debug for MemoryBackend<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryBackend")
            .field("shards", &self.stores.gcra.shard_count())
            .field("max_keys_per_shard", &self.stores.gcra.shard_cap)
            .finish_non_exhaustive()
    }
}

/// What every clone of a backend shares: the clock and the two stores.
struct SharedStores<C> {
    clock: C,
    /// Lone GCRA limits.
    gcra: GcraTable,
    /// Every algorithm but a lone GCRA limit, and stacks of limits.
    general: GeneralStore,
}

impl MemoryBackend<QuantaClock> {
    /// A backend on the default clock ([`QuantaClock`]) with the default cap of 1,000,000 keys.
    pub fn new() -> Self {
        Self::builder()
            .build()
            .expect("the default configuration is valid")
    }

    /// A builder to set the cap and the clock (default [`QuantaClock`];
    /// [`SystemClock`](crate::clock::SystemClock) reads std's `Instant` instead).
    pub fn builder() -> MemoryBackendBuilder<QuantaClock> {
        MemoryBackendBuilder {
            // Made (and calibrated) by `build`, only if `clock` does not replace it.
            clock: OrDefault::Default(QuantaClock::new),
            max_keys: DEFAULT_MAX_KEYS,
            shards: None,
        }
    }
}

impl Default for MemoryBackend<QuantaClock> {
    fn default() -> Self {
        Self::new()
    }
}

/// Builds a [`MemoryBackend`].
#[derive(Debug)]
#[must_use]
pub struct MemoryBackendBuilder<C> {
    clock: OrDefault<C>,
    max_keys: usize,
    shards: Option<usize>,
}

impl<C: Clock> MemoryBackendBuilder<C> {
    /// The most keys held at once (default 1,000,000). See [`MemoryBackend`] for what happens at
    /// the cap.
    pub fn max_keys(mut self, max_keys: usize) -> Self {
        self.max_keys = max_keys;
        self
    }

    /// The number of shards: 1 to 1024 and at most `max_keys`, rounded down to a power of two
    /// (default: 16 per core, at least 64, and fewer when a shard would hold under 64 keys). Each
    /// shard holds at most `max_keys / shards` keys, and a full one forgets its least used eighth
    /// to take a new key: shards of a few keys each forget a limited key as soon as new keys
    /// land beside it.
    pub fn shards(mut self, shards: usize) -> Self {
        self.shards = Some(shards);
        self
    }

    /// The clock, such as a [`ManualClock`](crate::clock::ManualClock) in tests.
    pub fn clock<C2: Clock>(self, clock: C2) -> MemoryBackendBuilder<C2> {
        MemoryBackendBuilder {
            clock: OrDefault::Given(clock),
            max_keys: self.max_keys,
            shards: self.shards,
        }
    }

    /// Builds the backend, or explains why `max_keys` or `shards` is out of range.
    pub fn build(self) -> Result<MemoryBackend<C>, BuildError> {
        if self.max_keys == 0 {
            return Err(BuildError::Invalid(
                "memory backend max_keys must be at least 1".into(),
            ));
        }
        let shards = match self.shards {
            Some(n) if n == 0 || n > MAX_SHARDS || n > self.max_keys => {
                return Err(BuildError::Invalid(format!(
                    "memory backend shards must be between 1 and {MAX_SHARDS} and at most max_keys ({}), not {n}",
                    self.max_keys
                )))
            }
            Some(n) => n,
            None => default_shards(self.max_keys),
        };
        // Round down to a power of two, so that a shard is picked with a mask.
        let shards = 1usize << shards.ilog2();
        let shard_cap = self.max_keys / shards;
        Ok(MemoryBackend {
            stores: Arc::new(SharedStores {
                clock: self.clock.get(),
                gcra: GcraTable::new(shards, shard_cap),
                general: GeneralStore::new(shards, shard_cap),
            }),
        })
    }
}

/// 16 shards per core, so that the threads of a many-core server seldom meet in one shard's lock
/// when they insert keys (at least 64, as on a machine of up to 4 cores), and at least 64 keys a
/// shard, so that a small `max_keys` is not split into shards too small to rank keys in.
fn default_shards(max_keys: usize) -> usize {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    (cores * 16).clamp(64, MAX_SHARDS).min(max_keys / 64).max(1)
}

impl<C: Clock> MemoryBackend<C> {
    /// Decides synchronously; [`Backend::check`] wraps this in a ready future. Every algorithm is
    /// implemented, so this does not fail today; the `Result` leaves room for one that is not.
    // Inlined: a lone limit's check is the layer's commonest, and out of line it costs ~30
    // instructions a request.
    #[inline(always)]
    pub fn decide(
        &self,
        limit: &Limit,
        key: &Key,
        quantity: u64,
    ) -> Result<Decision, BackendError> {
        let stores = &*self.stores;
        Ok(match limit.gcra() {
            Some(params) => stores
                .gcra
                .decide(params, limit.id(), key, quantity, &stores.clock),
            None => stores
                .general
                .decide_alone(limit, key, quantity, &stores.clock),
        })
    }

    /// Decides `charges` together, synchronously ([`Backend::check`] wraps this in a ready future):
    /// the request passes only if every charge is admitted, and only then is it recorded by all of
    /// them. Returns one decision per charge, in order. When one limit rejects, the others that
    /// would have admitted report the state they keep (as a request of quantity 0 would).
    ///
    /// A lone charge is decided as [`decide`](Self::decide) does (a lone GCRA limit in the fast
    /// table). A stack on one key keeps its state apart from the lone limits, keyed by its first
    /// limit's name, the key, and each limit's position; its GCRA limits keep their TAT there too,
    /// and a metered stack's reservations are settled where they were taken. Charges with keys of
    /// their own keep each limit's state under its own key. Fails for what
    /// [`Backend::validate`] refuses.
    ///
    /// ```
    /// use tower_throttle::backend::Charges;
    /// use tower_throttle::{Key, Limit, MemoryBackend, Quota};
    ///
    /// let backend = MemoryBackend::new();
    /// let limits = [
    ///     Limit::new("user", Quota::per_minute(10)).unwrap(),
    ///     Limit::new("org", Quota::per_minute(1)).unwrap(),
    /// ];
    /// let keys = [Key::from("alice"), Key::from("acme")];
    /// let charges = Charges::keyed(&limits, &keys, 1);
    /// assert!(backend.decide_charges(charges).unwrap().iter().all(|d| d.allowed));
    /// // The organisation's limit refuses: alice's is not charged.
    /// let refused = backend.decide_charges(charges).unwrap();
    /// assert!(!refused[1].allowed);
    /// assert_eq!(backend.peek_now(charges).unwrap()[0].remaining, 9);
    /// ```
    #[inline(always)]
    pub fn decide_charges(&self, charges: Charges<'_>) -> Result<Decisions, BackendError> {
        let limits = charges.limits();
        match (charges.same_key(), charges.same_quantity()) {
            (Some(key), Some(quantity)) => match limits {
                [one] => self.decide(one, key, quantity).map(Decisions::One),
                // More limits than a stack holds fail `check_stack` before the quantities count.
                all => {
                    let quantities = [quantity; MAX_STACKED_QUOTAS];
                    let quantities = quantities.get(..all.len()).unwrap_or(&quantities);
                    self.decide_each(all, key, quantities).map(Decisions::Many)
                }
            },
            (Some(key), None) => {
                let quantities = charges.quantities().unwrap_or_default();
                self.decide_each(limits, key, quantities)
                    .map(Decisions::Many)
            }
            (None, Some(quantity)) => {
                let keys = charges.keys().unwrap_or_default();
                check_keyed_stack(limits, keys)?;
                let (general, clock) = (&self.stores.general, &self.stores.clock);
                Ok(Decisions::Many(
                    general.decide_keyed(limits, keys, quantity, clock),
                ))
            }
            (None, None) => Err(BackendError::new(
                "charges with keys of their own take one quantity",
            )),
        }
    }

    /// A stack with a quantity per limit (`quantities[i]` under `limits[i]`), on one key.
    fn decide_each(
        &self,
        limits: &[Limit],
        key: &Key,
        quantities: &[u64],
    ) -> Result<Vec<Decision>, BackendError> {
        check_stack(limits).map_err(BackendError::new)?;
        if quantities.len() != limits.len() {
            return Err(BackendError::new(format!(
                "{} quantities for {} limits",
                quantities.len(),
                limits.len()
            )));
        }
        if let [limit] = limits {
            return Ok(vec![self.decide(limit, key, quantities[0])?]);
        }
        let (stores, mut out) = (&*self.stores, vec![PLACEHOLDER; limits.len()]);
        (stores.general).decide(limits, key, quantities, &stores.clock, &mut out);
        Ok(out)
    }

    /// The state of each charge's key under its limit (one limit, a stack on one key, or limits
    /// with keys of their own, as [`decide_charges`](Self::decide_charges) keeps them),
    /// synchronously, without consuming or writing anything ([`Backend::peek`] wraps this in a
    /// ready future). Bans are not the backend's: the layer's penalty box keeps them.
    ///
    /// ```
    /// use tower_throttle::backend::Charges;
    /// use tower_throttle::{Key, Limit, MemoryBackend, Quota};
    ///
    /// let backend = MemoryBackend::new();
    /// let limit = Limit::new("api", Quota::per_minute(3)).unwrap();
    /// let key = Key::from("alice");
    /// backend.decide(&limit, &key, 1).unwrap();
    /// let alice = Charges::one(&limit, &key, 1);
    /// let state = backend.peek_now(alice).unwrap()[0];
    /// assert_eq!((state.limit, state.remaining, state.retry_after), (3, 2, None));
    /// assert_eq!(backend.peek_now(alice).unwrap()[0].remaining, 2); // nothing consumed
    /// backend.reset_now(alice).unwrap();
    /// assert_eq!(backend.peek_now(alice).unwrap()[0].remaining, 3);
    /// ```
    pub fn peek_now(&self, charges: Charges<'_>) -> Result<Vec<KeyState>, BackendError> {
        let (limits, stores) = (charges.limits(), &*self.stores);
        let Some(key) = charges.same_key() else {
            // Each limit's state under its own key, as `decide_keyed` keeps it.
            let keys = charges.keys().unwrap_or_default();
            check_keyed_stack(limits, keys)?;
            let one = |(limit, key)| {
                stores
                    .general
                    .peek(slice::from_ref(limit), key, &stores.clock)
            };
            let states = limits.iter().zip(keys).flat_map(one);
            return Ok(states
                .map(|(now, next)| KeyState::from_decisions(&now, &next))
                .collect());
        };
        check_one_or_stack(limits)?;
        let decisions = match (limits, limits[0].gcra()) {
            ([limit], Some(params)) => {
                vec![stores.gcra.peek(params, limit.id(), key, &stores.clock)]
            }
            _ => stores.general.peek(limits, key, &stores.clock),
        };
        Ok(decisions
            .iter()
            .map(|(now, next)| KeyState::from_decisions(now, next))
            .collect())
    }

    /// Forgets the state of each charge's key under its limit, as kept for such charges,
    /// synchronously ([`Backend::reset`] wraps this in a ready future).
    pub fn reset_now(&self, charges: Charges<'_>) -> Result<(), BackendError> {
        let (limits, stores) = (charges.limits(), &*self.stores);
        let Some(key) = charges.same_key() else {
            let keys = charges.keys().unwrap_or_default();
            check_keyed_stack(limits, keys)?;
            for (limit, key) in limits.iter().zip(keys) {
                stores.general.forget(slice::from_ref(limit), key);
            }
            return Ok(());
        };
        check_one_or_stack(limits)?;
        match (limits, limits[0].gcra()) {
            ([limit], Some(_)) => stores.gcra.forget(limit.id(), key),
            _ => stores.general.forget(limits, key),
        }
        Ok(())
    }

    /// How many keys are live in both stores (including keys that have expired but were not swept
    /// yet). A stack of limits on one key counts once.
    pub fn len(&self) -> usize {
        self.stores.gcra.len() + self.stores.general.len()
    }

    /// Whether no key is live.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Drops every key whose state has expired now. Never needed for correctness or memory bounds
    /// (shards sweep themselves as they are used); useful before measuring [`len`](Self::len).
    pub fn sweep(&self) {
        let now = self.stores.clock.now_nanos();
        self.stores.gcra.sweep(now);
        self.stores.general.sweep(now);
    }
}

/// Limits with a key each: as a stack, and one key per limit.
fn check_keyed_stack(limits: &[Limit], keys: &[Key]) -> Result<(), BackendError> {
    if limits.is_empty() || keys.len() != limits.len() {
        return Err(BackendError::new(format!(
            "{} keys for {} limits",
            keys.len(),
            limits.len()
        )));
    }
    check_stack(limits).map_err(BackendError::new)?;
    // Two charges of one (limit, key) would each be decided on the state the other changes: not
    // all or nothing.
    let pairs = || limits.iter().map(Limit::id).zip(keys);
    if pairs()
        .enumerate()
        .any(|(i, pair)| pairs().skip(i + 1).any(|other| other == pair))
    {
        return Err(BackendError::new("two charges name one limit and key"));
    }
    Ok(())
}

/// One limit of any algorithm, or a stack that [`check_stack`] accepts.
fn check_one_or_stack(limits: &[Limit]) -> Result<(), BackendError> {
    match limits {
        [_] => Ok(()),
        stack => check_stack(stack).map_err(BackendError::new),
    }
}

impl<C: Clock> Backend for MemoryBackend<C> {
    type Future = Ready<Result<Decisions, BackendError>>;

    // Always inlined: the layer polls it at once, and out of line it costs ~70 instructions a
    // request (callgrind, `scripts/profile_pass.sh`).
    #[inline(always)]
    fn check(&self, charges: Charges<'_>) -> Self::Future {
        ready(self.decide_charges(charges))
    }

    /// Every algorithm, shape of charges, refund and settlement is implemented: only the stack
    /// rule ([`MAX_STACKED_QUOTAS`](crate::policy::MAX_STACKED_QUOTAS)) applies.
    fn validate(&self, limits: &[Limit], _uses: Uses) -> Result<(), BuildError> {
        check_one_or_stack(limits).map_err(|e| BuildError::Invalid(e.to_string()))
    }

    // Refunds and settlements go where `decide_charges` keeps the state: a lone GCRA limit in the
    // GCRA table, everything else (stacks included) in the general store; a slot back to the
    // general store, which counts slots per key under one lease a key (new after a reset).
    fn adjust(&self, charges: Charges<'_>, adjustment: Adjustment<'_>) {
        let stores = &*self.stores;
        let limits = charges.limits();
        let Some(key) = charges.same_key() else {
            return; // Quotas with keys of their own are neither refunded nor settled.
        };
        let nanos =
            |since: std::time::Duration| u64::try_from(since.as_nanos()).unwrap_or(u64::MAX);
        match adjustment {
            Adjustment::Release { lease } => {
                for (i, limit) in limits.iter().enumerate() {
                    stores
                        .general
                        .release(limit, key, charges.quantity(i), lease);
                }
            }
            // A settlement of `-quantity` under every limit, as on Redis.
            Adjustment::Refund { since, admitted } => {
                let back = i64::try_from(charges.quantity(0)).map_or(i64::MIN, |q| -q);
                let deltas = [back; MAX_STACKED_QUOTAS];
                let deltas = deltas.get(..limits.len()).unwrap_or(&[]);
                self.adjust(
                    charges,
                    Adjustment::Settle {
                        deltas,
                        since,
                        admitted,
                    },
                );
            }
            Adjustment::Settle {
                deltas,
                since,
                admitted,
            } => {
                if limits.is_empty()
                    || deltas.len() != limits.len()
                    || deltas.iter().all(|d| *d == 0)
                {
                    return;
                }
                match (limits, limits[0].gcra()) {
                    // A give-back moves the TAT back by as many emission intervals less the time
                    // they may have drained (a later request that found the bucket idle,
                    // `max(tat, now)`, absorbed it): less, never more, than the request took
                    // (and with no decision since, exactly).
                    ([limit], Some(params)) => {
                        let units = deltas[0].unsigned_abs();
                        let reset = admitted.first().map(|d| d.reset_after);
                        let since = match deltas[0] < 0 {
                            true => gcra::drain_bound(nanos(since), reset, units, params),
                            false => nanos(since),
                        };
                        let (gcra, clock) = (&stores.gcra, &stores.clock);
                        gcra.settle(params, limit.id(), key, deltas[0], since, clock);
                    }
                    _ => stores.general.settle(
                        limits,
                        key,
                        deltas,
                        (nanos(since), admitted),
                        &stores.clock,
                    ),
                }
            }
        }
    }

    fn peek(&self, charges: Charges<'_>) -> PeekFuture {
        Box::pin(ready(self.peek_now(charges)))
    }

    fn reset(&self, charges: Charges<'_>) -> ResetFuture {
        Box::pin(ready(self.reset_now(charges)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    /// A clock that reads the given times in turn (the last one from then on), as an unfenced TSC
    /// may read a little behind another thread.
    struct Readings(std::sync::Mutex<Vec<u64>>);

    impl Clock for Readings {
        fn now_nanos(&self) -> u64 {
            let mut times = self.0.lock().unwrap();
            if times.len() > 1 {
                times.remove(0)
            } else {
                times[0]
            }
        }
    }

    /// Charges naming one (limit, key) twice are refused whole: decided apart, the second could
    /// refuse after the first was recorded.
    #[test]
    fn charges_naming_one_limit_and_key_twice_are_an_error() {
        let backend = MemoryBackend::new();
        let limit = Limit::new("once", crate::quota::Quota::per_minute(1)).unwrap();
        let (limits, keys) = (
            [limit.clone(), limit.clone()],
            [Key::from("k"), Key::from("k")],
        );
        let error = backend
            .decide_charges(Charges::keyed(&limits, &keys, 1))
            .unwrap_err();
        assert!(error.to_string().contains("one limit and key"), "{error}");
        assert!(
            backend.decide(&limit, &Key::from("k"), 1).unwrap().allowed,
            "nothing taken"
        );
    }

    #[test]
    fn a_window_is_never_decided_before_a_time_its_shard_used() {
        let s = 1_000_000_000;
        // One request a second per fixed window; the second reading is 2 ns behind the first,
        // across the boundary at 1 s.
        let clock = Readings(std::sync::Mutex::new(vec![s + 1, s - 1]));
        let backend = MemoryBackend::builder().clock(clock).build().unwrap();
        let limit = Limit::with_algorithm(
            "w",
            crate::limit::Algorithm::FixedWindow,
            crate::quota::Quota::per_second(1),
        )
        .unwrap();
        let key = Key::from("k");
        assert!(backend.decide(&limit, &key, 1).unwrap().allowed);
        assert!(
            !backend.decide(&limit, &key, 1).unwrap().allowed,
            "decided in the window before, it would have been admitted"
        );
    }

    #[test]
    fn the_same_address_as_bytes_and_as_ip_are_different_keys() {
        let backend = MemoryBackend::builder()
            .clock(crate::clock::ManualClock::new())
            .build()
            .unwrap();
        let limit = Limit::new("t", crate::quota::Quota::per_minute(1)).unwrap();
        let ip = Key::from(Ipv4Addr::new(192, 0, 2, 7));
        let bytes = Key::from(&[192, 0, 2, 7][..]);
        assert!(backend.decide(&limit, &ip, 1).unwrap().allowed);
        assert!(backend.decide(&limit, &bytes, 1).unwrap().allowed);
        assert!(!backend.decide(&limit, &ip, 1).unwrap().allowed);
        assert!(!backend.decide(&limit, &bytes, 1).unwrap().allowed);
        assert_eq!(backend.len(), 2);
    }
}
