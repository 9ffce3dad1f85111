//! The local deny cache: a key that Redis limited is rejected here until its retry time.

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::decision::Decision;

const SHARDS: usize = 16;

/// foldhash, seeded per process: the keys are hostile, but only keys Redis limited are entries, at
/// most `SHARD_CAPACITY` a shard, so a collision flood stays bounded (at a fraction of SipHash's cost).
type RandomState = foldhash::fast::RandomState;
/// Entries per shard: a full one refuses new entries rather than grow (a miss costs a round trip).
const SHARD_CAPACITY: usize = 8192;

/// A rejection from Redis, with what the cache needs to know how long its numbers hold.
pub(crate) struct Rejection {
    pub(crate) decision: Decision,
    /// The GCRA's emission interval and tolerance, in nanoseconds.
    pub(crate) interval: u64,
    pub(crate) tolerance: u64,
    /// From `CL.THROTTLE`: whole seconds, rounded up.
    pub(crate) whole_seconds: bool,
    /// Its numbers hold until the retry time (`interval` and `tolerance` only tell quotas apart).
    pub(crate) until_retry: bool,
}

/// Limited keys and until when, for requests of the same cost and quota: it never admits, as other
/// processes only move a TAT later (a key deleted in Redis by hand is refused here until then).
pub(crate) struct DenyCache {
    hasher: RandomState,
    shards: Box<[Slot]>,
}

struct Slot {
    shard: Mutex<Shard>,
    /// Counts what made the shard's keys less limited: a rejection made before one is not
    /// inserted after it. One a shard: a refund or settle on one key (every response of a metered
    /// policy) must not keep every other key's rejections out of the cache.
    generation: AtomicU64,
}

#[derive(Default)]
struct Shard {
    map: HashMap<Box<str>, Denied, RandomState>,
    /// When a full shard may next prune (not every insertion of a flood scans).
    next_prune: Option<Instant>,
}

const PRUNE_EVERY: Duration = Duration::from_millis(100);

struct Denied {
    /// When Redis decided.
    at: Instant,
    /// Until when the key stays limited: the exact retry time (Lua) or a lower bound of it (Cell).
    until: Instant,
    quantity: u64,
    interval: u64,
    tolerance: u64,
    decision: Decision,
}

impl DenyCache {
    pub(crate) fn new() -> Self {
        let slot = || Slot {
            shard: Mutex::default(),
            generation: AtomicU64::new(0),
        };
        DenyCache {
            hasher: RandomState::default(),
            shards: (0..SHARDS).map(|_| slot()).collect(),
        }
    }

    fn slot(&self, key: &str) -> &Slot {
        &self.shards[self.hasher.hash_one(key) as usize % SHARDS]
    }

    /// The cached rejection of `key` for `quantity` units under this quota at `now`, aged, if it
    /// holds; else the generation of the key's shard, read before the call to Redis is sent, to
    /// give [`insert`](Self::insert) (from the one hash of the key).
    pub(crate) fn get(
        &self,
        key: &str,
        quantity: u64,
        interval: u64,
        tolerance: u64,
        now: Instant,
    ) -> Result<Decision, u64> {
        let slot = self.slot(key);
        let generation = slot.generation.load(Ordering::Acquire);
        let mut shard = lock(&slot.shard);
        let Some(entry) = shard.map.get(key) else {
            return Err(generation);
        };
        if now >= entry.until {
            shard.map.remove(key);
            return Err(generation);
        }
        if quantity != entry.quantity || interval != entry.interval || tolerance != entry.tolerance
        {
            // Another cost may fit (or never); another quota reads the state its own way.
            return Err(generation);
        }
        let elapsed = now - entry.at;
        let d = &entry.decision;
        let mut aged = Decision::limited(
            d.limit,
            d.remaining,
            d.retry_after.map(|r| r.saturating_sub(elapsed)),
            d.reset_after.saturating_sub(elapsed),
        );
        aged.banned = d.banned;
        Ok(aged)
    }

    /// Forgets the rejection of `key`: it was reset, or given units back (another process may hold
    /// the rejection until its retry time, which only admits less).
    pub(crate) fn forget(&self, key: &str) {
        // A new generation first: a decision in flight is not inserted after the entry is gone.
        let slot = self.slot(key);
        slot.generation.fetch_add(1, Ordering::AcqRel);
        lock(&slot.shard).map.remove(key);
    }

    /// Forgets every rejection of a key under `prefix` (a limit changed in a reload; `""`: every
    /// key, as resets may have been missed).
    pub(crate) fn forget_prefix(&self, prefix: &str) {
        for slot in &self.shards {
            slot.generation.fetch_add(1, Ordering::AcqRel);
            lock(&slot.shard)
                .map
                .retain(|key, _| !key.starts_with(prefix));
        }
    }

    /// Remembers a rejection Redis made `at` while its numbers hold: until the retry time, while
    /// `remaining` stays; from `CL.THROTTLE` (whole seconds), to a second before, if `remaining`
    /// cannot change. Not if anything was forgotten since `generation` (read at the sending).
    pub(crate) fn insert(
        &self,
        key: &str,
        quantity: u64,
        rejected: Rejection,
        at: Instant,
        generation: u64,
    ) {
        let Rejection {
            decision,
            interval,
            tolerance,
            whole_seconds,
            until_retry,
        } = rejected;
        let Some(retry) = decision.retry_after else {
            return; // never admitted: Redis still answers, with up-to-date numbers
        };
        // `remaining` next grows when tolerance - ttl reaches (remaining + 1) × interval.
        let next_unit = decision.remaining.saturating_add(1);
        // A penalty-box ban holds until its end, whatever the bucket does.
        let hold = if decision.banned || until_retry {
            retry
        } else if whole_seconds {
            if next_unit < quantity {
                return;
            }
            retry.saturating_sub(Duration::from_secs(1))
        } else {
            let grows_after = Duration::from_nanos(
                next_unit
                    .saturating_mul(interval)
                    .saturating_add(decision.reset_after.as_nanos() as u64)
                    .saturating_sub(tolerance),
            );
            retry.min(grows_after)
        };
        if hold.is_zero() {
            return;
        }
        let entry = Denied {
            at,
            until: at + hold,
            quantity,
            interval,
            tolerance,
            decision,
        };
        let slot = self.slot(key);
        let mut shard = lock(&slot.shard);
        // Under the shard's lock: a forget of this key came before (a new generation) or after.
        if slot.generation.load(Ordering::Acquire) != generation {
            return;
        }
        if shard.map.len() >= SHARD_CAPACITY && !shard.map.contains_key(key) {
            let now = Instant::now();
            if shard.next_prune.is_none_or(|t| now >= t) {
                shard.map.retain(|_, e| e.until > now);
                shard.next_prune = Some(now + PRUNE_EVERY);
            }
            if shard.map.len() >= SHARD_CAPACITY {
                return;
            }
        }
        shard.map.insert(key.into(), entry);
    }
}

fn lock(shard: &Mutex<Shard>) -> MutexGuard<'_, Shard> {
    shard.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;
    const I: u64 = 200 * MS;
    const TAU: u64 = 1000 * MS;

    /// A rejection under 5 at once, one every 200 ms (tolerance 1 s), of `quantity` units: the
    /// bucket holds `remaining` and the TAT is `ttl_ms` ahead.
    fn rejection(quantity: u64, remaining: u64, ttl_ms: u64, whole_seconds: bool) -> Rejection {
        let (interval, tolerance) = (I, TAU);
        let retry = ttl_ms * MS + quantity * interval - tolerance;
        Rejection {
            decision: Decision::limited(
                5,
                remaining,
                Some(Duration::from_nanos(retry)),
                Duration::from_millis(ttl_ms),
            ),
            interval,
            tolerance,
            whole_seconds,
            until_retry: false,
        }
    }

    fn limited(retry_ms: u64) -> Rejection {
        // One unit, nothing left: the TAT is retry + 800 ms ahead.
        rejection(1, 0, retry_ms + 800, false)
    }

    #[test]
    fn holds_a_rejection_for_the_same_cost_and_quota() {
        let cache = DenyCache::new();
        let get = |key: &str, units, at| cache.get(key, units, I, TAU, at);
        let now = Instant::now();
        let at = |ms| now + Duration::from_millis(ms);
        cache.insert("k", 2, rejection(2, 1, 1100, false), now, 0);
        // 2 units wanted, 1 left, TAT 1.1 s ahead: retry in 500 ms, and "remaining: 1" holds as long.
        let d = get("k", 2, at(120)).unwrap();
        assert!(!d.allowed);
        assert_eq!(d.retry_after, Some(Duration::from_millis(380)), "aged");
        assert_eq!(d.reset_after, Duration::from_millis(980), "aged");
        assert_eq!((d.limit, d.remaining), (5, 1));
        assert!(get("k", 2, at(499)).is_ok());
        assert!(get("k", 2, at(500)).is_err(), "retry time");
        cache.insert("k", 2, rejection(2, 1, 1100, false), now, 0);
        assert!(get("k", 1, now).is_err(), "fewer units may fit");
        assert!(
            get("k", 3, now).is_err(),
            "more units wait longer, or forever"
        );
        assert!(cache.get("k", 2, 2 * I, TAU, now).is_err(), "another rate");
        assert!(cache.get("k", 2, I, 2 * TAU, now).is_err(), "another quota");
        assert!(get("other", 2, now).is_err());
    }

    #[test]
    fn held_only_while_remaining_stays_the_same() {
        let cache = DenyCache::new();
        let get = |key: &str, units, at| cache.get(key, units, I, TAU, at);
        // 3 units wanted, 1 left, TAT 900 ms ahead: a second unit frees up after 300 ms, the third
        // (the retry time) after 500 ms. Held 300 ms, while "remaining: 1" is true.
        let r = rejection(3, 1, 900, false);
        assert_eq!(r.decision.retry_after, Some(Duration::from_millis(500)));
        let now = Instant::now();
        cache.insert("k", 3, r, now, 0);
        let held = get("k", 3, now + Duration::from_millis(299));
        assert_eq!(held.unwrap().remaining, 1);
        assert!(get("k", 3, now + Duration::from_millis(300)).is_err());
        // From CL.THROTTLE the numbers are not exact enough to age: not held at all.
        cache.insert("c", 3, rejection(3, 1, 2900, true), now, 0);
        assert!(get("c", 3, now).is_err());
    }

    #[test]
    fn expired_and_never_admitted_rejections_are_not_held() {
        let cache = DenyCache::new();
        let get = |key: &str, units, at| cache.get(key, units, I, TAU, at);
        let now = Instant::now();
        cache.insert("old", 1, limited(300), now, 0);
        assert!(get("old", 1, now + Duration::from_secs(1)).is_err());
        assert!(get("old", 1, now).is_err(), "an expired entry is dropped");
        let mut never = limited(300);
        never.decision.retry_after = None;
        cache.insert("never", 9, never, now, 0);
        assert!(get("never", 9, now).is_err());
    }

    #[test]
    fn a_rejection_decided_before_a_forget_is_not_kept_after_it() {
        let cache = DenyCache::new();
        let get = |key: &str, units, at| cache.get(key, units, I, TAU, at);
        let now = Instant::now();
        let sent = cache.get("k", 1, I, TAU, now).unwrap_err();
        cache.forget("k"); // a reset heard while Redis was deciding
        cache.insert("k", 1, limited(60_000), now, sent);
        assert!(get("k", 1, now).is_err());
        // A forget of every key counts too.
        let sent = cache.get("k", 1, I, TAU, now).unwrap_err();
        cache.forget_prefix("");
        cache.insert("k", 1, limited(60_000), now, sent);
        assert!(get("k", 1, now).is_err());
        cache.insert(
            "k",
            1,
            limited(60_000),
            now,
            cache.get("k", 1, I, TAU, now).unwrap_err(),
        );
        assert!(get("k", 1, now).is_ok());
        // A forget of a key in another shard does not (a refund there on every response would
        // keep every rejection out).
        let other = (0..)
            .map(|i| format!("o{i}"))
            .find(|o| !std::ptr::eq(cache.slot(o), cache.slot("j")));
        let other = other.unwrap();
        let sent = cache.get("j", 1, I, TAU, now).unwrap_err();
        cache.forget(&other);
        cache.insert("j", 1, limited(60_000), now, sent);
        assert!(get("j", 1, now).is_ok());
    }

    #[test]
    fn a_full_shard_refuses_rather_than_grows() {
        let cache = DenyCache::new();
        let now = Instant::now();
        for i in 0..SHARDS * SHARD_CAPACITY * 2 {
            cache.insert(&format!("k{i}"), 1, limited(60_000), now, 0);
        }
        let sizes = cache
            .shards
            .iter()
            .map(|s| s.shard.lock().unwrap().map.len());
        assert!(sizes.sum::<usize>() <= SHARDS * SHARD_CAPACITY);
    }
}
