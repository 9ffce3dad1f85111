//! [`Quota`]: how many requests a key may make, with `CL.THROTTLE`'s parameters.

use std::fmt;
use std::time::Duration;

/// The largest tolerance (`emission interval × (max_burst + 1)`) a quota may have, in nanoseconds.
///
/// 2^62 ns is about 146 years. The bound leaves headroom so that `now + tolerance` never overflows a
/// 64-bit nanosecond clock, including a Unix-epoch clock such as Redis' `TIME`.
const MAX_TOLERANCE_NANOS: u64 = 1 << 62;

/// How many requests a key may make: `count` per `period`, with bursts of up to `max_burst + 1`.
///
/// The parameters are exactly those of redis-cell's `CL.THROTTLE key max_burst count period`:
///
/// * the **emission interval** `T = period / count` is the steady spacing between requests;
/// * the **limit** is `max_burst + 1`: how many requests a fresh key may make at once;
/// * a key that stops sending refills one request every `T`, up to the limit.
///
/// The constructors say what they mean and default `max_burst` to `count - 1`, so that
/// `Quota::per_second(5)` admits five requests at once and then five a second:
///
/// ```
/// use std::time::Duration;
/// use tower_throttle::Quota;
///
/// let q = Quota::per_second(5);
/// assert_eq!((q.count(), q.period(), q.limit()), (5, Duration::from_secs(1), 5));
///
/// // The Quick start's route: bursts of 16, then 30 a minute (one every 2 s).
/// let q = Quota::per_minute(30).bursts_of(16);
/// assert_eq!(q.limit(), 16);
/// assert_eq!(q.emission_interval().unwrap(), Duration::from_secs(2));
/// // The same quota in CL.THROTTLE's terms: max_burst = 15.
/// assert_eq!(q, Quota::per_minute(30).with_max_burst(15));
///
/// // Invalid quotas are errors when a layer is built, naming the field:
/// assert_eq!(Quota::per_second(0).validate().unwrap_err().to_string(), "quota count must be at least 1");
/// ```
///
/// Constructing a `Quota` never fails; [`Quota::validate`] (which every builder of this crate calls)
/// rejects zero counts, zero periods, overflow and rates finer than one nanosecond. High rates are exact:
/// `Quota::per_second(100_000)` has an emission interval of exactly 10 µs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Quota {
    max_burst: u64,
    count: u64,
    period: Duration,
    /// Set by `bursts_of(0)`, which no `max_burst` can express: [`Quota::validate`] refuses it.
    empty_burst: bool,
}

impl Quota {
    /// `count` requests per `period`, with `max_burst` = `count - 1` (a limit of `count`).
    pub const fn per_period(count: u64, period: Duration) -> Self {
        Self::cl_throttle(count.saturating_sub(1), count, period)
    }

    /// `CL.THROTTLE key max_burst count period`'s three parameters, in that order.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use tower_throttle::Quota;
    /// // CL.THROTTLE user123 15 30 60
    /// let q = Quota::cl_throttle(15, 30, Duration::from_secs(60));
    /// assert_eq!(q, Quota::per_minute(30).with_max_burst(15));
    /// ```
    pub const fn cl_throttle(max_burst: u64, count: u64, period: Duration) -> Self {
        Quota {
            max_burst,
            count,
            period,
            empty_burst: false,
        }
    }

    /// `count` requests a second.
    pub const fn per_second(count: u64) -> Self {
        Self::per_period(count, Duration::from_secs(1))
    }

    /// `count` requests a minute.
    pub const fn per_minute(count: u64) -> Self {
        Self::per_period(count, Duration::from_secs(60))
    }

    /// `count` requests an hour.
    pub const fn per_hour(count: u64) -> Self {
        Self::per_period(count, Duration::from_secs(3600))
    }

    /// `count` requests a day.
    pub const fn per_day(count: u64) -> Self {
        Self::per_period(count, Duration::from_secs(86_400))
    }

    /// Lets a fresh key make `size` requests at once ("bursts of `size`"), then `count` per `period`.
    ///
    /// The same quota as [`with_max_burst(size - 1)`](Self::with_max_burst), said the way people
    /// say it: `CL.THROTTLE`'s `max_burst` counts the requests *beyond the first*, so "bursts of 20"
    /// is `max_burst` 19. A size of 0 would admit nothing: [`validate`](Self::validate) (so every
    /// builder) refuses it.
    ///
    /// ```
    /// use tower_throttle::Quota;
    ///
    /// // 30 a minute, bursts of 20: twenty requests at once, then one every 2 s.
    /// let q = Quota::per_minute(30).bursts_of(20);
    /// assert_eq!((q.limit(), q.max_burst()), (20, 19));
    /// assert_eq!(q, Quota::per_minute(30).with_max_burst(19));
    /// assert_eq!(
    ///     Quota::per_minute(30).bursts_of(0).validate().unwrap_err().to_string(),
    ///     "quota burst size (bursts_of) must be at least 1",
    /// );
    /// ```
    #[must_use]
    pub const fn bursts_of(self, size: u64) -> Self {
        match size.checked_sub(1) {
            Some(max_burst) => self.with_max_burst(max_burst),
            None => Quota {
                max_burst: 0,
                empty_burst: true,
                ..self
            },
        }
    }

    /// Replaces `CL.THROTTLE`'s `max_burst`: a fresh key may then make `max_burst + 1` requests at
    /// once. [`bursts_of`](Self::bursts_of) says the same with the burst's size:
    /// `with_max_burst(19)` is `bursts_of(20)`.
    #[must_use]
    pub const fn with_max_burst(self, max_burst: u64) -> Self {
        Quota {
            max_burst,
            empty_burst: false,
            ..self
        }
    }

    /// `CL.THROTTLE`'s `max_burst`.
    pub const fn max_burst(&self) -> u64 {
        self.max_burst
    }

    /// Requests per [`period`](Self::period).
    pub const fn count(&self) -> u64 {
        self.count
    }

    /// The period over which [`count`](Self::count) requests are allowed.
    pub const fn period(&self) -> Duration {
        self.period
    }

    /// `max_burst + 1`: the most requests a key can make at once (saturating at `u64::MAX`).
    pub const fn limit(&self) -> u64 {
        self.max_burst.saturating_add(1)
    }

    /// `period / count`, truncated to whole nanoseconds as `CL.THROTTLE` does.
    pub fn emission_interval(&self) -> Result<Duration, QuotaError> {
        self.validate()
            .map(|p| Duration::from_nanos(p.emission_interval()))
    }

    pub(crate) const fn empty_burst(&self) -> bool {
        self.empty_burst
    }

    /// Checks the quota and derives the GCRA parameters (in nanoseconds).
    pub fn validate(&self) -> Result<crate::gcra::GcraParams, QuotaError> {
        if self.count == 0 {
            return Err(QuotaError::ZeroCount);
        }
        if self.period.is_zero() {
            return Err(QuotaError::ZeroPeriod);
        }
        if self.empty_burst {
            return Err(QuotaError::ZeroBurst);
        }
        let period = u64::try_from(self.period.as_nanos())
            .ok()
            .filter(|p| *p <= MAX_TOLERANCE_NANOS)
            .ok_or(QuotaError::PeriodTooLong(self.period))?;
        let emission_interval = period / self.count;
        // The interval is truncated to whole nanoseconds (as CL.THROTTLE does), which speeds the rate
        // up by remainder / (interval × count). Refuse quotas where that exceeds 0.1 %: a quota of
        // 600,000,000 a second would otherwise silently become 1,000,000,000 a second.
        let truncation = u128::from(period % self.count) * 1000;
        if emission_interval == 0
            || truncation > u128::from(emission_interval) * u128::from(self.count)
        {
            return Err(QuotaError::RateTooFine {
                count: self.count,
                period: self.period,
            });
        }
        let tolerance = self
            .max_burst
            .checked_add(1)
            .and_then(|limit| emission_interval.checked_mul(limit))
            .filter(|t| *t <= MAX_TOLERANCE_NANOS)
            .ok_or(QuotaError::BurstTooLarge {
                max_burst: self.max_burst,
            })?;
        Ok(crate::gcra::GcraParams::new(
            emission_interval,
            tolerance,
            self.max_burst + 1,
        ))
    }
}

impl fmt::Display for Quota {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.empty_burst {
            return write!(f, "{} per {:?} (bursts of 0)", self.count, self.period);
        }
        write!(
            f,
            "{} per {:?} (max_burst {})",
            self.count, self.period, self.max_burst
        )
    }
}

/// Why a [`Quota`] is invalid. The message names the offending field.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum QuotaError {
    /// `count` is zero (`CL.THROTTLE` 0.2.2 crashes Redis on it).
    ZeroCount,
    /// `period` is zero.
    ZeroPeriod,
    /// [`Quota::bursts_of`] was given 0, which would admit nothing.
    ZeroBurst,
    /// `period` is longer than about 146 years.
    PeriodTooLong(Duration),
    /// `period / count` is less than one nanosecond, or so few nanoseconds that truncating it to a
    /// whole number would raise the rate by more than 0.1 %.
    RateTooFine {
        /// The count.
        count: u64,
        /// The period.
        period: Duration,
    },
    /// `emission interval × (max_burst + 1)` overflows (more than about 146 years).
    BurstTooLarge {
        /// The max_burst.
        max_burst: u64,
    },
}

impl fmt::Display for QuotaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            QuotaError::ZeroCount => f.write_str("quota count must be at least 1"),
            QuotaError::ZeroPeriod => f.write_str("quota period must be longer than zero"),
            QuotaError::ZeroBurst => f.write_str("quota burst size (bursts_of) must be at least 1"),
            QuotaError::PeriodTooLong(p) => {
                write!(f, "quota period {p:?} is too long (at most about 146 years)")
            }
            QuotaError::RateTooFine { count, period } => write!(
                f,
                "quota count {count} per period {period:?} is finer than the clock can represent (the interval between requests, {period:?} / {count}, must be a whole number of nanoseconds to within 0.1 %)"
            ),
            QuotaError::BurstTooLarge { max_burst } => write!(
                f,
                "quota max_burst {max_burst} is too large (emission interval × (max_burst + 1) overflows)"
            ),
        }
    }
}

impl std::error::Error for QuotaError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constructors_say_what_they_mean() {
        let q = Quota::per_second(5);
        assert_eq!((q.count(), q.limit()), (5, 5));
        let secs = Duration::from_secs;
        for (q, interval) in [
            (q, Duration::from_millis(200)),
            (Quota::per_minute(6), secs(10)),
            (Quota::per_hour(6), secs(600)),
            (Quota::per_day(24), secs(3600)),
            (Quota::per_period(6, secs(120)), secs(20)),
        ] {
            assert_eq!(q.emission_interval().unwrap(), interval, "{q}");
        }
    }

    #[test]
    fn bursts_of_n_is_max_burst_n_minus_one() {
        for size in [1, 2, 16, 20, 1_000, u64::MAX] {
            let by_size = Quota::per_minute(30).bursts_of(size);
            let by_max_burst = Quota::per_minute(30).with_max_burst(size - 1);
            assert_eq!(by_size, by_max_burst, "bursts_of({size})");
            assert_eq!(by_size.limit(), size);
            assert_eq!(by_size.validate(), by_max_burst.validate());
        }
        // The same GCRA parameters: a fresh key gets exactly `size` requests at once.
        let params = Quota::per_second(10).bursts_of(20).validate().unwrap();
        assert_eq!(
            params,
            Quota::cl_throttle(19, 10, Duration::from_secs(1))
                .validate()
                .unwrap()
        );
        // The last word wins, whichever spelling it uses.
        let one = Quota::per_second(1);
        let (five, none) = (one.bursts_of(5), one.bursts_of(0));
        assert_eq!(none.with_max_burst(4), five);
        assert_eq!(none.bursts_of(5), five);
        assert!(none.bursts_of(5).validate().is_ok());
        assert_eq!(one.with_max_burst(4).bursts_of(0), none);
        assert_eq!(none.validate(), Err(QuotaError::ZeroBurst));
        assert_eq!(
            one.with_max_burst(4).bursts_of(0).validate(),
            Err(QuotaError::ZeroBurst)
        );
        // Every algorithm refuses it, not only the GCRA that reads the burst.
        for algorithm in [
            crate::limit::Algorithm::FixedWindow,
            crate::limit::Algorithm::SlidingWindow,
            crate::limit::Algorithm::SlidingLog,
            crate::limit::Algorithm::Concurrency,
        ] {
            let quota = Quota::per_second(1).bursts_of(0);
            let err = crate::limit::Limit::with_algorithm("w", algorithm, quota).unwrap_err();
            assert!(err.to_string().contains("bursts_of"), "{algorithm}: {err}");
        }
    }

    #[test]
    fn high_rates_are_exact() {
        // (3 a second: 333,333,333 ns, off by 1 ns in 10^9: accepted, as CL.THROTTLE does.)
        for (count, interval) in [
            (100_000, Duration::from_micros(10)),
            (1_000_000_000, Duration::from_nanos(1)),
            (3, Duration::from_nanos(333_333_333)),
        ] {
            let q = Quota::per_second(count);
            assert_eq!(q.emission_interval().unwrap(), interval, "{q}");
        }
        // Ordinary quotas whose interval is rounded: accepted.
        for q in [
            Quota::per_second(600),
            Quota::per_minute(7_000),
            Quota::per_hour(7),
            Quota::per_day(7),
        ] {
            assert!(q.validate().is_ok(), "{q}");
        }
        // The 0.1 % bound, exactly: 1000 per 999,999 ns truncates 999 ns of 999,000 (accepted);
        // 1000 per 998,999 ns truncates 999 ns of 998,000 (refused).
        assert!(Quota::per_period(1000, Duration::from_nanos(999_999))
            .validate()
            .is_ok());
        assert!(matches!(
            Quota::per_period(1000, Duration::from_nanos(998_999)).validate(),
            Err(QuotaError::RateTooFine { count: 1000, .. })
        ));
    }

    #[test]
    fn invalid_quotas_name_the_field() {
        let cases = [
            (Quota::per_second(0), "count"),
            (Quota::per_period(1, Duration::ZERO), "period"),
            (Quota::per_second(1_000_000_001), "count"),
            (Quota::per_second(600_000_000), "count"),
            (
                Quota::per_period(1, Duration::from_secs(u64::MAX)),
                "period",
            ),
            (Quota::per_second(1).with_max_burst(u64::MAX), "max_burst"),
            (Quota::per_second(1).bursts_of(0), "bursts_of"),
            (Quota::per_day(1).with_max_burst(1_000_000_000), "max_burst"),
        ];
        for (q, field) in cases {
            let msg = q.validate().unwrap_err().to_string();
            assert!(msg.contains(field), "{q}: {msg:?} should name {field}");
        }
    }

    #[test]
    fn a_quota_displays_its_count_period_and_burst() {
        // A bursts_of(0) quota says so: it admits nothing, and validation refuses it.
        let m30 = Quota::per_minute(30);
        assert_eq!(m30.to_string(), "30 per 60s (max_burst 29)");
        assert_eq!(m30.bursts_of(0).to_string(), "30 per 60s (bursts of 0)");
        let s5 = Quota::per_second(5).with_max_burst(2);
        assert_eq!(s5.to_string(), "5 per 1s (max_burst 2)");
    }
}
