//! Moving a key into its shard's hot slot and back into the table (the protocol is in hot.rs).

use super::hot::HotKey;
use super::{write, GcraShard, GcraTable, RecordKey, Shard};
use crate::backend::memory::tuning::SWEEP_GRACE_NANOS;
use crate::clock::Clock;

impl GcraTable {
    /// Moves `key` of the limit `id` from its shard's table into the shard's hot slot, unless
    /// another key is hot there and in use (one hot key per shard; an idle one gives way).
    #[cold]
    #[inline(never)]
    pub(super) fn make_hot<K: RecordKey, C: Clock>(
        &self,
        shard: &Shard,
        hash: u64,
        id: u32,
        key: &K,
        clock: &C,
    ) {
        // A hot key in use stays: one that refilled less than a second ago (a key of a quota that
        // refills at once is never live for long, and two keys of one shard taking the slot in
        // turns would take the write lock each time). Looked at first without the lock, as most
        // calls find one.
        let in_use = |now: u64| {
            let since = now.saturating_sub(SWEEP_GRACE_NANOS);
            shard.hot.current_tat().is_some_and(|tat| tat > since)
        };
        if in_use(clock.now_nanos()) {
            return;
        }
        let mut table = write(&shard.table);
        let now = clock.now_nanos();
        if in_use(now) {
            return;
        }
        if let Some((limit, old, tat)) = shard.hot.take() {
            // Idle when looked at; in use again if a decision swapped it since.
            self.put_back(&mut table, limit, old, tat, now);
        }
        if let Ok(occupied) =
            K::table_mut(&mut table).find_entry(hash, |s| s.limit == id && s.key == *key)
        {
            let (record, _) = occupied.remove();
            shard.hot.put(id, key.hot(), record.tat.into_inner());
        }
    }

    /// A key that leaves the hot slot goes back into its table if its TAT is live.
    pub(super) fn put_back(
        &self,
        table: &mut GcraShard,
        limit: u32,
        key: HotKey,
        tat: u64,
        now: u64,
    ) {
        if tat <= now {
            return;
        }
        let hasher = &self.hasher;
        match key {
            HotKey::V4(k) => {
                table.insert_record(hasher, k.record_hash(limit, hasher), limit, k, tat)
            }
            HotKey::V6(k) => {
                table.insert_record(hasher, k.record_hash(limit, hasher), limit, k, tat)
            }
            HotKey::Other(k) => {
                table.insert_record(hasher, k.record_hash(limit, hasher), limit, k, tat)
            }
        }
    }
}
