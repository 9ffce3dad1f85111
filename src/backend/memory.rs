use std::collections::VecDeque;
use std::future::{ready, Ready};
use std::hash::BuildHasher;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard, RwLock, RwLockWriteGuard};

use hashbrown::HashTable;

use crate::backend::StackFuture;
use crate::clock::{Clock, SystemClock};
use crate::limit::{check_stack, MAX_STACKED_QUOTAS};
use crate::window::{self, FixedState, SlidingState};
use crate::{gcra, Algorithm, Backend, BackendError, BuildError, Decision, Key, Limit};

/// How often (at most) a shard drops keys that have refilled completely, when it is in use.
const SWEEP_INTERVAL_NANOS: u64 = 1_000_000_000;

/// The default cap on live keys.
const DEFAULT_MAX_KEYS: usize = 1_000_000;

/// The in-memory backend: one process, every [`Algorithm`], bounded memory.
///
/// It keeps two stores. A lone GCRA limit (the common case) has a table of its own, described
/// first; everything else, described under **Other algorithms and stacks**, shares a general one.
/// [`len`](Self::len) counts the keys of both.
///
/// **The GCRA table.** Exact `CL.THROTTLE` decisions.
/// State is one 64-bit TAT per live key, in a map split into shards behind read-write locks. A
/// decision for a key already in the map takes its shard's read lock and updates the TAT with a
/// compare-and-swap, so decisions in one shard run in parallel; a new key takes the write lock for a
/// few dozen nanoseconds. It never waits on I/O.
///
/// **Eviction.** A key whose TAT has passed is indistinguishable from a key never seen, so dropping it
/// loses nothing. Each shard drops such keys when it has doubled in size since the last sweep, and
/// at most once a second otherwise, during the calls that use it: no background task, nothing to call.
/// The cost is amortized O(1) per decision.
///
/// **The cap.** At most [`max_keys`](MemoryBackendBuilder::max_keys) keys are live in this table
/// (default 1,000,000, split evenly across the shards). When a shard is full of keys that have not refilled yet (many
/// distinct clients within one refill period, such as an attack from rotating addresses), it forgets
/// about an eighth of its keys: those that have used the smallest share of their own limit's tolerance
/// (the closest to fully refilled, whatever the limit's period). They start again with a full burst.
/// A client being limited has used all of its tolerance, so it is forgotten last: an attacker rotating
/// through fresh keys cannot reset it without spending each key's whole limit.
/// Memory is therefore bounded by the cap: each key is one table entry (plus hashbrown's control byte
/// and spare capacity) of 16 bytes for an IPv4 key, 32 for an IPv6 key and 40 for any other key,
/// and a byte-string key also owns its bytes on the heap (at most 64; longer keys are stored as a
/// 32-byte SHA-256 digest). IP keys own nothing beyond the entry: a million live IPv4 keys take about
/// 36 MB (`cargo bench --bench footprint`).
///
/// **Other algorithms and stacks.** The [window algorithms](crate::window), the concurrency limit
/// and [stacks of limits](Backend::check_all) (whose GCRA limits keep their TAT here, apart from
/// the same limits checked alone) live in a second map with as many shards, each behind a mutex:
/// one entry per key and stack (or lone limit), holding one state per limit, so that a stack is
/// decided under one lock and recorded only if every limit admits it. Windows are aligned on Unix
/// time ([`Clock::unix_origin_nanos`]), as in Redis. Memory per key, on 64-bit targets: an 80-byte
/// entry (plus hashbrown's control byte and spare capacity, and a byte-string key's own bytes) holds
/// the state of one limit in place; a stack keeps its states on the heap instead, 48 bytes per
/// limit. The state
/// itself is O(1) for the GCRA (a TAT), the fixed window (a window number and a count), the sliding
/// window (two counts) and the concurrency limit (a count); the sliding log is O(`count`): 8 bytes
/// per unit admitted within the last `period` (a `VecDeque`, so up to twice that in spare
/// capacity), never more than `count` of them.
///
/// Entries are dropped when their state expires (the end of the window that still counts, the
/// newest logged unit's `period`, the TAT), by the same amortized sweeps as the GCRA table, and a
/// concurrency entry as soon as its last request is [released](Backend::release). The general
/// map has its own cap of `max_keys` entries (so the two stores together hold at most twice that):
/// when a shard is full, it forgets about an eighth of its entries, those that use the smallest
/// share of their limit, as the GCRA table does: the count in the current fixed window, the sliding
/// window's weighted estimate or the sliding log's live units over the limit's `count`, a GCRA
/// limit's TAT ahead of now over its tolerance, and for a stack the largest share over its limits.
/// A client being limited uses its whole limit, so it is forgotten last, even if its state expires
/// before a lighter client's (every fixed-window entry of one window expires together). It
/// never forgets an entry with requests in flight, since that would admit more than the limit: a
/// shard full of them grows past the cap, by at most the number of keys with requests in flight.
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
    shards: Box<[RwLock<Shard>]>,
    shard_cap: usize,
    /// The general store: every algorithm but a lone GCRA limit, and stacks of limits.
    general: Box<[Mutex<GeneralShard>]>,
}

/// One live key. The TAT is atomic so that a decision for a key already in the table needs only the
/// shard's read lock (concurrent decisions compare-and-swap it); inserting and removing keys take the
/// write lock.
struct Slot<K> {
    tat: AtomicU64,
    limit: u32,
    key: K,
}

/// The three tables of a shard, by the form a key is stored in: IPv4 keys as 4 bytes (a 16-byte slot),
/// IPv6 keys as 16 bytes (32-byte slot), anything else as the [`Key`] itself (40-byte slot).
trait SlotKey: Sized + PartialEq {
    fn slot_hash(&self, limit: u32, hasher: &foldhash::fast::RandomState) -> u64;
    fn table(shard: &Shard) -> &HashTable<Slot<Self>>;
    fn table_mut(shard: &mut Shard) -> &mut HashTable<Slot<Self>>;
}

impl SlotKey for u32 {
    fn slot_hash(&self, limit: u32, hasher: &foldhash::fast::RandomState) -> u64 {
        hasher.hash_one((u64::from(limit) << 32) | u64::from(*self))
    }
    fn table(shard: &Shard) -> &HashTable<Slot<Self>> {
        &shard.v4
    }
    fn table_mut(shard: &mut Shard) -> &mut HashTable<Slot<Self>> {
        &mut shard.v4
    }
}

impl SlotKey for [u8; 16] {
    fn slot_hash(&self, limit: u32, hasher: &foldhash::fast::RandomState) -> u64 {
        hasher.hash_one((limit, u128::from_ne_bytes(*self)))
    }
    fn table(shard: &Shard) -> &HashTable<Slot<Self>> {
        &shard.v6
    }
    fn table_mut(shard: &mut Shard) -> &mut HashTable<Slot<Self>> {
        &mut shard.v6
    }
}

impl SlotKey for Key {
    fn slot_hash(&self, limit: u32, hasher: &foldhash::fast::RandomState) -> u64 {
        hasher.hash_one((limit, self))
    }
    fn table(shard: &Shard) -> &HashTable<Slot<Self>> {
        &shard.other
    }
    fn table_mut(shard: &mut Shard) -> &mut HashTable<Slot<Self>> {
        &mut shard.other
    }
}

/// The compact form of a key: IP keys as their address bits, anything else as the key itself.
enum Compact<'a> {
    V4(u32),
    V6([u8; 16]),
    Other(&'a Key),
}

impl<'a> Compact<'a> {
    fn of(key: &'a Key) -> Self {
        match key.ip() {
            Some(IpAddr::V4(ip)) => Compact::V4(ip.to_bits()),
            Some(IpAddr::V6(ip)) => Compact::V6(ip.octets()),
            None => Compact::Other(key),
        }
    }
}

struct Shard {
    v4: HashTable<Slot<u32>>,
    v6: HashTable<Slot<[u8; 16]>>,
    other: HashTable<Slot<Key>>,
    /// The tolerance (ns) of each limit seen in this shard, to rank keys of different limits at the
    /// cap (the last one seen, if two limits share a name with different quotas).
    tolerances: Vec<(u32, f32)>,
    /// Sweep expired keys when the tables reach this many entries...
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
                RwLock::new(Shard {
                    v4: HashTable::new(),
                    v6: HashTable::new(),
                    other: HashTable::new(),
                    tolerances: Vec::new(),
                    sweep_at_len: 64,
                    sweep_at_time: 0,
                })
            })
            .collect::<Box<[_]>>();
        let general = (0..shards.len())
            .map(|_| {
                Mutex::new(GeneralShard {
                    table: HashTable::new(),
                    scales: Vec::new(),
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
                general,
            }),
        })
    }
}

impl<C: Clock> MemoryBackend<C> {
    /// Decides synchronously; [`Backend::check`] wraps this in a ready future. Every algorithm is
    /// implemented, so this does not fail today; the `Result` leaves room for one that is not.
    pub fn decide(
        &self,
        limit: &Limit,
        key: &Key,
        quantity: u64,
    ) -> Result<Decision, BackendError> {
        let Some(params) = limit.gcra() else {
            let mut out = [PLACEHOLDER];
            self.decide_general(std::slice::from_ref(limit), key, quantity, &mut out);
            return Ok(out[0]);
        };
        Ok(match Compact::of(key) {
            Compact::V4(ip) => self.decide_in(params, limit.id(), &ip, quantity),
            Compact::V6(ip) => self.decide_in(params, limit.id(), &ip, quantity),
            Compact::Other(key) => self.decide_in(params, limit.id(), key, quantity),
        })
    }

    fn decide_in<K: SlotKey + Clone>(
        &self,
        params: &gcra::Params,
        id: u32,
        key: &K,
        quantity: u64,
    ) -> Decision {
        let inner = &*self.inner;
        let hash = key.slot_hash(id, &inner.hasher);
        // The shard comes from bits that hashbrown uses for neither the bucket index (low bits) nor
        // the control byte (top 7 bits), so each shard's table stays well spread.
        let lock = &inner.shards[(hash >> 32) as usize & (inner.shards.len() - 1)];
        let eq = |s: &Slot<K>| s.limit == id && s.key == *key;
        {
            // A key already in the table: the read lock, and a compare-and-swap of its TAT. Two
            // threads may read the clock in one order and swap in the other; the later swap then
            // decides on the newer TAT with an older `now`, which can only be stricter (never an
            // extra admission), and the exact-count test in tests/memory.rs holds under contention.
            let shard = lock.read().unwrap_or_else(|poisoned| poisoned.into_inner());
            // Read the clock under the lock: a sweep (under the write lock) never runs between
            // reading `now` and deciding with it.
            let now = inner.clock.now_nanos();
            if now < shard.sweep_at_time {
                if let Some(slot) = K::table(&shard).find(hash, eq) {
                    let mut current = slot.tat.load(Relaxed);
                    loop {
                        let live = (current > now).then_some(current);
                        let out = gcra::decide(live, now, params, quantity);
                        // A TAT not after `now` means no state, as does an expired `current`:
                        // nothing to write (the sweep drops the slot).
                        let store = out.new_tat.filter(|tat| *tat > now && *tat != current);
                        let Some(tat) = store else {
                            return out.decision;
                        };
                        match slot
                            .tat
                            .compare_exchange_weak(current, tat, Relaxed, Relaxed)
                        {
                            Ok(_) => return out.decision,
                            Err(actual) => current = actual,
                        }
                    }
                }
            }
        }
        // A new key, or a sweep is due: the write lock.
        let mut shard = lock
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let now = inner.clock.now_nanos();
        if now >= shard.sweep_at_time {
            shard.sweep(now, &inner.hasher);
        }
        let rehash = |s: &Slot<K>| s.key.slot_hash(s.limit, &inner.hasher);
        match K::table_mut(&mut shard).find_entry(hash, eq) {
            Ok(mut occupied) => {
                let tat = occupied.get_mut().tat.get_mut();
                let live = (*tat > now).then_some(*tat);
                let out = gcra::decide(live, now, params, quantity);
                match out.new_tat {
                    Some(new_tat) if new_tat > now => *tat = new_tat,
                    _ => {
                        occupied.remove();
                    }
                }
                out.decision
            }
            Err(_) => {
                let out = gcra::decide(None, now, params, quantity);
                if let Some(tat) = out.new_tat.filter(|tat| *tat > now) {
                    if shard.len() >= shard.sweep_at_len {
                        shard.sweep(now, &inner.hasher);
                    }
                    if shard.len() >= inner.shard_cap {
                        shard.evict_nearest_refill(now, inner.shard_cap, &inner.hasher);
                    }
                    shard.note_tolerance(id, params.tolerance() as f32);
                    let slot = Slot {
                        tat: AtomicU64::new(tat),
                        limit: id,
                        key: key.clone(),
                    };
                    K::table_mut(&mut shard).insert_unique(hash, slot, rehash);
                }
                out.decision
            }
        }
    }

    /// Decides a stack of limits together, synchronously ([`Backend::check_all`] wraps this in a
    /// ready future): the request passes only if every limit admits it, and only then is it recorded
    /// by all of them. Returns one decision per limit, in order. When one limit rejects, the others
    /// that would have admitted report the state they keep (as a request of quantity 0 would).
    ///
    /// A single limit is decided as [`decide`](Self::decide) does (a lone GCRA limit in the fast
    /// table). A stack keeps its state apart from the lone limits, keyed by its first limit's name,
    /// the key, and each limit's position; its GCRA limits keep their TAT there too. Fails for what
    /// [`Backend::validate_all`] refuses.
    pub fn decide_all(
        &self,
        limits: &[Limit],
        key: &Key,
        quantity: u64,
    ) -> Result<Vec<Decision>, BackendError> {
        check_stack(limits).map_err(BackendError::new)?;
        if let [limit] = limits {
            return Ok(vec![self.decide(limit, key, quantity)?]);
        }
        let mut out = vec![PLACEHOLDER; limits.len()];
        self.decide_general(limits, key, quantity, &mut out);
        Ok(out)
    }

    /// Decides `limits` (1 to [`MAX_STACKED_QUOTAS`], concurrency only alone) in the general store, one
    /// decision per limit into `out`, under one lock: each limit decides on the stored state, and
    /// the new states are written only if every limit admits.
    fn decide_general(&self, limits: &[Limit], key: &Key, quantity: u64, out: &mut [Decision]) {
        debug_assert!(!limits.is_empty() && limits.len() <= MAX_STACKED_QUOTAS);
        let inner = &*self.inner;
        let id = limits[0].id();
        let hash = inner.hasher.hash_one((id, key));
        let mut shard = inner.general_shard(hash);
        // Read the clock under the lock, so that each key sees its decisions' times in order (the
        // sliding log relies on it).
        let now = inner.clock.now_nanos();
        let origin = inner.clock.unix_origin_nanos();
        if now >= shard.sweep_at_time {
            shard.sweep(now, &inner.hasher);
        }
        let eq = |e: &Entry| e.limit == id && e.key == *key;
        if let Ok(mut occupied) = shard.table.find_entry(hash, eq) {
            let cells = &mut occupied.get_mut().cells;
            decide_cells(cells, limits, now, origin, quantity, out);
            if !cells.retain_live(now) {
                occupied.remove();
            }
            return;
        }
        let mut cells = Cells::Empty;
        decide_cells(&mut cells, limits, now, origin, quantity, out);
        if !cells.retain_live(now) {
            return;
        }
        if shard.table.len() >= shard.sweep_at_len {
            shard.sweep(now, &inner.hasher);
        }
        shard.note_scales(limits);
        if shard.table.len() >= inner.shard_cap {
            shard.evict_least_used(now, origin, inner.shard_cap, &inner.hasher);
        }
        let entry = Entry {
            limit: id,
            key: key.clone(),
            cells,
        };
        shard
            .table
            .insert_unique(hash, entry, |e| inner.hasher.hash_one((e.limit, &e.key)));
    }

    /// Gives back `quantity` in-flight units of a concurrency `limit` for `key` (saturating), and
    /// forgets the key when none are left. Does nothing for other algorithms.
    fn release_slot(&self, limit: &Limit, key: &Key, quantity: u64) {
        if limit.concurrency().is_none() {
            return;
        }
        let inner = &*self.inner;
        let id = limit.id();
        let hash = inner.hasher.hash_one((id, key));
        let mut shard = inner.general_shard(hash);
        let eq = |e: &Entry| e.limit == id && e.key == *key;
        let Ok(mut occupied) = shard.table.find_entry(hash, eq) else {
            return;
        };
        let cells = &mut occupied.get_mut().cells;
        if let Some(cell) = cells.find_mut(id, 0) {
            if let State::InFlight(n) = &mut cell.state {
                *n = n.saturating_sub(quantity);
                if *n == 0 {
                    cell.expires_at = 0;
                }
            }
        }
        // Released slots are the only state of a concurrency key, so the cell goes at 0 at once
        // rather than at the next sweep; the clock is not needed to tell.
        if !cells.retain_live(0) {
            occupied.remove();
        }
    }

    /// How many keys are live in both stores (including keys that have expired but were not swept
    /// yet). A stack of limits on one key counts once.
    pub fn len(&self) -> usize {
        let gcra: usize = self
            .inner
            .shards
            .iter()
            .map(|s| s.read().unwrap_or_else(|p| p.into_inner()).len())
            .sum();
        let general: usize = self.inner.general.iter().map(|s| lock(s).table.len()).sum();
        gcra + general
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
            write(shard).sweep(now, &self.inner.hasher);
        }
        for shard in self.inner.general.iter() {
            lock(shard).sweep(now, &self.inner.hasher);
        }
    }
}

impl<C> Inner<C> {
    fn general_shard(&self, hash: u64) -> MutexGuard<'_, GeneralShard> {
        // The same bits as the GCRA table's shards, for the same reason.
        lock(&self.general[(hash >> 32) as usize & (self.general.len() - 1)])
    }
}

fn lock(shard: &Mutex<GeneralShard>) -> MutexGuard<'_, GeneralShard> {
    shard.lock().unwrap_or_else(|p| p.into_inner())
}

/// What `out` is filled with before each limit decides.
const PLACEHOLDER: Decision = Decision::allowed(0, 0, std::time::Duration::ZERO);

/// One key's state in the general store: one cell per limit of the stack (or the lone limit) that
/// was decided under the entry's first limit `limit`.
struct Entry {
    limit: u32,
    key: Key,
    cells: Cells,
}

/// The cells of an entry, without an allocation for the common case of one limit.
enum Cells {
    Empty,
    One(Cell),
    Many(Vec<Cell>),
}

/// One limit's state for one key.
struct Cell {
    limit: u32,
    /// The limit's place in its stack, so that a stack may hold two limits of one name.
    position: u8,
    /// When the state becomes the same as no state, on the backend's clock (`now_nanos`); `u64::MAX`
    /// while requests are in flight, 0 for a state never written.
    expires_at: u64,
    state: State,
}

/// The state each algorithm keeps, as [`gcra`] and [`window`] define it.
enum State {
    /// The TAT, on the backend's clock (`now_nanos`, not Unix time).
    Gcra(u64),
    Fixed(FixedState),
    Sliding(SlidingState),
    /// Times of admitted units, oldest first (Unix time): at most the limit's count of them.
    Log(VecDeque<u64>),
    InFlight(u64),
}

impl State {
    /// A state equivalent to none for `algorithm`, so that each decision function reads it as a
    /// new key (a TAT of 0 is never after `now`; count 0 in window 0 is no count).
    fn fresh(algorithm: Algorithm) -> State {
        match algorithm {
            Algorithm::FixedWindow => State::Fixed(FixedState::default()),
            Algorithm::SlidingWindow => State::Sliding(SlidingState::default()),
            Algorithm::SlidingLog => State::Log(VecDeque::new()),
            Algorithm::Concurrency => State::InFlight(0),
            _ => State::Gcra(0),
        }
    }

    fn algorithm(&self) -> Algorithm {
        match self {
            State::Gcra(_) => Algorithm::Gcra,
            State::Fixed(_) => Algorithm::FixedWindow,
            State::Sliding(_) => Algorithm::SlidingWindow,
            State::Log(_) => Algorithm::SlidingLog,
            State::InFlight(_) => Algorithm::Concurrency,
        }
    }
}

impl Cells {
    fn as_mut_slice(&mut self) -> &mut [Cell] {
        match self {
            Cells::Empty => &mut [],
            Cells::One(cell) => std::slice::from_mut(cell),
            Cells::Many(cells) => cells,
        }
    }

    fn iter(&self) -> impl Iterator<Item = &Cell> {
        let slice: &[Cell] = match self {
            Cells::Empty => &[],
            Cells::One(cell) => std::slice::from_ref(cell),
            Cells::Many(cells) => cells,
        };
        slice.iter()
    }

    fn find_mut(&mut self, limit: u32, position: u8) -> Option<&mut Cell> {
        self.as_mut_slice()
            .iter_mut()
            .find(|c| c.limit == limit && c.position == position)
    }

    /// The index of the cell of `limit` at `position`, added with a fresh state if there is none
    /// (or if the name was reused for another algorithm).
    fn index_of(&mut self, limit: &Limit, position: u8) -> usize {
        let (id, algorithm) = (limit.id(), limit.algorithm());
        let found = self
            .as_mut_slice()
            .iter()
            .position(|c| c.limit == id && c.position == position);
        if let Some(i) = found {
            let cell = &mut self.as_mut_slice()[i];
            if cell.state.algorithm() != algorithm {
                cell.state = State::fresh(algorithm);
                cell.expires_at = 0;
            }
            return i;
        }
        let cell = Cell {
            limit: id,
            position,
            expires_at: 0,
            state: State::fresh(algorithm),
        };
        *self = match std::mem::replace(self, Cells::Empty) {
            Cells::Empty => Cells::One(cell),
            Cells::One(first) => Cells::Many(vec![first, cell]),
            Cells::Many(mut cells) => {
                cells.push(cell);
                Cells::Many(cells)
            }
        };
        self.as_mut_slice().len() - 1
    }

    /// Drops the cells that have expired at `now`; whether any is left.
    fn retain_live(&mut self, now: u64) -> bool {
        match self {
            Cells::Empty => {}
            Cells::One(cell) => {
                if cell.expires_at <= now {
                    *self = Cells::Empty;
                }
            }
            Cells::Many(cells) => {
                cells.retain(|c| c.expires_at > now);
                match cells.len() {
                    0 => *self = Cells::Empty,
                    1 => *self = Cells::One(cells.pop().expect("one cell")),
                    _ => {}
                }
            }
        }
        !matches!(self, Cells::Empty)
    }
}

/// A limit's decision before it is known whether the whole stack passes.
#[derive(Clone, Copy)]
enum Pending {
    Gcra(Option<u64>),
    Fixed(Option<FixedState>),
    Sliding(Option<SlidingState>),
    /// The log was trimmed and, if admitted, the units appended in place (removed again if the
    /// stack is rejected).
    Log,
    InFlight(u64),
}

/// Decides every limit of `limits` on `cells` at `now` (the backend's clock; windows add `origin`
/// to it for Unix time), writing the new states only if every limit admits.
fn decide_cells(
    cells: &mut Cells,
    limits: &[Limit],
    now: u64,
    origin: u64,
    quantity: u64,
    out: &mut [Decision],
) {
    let unix_now = now.saturating_add(origin);
    let mut pending = [(0usize, Pending::Log); MAX_STACKED_QUOTAS];
    let mut every_limit_admits = true;
    for (position, limit) in limits.iter().enumerate() {
        let index = cells.index_of(limit, position as u8);
        let cell = &mut cells.as_mut_slice()[index];
        let (decision, next) = decide_one(&mut cell.state, limit, now, unix_now, quantity);
        out[position] = decision;
        pending[position] = (index, next);
        every_limit_admits &= decision.allowed;
    }
    let slice = cells.as_mut_slice();
    for (position, limit) in limits.iter().enumerate() {
        let (index, next) = pending[position];
        let cell = &mut slice[index];
        if every_limit_admits {
            commit(cell, next, limit, now, origin);
        } else if out[position].allowed {
            if let (State::Log(log), Pending::Log) = (&mut cell.state, next) {
                log.truncate(log.len() - quantity as usize);
            }
            // Nothing was recorded: report the state as it stands.
            out[position] = decide_one(&mut cell.state, limit, now, unix_now, 0).0;
        }
    }
}

/// One limit's decision on `state`. Only the sliding log is changed in place (trimmed, and appended
/// to if admitted); the other states come back in [`Pending`].
fn decide_one(
    state: &mut State,
    limit: &Limit,
    now: u64,
    unix_now: u64,
    quantity: u64,
) -> (Decision, Pending) {
    match (state, limit.gcra(), limit.window(), limit.concurrency()) {
        (State::Gcra(tat), Some(params), _, _) => {
            let live = (*tat > now).then_some(*tat);
            let out = gcra::decide(live, now, params, quantity);
            (out.decision, Pending::Gcra(out.new_tat))
        }
        (State::Fixed(s), _, Some(params), _) => {
            let (d, next) = window::fixed_window(Some(*s), unix_now, params, quantity);
            (d, Pending::Fixed(next))
        }
        (State::Sliding(s), _, Some(params), _) => {
            let (d, next) = window::sliding_window(Some(*s), unix_now, params, quantity);
            (d, Pending::Sliding(next))
        }
        (State::Log(log), _, Some(params), _) => (
            window::sliding_log(log, unix_now, params, quantity),
            Pending::Log,
        ),
        (State::InFlight(n), _, _, Some(max)) => {
            let (d, next) = window::concurrency(*n, max, quantity);
            (d, Pending::InFlight(next))
        }
        _ => unreachable!("Cells::index_of gives each limit the state of its algorithm"),
    }
}

/// Writes an admitted stack's new state into `cell`, with when it expires on the backend's clock.
fn commit(cell: &mut Cell, next: Pending, limit: &Limit, now: u64, origin: u64) {
    let period = limit.window().map_or(0, |p| p.period());
    // Window states expire on a Unix-time boundary; the backend's clock is Unix time − origin.
    let at_unix = |t: u64| t.saturating_sub(origin);
    cell.expires_at = match (&mut cell.state, next) {
        (State::Gcra(tat), Pending::Gcra(next)) => {
            *tat = next.filter(|t| *t > now).unwrap_or(0);
            *tat
        }
        (State::Fixed(s), Pending::Fixed(next)) => {
            *s = next.unwrap_or_default();
            next.map_or(0, |s| {
                at_unix(s.window.saturating_add(1).saturating_mul(period))
            })
        }
        (State::Sliding(s), Pending::Sliding(next)) => {
            *s = next.unwrap_or_default();
            // The current count is weighed until the end of the next window, the previous one until
            // the end of this window.
            next.map_or(0, |s| {
                let windows = if s.current > 0 { 2 } else { 1 };
                at_unix(s.window.saturating_add(windows).saturating_mul(period))
            })
        }
        (State::Log(log), Pending::Log) => log
            .back()
            .map_or(0, |newest| at_unix(newest.saturating_add(period))),
        (State::InFlight(n), Pending::InFlight(next)) => {
            *n = next;
            if next > 0 {
                u64::MAX
            } else {
                0
            }
        }
        _ => unreachable!("decide_one returns the pending state of the cell's algorithm"),
    };
}

/// How many entries are sampled to choose which keys to forget at the cap.
const EVICTION_SAMPLE: usize = 1024;

fn write(shard: &RwLock<Shard>) -> RwLockWriteGuard<'_, Shard> {
    shard.write().unwrap_or_else(|p| p.into_inner())
}

/// Drops the slots whose TAT has passed, and gives memory back after a burst of keys (an attack, a
/// spike) has expired.
fn sweep_table<K: SlotKey>(
    table: &mut HashTable<Slot<K>>,
    now: u64,
    hasher: &foldhash::fast::RandomState,
) {
    table.retain(|s| *s.tat.get_mut() > now);
    let len = table.len();
    if table.capacity() > 4 * len.max(16) {
        table.shrink_to(2 * len, |s| s.key.slot_hash(s.limit, hasher));
    }
}

impl Shard {
    fn len(&self) -> usize {
        self.v4.len() + self.v6.len() + self.other.len()
    }

    fn sweep(&mut self, now: u64, hasher: &foldhash::fast::RandomState) {
        sweep_table(&mut self.v4, now, hasher);
        sweep_table(&mut self.v6, now, hasher);
        sweep_table(&mut self.other, now, hasher);
        self.sweep_at_len = (2 * self.len()).max(64);
        self.sweep_at_time = now.saturating_add(SWEEP_INTERVAL_NANOS);
    }

    fn note_tolerance(&mut self, id: u32, tolerance: f32) {
        match self.tolerances.iter_mut().find(|(i, _)| *i == id) {
            Some((_, t)) => *t = tolerance,
            None => self.tolerances.push((id, tolerance)),
        }
    }

    /// At the cap: forget about an eighth of the keys, those that have used the smallest share of
    /// their limit's tolerance (the closest to fully refilled, whatever their limit's period).
    ///
    /// The threshold comes from a sample (the table's order has nothing to do with the TATs), so the
    /// work under the lock is one pass over the tables per `cap / 8` new keys, with no allocation
    /// proportional to the shard.
    fn evict_nearest_refill(&mut self, now: u64, cap: usize, hasher: &foldhash::fast::RandomState) {
        // Expired slots (left by decisions under the read lock) go first, and count.
        let before = self.len();
        sweep_table(&mut self.v4, now, hasher);
        sweep_table(&mut self.v6, now, hasher);
        sweep_table(&mut self.other, now, hasher);
        let target = (cap / 8).max(1).saturating_sub(before - self.len());
        if target == 0 {
            return;
        }
        let Shard {
            v4,
            v6,
            other,
            tolerances,
            ..
        } = self;
        let tolerances = &*tolerances;
        // How much of its tolerance a key has used: near 0 = almost fully refilled, 1 = just limited.
        let used = |tat: u64, id: u32| {
            let tolerance = tolerances
                .iter()
                .find(|(i, _)| *i == id)
                .map_or(1.0, |(_, t)| *t);
            tat.saturating_sub(now) as f32 / tolerance
        };
        let len = v4.len() + v6.len() + other.len();
        // A sample from each table in proportion to its size.
        let share = |n: usize| (n * EVICTION_SAMPLE).div_ceil(len);
        let mut sample: Vec<f32> = Vec::with_capacity(EVICTION_SAMPLE + 3);
        sample.extend(
            v4.iter()
                .take(share(v4.len()))
                .map(|s| used(s.tat.load(Relaxed), s.limit)),
        );
        sample.extend(
            v6.iter()
                .take(share(v6.len()))
                .map(|s| used(s.tat.load(Relaxed), s.limit)),
        );
        sample.extend(
            other
                .iter()
                .take(share(other.len()))
                .map(|s| used(s.tat.load(Relaxed), s.limit)),
        );
        let nth = (sample.len() * target / len).min(sample.len() - 1);
        let (_, threshold, _) = sample.select_nth_unstable_by(nth, f32::total_cmp);
        let threshold = *threshold;
        // Strictly below the threshold first, then ties, until the target is met; a sample that
        // underestimates only evicts fewer keys, and the next insert tries again.
        let mut evicted = 0;
        for ties in [false, true] {
            let mut forget = |tat: u64, id: u32| {
                let u = used(tat, id);
                let forget = evicted < target && (u < threshold || (ties && u <= threshold));
                evicted += usize::from(forget);
                !forget
            };
            v4.retain(|s| forget(*s.tat.get_mut(), s.limit));
            v6.retain(|s| forget(*s.tat.get_mut(), s.limit));
            other.retain(|s| forget(*s.tat.get_mut(), s.limit));
            if evicted >= target {
                break;
            }
        }
    }
}

impl<C: Clock> Backend for MemoryBackend<C> {
    type Future = Ready<Result<Decision, BackendError>>;

    fn check(&self, limit: &Limit, key: &Key, quantity: u64) -> Self::Future {
        ready(self.decide(limit, key, quantity))
    }

    /// Every algorithm is implemented.
    fn validate(&self, limit: &Limit) -> Result<(), BuildError> {
        let _ = limit;
        Ok(())
    }

    fn check_all(&self, limits: &[Limit], key: &Key, quantity: u64) -> StackFuture {
        Box::pin(ready(self.decide_all(limits, key, quantity)))
    }

    /// The stack rule of every backend ([`MAX_STACKED_QUOTAS`]); memory adds nothing to it.
    fn validate_all(&self, limits: &[Limit]) -> Result<(), BuildError> {
        check_stack(limits).map_err(BuildError::Invalid)
    }

    fn release(&self, limit: &Limit, key: &Key, quantity: u64, lease: u64) {
        // Memory counts slots per key; the lease token identifies nothing more.
        let _ = lease;
        self.release_slot(limit, key, quantity);
    }
}

/// The general store's shard: a table of entries behind a mutex, since a stack's decision reads and
/// writes several states at once.
struct GeneralShard {
    table: HashTable<Entry>,
    /// The scale of each limit seen in this shard (by name, place in its stack and algorithm), to
    /// rank entries of different limits at the cap (the last one seen, if two limits share a name
    /// with different quotas).
    scales: Vec<(ScaleKey, Scale)>,
    /// Sweep expired entries when the table reaches this many entries...
    sweep_at_len: usize,
    /// ...or when the clock reaches this time.
    sweep_at_time: u64,
}

impl GeneralShard {
    fn sweep(&mut self, now: u64, hasher: &foldhash::fast::RandomState) {
        self.drop_expired(now, hasher);
        self.sweep_at_len = (2 * self.table.len()).max(64);
        self.sweep_at_time = now.saturating_add(SWEEP_INTERVAL_NANOS);
    }

    fn drop_expired(&mut self, now: u64, hasher: &foldhash::fast::RandomState) {
        self.table.retain(|e| e.cells.retain_live(now));
        let len = self.table.len();
        if self.table.capacity() > 4 * len.max(16) {
            self.table
                .shrink_to(2 * len, |e| hasher.hash_one((e.limit, &e.key)));
        }
    }

    /// Records the scale of each limit of a stack about to be inserted, so that its entry can be
    /// ranked at the cap. Only inserts need it: every entry is ranked by the limits it was inserted
    /// with (or later ones, if some new key has been inserted with them since).
    fn note_scales(&mut self, limits: &[Limit]) {
        for (position, limit) in limits.iter().enumerate() {
            let scale = match (limit.gcra(), limit.window()) {
                (Some(params), _) => Scale::Gcra(params.tolerance() as f32),
                (_, Some(params)) => Scale::Window(*params),
                // A concurrency entry needs no scale: it is never forgotten while it has requests
                // in flight, and it is dropped as soon as it has none.
                _ => continue,
            };
            let key = (limit.id(), position as u8, limit.algorithm());
            match self.scales.iter_mut().find(|(k, _)| *k == key) {
                Some((_, s)) => *s = scale,
                None => self.scales.push((key, scale)),
            }
        }
    }

    /// At the cap: forget about an eighth of the entries, those that use the smallest share of their
    /// limits (see [`share_used`]), but never one with requests in flight (forgetting it would admit
    /// more than the limit; those entries are bounded by the requests in flight, not by the cap).
    /// Ranking by expiry instead would let an attacker rotating through fresh keys push out a client
    /// being limited (a heavy sliding-log user expires before a later light one, and every fixed-window
    /// entry of one window expires together), which would then start over with a full quota.
    ///
    /// As in the GCRA table, the threshold comes from a sample (the table's order has nothing to do
    /// with the states), so the work under the lock is one pass over the table per `cap / 8` new
    /// keys, with no allocation proportional to the shard.
    fn evict_least_used(
        &mut self,
        now: u64,
        origin: u64,
        cap: usize,
        hasher: &foldhash::fast::RandomState,
    ) {
        let before = self.table.len();
        self.drop_expired(now, hasher);
        let target = (cap / 8).max(1).saturating_sub(before - self.table.len());
        if target == 0 {
            return;
        }
        let GeneralShard { table, scales, .. } = self;
        let scales = &*scales;
        let unix_now = now.saturating_add(origin);
        // `None`: requests in flight, never forgotten.
        let used = |e: &Entry| entry_share_used(&e.cells, scales, now, unix_now);
        let mut sample: Vec<f32> = Vec::with_capacity(EVICTION_SAMPLE);
        let mut scanned = 0;
        for share in table.iter().map(used) {
            if sample.len() == EVICTION_SAMPLE {
                break;
            }
            scanned += 1;
            sample.extend(share);
        }
        if sample.is_empty() {
            return;
        }
        // The sample holds `sample.len()` of `scanned` entries; `target` of `len` is the same share
        // of the scanned entries (in-flight entries included, which the sample skips).
        let len = table.len();
        let nth = (scanned * target / len).min(sample.len() - 1);
        let (_, threshold, _) = sample.select_nth_unstable_by(nth, f32::total_cmp);
        let threshold = *threshold;
        // Strictly below the threshold first, then ties, until the target is met; a sample that
        // underestimates only evicts fewer entries, and the next insert tries again.
        let mut evicted = 0;
        for ties in [false, true] {
            table.retain(|e| {
                let forget = evicted < target
                    && used(e).is_some_and(|u| u < threshold || (ties && u <= threshold));
                evicted += usize::from(forget);
                !forget
            });
            if evicted >= target {
                break;
            }
        }
    }
}

/// What a limit's scale is looked up by: its name's id, its place in the stack, its algorithm.
type ScaleKey = (u32, u8, Algorithm);

/// What a limit's state is measured against to tell how much of the limit it uses.
#[derive(Clone, Copy)]
enum Scale {
    /// The GCRA's tolerance in nanoseconds (as decided, including a delay, like the GCRA table's).
    Gcra(f32),
    Window(window::Params),
}

/// The largest share of its limit that any cell of an entry uses at `now`, or `None` while it has
/// requests in flight. A stack is as close to being limited as its most used limit.
fn entry_share_used(
    cells: &Cells,
    scales: &[(ScaleKey, Scale)],
    now: u64,
    unix_now: u64,
) -> Option<f32> {
    cells.iter().try_fold(0.0f32, |most, cell| {
        let key = (cell.limit, cell.position, cell.state.algorithm());
        let scale = scales.iter().find(|(k, _)| *k == key).map(|(_, s)| *s);
        Some(most.max(share_used(&cell.state, scale, now, unix_now)?))
    })
}

/// The share of its limit that one state uses at `now` (`unix_now` for the windows): 0 for a state
/// that admits a full quota, 1 for a client being limited, `None` with requests in flight. The
/// same measure for every algorithm and period, so that the entries of different limits compare.
fn share_used(state: &State, scale: Option<Scale>, now: u64, unix_now: u64) -> Option<f32> {
    let share = match (state, scale) {
        (State::InFlight(n), _) => return (*n == 0).then_some(0.0),
        (State::Gcra(tat), Some(Scale::Gcra(tolerance))) => {
            tat.saturating_sub(now) as f32 / tolerance
        }
        (State::Fixed(s), Some(Scale::Window(p))) => {
            // A count of a window that has passed no longer counts.
            if s.window == unix_now / p.period() {
                s.count as f32 / p.limit() as f32
            } else {
                0.0
            }
        }
        (State::Sliding(s), Some(Scale::Window(p))) => {
            // The estimate `window::sliding_window` decides on: previous × left / period + current.
            let period = p.period();
            let window = unix_now / period;
            let left = period - unix_now % period;
            let (current, previous) = if s.window == window {
                (s.current, s.previous)
            } else if s.window.saturating_add(1) == window {
                (0, s.current)
            } else {
                (0, 0)
            };
            let estimate = previous as f64 * left as f64 / period as f64 + current as f64;
            (estimate / p.limit() as f64) as f32
        }
        (State::Log(log), Some(Scale::Window(p))) => {
            // The log is oldest first; units whose period has passed no longer count.
            let gone = log.partition_point(|t| t.saturating_add(p.period()) <= unix_now);
            (log.len() - gone) as f32 / p.limit() as f32
        }
        // No scale known: a cell added to an entry after its insert, under limits no new key has
        // used since. Ranked as fully used, so it is not forgotten before the entries that can be
        // ranked (ties still go once those are exhausted, so the cap holds).
        _ => 1.0,
    };
    Some(share)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{Ipv4Addr, Ipv6Addr};

    #[test]
    fn ip_keys_are_stored_compactly_and_other_keys_as_themselves() {
        assert_eq!(std::mem::size_of::<Slot<u32>>(), 16);
        assert_eq!(std::mem::size_of::<Slot<[u8; 16]>>(), 32);
        // The general store's entry, as documented on MemoryBackend.
        assert_eq!(std::mem::size_of::<Entry>(), 80);
        assert_eq!(std::mem::size_of::<Cell>(), 48);
        let v4 = Key::from(Ipv4Addr::new(192, 0, 2, 7));
        assert!(matches!(Compact::of(&v4), Compact::V4(bits) if bits == 0xc000_0207));
        let v6: Ipv6Addr = "2001:db8::1".parse().unwrap();
        assert!(matches!(Compact::of(&Key::from(v6)), Compact::V6(o) if o == v6.octets()));
        // IPv4-mapped IPv6 addresses are IPv4 keys.
        let mapped: IpAddr = "::ffff:192.0.2.7".parse().unwrap();
        assert!(matches!(
            Compact::of(&Key::from(mapped)),
            Compact::V4(0xc000_0207)
        ));
        // Byte strings of an address's length are not addresses.
        for other in [
            Key::from("abcd"),
            Key::from(&[0xc0, 0, 2, 7][..]),
            Key::from(&[7u8; 16][..]),
            Key::global(),
            Key::from("x".repeat(100)),
        ] {
            assert!(
                matches!(Compact::of(&other), Compact::Other(_)),
                "{other:?}"
            );
        }
    }

    #[test]
    fn the_same_address_as_bytes_and_as_ip_are_different_keys() {
        let backend = MemoryBackend::builder()
            .clock(crate::clock::ManualClock::new())
            .build()
            .unwrap();
        let limit = Limit::new("t", crate::Quota::per_minute(1)).unwrap();
        let ip = Key::from(Ipv4Addr::new(192, 0, 2, 7));
        let bytes = Key::from(&[192, 0, 2, 7][..]);
        assert!(backend.decide(&limit, &ip, 1).unwrap().allowed);
        assert!(backend.decide(&limit, &bytes, 1).unwrap().allowed);
        assert!(!backend.decide(&limit, &ip, 1).unwrap().allowed);
        assert!(!backend.decide(&limit, &bytes, 1).unwrap().allowed);
        assert_eq!(backend.len(), 2);
    }
}
