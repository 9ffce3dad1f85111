//! The GCRA table: one TAT per key for lone GCRA limits, in shards behind read-write locks (the
//! [`MemoryBackend`](super::MemoryBackend) docs say why, and how it sweeps and evicts).

use std::hash::BuildHasher;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

use hashbrown::HashTable;

mod hot;
mod promote;
mod settle;
mod state;

use hot::{HotKey, HotSlot, Sampler, MOVED};

use super::tuning::{Padded, EVICTION_SAMPLE, SWEEP_GRACE_NANOS, SWEEP_INTERVAL_NANOS};
use crate::clock::Clock;
use crate::decision::Decision;
use crate::gcra;
use crate::key::Key;

/// A map from (limit, key) to TAT, split into shards of at most `shard_cap` keys.
pub(super) struct GcraTable {
    hasher: foldhash::fast::RandomState,
    shards: Box<[Padded<Shard>]>,
    pub(super) shard_cap: usize,
}

impl GcraTable {
    pub(super) fn shard_count(&self) -> usize {
        self.shards.len()
    }

    /// `shards` (a power of two) empty shards of at most `shard_cap` keys each.
    pub(super) fn new(shards: usize, shard_cap: usize) -> Self {
        debug_assert!(shards.is_power_of_two());
        let shards = (0..shards)
            .map(|_| {
                Padded(Shard {
                    table: RwLock::new(GcraShard {
                        v4: HashTable::new(),
                        v6: HashTable::new(),
                        other: HashTable::new(),
                        tolerances: Vec::new(),
                        sweep_at_len: 64,
                        sweep_at_time: 0,
                    }),
                    hot: HotSlot::default(),
                    sampler: Sampler::default(),
                })
            })
            .collect();
        GcraTable {
            hasher: foldhash::fast::RandomState::default(),
            shards,
            shard_cap,
        }
    }

    /// Decides `quantity` units of limit `id` for `key` and records them if admitted. IP keys are
    /// stored as their address bits.
    pub(super) fn decide<C: Clock>(
        &self,
        params: &gcra::GcraParams,
        id: u32,
        key: &Key,
        quantity: u64,
        clock: &C,
    ) -> Decision {
        by_form!(key, |k| self.decide_in(params, id, k, quantity, clock))
    }

    fn decide_in<K: RecordKey + Clone, C: Clock>(
        &self,
        params: &gcra::GcraParams,
        id: u32,
        key: &K,
        quantity: u64,
        clock: &C,
    ) -> Decision {
        let hash = key.record_hash(id, &self.hasher);
        let shard = self.shard(hash);
        // The shard's hot key (hot.rs): no lock.
        if let Some(decision) = shard
            .hot
            .decide(params, id, |h| key.is_hot(h), quantity, clock)
        {
            return decision;
        }
        let eq = |s: &TatRecord<K>| s.limit == id && s.key == *key;
        {
            // A key already in the table: the read lock, and a compare-and-swap of its TAT. Two
            // threads may read the clock in one order and swap in the other; the later swap then
            // decides on the newer TAT with an older `now`, which can only be stricter (never an
            // extra admission), and the exact-count test in tests/memory/backend.rs holds under
            // contention.
            let table = read(&shard.table);
            // Read the clock under the lock: a sweep (under the write lock) never runs between
            // reading `now` and deciding with it.
            let now = clock.now_nanos();
            if now < table.sweep_at_time
                && let Some(record) = K::table(&table).find(hash, eq)
            {
                let mut contended = false;
                let mut current = record.tat.load(Relaxed);
                // The whole decision between the load and the swap: a key that threads collide
                // on moves to the hot slot, whose loop computes only the new TAT there.
                let decision = loop {
                    let live = (current > now).then_some(current);
                    let out = gcra::decide(live, now, params, quantity);
                    // A TAT not after `now` means no state, as does an expired `current`:
                    // nothing to write (the sweep drops the record).
                    let store = out.new_tat.filter(|tat| *tat > now && *tat != current);
                    let Some(tat) = store else {
                        break out.decision;
                    };
                    match record
                        .tat
                        .compare_exchange_weak(current, tat, Relaxed, Relaxed)
                    {
                        Ok(_) => break out.decision,
                        Err(actual) => {
                            contended |= actual != current;
                            current = actual;
                        }
                    }
                };
                let hot = contended || shard.sampler.another_thread_too(hash, now);
                drop(table);
                if hot {
                    self.make_hot(shard, hash, id, key, clock);
                }
                return decision;
            }
        }
        // A new key, or a sweep is due: the write lock.
        let mut table = write(&shard.table);
        // The key may have become hot since it was looked for in the slot.
        if let Some(decision) = shard
            .hot
            .decide(params, id, |h| key.is_hot(h), quantity, clock)
        {
            return decision;
        }
        let now = clock.now_nanos();
        if now >= table.sweep_at_time {
            table.sweep_refilled(now, &self.hasher);
        }
        match K::table_mut(&mut table).find_entry(hash, eq) {
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
                    self.insert_new(&mut table, hash, params, id, key.clone(), tat, now);
                }
                out.decision
            }
        }
    }

    /// The shard of a record's hash. The shard comes from bits that hashbrown uses for neither the
    /// bucket index (low bits) nor the control byte (top 7 bits), so each shard's table stays well
    /// spread.
    fn shard(&self, hash: u64) -> &Shard {
        &self.shards[(hash >> 32) as usize & (self.shards.len() - 1)]
    }

    /// Adds a key not in `shard`, sweeping or evicting first as the shard's size asks.
    #[allow(clippy::too_many_arguments)]
    fn insert_new<K: RecordKey>(
        &self,
        shard: &mut GcraShard,
        hash: u64,
        params: &gcra::GcraParams,
        id: u32,
        key: K,
        tat: u64,
        now: u64,
    ) {
        if shard.len() >= shard.sweep_at_len {
            shard.sweep_refilled(now, &self.hasher);
        }
        if shard.len() >= self.shard_cap {
            shard.evict_nearest_refill(now, self.shard_cap, &self.hasher);
        }
        shard.note_tolerance(id, params.tolerance() as f32);
        shard.insert_record(&self.hasher, hash, id, key, tat);
    }

    /// `key`'s state under limit `id`, for a quantity of 0 and of 1: nothing is written.
    pub(super) fn peek<C: Clock>(
        &self,
        params: &gcra::GcraParams,
        id: u32,
        key: &Key,
        clock: &C,
    ) -> (Decision, Decision) {
        let tat = by_form!(key, |k| self.stored_tat(id, k));
        let now = clock.now_nanos();
        let live = tat.filter(|tat| *tat > now);
        (
            gcra::decide(live, now, params, 0).decision,
            gcra::decide(live, now, params, 1).decision,
        )
    }

    fn stored_tat<K: RecordKey>(&self, id: u32, key: &K) -> Option<u64> {
        let hash = key.record_hash(id, &self.hasher);
        let shard = self.shard(hash);
        // The slot under the lock: a key moved into it meanwhile would be in neither.
        let table = read(&shard.table);
        let hot = shard
            .hot
            .with(id, |h| key.is_hot(h), |tat| tat.load(Relaxed));
        if let Some(tat) = hot.filter(|tat| *tat != MOVED) {
            return Some(tat);
        }
        K::table(&table)
            .find(hash, |s| s.limit == id && s.key == *key)
            .map(|record| record.tat.load(Relaxed))
    }

    /// Forgets `key` under the GCRA limit `id`: it starts again with a full burst.
    pub(super) fn forget(&self, id: u32, key: &Key) {
        by_form!(key, |k| self.forget_in(id, k))
    }

    fn forget_in<K: RecordKey>(&self, id: u32, key: &K) {
        let hash = key.record_hash(id, &self.hasher);
        let shard = self.shard(hash);
        let mut table = write(&shard.table);
        if shard.hot.with(id, |h| key.is_hot(h), |_| ()).is_some() {
            shard.hot.take();
        }
        if let Ok(occupied) =
            K::table_mut(&mut table).find_entry(hash, |s| s.limit == id && s.key == *key)
        {
            occupied.remove();
        }
    }

    /// How many keys are live (including keys that have expired but were not swept yet).
    pub(super) fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| read(&s.table).len() + s.hot.len())
            .sum()
    }

    /// Drops every key whose TAT has passed at `now`.
    pub(super) fn sweep(&self, now: u64) {
        for shard in self.shards.iter() {
            let mut table = write(&shard.table);
            if shard.hot.current_tat().is_some_and(|tat| tat <= now)
                && let Some((limit, key, tat)) = shard.hot.take()
            {
                // Live again if a decision swapped it since.
                self.put_back(&mut table, limit, key, tat, now);
            }
            table.sweep(now, now, &self.hasher);
        }
    }
}

struct Shard {
    table: RwLock<GcraShard>,
    hot: HotSlot,
    sampler: Sampler,
}

/// One live key. The TAT is atomic so that a decision for a key already in the table needs only the
/// shard's read lock (concurrent decisions compare-and-swap it); inserting and removing keys take
/// the write lock.
struct TatRecord<K> {
    tat: AtomicU64,
    limit: u32,
    key: K,
}

/// The three tables of a shard, by the form a key is stored in: IPv4 keys as 4 bytes (a 16-byte
/// record), IPv6 keys as 16 bytes (32-byte record), anything else as the [`Key`] itself (40-byte
/// record).
trait RecordKey: Sized + PartialEq {
    fn record_hash(&self, limit: u32, hasher: &foldhash::fast::RandomState) -> u64;
    fn is_hot(&self, hot: &HotKey) -> bool;
    fn hot(&self) -> HotKey;
    fn table(shard: &GcraShard) -> &HashTable<TatRecord<Self>>;
    fn table_mut(shard: &mut GcraShard) -> &mut HashTable<TatRecord<Self>>;
}

/// `RecordKey` for each form: the hot key's variant, the shard's table, what is hashed (with the
/// limit) to place a record.
macro_rules! record_key {
    ($($form:ty => $hot:ident, $table:ident, |$k:ident, $limit:ident| $hashed:expr;)*) => {$(
        impl RecordKey for $form {
            fn record_hash(&self, $limit: u32, hasher: &foldhash::fast::RandomState) -> u64 {
                let $k = self;
                hasher.hash_one($hashed)
            }
            fn is_hot(&self, hot: &HotKey) -> bool {
                matches!(hot, HotKey::$hot(k) if k == self)
            }
            fn hot(&self) -> HotKey {
                HotKey::$hot(self.clone())
            }
            fn table(shard: &GcraShard) -> &HashTable<TatRecord<Self>> {
                &shard.$table
            }
            fn table_mut(shard: &mut GcraShard) -> &mut HashTable<TatRecord<Self>> {
                &mut shard.$table
            }
        }
    )*};
}
record_key! {
    u32 => V4, v4, |k, limit| (u64::from(limit) << 32) | u64::from(*k);
    [u8; 16] => V6, v6, |k, limit| (limit, u128::from_ne_bytes(*k));
    Key => Other, other, |k, limit| (limit, k);
}

/// `$body` with `$k` bound to `$key`'s [`Compact`] form: `&u32`, `&[u8; 16]` or `&Key`, each
/// typed, so that a generic method is compiled once per form.
macro_rules! by_form {
    ($key:expr, |$k:ident| $body:expr) => {
        match Compact::of($key) {
            Compact::V4(ip) => {
                let $k = &ip;
                $body
            }
            Compact::V6(ip) => {
                let $k = &ip;
                $body
            }
            Compact::Other($k) => $body,
        }
    };
}
use by_form;

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

struct GcraShard {
    v4: HashTable<TatRecord<u32>>,
    v6: HashTable<TatRecord<[u8; 16]>>,
    other: HashTable<TatRecord<Key>>,
    /// The tolerance (ns) of each limit seen in this shard, to rank keys of different limits at the
    /// cap (the last one seen, if two limits share a name with different quotas).
    tolerances: Vec<(u32, f32)>,
    /// Sweep expired keys when the tables reach this many entries...
    sweep_at_len: usize,
    /// ...or when the clock reaches this time.
    sweep_at_time: u64,
}

// Always inlined: `read` is on every decision's path, as `shard.table.read()` was.
#[inline(always)]
fn read(shard: &RwLock<GcraShard>) -> RwLockReadGuard<'_, GcraShard> {
    shard.read().unwrap_or_else(|p| p.into_inner())
}

fn write(shard: &RwLock<GcraShard>) -> RwLockWriteGuard<'_, GcraShard> {
    shard.write().unwrap_or_else(|p| p.into_inner())
}

/// `$body` for each of `$shard`'s three tables in turn, with `$t` bound to it (`&mut`).
macro_rules! each_table {
    ($shard:expr, |$t:ident| $body:expr) => {{
        let $t = &mut $shard.v4;
        $body;
        let $t = &mut $shard.v6;
        $body;
        let $t = &mut $shard.other;
        $body;
    }};
}

/// Drops the records whose TAT has passed, and gives memory back after a burst of keys (an attack,
/// a spike) has expired.
fn sweep_table<K: RecordKey>(
    table: &mut HashTable<TatRecord<K>>,
    now: u64,
    hasher: &foldhash::fast::RandomState,
) {
    table.retain(|s| *s.tat.get_mut() > now);
    let len = table.len();
    if table.capacity() > 4 * len.max(16) {
        table.shrink_to(2 * len, |s| s.key.record_hash(s.limit, hasher));
    }
}

impl GcraShard {
    /// Inserts `key`'s TAT under `limit`, whose record hashes to `hash`: not in the table yet.
    fn insert_record<K: RecordKey>(
        &mut self,
        hasher: &foldhash::fast::RandomState,
        hash: u64,
        limit: u32,
        key: K,
        tat: u64,
    ) {
        let record = TatRecord {
            tat: AtomicU64::new(tat),
            limit,
            key,
        };
        K::table_mut(self).insert_unique(hash, record, |s| s.key.record_hash(s.limit, hasher));
    }

    fn len(&self) -> usize {
        self.v4.len() + self.v6.len() + self.other.len()
    }

    /// The sweep the shard runs itself: drops the keys that refilled at least
    /// [`SWEEP_GRACE_NANOS`] ago (the constant says why not at once).
    fn sweep_refilled(&mut self, now: u64, hasher: &foldhash::fast::RandomState) {
        self.sweep(now.saturating_sub(SWEEP_GRACE_NANOS), now, hasher);
    }

    /// Drops the keys whose TAT is not after `refilled_by` (at most `now`).
    fn sweep(&mut self, refilled_by: u64, now: u64, hasher: &foldhash::fast::RandomState) {
        each_table!(self, |t| sweep_table(t, refilled_by, hasher));
        self.sweep_at_len = (2 * self.len()).max(64);
        self.sweep_at_time = now.saturating_add(SWEEP_INTERVAL_NANOS);
    }

    fn note_tolerance(&mut self, id: u32, tolerance: f32) {
        match self.tolerances.iter_mut().find(|(i, _)| *i == id) {
            Some((_, t)) => *t = tolerance,
            None => self.tolerances.push((id, tolerance)),
        }
    }

    /// At the cap: forgets about an eighth of the keys, those that have used the smallest share of
    /// their limit's tolerance. The threshold comes from a sample (the table's order has nothing to
    /// do with the TATs), so the work under the lock is one pass over the tables per `cap / 8` new
    /// keys, with no allocation proportional to the shard.
    fn evict_nearest_refill(&mut self, now: u64, cap: usize, hasher: &foldhash::fast::RandomState) {
        // Expired records (left by decisions under the read lock) go first, and count.
        let before = self.len();
        each_table!(self, |t| sweep_table(t, now, hasher));
        let target = (cap / 8).max(1).saturating_sub(before - self.len());
        if target == 0 {
            return;
        }
        let tolerances = &self.tolerances;
        // How much of its tolerance a key has used: near 0 = almost fully refilled, 1 = just
        // limited.
        let used = |tat: u64, id: u32| {
            let tolerance = tolerances
                .iter()
                .find(|(i, _)| *i == id)
                .map_or(1.0, |(_, t)| *t);
            tat.saturating_sub(now) as f32 / tolerance
        };
        let len = self.len();
        // A sample from each table in proportion to its size.
        let share = |n: usize| (n * EVICTION_SAMPLE).div_ceil(len);
        let mut sample: Vec<f32> = Vec::with_capacity(EVICTION_SAMPLE + 3);
        each_table!(self, |t| sample.extend(
            t.iter()
                .take(share(t.len()))
                .map(|s| used(s.tat.load(Relaxed), s.limit))
        ));
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
            each_table!(self, |t| t.retain(|s| forget(*s.tat.get_mut(), s.limit)));
            if evicted >= target {
                break;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;
    use crate::quota::Quota;
    use std::net::{Ipv4Addr, Ipv6Addr};
    use std::time::Duration;

    #[test]
    fn ip_keys_are_stored_compactly_and_other_keys_as_themselves() {
        assert_eq!(std::mem::size_of::<TatRecord<u32>>(), 16);
        assert_eq!(std::mem::size_of::<TatRecord<[u8; 16]>>(), 32);
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

    const S: u64 = 1_000_000_000;

    /// Decides one unit of `limit` for `key`: whether it passed.
    fn admit<C: Clock>(table: &GcraTable, limit: &crate::Limit, key: &Key, clock: &C) -> bool {
        table
            .decide(limit.gcra().unwrap(), limit.id(), key, 1, clock)
            .allowed
    }

    fn limited(table: &GcraTable, limit: &crate::Limit, key: &Key, clock: &ManualClock) -> bool {
        let params = limit.gcra().unwrap();
        let (_, one) = table.peek(params, limit.id(), key, clock);
        !one.allowed
    }

    #[test]
    fn the_table_counts_and_sweeps_keys_of_every_form() {
        let table = GcraTable::new(4, 1000);
        assert_eq!((table.shard_count(), table.shard_cap), (4, 1000));
        let clock = ManualClock::new();
        clock.set(Duration::from_secs(10));
        let limit = crate::Limit::new("table-len", Quota::per_second(1)).unwrap();
        let keys = [
            Key::from(Ipv4Addr::new(192, 0, 2, 7)),
            Key::from("2001:db8::1".parse::<Ipv6Addr>().unwrap()),
            Key::from("alice"),
        ];
        for key in &keys {
            assert!(admit(&table, &limit, key, &clock));
        }
        assert_eq!(table.len(), 3);
        // Not yet refilled: a sweep keeps them.
        table.sweep(clock.now_nanos() + S / 2);
        assert_eq!(table.len(), 3);
        table.sweep(clock.now_nanos() + S);
        assert_eq!(table.len(), 0);
    }

    #[test]
    fn a_sweep_gives_back_the_memory_of_a_burst_of_keys() {
        let table = GcraTable::new(1, 100_000);
        let clock = ManualClock::new();
        let limit = crate::Limit::new("table-shrink", Quota::per_second(1)).unwrap();
        for i in 0..5000u32 {
            assert!(admit(&table, &limit, &Key::from(format!("k{i}")), &clock));
        }
        let capacity = |table: &GcraTable| table.shards[0].table.read().unwrap().other.capacity();
        assert!(capacity(&table) >= 5000);
        table.sweep(clock.now_nanos() + S);
        assert_eq!(table.len(), 0);
        assert!(
            capacity(&table) < 100,
            "{} after the sweep",
            capacity(&table)
        );
    }

    /// At the cap, the keys that used the smallest share of their own limit's tolerance go first:
    /// an hourly key half refilled before a per-second key just limited, though its TAT is further
    /// ahead.
    #[test]
    fn eviction_ranks_keys_by_the_share_of_their_own_limits_tolerance() {
        let table = GcraTable::new(1, 8);
        let clock = ManualClock::new();
        let hourly = crate::Limit::new("table-evict-hourly", Quota::per_hour(1)).unwrap();
        let second = crate::Limit::new("table-evict-second", Quota::per_second(1)).unwrap();
        let slow: Vec<Key> = (0..4).map(|i| Key::from(format!("slow-{i}"))).collect();
        let fast: Vec<Key> = (0..5).map(|i| Key::from(format!("fast-{i}"))).collect();
        for key in &slow {
            assert!(admit(&table, &hourly, key, &clock));
        }
        clock.advance(Duration::from_secs(1800));
        for key in &fast {
            assert!(admit(&table, &second, key, &clock));
        }
        // The 9th key met a full shard: one key was forgotten, an hourly one.
        assert_eq!(table.len(), 8);
        for key in &fast {
            assert!(limited(&table, &second, key, &clock), "{key:?} was evicted");
        }
        let kept = slow.iter().filter(|k| limited(&table, &hourly, k, &clock));
        assert_eq!(kept.count(), 3);
    }

    /// Moves the hot key back into its table, state and all (as a later hot key does).
    fn cool(table: &GcraTable, now: u64) {
        let shard = &table.shards[0];
        let mut locked = write(&shard.table);
        if let Some((limit, key, tat)) = shard.hot.take() {
            table.put_back(&mut locked, limit, key, tat, now);
        }
    }

    /// A hot key decides exactly what its record in the table did, through every operation; and
    /// decisions racing with its moves into and out of the slot admit exactly the limit.
    #[test]
    fn a_hot_key_keeps_its_state_and_exact_counts_through_its_moves() {
        let table = GcraTable::new(1, 1000);
        let clock = ManualClock::new();
        clock.set(Duration::from_secs(10));
        let limit = crate::Limit::new("hot", Quota::per_minute(60).with_max_burst(9)).unwrap();
        let params = limit.gcra().unwrap();
        let id = limit.id();
        let key = Key::from("hot");
        let hash = key.record_hash(id, &table.hasher);
        let decide = |n| table.decide(params, id, &key, n, &clock);
        assert!(decide(4).allowed);
        table.make_hot(&table.shards[0], hash, id, &key, &clock);
        assert_eq!(table.shards[0].hot.len(), 1);
        assert_eq!(table.len(), 1, "in the slot, not also in the table");
        // 4 of 10 used: 6 pass, the 7th does not.
        let (_, one) = table.peek(params, id, &key, &clock);
        assert_eq!(one.remaining, 5);
        assert!(decide(6).allowed);
        assert!(!decide(1).allowed);
        // Settlements (a refund is one of -quantity) reach the hot TAT.
        table.settle(params, id, &key, -2, 0, &clock);
        assert!(decide(2).allowed);
        assert!(!decide(1).allowed);
        table.settle(params, id, &key, -1, 0, &clock);
        assert!(decide(1).allowed);
        // Out and back in: the same state.
        cool(&table, clock.now_nanos());
        assert_eq!(table.shards[0].hot.len(), 0);
        assert!(!decide(1).allowed);
        table.make_hot(&table.shards[0], hash, id, &key, &clock);
        assert!(!decide(1).allowed);
        // Forgotten: a full burst again, and no longer hot.
        table.forget(id, &key);
        assert_eq!(table.len(), 0);
        assert!(decide(10).allowed);
        // An explicit sweep drops an expired hot key.
        table.make_hot(&table.shards[0], hash, id, &key, &clock);
        assert_eq!(table.shards[0].hot.len(), 1);
        table.sweep(clock.now_nanos() + 20 * S);
        assert_eq!(table.len(), 0);

        // Eight threads decide on two keys of one shard while another moves them into and out of
        // the hot slot (a frozen clock): exactly each key's limit passes.
        let keys = [Key::from("a"), Key::from("b")];
        let hashes = keys.clone().map(|k| k.record_hash(id, &table.hasher));
        let stop = std::sync::atomic::AtomicBool::new(false);
        let admitted: Vec<[usize; 2]> = std::thread::scope(|s| {
            let mover = s.spawn(|| {
                let mut moves = 0;
                while !stop.load(Relaxed) {
                    for (k, hash) in keys.iter().zip(hashes) {
                        table.make_hot(&table.shards[0], hash, id, k, &clock);
                        moves += 1;
                        cool(&table, clock.now_nanos());
                    }
                }
                moves
            });
            let deciders: Vec<_> = (0..8)
                .map(|t| {
                    let (table, keys, clock) = (&table, &keys, &clock);
                    s.spawn(move || {
                        let mut admitted = [0usize; 2];
                        for i in 0..20_000 {
                            let k = (t + i) % 2;
                            let d = table.decide(params, id, &keys[k], 1, clock);
                            admitted[k] += usize::from(d.allowed);
                        }
                        admitted
                    })
                })
                .collect();
            let admitted = deciders.into_iter().map(|d| d.join().unwrap()).collect();
            stop.store(true, Relaxed);
            assert!(mover.join().unwrap() > 0);
            admitted
        });
        for k in 0..2 {
            assert_eq!(admitted.iter().map(|a| a[k]).sum::<usize>(), 10, "key {k}");
        }
    }

    /// A peek and a refund racing with the key's moves into and out of the hot slot find its state
    /// every time (looked for in the slot before the lock, a key moved in meanwhile was in neither:
    /// a spent key peeked as untouched, a refund lost).
    #[test]
    fn a_peek_and_a_refund_find_a_key_moving_into_the_hot_slot() {
        let table = GcraTable::new(1, 1000);
        let clock = ManualClock::new();
        clock.set(Duration::from_secs(10));
        let limit = crate::Limit::new("hot", Quota::per_minute(60).with_max_burst(9)).unwrap();
        let (params, id, key) = (limit.gcra().unwrap(), limit.id(), Key::from("hot"));
        let hash = key.record_hash(id, &table.hasher);
        assert!(table.decide(params, id, &key, 10, &clock).allowed);
        let stop = std::sync::atomic::AtomicBool::new(false);
        // Stops the mover however this thread leaves the scope (a failed assertion too).
        struct Stop<'a>(&'a std::sync::atomic::AtomicBool);
        impl Drop for Stop<'_> {
            fn drop(&mut self) {
                self.0.store(true, Relaxed);
            }
        }
        std::thread::scope(|s| {
            s.spawn(|| {
                while !stop.load(Relaxed) {
                    table.make_hot(&table.shards[0], hash, id, &key, &clock);
                    cool(&table, clock.now_nanos());
                }
            });
            let _stop = Stop(&stop);
            for i in 0..50_000 {
                let (_, one) = table.peek(params, id, &key, &clock);
                assert!(!one.allowed, "peek {i} found no state");
            }
            // A refund of one and a charge of one, 20,000 times: the key stays spent.
            for i in 0..20_000 {
                table.settle(params, id, &key, -1, 0, &clock);
                assert!(
                    table.decide(params, id, &key, 1, &clock).allowed,
                    "refund {i} lost"
                );
            }
        });
    }

    /// A key that one thread alone decides on stays in the table (the slot would only cost it
    /// instructions); one that two threads take turns on moves to the slot.
    #[test]
    fn a_key_moves_to_the_hot_slot_when_two_threads_decide_on_it_not_one() {
        let clock = crate::clock::QuantaClock::new();
        let limit = crate::Limit::new("sampled", Quota::per_second(1_000_000_000)).unwrap();
        let key = Key::from(Ipv4Addr::new(192, 0, 2, 9));
        let hot = |table: &GcraTable| table.shards.iter().map(|s| s.hot.len()).sum::<usize>();
        let alone = GcraTable::new(4, 1000);
        for _ in 0..200_000 {
            assert!(admit(&alone, &limit, &key, &clock));
        }
        assert_eq!(hot(&alone), 0);
        let shared = GcraTable::new(4, 1000);
        std::thread::scope(|s| {
            for _ in 0..2 {
                s.spawn(|| {
                    for _ in 0..200_000 {
                        assert!(admit(&shared, &limit, &key, &clock));
                    }
                });
            }
        });
        assert_eq!(hot(&shared), 1);
        assert_eq!(shared.len(), 1);
    }

    /// A refund moves back its own key's TAT and no other, however many keys share a shard.
    #[test]
    fn a_refund_among_thousands_of_keys_moves_only_its_own() {
        let table = GcraTable::new(1, 100_000);
        let clock = ManualClock::new();
        let limit = crate::Limit::new("table-refund", Quota::per_minute(1)).unwrap();
        let other = crate::Limit::new("table-refund-other", Quota::per_minute(1)).unwrap();
        let keys: Vec<Key> = (0..3000u32)
            .map(|i| Key::from(format!("user-{i}")))
            .collect();
        for key in &keys {
            assert!(admit(&table, &limit, key, &clock) && admit(&table, &other, key, &clock));
        }
        let params = limit.gcra().unwrap();
        for key in keys.iter().step_by(2) {
            table.settle(params, limit.id(), key, -1, 0, &clock);
        }
        for (i, key) in keys.iter().enumerate() {
            assert_eq!(limited(&table, &limit, key, &clock), i % 2 == 1, "{key:?}");
            assert!(limited(&table, &other, key, &clock), "{key:?}");
        }
    }
}
