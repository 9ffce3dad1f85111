//! The general store: every algorithm but a lone GCRA limit, and stacks of limits. One entry per
//! key and stack (or lone limit) holds one state per limit, decided under its shard's mutex.

use std::hash::BuildHasher;
use std::slice;
use std::sync::{Mutex, MutexGuard};

use super::entries::*;
use super::general_shard::*;
use super::tuning::Padded;
use crate::clock::Clock;
use crate::decision::Decision;
use crate::key::Key;
use crate::limit::{Limit, MAX_STACKED_QUOTAS};

/// Entries in shards behind mutexes, at most `shard_cap` a shard (beyond it only while requests
/// are in flight). A stack's GCRA limits keep their TAT here, apart from the same limits alone.
pub(super) struct GeneralStore {
    pub(super) hasher: foldhash::fast::RandomState,
    pub(super) shards: Box<[Padded<Mutex<GeneralShard>>]>,
    shard_cap: usize,
}

impl GeneralStore {
    /// `shards` (a power of two) empty shards of at most `shard_cap` entries each.
    pub(super) fn new(shards: usize, shard_cap: usize) -> Self {
        debug_assert!(shards.is_power_of_two());
        let shards = (0..shards)
            .map(|_| Padded(Mutex::new(GeneralShard::with_capacity(0))))
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
        self.decide(slice::from_ref(limit), key, &[quantity], clock, &mut out);
        out[0]
    }

    /// Decides `limits` (1 to [`MAX_STACKED_QUOTAS`], concurrency only alone), `quantities[i]`
    /// units under `limits[i]`, one decision per limit into `out`, under one lock: each limit
    /// decides on the stored state, and the new states are written only if every limit admits.
    pub(super) fn decide<C: Clock>(
        &self,
        limits: &[Limit],
        key: &Key,
        quantities: &[u64],
        clock: &C,
        out: &mut [Decision],
    ) {
        debug_assert!(!limits.is_empty() && limits.len() <= MAX_STACKED_QUOTAS);
        let (hash, mut shard) = self.locate(limits[0].id(), key);
        // Read the clock under the lock, so that each key sees its decisions' times in order (the
        // sliding log and the windows rely on it).
        let now = shard.now(clock);
        let origin = clock.unix_origin_nanos();
        if now >= shard.sweep_at_time {
            shard.sweep(now, &self.hasher);
        }
        self.update(&mut shard, hash, limits, key, (now, origin), |cells| {
            decide_cells(cells, limits, key, now, origin, quantities, out)
        });
    }

    /// Applies `f` to the cells of `key`'s entry (to empty cells if it has none), then drops the
    /// entry if none of them is live at `now`, or adds it if it is new and one is.
    pub(super) fn update(
        &self,
        shard: &mut GeneralShard,
        hash: u64,
        limits: &[Limit],
        key: &Key,
        (now, origin): (u64, u64),
        f: impl FnOnce(&mut Cells),
    ) {
        if let Ok(mut occupied) = shard.table.find_entry(hash, Entry::is(limits[0].id(), key)) {
            let cells = &mut occupied.get_mut().cells;
            f(cells);
            if !cells.retain_live(now) {
                occupied.remove();
            }
            return;
        }
        let mut cells = Cells::Empty;
        f(&mut cells);
        self.insert(shard, hash, limits, key, cells, now, origin);
    }

    /// Adds a new entry of `cells` for `key` under `limits` to `shard` (unless every cell has
    /// expired at `now`), sweeping or evicting first as the shard's size asks.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn insert(
        &self,
        shard: &mut GeneralShard,
        hash: u64,
        limits: &[Limit],
        key: &Key,
        mut cells: Cells,
        now: u64,
        origin: u64,
    ) {
        let id = limits[0].id();
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

    /// Gives back `quantity` in-flight units of a concurrency `limit` for `key` (saturating), taken
    /// under `lease` (0: any), and forgets the key when none are left. Does nothing for other
    /// algorithms, nor for slots of a lease the key no longer holds (it was reset since).
    pub(super) fn release(&self, limit: &Limit, key: &Key, quantity: u64, lease: u64) {
        if limit.concurrency().is_none() {
            return;
        }
        let id = limit.id();
        let (hash, mut shard) = self.locate(id, key);
        let Ok(mut occupied) = shard.table.find_entry(hash, Entry::is(id, key)) else {
            return;
        };
        let cells = &mut occupied.get_mut().cells;
        if let Some(cell) = cells.find_mut(id, 0)
            && let State::InFlight(n, held) = &mut cell.state
            && (lease == 0 || lease == *held)
        {
            *n = n.saturating_sub(quantity);
            if *n == 0 {
                cell.expires_at = 0;
            }
        }
        // Released slots are the only state of a concurrency key, so the cell goes at 0 at once
        // rather than at the next sweep; the clock is not needed to tell.
        if !cells.retain_live(0) {
            occupied.remove();
        }
    }

    /// `key`'s state under each of `limits`, for a quantity of 0 and of 1, each decided on a copy
    /// of the stored state: nothing is written.
    pub(super) fn peek<C: Clock>(
        &self,
        limits: &[Limit],
        key: &Key,
        clock: &C,
    ) -> Vec<(Decision, Decision)> {
        let (hash, mut shard) = self.locate(limits[0].id(), key);
        let now = shard.now(clock);
        let unix_now = now.saturating_add(clock.unix_origin_nanos());
        let entry = shard.table.find(hash, Entry::is(limits[0].id(), key));
        limits
            .iter()
            .enumerate()
            .map(|(position, limit)| {
                let copy = || stored_state(entry, limit, position as u8, now);
                let (state_now, _) = decide_one(&mut copy(), limit, key, now, unix_now, 0);
                let (next, _) = decide_one(&mut copy(), limit, key, now, unix_now, 1);
                (state_now, next)
            })
            .collect()
    }

    /// Forgets `key`'s entry under `limits` (a lone limit or a stack), requests in flight included.
    pub(super) fn forget(&self, limits: &[Limit], key: &Key) {
        let (hash, mut shard) = self.locate(limits[0].id(), key);
        if let Ok(occupied) = shard.table.find_entry(hash, Entry::is(limits[0].id(), key)) {
            occupied.remove();
        }
    }

    /// Settles a metered request's cost on `key`'s entry under `limits`: `deltas[i]` units more (or
    /// fewer) under each GCRA limit ([`gcra::settle`](crate::gcra::settle)), fewer under a window
    /// (as a refund). A charge may make the entry (a reservation of 0 left none).
    pub(super) fn settle<C: Clock>(
        &self,
        limits: &[Limit],
        key: &Key,
        deltas: &[i64],
        since: (u64, &[Decision]),
        clock: &C,
    ) {
        let (hash, mut shard) = self.locate(limits[0].id(), key);
        let now = shard.now(clock);
        let at = (now, clock.unix_origin_nanos());
        self.update(&mut shard, hash, limits, key, at, |cells| {
            settle_cells(cells, (limits, key), deltas, at, since)
        });
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

    /// The hash of `key`'s entry under the limit `id`, and its shard, locked.
    pub(super) fn locate(&self, id: u32, key: &Key) -> (u64, MutexGuard<'_, GeneralShard>) {
        let hash = self.hasher.hash_one((id, key));
        (hash, self.shard(hash))
    }

    pub(super) fn shard(&self, hash: u64) -> MutexGuard<'_, GeneralShard> {
        lock(&self.shards[self.shard_index(hash)])
    }

    /// The index of the shard of `hash`: the same bits as the GCRA table's shards, for the same
    /// reason.
    pub(super) fn shard_index(&self, hash: u64) -> usize {
        (hash >> 32) as usize & (self.shards.len() - 1)
    }
}

pub(super) fn lock(shard: &Mutex<GeneralShard>) -> MutexGuard<'_, GeneralShard> {
    shard.lock().unwrap_or_else(|p| p.into_inner())
}
