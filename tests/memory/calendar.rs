//! Calendar windows in memory, on a manual clock set to chosen Unix instants: a refusal's wait,
//! a peek's reset and the quota's return fall on the exact boundary across DST changes in two
//! zones, in leap and common Februaries and on a month-end anchor; refunds stay in their window,
//! and an entry expires at its window's uneven end. The instants are written out as Unix seconds
//! (computed with Python's zoneinfo, not with the crate's own time zone code).

use std::time::Duration;
use tower_throttle::backend::Charges;

use crate::asks::Asks;
use tower_throttle::clock::ManualClock;
use tower_throttle::window::{CalendarPeriod, CalendarWindow, WindowStart};
use tower_throttle::{Algorithm, Key, Limit, MemoryBackend, Quota};

const HOUR: u64 = 3600;

fn limit(window: CalendarWindow) -> Limit {
    let quota = Quota::per_period(2, window.period().nominal());
    Limit::with_algorithm("calendar", Algorithm::FixedWindow, quota)
        .unwrap()
        .with_calendar(window)
        .unwrap()
}

/// A backend whose clock reads `unix` seconds since the Unix epoch.
fn at(unix: u64) -> (MemoryBackend<ManualClock>, ManualClock) {
    let clock = ManualClock::new();
    clock.set(Duration::from_secs(unix));
    let backend = MemoryBackend::builder()
        .clock(clock.clone())
        .shards(1)
        .build()
        .unwrap();
    (backend, clock)
}

/// Spends `key`'s quota at `now` and checks that the refusal waits exactly until `boundary`, that a
/// peek's reset says the same, that the quota is still spent a nanosecond before the boundary and
/// back at it.
fn waits_until(window: CalendarWindow, now: u64, boundary: u64) {
    let (backend, clock) = at(now);
    let limit = limit(window.clone());
    let key = Key::from("customer-1");
    assert!(backend.decide(&limit, &key, 2).unwrap().allowed);
    let refused = backend.decide(&limit, &key, 1).unwrap();
    let wait = Duration::from_secs(boundary - now);
    assert!(!refused.allowed);
    assert_eq!(refused.retry_after, Some(wait), "{window:?} at {now}");
    assert_eq!(refused.reset_after, wait);
    let peeked = backend
        .peek_now(Charges::stack(std::slice::from_ref(&limit), &key, 0))
        .unwrap()[0];
    assert_eq!((peeked.remaining, peeked.reset_after), (0, wait));
    clock.advance(wait - Duration::from_nanos(1));
    assert!(
        !backend.decide(&limit, &key, 1).unwrap().allowed,
        "a ns early"
    );
    clock.advance(Duration::from_nanos(1));
    let back = backend.decide(&limit, &key, 2).unwrap();
    assert!(back.allowed, "{window:?}: the quota is back at {boundary}");
}

#[test]
fn days_across_dst_end_at_local_midnight_in_paris_and_new_york() {
    let paris = || CalendarWindow::day().timezone("Europe/Paris");
    // 2027-03-28T12:00+02:00, the 23-hour day: 12 hours to 2027-03-29T00:00+02:00.
    waits_until(paris(), 1_806_228_000, 1_806_271_200);
    // 2027-10-31T00:30+02:00, the 25-hour day: 24.5 hours to 2027-11-01T00:00+01:00.
    waits_until(paris(), 1_824_935_400, 1_825_023_600);
    assert_eq!(1_825_023_600 - 1_824_935_400, 24 * HOUR + HOUR / 2);
    let new_york = || CalendarWindow::day().timezone("America/New_York");
    // 2027-03-14T03:30-04:00 (just after the spring change) to 2027-03-15T00:00-04:00.
    waits_until(new_york(), 1_805_009_400, 1_805_083_200);
    // 2027-11-07T01:30-05:00 (the second 01:30 of the fall-back night) to 2027-11-08T00:00-05:00.
    waits_until(new_york(), 1_825_569_000, 1_825_650_000);
}

#[test]
fn months_end_with_february_in_leap_and_common_years() {
    // 2028-02-28T12:00Z: February 29th still to come, 36 hours to March 1st.
    waits_until(CalendarWindow::month(), 1_835_352_000, 1_835_481_600);
    // 2027-02-28T12:00Z: 12 hours.
    waits_until(CalendarWindow::month(), 1_803_816_000, 1_803_859_200);
}

#[test]
fn an_anchor_on_the_31st_ends_on_the_last_day_of_shorter_months() {
    let on_31st = || CalendarWindow::month().anchor_day(31);
    // 2027-04-29T12:00Z: the window ends on April 30th (April has no 31st).
    waits_until(on_31st(), 1_809_000_000, 1_809_043_200);
    // 2028-02-28T12:00Z: on February 29th.
    waits_until(on_31st(), 1_835_352_000, 1_835_395_200);
}

#[tokio::test]
async fn a_refund_stays_in_its_window_and_the_entry_expires_at_the_uneven_end() {
    // 2027-03-28T12:00+02:00 in Paris: the window ends 12 hours later, 23 hours after it began.
    let (backend, clock) = at(1_806_228_000);
    let limit = limit(CalendarWindow::day().timezone("Europe/Paris"));
    let key = Key::from("ann");
    assert!(backend.decide(&limit, &key, 2).unwrap().allowed);
    backend.refund(std::slice::from_ref(&limit), &key, 1, Duration::ZERO);
    assert!(backend.decide(&limit, &key, 1).unwrap().allowed);
    assert!(!backend.decide(&limit, &key, 1).unwrap().allowed);
    // A second before the boundary the entry lives; at it, a sweep drops it.
    clock.advance(Duration::from_secs(12 * HOUR - 1));
    backend.sweep();
    assert_eq!(backend.len(), 1);
    clock.advance(Duration::from_secs(1));
    backend.sweep();
    assert!(backend.is_empty(), "{} entries left", backend.len());
    // A refund of a request admitted in the day before takes nothing from the new day.
    assert!(backend.decide(&limit, &key, 2).unwrap().allowed);
    backend.refund(
        std::slice::from_ref(&limit),
        &key,
        1,
        Duration::from_secs(60),
    );
    assert!(!backend.decide(&limit, &key, 1).unwrap().allowed);
}

#[test]
fn calendar_windows_are_checked_when_built() {
    let message = |r: Result<Limit, tower_throttle::BuildError>| r.unwrap_err().to_string();
    let day = Quota::per_period(2, CalendarPeriod::Day.nominal());
    let fixed = || Limit::with_algorithm("c", Algorithm::FixedWindow, day).unwrap();
    assert_eq!(
        message(
            Limit::new("c", day)
                .unwrap()
                .with_calendar(CalendarWindow::day())
        ),
        r#"policy "c": calendar windows are fixed windows (algorithm "fixed-window"), not gcra"#
    );
    assert_eq!(
        message(fixed().with_calendar(CalendarWindow::day().timezone("Mars/Olympus"))),
        r#"policy "c": unknown time zone "Mars/Olympus" (an IANA name such as "Europe/Paris" or "UTC")"#
    );
    assert_eq!(
        message(fixed().with_calendar(CalendarWindow::week())),
        r#"policy "c": calendar = "week" counts per calendar week: leave the period out (or write "7days"), not 86400s"#
    );
    let per_key = fixed().with_window_start(WindowStart::PerKey).unwrap();
    assert!(message(per_key.with_calendar(CalendarWindow::day())).contains("per-key"));
    let calendar = fixed().with_calendar(CalendarWindow::day()).unwrap();
    assert!(message(calendar.clone().with_window_start(WindowStart::PerKey)).contains("per-key"));
    // Limits that share a name must agree on the calendar.
    assert!(!calendar.same_rules(&fixed()));
    assert!(!calendar.same_rules(
        &fixed()
            .with_calendar(CalendarWindow::day().timezone("Europe/Paris"))
            .unwrap()
    ));
    assert!(calendar.same_rules(&fixed().with_calendar(CalendarWindow::day()).unwrap()));
}
