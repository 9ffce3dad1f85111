//! The boundaries, against instants written out by hand with their offsets (and checked against
//! Python's zoneinfo): DST days in two zones, a zone whose midnight is skipped, leap and common
//! Februaries, anchors past a month's end, ISO weeks across a year end.

use std::time::Duration;

use super::*;

/// Unix seconds of an RFC 3339 instant.
fn t(text: &str) -> u64 {
    let instant: jiff::Timestamp = text.parse().unwrap();
    instant.as_second() as u64
}

fn calendar(window: CalendarWindow) -> &'static Calendar {
    let period = window.period().nominal();
    Calendar::of(&window, period).unwrap()
}

fn bounds(window: CalendarWindow, at: &str) -> (u64, u64, u64) {
    let b = calendar(window).bounds_at(t(at));
    (b.start, b.end, b.next_end)
}

const HOUR: u64 = 3600;

#[test]
fn a_day_across_dst_is_23_or_25_hours_in_paris_and_new_york() {
    let paris = || CalendarWindow::day().timezone("Europe/Paris");
    // Spring forward on 2027-03-28 (02:00 CET → 03:00 CEST): a day of 23 hours.
    let (start, end, next) = bounds(paris(), "2027-03-28T12:00:00+02:00");
    assert_eq!(start, t("2027-03-28T00:00:00+01:00"));
    assert_eq!(end, t("2027-03-29T00:00:00+02:00"));
    assert_eq!(next, t("2027-03-30T00:00:00+02:00"));
    assert_eq!(end - start, 23 * HOUR);
    // Before the change, in the same day: the same window.
    assert_eq!(bounds(paris(), "2027-03-28T01:59:59+01:00").1, end);
    // Fall back on 2027-10-31 (03:00 CEST → 02:00 CET): 25 hours, the repeated hour inside.
    let (start, end, _) = bounds(paris(), "2027-10-31T02:30:00+01:00");
    assert_eq!(start, t("2027-10-31T00:00:00+02:00"));
    assert_eq!(end, t("2027-11-01T00:00:00+01:00"));
    assert_eq!(end - start, 25 * HOUR);
    // The day before the spring change ends where the change day starts.
    let (_, end, next) = bounds(paris(), "2027-03-27T23:59:59+01:00");
    assert_eq!(end, t("2027-03-28T00:00:00+01:00"));
    assert_eq!(next - end, 23 * HOUR);

    let new_york = || CalendarWindow::day().timezone("America/New_York");
    let (start, end, _) = bounds(new_york(), "2027-03-14T03:30:00-04:00");
    assert_eq!(start, t("2027-03-14T00:00:00-05:00"));
    assert_eq!(end, t("2027-03-15T00:00:00-04:00"));
    assert_eq!(end - start, 23 * HOUR);
    let (start, end, _) = bounds(new_york(), "2027-11-07T01:30:00-05:00");
    assert_eq!(start, t("2027-11-07T00:00:00-04:00"));
    assert_eq!(end, t("2027-11-08T00:00:00-05:00"));
    assert_eq!(end - start, 25 * HOUR);
}

#[test]
fn a_day_whose_midnight_is_skipped_starts_when_the_gap_ends() {
    // Santiago springs forward at midnight on 2026-09-06: the day starts at 01:00 (-03:00).
    let santiago = || CalendarWindow::day().timezone("America/Santiago");
    let (start, end, _) = bounds(santiago(), "2026-09-06T12:00:00-03:00");
    assert_eq!(start, t("2026-09-06T01:00:00-03:00"));
    assert_eq!(end, t("2026-09-07T00:00:00-03:00"));
    assert_eq!(end - start, 23 * HOUR);
    // The last second of the day before is in the day before.
    assert_eq!(bounds(santiago(), "2026-09-05T23:59:59-04:00").1, start);
}

#[test]
fn months_follow_the_calendar_in_leap_and_common_years() {
    let utc = CalendarWindow::month;
    let (start, end, next) = bounds(utc(), "2028-02-15T08:00:00Z");
    assert_eq!(start, t("2028-02-01T00:00:00Z"));
    assert_eq!(end, t("2028-03-01T00:00:00Z"));
    assert_eq!(next, t("2028-04-01T00:00:00Z"));
    assert_eq!(end - start, 29 * 24 * HOUR);
    let (start, end, _) = bounds(utc(), "2027-02-28T23:59:59Z");
    assert_eq!(end - start, 28 * 24 * HOUR);
    // A month in Paris crosses the spring change: 31 days less an hour, cut at local midnights.
    let (start, end, _) = bounds(utc().timezone("Europe/Paris"), "2027-03-31T23:30:00+02:00");
    assert_eq!(start, t("2027-03-01T00:00:00+01:00"));
    assert_eq!(end, t("2027-04-01T00:00:00+02:00"));
    assert_eq!(end - start, 31 * 24 * HOUR - HOUR);
    // December into January.
    let (start, end, next) = bounds(utc(), "2027-12-31T23:59:59Z");
    assert_eq!(start, t("2027-12-01T00:00:00Z"));
    assert_eq!(end, t("2028-01-01T00:00:00Z"));
    assert_eq!(next, t("2028-02-01T00:00:00Z"));
}

#[test]
fn an_anchor_past_a_months_end_falls_on_its_last_day() {
    let on_31st = || CalendarWindow::month().anchor_day(31);
    // April has 30 days: the window from March 31st ends on April 30th, and the next on May 31st.
    let (start, end, next) = bounds(on_31st(), "2027-04-15T00:00:00Z");
    assert_eq!(start, t("2027-03-31T00:00:00Z"));
    assert_eq!(end, t("2027-04-30T00:00:00Z"));
    assert_eq!(next, t("2027-05-31T00:00:00Z"));
    // On April 30th itself the new window has begun.
    assert_eq!(
        bounds(on_31st(), "2027-04-30T00:00:00Z").0,
        t("2027-04-30T00:00:00Z")
    );
    // February: the 29th in 2028, the 28th in 2027.
    let (start, end, next) = bounds(on_31st(), "2028-02-10T00:00:00Z");
    assert_eq!(start, t("2028-01-31T00:00:00Z"));
    assert_eq!(end, t("2028-02-29T00:00:00Z"));
    assert_eq!(next, t("2028-03-31T00:00:00Z"));
    assert_eq!(
        bounds(on_31st(), "2027-02-27T00:00:00Z").1,
        t("2027-02-28T00:00:00Z")
    );
    // A billing day in a zone: the 15th at midnight in Paris, before and after it.
    let billing = || {
        CalendarWindow::month()
            .anchor_day(15)
            .timezone("Europe/Paris")
    };
    let (start, end, _) = bounds(billing(), "2027-01-14T23:59:59+01:00");
    assert_eq!(start, t("2026-12-15T00:00:00+01:00"));
    assert_eq!(end, t("2027-01-15T00:00:00+01:00"));
    assert_eq!(bounds(billing(), "2027-01-15T00:00:00+01:00").0, end);
}

#[test]
fn iso_weeks_start_on_monday_across_a_year_end() {
    // 2026-12-31 is a Thursday: its week runs from Monday 2026-12-28 to Monday 2027-01-04.
    let (start, end, next) = bounds(CalendarWindow::week(), "2026-12-31T10:00:00Z");
    assert_eq!(start, t("2026-12-28T00:00:00Z"));
    assert_eq!(end, t("2027-01-04T00:00:00Z"));
    assert_eq!(next, t("2027-01-11T00:00:00Z"));
    // A Sunday is the week's last day; Monday begins the next.
    let week = || CalendarWindow::week().timezone("America/New_York");
    let (_, end, _) = bounds(week(), "2027-03-14T23:00:00-04:00");
    assert_eq!(end, t("2027-03-15T00:00:00-04:00"));
    // That week held the spring change: an hour short.
    let (start, end, _) = bounds(week(), "2027-03-10T12:00:00-05:00");
    assert_eq!(end - start, 7 * 24 * HOUR - HOUR);
}

#[test]
fn the_bounds_name_the_window_holding_another_clock() {
    let bounds = Bounds {
        start: 100,
        end: 200,
        next_end: 250,
    };
    const US: u64 = 1_000_000;
    let window_at = |at| bounds.window_at(at, US);
    // A clock behind the one that computed them: the window ending at `start`.
    assert_eq!(window_at(99 * US), (100, US));
    assert_eq!(window_at(100 * US), (200, 100 * US));
    assert_eq!(window_at(200 * US - 1), (200, 1));
    // Ahead of it: the next window, then one as long as it.
    assert_eq!(window_at(200 * US), (250, 50 * US));
    assert_eq!(window_at(250 * US), (300, 50 * US));
    assert_eq!(window_at(400 * US), (300, 1));
}

#[test]
fn bounds_are_kept_until_an_instant_leaves_them() {
    let window = CalendarWindow::day().timezone("Asia/Tokyo");
    let calendar = calendar(window.clone());
    let noon = t("2027-06-01T12:00:00+09:00");
    let today = calendar.bounds_at(noon);
    assert_eq!(**calendar.last.load(), today);
    // An earlier instant is answered, and today's bounds stay.
    let yesterday = calendar.bounds_at(noon - 24 * HOUR);
    assert_eq!(yesterday.end, today.start);
    assert_eq!(**calendar.last.load(), today);
    // A later one moves them on.
    let tomorrow = calendar.bounds_at(noon + 24 * HOUR);
    assert_eq!(tomorrow.start, today.end);
    assert_eq!(**calendar.last.load(), tomorrow);
    assert!(std::ptr::eq(calendar, self::calendar(window)));
    // The memory backend's view: the end names the window, the rest is in nanoseconds.
    let (end, left) = calendar.window_at_nanos(noon * 1_000_000_000 + 1);
    assert_eq!(end, today.end);
    assert_eq!(left, 12 * HOUR * 1_000_000_000 - 1);
}

#[test]
fn a_wrong_description_is_refused_with_its_reason() {
    let error =
        |window: CalendarWindow, period: Duration| Calendar::of(&window, period).unwrap_err();
    let day = Duration::from_secs(86_400);
    let month = CalendarPeriod::Month.nominal();
    assert_eq!(
        error(CalendarWindow::day().timezone("Europe/Pariss"), day),
        "unknown time zone \"Europe/Pariss\" (an IANA name such as \"Europe/Paris\" or \"UTC\")"
    );
    assert_eq!(
        error(CalendarWindow::month().anchor_day(0), month),
        "anchor_day must be 1 to 31, not 0"
    );
    assert_eq!(
        error(CalendarWindow::month().anchor_day(32), month),
        "anchor_day must be 1 to 31, not 32"
    );
    assert_eq!(
        error(CalendarWindow::week().anchor_day(3), 7 * day),
        "anchor_day is for calendar = \"month\", not \"week\""
    );
    assert_eq!(
        error(CalendarWindow::month(), 30 * day),
        "calendar = \"month\" counts per calendar month: leave the period out (or write \"1month\"), not 2592000s"
    );
    assert_eq!(
        "year".parse::<CalendarPeriod>().unwrap_err(),
        "calendar \"year\" is not one of \"day\", \"week\", \"month\""
    );
}

#[test]
fn a_description_reads_back_what_it_was_given() {
    for (period, name, secs) in [
        (CalendarPeriod::Day, "day", 86_400),
        (CalendarPeriod::Week, "week", 7 * 86_400),
        (CalendarPeriod::Month, "month", 2_630_016),
    ] {
        assert_eq!(period.as_str(), name);
        assert_eq!(name.parse::<CalendarPeriod>(), Ok(period));
        assert_eq!(period.nominal(), Duration::from_secs(secs));
    }
    let billing = CalendarWindow::month()
        .timezone("Europe/Paris")
        .anchor_day(15);
    assert_eq!(billing.period(), CalendarPeriod::Month);
    assert_eq!(billing.zone(), "Europe/Paris");
    assert_eq!(billing.anchor(), Some(15));
    let week = CalendarWindow::week();
    assert_eq!(week.period(), CalendarPeriod::Week);
    assert_eq!(week.zone(), "UTC");
    assert_eq!(week.anchor(), None);
    assert_eq!(CalendarWindow::day().period(), CalendarPeriod::Day);
}

#[test]
fn a_calendar_is_equal_hashed_and_printed_as_its_description() {
    use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher};
    let window = CalendarWindow::month()
        .timezone("Australia/Sydney")
        .anchor_day(28);
    let sydney = calendar(window.clone());
    let other = calendar(CalendarWindow::month().timezone("Australia/Sydney"));
    assert_eq!(sydney, calendar(window.clone()));
    assert_ne!(sydney, other);
    assert_eq!(sydney.window(), &window);
    let hash = BuildHasherDefault::<DefaultHasher>::default();
    assert_eq!(hash.hash_one(sydney), hash.hash_one(&window));
    assert_eq!(format!("{sydney:?}"), format!("{window:?}"));
}

#[test]
fn an_instant_past_the_year_9999_falls_in_a_utc_day() {
    // jiff's dates end with the year 9999: 300,000,000,000 s (in the year 11476) is
    // 3,472,222 UTC days and 19,200 s since the epoch, in a zone or not.
    let far = calendar(CalendarWindow::day().timezone("Pacific/Auckland"));
    let b = far.bounds_at(300_000_000_000);
    assert_eq!(b.start, 299_999_980_800);
    assert_eq!(b.end, 300_000_067_200);
    assert_eq!(b.next_end, 300_000_153_600);
}
