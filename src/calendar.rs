//! Calendar windows: fixed windows cut on the civil calendar of a time zone — a day, an ISO week
//! (Monday to Sunday) or a month, from an anchor day for billing cycles — instead of on multiples
//! of a period since the Unix epoch.
//!
//! A boundary is the first instant of a civil date in the zone (midnight, or the end of a DST gap
//! that swallows midnight), computed by `jiff` with its bundled time zone database (feature
//! `calendar`), so every process of a build agrees, with or without `/usr/share/zoneinfo`. Windows
//! are uneven: a day is 23, 24 or 25 hours long, a month 28 to 31 days.
//!
//! What a backend needs is [`Bounds`]: the start of the window holding an instant, its end and the
//! end of the window after it (Unix seconds: every boundary is a whole second). A window is named by
//! its end. The memory backend asks for the bounds at its own clock; the Redis backend at the app
//! server's clock, and sends all three with the call, so that the script, which knows no time
//! zones, picks the window holding the server's clock (see [`Bounds::window_at`], which limits.lua
//! repeats). Computing them takes a few time zone look-ups, so each calendar keeps the last bounds
//! it computed and recomputes only when an instant falls outside them: once per window.

use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use arc_swap::ArcSwap;

/// The length of a calendar window, as the civil calendar counts it
/// ([`CalendarWindow`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum CalendarPeriod {
    /// From midnight to midnight (23 or 25 hours across a DST change): `"day"` in the config.
    Day,
    /// An ISO week, from Monday's midnight to the next Monday's: `"week"`.
    Week,
    /// From the anchor day of one month to the anchor day of the next (the 1st by default):
    /// `"month"`.
    Month,
}

impl CalendarPeriod {
    /// The name used in the TOML configuration (`calendar = "month"`).
    pub fn as_str(self) -> &'static str {
        match self {
            CalendarPeriod::Day => "day",
            CalendarPeriod::Week => "week",
            CalendarPeriod::Month => "month",
        }
    }

    /// The quota period that stands for this calendar period, which a policy's quota must have
    /// (or, in the config, may leave out): 1 day, 7 days, or for a month 30.44 days (what the
    /// config's `period = "1month"` means). It is what `RateLimit-Policy`'s `w`
    /// reports; the windows themselves follow the calendar.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_throttle::window::CalendarPeriod;
    ///
    /// assert_eq!(CalendarPeriod::Day.nominal(), Duration::from_secs(86_400));
    /// assert_eq!(CalendarPeriod::Month.nominal(), Duration::from_secs(2_630_016));
    /// ```
    pub const fn nominal(self) -> Duration {
        match self {
            CalendarPeriod::Day => Duration::from_secs(86_400),
            CalendarPeriod::Week => Duration::from_secs(7 * 86_400),
            CalendarPeriod::Month => Duration::from_secs(2_630_016),
        }
    }
}

impl std::str::FromStr for CalendarPeriod {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        [
            CalendarPeriod::Day,
            CalendarPeriod::Week,
            CalendarPeriod::Month,
        ]
        .into_iter()
        .find(|p| p.as_str() == s)
        .ok_or_else(|| format!("calendar {s:?} is not one of \"day\", \"week\", \"month\""))
    }
}

/// A fixed window on the calendar of a time zone
/// ([`PolicyBuilder::calendar`](crate::PolicyBuilder::calendar),
/// [`Limit::with_calendar`](crate::Limit::with_calendar)): "10,000 requests per calendar month,
/// reset at midnight Europe/Paris on the 15th". What it says is checked when the policy is built:
/// an unknown time zone, or an anchor day outside 1..=31 or on a day or week, is an error then.
///
/// ```
/// use tower_throttle::window::{CalendarPeriod, CalendarWindow};
///
/// let billing = CalendarWindow::month().timezone("Europe/Paris").anchor_day(15);
/// assert_eq!(billing.period(), CalendarPeriod::Month);
/// assert_eq!(billing.zone(), "Europe/Paris");
/// assert_eq!(billing.anchor(), Some(15));
/// assert_eq!(CalendarWindow::day().zone(), "UTC");
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct CalendarWindow {
    period: CalendarPeriod,
    timezone: String,
    anchor_day: Option<u8>,
}

impl CalendarWindow {
    /// Windows of `period`, in UTC, months from the 1st.
    pub fn new(period: CalendarPeriod) -> Self {
        CalendarWindow {
            period,
            timezone: "UTC".to_owned(),
            anchor_day: None,
        }
    }

    /// Calendar days.
    pub fn day() -> Self {
        Self::new(CalendarPeriod::Day)
    }

    /// ISO weeks (from Monday).
    pub fn week() -> Self {
        Self::new(CalendarPeriod::Week)
    }

    /// Calendar months.
    pub fn month() -> Self {
        Self::new(CalendarPeriod::Month)
    }

    /// The time zone whose midnights cut the windows: an IANA name such as `"Europe/Paris"`
    /// (default `"UTC"`).
    pub fn timezone(mut self, name: impl Into<String>) -> Self {
        self.timezone = name.into();
        self
    }

    /// For months: the day each window starts on, 1 to 31 (a billing day); in a month without
    /// that day, the month's last day (the 31st is April's 30th and February's 28th or 29th).
    pub fn anchor_day(mut self, day: u8) -> Self {
        self.anchor_day = Some(day);
        self
    }

    /// The calendar period.
    pub fn period(&self) -> CalendarPeriod {
        self.period
    }

    /// The time zone's name.
    pub fn zone(&self) -> &str {
        &self.timezone
    }

    /// The anchor day, if one was given.
    pub fn anchor(&self) -> Option<u8> {
        self.anchor_day
    }

    fn check(&self, period: Duration) -> Result<(), String> {
        match (self.period, self.anchor_day) {
            (CalendarPeriod::Month, Some(day)) if !(1..=31).contains(&day) => {
                return Err(format!("anchor_day must be 1 to 31, not {day}"));
            }
            (CalendarPeriod::Day | CalendarPeriod::Week, Some(_)) => {
                return Err(format!(
                    "anchor_day is for calendar = \"month\", not {:?}",
                    self.period.as_str()
                ));
            }
            _ => {}
        }
        if period != self.period.nominal() {
            let (name, written) = match self.period {
                CalendarPeriod::Day => ("day", "1day"),
                CalendarPeriod::Week => ("week", "7days"),
                CalendarPeriod::Month => ("month", "1month"),
            };
            return Err(format!(
                "calendar = {name:?} counts per calendar {name}: leave the period out (or write \
                 {written:?}), not {period:?}"
            ));
        }
        Ok(())
    }
}

/// The bounds of the window holding an instant, in Unix seconds: `start <= instant < end`, and
/// the window after it ends at `next_end`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Bounds {
    pub(crate) start: u64,
    pub(crate) end: u64,
    pub(crate) next_end: u64,
}

impl Bounds {
    /// The window holding `at` (Unix time in units of `1 / per_second` s: 10^6 for Redis'
    /// microseconds, 10^9 for the memory backend's nanoseconds) among those these bounds know, as
    /// its end (Unix seconds: the window's name) and the time left to it (in `at`'s unit). An
    /// instant past `next_end` (a clock a whole window ahead of the one that computed the bounds)
    /// falls in a window as long as the last, after it. limits.lua's `calendar_at` is the same, on
    /// the server's clock.
    pub(crate) fn window_at(&self, at: u64, per_second: u64) -> (u64, u64) {
        let after = self.next_end + (self.next_end - self.end);
        for end in [self.start, self.end, self.next_end, after] {
            let end_at = end.saturating_mul(per_second);
            if at < end_at {
                return (end, end_at - at);
            }
        }
        (after, 1)
    }
}

/// A compiled [`CalendarWindow`]: its zone looked up, and the last bounds it computed. Interned
/// ([`Calendar::of`]): one per distinct description for the life of the process, so that the
/// window parameters that point at it stay `Copy`, and limits that share a calendar share its
/// cache.
pub(crate) struct Calendar {
    window: CalendarWindow,
    zone: Zone,
    /// The bounds computed last: most instants fall in them.
    last: ArcSwap<Bounds>,
}

#[cfg(feature = "calendar")]
type Zone = jiff::tz::TimeZone;

/// Without the feature `calendar` no calendar is ever made ([`Calendar::of`] refuses): no value of
/// this type exists.
#[cfg(not(feature = "calendar"))]
#[derive(Clone, Copy)]
enum Zone {}

// Interned: one calendar per description, so the same calendar is the same one.
impl PartialEq for Calendar {
    fn eq(&self, other: &Self) -> bool {
        std::ptr::eq(self, other)
    }
}

impl Eq for Calendar {}

impl std::hash::Hash for Calendar {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.window.hash(state);
    }
}

impl std::fmt::Debug for Calendar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.window.fmt(f)
    }
}

impl Calendar {
    /// The calendar `window` describes, for a quota of `period`, or why there is none (always, in a
    /// build without the feature `calendar`).
    pub(crate) fn of(
        window: &CalendarWindow,
        period: Duration,
    ) -> Result<&'static Calendar, String> {
        window.check(period)?;
        static INTERNED: OnceLock<Mutex<Vec<&'static Calendar>>> = OnceLock::new();
        let mut interned = INTERNED
            .get_or_init(Default::default)
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(known) = interned.iter().find(|c| c.window == *window) {
            return Ok(known);
        }
        let calendar = Calendar {
            window: window.clone(),
            zone: zone_named(&window.timezone)?,
            // Empty: the first instant asked about computes its window.
            last: ArcSwap::from_pointee(Bounds {
                start: 0,
                end: 0,
                next_end: 0,
            }),
        };
        // Descriptions come from configuration, so the leaked calendars stay few (a reload with the
        // same description finds the one it made before).
        let calendar: &'static Calendar = Box::leak(Box::new(calendar));
        interned.push(calendar);
        Ok(calendar)
    }

    pub(crate) fn window(&self) -> &CalendarWindow {
        &self.window
    }

    /// The bounds of the window holding this process's clock (the Redis backend sends them).
    #[cfg(feature = "redis")]
    pub(crate) fn bounds_now(&self) -> Bounds {
        self.bounds_at(crate::clock::unix_secs())
    }

    /// The bounds of the window holding `unix_secs`: the last ones computed when they hold it,
    /// computed (and kept, when they are later than those) otherwise.
    pub(crate) fn bounds_at(&self, unix_secs: u64) -> Bounds {
        let last = **self.last.load();
        if last.start <= unix_secs && unix_secs < last.end {
            return last;
        }
        let bounds = self.compute(unix_secs);
        // A refund asking about an earlier instant must not push the current window out.
        if bounds.start >= last.start {
            self.last.store(Arc::new(bounds));
        }
        bounds
    }

    /// The window holding `unix_nanos` on the memory backend's clock: its end (Unix seconds, the
    /// window's name) and the nanoseconds left to it. Never inlined: the fixed window's decision,
    /// which calls it only for calendar windows, stays small enough to inline for the others.
    #[inline(never)]
    pub(crate) fn window_at_nanos(&self, unix_nanos: u64) -> (u64, u64) {
        const NANOS: u64 = 1_000_000_000;
        self.bounds_at(unix_nanos / NANOS)
            .window_at(unix_nanos, NANOS)
    }

    #[cfg(not(feature = "calendar"))]
    fn compute(&self, _: u64) -> Bounds {
        match self.zone {}
    }

    #[cfg(feature = "calendar")]
    fn compute(&self, unix_secs: u64) -> Bounds {
        civil::bounds(
            &self.zone,
            self.window.period,
            self.window.anchor_day,
            unix_secs,
        )
        // Only an instant beyond jiff's range (the year 9999) has no civil date: a UTC day then.
        .unwrap_or_else(|| {
            let start = unix_secs - unix_secs % 86_400;
            Bounds {
                start,
                end: start + 86_400,
                next_end: start + 2 * 86_400,
            }
        })
    }
}

#[cfg(feature = "calendar")]
fn zone_named(name: &str) -> Result<Zone, String> {
    jiff::tz::TimeZone::get(name).map_err(|_| {
        format!("unknown time zone {name:?} (an IANA name such as \"Europe/Paris\" or \"UTC\")")
    })
}

#[cfg(not(feature = "calendar"))]
fn zone_named(_: &str) -> Result<Zone, String> {
    Err("calendar windows need the crate feature \"calendar\"".to_owned())
}

/// The civil calendar's arithmetic, on `jiff`'s dates.
#[cfg(feature = "calendar")]
mod civil {
    use jiff::civil::Date;
    use jiff::tz::TimeZone;
    use jiff::{Timestamp, ToSpan};

    use super::{Bounds, CalendarPeriod};

    /// The bounds of the window holding `unix_secs` (`None` beyond jiff's range).
    pub(super) fn bounds(
        zone: &TimeZone,
        period: CalendarPeriod,
        anchor: Option<u8>,
        unix_secs: u64,
    ) -> Option<Bounds> {
        let instant = Timestamp::from_second(i64::try_from(unix_secs).ok()?).ok()?;
        let today = instant.to_zoned_datetime(zone.clone()).date();
        let start = window_start(today, period, anchor)?;
        let end = next_start(start, period, anchor)?;
        let next_end = next_start(end, period, anchor)?;
        let at = |date: Date| -> Option<u64> {
            let first = date.to_zoned_datetime(zone.clone()).ok()?;
            u64::try_from(first.timestamp().as_second()).ok()
        };
        Some(Bounds {
            start: at(start)?,
            end: at(end)?,
            next_end: at(next_end)?,
        })
    }

    fn window_start(date: Date, period: CalendarPeriod, anchor: Option<u8>) -> Option<Date> {
        match period {
            CalendarPeriod::Day => Some(date),
            CalendarPeriod::Week => {
                let back = date.weekday().to_monday_zero_offset();
                date.checked_sub(i64::from(back).days()).ok()
            }
            CalendarPeriod::Month => {
                let month = date.first_of_month();
                let this = anchored(month, anchor)?;
                if date >= this {
                    Some(this)
                } else {
                    anchored(month.checked_sub(1.month()).ok()?, anchor)
                }
            }
        }
    }

    fn next_start(start: Date, period: CalendarPeriod, anchor: Option<u8>) -> Option<Date> {
        match period {
            CalendarPeriod::Day => start.tomorrow().ok(),
            CalendarPeriod::Week => start.checked_add(7.days()).ok(),
            CalendarPeriod::Month => {
                anchored(start.first_of_month().checked_add(1.month()).ok()?, anchor)
            }
        }
    }

    /// The anchor day in the month that starts on `first`: the anchor, or the month's last day
    /// when it has no such day.
    fn anchored(first: Date, anchor: Option<u8>) -> Option<Date> {
        let day = i8::try_from(anchor.unwrap_or(1)).ok()?;
        first
            .with()
            .day(day.min(first.days_in_month()))
            .build()
            .ok()
    }
}

#[cfg(all(test, feature = "calendar"))]
mod tests;
