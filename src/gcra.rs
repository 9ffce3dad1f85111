//! The GCRA as `CL.THROTTLE` defines it, as a pure function: no I/O, no clock.
//!
//! Every backend of this crate computes the same function, so a key gets the same decisions in memory,
//! in the Lua script and from redis-cell. The only state per key is its *theoretical arrival time*
//! (TAT), in nanoseconds on the backend's clock.
//!
//! ```
//! use tower_throttle::{gcra, Quota};
//!
//! let params = Quota::per_second(2).validate().unwrap(); // limit 2, one every 500 ms
//! let first = gcra::decide(None, 0, &params, 1);
//! assert!(first.decision.allowed);
//! assert_eq!(first.decision.remaining, 1);
//! let second = gcra::decide(first.new_tat, 0, &params, 1);
//! let third = gcra::decide(second.new_tat, 0, &params, 1);
//! assert!(!third.decision.allowed);
//! assert_eq!(third.new_tat, second.new_tat); // a rejection writes nothing
//! assert_eq!(third.decision.retry_after, Some(std::time::Duration::from_millis(500)));
//! ```

use std::time::Duration;

use crate::decision::Decision;

/// Validated GCRA parameters in nanoseconds; made only by [`Quota::validate`](crate::Quota::validate),
/// so they are always consistent (`tolerance = emission_interval × limit`, all at least 1).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GcraParams {
    emission_interval: u64,
    tolerance: u64,
    limit: u64,
    /// `floor((2^64 - 1) / emission_interval)`, so that [`GcraParams::intervals_in`] divides by the
    /// emission interval with a multiplication: a 64-bit `div` costs 35 to 90 cycles on x86-64, as
    /// much as the rest of an in-memory decision. Derived from `emission_interval` alone.
    reciprocal: u64,
    /// How far ahead of `now` a stored TAT is read as it is: the tolerance, plus the debt a settled
    /// cost may leave for a metered limit ([`GcraParams::with_debt`]). Beyond it, a TAT was written
    /// under another quota.
    ceiling: u64,
}

impl GcraParams {
    pub(crate) const fn new(emission_interval: u64, tolerance: u64, limit: u64) -> Self {
        GcraParams {
            emission_interval,
            tolerance,
            limit,
            reciprocal: u64::MAX / emission_interval,
            ceiling: tolerance,
        }
    }

    /// The same parameters for a metered limit, whose key may owe up to `units` past its burst
    /// ([`settle`]): a TAT up to `units` emission intervals beyond the tolerance is debt, read as
    /// it is, not another quota's state. At most 2^63 ns (292 years): a TAT of now plus the
    /// ceiling stays below `u64::MAX`, which the memory backend's hot slot reserves.
    pub(crate) const fn with_debt(mut self, units: u64) -> Self {
        let debt = self.emission_interval.saturating_mul(units);
        let ceiling = self.tolerance.saturating_add(debt);
        self.ceiling = if ceiling < 1 << 63 { ceiling } else { 1 << 63 };
        self
    }

    /// How far ahead of now a TAT may lie: the tolerance, plus the debt cap of a metered limit.
    pub const fn ceiling(&self) -> u64 {
        self.ceiling
    }

    /// `n / emission_interval`, exactly (rounded down), without a hardware division. The estimate
    /// `n × reciprocal / 2^64` is never above the quotient and at most 2 below it (the reciprocal is
    /// rounded down by less than 1, and `n < 2^64`), and the remainder corrects it.
    #[inline]
    fn intervals_in(&self, n: u64) -> u64 {
        let t = self.emission_interval;
        let mut q = ((u128::from(n) * u128::from(self.reciprocal)) >> 64) as u64;
        // q ≤ n / t, so q × t ≤ n: neither overflows.
        let mut r = n - q * t;
        while r >= t {
            q += 1;
            r -= t;
        }
        q
    }

    /// `T = period / count`: the steady spacing of requests in nanoseconds, at least 1.
    pub const fn emission_interval(&self) -> u64 {
        self.emission_interval
    }

    /// `tau = T × (max_burst + 1)`: how far ahead of schedule a key may run, in nanoseconds.
    pub const fn tolerance(&self) -> u64 {
        self.tolerance
    }

    /// `max_burst + 1`.
    pub const fn limit(&self) -> u64 {
        self.limit
    }
}

/// The result of [`decide`]: the decision and the state to store.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Outcome {
    /// The decision.
    pub decision: Decision,
    /// The TAT to store, unchanged from the input when the request was limited (unless the input lay
    /// more than the tolerance ahead, written under another quota: then it is brought back to
    /// `now + tolerance`, a full bucket). A stored TAT that is not
    /// after `now` is equivalent to no state at all, so a backend may delete the key instead; a TAT may
    /// always be dropped once the clock passes it (it expires after [`Decision::reset_after`]).
    pub new_tat: Option<u64>,
}

/// Decides whether `quantity` units may pass now, given the key's stored TAT.
///
/// `tat` is the stored state (`None` for a new or expired key), `now` the backend's clock in
/// nanoseconds. A `quantity` of 0 peeks without consuming. A `quantity` whose cost exceeds the
/// tolerance is limited with `retry_after = None`: it can never pass.
///
/// A stored TAT more than the tolerance ahead of `now` is debt for a metered limit (up to its
/// [`ceiling`](GcraParams::ceiling): the key is refused until it is paid back, and `retry_after` says
/// exactly when); otherwise it can only come from another quota (a route whose
/// quota changed while its keys lived on in Redis), and is read as a full bucket. redis-cell instead
/// keeps such a key limited until the old TAT passes.
///
/// One deliberate difference from redis-cell 0.2.2: when a stored TAT lies in the past (a key not yet
/// expired), redis-cell reports a negative `reset_after` and a `remaining` above the limit for an
/// oversized request; here both are clamped (`reset_after` ≥ 0, `remaining` ≤ `limit`).
#[inline]
pub fn decide(tat: Option<u64>, now: u64, params: &GcraParams, quantity: u64) -> Outcome {
    let GcraParams {
        emission_interval: t,
        tolerance: tau,
        limit,
        ceiling,
        ..
    } = *params;
    // A TAT more than the ceiling (the tolerance, plus a metered limit's debt) ahead was stored under
    // another quota (a changed route in a shared store): it counts as a full bucket under this one,
    // and is stored so, so that it drains from now on. Under one quota it cannot happen.
    let tat = tat.map(|tat| tat.min(now.saturating_add(ceiling)));
    let tat_or_now = tat.unwrap_or(now);
    let increment = t.checked_mul(quantity);
    // new_tat = max(tat, now) + T × quantity; the request passes when new_tat - tau <= now.
    let new_tat = increment.and_then(|inc| tat_or_now.max(now).checked_add(inc));
    let allowed_tat = new_tat.filter(|n| *n <= now.saturating_add(tau));

    let (decision, stored) = match allowed_tat {
        Some(new_tat) => {
            let ttl = new_tat - now;
            let remaining = params.intervals_in(tau - ttl);
            (
                Decision::allowed(limit, remaining, Duration::from_nanos(ttl)),
                Some(new_tat),
            )
        }
        None => {
            let ttl = tat_or_now.saturating_sub(now);
            let remaining = params.intervals_in(tau.saturating_sub(ttl)).min(limit);
            let retry_after = match (increment, new_tat) {
                (Some(inc), Some(new_tat)) if inc <= tau => {
                    Some(Duration::from_nanos(new_tat - tau - now))
                }
                _ => None,
            };
            (
                Decision::limited(limit, remaining, retry_after, Duration::from_nanos(ttl)),
                tat,
            )
        }
    };
    Outcome {
        decision,
        new_tat: stored,
    }
}

/// What [`decide`] would store, and nothing else: no division to count `remaining`. A backend that
/// updates a TAT by compare-and-swap calls this between the read and the swap, so that the window
/// in which another thread's swap makes it retry stays short when many threads decide on one key,
/// and calls [`decide`] with the same inputs once its swap has succeeded.
#[inline]
#[cfg_attr(not(feature = "memory"), allow(dead_code))]
pub(crate) fn stored_tat(
    tat: Option<u64>,
    now: u64,
    params: &GcraParams,
    quantity: u64,
) -> Option<u64> {
    let tat = tat.map(|tat| tat.min(now.saturating_add(params.ceiling)));
    let admitted = params
        .emission_interval
        .checked_mul(quantity)
        .and_then(|inc| tat.unwrap_or(now).max(now).checked_add(inc))
        .filter(|n| *n <= now.saturating_add(params.tolerance));
    admitted.or(tat)
}

/// A metered request's cost settled after its response: the TAT to store for a stored `tat`
/// (`None`: no state) at `now`, when the request cost `delta` units more (or, negative, fewer)
/// than it reserved at most `since` ns ago.
///
/// More: `max(tat, now) + delta × T` with no admission test (the response has been sent), capped
/// at the [`ceiling`](GcraParams::ceiling) (`now + tolerance + max_debt × T`); the key is in debt when
/// this lies beyond `now + tolerance`. Fewer: as a refund, the TAT moves back by `|delta| × T`
/// less `since` (the request's units may have drained meanwhile: a backend that knows the key
/// stayed busy without them passes only the time beyond that), and never below `now`. A result
/// not after `now` means no state.
///
/// ```
/// use tower_throttle::{gcra, Limit, Quota};
///
/// let tokens = Limit::new("tokens", Quota::per_second(10)).unwrap().with_max_debt(5);
/// let params = tokens.gcra().unwrap(); // 10 units, one every 100 ms
/// let s = 1_000_000_000;
/// // Reserved 1, used 15: 14 more, but at most 5 past the burst of 10.
/// let reserved = gcra::decide(None, s, params, 1).new_tat;
/// let tat = gcra::settle(reserved, s, params, 14, 0);
/// assert_eq!(tat, Some(s + 1_500_000_000));
/// let refused = gcra::decide(tat, s, params, 1).decision;
/// assert_eq!(refused.remaining, 0);
/// assert_eq!(refused.retry_after, Some(std::time::Duration::from_millis(600)));
/// ```
pub fn settle(
    tat: Option<u64>,
    now: u64,
    params: &GcraParams,
    delta: i64,
    since: u64,
) -> Option<u64> {
    let live = tat.filter(|tat| *tat > now);
    let units = delta.unsigned_abs();
    let moved = if delta >= 0 {
        let cap = now.saturating_add(params.ceiling);
        let charged = live
            .unwrap_or(now)
            .saturating_add(params.emission_interval.saturating_mul(units));
        // Never lower than it was: a TAT already past the cap (another quota's) is left to decide.
        Some(charged.min(cap).max(live.unwrap_or(0)))
    } else {
        let back = params
            .emission_interval
            .saturating_mul(units)
            .saturating_sub(since);
        live.map(|tat| tat.saturating_sub(back))
    };
    moved.filter(|tat| *tat > now)
}

/// The `since` (ns) that [`settle`] takes to give back `units` admitted at most `since` ago: less
/// the time none of them can have drained, while the key stayed busy without them (their
/// decision's `reset_after` less their emission intervals; `None`: not known). A later decision
/// that found the key idle absorbed only what passed beyond that, so the TAT moved back by the
/// rest lands exactly where it would be had the units never been taken, never earlier (unless
/// something else moved the state back meanwhile: another request's give-back, a reset).
#[cfg_attr(not(any(feature = "memory", feature = "redis")), allow(dead_code))]
pub(crate) fn drain_bound(
    since: u64,
    reset_after: Option<Duration>,
    units: u64,
    params: &GcraParams,
) -> u64 {
    let busy = reset_after.map_or(0, |reset| {
        let reset = u64::try_from(reset.as_nanos()).unwrap_or(u64::MAX);
        reset.saturating_sub(params.emission_interval.saturating_mul(units))
    });
    since.saturating_sub(busy)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quota::Quota;

    /// However large the debt allowed, a settled TAT stays a TAT (below `u64::MAX`).
    #[test]
    fn a_settled_debt_stays_below_the_largest_tat() {
        let limit = crate::Limit::new("m", Quota::per_second(1))
            .unwrap()
            .with_max_debt(u64::MAX);
        let params = limit.gcra().unwrap();
        let tat = settle(Some(0), 1_000, params, i64::MAX, 0).unwrap();
        assert_eq!(tat, 1_000 + (1 << 63));
    }

    const S: u64 = 1_000_000_000;
    const MS: u64 = 1_000_000;

    /// redis-cell 0.2.2, `src/cell/mod.rs`, `it_rate_limits`: the same quota and the same 15 cases
    /// (number, now since start, volume, remaining, reset_after, retry_after, limited), where
    /// retry_after -1 means "none".
    #[test]
    fn reproduces_redis_cell_test_table() {
        let limit = 5;
        let params = Quota::per_second(1)
            .with_max_burst(limit - 1)
            .validate()
            .unwrap();
        #[rustfmt::skip]
        let cases: [(u32, u64, u64, u64, u64, i64, bool); 15] = [
            (0, 0, 6, 5, 0, -1, true),
            (1, 0, 1, 4, S, -1, false),
            (2, 0, 1, 3, 2 * S, -1, false),
            (3, 0, 1, 2, 3 * S, -1, false),
            (4, 0, 1, 1, 4 * S, -1, false),
            (5, 0, 1, 0, 5 * S, -1, false),
            (6, 0, 1, 0, 5 * S, S as i64, true),
            (7, 3000 * MS, 1, 2, 3000 * MS, -1, false),
            (8, 3100 * MS, 1, 1, 3900 * MS, -1, false),
            (9, 4000 * MS, 1, 1, 4000 * MS, -1, false),
            (10, 8000 * MS, 1, 4, 1000 * MS, -1, false),
            (11, 9500 * MS, 1, 4, 1000 * MS, -1, false),
            (12, 9500 * MS, 0, 4, S, -1, false),
            (13, 9500 * MS, 2, 2, 3 * S, -1, false),
            (14, 9500 * MS, 5, 2, 3 * S, 3 * S as i64, true),
        ];
        // redis-cell's clock is wall time; any origin works for a pure function.
        let start = 1_700_000_000 * S;
        let mut tat = None;
        for (num, at, volume, remaining, reset_after, retry_after, limited) in cases {
            let out = decide(tat, start + at, &params, volume);
            let reset_after = Duration::from_nanos(reset_after);
            let retry_after = nanos_or_none(retry_after);
            let want = decision(!limited, limit, remaining, retry_after, reset_after);
            assert_eq!(out.decision, want, "case {num}");
            if limited {
                assert_eq!(out.new_tat, tat, "case {num}: a rejection must not write");
            }
            tat = out.new_tat;
        }
    }

    fn decision(
        allowed: bool,
        limit: u64,
        remaining: u64,
        retry: Option<Duration>,
        reset: Duration,
    ) -> Decision {
        Decision {
            allowed,
            ..Decision::limited(limit, remaining, retry, reset)
        }
    }

    /// redis-cell's retry_after: nanoseconds, or -1 for none.
    fn nanos_or_none(n: i64) -> Option<Duration> {
        (n >= 0).then(|| Duration::from_nanos(n as u64))
    }

    fn xorshift(mut x: u64) -> impl FnMut() -> u64 {
        move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        }
    }

    #[test]
    fn stored_tat_is_what_decide_stores() {
        let mut next = xorshift(0x2545_f491_4f6c_dd1d);
        for _ in 0..100_000 {
            let period = Duration::from_nanos(1 + next() % 10_000_000_000);
            let quota =
                crate::Quota::per_period(1 + next() % 1_000, period).with_max_burst(next() % 100);
            let limit = crate::Limit::new("stored-tat", quota).unwrap();
            let params = limit.gcra().unwrap();
            let now = next() % (1 << 50);
            let tat = match next() % 4 {
                0 => None,
                1 => Some(now.saturating_sub(next() % (2 * params.tolerance() + 1))),
                _ => Some(now + next() % (3 * params.tolerance() + 1)),
            };
            let quantity = match next() % 8 {
                0 => 0,
                1 => next(),
                _ => next() % (params.limit() + 2),
            };
            assert_eq!(
                stored_tat(tat, now, params, quantity),
                decide(tat, now, params, quantity).new_tat,
                "{tat:?} {now} {quantity} {params:?}"
            );
        }
    }

    #[test]
    fn intervals_in_is_the_exact_quotient() {
        let mut next = xorshift(0x9e37_79b9_7f4a_7c15);
        #[rustfmt::skip]
        let divisors = [
            1, 2, 3, 7, 10, 1_000, 999_999_937, 1 << 32, (1 << 63) + 1, u64::MAX - 1, u64::MAX,
        ];
        let numerators = [0, 1, 2, u64::MAX / 2, u64::MAX - 1, u64::MAX];
        let random: Vec<u64> = (0..2000).map(|i| next() >> (i % 64)).collect();
        for t in divisors.into_iter().chain(random).filter(|t| *t > 0) {
            let params = GcraParams::new(t, t, 1);
            for n in numerators.into_iter().chain([
                t - 1,
                t,
                t.saturating_add(1),
                t.saturating_mul(3) - 1,
            ]) {
                assert_eq!(params.intervals_in(n), n / t, "{n} / {t}");
            }
            for i in 0..50 {
                let n = next() >> (i % 64);
                assert_eq!(params.intervals_in(n), n / t, "{n} / {t}");
            }
        }
    }

    /// A line-by-line port of redis-cell 0.2.2's `RateLimiter::rate_limit` (signed nanoseconds,
    /// `remaining` computed in float microseconds as it does), to compare every output.
    fn redis_cell(
        stored: Option<i64>,
        now: i64,
        t: i64,
        max_burst: i64,
        quantity: i64,
    ) -> (bool, i64, i64, i64, Option<i64>) {
        let dvt = t * (max_burst + 1);
        let increment = t * quantity;
        let tat = stored.unwrap_or(now);
        let new_tat = if now > tat {
            now + increment
        } else {
            tat + increment
        };
        let allow_at = new_tat - dvt;
        let diff = now - allow_at;
        let (limited, ttl, retry, store) = if diff < 0 {
            let retry = if increment <= dvt { -diff } else { -1 };
            (true, tat - now, retry, stored)
        } else {
            (false, new_tat - now, -1, Some(new_tat))
        };
        let next = dvt - ttl;
        let remaining = if next > -t {
            ((next / 1_000) as f64 / (t / 1_000) as f64) as i64
        } else {
            0
        };
        (limited, remaining, retry, ttl, store)
    }

    #[test]
    fn agrees_with_redis_cell_on_every_output() {
        let mut random = xorshift(0x9e37_79b9_7f4a_7c15);
        let mut next = |n: u64| random() % n;
        for _ in 0..200 {
            // Whole microseconds, as redis-cell's remaining is computed in microseconds.
            let t_us = 1 + next(10_000_000);
            let max_burst = next(20);
            let params = Quota::cl_throttle(max_burst, 1, Duration::from_micros(t_us))
                .validate()
                .unwrap();
            let t = (t_us * 1_000) as i64;
            let mut now = 1_700_000_000 * S as i64;
            let mut stored: Option<i64> = None;
            for _ in 0..200 {
                now += match next(4) {
                    0 => 0,
                    1 => next(t as u64) as i64,
                    _ => next(3 * t as u64 * (max_burst + 1)) as i64,
                };
                // Redis expires the key at its TAT.
                stored = stored.filter(|tat| *tat > now);
                let quantity = next(max_burst + 3);
                let (limited, remaining, retry, reset, store) =
                    redis_cell(stored, now, t, max_burst as i64, quantity as i64);
                let ours = decide(stored.map(|s| s as u64), now as u64, &params, quantity);
                let (reset, retry) = (Duration::from_nanos(reset as u64), nanos_or_none(retry));
                let want = decision(!limited, params.limit(), remaining as u64, retry, reset);
                assert_eq!(ours.decision, want);
                assert_eq!(ours.new_tat.map(|n| n as i64), store);
                stored = store;
            }
        }
    }

    #[test]
    fn a_burst_then_the_steady_rate() {
        // The Quick start's route: max_burst 15, 30 per minute → 16 at once, then one every 2 s.
        let params = Quota::per_minute(30).with_max_burst(15).validate().unwrap();
        let mut tat = None;
        for i in 0..16 {
            let out = decide(tat, 0, &params, 1);
            assert!(out.decision.allowed, "request {i}");
            assert_eq!(out.decision.remaining, 15 - i);
            tat = out.new_tat;
        }
        let d = decide(tat, 0, &params, 1).decision;
        let secs = Duration::from_secs;
        assert_eq!(d, Decision::limited(16, 0, Some(secs(2)), secs(32)));
        // One emission interval later exactly one more passes.
        let out = decide(tat, 2 * S, &params, 1);
        assert!(out.decision.allowed);
        assert!(!decide(out.new_tat, 2 * S, &params, 1).decision.allowed);
    }

    #[test]
    fn high_rates_admit_exactly() {
        // 100,000 a second: in one simulated second at 1 µs steps, exactly limit + 100,000 pass
        // (the burst plus the refill), not 0 and not everything.
        let params = Quota::per_second(100_000).validate().unwrap();
        let mut tat = None;
        let mut passed = 0u64;
        for us in 0..1_000_000u64 {
            let out = decide(tat, us * 1_000, &params, 1);
            passed += u64::from(out.decision.allowed);
            tat = out.new_tat;
        }
        // The burst of 100,000 at t=0, then one each 10 µs during the following 999,999 µs.
        assert_eq!(passed, 100_000 + 99_999);
    }

    #[test]
    fn oversized_and_overflowing_quantities_never_pass_and_never_panic() {
        let params = Quota::per_second(10).validate().unwrap();
        for q in [11, 1_000, u64::MAX / 2, u64::MAX] {
            let out = decide(None, 5 * S, &params, q);
            let d = out.decision;
            assert_eq!((d.allowed, d.retry_after, d.remaining), (false, None, 10));
            assert_eq!(out.new_tat, None);
        }
        // A clock far in the future does not overflow either.
        let out = decide(Some(u64::MAX - 1), u64::MAX - 10, &params, 1);
        assert!(!out.decision.allowed);
    }

    #[test]
    fn a_stale_tat_is_clamped() {
        let params = Quota::per_second(5).validate().unwrap();
        // A TAT 3 s in the past (a key not yet expired): same as a new key.
        let d = decide(Some(2 * S), 5 * S, &params, 6).decision;
        assert_eq!((d.reset_after, d.remaining), (Duration::ZERO, 5));
        let fresh = decide(None, 5 * S, &params, 1);
        let stale = decide(Some(2 * S), 5 * S, &params, 1);
        assert_eq!(fresh, stale);
    }

    /// A refund told its admission's `reset_after` leaves the TAT where it would be had the units
    /// never been taken, however long ago they were (exactly with no decision since; with one,
    /// never earlier); told nothing, it takes the whole time since off a busy key's units too.
    #[test]
    fn a_refund_told_its_reset_after_leaves_the_state_as_if_never_taken() {
        // 10 a second: one unit every 100 ms, a tolerance of 1 s.
        let params = Quota::per_second(10).validate().unwrap();
        let backlog = |tat: Option<u64>, now: u64| tat.map_or(0, |t| t.saturating_sub(now));
        for before_ms in [0, 50, 300, 700] {
            for elapsed_ms in [0, 30, 100, 250, 400, 2_000] {
                for other_at in [None, Some(elapsed_ms / 2)] {
                    let t0 = 10 * S;
                    let before = (before_ms > 0).then_some(t0 + before_ms * MS);
                    let taken = decide(before, t0, &params, 2);
                    assert!(taken.decision.allowed);
                    let (mut tat, mut never) = (taken.new_tat, before);
                    // Another request meanwhile, admitted with the units and without them.
                    if let Some(at) = other_at {
                        let at = t0 + at * MS;
                        (tat, never) = (decide(tat, at, &params, 1).new_tat, {
                            decide(never, at, &params, 1).new_tat
                        });
                    }
                    let now = t0 + elapsed_ms * MS;
                    let reset = Some(taken.decision.reset_after);
                    let since = drain_bound(elapsed_ms * MS, reset, 2, &params);
                    let back = settle(tat, now, &params, -2, since);
                    let case = (before_ms, elapsed_ms, other_at);
                    match other_at {
                        None => assert_eq!(backlog(back, now), backlog(never, now), "{case:?}"),
                        Some(_) => assert!(backlog(back, now) >= backlog(never, now), "{case:?}"),
                    }
                }
            }
        }
        // A busy key (700 ms ahead before them), 250 ms on: both units back told, none untold.
        let (t0, reset) = (10 * S, Some(Duration::from_millis(900)));
        let tat = Some(t0 + 900 * MS);
        let now = t0 + 250 * MS;
        let told = drain_bound(250 * MS, reset, 2, &params);
        assert_eq!(settle(tat, now, &params, -2, told), Some(t0 + 700 * MS));
        assert_eq!(settle(tat, now, &params, -2, 250 * MS), tat);
    }

    #[test]
    fn settle_charges_up_to_the_ceiling_and_refunds_down_to_no_state() {
        // 10 a second: one unit every 100 ms, a tolerance of 1 s.
        let params = Quota::per_second(10).validate().unwrap();
        let metered = params.with_debt(5);
        let at = |ms: u64| Some(S + ms * MS);
        // A charge starts from the TAT, or from now when the key has no live state.
        assert_eq!(settle(None, S, &params, 3, 0), at(300));
        assert_eq!(settle(Some(S - 1), S, &params, 1, 0), at(100));
        assert_eq!(settle(at(200), S, &params, 2, 0), at(400));
        // Capped at now + ceiling: the tolerance, plus the debt of a metered limit.
        assert_eq!(settle(at(900), S, &params, 5, 0), at(1000));
        assert_eq!(settle(at(900), S, &metered, 5, 0), at(1400));
        assert_eq!(settle(at(900), S, &metered, 50, 0), at(1500));
        // Never lower than it was (a TAT past the cap is another quota's state).
        assert_eq!(settle(at(3000), S, &params, 1, 0), at(3000));
        // A refund moves the TAT back, less the time since the request.
        assert_eq!(settle(at(500), S, &params, -2, 0), at(300));
        assert_eq!(settle(at(500), S, &params, -2, 50 * MS), at(350));
        // Back to now or before: no state, and nothing to refund without state.
        assert_eq!(settle(at(200), S, &params, -2, 0), None);
        assert_eq!(settle(at(200), S, &params, -5, 0), None);
        assert_eq!(settle(Some(S), S, &params, -1, 0), None);
        assert_eq!(settle(None, S, &params, -1, 0), None);
        assert_eq!(settle(None, S, &params, 0, 0), None);
    }
}
