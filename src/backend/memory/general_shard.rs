//! A shard of the general store: its entries behind one mutex, with its sweeps and eviction.

use std::hash::BuildHasher;

use hashbrown::HashTable;

use super::entries::*;
use super::tuning::{EVICTION_SAMPLE, SWEEP_INTERVAL_NANOS};
use crate::clock::Clock;
use crate::key::Key;
use crate::limit::{Algorithm, Limit};
use crate::window;

/// The general store's shard: a table of entries behind a mutex, since a stack's decision reads and
/// writes several states at once.
pub(super) struct GeneralShard {
    pub(super) table: HashTable<Entry>,
    /// The scale of each limit seen in this shard (by name, place in its stack and algorithm), to
    /// rank entries of different limits at the cap (the last one seen, if two limits share a name
    /// with different quotas).
    pub(super) scales: Vec<(ScaleKey, Scale)>,
    /// Sweep expired entries when the table reaches this many entries...
    pub(super) sweep_at_len: usize,
    /// ...or when the clock reaches this time.
    pub(super) sweep_at_time: u64,
    /// The latest time a decision in this shard used.
    pub(super) latest_now: u64,
}

impl GeneralShard {
    pub(super) fn with_capacity(capacity: usize) -> Self {
        GeneralShard {
            table: HashTable::with_capacity(capacity),
            scales: Vec::new(),
            sweep_at_len: 64,
            sweep_at_time: 0,
            latest_now: 0,
        }
    }

    /// The clock's reading, never before one an earlier holder of this shard's lock used. The
    /// default [`QuantaClock`](crate::clock::QuantaClock) reads the TSC without a fence, so a
    /// reading taken just after acquiring the lock may be a few nanoseconds older than the previous
    /// holder's; a window decided on the older side of a boundary would then overwrite the newer
    /// window's count (one admission too many). Keys live in one shard, so this keeps each key's
    /// times in order.
    pub(super) fn now<C: Clock>(&mut self, clock: &C) -> u64 {
        let now = clock.now_nanos().max(self.latest_now);
        self.latest_now = now;
        now
    }

    pub(super) fn sweep(&mut self, now: u64, hasher: &foldhash::fast::RandomState) {
        // A sweep that dropped a window ending at `now` is a use of that time too: a decision after
        // it must not read an older one and decide in the dropped window afresh.
        self.latest_now = self.latest_now.max(now);
        self.drop_expired(now, hasher);
        self.sweep_at_len = (2 * self.table.len()).max(64);
        self.sweep_at_time = now.saturating_add(SWEEP_INTERVAL_NANOS);
    }

    pub(super) fn drop_expired(&mut self, now: u64, hasher: &foldhash::fast::RandomState) {
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
    pub(super) fn note_scales(&mut self, limits: &[Limit]) {
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

    /// At the cap: forgets about an eighth of the entries, those that use the smallest share of
    /// their limits ([`share_used`]), but never one with requests in flight (that would admit more
    /// than the limit; such entries are bounded by the requests in flight, not by the cap). Ranking
    /// by expiry instead would let an attacker rotating through fresh keys push out a client being
    /// limited (a heavy sliding-log user expires before a later light one, and every fixed-window
    /// entry of one window expires together), which would then start over with a full quota.
    ///
    /// As in the GCRA table, the threshold comes from a sample, so the work under the lock is one
    /// pass over the table per `cap / 8` new keys, with no allocation proportional to the shard.
    pub(super) fn evict_least_used(
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
        let used = |e: &Entry| entry_share_used(&e.cells, &e.key, scales, now, unix_now);
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
pub(super) type ScaleKey = (u32, u8, Algorithm);

/// What a limit's state is measured against to tell how much of the limit it uses.
#[derive(Clone, Copy)]
pub(super) enum Scale {
    /// The GCRA's tolerance in nanoseconds (as decided, including a delay, like the GCRA table's).
    Gcra(f32),
    Window(window::WindowParams),
}

/// The largest share of its limit that any cell of an entry uses at `now`, or `None` while it has
/// requests in flight. A stack is as close to being limited as its most used limit.
pub(super) fn entry_share_used(
    cells: &Cells,
    key: &Key,
    scales: &[(ScaleKey, Scale)],
    now: u64,
    unix_now: u64,
) -> Option<f32> {
    cells.iter().try_fold(0.0f32, |most, cell| {
        let scale_key = (cell.limit, cell.position, cell.state.algorithm());
        let scale = scales
            .iter()
            .find(|(k, _)| *k == scale_key)
            .map(|(_, s)| *s);
        Some(most.max(share_used(&cell.state, scale, key, now, unix_now)?))
    })
}

/// The share of its limit that one state uses at `now` (`unix_now` for the windows): 0 for a state
/// that admits a full quota, 1 for a client being limited, `None` with requests in flight. The
/// same measure for every algorithm and period, so that the entries of different limits compare.
pub(super) fn share_used(
    state: &State,
    scale: Option<Scale>,
    key: &Key,
    now: u64,
    unix_now: u64,
) -> Option<f32> {
    let share = match (state, scale) {
        (State::InFlight(n, _), _) => return (*n == 0).then_some(0.0),
        (State::Gcra(tat), Some(Scale::Gcra(tolerance))) => {
            tat.saturating_sub(now) as f32 / tolerance
        }
        (State::Fixed(s), Some(Scale::Window(p))) => {
            // A count of a window that has passed no longer counts (on the key's own clock); one
            // of the next (kept by a clock ahead: a restored file) does, as `fixed_window` reads it.
            let window = p.fixed_window_at(unix_now + p.shift_of(key)).0;
            // The next window looked for only past this one (a calendar's is reckoned then).
            let next = || p.fixed_window_at(p.fixed_window_end(window)).0;
            if s.window == window || (s.window > window && s.window == next()) {
                s.count as f32 / p.limit() as f32
            } else {
                0.0
            }
        }
        (State::Sliding(s), Some(Scale::Window(p))) => {
            // The estimate `window::sliding_window` decides on: previous × left / period + current
            // (of the next window from its start, as it reads one kept by a clock ahead).
            let period = p.period();
            let (mut window, mut left) = (unix_now / period, period - unix_now % period);
            if s.window == window.saturating_add(1) {
                (window, left) = (s.window, period);
            }
            let (current, previous) = window::SlidingState::at(Some(*s), window);
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
    use crate::key::Key;
    use crate::window::{FixedState, SlidingState};

    const S: u64 = 1_000_000_000;

    /// An entry of `key` holding one cell of `limit`.
    fn entry(limit: u32, key: String, expires_at: u64, state: State) -> Entry {
        let (position, key) = (0, Key::from(key));
        let cells = Cells::One(Cell {
            limit,
            position,
            expires_at,
            state,
        });
        Entry { limit, key, cells }
    }

    /// An entry of one GCRA cell of limit 1 (scaled as `Scale::Gcra(10 s)` in these tests).
    fn gcra_entry(i: u64, tat: u64) -> Entry {
        entry(1, format!("k{i}"), tat, State::Gcra(tat))
    }

    /// An entry of one concurrency cell (limit 2) with `n` requests in flight.
    fn in_flight_entry(i: u64, n: u64) -> Entry {
        entry(2, format!("f{i}"), u64::MAX, State::InFlight(n, 1))
    }

    fn insert(shard: &mut GeneralShard, hasher: &foldhash::fast::RandomState, entry: Entry) {
        let hash = |e: &Entry| hasher.hash_one((e.limit, &e.key));
        shard.table.insert_unique(hash(&entry), entry, hash);
    }

    /// A shard with room for `capacity` entries holding `n` GCRA entries, using 1/n to n/n of
    /// their limit (a tolerance of 10 s) at `now`.
    fn gcra_shares(
        n: u64,
        capacity: usize,
        now: u64,
        hasher: &foldhash::fast::RandomState,
    ) -> GeneralShard {
        let mut shard = GeneralShard::with_capacity(capacity);
        let scale = Scale::Gcra((10 * S) as f32);
        shard.scales.push(((1, 0, Algorithm::Gcra), scale));
        for i in 0..n {
            let entry = gcra_entry(i, now + (i + 1) * 10 * S / n);
            insert(&mut shard, hasher, entry);
        }
        shard
    }

    fn keys(shard: &GeneralShard) -> Vec<String> {
        let mut keys: Vec<String> = shard.table.iter().map(|e| e.key.to_string()).collect();
        keys.sort();
        keys
    }

    #[test]
    fn share_used_measures_each_state_against_its_limit() {
        let now = 100 * S;
        // The windows read Unix time: window 10 of 10 s spans [100 s, 110 s); 2.5 s into it, 3/4
        // of the previous window's count still weighs.
        let unix = 100 * S + S * 5 / 2;
        let window = Some(Scale::Window(window::WindowParams::new(10 * S, 10)));
        let gcra = Some(Scale::Gcra((10 * S) as f32));
        let key = Key::from("k");
        let share = |state: &State, scale| share_used(state, scale, &key, now, unix);
        // GCRA: the TAT's distance from now against the tolerance.
        assert_eq!(share(&State::Gcra(now + 5 * S), gcra), Some(0.5));
        assert_eq!(share(&State::Gcra(now - S), gcra), Some(0.0));
        // Fixed window: the count of the current window only.
        let fixed = |window, count| State::Fixed(FixedState { window, count });
        assert_eq!(share(&fixed(10, 4), window), Some(0.4));
        assert_eq!(share(&fixed(9, 4), window), Some(0.0));
        // The next window's count (kept by a clock ahead, a restored file) counts, as decided;
        // one further on does not.
        assert_eq!(share(&fixed(11, 10), window), Some(1.0));
        assert_eq!(share(&fixed(12, 10), window), Some(0.0));
        // Sliding window: previous × left / period + current, over the limit.
        let sliding = |window, current, previous| {
            State::Sliding(SlidingState {
                window,
                current,
                previous,
            })
        };
        let close = |got: Option<f32>, want: f32| {
            let got = got.expect("a share");
            assert!((got - want).abs() < 1e-6, "{got} != {want}");
        };
        close(share(&sliding(10, 2, 8), window), (8.0 * 0.75 + 2.0) / 10.0);
        close(share(&sliding(9, 8, 5), window), 8.0 * 0.75 / 10.0);
        close(share(&sliding(8, 8, 5), window), 0.0);
        close(share(&sliding(11, 10, 0), window), 1.0);
        // Sliding log: the units still inside the period.
        let log = State::Log([unix - 10 * S, unix - 9 * S, unix - S].into());
        close(share(&log, window), 0.2);
        // In flight: never forgotten while requests are in flight; nothing used at 0.
        assert_eq!(share(&State::InFlight(3, 1), None), None);
        assert_eq!(share(&State::InFlight(0, 1), None), Some(0.0));
        // No scale known (or another algorithm's): ranked as fully used.
        assert_eq!(share(&State::Gcra(now + 5 * S), None), Some(1.0));
        assert_eq!(share(&fixed(10, 4), gcra), Some(1.0));
    }

    #[test]
    fn eviction_forgets_the_least_used_eighth_and_never_an_entry_in_flight() {
        let hasher = foldhash::fast::RandomState::default();
        let now = 100 * S;
        // 8 GCRA entries using 1/8 to 8/8 of the limit and 56 with requests in flight: at a cap
        // of 64, an eighth (8) go; the in-flight ones cannot, so the 8 GCRA entries do.
        let mut shard = gcra_shares(8, 64, now, &hasher);
        for i in 0..56 {
            insert(&mut shard, &hasher, in_flight_entry(i, 1));
        }
        shard.evict_least_used(now, 0, 64, &hasher);
        assert_eq!(shard.table.len(), 56);
        assert!(shard.table.iter().all(|e| e.limit == 2));

        // 63 entries in flight and a single idle one: only the idle one goes (fewer than an
        // eighth: the entries in flight are bounded by the requests, not by the cap).
        let mut shard = GeneralShard::with_capacity(64);
        for i in 0..63 {
            insert(&mut shard, &hasher, in_flight_entry(i, 1));
        }
        insert(&mut shard, &hasher, in_flight_entry(63, 0));
        shard.evict_least_used(now, 0, 64, &hasher);
        assert_eq!(shard.table.len(), 63);
        assert!(!keys(&shard).contains(&"f63".to_string()));

        // 16 GCRA entries using 1/16 to 16/16: the 2 least used go (an eighth of a cap of 16).
        let mut shard = gcra_shares(16, 16, now, &hasher);
        shard.evict_least_used(now, 0, 16, &hasher);
        let mut want: Vec<String> = (2..16).map(|i| format!("k{i}")).collect();
        want.sort();
        assert_eq!(keys(&shard), want);
    }

    #[test]
    fn a_sweep_shrinks_the_table_only_when_it_is_over_four_times_its_entries() {
        // A shrink rehashes every entry under the shard's lock: it is worth it only when the table
        // holds more than four times the room its entries need.
        let hasher = foldhash::fast::RandomState::default();
        let now = 100 * S;
        let mut shard = GeneralShard::with_capacity(112);
        // 28 live entries in a table of room for 112 (none removed yet, so the room is exactly
        // that: a removal may leave a tombstone, which hashbrown counts out of the room left).
        for i in 0..28 {
            insert(&mut shard, &hasher, gcra_entry(i, now + S));
        }
        assert_eq!(shard.table.capacity(), 112, "hashbrown's room for 112");
        shard.sweep(now, &hasher);
        assert_eq!(shard.table.len(), 28);
        assert_eq!(shard.table.capacity(), 112, "four times its entries: kept");
        // One fewer live entry: more than four times; shrunk to room for twice the entries.
        shard.table.iter_mut().next().expect("an entry").cells = Cells::Empty;
        shard.sweep(now, &hasher);
        assert_eq!(shard.table.len(), 27);
        assert!(shard.table.capacity() < 112 && shard.table.capacity() >= 54);
    }
}
