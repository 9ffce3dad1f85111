//! Charges with keys of their own ([`Charges::keyed`](crate::backend::Charges::keyed)): each limit
//! keeps its state in the general store under its own key, and the decision locks every shard
//! involved, decides every limit on its stored state, and writes the new states only if every
//! limit admits. Exact: nothing else can touch those entries between the decision and the write.

use std::hash::BuildHasher;
use std::sync::MutexGuard;

use super::entries::*;
use super::general::{lock, GeneralStore};
use super::general_shard::GeneralShard;
use crate::clock::Clock;
use crate::decision::Decision;
use crate::key::Key;
use crate::limit::Limit;

/// The shards a keyed decision holds, each once, in ascending order of index.
struct Locked<'a> {
    guards: Vec<(usize, MutexGuard<'a, GeneralShard>)>,
}

impl<'a> Locked<'a> {
    fn shard(&mut self, index: usize) -> &mut GeneralShard {
        let at = self
            .guards
            .binary_search_by_key(&index, |(i, _)| *i)
            .expect("every shard of the decision is locked");
        &mut self.guards[at].1
    }
}

impl GeneralStore {
    /// Locks the shards of `hashes`, each once, lowest index first: two keyed decisions that
    /// share shards take them in the same order, so neither can wait for the other forever (every
    /// other path holds one shard at a time).
    fn lock_all(&self, hashes: &[u64]) -> Locked<'_> {
        let mut indices: Vec<usize> = hashes.iter().map(|h| self.shard_index(*h)).collect();
        indices.sort_unstable();
        indices.dedup();
        Locked {
            guards: indices
                .into_iter()
                .map(|i| (i, lock(&self.shards[i])))
                .collect(),
        }
    }

    /// Decides `quantity` units under each of `limits`, `limits[i]` on `keys[i]`'s own entry.
    pub(super) fn decide_keyed<C: Clock>(
        &self,
        limits: &[Limit],
        keys: &[Key],
        quantity: u64,
        clock: &C,
    ) -> Vec<Decision> {
        let hashes: Vec<u64> = limits
            .iter()
            .zip(keys)
            .map(|(l, k)| self.hasher.hash_one((l.id(), k)))
            .collect();
        let mut locked = self.lock_all(&hashes);
        // One time for every limit: the latest any of the shards has used, so each keeps its
        // keys' times in order.
        let now = locked
            .guards
            .iter_mut()
            .map(|(_, shard)| shard.now(clock))
            .max()
            .unwrap_or_default();
        let origin = clock.unix_origin_nanos();
        let unix_now = now.saturating_add(origin);
        for (_, shard) in locked.guards.iter_mut() {
            shard.latest_now = now;
            if now >= shard.sweep_at_time {
                shard.sweep(now, &self.hasher);
            }
        }
        // Limit `i` deciding `quantity` on a copy of its state: nothing is written.
        let mut on_copy = |i: usize, quantity| {
            let (limit, key, hash) = (&limits[i], &keys[i], hashes[i]);
            let table = &locked.shard(self.shard_index(hash)).table;
            let mut state =
                stored_state(table.find(hash, Entry::is(limit.id(), key)), limit, 0, now);
            decide_one(&mut state, limit, key, now, unix_now, quantity).0
        };
        let mut out: Vec<Decision> = (0..limits.len()).map(|i| on_copy(i, quantity)).collect();
        if !out.iter().all(|d| d.allowed) {
            // Nothing is recorded: an admitting limit reports its state as it stands.
            for (i, decision) in out.iter_mut().enumerate() {
                if decision.allowed {
                    *decision = on_copy(i, 0);
                }
            }
            return out;
        }
        // Every limit admits: the same decisions again, on the stored states, written this time
        // (the locks are still held, so the states are the ones just decided on).
        for (i, ((limit, key), hash)) in limits.iter().zip(keys).zip(&hashes).enumerate() {
            let shard = locked.shard(self.shard_index(*hash));
            let one = std::slice::from_ref(limit);
            let written = &mut out[i..=i];
            self.update(shard, *hash, one, key, (now, origin), |cells| {
                decide_cells(cells, one, key, now, origin, &[quantity], written)
            });
            debug_assert!(
                out[i].allowed,
                "a limit decides alike on the state it just read"
            );
        }
        out
    }
}
