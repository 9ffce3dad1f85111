//! [`Limit`]: a named, validated quota — what a backend is asked to enforce.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use crate::budget::Budget;
use crate::error::BuildError;
use crate::penalty::Penalty;
use crate::quota::{Quota, QuotaError};
use crate::{gcra, window};

/// The algorithm a [`Limit`] is enforced with (see [`window`](crate::window) for a comparison).
///
/// For every algorithm but the GCRA, the limit is the quota's `count` per `period` (or `count` in
/// flight, for [`Concurrency`](Algorithm::Concurrency)) and its `max_burst` is not used.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Algorithm {
    /// The generic cell rate algorithm, exactly as redis-cell's `CL.THROTTLE`: `count` per `period`
    /// at a steady rate, with bursts of `max_burst + 1`. O(1) state per key. `"gcra"` in the
    /// config.
    #[default]
    Gcra,
    /// At most `count` in any window of length `period`, exactly; O(count) state per key.
    /// `"sliding-log"`.
    SlidingLog,
    /// At most `count` per window of `period`, windows aligned on the clock; `"fixed-window"`.
    FixedWindow,
    /// The previous-window weighted estimate of a sliding window; `"sliding-window"`.
    SlidingWindow,
    /// At most `count` requests in flight per key; `"concurrency"`.
    Concurrency,
}

impl Algorithm {
    pub(crate) const ALL: [Algorithm; 5] = [
        Algorithm::Gcra,
        Algorithm::SlidingLog,
        Algorithm::FixedWindow,
        Algorithm::SlidingWindow,
        Algorithm::Concurrency,
    ];

    /// The name used in the TOML configuration.
    pub fn as_str(self) -> &'static str {
        match self {
            Algorithm::Gcra => "gcra",
            Algorithm::SlidingLog => "sliding-log",
            Algorithm::FixedWindow => "fixed-window",
            Algorithm::SlidingWindow => "sliding-window",
            Algorithm::Concurrency => "concurrency",
        }
    }
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Algorithm {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Algorithm::ALL
            .into_iter()
            .find(|a| a.as_str() == s)
            .ok_or_else(|| {
                format!(
                    "unknown algorithm {s:?} (expected \"gcra\", \"sliding-log\", \"fixed-window\", \"sliding-window\" or \"concurrency\")"
                )
            })
    }
}

/// How long a Redis concurrency lease lives unless its request ends first (see
/// [`Limit::with_lease`]).
pub const DEFAULT_LEASE: Duration = Duration::from_secs(60);

/// The shortest lease: renewed every third of it, at most every 10 ms.
const MIN_LEASE: Duration = Duration::from_millis(30);

/// The largest `count` of a [sliding log](Algorithm::SlidingLog) or a
/// [concurrency](Algorithm::Concurrency) limit: their state is one entry per unit (8 bytes in
/// memory, a sorted-set member of about 100 bytes on Redis, where a request's units are also
/// written in one atomic call), so larger counts belong to the sliding window, whose state is two
/// counters.
pub const MAX_UNIT_COUNT: u64 = 10_000;

/// The most limits one stack may hold: one policy's (or one tier's) stacked quotas. Every backend
/// decides a stack in one atomic step (memory: one lock over a fixed array; Redis: one script call
/// on one key's hash slot), so the size is bounded for all of them here, once.
pub const MAX_STACKED_QUOTAS: usize = 16;

/// The rule every stack obeys, whatever the backend (backends add only their own constraints): 1 to
/// [`MAX_STACKED_QUOTAS`] limits, and no concurrency limit, whose slot is given back per limit when
/// the request ends, which a stack has no way to name.
#[cfg_attr(not(any(feature = "memory", feature = "redis")), allow(dead_code))]
pub(crate) fn check_stack(limits: &[Limit]) -> Result<(), String> {
    if limits.is_empty() || limits.len() > MAX_STACKED_QUOTAS {
        return Err(format!(
            "a stack holds 1 to {MAX_STACKED_QUOTAS} limits, not {}",
            limits.len()
        ));
    }
    if let Some(limit) = limits
        .iter()
        .find(|l| l.algorithm() == Algorithm::Concurrency)
    {
        return Err(format!(
            "policy {:?}: a concurrency limit cannot be part of a stack (its slot is given back \
             when the request ends, which a stack has no way to do)",
            limit.name()
        ));
    }
    Ok(())
}

/// The longest a delayed request may be made to wait ([`Limit::with_delay`]).
pub const MAX_DELAY: Duration = Duration::from_secs(3600);

/// A named quota: the policy as a backend sees it (algorithm and quota; the cost comes with each call).
///
/// The name is the namespace of the keys (the "action" of "user U may do action A N times a
/// period"): two limits with different names never share state, two with the same name share it.
/// Names are 1 to 64 characters of `[A-Za-z0-9_.-]`, so they are safe in Redis keys and in
/// `RateLimit-Policy` headers.
///
/// ```
/// use tower_throttle::{Limit, Quota};
///
/// let limit = Limit::new("login", Quota::per_minute(5)).unwrap();
/// assert_eq!(limit.name(), "login");
/// assert!(Limit::new("log in", Quota::per_minute(5)).is_err());
/// assert!(Limit::new("login", Quota::per_minute(0)).is_err());
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limit {
    name: Arc<str>,
    #[cfg_attr(not(feature = "memory"), allow(dead_code))]
    id: u32,
    quota: Quota,
    params: Params,
    penalty: Option<Penalty>,
    /// Whose penalty box strikes and bans count in (a backend that keeps them: Redis): the
    /// policy's, whatever tier or override quota the key is under (`None`: this limit's own).
    penalty_box: Option<Arc<str>>,
    budget: Option<Budget>,
    /// How far past its burst a settled cost may push the key, in units (`None`: one period's
    /// quota).
    max_debt: Option<u64>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Params {
    /// `admit` decides (its tolerance includes the delay, if any); `tolerance` is the quota's own.
    Gcra {
        admit: gcra::GcraParams,
        tolerance: u64,
        delay: Option<Duration>,
    },
    Window(Algorithm, window::WindowParams),
    Concurrency {
        limit: u64,
        lease: Duration,
    },
}

impl Limit {
    /// A GCRA limit called `name`.
    pub fn new(name: impl Into<String>, quota: Quota) -> Result<Self, BuildError> {
        let name = name.into();
        validate_name(&name)?;
        let gcra = quota.validate().map_err(|source| BuildError::Quota {
            policy: name.clone(),
            source,
        })?;
        let params = Params::Gcra {
            admit: gcra,
            tolerance: gcra.tolerance(),
            delay: None,
        };
        Ok(Limit::of(name, quota, params))
    }

    /// A limit of a validated name and parameters, with nothing added.
    fn of(name: String, quota: Quota, params: Params) -> Self {
        Limit {
            id: intern(&name),
            name: name.into(),
            quota,
            params,
            penalty: None,
            penalty_box: None,
            budget: None,
            max_debt: None,
        }
    }

    /// A limit called `name` enforced with `algorithm`. For the GCRA this is [`Limit::new`]; for the
    /// others the limit is `quota.count()` per `quota.period()` (or in flight) and `max_burst` is not
    /// used.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_throttle::{Algorithm, Limit, Quota};
    ///
    /// let limit = Limit::with_algorithm("search", Algorithm::SlidingLog, Quota::per_minute(30)).unwrap();
    /// assert_eq!(limit.max_cost(), 30);
    /// let conn = Limit::with_algorithm("downloads", Algorithm::Concurrency, Quota::per_second(2)).unwrap();
    /// assert_eq!(conn.concurrency(), Some(2));
    /// ```
    pub fn with_algorithm(
        name: impl Into<String>,
        algorithm: Algorithm,
        quota: Quota,
    ) -> Result<Self, BuildError> {
        if algorithm == Algorithm::Gcra {
            return Limit::new(name, quota);
        }
        let name = name.into();
        validate_name(&name)?;
        let error = |source| BuildError::Quota {
            policy: name.clone(),
            source,
        };
        if quota.count() == 0 {
            return Err(error(QuotaError::ZeroCount));
        }
        // Other algorithms ignore the burst, but a burst of nothing is a mistake whatever reads it.
        if quota.empty_burst() {
            return Err(error(QuotaError::ZeroBurst));
        }
        if matches!(algorithm, Algorithm::SlidingLog | Algorithm::Concurrency)
            && quota.count() > MAX_UNIT_COUNT
        {
            return Err(BuildError::Invalid(format!(
                "policy {name:?}: algorithm {:?} keeps one entry per unit, so its count is at most \
                 {MAX_UNIT_COUNT}, not {} (use \"sliding-window\" for larger counts)",
                algorithm.as_str(),
                quota.count()
            )));
        }
        let params = if algorithm == Algorithm::Concurrency {
            Params::Concurrency {
                limit: quota.count(),
                lease: DEFAULT_LEASE,
            }
        } else {
            if quota.period().is_zero() {
                return Err(error(QuotaError::ZeroPeriod));
            }
            let period = u64::try_from(quota.period().as_nanos())
                .ok()
                .filter(|p| *p <= 1 << 62)
                .ok_or_else(|| error(QuotaError::PeriodTooLong(quota.period())))?;
            Params::Window(algorithm, window::WindowParams::new(period, quota.count()))
        };
        Ok(Limit::of(name, quota, params))
    }

    /// Where this fixed window's boundaries fall: on the Unix epoch for every key (the default), or
    /// at a phase of each key's own ([`WindowStart::PerKey`](window::WindowStart::PerKey)), so that
    /// keys refused together do not all come back at one instant. Only for
    /// [`Algorithm::FixedWindow`].
    pub fn with_window_start(mut self, start: window::WindowStart) -> Result<Self, BuildError> {
        match (&mut self.params, start) {
            (_, window::WindowStart::Aligned) => Ok(self),
            (Params::Window(Algorithm::FixedWindow, params), window::WindowStart::PerKey)
                if params.calendar().is_some() =>
            {
                Err(self.invalid(CALENDAR_NOT_PER_KEY))
            }
            (Params::Window(Algorithm::FixedWindow, params), window::WindowStart::PerKey) => {
                *params = params.per_key();
                Ok(self)
            }
            _ => Err(self.invalid(format_args!(
                "window_start = \"per-key\" is for the fixed window, not {}",
                self.algorithm()
            ))),
        }
    }

    /// A fixed window cut on the calendar of a time zone — days, ISO weeks, months (from an
    /// anchor day) — instead of on multiples of the period since the Unix epoch: "10,000 a
    /// calendar month, reset at midnight in Paris on the 15th". `Retry-After` and the reset point
    /// at the exact next boundary, across DST changes and month ends. Only for
    /// [`Algorithm::FixedWindow`] whose quota's period is the calendar's
    /// [`nominal`](window::CalendarPeriod::nominal) one, with aligned windows; an unknown time zone
    /// or an anchor day outside 1..=31 (or for a day or week) is an error too, as is a build
    /// without the feature `calendar`.
    ///
    /// ```
    /// use tower_throttle::window::{CalendarPeriod, CalendarWindow};
    /// use tower_throttle::{Algorithm, Limit, Quota};
    ///
    /// let monthly = Quota::per_period(10_000, CalendarPeriod::Month.nominal());
    /// let billing = CalendarWindow::month().timezone("Europe/Paris").anchor_day(15);
    /// let limit = Limit::with_algorithm("api", Algorithm::FixedWindow, monthly)
    ///     .unwrap()
    ///     .with_calendar(billing.clone())
    ///     .unwrap();
    /// assert_eq!(limit.calendar(), Some(&billing));
    ///
    /// let gcra = Limit::new("api", monthly).unwrap();
    /// assert!(gcra.with_calendar(billing).is_err());
    /// ```
    pub fn with_calendar(mut self, calendar: window::CalendarWindow) -> Result<Self, BuildError> {
        let period = self.quota.period();
        match &mut self.params {
            Params::Window(Algorithm::FixedWindow, p) if p.is_per_key() => {
                Err(self.invalid(CALENDAR_NOT_PER_KEY))
            }
            Params::Window(Algorithm::FixedWindow, params) => {
                match crate::calendar::Calendar::of(&calendar, period) {
                    Ok(compiled) => *params = params.on_calendar(compiled),
                    Err(why) => return Err(self.invalid(why)),
                }
                Ok(self)
            }
            _ => Err(self.invalid(format_args!(
                "calendar windows are fixed windows (algorithm \"fixed-window\"), not {}",
                self.algorithm()
            ))),
        }
    }

    /// The calendar a fixed window's boundaries follow, if any ([`Limit::with_calendar`]).
    pub fn calendar(&self) -> Option<&window::CalendarWindow> {
        self.window()?.calendar().map(|c| c.window())
    }

    /// How far the clock moves for `key`'s windows under this limit (see
    /// [`window::WindowParams`]): 0 unless each key's fixed window starts at its own phase.
    #[cfg_attr(not(any(feature = "memory", feature = "redis")), allow(dead_code))]
    pub(crate) fn window_shift(&self, key: &crate::key::Key) -> u64 {
        match &self.params {
            Params::Window(Algorithm::FixedWindow, params) => params.shift_of(key),
            _ => 0,
        }
    }

    /// nginx's `burst` with `delay`: a GCRA request beyond the quota's burst waits up to
    /// `max_delay` for its turn instead of being rejected (the middleware sleeps, without blocking
    /// a thread); beyond that it is rejected. The slot is taken when the request is admitted, so
    /// waiting never takes it twice. Only for [`Algorithm::Gcra`]; `max_delay` is at most an hour.
    pub fn with_delay(mut self, max_delay: Duration) -> Result<Self, BuildError> {
        if max_delay.is_zero() || max_delay > MAX_DELAY {
            return Err(self.invalid("max_delay must be more than 0 and at most 1 hour"));
        }
        let Params::Gcra {
            admit, tolerance, ..
        } = self.params
        else {
            return Err(self.invalid(format_args!(
                "max_delay (mode = \"delay\") needs algorithm \"gcra\", not {:?}",
                self.algorithm().as_str()
            )));
        };
        let extra = max_delay.as_nanos() as u64;
        let admit =
            gcra::GcraParams::new(admit.emission_interval(), tolerance + extra, admit.limit());
        self.params = Params::Gcra {
            admit,
            tolerance,
            delay: Some(max_delay),
        };
        Ok(self)
    }

    /// The longest a request may wait for its turn, if the limit delays instead of rejecting.
    pub fn delay(&self) -> Option<Duration> {
        match self.params {
            Params::Gcra { delay, .. } => delay,
            _ => None,
        }
    }

    /// For a delaying limit, how long an admitted request must wait before it proceeds, from its
    /// decision's `reset_after` (how far the key's TAT lies ahead): the part beyond the quota's own
    /// tolerance.
    pub fn delay_for(&self, decision: &crate::decision::Decision) -> Duration {
        match self.params {
            Params::Gcra {
                tolerance,
                delay: Some(_),
                ..
            } if decision.allowed => decision
                .reset_after
                .saturating_sub(Duration::from_nanos(tolerance)),
            _ => Duration::ZERO,
        }
    }

    /// How long a Redis concurrency lease lives if its process dies before releasing it (default 60
    /// s, [`DEFAULT_LEASE`]). A live process renews the leases of its requests in flight every
    /// third of this, so a shorter lease frees a dead process's slots sooner, at the cost of more
    /// renewals. At least 30 ms (renewed at most every 10 ms), at most a day. Only for
    /// [`Algorithm::Concurrency`].
    pub fn with_lease(mut self, lease: Duration) -> Result<Self, BuildError> {
        let most = MAX_DELAY * 24;
        match &mut self.params {
            Params::Concurrency { lease: l, .. } if (MIN_LEASE..=most).contains(&lease) => {
                *l = lease;
                Ok(self)
            }
            Params::Concurrency { .. } => {
                Err(self.invalid("lease must be at least 30 ms and at most 1 day"))
            }
            _ => Err(self.invalid("a lease is only for algorithm \"concurrency\"")),
        }
    }

    /// The window parameters, for [`Algorithm::SlidingLog`], [`Algorithm::FixedWindow`] and
    /// [`Algorithm::SlidingWindow`].
    pub fn window(&self) -> Option<&window::WindowParams> {
        match &self.params {
            Params::Window(_, p) => Some(p),
            _ => None,
        }
    }

    /// The most requests in flight, for [`Algorithm::Concurrency`].
    pub fn concurrency(&self) -> Option<u64> {
        match self.params {
            Params::Concurrency { limit, .. } => Some(limit),
            _ => None,
        }
    }

    /// The lease of a Redis concurrency slot, for [`Algorithm::Concurrency`].
    pub fn lease(&self) -> Option<Duration> {
        match self.params {
            Params::Concurrency { lease, .. } => Some(lease),
            _ => None,
        }
    }

    /// With a [`Penalty`]: keys limited often enough are banned for a while.
    pub fn with_penalty(mut self, penalty: Penalty) -> Self {
        self.penalty = Some(penalty);
        self
    }

    /// The penalty, if any.
    pub fn penalty(&self) -> Option<&Penalty> {
        self.penalty.as_ref()
    }

    /// Its penalty counted in the box named `name` (its policy's), not its own.
    pub(crate) fn in_penalty_box(mut self, name: &str) -> Self {
        self.penalty_box = Some(name.into());
        self
    }

    /// The name of the penalty box its strikes and bans count in.
    pub(crate) fn penalty_box(&self) -> &str {
        self.penalty_box.as_deref().unwrap_or(&self.name)
    }

    /// This limit with no penalty: what a request whose refusal is not enforced is asked under,
    /// so that a backend that keeps penalties does not strike it.
    pub(crate) fn without_penalty(&self) -> Self {
        Limit {
            penalty: None,
            ..self.clone()
        }
    }

    /// With a leased [`Budget`]: on Redis, a process takes slices of a hot key's budget and admits
    /// from them locally. Only for the GCRA without a [penalty](Self::with_penalty) (every
    /// rejection must reach Redis as a strike) or a [delay](Self::with_delay) (a slice admits now
    /// or not at all); the budget's settings are checked too.
    ///
    /// ```
    /// use tower_throttle::{policy::Budget, Algorithm, Limit, Quota};
    ///
    /// let hot = Limit::new("api", Quota::per_second(1000)).unwrap().with_budget(Budget::new()).unwrap();
    /// assert!(hot.budget().is_some());
    /// let log = Limit::with_algorithm("log", Algorithm::SlidingLog, Quota::per_second(5)).unwrap();
    /// assert!(log.with_budget(Budget::new()).is_err());
    /// ```
    pub fn with_budget(mut self, budget: Budget) -> Result<Self, BuildError> {
        budget.validate().map_err(|e| self.invalid(e))?;
        self.budget = Some(budget);
        self.budget_error()
            .map_or(Ok(self), |why| Err(BuildError::Invalid(why)))
    }

    /// The leased budget, if any.
    pub fn budget(&self) -> Option<&Budget> {
        self.budget.as_ref()
    }

    /// Why this limit cannot lease budgets, if it cannot (a penalty added after the budget is
    /// caught here too, when a backend validates the limit).
    pub(crate) fn budget_error(&self) -> Option<String> {
        let why = match self.params {
            Params::Gcra { delay: Some(_), .. } => {
                "a leased budget cannot delay requests (a slice admits now or not at all)"
            }
            Params::Gcra { .. } if self.penalty.is_some() => {
                "a leased budget cannot go with a penalty (every rejection must reach Redis as a strike)"
            }
            Params::Gcra { .. } => return None,
            _ => "a leased budget is only for algorithm \"gcra\"",
        };
        Some(format!("policy {:?}: {why}", self.name()))
    }

    /// With a cap on debt: a cost settled after the response
    /// ([`Adjustment::Settle`](crate::backend::Adjustment::Settle)) may push the key at most
    /// `units` past its burst, so one runaway request cannot lock a key out for days. The default
    /// is one period's quota (`quota.count()`); 0 forgets any debt, as Gubernator's
    /// `DRAIN_OVER_LIMIT` does.
    ///
    /// ```
    /// use tower_throttle::{Limit, Quota};
    ///
    /// let tokens = Limit::new("tokens", Quota::per_minute(100_000)).unwrap();
    /// assert_eq!(tokens.max_debt(), 100_000);
    /// assert_eq!(tokens.with_max_debt(5_000).max_debt(), 5_000);
    /// ```
    ///
    /// Setting it makes the limit metered: its decisions read a key's debt as debt (refused until
    /// paid back) instead of as a TAT written under another quota (see [`gcra::decide`]).
    /// [`PolicyBuilder::metered`](crate::PolicyBuilder::metered) sets it to the default if you
    /// have not.
    pub fn with_max_debt(mut self, units: u64) -> Self {
        self.max_debt = Some(units);
        if let Params::Gcra { admit, .. } = &mut self.params {
            *admit = admit.with_debt(units);
        }
        self
    }

    /// Whether the limit is metered: it may carry debt ([`with_max_debt`](Self::with_max_debt)).
    pub fn is_metered(&self) -> bool {
        self.max_debt.is_some()
    }

    /// How many units past its burst a settled cost may push a key (see
    /// [`with_max_debt`](Self::with_max_debt)).
    pub fn max_debt(&self) -> u64 {
        self.max_debt.unwrap_or_else(|| self.quota.count())
    }

    /// The name (namespace) of the limit.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// A number unique to the name within this process.
    #[cfg_attr(not(feature = "memory"), allow(dead_code))]
    pub(crate) fn id(&self) -> u32 {
        self.id
    }

    /// The algorithm.
    pub fn algorithm(&self) -> Algorithm {
        match self.params {
            Params::Gcra { .. } => Algorithm::Gcra,
            Params::Window(algorithm, _) => algorithm,
            Params::Concurrency { .. } => Algorithm::Concurrency,
        }
    }

    /// The most units one request may cost and still be admitted some time (for the GCRA, the
    /// limit `max_burst + 1`).
    pub fn max_cost(&self) -> u64 {
        match self.params {
            Params::Gcra { admit, .. } => admit.limit(),
            Params::Window(_, p) => p.limit(),
            Params::Concurrency { limit, .. } => limit,
        }
    }

    /// The quota.
    pub fn quota(&self) -> &Quota {
        &self.quota
    }

    /// The GCRA parameters a backend decides with, when the algorithm is [`Algorithm::Gcra`]. With
    /// a [delay](Limit::with_delay) their tolerance includes the delay.
    pub fn gcra(&self) -> Option<&gcra::GcraParams> {
        match &self.params {
            Params::Gcra { admit, .. } => Some(admit),
            _ => None,
        }
    }

    /// Whether `other` decides exactly as this limit does (the name aside): same quota, algorithm,
    /// delay, lease and penalty. Limits that share a name share state, so they must.
    pub fn same_rules(&self, other: &Limit) -> bool {
        self.quota == other.quota
            && self.algorithm() == other.algorithm()
            && self.window() == other.window()
            && self.delay() == other.delay()
            && self.lease() == other.lease()
            && self.penalty == other.penalty
            && self.max_debt == other.max_debt
    }

    /// An error of a setting this limit cannot take: `policy "name": why`.
    fn invalid(&self, why: impl fmt::Display) -> BuildError {
        BuildError::Invalid(format!("policy {:?}: {why}", self.name))
    }

    /// The quota's own GCRA tolerance in nanoseconds (without a delay), for the GCRA.
    pub(crate) fn tolerance(&self) -> Option<u64> {
        match self.params {
            Params::Gcra { tolerance, .. } => Some(tolerance),
            _ => None,
        }
    }

    /// Delay mode: what is left of the quota's own tolerance, not the delay's, when the key's
    /// state ends `reset_after` from now (at most `limit`); `remaining` as the backend reckoned it
    /// for any other limit. What the fields and a peek show.
    pub(crate) fn remaining_in_quota(
        &self,
        reset_after: Duration,
        remaining: u64,
        limit: u64,
    ) -> u64 {
        match (self.delay(), self.tolerance(), self.gcra()) {
            (Some(_), Some(tolerance), Some(gcra)) => {
                let ahead = u64::try_from(reset_after.as_nanos()).unwrap_or(u64::MAX);
                (tolerance.saturating_sub(ahead) / gcra.emission_interval()).min(limit)
            }
            _ => remaining,
        }
    }
}

/// Why a calendar window cannot start per key (asked for either way round).
const CALENDAR_NOT_PER_KEY: &str = "a calendar window starts at the calendar's boundaries for \
                                    every key, so it cannot also have window_start = \"per-key\"";

/// The name under which an operator's override quotas of policy `policy` keep their keys' state:
/// `<policy>.override`; for a policy name too long for that, its start and a hash of the whole
/// (stable across processes), never the policy's own name, whose state it would share.
pub(crate) fn override_state_name(policy: &str) -> String {
    let own = format!("{policy}.override");
    if own.len() <= 64 {
        return own;
    }
    // FNV-1a: the same in every process and release.
    let hash = (policy.bytes()).fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    // Names are ASCII (`validate_name`): any cut is a character boundary.
    let start = policy.get(..46).unwrap_or(policy);
    format!("{start}-{:08x}.override", hash as u32)
}

pub(crate) fn validate_name(name: &str) -> Result<(), BuildError> {
    let reason = if name.is_empty() {
        "is empty"
    } else if name.len() > 64 {
        "is longer than 64 characters"
    } else if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b))
    {
        "may only contain ASCII letters, digits, '_', '.' and '-'"
    } else {
        return Ok(());
    };
    Err(BuildError::InvalidName {
        name: name.to_owned(),
        reason,
    })
}

/// Gives each distinct name a small number, so the memory backend keys its map by a `u32` instead
/// of hashing and storing the name with every key. Names come from configuration, so the table
/// stays small.
fn intern(name: &str) -> u32 {
    static NAMES: OnceLock<Mutex<HashMap<String, u32>>> = OnceLock::new();
    let mut names = NAMES
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    // Past u32::MAX distinct names (never, for names from configuration) ids would be shared, which
    // only merges state in the memory backend; it cannot panic.
    let next = names.len() as u32;
    *names.entry(name.to_owned()).or_insert(next)
}

#[cfg(test)]
mod tests;
