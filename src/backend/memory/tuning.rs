//! What both in-memory stores share: sweep timing, the eviction sample and shard padding.

/// How often (at most) a shard drops keys that have refilled completely, when it is in use.
pub(super) const SWEEP_INTERVAL_NANOS: u64 = 1_000_000_000;

/// How many entries are sampled to choose which keys to forget at the cap (in either store).
pub(super) const EVICTION_SAMPLE: usize = 1024;

/// How long a key of the GCRA table stays after it has refilled, before a sweep drops it.
///
/// A key that refills between two visits (a client that comes back every few hundred milliseconds
/// under a per-second limit) would otherwise be dropped by one sweep and inserted again under its
/// shard's write lock on its next visit, stalling every other decision in that shard; and a shard
/// whose keys had all refilled would sweep again after 64 new keys, so that under such traffic
/// nearly every decision took the write lock. Kept a second longer, the key is found and decided
/// under the read lock. Memory stays bounded by the cap, and eviction at the cap drops every
/// refilled key first.
pub(super) const SWEEP_GRACE_NANOS: u64 = 1_000_000_000;

/// A shard on cache lines of its own (128 bytes: two lines, as the adjacent-line prefetcher of
/// x86-64 fetches them in pairs). Without it, neighbouring shards' lock words share a line, and
/// threads deciding on keys in different shards slow each other down.
#[repr(align(128))]
pub(super) struct Padded<T>(pub(super) T);

impl<T> std::ops::Deref for Padded<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}
