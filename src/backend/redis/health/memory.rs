//! [`MemoryReport`]: what Redis says about its memory (the `maxmemory-policy`, the keys it evicted),
//! and what the watcher (watch.rs) remembers between two reads ([`Seen`]).

/// What Redis says about its memory, from [`RedisBackend::memory`](crate::redis::RedisBackend::memory).
/// On a Cluster, over every primary: the first policy that can evict (or the first policy), and
/// the evictions summed.
///
/// ```
/// use tower_throttle::redis::MemoryReport;
///
/// assert!(MemoryReport::policy_evicts("allkeys-lru"));
/// assert!(MemoryReport::policy_evicts("volatile-ttl")); // every limiter key has a TTL
/// assert!(!MemoryReport::policy_evicts("noeviction"));
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct MemoryReport {
    /// `maxmemory-policy`, or `None` where Redis refuses `CONFIG GET` (managed Redis, ACLs).
    pub policy: Option<String>,
    /// `maxmemory` in bytes (0: no cap; a Cluster's largest), or `None` where Redis refuses it.
    pub maxmemory: Option<u64>,
    /// `evicted_keys` from `INFO stats`: every key Redis evicted since it started (the limiter's
    /// and any other), or `None` where Redis refuses `INFO`.
    pub evicted_keys: Option<u64>,
    /// The keys evicted since this backend first read `evicted_keys` (what the metric counted).
    pub evictions_seen: u64,
}

impl MemoryReport {
    /// Whether Redis may evict the limiter's keys under this `maxmemory-policy`: every policy but
    /// `noeviction` (the `volatile-*` ones too, as every limiter key has a TTL).
    pub fn policy_evicts(policy: &str) -> bool {
        policy.starts_with("allkeys-") || policy.starts_with("volatile-")
    }

    /// Whether [`policy`](Self::policy) is known and may evict the limiter's keys.
    pub fn evicts(&self) -> bool {
        self.policy.as_deref().is_some_and(Self::policy_evicts)
    }
}

/// What the watcher remembers between reads, shared with `RedisBackend::memory` calls.
#[derive(Default)]
pub(crate) struct Seen {
    /// `evicted_keys` at the last read, per node (by address on a Cluster).
    pub(crate) evicted_keys: Vec<(String, u64)>,
    pub(crate) evictions_seen: u64,
    /// The evicting policy last warned about.
    pub(crate) warned_policy: Option<String>,
    /// `CONFIG GET` was refused, and that was said.
    pub(crate) said_config_refused: bool,
}
