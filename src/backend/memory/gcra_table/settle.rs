//! Settling a metered request's cost on a lone GCRA limit: a compare-and-swap of the key's TAT
//! under the read lock, as decisions make, or a new key under the write lock when a charge finds
//! none.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use super::hot::MOVED;
use super::{by_form, read, write, Compact, GcraTable, RecordKey, TatRecord};
use crate::clock::Clock;
use crate::gcra;
use crate::key::Key;

impl GcraTable {
    /// Settles `delta` units more (or fewer) of the GCRA limit `id` (with `params`) for `key`,
    /// reserved at most `since` ns ago ([`gcra::settle`]).
    pub(in crate::backend::memory) fn settle<C: Clock>(
        &self,
        params: &gcra::GcraParams,
        id: u32,
        key: &Key,
        delta: i64,
        since: u64,
        clock: &C,
    ) {
        if delta == 0 {
            return;
        }
        by_form!(key, |k| self.settle_in(params, id, k, delta, since, clock))
    }

    fn settle_in<K: RecordKey + Clone, C: Clock>(
        &self,
        params: &gcra::GcraParams,
        id: u32,
        key: &K,
        delta: i64,
        since: u64,
        clock: &C,
    ) {
        let hash = key.record_hash(id, &self.hasher);
        let shard = self.shard(hash);
        let eq = |s: &TatRecord<K>| s.limit == id && s.key == *key;
        let settle = |tat: &AtomicU64| settle_tat(tat, params, delta, since, clock.now_nanos());
        {
            // The slot under the lock: a key moved into it meanwhile would be in neither, and
            // its refund lost.
            let table = read(&shard.table);
            if shard.hot.with(id, |h| key.is_hot(h), settle) == Some(true) {
                return;
            }
            let now = clock.now_nanos();
            if let Some(record) = K::table(&table).find(hash, eq) {
                settle_tat(&record.tat, params, delta, since, now);
                return;
            }
        }
        if delta < 0 {
            // No state: nothing to give back.
            return;
        }
        // A charge for a key with no state (it reserved nothing, or it was forgotten): as a new key.
        let mut table = write(&shard.table);
        if shard.hot.with(id, |h| key.is_hot(h), settle) == Some(true) {
            return;
        }
        let now = clock.now_nanos();
        match K::table_mut(&mut table).find_entry(hash, eq) {
            Ok(mut occupied) => {
                let tat = occupied.get_mut().tat.get_mut();
                *tat = gcra::settle(Some(*tat), now, params, delta, since).unwrap_or(0);
            }
            Err(_) => {
                let Some(tat) = gcra::settle(None, now, params, delta, since) else {
                    return;
                };
                self.insert_new(&mut table, hash, params, id, key.clone(), tat, now);
            }
        }
    }
}

/// Settles on one TAT by compare-and-swap, as decisions make; false if it left the hot slot
/// meanwhile ([`MOVED`]).
fn settle_tat(
    tat: &AtomicU64,
    params: &gcra::GcraParams,
    delta: i64,
    since: u64,
    now: u64,
) -> bool {
    let mut current = tat.load(Relaxed);
    loop {
        if current == MOVED {
            return false;
        }
        // 0: no state (the sweep drops the record).
        let next = gcra::settle(Some(current), now, params, delta, since).unwrap_or(0);
        if next == current {
            return true;
        }
        match tat.compare_exchange_weak(current, next, Relaxed, Relaxed) {
            Ok(_) => return true,
            Err(actual) => current = actual,
        }
    }
}
