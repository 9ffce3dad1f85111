//! Calendar windows on Redis. First the scripts themselves (limits.lua alone and limits_batch.lua,
//! the coalesced path) on a test clock set to chosen instants, with the bounds the backend would
//! send: the refusal's wait is exactly the time to the boundary across DST changes in two zones,
//! in a leap February and on a month-end anchor, and a server clock behind or ahead of the bounds
//! picks the window its own clock is in. Then the backend at the real time, alone and coalesced:
//! its waits, resets and refunds agree with the memory backend's and land on the boundary the
//! calendar names. The instants are Unix seconds written out (computed with Python's zoneinfo).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tower_throttle::redis::{RedisBackend, RedisMode};
use tower_throttle::window::CalendarWindow;
use tower_throttle::{Algorithm, Backend, Key, Limit, MemoryBackend, Quota};

use crate::batch::on_a_test_clock;
use crate::lua::{LIMITS, LIMITS_BATCH};
use crate::support::asks::Asks;
use crate::support::redis::RedisServer;

/// The bounds the backend sends for a calendar window (`start <= its clock < end`, the next window
/// ending at `next_end`), as the script's two parameters.
fn calendar_args(start: u64, end: u64, next_end: u64) -> (u64, u64) {
    (end, (end - start) * (1 << 22) + (next_end - end))
}

/// One day, week or month as the script sees it: where its window starts and ends, and where the
/// next one ends.
struct Case {
    what: &'static str,
    start: u64,
    end: u64,
    next_end: u64,
}

const CASES: [Case; 6] = [
    Case {
        what: "Paris, 2027-03-28 (23 hours)",
        start: 1_806_188_400,
        end: 1_806_271_200,
        next_end: 1_806_357_600,
    },
    Case {
        what: "Paris, 2027-10-31 (25 hours)",
        start: 1_824_933_600,
        end: 1_825_023_600,
        next_end: 1_825_110_000,
    },
    Case {
        what: "New York, 2027-03-14 (23 hours)",
        start: 1_805_000_400,
        end: 1_805_083_200,
        next_end: 1_805_169_600,
    },
    Case {
        what: "February 2028 (29 days)",
        start: 1_832_976_000,
        end: 1_835_481_600,
        next_end: 1_838_160_000,
    },
    Case {
        what: "anchor 31, from March 31st to April 30th 2027",
        start: 1_806_451_200,
        end: 1_809_043_200,
        next_end: 1_811_721_600,
    },
    Case {
        what: "anchor 31, from January 31st to February 29th 2028",
        start: 1_832_889_600,
        end: 1_835_395_200,
        next_end: 1_838_073_600,
    },
];

/// What the script answers for `quantity` units of a 2-per-window calendar limit on `key`, at the
/// test clock's `now_us`, with the bounds of `case`: {limited, remaining, retry_after (ns)}. With
/// `batch`, through limits_batch.lua as the only item after two others on the same key that ask
/// for nothing (peeks: the batch's cache reads the key for them).
async fn decide(
    conn: &mut redis::aio::MultiplexedConnection,
    batch: bool,
    case: &Case,
    now_us: u64,
    quantity: u64,
) -> (i64, i64, i64) {
    let _: () = redis::cmd("HSET")
        .arg("test-clock")
        .arg("s")
        .arg(now_us / 1_000_000)
        .arg("us")
        .arg(now_us % 1_000_000)
        .query_async(conn)
        .await
        .unwrap();
    let (end, lengths) = calendar_args(case.start, case.end, case.next_end);
    let args = |q: u64| vec![1, q, 7, 0, 0, 0, 5, 2, end, lengths];
    let reply: Vec<redis::Value> = if batch {
        let script = on_a_test_clock(LIMITS_BATCH);
        let mut call = script.prepare_invoke();
        call.arg(3);
        for q in [0, 0, quantity] {
            let args = args(q);
            call.key("cal").arg(1).arg(args.len());
            for arg in args {
                call.arg(arg);
            }
        }
        let all: Vec<redis::Value> = call.invoke_async(conn).await.unwrap();
        all[12..].to_vec()
    } else {
        let script = on_a_test_clock(LIMITS);
        let mut call = script.prepare_invoke();
        call.key("cal");
        for arg in args(quantity) {
            call.arg(arg);
        }
        call.invoke_async(conn).await.unwrap()
    };
    let int = |v: &redis::Value| match v {
        redis::Value::Int(i) => *i,
        other => panic!("not an integer: {other:?}"),
    };
    (int(&reply[1]), int(&reply[3]), int(&reply[4]))
}

#[tokio::test]
async fn the_scripts_wait_exactly_until_uneven_boundaries() {
    let server = RedisServer::start();
    let client = redis::Client::open(server.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    const S: u64 = 1_000_000;
    for batch in [false, true] {
        for case in &CASES {
            let at = format!("{} (batch: {batch})", case.what);
            let _: () = redis::cmd("DEL")
                .arg("cal")
                .query_async(&mut conn)
                .await
                .unwrap();
            // Two hours before the end, a little past a whole second.
            let now = (case.end - 7200) * S + 250_000;
            assert_eq!(decide(&mut conn, batch, case, now, 2).await.0, 0, "{at}");
            let (limited, remaining, retry) = decide(&mut conn, batch, case, now, 1).await;
            assert_eq!((limited, remaining), (1, 0), "{at}");
            assert_eq!(retry, (7200 * S - 250_000) as i64 * 1000, "{at}");
            // The key expires with its window (rounded up to the millisecond), not later.
            let ttl: i64 = redis::cmd("PTTL")
                .arg("cal")
                .query_async(&mut conn)
                .await
                .unwrap();
            assert!(ttl > 0 && ttl <= 7_200_000, "{at}: PTTL {ttl}");
            // A microsecond before the boundary: still spent; at it, the quota is back.
            let early = decide(&mut conn, batch, case, case.end * S - 1, 1).await;
            assert_eq!(early, (1, 0, 1000), "{at}");
            let (limited, remaining, _) = decide(&mut conn, batch, case, case.end * S, 2).await;
            assert_eq!((limited, remaining), (0, 0), "{at}");
            // The server a little ahead of the client that computed the bounds: its clock is in
            // the next window, which ends at `next_end`.
            let ahead = case.end * S + 30 * S;
            let (limited, _, retry) = decide(&mut conn, batch, case, ahead, 1).await;
            assert_eq!(
                limited, 1,
                "{at}: the next window's quota was spent at its start"
            );
            assert_eq!(
                retry,
                ((case.next_end - case.end - 30) * S * 1000) as i64,
                "{at}"
            );
            // Behind it: the window before, which ends at `start`.
            let _: () = redis::cmd("DEL")
                .arg("cal")
                .query_async(&mut conn)
                .await
                .unwrap();
            let behind = case.start * S - 5 * S;
            assert_eq!(decide(&mut conn, batch, case, behind, 2).await.0, 0, "{at}");
            let (limited, _, retry) = decide(&mut conn, batch, case, behind, 1).await;
            assert_eq!((limited, retry), (1, (5 * S * 1000) as i64), "{at}");
        }
    }
}

fn limit(name: &str, window: CalendarWindow) -> Limit {
    let quota = Quota::per_period(3, window.period().nominal());
    Limit::with_algorithm(name, Algorithm::FixedWindow, quota)
        .unwrap()
        .with_calendar(window)
        .unwrap()
}

/// The refusal's wait once `key`'s quota is spent on `backend`, and the Unix time (µs) it was
/// refused at.
async fn wait_of<B: Backend>(backend: &B, limit: &Limit, key: &Key) -> (Duration, u128) {
    for _ in 0..3 {
        assert!(
            backend.check_one(limit, key, 1).await.unwrap().allowed,
            "{key}"
        );
    }
    let refused = backend.check_one(limit, key, 1).await.unwrap();
    let at = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_micros();
    assert!(!refused.allowed, "{key}");
    (refused.retry_after.unwrap(), at)
}

/// The next boundary of `window` after now, by jiff's own zoned arithmetic (not the crate's).
fn next_boundary(window: &CalendarWindow) -> u128 {
    use jiff::ToSpan;
    let zone = jiff::tz::TimeZone::get(window.zone()).unwrap();
    let now = jiff::Timestamp::now().to_zoned_datetime(zone);
    let next = match window.period() {
        tower_throttle::window::CalendarPeriod::Day => now.tomorrow().unwrap().start_of_day(),
        tower_throttle::window::CalendarPeriod::Week => {
            let monday = now.date().weekday().to_monday_zero_offset();
            let days = 7 - i64::from(monday);
            now.start_of_day()
                .unwrap()
                .checked_add(days.days())
                .unwrap()
                .start_of_day()
        }
        _ => now
            .first_of_month()
            .unwrap()
            .checked_add(1.month())
            .unwrap()
            .start_of_day(),
    };
    next.unwrap().timestamp().as_microsecond() as u128
}

#[tokio::test]
async fn the_backend_alone_and_coalesced_agrees_with_memory_on_the_boundary() {
    let server = RedisServer::start();
    let calendars = [
        CalendarWindow::day().timezone("Europe/Paris"),
        CalendarWindow::day().timezone("America/New_York"),
        CalendarWindow::day().timezone("Pacific/Kiritimati"),
        CalendarWindow::week().timezone("Asia/Tokyo"),
        CalendarWindow::month().timezone("Europe/Paris"),
        CalendarWindow::month().timezone("America/New_York"),
    ];
    for coalesce in [false, true] {
        let redis = RedisBackend::builder()
            .url(server.url())
            .mode(RedisMode::Lua)
            .coalesce(coalesce)
            .timeout(Duration::from_secs(2))
            .connect()
            .await
            .unwrap();
        let memory = MemoryBackend::new();
        for (i, window) in calendars.iter().enumerate() {
            let limit = limit(&format!("cal-{i}-{coalesce}"), window.clone());
            let key = Key::from("customer-7");
            let boundary = next_boundary(window);
            let (on_redis, at) = wait_of(&redis, &limit, &key).await;
            // The boundary falls a whole second apart from any instant on it, exactly: the wait
            // ends on it (the call's own time aside).
            let ends_at = at + on_redis.as_micros();
            assert!(
                ends_at.abs_diff(boundary) < 250_000,
                "{window:?}: {ends_at} vs {boundary}"
            );
            let (in_memory, _) = wait_of(&memory, &limit, &key).await;
            assert!(
                in_memory.abs_diff(on_redis) < Duration::from_millis(250),
                "{window:?}: {in_memory:?} in memory, {on_redis:?} on Redis"
            );
            // A peek on Redis names the same reset.
            let peeked = redis
                .peek_all(std::slice::from_ref(&limit), &key)
                .await
                .unwrap()[0];
            assert_eq!(peeked.remaining, 0);
            assert!(peeked.reset_after.abs_diff(on_redis) < Duration::from_millis(250));
            // Given back in the window: one more passes, on both.
            memory.refund(std::slice::from_ref(&limit), &key, 1, Duration::ZERO);
            redis.refund(std::slice::from_ref(&limit), &key, 1, Duration::ZERO);
            assert!(memory.check_one(&limit, &key, 1).await.unwrap().allowed);
            let mut given_back = false;
            // The refund is sent in the background: give it a moment.
            for _ in 0..100 {
                let state = redis
                    .peek_all(std::slice::from_ref(&limit), &key)
                    .await
                    .unwrap();
                if state[0].remaining > 0 {
                    given_back = true;
                    break;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            assert!(given_back, "{window:?}: the refund did not land on Redis");
            assert!(redis.check_one(&limit, &key, 1).await.unwrap().allowed);
            assert!(!redis.check_one(&limit, &key, 1).await.unwrap().allowed);
        }
    }
}
