//! Sliced budgets for hot keys ([`Budget`]): a slice of a hot key's budget, taken in one atomic call
//! (`budget.lua`), is admitted from locally, never more than Redis granted.
//!
//! Per key, this process keeps the units it saw lately (hotness, the local rate) and its slice. A
//! request takes from a live slice; a hot key whose slice ran out asks for one sized by the local
//! rate; a cold key, or one whose slice is on its way, is decided per request. The table is
//! bounded: when full, keys idle two slice TTLs go; new keys stay cold.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use redis::RedisError;

use crate::backend::redis::conn::connection::RedisConnection;
use crate::backend::redis::wire::args::Args;
use crate::backend::redis::wire::scripts::{from_reply, Answer, BUDGET};
use crate::budget::Budget;
use crate::decision::Decision;

/// The most keys one process tracks for hotness; beyond it, keys are decided per request.
const MAX_KEYS: usize = 100_000;

/// The budget slices this process holds, per Redis key.
#[derive(Default)]
pub(crate) struct Budgets {
    keys: Mutex<HashMap<Box<str>, Slice>>,
    /// When the full table was last swept: at most once a slice TTL (a flood of new keys costs
    /// each a lookup, not a scan under the lock).
    last_sweep: Mutex<Option<Instant>>,
    /// The next slice's id: a fetch credits the slice it was asked for, not one put in its
    /// place after a reset or a reload dropped it (Redis may have granted the units from the
    /// state the reset deleted). Resets of other keys leave it be.
    next_id: AtomicU64,
}

/// One key: its recent rate and its slice.
struct Slice {
    /// The start of the current counting period (one slice TTL long).
    period_start: Instant,
    /// Units asked in the current period and in the one before.
    seen_now: u64,
    seen_before: u64,
    /// Units granted by Redis and not yet admitted; lost at `expires`.
    units: u64,
    expires: Instant,
    /// When the slice was granted, with what Redis told after granting it.
    granted_at: Instant,
    told: Decision,
    /// The units of the latest grant: the slice is refilled ahead when a quarter is left.
    last_grant: u64,
    /// A slice is on its way: requests meanwhile take what is left, then are decided per request.
    fetching: bool,
    /// Which slice this is ([`Budgets::next_id`]).
    id: u64,
}

impl Slice {
    fn new(now: Instant, id: u64) -> Self {
        Slice {
            id,
            period_start: now,
            seen_now: 0,
            seen_before: 0,
            units: 0,
            expires: now,
            granted_at: now,
            told: Decision::allowed(0, 0, Duration::ZERO),
            last_grant: 0,
            fetching: false,
        }
    }

    /// The slice to ask for: a slice TTL at the local rate, within the bounds, at least `least`.
    fn want(&self, budget: &Budget, limit: u64, least: u64) -> u64 {
        self.seen_now
            .max(self.seen_before)
            .min(budget.max_slice_units().min(limit))
            .max(least)
    }

    /// What a request admitted from the slice is told: see [`Budget`]'s headers.
    fn decision(&self, now: Instant) -> Decision {
        let told = &self.told;
        Decision::allowed(
            told.limit,
            // At most the limit, as Redis would say (an earlier slice's units may have drained).
            self.units.saturating_add(told.remaining).min(told.limit),
            told.reset_after
                .saturating_sub(now.saturating_duration_since(self.granted_at)),
        )
    }
}

/// What this process can do about a request without Redis.
pub(crate) enum Local {
    /// Admitted from the slice.
    Admit(Decision),
    /// Admitted from the slice, which runs low: fetch this many more in the background.
    AdmitAndRefill(Decision, u64, Fetching),
    /// Hot, its slice out: fetch this many units (the request's among them), holding the guard.
    Fetch(u64, Fetching),
    /// Decide it per request, as without a budget.
    PerRequest,
}

/// While held, the key's slice is being fetched; dropped, the next request may fetch again.
pub(crate) struct Fetching {
    budgets: Arc<Budgets>,
    key: Box<str>,
    /// The slice fetched for: one put in its place meanwhile is not this fetch's.
    id: u64,
}

impl Drop for Fetching {
    fn drop(&mut self) {
        let mut keys = self.budgets.lock();
        if let Some(slice) = keys.get_mut(&self.key).filter(|s| s.id == self.id) {
            slice.fetching = false;
        }
    }
}

impl Budgets {
    fn lock(&self) -> MutexGuard<'_, HashMap<Box<str>, Slice>> {
        // A panic elsewhere while holding it leaves only counters behind: still usable.
        self.keys.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Admits `quantity` units of `key` from its slice, or says how to decide it.
    pub(crate) fn local(
        self: &Arc<Self>,
        key: &str,
        budget: &Budget,
        limit: u64,
        quantity: u64,
    ) -> Local {
        if quantity == 0 {
            return Local::PerRequest;
        }
        let now = Instant::now();
        let ttl = budget.slice_lifetime();
        let fetching = |id| Fetching {
            budgets: self.clone(),
            key: key.into(),
            id,
        };
        let mut keys = self.lock();
        if !keys.contains_key(key) {
            if keys.len() >= MAX_KEYS {
                let mut last_sweep = self.last_sweep.lock().unwrap_or_else(|p| p.into_inner());
                if last_sweep.is_none_or(|at| now.saturating_duration_since(at) >= ttl) {
                    *last_sweep = Some(now);
                    // A slice still holding units stays, whatever this budget's life: another
                    // policy's may be longer, and Redis counted its units as taken.
                    keys.retain(|_, s| {
                        now.saturating_duration_since(s.period_start) < ttl * 2
                            || (s.units > 0 && now < s.expires)
                    });
                }
                if keys.len() >= MAX_KEYS {
                    return Local::PerRequest;
                }
            }
            let id = self.next_id.fetch_add(1, Ordering::Relaxed);
            keys.insert(key.into(), Slice::new(now, id));
        }
        let Some(slice) = keys.get_mut(key) else {
            return Local::PerRequest;
        };
        let since = now.saturating_duration_since(slice.period_start);
        if since >= ttl {
            slice.seen_before = if since < ttl * 2 { slice.seen_now } else { 0 };
            slice.seen_now = 0;
            slice.period_start = now;
        }
        slice.seen_now = slice.seen_now.saturating_add(quantity);
        if now >= slice.expires {
            // Granted, unused, and lost: the bounded loss of a slice.
            slice.units = 0;
        } else if slice.units >= quantity {
            slice.units -= quantity;
            let decision = slice.decision(now);
            // A quarter of the latest grant left: refilled ahead, while the rest is admitted.
            if slice.fetching || slice.units.saturating_mul(4) > slice.last_grant {
                return Local::Admit(decision);
            }
            slice.fetching = true;
            let want = slice.want(budget, limit, 1);
            return Local::AdmitAndRefill(decision, want, fetching(slice.id));
        }
        let hot =
            slice.seen_now.saturating_add(slice.seen_before) >= u64::from(budget.hot_threshold());
        if !hot || slice.fetching {
            return Local::PerRequest;
        }
        slice.fetching = true;
        Local::Fetch(slice.want(budget, limit, quantity), fetching(slice.id))
    }

    /// Asks Redis for `want` units of the slice `fetching` is for (at least `quantity`, the
    /// request's), keeping the rest in it.
    pub(crate) async fn fetch(
        &self,
        conn: &mut RedisConnection,
        fetching: &Fetching,
        args: &Args,
        budget: &Budget,
        quantity: u64,
        want: u64,
    ) -> Result<Answer, RedisError> {
        let reply: [i64; 5] = BUDGET
            .key(&*fetching.key)
            .arg(args.interval)
            .arg(args.tolerance)
            .arg(args.limit)
            .arg(want)
            .arg(quantity.max(1))
            .invoke_async(conn)
            .await?;
        let [granted, limit, remaining, retry_after, reset_after] = reply;
        let granted = granted.max(0) as u64;
        // What Redis left after the grant, or gcra.lua's rejection of the request's units.
        let refused = i64::from(granted < quantity.max(1));
        let reply = [refused, limit, remaining, retry_after, reset_after];
        let mut decision = from_reply(reply, Duration::from_nanos);
        let now = Instant::now();
        let mut keys = self.lock();
        // Dropped from the table meanwhile (a reset, a reload): the rest of the slice is lost.
        let slice = keys.get_mut(&*fetching.key).filter(|s| s.id == fetching.id);
        if let (true, Some(slice)) = (decision.allowed, slice) {
            if now >= slice.expires {
                slice.units = 0;
            }
            slice.units = slice.units.saturating_add(granted - quantity);
            slice.last_grant = granted;
            slice.expires = now + budget.slice_lifetime();
            slice.granted_at = now;
            slice.told = decision;
            decision = slice.decision(now);
        }
        Ok(Answer {
            decision,
            whole_seconds: false,
        })
    }

    /// Drops `key`'s slice (after a reset: Redis forgot the units it granted).
    pub(crate) fn forget(&self, key: &str) {
        self.lock().remove(key);
    }

    /// Drops the slices of keys under `prefix` (a limit changed in a reload: its old rate's;
    /// `""`: every slice, as resets may have been missed).
    pub(crate) fn forget_prefix(&self, prefix: &str) {
        self.lock().retain(|key, _| !key.starts_with(prefix));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Gives `key` a slice of `units`, as a grant with `redis_remaining` left would.
    fn grant(budgets: &Budgets, key: &str, units: u64, redis_remaining: u64, ttl: Duration) {
        let now = Instant::now();
        let mut keys = budgets.lock();
        let slice = keys.entry(key.into()).or_insert_with(|| Slice::new(now, 0));
        slice.units = units;
        slice.expires = now + ttl;
        slice.granted_at = now;
        slice.told = Decision::allowed(100, redis_remaining, Duration::from_secs(1));
        slice.last_grant = units;
    }

    /// Hot after `hot_after` units, slices living a minute.
    fn budget(hot_after: u32) -> Budget {
        Budget::new()
            .hot_after(hot_after)
            .slice_ttl(Duration::from_secs(60))
    }

    #[test]
    fn a_key_is_cold_until_hot_after_decisions() {
        let budgets = Arc::new(Budgets::default());
        let budget = budget(3);
        let local = |key: &str, units| budgets.local(key, &budget, 100, units);
        assert!(matches!(local("k", 1), Local::PerRequest));
        assert!(matches!(local("k", 1), Local::PerRequest));
        let Local::Fetch(want, fetching) = budgets.local("k", &budget, 100, 1) else {
            panic!("hot after 3");
        };
        assert_eq!(want, 3, "about the units seen");
        // While the slice is on its way, the others are decided per request.
        assert!(matches!(local("k", 1), Local::PerRequest));
        drop(fetching);
        assert!(matches!(local("k", 1), Local::Fetch(..)));
    }

    #[test]
    fn a_slice_admits_what_was_granted_and_no_more() {
        let budgets = Arc::new(Budgets::default());
        let budget = budget(1);
        let local = |key: &str, units| budgets.local(key, &budget, 100, units);
        grant(&budgets, "k", 3, 40, Duration::from_secs(60));
        let mut remaining = Vec::new();
        let mut refills = 0;
        for _ in 0..3 {
            match budgets.local("k", &budget, 100, 1) {
                Local::Admit(d) => remaining.push(d.remaining),
                Local::AdmitAndRefill(d, want, _fetching) => {
                    remaining.push(d.remaining);
                    assert!(want >= 1);
                    refills += 1;
                }
                _ => panic!("the slice holds 3"),
            }
        }
        // Refilled ahead once, when a quarter of the grant was left.
        assert_eq!(refills, 1);
        // The slice's units left plus what Redis said was left when it granted them.
        assert_eq!(remaining, [42, 41, 40]);
        assert!(matches!(local("k", 1), Local::Fetch(..)));
        // A request costing more than the slice holds asks Redis.
        grant(&budgets, "big", 2, 0, Duration::from_secs(60));
        assert!(matches!(local("big", 5), Local::Fetch(5, _)));
    }

    #[test]
    fn the_slice_asked_is_bounded_by_max_slice_and_the_limit() {
        let budgets = Arc::new(Budgets::default());
        let budget = budget(1).max_slice(10);
        let local = |key: &str, units| budgets.local(key, &budget, 100, units);
        for _ in 0..50 {
            drop(budgets.local("k", &budget, 100, 1));
        }
        assert!(matches!(local("k", 1), Local::Fetch(10, _)));
        assert!(matches!(
            budgets.local("j", &budget, 1, 1),
            Local::Fetch(1, _)
        ));
    }

    /// A full table is swept of keys idle for two of the sweeping budget's slice lives, but a
    /// slice of a longer-lived budget that still holds units is kept.
    #[test]
    fn a_sweep_keeps_the_slices_that_hold_units() {
        let budgets = Arc::new(Budgets::default());
        let short = budget(100).slice_ttl(Duration::from_millis(250));
        grant(&budgets, "long", 5, 0, Duration::from_secs(60));
        grant(&budgets, "spent", 0, 0, Duration::from_secs(60));
        {
            let mut keys = budgets.lock();
            let idle = Instant::now() - Duration::from_secs(1);
            for i in 0..MAX_KEYS - 2 {
                let mut slice = Slice::new(idle, 0);
                slice.seen_now = 1;
                keys.insert(format!("flood-{i}").into(), slice);
            }
            for key in ["long", "spent"] {
                keys.get_mut(key).unwrap().period_start = idle;
            }
        }
        assert!(matches!(
            budgets.local("new", &short, 100, 1),
            Local::PerRequest
        ));
        let keys = budgets.lock();
        assert_eq!(keys.len(), 2, "the flood and the spent slice swept");
        assert_eq!(keys["long"].units, 5);
        assert!(keys.contains_key("new"));
    }

    /// A fetch outlived by its slice (a reset dropped it, a request made another) answers for its
    /// own slice only: it does not end the new slice's fetch, which stays the only one.
    #[test]
    fn a_fetch_for_a_dropped_slice_leaves_the_new_one_alone() {
        let budgets = Arc::new(Budgets::default());
        let budget = budget(1);
        let Local::Fetch(_, old) = budgets.local("k", &budget, 100, 1) else {
            panic!("hot after 1");
        };
        budgets.forget("k");
        let Local::Fetch(_, new) = budgets.local("k", &budget, 100, 1) else {
            panic!("a new slice, hot at once");
        };
        assert_ne!(old.id, new.id);
        drop(old);
        assert!(
            matches!(budgets.local("k", &budget, 100, 1), Local::PerRequest),
            "the new slice is still on its way: one fetch at a time"
        );
        drop(new);
        assert!(matches!(
            budgets.local("k", &budget, 100, 1),
            Local::Fetch(..)
        ));
    }
}
