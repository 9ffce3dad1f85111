//! What both in-memory stores share: how often a shard sweeps, how many entries eviction samples.

/// How often (at most) a shard drops keys that have refilled completely, when it is in use.
pub(super) const SWEEP_INTERVAL_NANOS: u64 = 1_000_000_000;

/// How many entries are sampled to choose which keys to forget at the cap (in either store).
pub(super) const EVICTION_SAMPLE: usize = 1024;
