//! The general store: every algorithm but a lone GCRA limit, and stacks of limits. One entry per
//! key and stack (or lone limit) holds one state per limit, decided under its shard's mutex, with
//! sweeps and eviction by the share of its limits an entry uses.

use std::collections::VecDeque;
use std::hash::BuildHasher;
use std::sync::{Mutex, MutexGuard};

use hashbrown::HashTable;

use super::{EVICTION_SAMPLE, SWEEP_INTERVAL_NANOS};
use crate::clock::Clock;
use crate::decision::Decision;
use crate::gcra;
use crate::key::Key;
use crate::limit::{Algorithm, Limit, MAX_STACKED_QUOTAS};
use crate::window::{self, FixedState, SlidingState};

/// The windows, the sliding log, the concurrency limit and stacks of limits (whose GCRA limits keep
/// their TAT here, apart from the same limits checked alone): entries in shards behind mutexes,
/// each shard holding at most `shard_cap` entries (beyond it only while requests are in flight).
pub(super) struct GeneralStore {
    hasher: foldhash::fast::RandomState,
    shards: Box<[Mutex<GeneralShard>]>,
    shard_cap: usize,
}

impl GeneralStore {
    /// `shards` (a power of two) empty shards of at most `shard_cap` entries each.
    pub(super) fn new(shards: usize, shard_cap: usize) -> Self {
        debug_assert!(shards.is_power_of_two());
        let shards = (0..shards)
            .map(|_| {
                Mutex::new(GeneralShard {
                    table: HashTable::new(),
                    scales: Vec::new(),
                    sweep_at_len: 64,
                    sweep_at_time: 0,
                    latest_now: 0,
                })
            })
            .collect();
        GeneralStore {
            hasher: foldhash::fast::RandomState::default(),
            shards,
            shard_cap,
        }
    }

    /// Decides one limit alone (any algorithm but the GCRA, which has a table of its own).
    pub(super) fn decide_alone<C: Clock>(
        &self,
        limit: &Limit,
        key: &Key,
        quantity: u64,
        clock: &C,
    ) -> Decision {
        let mut out = [PLACEHOLDER];
        self.decide(std::slice::from_ref(limit), key, quantity, clock, &mut out);
        out[0]
    }

    /// Decides a stack of limits together: one decision per limit, in order.
    pub(super) fn decide_stack<C: Clock>(
        &self,
        limits: &[Limit],
        key: &Key,
        quantity: u64,
        clock: &C,
    ) -> Vec<Decision> {
        let mut out = vec![PLACEHOLDER; limits.len()];
        self.decide(limits, key, quantity, clock, &mut out);
        out
    }

    /// Decides `limits` (1 to [`MAX_STACKED_QUOTAS`], concurrency only alone), one decision per
    /// limit into `out`, under one lock: each limit decides on the stored state, and the new states
    /// are written only if every limit admits.
    fn decide<C: Clock>(
        &self,
        limits: &[Limit],
        key: &Key,
        quantity: u64,
        clock: &C,
        out: &mut [Decision],
    ) {
        debug_assert!(!limits.is_empty() && limits.len() <= MAX_STACKED_QUOTAS);
        let id = limits[0].id();
        let hash = self.hasher.hash_one((id, key));
        let mut shard = self.shard(hash);
        // Read the clock under the lock, so that each key sees its decisions' times in order (the
        // sliding log and the windows rely on it).
        let now = shard.now(clock);
        let origin = clock.unix_origin_nanos();
        if now >= shard.sweep_at_time {
            shard.sweep(now, &self.hasher);
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
            shard.sweep(now, &self.hasher);
        }
        shard.note_scales(limits);
        if shard.table.len() >= self.shard_cap {
            shard.evict_least_used(now, origin, self.shard_cap, &self.hasher);
        }
        let entry = Entry {
            limit: id,
            key: key.clone(),
            cells,
        };
        shard
            .table
            .insert_unique(hash, entry, |e| self.hasher.hash_one((e.limit, &e.key)));
    }

    /// Gives back `quantity` in-flight units of a concurrency `limit` for `key` (saturating), and
    /// forgets the key when none are left. Does nothing for other algorithms.
    pub(super) fn release(&self, limit: &Limit, key: &Key, quantity: u64) {
        if limit.concurrency().is_none() {
            return;
        }
        let id = limit.id();
        let hash = self.hasher.hash_one((id, key));
        let mut shard = self.shard(hash);
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

    /// `key`'s state under each of `limits` (a lone limit or a stack, as decided) at `clock`'s now,
    /// for a quantity of 0 and of 1: each decided on a copy of the stored state, so nothing is
    /// written.
    pub(super) fn peek<C: Clock>(
        &self,
        limits: &[Limit],
        key: &Key,
        clock: &C,
    ) -> Vec<(Decision, Decision)> {
        let id = limits[0].id();
        let hash = self.hasher.hash_one((id, key));
        let mut shard = self.shard(hash);
        let now = shard.now(clock);
        let unix_now = now.saturating_add(clock.unix_origin_nanos());
        let entry = shard
            .table
            .find(hash, |e: &Entry| e.limit == id && e.key == *key);
        limits
            .iter()
            .enumerate()
            .map(|(position, limit)| {
                let stored = entry.and_then(|e| {
                    e.cells.iter().find(|c| {
                        c.limit == limit.id()
                            && c.position == position as u8
                            && c.state.algorithm() == limit.algorithm()
                            && c.expires_at > now
                    })
                });
                let copy = || stored.map_or(State::fresh(limit.algorithm()), |c| c.state.copy());
                let (state_now, _) = decide_one(&mut copy(), limit, now, unix_now, 0);
                let (next, _) = decide_one(&mut copy(), limit, now, unix_now, 1);
                (state_now, next)
            })
            .collect()
    }

    /// Forgets `key`'s entry under `limits` (a lone limit or a stack), requests in flight included.
    pub(super) fn forget(&self, limits: &[Limit], key: &Key) {
        let id = limits[0].id();
        let hash = self.hasher.hash_one((id, key));
        let mut shard = self.shard(hash);
        if let Ok(occupied) = shard
            .table
            .find_entry(hash, |e: &Entry| e.limit == id && e.key == *key)
        {
            occupied.remove();
        }
    }

    /// Gives back `quantity` units that `limits` (a lone limit or a stack, keyed as
    /// [`decide`](Self::decide) keys them) admitted for `key` at most `since` ago: see
    /// [`Backend::refund`](crate::Backend::refund) for what each algorithm gives back.
    pub(super) fn refund<C: Clock>(
        &self,
        limits: &[Limit],
        key: &Key,
        quantity: u64,
        since: u64,
        clock: &C,
    ) {
        let Some(first) = limits.first() else {
            return;
        };
        let id = first.id();
        let hash = self.hasher.hash_one((id, key));
        let mut shard = self.shard(hash);
        let now = shard.now(clock);
        let unix_now = now.saturating_add(clock.unix_origin_nanos());
        let eq = |e: &Entry| e.limit == id && e.key == *key;
        let Ok(mut occupied) = shard.table.find_entry(hash, eq) else {
            return;
        };
        let cells = &mut occupied.get_mut().cells;
        for (position, limit) in limits.iter().enumerate() {
            if let Some(cell) = cells.find_mut(limit.id(), position as u8) {
                refund_state(&mut cell.state, limit, now, unix_now, quantity, since);
            }
        }
    }

    /// How many entries are live (including entries that have expired but were not swept yet).
    pub(super) fn len(&self) -> usize {
        self.shards.iter().map(|s| lock(s).table.len()).sum()
    }

    /// Drops every entry whose state has expired at `now`.
    pub(super) fn sweep(&self, now: u64) {
        for shard in self.shards.iter() {
            lock(shard).sweep(now, &self.hasher);
        }
    }

    fn shard(&self, hash: u64) -> MutexGuard<'_, GeneralShard> {
        // The same bits as the GCRA table's shards, for the same reason.
        lock(&self.shards[(hash >> 32) as usize & (self.shards.len() - 1)])
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

    /// A copy, for a peek to decide on without touching the stored state.
    fn copy(&self) -> State {
        match self {
            State::Gcra(tat) => State::Gcra(*tat),
            State::Fixed(s) => State::Fixed(*s),
            State::Sliding(s) => State::Sliding(*s),
            State::Log(log) => State::Log(log.clone()),
            State::InFlight(n) => State::InFlight(*n),
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

/// A limit's next state, decided but not yet written: it is written only if the whole stack passes.
#[derive(Clone, Copy)]
enum NextState {
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
    let mut pending = [(0usize, NextState::Log); MAX_STACKED_QUOTAS];
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
            if let (State::Log(log), NextState::Log) = (&mut cell.state, next) {
                log.truncate(log.len() - quantity as usize);
            }
            // Nothing was recorded: report the state as it stands.
            out[position] = decide_one(&mut cell.state, limit, now, unix_now, 0).0;
        }
    }
}

/// One limit's decision on `state`. Only the sliding log is changed in place (trimmed, and appended
/// to if admitted); the other states come back in [`NextState`].
fn decide_one(
    state: &mut State,
    limit: &Limit,
    now: u64,
    unix_now: u64,
    quantity: u64,
) -> (Decision, NextState) {
    match (state, limit.gcra(), limit.window(), limit.concurrency()) {
        (State::Gcra(tat), Some(params), _, _) => {
            let live = (*tat > now).then_some(*tat);
            let out = gcra::decide(live, now, params, quantity);
            (out.decision, NextState::Gcra(out.new_tat))
        }
        (State::Fixed(s), _, Some(params), _) => {
            let (d, next) = window::fixed_window(Some(*s), unix_now, params, quantity);
            (d, NextState::Fixed(next))
        }
        (State::Sliding(s), _, Some(params), _) => {
            let (d, next) = window::sliding_window(Some(*s), unix_now, params, quantity);
            (d, NextState::Sliding(next))
        }
        (State::Log(log), _, Some(params), _) => (
            window::sliding_log(log, unix_now, params, quantity),
            NextState::Log,
        ),
        (State::InFlight(n), _, _, Some(max)) => {
            let (d, next) = window::concurrency(*n, max, quantity);
            (d, NextState::InFlight(next))
        }
        _ => unreachable!("Cells::index_of gives each limit the state of its algorithm"),
    }
}

/// Takes `quantity` units admitted at most `since` ago out of `state` (at `now` on the backend's
/// clock, `unix_now` in Unix time). Whatever cannot be proven to be the request's own is left: a
/// refund may give back less than the request took, never more. Expiries are left as they are
/// (later than needed at worst).
fn refund_state(
    state: &mut State,
    limit: &Limit,
    now: u64,
    unix_now: u64,
    quantity: u64,
    since: u64,
) {
    let admitted_after = unix_now.saturating_sub(since);
    match (state, limit.gcra(), limit.window()) {
        (State::Gcra(tat), Some(params), _) if *tat > now => {
            // Less the time since the admission: see `GcraTable::refund`.
            let back = params
                .emission_interval()
                .saturating_mul(quantity)
                .saturating_sub(since);
            *tat = tat.saturating_sub(back);
        }
        (State::Fixed(s), _, Some(params)) => {
            let window = unix_now / params.period();
            // Only while the window that admitted the request is still the current one (and it
            // surely is when the earliest admission time falls in it too).
            if s.window == window && admitted_after / params.period() == window {
                s.count = s.count.saturating_sub(quantity);
            }
        }
        (State::Sliding(s), _, Some(params)) => {
            let window = unix_now / params.period();
            let (mut current, mut previous) = match *s {
                ref s if s.window == window => (s.current, s.previous),
                ref s if s.window + 1 == window => (0, s.current),
                _ => return,
            };
            match window - admitted_after / params.period() {
                0 => current = current.saturating_sub(quantity),
                // Admitted in the previous window, or in this one within `since` of its start:
                // the previous window's count weighs less, so taking the units from it never gives
                // back more than the request took.
                1 => previous = previous.saturating_sub(quantity),
                _ => return,
            }
            *s = SlidingState {
                window,
                current,
                previous,
            };
        }
        (State::Log(log), _, Some(_)) => {
            // The oldest units logged at or after the earliest admission time: the request's own,
            // or older ones (which leave the window sooner, so removing them gives back less).
            let from = log.partition_point(|t| *t < admitted_after);
            let to = from.saturating_add(quantity as usize).min(log.len());
            log.drain(from..to);
        }
        _ => {}
    }
}

/// Writes an admitted stack's new state into `cell`, with when it expires on the backend's clock.
fn commit(cell: &mut Cell, next: NextState, limit: &Limit, now: u64, origin: u64) {
    let period = limit.window().map_or(0, |p| p.period());
    // Window states expire on a Unix-time boundary; the backend's clock is Unix time − origin.
    let at_unix = |t: u64| t.saturating_sub(origin);
    cell.expires_at = match (&mut cell.state, next) {
        (State::Gcra(tat), NextState::Gcra(next)) => {
            *tat = next.filter(|t| *t > now).unwrap_or(0);
            *tat
        }
        (State::Fixed(s), NextState::Fixed(next)) => {
            *s = next.unwrap_or_default();
            next.map_or(0, |s| {
                at_unix(s.window.saturating_add(1).saturating_mul(period))
            })
        }
        (State::Sliding(s), NextState::Sliding(next)) => {
            *s = next.unwrap_or_default();
            // The current count is weighed until the end of the next window, the previous one until
            // the end of this window.
            next.map_or(0, |s| {
                let windows = if s.current > 0 { 2 } else { 1 };
                at_unix(s.window.saturating_add(windows).saturating_mul(period))
            })
        }
        (State::Log(log), NextState::Log) => log
            .back()
            .map_or(0, |newest| at_unix(newest.saturating_add(period))),
        (State::InFlight(n), NextState::InFlight(next)) => {
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
    /// The latest time a decision in this shard used.
    latest_now: u64,
}

impl GeneralShard {
    /// The clock's reading, never before one an earlier holder of this shard's lock used. The
    /// default [`QuantaClock`](crate::clock::QuantaClock) reads the TSC without a fence, so a
    /// reading taken just after acquiring the lock may be a few nanoseconds older than the previous
    /// holder's; a window decided on the older side of a boundary would then overwrite the newer
    /// window's count (one admission too many). Keys live in one shard, so this keeps each key's
    /// times in order.
    fn now<C: Clock>(&mut self, clock: &C) -> u64 {
        let now = clock.now_nanos().max(self.latest_now);
        self.latest_now = now;
        now
    }

    fn sweep(&mut self, now: u64, hasher: &foldhash::fast::RandomState) {
        // A sweep that dropped a window ending at `now` is a use of that time too: a decision after
        // it must not read an older one and decide in the dropped window afresh.
        self.latest_now = self.latest_now.max(now);
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

    #[test]
    fn entries_are_the_size_the_backend_documents() {
        // The general store's entry, as documented on MemoryBackend.
        assert_eq!(std::mem::size_of::<Entry>(), 80);
        assert_eq!(std::mem::size_of::<Cell>(), 48);
    }
}
