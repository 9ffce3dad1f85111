use std::future::{ready, Ready};
use std::hash::BuildHasher;
use std::sync::{Arc, Mutex};

use hashbrown::HashTable;

use crate::clock::{Clock, SystemClock};
use crate::{gcra, Backend, BackendError, BuildError, Decision, Key, Limit};

/// How often (at most) a shard drops keys that have refilled completely, when it is in use.
const SWEEP_INTERVAL_NANOS: u64 = 1_000_000_000;

/// The default cap on live keys.
const DEFAULT_MAX_KEYS: usize = 1_000_000;

/// The in-memory GCRA backend: one process, exact `CL.THROTTLE` decisions, bounded memory.
///
/// State is one 64-bit TAT per live key, in a map split into mutex-guarded shards. A decision
/// locks one shard for a few dozen nanoseconds; it never waits on I/O.
///
/// **Eviction.** A key whose TAT has passed is indistinguishable from a key never seen, so dropping it
/// loses nothing. Each shard drops such keys when it has doubled in size since the last sweep, and
/// at most once a second otherwise, during the calls that use it: no background task, nothing to call.
/// The cost is amortized O(1) per decision.
///
/// **The cap.** At most [`max_keys`](MemoryBackendBuilder::max_keys) keys are live (default 1,000,000,
/// split evenly across the shards). When a shard is full of keys that have not refilled yet (many
/// distinct clients within one refill period, such as an attack from rotating addresses), it forgets
/// about an eighth of its keys: those that have used the smallest share of their own limit's tolerance
/// (the closest to fully refilled, whatever the limit's period). They start again with a full burst.
/// A client being limited has used all of its tolerance, so it is forgotten last: an attacker rotating
/// through fresh keys cannot reset it without spending each key's whole limit.
/// Memory is therefore bounded by the cap: each key is one 40-byte table entry (plus hashbrown's
/// control byte and spare capacity), and a byte-string key also owns its bytes on the heap (at most 64;
/// longer keys are stored as a 32-byte SHA-256 digest). IP keys own nothing beyond the entry.
///
/// Clones share the same state, so one backend can serve several layers.
///
/// ```
/// use std::time::Duration;
/// use tower_throttle::{Backend, Key, Limit, MemoryBackend, Quota};
/// use tower_throttle::clock::ManualClock;
///
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// let clock = ManualClock::new();
/// let backend = MemoryBackend::builder().clock(clock.clone()).build().unwrap();
/// let limit = Limit::new("api", Quota::per_second(2)).unwrap();
/// let key = Key::from("alice");
/// assert!(backend.check(&limit, &key, 1).await.unwrap().allowed);
/// assert!(backend.check(&limit, &key, 1).await.unwrap().allowed);
/// let third = backend.check(&limit, &key, 1).await.unwrap();
/// assert!(!third.allowed);
/// assert_eq!(third.retry_after, Some(Duration::from_millis(500)));
/// clock.advance(Duration::from_millis(500));
/// assert!(backend.check(&limit, &key, 1).await.unwrap().allowed);
/// # });
/// ```
pub struct MemoryBackend<C = SystemClock> {
    inner: Arc<Inner<C>>,
}

impl<C> Clone for MemoryBackend<C> {
    fn clone(&self) -> Self {
        MemoryBackend {
            inner: self.inner.clone(),
        }
    }
}

impl<C> std::fmt::Debug for MemoryBackend<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryBackend")
            .field("shards", &self.inner.shards.len())
            .field("max_keys_per_shard", &self.inner.shard_cap)
            .finish_non_exhaustive()
    }
}

struct Inner<C> {
    clock: C,
    hasher: foldhash::fast::RandomState,
    shards: Box<[Mutex<Shard>]>,
    shard_cap: usize,
}

struct Entry {
    limit: u32,
    /// The limit's tolerance in nanoseconds, to rank keys of different limits at the cap. An `f32`
    /// fits in the padding next to `limit`, so the entry stays 40 bytes.
    tolerance: f32,
    tat: u64,
    key: Key,
}

impl Entry {
    /// How much of its tolerance the key has used: near 0 = almost fully refilled, 1 = just limited.
    fn used(&self, now: u64) -> f32 {
        self.tat.saturating_sub(now) as f32 / self.tolerance
    }
}

struct Shard {
    table: HashTable<Entry>,
    /// Sweep expired keys when the table reaches this many entries...
    sweep_at_len: usize,
    /// ...or when the clock reaches this time.
    sweep_at_time: u64,
}

/// The most shards a backend may have.
const MAX_SHARDS: usize = 1024;

impl MemoryBackend<SystemClock> {
    /// A backend on the system clock with the default cap of 1,000,000 keys.
    pub fn new() -> Self {
        Self::builder()
            .build()
            .expect("the default configuration is valid")
    }

    /// A builder to set the cap and the clock.
    pub fn builder() -> MemoryBackendBuilder<SystemClock> {
        MemoryBackendBuilder {
            clock: SystemClock::new(),
            max_keys: DEFAULT_MAX_KEYS,
            shards: None,
        }
    }
}

impl Default for MemoryBackend<SystemClock> {
    fn default() -> Self {
        Self::new()
    }
}

/// Builds a [`MemoryBackend`].
#[derive(Debug)]
#[must_use]
pub struct MemoryBackendBuilder<C> {
    clock: C,
    max_keys: usize,
    shards: Option<usize>,
}

impl<C: Clock> MemoryBackendBuilder<C> {
    /// The most keys held at once (default 1,000,000). See [`MemoryBackend`] for what happens at the cap.
    pub fn max_keys(mut self, max_keys: usize) -> Self {
        self.max_keys = max_keys;
        self
    }

    /// The number of shards: 1 to 1024 and at most `max_keys`, rounded down to a power of two
    /// (default: 64, or fewer so that each shard holds at least 64 keys). Each shard holds at most
    /// `max_keys / shards` keys.
    pub fn shards(mut self, shards: usize) -> Self {
        self.shards = Some(shards);
        self
    }

    /// The clock, such as a [`ManualClock`](crate::clock::ManualClock) in tests.
    pub fn clock<C2: Clock>(self, clock: C2) -> MemoryBackendBuilder<C2> {
        MemoryBackendBuilder {
            clock,
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
            None => (self.max_keys / 64).clamp(1, 64),
        };
        // Round down to a power of two, so that a shard is picked with a mask.
        let shards = 1usize << shards.ilog2();
        let shard_cap = self.max_keys / shards;
        let shards = (0..shards)
            .map(|_| {
                Mutex::new(Shard {
                    table: HashTable::new(),
                    sweep_at_len: 64,
                    sweep_at_time: 0,
                })
            })
            .collect();
        Ok(MemoryBackend {
            inner: Arc::new(Inner {
                clock: self.clock,
                hasher: foldhash::fast::RandomState::default(),
                shards,
                shard_cap,
            }),
        })
    }
}

impl<C: Clock> MemoryBackend<C> {
    /// Decides synchronously; [`Backend::check`] wraps this in a ready future. Fails only for an
    /// algorithm this backend does not implement.
    pub fn decide(
        &self,
        limit: &Limit,
        key: &Key,
        quantity: u64,
    ) -> Result<Decision, BackendError> {
        let Some(params) = limit.gcra() else {
            return Err(unsupported(limit));
        };
        let inner = &*self.inner;
        let id = limit.id();
        let hash = inner.hasher.hash_one((id, key));
        // The shard comes from bits that hashbrown uses for neither the bucket index (low bits) nor
        // the control byte (top 7 bits), so each shard's table stays well spread.
        let shard = (hash >> 32) as usize & (inner.shards.len() - 1);
        let mut shard = inner.shards[shard]
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        // Read the clock under the lock, so decisions for one key see non-decreasing times.
        let now = inner.clock.now_nanos();
        if now >= shard.sweep_at_time {
            shard.sweep(now, &inner.hasher);
        }
        let eq = |e: &Entry| e.limit == id && e.key == *key;
        let rehash = |e: &Entry| inner.hasher.hash_one((e.limit, &e.key));
        let decision = match shard.table.find_entry(hash, eq) {
            Ok(mut occupied) => {
                let entry = occupied.get_mut();
                let live = (entry.tat > now).then_some(entry.tat);
                let out = gcra::decide(live, now, params, quantity);
                match out.new_tat {
                    Some(tat) if tat > now => entry.tat = tat,
                    _ => {
                        occupied.remove();
                    }
                }
                out.decision
            }
            Err(_) => {
                let out = gcra::decide(None, now, params, quantity);
                if let Some(tat) = out.new_tat.filter(|tat| *tat > now) {
                    if shard.table.len() >= shard.sweep_at_len {
                        shard.sweep(now, &inner.hasher);
                    }
                    if shard.table.len() >= inner.shard_cap {
                        shard.evict_nearest_refill(now, inner.shard_cap);
                    }
                    let entry = Entry {
                        limit: id,
                        tolerance: params.tolerance() as f32,
                        tat,
                        key: key.clone(),
                    };
                    shard.table.insert_unique(hash, entry, rehash);
                }
                out.decision
            }
        };
        Ok(decision)
    }

    /// How many keys are live (including keys that have refilled but were not swept yet).
    pub fn len(&self) -> usize {
        self.inner
            .shards
            .iter()
            .map(|s| s.lock().unwrap_or_else(|p| p.into_inner()).table.len())
            .sum()
    }

    /// Whether no key is live.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Drops every key whose state has expired now. Never needed for correctness or memory bounds
    /// (shards sweep themselves as they are used); useful before measuring [`len`](Self::len).
    pub fn sweep(&self) {
        let now = self.inner.clock.now_nanos();
        for shard in self.inner.shards.iter() {
            shard
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .sweep(now, &self.inner.hasher);
        }
    }
}

fn unsupported(limit: &Limit) -> BackendError {
    BackendError::new(format!(
        "the memory backend does not implement {:?} (policy {:?})",
        limit.algorithm(),
        limit.name()
    ))
}

/// How many entries are sampled to choose which keys to forget at the cap.
const EVICTION_SAMPLE: usize = 1024;

impl Shard {
    fn sweep(&mut self, now: u64, hasher: &foldhash::fast::RandomState) {
        self.table.retain(|e| e.tat > now);
        let len = self.table.len();
        // Give memory back after a burst of keys (an attack, a spike) has expired.
        if self.table.capacity() > 4 * len.max(16) {
            self.table
                .shrink_to(2 * len, |e| hasher.hash_one((e.limit, &e.key)));
        }
        self.sweep_at_len = (2 * len).max(64);
        self.sweep_at_time = now.saturating_add(SWEEP_INTERVAL_NANOS);
    }

    /// At the cap: forget about an eighth of the keys, those that have used the smallest share of
    /// their limit's tolerance (the closest to fully refilled, whatever their limit's period).
    ///
    /// The threshold comes from a sample (the table's order has nothing to do with the TATs), so the
    /// work under the lock is one pass over the table per `cap / 8` new keys, with no allocation
    /// proportional to the shard.
    fn evict_nearest_refill(&mut self, now: u64, cap: usize) {
        let target = (cap / 8).max(1);
        let mut sample: Vec<f32> = self
            .table
            .iter()
            .take(EVICTION_SAMPLE)
            .map(|e| e.used(now))
            .collect();
        let nth = (sample.len() * target / self.table.len()).min(sample.len() - 1);
        let (_, threshold, _) = sample.select_nth_unstable_by(nth, f32::total_cmp);
        let threshold = *threshold;
        // Strictly below the threshold first, then ties, until the target is met; a sample that
        // underestimates only evicts fewer keys, and the next insert tries again.
        let mut evicted = 0;
        self.table.retain(|e| {
            let forget = evicted < target && e.used(now) < threshold;
            evicted += usize::from(forget);
            !forget
        });
        if evicted < target {
            self.table.retain(|e| {
                let forget = evicted < target && e.used(now) <= threshold;
                evicted += usize::from(forget);
                !forget
            });
        }
    }
}

impl<C: Clock> Backend for MemoryBackend<C> {
    type Future = Ready<Result<Decision, BackendError>>;

    fn check(&self, limit: &Limit, key: &Key, quantity: u64) -> Self::Future {
        ready(self.decide(limit, key, quantity))
    }

    fn validate(&self, limit: &Limit) -> Result<(), BuildError> {
        match limit.gcra() {
            Some(_) => Ok(()),
            None => Err(BuildError::Invalid(unsupported(limit).to_string())),
        }
    }
}
