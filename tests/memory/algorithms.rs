//! Every algorithm of the memory backend, exactly, on a manual clock: the window algorithms, the
//! concurrency limit, stacks of limits, exactness under contention, the cap and the sweeps.

use std::collections::VecDeque;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::sync::Barrier;
use std::task::{Context, Poll, Waker};
use std::time::Duration;
use tower_throttle::backend::{Charges, Decisions};

use crate::asks::Asks;
use tower_throttle::clock::{Clock, ManualClock};
use tower_throttle::window::CONCURRENCY_RETRY;
use tower_throttle::{Algorithm, Backend, Decision, Key, Limit, MemoryBackend, Quota};

const MS: Duration = Duration::from_millis(1);

fn backend(max_keys: usize) -> (MemoryBackend<ManualClock>, ManualClock) {
    let clock = ManualClock::new();
    let backend = MemoryBackend::builder()
        .clock(clock.clone())
        .max_keys(max_keys)
        .shards(1)
        .build()
        .unwrap();
    (backend, clock)
}

fn limit(name: &str, algorithm: Algorithm, quota: Quota) -> Limit {
    Limit::with_algorithm(name, algorithm, quota).unwrap()
}

/// The output of a future that must be ready at once, as the memory backend's are.
fn now<T>(future: impl Future<Output = T>) -> T {
    let mut future = std::pin::pin!(future);
    match future
        .as_mut()
        .poll(&mut Context::from_waker(Waker::noop()))
    {
        Poll::Ready(out) => out,
        Poll::Pending => panic!("the memory backend waits for nothing"),
    }
}

/// `Backend::check`, whose memory future is always ready.
fn check<C: Clock>(
    backend: &MemoryBackend<C>,
    limit: &Limit,
    key: &Key,
    quantity: u64,
) -> Decision {
    let decisions = backend
        .check(Charges::one(limit, key, quantity))
        .into_inner()
        .expect("the memory backend decides every algorithm");
    match decisions {
        Decisions::One(decision) => decision,
        many => panic!("one charge, answered as a list: {many:?}"),
    }
}

fn check_all<C: Clock>(
    backend: &MemoryBackend<C>,
    limits: &[Limit],
    key: &Key,
    quantity: u64,
) -> Vec<Decision> {
    let decisions = now(backend.check_all(limits, key, quantity)).expect("a valid stack");
    assert_eq!(decisions.len(), limits.len(), "one decision per limit");
    decisions
}

fn at(clock: &ManualClock, since_origin: Duration) {
    clock.set(since_origin);
}

#[test]
fn fixed_window_counts_per_window_and_resets_on_the_boundary() {
    let (backend, clock) = backend(1_000);
    let l = limit("fixed", Algorithm::FixedWindow, Quota::per_second(3));
    let key = Key::from("alice");
    at(&clock, 200 * MS);
    for remaining in [2, 1, 0] {
        let d = check(&backend, &l, &key, 1);
        assert!(d.allowed);
        assert_eq!((d.limit, d.remaining), (3, remaining));
        assert_eq!(d.reset_after, 800 * MS);
        assert_eq!(d.retry_after, None);
    }
    at(&clock, 700 * MS);
    let d = check(&backend, &l, &key, 1);
    assert!(!d.allowed);
    assert_eq!(d.remaining, 0);
    assert_eq!(d.retry_after, Some(300 * MS), "the next boundary");
    assert_eq!(d.reset_after, 300 * MS);
    // One nanosecond before the boundary it still rejects; at the boundary the count resets.
    at(&clock, Duration::from_nanos(999_999_999));
    assert!(!check(&backend, &l, &key, 1).allowed);
    assert_eq!(
        check(&backend, &l, &key, 1).retry_after,
        Some(Duration::from_nanos(1))
    );
    at(&clock, Duration::from_secs(1));
    let d = check(&backend, &l, &key, 2);
    assert!(d.allowed);
    assert_eq!(d.remaining, 1);
    assert_eq!(d.reset_after, Duration::from_secs(1));
    // More than the limit never passes, and is not recorded.
    let d = check(&backend, &l, &key, 4);
    assert!(!d.allowed);
    assert_eq!(d.retry_after, None);
    assert_eq!(check(&backend, &l, &key, 1).remaining, 0);
    // Across a boundary a client can pass twice the count within one period (documented).
    let burst = Key::from("burst");
    at(&clock, Duration::from_millis(1_999));
    assert!(check(&backend, &l, &burst, 3).allowed);
    at(&clock, Duration::from_secs(2));
    assert!(check(&backend, &l, &burst, 3).allowed);
}

#[test]
fn sliding_window_weighs_the_previous_window() {
    let (backend, clock) = backend(1_000);
    let l = limit("sliding", Algorithm::SlidingWindow, Quota::per_second(10));
    let key = Key::from("alice");
    for remaining in (0..10).rev() {
        let d = check(&backend, &l, &key, 1);
        assert!(d.allowed);
        assert_eq!(d.remaining, remaining);
        // This window's count weighs until the end of the next window.
        assert_eq!(d.reset_after, Duration::from_secs(2));
    }
    let d = check(&backend, &l, &key, 1);
    assert!(!d.allowed);
    // At 1.1 s the 10 of window 0 weigh 10 × 0.9 = 9, so one more fits.
    assert_eq!(d.retry_after, Some(1_100 * MS));
    assert_eq!(d.remaining, 0);
    at(&clock, Duration::from_nanos(1_099_999_999));
    assert!(!check(&backend, &l, &key, 1).allowed);
    at(&clock, 1_100 * MS);
    let d = check(&backend, &l, &key, 1);
    assert!(d.allowed);
    assert_eq!(d.remaining, 0);
    // At 1.25 s: 10 × 0.75 + 1 = 8.5, one more makes 9.5 (remaining rounds down to 0).
    at(&clock, 1_250 * MS);
    let d = check(&backend, &l, &key, 1);
    assert!(d.allowed);
    assert_eq!(d.remaining, 0);
    let d = check(&backend, &l, &key, 1);
    assert!(!d.allowed);
    // 10 × (1 − e) + 2 + 1 <= 10 from e = 0.3: 50 ms later.
    assert_eq!(d.retry_after, Some(50 * MS));
    at(&clock, 1_300 * MS);
    assert!(check(&backend, &l, &key, 1).allowed);
    assert!(!check(&backend, &l, &key, 1).allowed);
    // Never more than the limit.
    assert_eq!(check(&backend, &l, &Key::from("new"), 11).retry_after, None);
    // Two windows later nothing weighs any more.
    at(&clock, Duration::from_secs(3));
    let d = check(&backend, &l, &key, 10);
    assert!(d.allowed);
    assert_eq!(d.remaining, 0);
}

#[test]
fn sliding_log_is_exact_and_does_not_record_rejections() {
    let (backend, clock) = backend(1_000);
    let l = limit("log", Algorithm::SlidingLog, Quota::per_second(3));
    let key = Key::from("alice");
    let d = check(&backend, &l, &key, 1);
    assert!(d.allowed);
    assert_eq!((d.remaining, d.reset_after), (2, Duration::from_secs(1)));
    at(&clock, 400 * MS);
    let d = check(&backend, &l, &key, 2);
    assert!(d.allowed);
    assert_eq!((d.remaining, d.reset_after), (0, Duration::from_secs(1)));
    at(&clock, 900 * MS);
    let d = check(&backend, &l, &key, 1);
    assert!(!d.allowed);
    assert_eq!(
        d.retry_after,
        Some(100 * MS),
        "the unit of t = 0 leaves at 1 s"
    );
    assert_eq!(d.reset_after, 500 * MS);
    // A client hammering while limited does not push its own window forward.
    for _ in 0..100 {
        clock.advance(Duration::from_nanos(999));
        assert!(!check(&backend, &l, &key, 1).allowed);
    }
    at(&clock, Duration::from_secs(1));
    let d = check(&backend, &l, &key, 1);
    assert!(d.allowed);
    assert_eq!(d.remaining, 0);
    // Two more need both units of 400 ms to leave.
    let d = check(&backend, &l, &key, 2);
    assert!(!d.allowed);
    assert_eq!(d.retry_after, Some(400 * MS));
    at(&clock, Duration::from_nanos(1_399_999_999));
    assert!(!check(&backend, &l, &key, 2).allowed);
    at(&clock, 1_400 * MS);
    assert!(check(&backend, &l, &key, 2).allowed);
    assert_eq!(check(&backend, &l, &key, 4).retry_after, None);
    assert_eq!(check(&backend, &l, &key, 0).remaining, 0, "a peek");
}

#[test]
fn sliding_log_admits_at_most_the_count_in_any_window() {
    let (backend, clock) = backend(1_000);
    let l = limit("log-any", Algorithm::SlidingLog, Quota::per_second(5));
    let key = Key::from("k");
    let mut admitted = VecDeque::new();
    // A request every 7 ms for 10 s.
    for step in 0..1_500u64 {
        at(&clock, Duration::from_millis(7 * step));
        if check(&backend, &l, &key, 1).allowed {
            let now = clock.now_nanos();
            admitted.push_back(now);
            while admitted.front().is_some_and(|t| t + 1_000_000_000 <= now) {
                admitted.pop_front();
            }
            assert!(
                admitted.len() <= 5,
                "{} in one second at {now}",
                admitted.len()
            );
        }
    }
    assert_eq!(admitted.len(), 5);
}

/// A reset forgets a key's slots; the requests that held them give back nothing when they end
/// (their lease is the key's no longer), so the requests after the reset keep theirs.
#[tokio::test]
async fn releases_of_slots_taken_before_a_reset_free_no_slot_after_it() {
    let (backend, _clock) = backend(1_000);
    let l = limit("slots", Algorithm::Concurrency, Quota::per_second(2));
    let key = Key::from("alice");
    let before: Vec<Decision> = (0..2).map(|_| check(&backend, &l, &key, 1)).collect();
    assert!(before.iter().all(|d| d.allowed));
    backend
        .reset_all(std::slice::from_ref(&l), &key)
        .await
        .unwrap();
    let after: Vec<Decision> = (0..2).map(|_| check(&backend, &l, &key, 1)).collect();
    assert!(after.iter().all(|d| d.allowed));
    assert_ne!(before[0].lease, after[0].lease);
    for d in &before {
        backend.release(&l, &key, 1, d.lease.unwrap());
    }
    assert!(
        !check(&backend, &l, &key, 1).allowed,
        "the two after it hold both slots"
    );
    backend.release(&l, &key, 1, after[0].lease.unwrap());
    assert!(check(&backend, &l, &key, 1).allowed);
}

#[test]
fn concurrency_counts_requests_in_flight_until_released() {
    let (backend, clock) = backend(1_000);
    let l = limit("slots", Algorithm::Concurrency, Quota::per_second(2));
    let key = Key::from("alice");
    let d = check(&backend, &l, &key, 1);
    assert!(d.allowed);
    assert_eq!((d.limit, d.remaining), (2, 1));
    assert!(d.lease.is_some(), "the slots' lease");
    assert_eq!(check(&backend, &l, &key, 1).remaining, 0);
    let d = check(&backend, &l, &key, 1);
    assert!(!d.allowed);
    assert_eq!(d.retry_after, Some(CONCURRENCY_RETRY));
    // Requests in flight are not state that expires: an hour later they still hold their slots.
    clock.advance(Duration::from_secs(3_600));
    backend.sweep();
    assert!(!check(&backend, &l, &key, 1).allowed);
    backend.release(&l, &key, 1, 0);
    let d = check(&backend, &l, &key, 1);
    assert!(d.allowed);
    assert_eq!(d.remaining, 0);
    // Releasing more than is held saturates, and the key is gone at 0.
    backend.release(&l, &key, 5, 0);
    assert_eq!(backend.len(), 0);
    assert_eq!(check(&backend, &l, &key, 0).remaining, 2, "a peek");
    assert_eq!(backend.len(), 0, "a peek records nothing");
    // A release without a request, or for another algorithm, changes nothing.
    backend.release(&l, &Key::from("nobody"), 1, 0);
    let fixed = limit("slots-fixed", Algorithm::FixedWindow, Quota::per_second(1));
    assert!(check(&backend, &fixed, &key, 1).allowed);
    backend.release(&fixed, &key, 1, 0);
    assert!(!check(&backend, &fixed, &key, 1).allowed);
    // More than the limit never passes.
    let d = check(&backend, &l, &key, 3);
    assert!(!d.allowed);
    assert_eq!(d.retry_after, None);
    // Keys are independent.
    assert!(check(&backend, &l, &Key::from("bob"), 2).allowed);
    assert!(check(&backend, &l, &key, 2).allowed);
}

#[test]
fn a_fixed_window_stack_rejected_by_one_limit_records_nothing_in_the_others() {
    let (backend, clock) = backend(1_000);
    let stack = [
        limit("fw-second", Algorithm::FixedWindow, Quota::per_second(3)),
        limit("fw-minute", Algorithm::FixedWindow, Quota::per_minute(5)),
    ];
    let key = Key::from("alice");
    for (second, minute) in [(2, 4), (1, 3), (0, 2)] {
        let d = check_all(&backend, &stack, &key, 1);
        assert!(d[0].allowed && d[1].allowed);
        assert_eq!((d[0].remaining, d[1].remaining), (second, minute));
        assert_eq!((d[0].limit, d[1].limit), (3, 5));
    }
    // The per-second limit rejects; the per-minute limit would admit, but records nothing.
    let d = check_all(&backend, &stack, &key, 1);
    assert!(!d[0].allowed);
    assert_eq!(d[0].retry_after, Some(Duration::from_secs(1)));
    assert!(d[1].allowed);
    assert_eq!(d[1].remaining, 2);
    assert!(!Decision::combine(&d).unwrap().allowed);
    at(&clock, Duration::from_secs(1));
    for (second, minute) in [(2, 1), (1, 0)] {
        let d = check_all(&backend, &stack, &key, 1);
        assert!(d[0].allowed && d[1].allowed);
        assert_eq!((d[0].remaining, d[1].remaining), (second, minute));
    }
    // Now the per-minute limit rejects, and the per-second limit keeps its last slot.
    let d = check_all(&backend, &stack, &key, 1);
    assert!(d[0].allowed);
    assert_eq!(d[0].remaining, 1);
    assert!(!d[1].allowed);
    assert_eq!(d[1].retry_after, Some(Duration::from_secs(59)));
    let combined = Decision::combine(&d).unwrap();
    assert!(!combined.allowed);
    assert_eq!(combined.retry_after, Some(Duration::from_secs(59)));
    // A request larger than one limit never passes and costs nothing.
    let d = check_all(&backend, &stack, &Key::from("bob"), 4);
    assert!(!d[0].allowed && d[0].retry_after.is_none());
    assert_eq!(d[1].remaining, 5);
    at(&clock, Duration::from_secs(60));
    let d = check_all(&backend, &stack, &key, 1);
    assert!(d[0].allowed && d[1].allowed);
    assert_eq!((d[0].remaining, d[1].remaining), (2, 4));
}

#[test]
fn a_gcra_stack_rejected_by_one_limit_records_nothing_in_the_others() {
    let (backend, clock) = backend(1_000);
    let stack = [
        Limit::new("gcra-second", Quota::per_second(3)).unwrap(),
        Limit::new("gcra-minute", Quota::per_minute(5)).unwrap(),
    ];
    let key = Key::from("alice");
    for (second, minute) in [(2, 4), (1, 3), (0, 2)] {
        let d = check_all(&backend, &stack, &key, 1);
        assert!(d[0].allowed && d[1].allowed);
        assert_eq!((d[0].remaining, d[1].remaining), (second, minute));
    }
    let d = check_all(&backend, &stack, &key, 1);
    assert!(!d[0].allowed);
    assert!(d[1].allowed);
    assert_eq!(d[1].remaining, 2, "the per-minute limit was not charged");
    // One second later the per-second limit is full again; the per-minute one has 2 left (its TAT
    // is 36 s ahead of 0, 35 s of its 60 s tolerance).
    at(&clock, Duration::from_secs(1));
    for (second, minute) in [(2, 1), (1, 0)] {
        let d = check_all(&backend, &stack, &key, 1);
        assert!(d[0].allowed && d[1].allowed);
        assert_eq!((d[0].remaining, d[1].remaining), (second, minute));
    }
    let d = check_all(&backend, &stack, &key, 1);
    assert!(d[0].allowed);
    assert_eq!(d[0].remaining, 1, "the per-second limit was not charged");
    assert!(!d[1].allowed);
    // The next unit of the per-minute limit is due 12 s after the TAT of 60 s, minus the tolerance.
    assert_eq!(d[1].retry_after, Some(Duration::from_secs(11)));
    at(&clock, Duration::from_secs(12));
    assert!(
        Decision::combine(&check_all(&backend, &stack, &key, 1))
            .unwrap()
            .allowed
    );
    assert!(
        !Decision::combine(&check_all(&backend, &stack, &key, 1))
            .unwrap()
            .allowed
    );
}

#[test]
fn a_mixed_stack_rolls_back_the_log_when_another_limit_rejects() {
    let (backend, clock) = backend(1_000);
    let stack = [
        Limit::new("mix-gcra", Quota::per_second(3)).unwrap(),
        limit("mix-log", Algorithm::SlidingLog, Quota::per_minute(4)),
        limit(
            "mix-sliding",
            Algorithm::SlidingWindow,
            Quota::per_minute(100),
        ),
    ];
    let key = Key::from("alice");
    for _ in 0..3 {
        assert!(check_all(&backend, &stack, &key, 1)
            .iter()
            .all(|d| d.allowed));
    }
    // The GCRA rejects 50 times: the log must not have grown.
    for _ in 0..50 {
        let d = check_all(&backend, &stack, &key, 1);
        assert!(!d[0].allowed && d[1].allowed && d[2].allowed);
        assert_eq!((d[1].remaining, d[2].remaining), (1, 97));
    }
    at(&clock, Duration::from_secs(1));
    let d = check_all(&backend, &stack, &key, 1);
    assert!(d.iter().all(|d| d.allowed));
    assert_eq!(d[1].remaining, 0);
    let d = check_all(&backend, &stack, &key, 1);
    assert!(d[0].allowed && !d[1].allowed && d[2].allowed);
    assert_eq!(d[1].retry_after, Some(Duration::from_secs(59)));
    assert_eq!(d[0].remaining, 2);
    // At 60 s the three units of t = 0 leave the log; the one of 1 s stays.
    at(&clock, Duration::from_secs(60));
    for _ in 0..3 {
        assert!(check_all(&backend, &stack, &key, 1)
            .iter()
            .all(|d| d.allowed));
    }
    let d = check_all(&backend, &stack, &key, 1);
    assert!(!d[0].allowed && !d[1].allowed);
}

#[test]
fn a_stack_may_hold_two_limits_of_one_name() {
    let (backend, _clock) = backend(1_000);
    let stack = [
        limit("same", Algorithm::FixedWindow, Quota::per_second(3)),
        limit("same", Algorithm::FixedWindow, Quota::per_minute(5)),
    ];
    let key = Key::from("alice");
    let d = check_all(&backend, &stack, &key, 2);
    assert_eq!((d[0].remaining, d[1].remaining), (1, 3));
    let d = check_all(&backend, &stack, &key, 1);
    assert_eq!((d[0].remaining, d[1].remaining), (0, 2));
    assert!(!check_all(&backend, &stack, &key, 1)[0].allowed);
}

#[test]
fn stacks_are_validated() {
    let (backend, _clock) = backend(1_000);
    let fixed = |i: usize| {
        limit(
            &format!("v{i}"),
            Algorithm::FixedWindow,
            Quota::per_second(1),
        )
    };
    let sixteen: Vec<Limit> = (0..16).map(fixed).collect();
    let seventeen: Vec<Limit> = (0..17).map(fixed).collect();
    let conc = limit("v-conc", Algorithm::Concurrency, Quota::per_second(1));
    assert!(backend.validate_all(&sixteen).is_ok());
    assert!(backend.validate_all(&seventeen).is_err());
    assert!(backend.validate_all(&[]).is_err());
    assert!(backend.validate_all(&[fixed(0), conc.clone()]).is_err());
    // One charge is a limit alone, whatever its algorithm: only a stack refuses a concurrency limit.
    assert!(backend.validate_all(std::slice::from_ref(&conc)).is_ok());
    let key = Key::from("k");
    assert!(now(backend.check_all(&seventeen, &key, 1)).is_err());
    assert!(now(backend.check_all(&[], &key, 1)).is_err());
    assert!(now(backend.check_all(&[fixed(0), conc.clone()], &key, 1)).is_err());
    assert!(backend
        .decide_charges(Charges::stack(std::slice::from_ref(&conc), &key, 1))
        .is_ok_and(|d| matches!(d, Decisions::One(d) if d.allowed)));
    backend.release(&conc, &key, 1, 0);
    // Sixteen limits decide together.
    let d = now(backend.check_all(&sixteen, &key, 1)).unwrap();
    assert_eq!(d.len(), 16);
    assert!(d.iter().all(|d| d.allowed && d.remaining == 0));
    assert_eq!(backend.len(), 1, "a stack is one entry per key");
    // Every algorithm is valid alone.
    for algorithm in [
        Algorithm::Gcra,
        Algorithm::SlidingLog,
        Algorithm::FixedWindow,
        Algorithm::SlidingWindow,
        Algorithm::Concurrency,
    ] {
        assert!(backend
            .validate_one(&limit("alone", algorithm, Quota::per_second(1)))
            .is_ok());
    }
    // A single limit in a stack is decided as decide does (a lone GCRA limit in the fast table).
    let gcra = Limit::new("v-gcra", Quota::per_second(1)).unwrap();
    assert!(
        backend
            .decide_charges(Charges::stack(std::slice::from_ref(&gcra), &key, 1))
            .unwrap()[0]
            .allowed
    );
    assert!(!backend.decide(&gcra, &key, 1).unwrap().allowed);
}

/// Windows are aligned on Unix time: the clock's origin counts.
#[test]
fn windows_align_on_the_clocks_unix_origin() {
    #[derive(Clone)]
    struct HalfPast(ManualClock);
    impl Clock for HalfPast {
        fn now_nanos(&self) -> u64 {
            self.0.now_nanos()
        }
        fn unix_origin_nanos(&self) -> u64 {
            1_700_000_000_500_000_000
        }
    }
    let manual = ManualClock::new();
    let backend = MemoryBackend::builder()
        .clock(HalfPast(manual.clone()))
        .shards(1)
        .build()
        .unwrap();
    let l = limit("aligned", Algorithm::FixedWindow, Quota::per_second(1));
    let key = Key::from("k");
    let d = check(&backend, &l, &key, 1);
    assert!(d.allowed);
    assert_eq!(
        d.reset_after,
        500 * MS,
        "the Unix second ends 500 ms after the origin"
    );
    at(&manual, Duration::from_nanos(499_999_999));
    assert!(!check(&backend, &l, &key, 1).allowed);
    // The entry expires at the Unix boundary, on the backend's own clock.
    backend.sweep();
    assert_eq!(backend.len(), 1);
    at(&manual, 500 * MS);
    backend.sweep();
    assert_eq!(backend.len(), 0);
    assert!(check(&backend, &l, &key, 1).allowed);
}

const THREADS: usize = 8;
const CALLS: usize = 200;

/// `THREADS` threads × `CALLS` calls of `decide` on one key with a frozen clock; how many passed.
fn admitted_under_contention(decide: impl Fn() -> bool + Sync) -> u64 {
    let admitted = AtomicU64::new(0);
    let barrier = Barrier::new(THREADS);
    std::thread::scope(|s| {
        for _ in 0..THREADS {
            s.spawn(|| {
                barrier.wait();
                for _ in 0..CALLS {
                    if decide() {
                        admitted.fetch_add(1, SeqCst);
                    }
                }
            });
        }
    });
    admitted.into_inner()
}

#[test]
fn every_algorithm_admits_exactly_the_limit_under_contention() {
    for algorithm in [
        Algorithm::FixedWindow,
        Algorithm::SlidingWindow,
        Algorithm::SlidingLog,
        Algorithm::Concurrency,
    ] {
        let (backend, clock) = backend(1_000);
        at(&clock, 1_234 * MS);
        let l = limit("contended", algorithm, Quota::per_minute(100));
        let key = Key::from("hot");
        let admitted = admitted_under_contention(|| backend.decide(&l, &key, 1).unwrap().allowed);
        assert_eq!(admitted, 100, "{algorithm}");
    }
    // Stacks: GCRA limits in the general store, and a mixed stack.
    let (backend, _clock) = backend(1_000);
    let gcra = [
        Limit::new("contended-g1", Quota::per_minute(100)).unwrap(),
        Limit::new("contended-g2", Quota::per_hour(150)).unwrap(),
    ];
    let key = Key::from("hot");
    let admitted = admitted_under_contention(|| {
        Decision::combine(
            &backend
                .decide_charges(Charges::stack(&gcra, &key, 1))
                .unwrap(),
        )
        .unwrap()
        .allowed
    });
    assert_eq!(admitted, 100);
    let mixed = [
        limit("contended-m1", Algorithm::SlidingLog, Quota::per_hour(70)),
        limit(
            "contended-m2",
            Algorithm::FixedWindow,
            Quota::per_minute(90),
        ),
        Limit::new("contended-m3", Quota::per_minute(80)).unwrap(),
    ];
    let admitted = admitted_under_contention(|| {
        Decision::combine(
            &backend
                .decide_charges(Charges::stack(&mixed, &key, 1))
                .unwrap(),
        )
        .unwrap()
        .allowed
    });
    assert_eq!(admitted, 70);
}

#[test]
fn concurrency_never_has_more_than_the_limit_in_flight() {
    let (backend, _clock) = backend(1_000);
    let l = limit("in-flight", Algorithm::Concurrency, Quota::per_second(3));
    let key = Key::from("hot");
    let in_flight = AtomicU64::new(0);
    let high_water = AtomicU64::new(0);
    let admitted = admitted_under_contention(|| {
        if !backend.decide(&l, &key, 1).unwrap().allowed {
            return false;
        }
        let now = in_flight.fetch_add(1, SeqCst) + 1;
        high_water.fetch_max(now, SeqCst);
        std::thread::yield_now();
        in_flight.fetch_sub(1, SeqCst);
        backend.release(&l, &key, 1, 0);
        true
    });
    let high_water = high_water.into_inner();
    assert!((1..=3).contains(&high_water), "{high_water}");
    assert!(admitted >= 3, "{admitted}");
    assert_eq!(backend.len(), 0, "every slot was given back");
}

#[test]
fn the_cap_holds_with_many_keys_and_never_forgets_requests_in_flight() {
    let (backend, clock) = backend(1_000);
    let conc = limit("cap-conc", Algorithm::Concurrency, Quota::per_second(1));
    // Nearly the whole cap in flight: fewer entries can be forgotten than the usual eighth.
    let held: Vec<Key> = (0..950u32)
        .map(|i| Key::from(format!("held-{i}")))
        .collect();
    for key in &held {
        assert!(check(&backend, &conc, key, 1).allowed);
    }
    let limits = [
        limit("cap-fixed", Algorithm::FixedWindow, Quota::per_minute(10)),
        limit(
            "cap-sliding",
            Algorithm::SlidingWindow,
            Quota::per_minute(10),
        ),
        limit("cap-log", Algorithm::SlidingLog, Quota::per_minute(10)),
    ];
    let stack = [
        Limit::new("cap-stack", Quota::per_minute(10)).unwrap(),
        limits[2].clone(),
    ];
    // A flood of distinct keys within one period.
    for i in 0..30_000u32 {
        clock.advance(Duration::from_micros(1));
        let key = Key::from(i);
        assert!(check(&backend, &limits[i as usize % 3], &key, 1).allowed);
        if i % 10 == 0 {
            assert!(check_all(&backend, &stack, &key, 1)
                .iter()
                .all(|d| d.allowed));
        }
        assert!(backend.len() <= 1_000, "{} keys at {i}", backend.len());
    }
    // Not one request in flight was forgotten.
    for key in &held {
        assert!(!check(&backend, &conc, key, 1).allowed);
    }
    for key in &held {
        backend.release(&conc, key, 1, 0);
    }
    assert!(held
        .iter()
        .all(|key| check(&backend, &conc, key, 1).allowed));
}

#[test]
fn the_cap_forgets_the_entries_that_use_the_least_of_their_limit() {
    let (backend, clock) = backend(1_000);
    let day = limit("cap-day", Algorithm::SlidingLog, Quota::per_day(10));
    let minute = limit("cap-minute", Algorithm::SlidingLog, Quota::per_minute(10));
    let daily: Vec<Key> = (0..500u32).map(|i| Key::from(format!("d{i}"))).collect();
    for key in &daily {
        assert!(check(&backend, &day, key, 10).allowed);
    }
    for i in 0..5_000u32 {
        clock.advance(Duration::from_micros(1));
        assert!(check(&backend, &minute, &Key::from(i), 1).allowed);
    }
    assert!(backend.len() <= 1_000);
    // The daily entries use their whole limit, so they are kept (their keys are still limited).
    let kept = daily
        .iter()
        .filter(|key| !check(&backend, &day, key, 1).allowed)
        .count();
    assert_eq!(kept, 500);
}

#[test]
fn at_the_cap_clients_being_limited_stay_limited_under_every_window_algorithm() {
    // Ranking by expiry would forget them first: a heavy sliding-log user expires before the light
    // keys logged after it, and every fixed-window entry of one window expires together. They are
    // ranked by the share of their limit in use instead, as in the GCRA table
    // (tests/memory/backend.rs: memory_is_bounded_by_the_cap_and_heavy_users_stay_limited).
    let (backend, clock) = backend(1_000);
    let limits = [
        limit("heavy-log", Algorithm::SlidingLog, Quota::per_minute(10)),
        limit("heavy-fixed", Algorithm::FixedWindow, Quota::per_minute(10)),
        limit(
            "heavy-sliding",
            Algorithm::SlidingWindow,
            Quota::per_minute(10),
        ),
    ];
    // A stack limited by its GCRA limit, the other one far from its own.
    let stack = [
        Limit::new("heavy-gcra", Quota::per_minute(10)).unwrap(),
        limit(
            "heavy-wide",
            Algorithm::FixedWindow,
            Quota::per_minute(1_000),
        ),
    ];
    let heavy = Key::from("heavy");
    for l in &limits {
        assert!(check(&backend, l, &heavy, 10).allowed);
        assert!(!check(&backend, l, &heavy, 1).allowed);
    }
    assert!(check_all(&backend, &stack, &heavy, 10)
        .iter()
        .all(|d| d.allowed));
    assert!(!check_all(&backend, &stack, &heavy, 1)[0].allowed);
    // An attacker rotating through fresh keys, one request each, within the same minute window.
    let n = 30_000u32;
    for i in 0..n {
        clock.advance(Duration::from_micros(1));
        let key = Key::from(i);
        assert!(check(&backend, &limits[i as usize % 3], &key, 1).allowed);
        assert!(backend.len() <= 1_000, "{} keys at {i}", backend.len());
    }
    // The limited clients were kept: still limited, with nothing left.
    for l in &limits {
        let d = check(&backend, l, &heavy, 1);
        assert!(!d.allowed, "{}", l.name());
        assert_eq!(d.remaining, 0, "{}", l.name());
    }
    assert!(!check_all(&backend, &stack, &heavy, 1)[0].allowed);
    // The fresh keys were the ones forgotten: they start over with a full quota (a peek, quantity
    // 0, shows it without recording anything).
    let forgotten = (0..n)
        .filter(|i| check(&backend, &limits[*i as usize % 3], &Key::from(*i), 0).remaining == 10)
        .count();
    assert!(forgotten >= 29_000, "{forgotten}");
}

#[test]
fn sweeps_drop_expired_entries_of_every_algorithm() {
    let (backend, clock) = backend(1_000_000);
    let limits = [
        limit("sweep-fixed", Algorithm::FixedWindow, Quota::per_second(10)),
        limit(
            "sweep-sliding",
            Algorithm::SlidingWindow,
            Quota::per_second(10),
        ),
        limit("sweep-log", Algorithm::SlidingLog, Quota::per_second(10)),
    ];
    let stack = [
        Limit::new("sweep-gcra", Quota::per_second(10)).unwrap(),
        limits[0].clone(),
    ];
    for i in 0..10_000u32 {
        let key = Key::from(i);
        assert!(check(&backend, &limits[i as usize % 3], &key, 1).allowed);
        assert!(check_all(&backend, &stack, &key, 1)
            .iter()
            .all(|d| d.allowed));
    }
    assert_eq!(backend.len(), 3_334 + 3_333 + 3_333 + 10_000);
    // At 1.5 s only the sliding windows still weigh their previous window.
    at(&clock, 1_500 * MS);
    backend.sweep();
    assert_eq!(backend.len(), 3_333);
    at(&clock, Duration::from_secs(2));
    backend.sweep();
    assert_eq!(backend.len(), 0);
    // Without calling sweep: the next decisions sweep the shard within a second.
    for i in 0..10_000u32 {
        assert!(check(&backend, &limits[i as usize % 3], &Key::from(i), 1).allowed);
    }
    assert_eq!(backend.len(), 10_000);
    at(&clock, Duration::from_secs(10));
    assert!(check(&backend, &limits[0], &Key::from("new"), 1).allowed);
    assert_eq!(backend.len(), 1);
}

#[test]
fn a_shared_backend_decides_every_algorithm_from_many_threads() {
    // One backend, one key, every algorithm (the GCRA in its table, the others in the general
    // store), with THREADS threads each asking every limit in turn, from a different start, so
    // that the stores are contended at once. On a frozen clock each admits exactly its 100.
    let (backend, clock) = backend(1_000);
    at(&clock, 1_234 * MS);
    let limits: Vec<Limit> = [
        Algorithm::Gcra,
        Algorithm::FixedWindow,
        Algorithm::SlidingWindow,
        Algorithm::SlidingLog,
        Algorithm::Concurrency,
    ]
    .into_iter()
    .map(|algorithm| {
        limit(
            &format!("shared-{algorithm}"),
            algorithm,
            Quota::per_minute(100),
        )
    })
    .collect();
    let key = Key::from("shared");
    let admitted: Vec<AtomicU64> = limits.iter().map(|_| AtomicU64::new(0)).collect();
    let barrier = Barrier::new(THREADS);
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let (backend, limits, key, admitted, barrier) =
                (&backend, &limits, &key, &admitted, &barrier);
            s.spawn(move || {
                barrier.wait();
                for i in 0..CALLS {
                    let n = (t + i) % limits.len();
                    if check(backend, &limits[n], key, 1).allowed {
                        admitted[n].fetch_add(1, SeqCst);
                    }
                }
            });
        }
    });
    for (l, admitted) in limits.iter().zip(&admitted) {
        // THREADS × CALLS / 5 = 320 asked each.
        assert_eq!(admitted.load(SeqCst), 100, "{}", l.algorithm());
    }
    // One entry per limit for the one key.
    assert_eq!(backend.len(), limits.len());
}

#[test]
fn requests_in_flight_may_hold_a_shard_past_the_cap() {
    let (backend, _clock) = backend(100);
    let conc = limit("past-cap", Algorithm::Concurrency, Quota::per_second(1));
    let keys: Vec<Key> = (0..150u32).map(Key::from).collect();
    // Forgetting any of them would admit a second request in flight: they are all kept.
    for key in &keys {
        assert!(check(&backend, &conc, key, 1).allowed);
    }
    assert_eq!(backend.len(), 150);
    assert!(keys
        .iter()
        .all(|key| !check(&backend, &conc, key, 1).allowed));
    // Released, they go at once, and the cap holds again.
    for key in &keys {
        backend.release(&conc, key, 1, 0);
    }
    assert_eq!(backend.len(), 0);
    let fixed = limit(
        "past-cap-fixed",
        Algorithm::FixedWindow,
        Quota::per_minute(1),
    );
    for key in (0..1_000u32).map(Key::from) {
        assert!(check(&backend, &fixed, &key, 1).allowed);
        assert!(backend.len() <= 100);
    }
}
