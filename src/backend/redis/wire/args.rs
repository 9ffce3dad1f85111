//! What a limit becomes on the wire: its Redis keys, the arguments of `gcra.lua`, `limits.lua` and
//! `CL.THROTTLE`, and what the Redis backend refuses because it cannot enforce it exactly.

use std::time::Duration;

use super::mode::RedisMode;
use crate::error::BuildError;
use crate::key::Key;
use crate::limit::{check_stack, Algorithm, Limit, DEFAULT_LEASE};
use crate::penalty::Penalty;

/// The Lua path computes `tat - now` and its sums exactly in doubles (53-bit integers) while the
/// tolerance plus one interval stays within 2^52 ns (about 52 days); longer ones are refused.
const LUA_MAX_WINDOW_NS: u64 = 1 << 52;

/// Bounds that keep limits.lua's integers exact in doubles: periods below 2^52 ns, counts below
/// 2^51; sliding windows: count × period (µs) below 2^51, counts below 2^41.
const WINDOW_MAX_PERIOD_NS: u64 = 1 << 52;
const MAX_COUNT: u64 = 1 << 51;
const SLIDING_MAX_COUNT: u64 = 1 << 41;

/// The Redis key that holds `key`'s state under the policy `policy`: `prefix:policy:{key}`.
pub(crate) fn redis_key(prefix: &str, policy: &str, key: &Key) -> String {
    let mut out = String::with_capacity(prefix.len() + policy.len() + 48);
    out.push_str(prefix);
    out.push(':');
    out.push_str(policy);
    out.push_str(":{");
    let start = out.len();
    key.render(&mut out);
    if out.len() == start {
        // The empty key: `{}` is no hash tag (Redis hashes the whole name), and a stack's keys
        // would fall in different Cluster slots. A lone `%` is no key's rendering.
        out.push('%');
    }
    out.push('}');
    out
}

/// The Redis key that holds `key`'s state under `limit`: [`redis_key`] with the algorithm's suffix.
pub(crate) fn state_key(prefix: &str, limit: &Limit, key: &Key) -> String {
    let mut out = redis_key(prefix, limit.name(), key);
    out.push_str(suffix(limit.algorithm()));
    out
}

/// `key`'s state under `limit`, one of a stack whose limits have keys of their own:
/// `prefix:limit:{tag}:key` and the algorithm's suffix, `tag` the stack's first limit's name, so
/// the whole stack shares one Cluster slot and one script; `key` is escaped as in [`redis_key`].
pub(crate) fn keyed_state_key(prefix: &str, tag: &str, limit: &Limit, key: &Key) -> String {
    let mut out = format!("{prefix}:{}:{{{tag}}}:", limit.name());
    key.render(&mut out);
    out.push_str(suffix(limit.algorithm()));
    out
}

/// The key suffix of each algorithm: a changed algorithm never reads another's key (`WRONGTYPE`).
fn suffix(algorithm: Algorithm) -> &'static str {
    match algorithm {
        Algorithm::Gcra => "",
        Algorithm::SlidingLog => ":log",
        Algorithm::FixedWindow => ":fixed",
        Algorithm::SlidingWindow => ":sliding",
        Algorithm::Concurrency => ":concurrency",
    }
}

/// A penalty box's arguments to the scripts: after, within (ms), ban (ms); 0 0 0 without one.
pub(crate) fn penalty_args(penalty: Option<&Penalty>) -> [u64; 3] {
    penalty.map_or([0; 3], |p| {
        let ms = |d: Duration| d.as_millis().max(1) as u64;
        [u64::from(p.after()), ms(p.within()), ms(p.ban())]
    })
}

/// What a policy's quota becomes on each path.
#[derive(Clone, Copy)]
pub(crate) struct Args {
    /// The limit delays ([`Limit::with_delay`]), which `CL.THROTTLE` cannot express: always Lua.
    pub(crate) delayed: bool,
    pub(crate) interval: u64,
    pub(crate) tolerance: u64,
    /// How far ahead (ns) the scripts read a stored TAT as it is: the GCRA's `ceiling` (beyond
    /// it, a TAT was written under another quota).
    pub(crate) ceiling: u64,
    pub(crate) limit: u64,
    /// `CL.THROTTLE key max_burst count period`: `None` when the quota has no exact whole-second
    /// form.
    pub(crate) cell: Option<CellArgs>,
}

#[derive(Clone, Copy)]
pub(crate) struct CellArgs {
    pub(crate) max_burst: u64,
    pub(crate) count: u64,
    pub(crate) period_secs: u64,
}

impl Args {
    /// The GCRA's arguments (`None` for the other algorithms), with `CL.THROTTLE`'s only if `cell`
    /// (the mode may take that path): its whole-second form takes 128-bit divisions, which the Lua
    /// path need not pay.
    pub(crate) fn new(limit: &Limit, cell: bool) -> Option<Args> {
        let params = limit.gcra()?;
        let delayed = limit.delay().is_some();
        Some(Args {
            delayed,
            interval: params.emission_interval(),
            tolerance: params.tolerance(),
            ceiling: params.ceiling(),
            limit: params.limit(),
            cell: (cell && !delayed && cell_counts_exactly(limit))
                .then(|| cell_args(limit))
                .flatten(),
        })
    }

    /// Whether the limit is metered: its keys may hold debt past the tolerance.
    pub(crate) fn metered(&self) -> bool {
        self.ceiling != self.tolerance
    }
}

/// Why the Redis backend cannot settle metered `limit`'s costs exactly: not a GCRA limit, a leased
/// budget (granted before the cost is known), or a debt past 2^52 ns (about 52 days).
fn metered_error(limit: &Limit) -> Result<(), String> {
    if !limit.is_metered() {
        return Ok(());
    }
    let name = limit.name();
    let Some(params) = limit.gcra() else {
        return Err(format!(
            "policy {name:?}: a metered limit settles its cost on a GCRA limit, not a {} limit",
            limit.algorithm()
        ));
    };
    if limit.budget().is_some() {
        return Err(format!(
            "policy {name:?}: a metered limit cannot have a leased budget on the Redis backend (a \
             slice is granted before the cost is known); remove the budget"
        ));
    }
    let window = params.ceiling().checked_add(params.emission_interval());
    if window.is_none_or(|w| w >= LUA_MAX_WINDOW_NS) {
        return Err(format!(
            "policy {name:?}: the Redis backend holds debts that are paid back within 52 days \
             (the burst plus max_debt = {} units, at one every {:?}); lower max_debt",
            limit.max_debt(),
            Duration::from_nanos(params.emission_interval())
        ));
    }
    Ok(())
}

/// The quota as `count` per `period_secs` whole seconds at exactly the same rate, in the fewest
/// seconds that hold a whole number of emissions.
fn cell_args(limit: &Limit) -> Option<CellArgs> {
    const NANOS: u128 = 1_000_000_000;
    let quota = limit.quota();
    let period = quota.period().as_nanos();
    let count = u128::from(quota.count());
    if period == 0 || count == 0 {
        return None;
    }
    // A whole-second period is sent as it is; otherwise count' / secs = count / period, with the
    // smallest such secs: period / gcd(period, count × 10^9).
    let secs = if period.is_multiple_of(NANOS) {
        period / NANOS
    } else {
        period / gcd(period, count * NANOS)
    };
    let scaled_count = count * NANOS * secs / period;
    let max = i64::MAX as u128;
    if secs == 0 || secs > max / NANOS || scaled_count == 0 || scaled_count > max {
        return None;
    }
    // redis-cell divides the period by the count in nanoseconds, like Quota::validate: same
    // interval.
    let cell_interval = secs * NANOS / scaled_count;
    if Some(cell_interval as u64) != limit.gcra().map(|p| p.emission_interval()) {
        return None;
    }
    // redis-cell counts what remains in whole microseconds of the interval: under one, it divides
    // by zero and says i64::MAX remain.
    if cell_interval < 1_000 {
        return None;
    }
    Some(CellArgs {
        max_burst: quota.max_burst(),
        count: scaled_count as u64,
        period_secs: secs as u64,
    })
}

/// Whether `CL.THROTTLE` counts the limit as exactly as Lua does; Lua takes the others in every
/// mode.
fn cell_counts_exactly(limit: &Limit) -> bool {
    let Some(params) = limit.gcra() else {
        return false;
    };
    let interval = params.emission_interval();
    // It counts what remains in whole microseconds of the interval: where those it drops are more
    // than a thousandth of it, what it says remains is that far off (1.67 µs read as 1: 13 of a
    // limit of 10).
    let whole_us = interval >= 1_000_000 || interval.is_multiple_of(1_000);
    // It sets a key's expiry in whole milliseconds, truncated: a key whose TAT is less than one
    // ahead is gone at the next, and its next request finds the whole burst. Under 10 ms of
    // tolerance that is most of a flood's requests; at 10 ms, a tenth of the burst at most.
    let tolerance = u128::from(interval) * (u128::from(limit.quota().max_burst()) + 1);
    whole_us && tolerance >= 10_000_000
}

fn gcd(mut a: u128, mut b: u128) -> u128 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

/// One limit as the limits script takes it: its key, `kind`, limit and two parameters.
pub(crate) struct Spec {
    pub(crate) key: String,
    pub(crate) kind: u8,
    pub(crate) limit: u64,
    pub(crate) a: u64,
    pub(crate) b: u64,
    /// The GCRA's [`Args::ceiling`] (0 for the other algorithms).
    pub(crate) ceiling: u64,
}

const KIND_GCRA: u8 = 0;
const KIND_FIXED_WINDOW: u8 = 2;
const KIND_CONCURRENCY: u8 = 4;
const KIND_CALENDAR_WINDOW: u8 = 5;

/// A calendar window's two lengths (whole seconds, under 2^22: 48 days; a month is at most 32) go
/// in one argument, the first times this plus the second (below 2^44: exact in a double).
const CALENDAR_SPLIT: u64 = 1 << 22;

impl Spec {
    /// [`of`](Self::of) for `key` now, on `state_key`: a fixed window at the key's own phase
    /// ([`WindowStart::PerKey`](crate::window::WindowStart::PerKey)) takes its shift (µs) as `b`; a
    /// calendar window, the bounds around this process's clock ([`calendar_args`]).
    pub(crate) fn on(limit: &Limit, key: &Key, state_key: String) -> Result<Spec, String> {
        let mut spec = Self::of(limit, state_key)?;
        match spec.kind {
            KIND_FIXED_WINDOW => spec.b = limit.window_shift(key) / 1000,
            KIND_CALENDAR_WINDOW => {
                if let Some(calendar) = limit.window().and_then(|w| w.calendar()) {
                    (spec.a, spec.b) = calendar_args(calendar.bounds_now());
                }
            }
            _ => {}
        }
        Ok(spec)
    }

    /// `settle.lua`'s last parameter for this limit: the GCRA's ceiling, a fixed window's shift, a
    /// calendar window's lengths.
    pub(crate) fn settle_last(&self) -> u64 {
        match self.kind {
            KIND_FIXED_WINDOW | KIND_CALENDAR_WINDOW => self.b,
            _ => self.ceiling,
        }
    }

    /// The script's arguments for `limit`, or why the script cannot enforce it exactly.
    pub(crate) fn of(limit: &Limit, key: String) -> Result<Spec, String> {
        let name = limit.name();
        let too_many = |count: u64| {
            format!("policy {name:?}: the Redis backend supports counts up to 2^51, not {count}")
        };
        let algorithm = limit.algorithm();
        let ceiling = limit.gcra().map_or(0, |params| params.ceiling());
        let spec = |kind, limit, a, b| Spec {
            key,
            kind,
            limit,
            a,
            b,
            ceiling,
        };
        if let Some(gcra) = limit.gcra() {
            let window = gcra.tolerance().checked_add(gcra.emission_interval());
            if window.is_none_or(|w| w > LUA_MAX_WINDOW_NS) {
                return Err(format!(
                    "policy {name:?}: the Redis backend supports bursts that refill within 52 days \
                     (period / count × (max_burst + 1)); this quota needs {:?}",
                    Duration::from_nanos(gcra.tolerance())
                ));
            }
            return Ok(spec(
                KIND_GCRA,
                gcra.limit(),
                gcra.emission_interval(),
                gcra.tolerance(),
            ));
        }
        if let Some(count) = limit.concurrency() {
            if count > MAX_COUNT {
                return Err(too_many(count));
            }
            let lease = limit.lease().unwrap_or(DEFAULT_LEASE);
            // Rounded up: a lease never ends before the time it was given.
            let lease_us = lease.as_nanos().div_ceil(1000) as u64;
            return Ok(spec(KIND_CONCURRENCY, count, lease_us, 0));
        }
        let Some(window) = limit.window() else {
            return Err(format!(
                "policy {name:?}: the Redis backend cannot enforce algorithm {algorithm:?}"
            ));
        };
        let (period, count) = (window.period(), window.limit());
        // TIME counts microseconds: finer periods would miss window.rs's boundaries.
        if period % 1000 != 0 {
            return Err(format!(
                "policy {name:?}: the Redis backend needs the period of a {algorithm} limit to be a \
                 whole number of microseconds, not {:?}",
                Duration::from_nanos(period)
            ));
        }
        if period >= WINDOW_MAX_PERIOD_NS {
            return Err(format!(
                "policy {name:?}: the Redis backend supports {algorithm} periods shorter than 52 days, \
                 not {:?}",
                Duration::from_nanos(period)
            ));
        }
        if count > MAX_COUNT {
            return Err(too_many(count));
        }
        let period_us = period / 1000;
        let kind = match algorithm {
            Algorithm::SlidingLog => 1,
            // Its bounds come with each call (`on`).
            Algorithm::FixedWindow if window.calendar().is_some() => {
                return Ok(spec(KIND_CALENDAR_WINDOW, count, 0, 0));
            }
            Algorithm::FixedWindow => KIND_FIXED_WINDOW,
            _ => {
                // The weighted estimate is count × period (µs), exact in a double below 2^51; a
                // retry time's remainder is below count × 1000.
                if count > SLIDING_MAX_COUNT {
                    return Err(format!(
                        "policy {name:?}: the Redis backend supports sliding windows of up to 2^41 \
                         units, not {count}"
                    ));
                }
                if count.checked_mul(period_us).is_none_or(|p| p > MAX_COUNT) {
                    return Err(format!(
                        "policy {name:?}: the Redis backend supports sliding windows whose count × \
                         period stays below 2^51 µs (about 26,000 a day, 600,000 an hour); this one \
                         is {count} per {:?}",
                        Duration::from_nanos(period)
                    ));
                }
                3
            }
        };
        Ok(spec(kind, count, period_us, 0))
    }

    /// A concurrency limit: its admitted units hold a lease.
    pub(crate) fn is_concurrency(&self) -> bool {
        self.kind == KIND_CONCURRENCY
    }

    /// A metered GCRA limit: its keys may hold debt (see [`Args::ceiling`]).
    pub(crate) fn is_metered(&self) -> bool {
        self.kind == KIND_GCRA && self.ceiling != self.b
    }
}

/// A calendar window's two parameters: the end (Unix seconds) of the window holding this
/// process's clock, and the lengths of that window and the next (`before × 2^22 + after`). The
/// script picks the window holding the server's clock among those ending at `end - before`, `end`
/// and `end + after`, so a server clock a little off still counts in its own window.
fn calendar_args(bounds: crate::calendar::Bounds) -> (u64, u64) {
    let before = (bounds.end - bounds.start).min(CALENDAR_SPLIT - 1);
    let after = (bounds.next_end - bounds.end).min(CALENDAR_SPLIT - 1);
    (bounds.end, before * CALENDAR_SPLIT + after)
}

/// Why `limits` cannot be decided together: every backend's rule ([`check_stack`]), and Redis'.
pub(crate) fn stack_error(limits: &[Limit]) -> Result<(), String> {
    check_stack(limits)?;
    for (i, limit) in limits.iter().enumerate() {
        // Same name and algorithm: the same key, which one call would read twice and write twice.
        if limits[..i]
            .iter()
            .any(|l| l.name() == limit.name() && l.algorithm() == limit.algorithm())
        {
            return Err(format!(
                "policy {:?} appears twice in one stack with algorithm {}: give each its own name",
                limit.name(),
                limit.algorithm()
            ));
        }
    }
    Ok(())
}

/// Whether the Redis backend in `mode` can enforce `limit` (`Backend::validate`).
pub(crate) fn validate(mode: RedisMode, limit: &Limit) -> Result<(), BuildError> {
    metered_error(limit).map_err(BuildError::Invalid)?;
    let name = limit.name();
    // Cell takes CL.THROTTLE, but for a delayed limit (Lua in every mode).
    let cell = Args::new(limit, true).filter(|args| mode == RedisMode::Cell && !args.delayed);
    if cell.is_some() && cell_args(limit).is_none() {
        return Err(BuildError::Invalid(format!(
            "policy {name:?}: CL.THROTTLE cannot express this quota exactly (its period must be a \
             whole number of seconds at the same rate); use mode \"lua\""
        )));
    }
    // Every mode runs the limits script, for peeks, refunds and a penalty's strikes in Cell mode,
    // for what only Lua can enforce in Auto mode: Lua must be able to (the same bounds).
    Spec::of(limit, String::new())
        .map(drop)
        .map_err(BuildError::Invalid)
}

/// Whether the Redis backend can enforce `limits` together (`Backend::validate` of a stack); in a
/// stack the GCRA runs on the limits script, with gcra.lua's bounds ([`Spec::of`]).
pub(crate) fn validate_stack(limits: &[Limit]) -> Result<(), BuildError> {
    stack_error(limits).map_err(BuildError::Invalid)?;
    limits.iter().try_for_each(|l| validate(RedisMode::Lua, l))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quota::Quota;

    fn cell(quota: Quota) -> Option<(u64, u64, u64)> {
        let limit = Limit::new("t", quota).unwrap();
        let args = Args::new(&limit, true).unwrap().cell;
        args.map(|c| (c.max_burst, c.count, c.period_secs))
    }

    #[test]
    fn a_keyed_stack_s_keys_share_the_tag_of_its_first_limit() {
        let user = Limit::new("api.1m.x-user-id", Quota::per_minute(10)).unwrap();
        let org = Limit::with_algorithm(
            "api.1m.x-org-id",
            Algorithm::FixedWindow,
            Quota::per_minute(100),
        )
        .unwrap();
        let tag = user.name();
        assert_eq!(
            keyed_state_key("p", tag, &user, &Key::from("alice")),
            "p:api.1m.x-user-id:{api.1m.x-user-id}:alice"
        );
        // A key cannot open a tag of its own: braces are escaped.
        let org_key = keyed_state_key("p", tag, &org, &Key::from("{acme}"));
        assert!(org_key.starts_with("p:api.1m.x-org-id:{api.1m.x-user-id}:"));
        assert!(org_key.ends_with(":fixed"));
        assert_eq!(org_key.matches('{').count(), 1, "{org_key}");
    }

    /// The empty key has a hash tag too: a stack's keys for it share one Cluster slot.
    #[test]
    fn the_empty_key_s_state_keys_share_a_slot() {
        use crate::backend::redis::conn::cluster_nodes::slot_of;
        let (a, b) = (
            redis_key("p", "a", &Key::from("")),
            redis_key("p", "b", &Key::from("")),
        );
        assert_eq!(a, "p:a:{%}");
        assert_eq!(slot_of(a.as_bytes()), slot_of(b.as_bytes()));
    }

    #[test]
    fn quotas_map_to_whole_second_periods_at_the_same_rate() {
        let ms = Duration::from_millis;
        for (quota, sent) in [
            (Quota::per_second(5), (4, 5, 1)),
            (Quota::cl_throttle(15, 30, ms(60_000)), (15, 30, 60)),
            (Quota::per_period(5, ms(500)), (4, 10, 1)),
            (Quota::per_period(1, ms(1500)), (0, 2, 3)),
            (Quota::per_period(3, ms(700)), (2, 30, 7)),
            (Quota::per_day(1000), (999, 1000, 86_400)),
        ] {
            assert_eq!(cell(quota), Some(sent), "{quota:?}");
        }
        // An interval under a microsecond, or not of whole microseconds under a millisecond, is
        // not CL.THROTTLE's (it would count what remains in whole microseconds), nor a tolerance
        // under 10 ms (it would expire keys up to a millisecond early): Lua takes them, also in
        // Cell mode, which refuses only a quota with no whole-second form.
        for quota in [
            Quota::per_second(2_000_000),
            Quota::per_second(4_000_000),
            Quota::per_second(600_000),
            Quota::per_second(10_000).with_max_burst(4),
            Quota::per_second(1_000).with_max_burst(8),
        ] {
            assert_eq!(cell(quota), None, "{quota:?}");
        }
        assert!(cell(Quota::per_second(1_000_000)).is_some());
        assert!(cell(Quota::per_second(1_000).with_max_burst(9)).is_some());
        assert!(cell(Quota::per_minute(7)).is_some());
        let inexact = Limit::new("t", Quota::per_second(10_000).with_max_burst(4)).unwrap();
        assert!(validate(RedisMode::Cell, &inexact).is_ok());
        let never = Limit::new("t", Quota::per_second(2_000_000)).unwrap();
        assert!(validate(RedisMode::Cell, &never).is_err());
    }
}
