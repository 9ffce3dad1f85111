//! The window algorithms and the concurrency limit, as pure functions of a key's stored state.
//!
//! Like [`gcra::decide`](crate::gcra::decide), each function takes the stored state (or `None`), the
//! backend's clock in nanoseconds, the limit and the request's quantity, and returns the
//! [`Decision`] with the state to store. The memory backend calls them under a lock; the Redis
//! backend's Lua script computes the same functions on the server clock. A rejected request never
//! changes the state.
//!
//! | algorithm | exact? | state per key | `Retry-After` |
//! |---|---|---|---|
//! | GCRA | yes: `count` per `period` at a steady rate, bursts of `max_burst + 1` | one timestamp, O(1) | when the next unit is due |
//! | [sliding log](sliding_log) | yes: at most `count` in **any** window of length `period` | one timestamp per admitted unit, O(count) | when enough of the oldest leave the window |
//! | [fixed window](fixed_window) | per window only: up to `2 × count` across a boundary | a window number and a counter, O(1) | the next window boundary |
//! | [sliding window](sliding_window) | approximate (see its error bound) | two counters, O(1) | when the weighted estimate leaves room |
//! | [concurrency] | yes: at most `count` in flight | a counter (in Redis: one lease per request) | 1 s (unknown) |
//!
//! Windows are aligned on multiples of `period` since the clock's epoch (the Unix epoch for the
//! system clock and for Redis), so every process and every key shares the same boundaries. A fixed
//! window may instead follow the calendar of a time zone ([`CalendarWindow`]: days, ISO weeks,
//! months from an anchor day), or start at a phase of each key's own ([`WindowStart::PerKey`]).

use std::collections::VecDeque;
use std::time::Duration;

use crate::calendar::Calendar;
use crate::decision::Decision;

pub use crate::calendar::{CalendarPeriod, CalendarWindow};

/// How long a client rejected by a concurrency limit is told to wait: when a slot frees up is
/// unknown, so this is a hint, not a promise.
pub const CONCURRENCY_RETRY: Duration = Duration::from_secs(1);

/// Where a fixed window's boundaries fall
/// ([`PolicyBuilder::window_start`](crate::PolicyBuilder::window_start)).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum WindowStart {
    /// On multiples of the period since the Unix epoch, for every key: "100 per calendar minute".
    /// Every key's window resets at the same instant, so clients refused together come back
    /// together.
    #[default]
    Aligned,
    /// At a phase of each key's own, from a hash of the key that every process computes alike:
    /// the same key always has the same boundaries, and the keys' resets are spread over the
    /// period.
    PerKey,
}

/// Validated window parameters in nanoseconds: at most `limit` units per window of `period`
/// (for a fixed window on the calendar, per window of the calendar, `period` being its nominal
/// length).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct WindowParams {
    period: u64,
    limit: u64,
    per_key: bool,
    /// A fixed window's calendar, whose windows replace the period's.
    calendar: Option<&'static Calendar>,
}

impl WindowParams {
    pub(crate) const fn new(period: u64, limit: u64) -> Self {
        WindowParams {
            period,
            limit,
            per_key: false,
            calendar: None,
        }
    }

    pub(crate) const fn on_calendar(self, calendar: &'static Calendar) -> Self {
        WindowParams {
            calendar: Some(calendar),
            ..self
        }
    }

    pub(crate) const fn is_per_key(&self) -> bool {
        self.per_key
    }

    pub(crate) fn calendar(&self) -> Option<&'static Calendar> {
        self.calendar
    }

    /// The fixed window holding `now` (Unix nanoseconds): its number (on the calendar, its end in
    /// Unix seconds) and the nanoseconds left to its end.
    #[inline]
    pub(crate) fn fixed_window_at(&self, now: u64) -> (u64, u64) {
        match self.calendar {
            None => (now / self.period, self.period - now % self.period),
            Some(calendar) => calendar.window_at_nanos(now),
        }
    }

    /// When fixed window `window` (as [`fixed_window_at`](Self::fixed_window_at) numbers it) ends,
    /// in Unix nanoseconds.
    pub(crate) fn fixed_window_end(&self, window: u64) -> u64 {
        match self.calendar {
            None => window.saturating_add(1).saturating_mul(self.period),
            Some(_) => window.saturating_mul(1_000_000_000),
        }
    }

    pub(crate) const fn per_key(self) -> Self {
        WindowParams {
            per_key: true,
            ..self
        }
    }

    /// How far to move the clock for `key` so that its windows start at its own phase (0 for
    /// aligned windows): `period - phase`, the phase in whole microseconds (Redis' clock), below
    /// the period. Moving forward by `period - phase` cuts where moving back by `phase` would,
    /// without going below 0.
    #[cfg_attr(not(any(feature = "memory", feature = "redis")), allow(dead_code))]
    pub(crate) fn shift_of(&self, key: &crate::key::Key) -> u64 {
        if !self.per_key {
            return 0;
        }
        let key_hash = key.stable_hash();
        let period_us = (self.period / 1000).max(1);
        self.period - (key_hash % period_us) * 1000 % self.period
    }

    /// The window length in nanoseconds (at least 1).
    pub const fn period(&self) -> u64 {
        self.period
    }

    /// Units admitted per window (at least 1).
    pub const fn limit(&self) -> u64 {
        self.limit
    }
}

fn nanos(n: u64) -> Duration {
    Duration::from_nanos(n)
}

/// A fixed window's stored state: which window, and how many units it admitted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct FixedState {
    /// The window's number: its start divided by the period.
    pub window: u64,
    /// Units admitted in that window.
    pub count: u64,
}

/// **Fixed window**: a counter per window of `period` (or of its calendar), reset at each boundary.
///
/// Cheap and easy to explain ("100 per calendar minute"), but a client may spend its whole quota at
/// the end of one window and again at the start of the next: up to `2 × count` within one `period`.
/// A rejection's `Retry-After` points at the next boundary; `reset_after` is the same.
#[inline]
pub fn fixed_window(
    state: Option<FixedState>,
    now: u64,
    params: &WindowParams,
    quantity: u64,
) -> (Decision, Option<FixedState>) {
    let limit = params.limit;
    let (mut window, mut to_boundary) = params.fixed_window_at(now);
    // The next window (kept by a clock ahead: a restored state file) is the one the key counts in
    // until it ends, as the Redis script decides on a clock that steps back. Only the next (the
    // window holding the instant this one ends): one further on was numbered under another
    // period. Looked for only past this window, so a calendar's is reckoned then alone.
    let next = |s: &FixedState| {
        s.window > window && s.window == params.fixed_window_at(params.fixed_window_end(window)).0
    };
    if let Some(s) = state.filter(next) {
        (window, to_boundary) = (s.window, params.fixed_window_end(s.window) - now);
    }
    // A count above the limit was kept under a larger quota (a reload, a restored state file): it
    // means "full" under this one.
    let used = match state {
        Some(s) if s.window == window => s.count.min(limit),
        _ => 0,
    };
    let reset = if used == 0 { 0 } else { to_boundary };
    match used.checked_add(quantity).filter(|total| *total <= limit) {
        Some(total) => {
            let reset = if total == 0 { 0 } else { to_boundary };
            let stored = (total > 0).then_some(FixedState {
                window,
                count: total,
            });
            (
                Decision::allowed(limit, limit - total, nanos(reset)),
                stored,
            )
        }
        None => {
            let retry = (quantity <= limit).then(|| nanos(to_boundary));
            let decision = Decision::limited(limit, limit - used, retry, nanos(reset));
            (decision, state.filter(|s| s.window == window))
        }
    }
}

/// A sliding window counter's stored state: the counts of the current and the previous window.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct SlidingState {
    /// The number of the window `current` counts.
    pub window: u64,
    /// Units admitted in window `window`.
    pub current: u64,
    /// Units admitted in window `window - 1`.
    pub previous: u64,
}

impl SlidingState {
    /// The counts (current, previous) as seen from window `window`.
    pub(crate) fn at(state: Option<SlidingState>, window: u64) -> (u64, u64) {
        match state {
            Some(s) if s.window == window => (s.current, s.previous),
            Some(s) if s.window.saturating_add(1) == window => (0, s.current),
            _ => (0, 0),
        }
    }
}

/// **Sliding window counter**: the previous-window weighted approximation that Cloudflare describes.
///
/// The number of units in the window of length `period` ending now is estimated as
/// `previous × (period − elapsed) / period + current`, where `elapsed` is the time since the current
/// window began: it assumes the previous window's requests were spread evenly. A request passes when
/// the estimate plus its quantity is at most `count`. The comparison is exact (integer arithmetic on
/// `count × period`), so the only error is the assumption.
///
/// **Error bound.** When the previous window's requests were spread evenly, the estimate is exact.
/// When they were bunched at its end, the estimate is low: up to (but never quite) `2 × count` units
/// can pass in one window of length `period` (the previous window's `count` in its last instant, then
/// `count × elapsed / period` more as they are weighted out). When they were bunched at its start,
/// the estimate is high and fewer than `count` pass. No window *aligned on the period* ever holds more
/// than `count`. `tests/memory/window_accuracy.rs` measures the error against the exact sliding log on a
/// recorded pattern.
pub fn sliding_window(
    state: Option<SlidingState>,
    now: u64,
    params: &WindowParams,
    quantity: u64,
) -> (Decision, Option<SlidingState>) {
    let WindowParams { period, limit, .. } = *params;
    let (mut window, mut left) = (now / period, period - now % period);
    // The next window (as the fixed window's): decided at its start, where its previous count
    // weighs most, as the Redis script decides.
    if let Some(s) = state.filter(|s| s.window == window.saturating_add(1)) {
        (window, left) = (s.window, period);
    }
    // Counts above the limit were kept under a larger quota: "full" under this one, as in the
    // fixed window (and as the Redis script reads them).
    let (current, previous) = SlidingState::at(state, window);
    let (current, previous) = (current.min(limit), previous.min(limit));
    let p = u128::from(period);
    // estimate × period, exactly.
    let weighted = u128::from(previous) * u128::from(left) + u128::from(current) * p;
    let capacity = u128::from(limit) * p;
    let reset = if current > 0 {
        left + period
    } else if previous > 0 {
        left
    } else {
        0
    };
    let cost = u128::from(quantity) * p;
    let stored_now = |current: u64| {
        (current > 0 || previous > 0).then_some(SlidingState {
            window,
            current,
            previous,
        })
    };
    if weighted + cost <= capacity {
        let current = current + quantity;
        let used = weighted + cost;
        let remaining = ((capacity - used) / p) as u64;
        let reset = if current > 0 { left + period } else { reset };
        return (
            Decision::allowed(limit, remaining, nanos(reset)),
            stored_now(current),
        );
    }
    let remaining = (capacity.saturating_sub(weighted) / p) as u64;
    let retry = if quantity > limit {
        None
    } else if current
        .checked_add(quantity)
        .is_some_and(|total| total <= limit)
    {
        // Later in this window, as the previous window is weighted out: previous × (left − w) must
        // fit in (limit − current − quantity) × period.
        let room = u128::from(limit - current - quantity) * p;
        let fits = (room / u128::from(previous)) as u64;
        Some(nanos(left - fits.min(left)))
    } else {
        // Not before the next window, where this window's `current` is the one weighted out.
        let room = u128::from(limit - quantity) * p;
        let fits = (room / u128::from(current)).min(p) as u64;
        Some(nanos(left + (period - fits)))
    };
    (
        Decision::limited(limit, remaining, retry, nanos(reset)),
        stored_now(current),
    )
}

/// **Sliding log**: the time of every admitted unit within the last `period`, so that at most
/// `count` units pass in **any** window of length `period`. Exact, at O(`count`) memory per key
/// (the GCRA needs O(1)); rejected requests are not recorded, so a client that keeps retrying does
/// not lock itself out.
///
/// A unit admitted at `t` leaves the window when the clock reaches `t + period`.
/// `log` holds the times in order, oldest first; this function trims it and appends to it.
pub fn sliding_log(
    log: &mut VecDeque<u64>,
    now: u64,
    params: &WindowParams,
    quantity: u64,
) -> Decision {
    let WindowParams { period, limit, .. } = *params;
    while log.front().is_some_and(|t| t.saturating_add(period) <= now) {
        log.pop_front();
    }
    let used = log.len() as u64;
    let reset_of = |log: &VecDeque<u64>| {
        log.back().map_or(0, |newest| {
            newest.saturating_add(period).saturating_sub(now)
        })
    };
    if used
        .checked_add(quantity)
        .is_some_and(|total| total <= limit)
    {
        log.extend(std::iter::repeat_n(now, quantity as usize));
        return Decision::allowed(limit, limit - log.len() as u64, nanos(reset_of(log)));
    }
    let retry = (quantity <= limit).then(|| {
        // The oldest `used + quantity − limit` units must leave.
        let leaving = (used + quantity - limit - 1) as usize;
        nanos(log[leaving].saturating_add(period) - now)
    });
    // A log longer than the limit was kept under a larger quota: nothing remains.
    Decision::limited(
        limit,
        limit.saturating_sub(used),
        retry,
        nanos(reset_of(log)),
    )
}

/// **Concurrency**: at most `limit` units in flight. `in_flight` is the key's count; an admitted
/// request adds its quantity, which the caller gives back when the request ends.
pub fn concurrency(in_flight: u64, limit: u64, quantity: u64) -> (Decision, u64) {
    match in_flight
        .checked_add(quantity)
        .filter(|total| *total <= limit)
    {
        Some(total) => (
            Decision::allowed(limit, limit - total, Duration::ZERO),
            total,
        ),
        None => {
            let retry = (quantity <= limit).then_some(CONCURRENCY_RETRY);
            let remaining = limit.saturating_sub(in_flight);
            // The fields' reset is no sooner than the retry: `t=0` tells a client to come back now.
            let reset = retry.unwrap_or(Duration::ZERO);
            (Decision::limited(limit, remaining, retry, reset), in_flight)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;
    const MS: u64 = 1_000_000;

    fn params(limit: u64, period: u64) -> WindowParams {
        WindowParams::new(period, limit)
    }

    fn fixed(window: u64, count: u64) -> Option<FixedState> {
        Some(FixedState { window, count })
    }

    fn sliding(window: u64, current: u64, previous: u64) -> Option<SlidingState> {
        Some(SlidingState {
            window,
            current,
            previous,
        })
    }

    // tests/memory/algorithms.rs shows, through the memory backend, how each algorithm counts
    // (`fixed_window_counts_per_window_and_resets_on_the_boundary`,
    // `sliding_window_weighs_the_previous_window`,
    // `sliding_log_is_exact_and_does_not_record_rejections`,
    // `concurrency_counts_requests_in_flight_until_released`). Below: what it cannot show (the
    // stored state, a key without one).

    #[test]
    fn a_rejection_keeps_the_state_and_counts_above_a_smaller_limit_read_as_full() {
        let p = params(3, S);
        let full = fixed(10, 3);
        let (d, stored) = fixed_window(full, 10 * S + 700 * MS, &p, 1);
        assert_eq!((d.allowed, d.retry_after), (false, Some(nanos(300 * MS))));
        assert_eq!(stored, full);
        // More than the limit can never pass.
        let d = fixed_window(None, 0, &p, u64::MAX).0;
        assert!(!d.allowed && d.retry_after.is_none());
        let params = WindowParams::new(10, 3);
        let kept = fixed(0, 50);
        let (d, next) = fixed_window(kept, 5, &params, 1);
        assert!(!d.allowed && d.remaining == 0, "{d:?}");
        assert_eq!(next, kept);
        let mut log: VecDeque<u64> = (0..50).collect();
        let d = sliding_log(&mut log, 60, &WindowParams::new(1000, 3), 1);
        assert!(!d.allowed && d.remaining == 0, "{d:?}");
    }

    /// A window newer than the clock's (a state file written by a clock ahead) still counts, until
    /// it ends: decided afresh in the clock's window, the key would get its limit again.
    #[test]
    fn a_window_newer_than_the_clock_still_counts() {
        let p = params(3, S);
        let (d, stored) = fixed_window(fixed(11, 3), 10 * S + 700 * MS, &p, 1);
        assert_eq!((d.allowed, d.retry_after), (false, Some(nanos(1300 * MS))));
        assert_eq!(stored, fixed(11, 3));
        let (d, stored) = fixed_window(fixed(11, 1), 10 * S + 700 * MS, &p, 1);
        assert_eq!(
            (d.allowed, d.remaining, d.reset_after),
            (true, 1, nanos(1300 * MS))
        );
        assert_eq!(stored, fixed(11, 2));
        // The sliding window: window 11's 3 weigh in full, at its start.
        let (d, stored) = sliding_window(sliding(11, 3, 0), 10 * S + 700 * MS, &p, 1);
        assert!(!d.allowed && d.remaining == 0, "{d:?}");
        assert_eq!(stored, sliding(11, 3, 0));
        let (d, stored) = sliding_window(sliding(11, 1, 0), 10 * S + 700 * MS, &p, 1);
        assert!(d.allowed && d.remaining == 1, "{d:?}");
        assert_eq!(stored, sliding(11, 2, 0));
        // A window further on was numbered under another (shorter) period: it counts for nothing.
        let (d, stored) = fixed_window(fixed(600, 3), 10 * S + 700 * MS, &p, 1);
        assert!(d.allowed && d.remaining == 2, "{d:?}");
        assert_eq!(stored, fixed(10, 1));
        let (d, stored) = sliding_window(sliding(600, 3, 0), 10 * S + 700 * MS, &p, 1);
        assert!(d.allowed && d.remaining == 2, "{d:?}");
        assert_eq!(stored, sliding(10, 1, 0));
    }

    /// On the calendar too: the next day's count, kept by a clock a little ahead, counts on a
    /// clock still in the day before (the window holding the instant this one ends).
    #[cfg(feature = "calendar")]
    #[test]
    fn a_calendar_day_counted_by_a_clock_ahead_still_counts() {
        let day = crate::window::CalendarWindow::day();
        let nominal = day.period().nominal();
        let calendar = crate::calendar::Calendar::of(&day, nominal).unwrap();
        let p = WindowParams::new(nominal.as_nanos() as u64, 2).on_calendar(calendar);
        let midnight = 1_767_225_600; // 2026-01-01T00:00:00Z
        let (d, spent) = fixed_window(None, (midnight + 10) * S, &p, 2);
        assert!(d.allowed);
        let (d, kept) = fixed_window(spent, (midnight - 5) * S, &p, 1);
        assert!(!d.allowed, "{d:?}");
        assert_eq!(d.retry_after, Some(nanos((24 * 3600 + 5) * S)));
        assert_eq!(kept, spent);
        // Two days on was counted under another period: nothing.
        let (d, _) = fixed_window(spent, (midnight - 86_400 - 5) * S, &p, 1);
        assert!(d.allowed, "{d:?}");
    }

    /// A count near `u64::MAX` (no bound in memory) is refused without overflowing.
    #[test]
    fn a_sliding_window_of_the_largest_count_refuses_without_overflow() {
        let p = params(u64::MAX, S);
        let (d, full) = sliding_window(None, 0, &p, u64::MAX);
        assert!(d.allowed, "{d:?}");
        let d = sliding_window(full, 1, &p, 1).0;
        assert!(!d.allowed && d.retry_after.is_some(), "{d:?}");
    }

    #[test]
    fn a_limited_sliding_window_reports_what_is_left_and_when_it_resets() {
        let p = params(10, S);
        let half = S + 500 * MS;
        // 10 in window 0, 2 in window 1; half-way they weigh 5 + 2 = 7: 3 left, 4 wanted.
        let s = sliding(1, 2, 10);
        let (d, stored) = sliding_window(s, half, &p, 4);
        assert!(!d.allowed);
        assert_eq!((d.limit, d.remaining), (10, 3));
        // Fits once 10 × (1 − e) + 2 + 4 <= 10, at e = 0.6: 100 ms later.
        assert_eq!(d.retry_after, Some(nanos(100 * MS)));
        // This window's units weigh until the end of the next one.
        assert_eq!(d.reset_after, nanos(1500 * MS));
        assert_eq!(stored, s, "a rejection changes nothing");
        // 8 in this window, nothing before: 2 left, 5 wanted, not before the next window, where
        // 8 × (1 − e) + 5 <= 10 from e = 0.375: 875 ms from now.
        let (d, _) = sliding_window(sliding(1, 8, 0), half, &p, 5);
        assert_eq!((d.allowed, d.remaining), (false, 2));
        assert_eq!(d.retry_after, Some(nanos(875 * MS)));
        assert_eq!(d.reset_after, nanos(1500 * MS));
        // A full current window must wait into the next one: in window 2, 10 × (1 − e) + 5 <= 10
        // from e = 0.5.
        let full = sliding(1, 10, 0);
        let (d, _) = sliding_window(full, half, &p, 5);
        assert_eq!((d.allowed, d.retry_after), (false, Some(nanos(S))));
        assert!(sliding_window(full, 2 * S + 500 * MS, &p, 5).0.allowed);
        // Only the previous window's units: they weigh until this window ends. A quarter into
        // window 1 its 10 weigh 7.5, so 2 more fit (not 3), stored beside them; an oversized
        // request never fits, and stores the roll-over only.
        let s = sliding(0, 10, 0);
        let (d, stored) = sliding_window(s, S + 250 * MS, &p, 2);
        assert_eq!((d.allowed, d.remaining), (true, 0));
        assert_eq!(stored, sliding(1, 2, 10));
        let (d, stored) = sliding_window(s, S + 250 * MS, &p, 11);
        assert_eq!((d.allowed, d.remaining, d.retry_after), (false, 2, None));
        assert_eq!(d.reset_after, nanos(750 * MS));
        assert_eq!(stored, sliding(1, 0, 10));
    }

    /// Counts kept under a larger quota read as the limit (full), as the fixed window's do: half
    /// into window 1, 50 from window 0 weigh as 10 × 0.5 = 5.
    #[test]
    fn a_sliding_window_counts_past_the_limit_as_full() {
        let p = params(10, S);
        let (d, stored) = sliding_window(sliding(1, 0, 50), S + 500 * MS, &p, 1);
        assert_eq!((d.allowed, d.remaining), (true, 4));
        assert_eq!(stored, sliding(1, 1, 10));
        let (d, _) = sliding_window(sliding(1, u64::MAX, 0), S + 500 * MS, &p, 1);
        assert_eq!((d.allowed, d.remaining), (false, 0));
    }

    #[test]
    fn a_peek_or_an_oversized_request_on_a_new_key_stores_nothing() {
        let p = params(10, S);
        for now in [0, S + 250 * MS] {
            let (d, stored) = sliding_window(None, now, &p, 0);
            assert_eq!((d.allowed, d.remaining), (true, 10));
            assert_eq!(d.reset_after, Duration::ZERO);
            assert_eq!(stored, None, "a peek at {now}");
            let (d, stored) = sliding_window(None, now, &p, 11);
            assert_eq!((d.allowed, d.remaining, d.retry_after), (false, 10, None));
            assert_eq!(d.reset_after, Duration::ZERO);
            assert_eq!(stored, None, "an oversized request at {now}");
        }
        // A state two windows old is no state.
        assert_eq!(sliding_window(sliding(0, 10, 10), 2 * S, &p, 0).1, None);
    }
}
