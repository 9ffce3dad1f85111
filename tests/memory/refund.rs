//! Refunds (counting by outcome) on the memory backend: every algorithm gives back what a request
//! took while it still counts, and never more.

use std::time::Duration;
use tower_throttle::backend::Charges;

use crate::asks::Asks;
use tower_throttle::clock::ManualClock;
use tower_throttle::{Algorithm, Key, Limit, MemoryBackend, Quota};

pub(crate) fn backend() -> (MemoryBackend<ManualClock>, ManualClock) {
    let clock = ManualClock::new();
    // Away from zero, so that "at most `since` ago" never reaches before the clock's origin.
    clock.advance(Duration::from_secs(1000));
    let backend = MemoryBackend::builder()
        .clock(clock.clone())
        .build()
        .unwrap();
    (backend, clock)
}

/// How many of `n` requests of one unit pass now.
fn admitted(backend: &MemoryBackend<ManualClock>, limits: &[Limit], key: &Key, n: u32) -> u32 {
    (0..n)
        .filter(|_| {
            backend
                .decide_charges(Charges::stack(limits, key, 1))
                .unwrap()[0]
                .allowed
        })
        .count() as u32
}

#[test]
fn every_algorithm_gives_back_a_refunded_unit() {
    assert!(MemoryBackend::new().can_refund());
    let algorithms = [
        Algorithm::Gcra,
        Algorithm::SlidingLog,
        Algorithm::FixedWindow,
        Algorithm::SlidingWindow,
    ];
    for algorithm in algorithms {
        let (backend, clock) = backend();
        let limit = [Limit::with_algorithm("r", algorithm, Quota::per_minute(3)).unwrap()];
        let key = Key::from("alice");
        assert_eq!(admitted(&backend, &limit, &key, 5), 3, "{algorithm}");
        clock.advance(Duration::from_millis(10));
        backend.refund(&limit, &key, 2, Duration::from_millis(10));
        assert_eq!(
            admitted(&backend, &limit, &key, 5),
            2,
            "{algorithm}: two given back"
        );
        // Refunding a key that has nothing, or more than it has, never goes below empty.
        backend.refund(&limit, &Key::from("nobody"), 1, Duration::ZERO);
        backend.refund(&limit, &key, 100, Duration::from_millis(10));
        assert_eq!(
            admitted(&backend, &limit, &key, 5),
            3,
            "{algorithm}: back to full, not more"
        );
    }
}

#[test]
fn a_stack_is_refunded_in_every_limit() {
    let (backend, clock) = backend();
    let stack = [
        Limit::new("s.1m", Quota::per_minute(2)).unwrap(),
        Limit::with_algorithm("s.1h", Algorithm::FixedWindow, Quota::per_hour(3)).unwrap(),
    ];
    let key = Key::from("bob");
    assert_eq!(admitted(&backend, &stack, &key, 3), 2);
    clock.advance(Duration::from_millis(5));
    backend.refund(&stack, &key, 2, Duration::from_millis(5));
    // Both limits gave the units back: two more pass, and then the hourly limit (3) stops them.
    assert_eq!(admitted(&backend, &stack, &key, 3), 2);
    let decisions = backend
        .decide_charges(Charges::stack(&stack, &key, 1))
        .unwrap();
    assert!(!decisions[0].allowed);
}

#[test]
fn units_of_an_earlier_window_are_not_refunded_from_the_current_one() {
    let (backend, clock) = backend();
    let limit = [Limit::with_algorithm("w", Algorithm::FixedWindow, Quota::per_second(2)).unwrap()];
    let key = Key::from("carol");
    assert_eq!(admitted(&backend, &limit, &key, 2), 2);
    clock.advance(Duration::from_secs(1));
    assert_eq!(admitted(&backend, &limit, &key, 2), 2);
    // A request admitted 1.5 s ago counted in a window that has ended: nothing to give back now.
    backend.refund(&limit, &key, 1, Duration::from_millis(1500));
    assert_eq!(admitted(&backend, &limit, &key, 1), 0);
}

#[test]
fn a_sliding_log_gives_back_the_oldest_units_it_may_have_logged() {
    let (backend, clock) = backend();
    let limit = [Limit::with_algorithm("l", Algorithm::SlidingLog, Quota::per_second(2)).unwrap()];
    let key = Key::from("dave");
    assert_eq!(admitted(&backend, &limit, &key, 1), 1);
    clock.advance(Duration::from_millis(600));
    assert_eq!(admitted(&backend, &limit, &key, 1), 1);
    // The second request (admitted 0 ms ago) is refunded: the first one's unit stays, and leaves
    // the window 400 ms later.
    backend.refund(&limit, &key, 1, Duration::ZERO);
    assert_eq!(admitted(&backend, &limit, &key, 2), 1);
    clock.advance(Duration::from_millis(400));
    assert_eq!(admitted(&backend, &limit, &key, 2), 1);
}

/// A refund never gives back more than the request took, even when another request came while it
/// was in flight: A (to be refunded) fills an empty bucket at t = 0, B (counted) comes at 0.89 s and
/// A is refunded at 0.9 s. Had A never come, B would have found the bucket idle: its TAT would be
/// 1.89 s. Moving the TAT back by A's whole interval would leave 1 s, and B would have cost only
/// 0.11 of a unit — a way to slip extra counted requests between refunded ones.
#[test]
fn a_gcra_refund_gives_back_no_more_than_the_request_took() {
    let (backend, clock) = backend();
    let limit = [Limit::new("r", Quota::per_second(1).bursts_of(2)).unwrap()];
    let key = Key::from("mallory");
    assert!(
        backend
            .decide_charges(Charges::stack(&limit, &key, 1))
            .unwrap()[0]
            .allowed
    ); // A
    clock.advance(Duration::from_millis(890));
    assert!(
        backend
            .decide_charges(Charges::stack(&limit, &key, 1))
            .unwrap()[0]
            .allowed
    ); // B
    clock.advance(Duration::from_millis(10));
    backend.refund(&limit, &key, 1, Duration::from_millis(900)); // A's
                                                                 // As if only B had come at 0.89 s: one more now (the burst's second), then nothing until
                                                                 // 1.89 s less the tolerance.
    let after = backend.peek_now(Charges::stack(&limit, &key, 0)).unwrap()[0];
    let without_a = Duration::from_millis(1890) - Duration::from_millis(900);
    assert!(
        after.reset_after >= without_a,
        "refunded more than A took: reset after {:?}, at least {without_a:?} without A",
        after.reset_after
    );
    // With no request in between, a refund is whole: the bucket is as if A never came.
    let (fresh, clock) = self::backend();
    assert!(
        fresh
            .decide_charges(Charges::stack(&limit, &key, 1))
            .unwrap()[0]
            .allowed
    );
    clock.advance(Duration::from_millis(5));
    fresh.refund(&limit, &key, 1, Duration::from_millis(5));
    assert_eq!(
        fresh.peek_now(Charges::stack(&limit, &key, 0)).unwrap()[0].remaining,
        2
    );
}

#[test]
fn a_sliding_window_gives_back_units_of_the_previous_window_from_it() {
    let (backend, clock) = backend();
    let limit =
        [Limit::with_algorithm("s", Algorithm::SlidingWindow, Quota::per_minute(3)).unwrap()];
    let key = Key::from("alice");
    // 3 admitted at 1000 s, in the window [960 s, 1020 s).
    assert_eq!(admitted(&backend, &limit, &key, 3), 3);
    // 1 s into the next window they still weigh 3 × 59/60: nothing passes.
    clock.advance(Duration::from_secs(21));
    assert_eq!(admitted(&backend, &limit, &key, 1), 0);
    // Given back from the previous window's count, where they were admitted.
    backend.refund(&limit, &key, 3, Duration::from_secs(21));
    assert_eq!(admitted(&backend, &limit, &key, 4), 3);
}

/// Releases and refunds for keys that hold nothing, among thousands that do, change nothing: the
/// store finds an entry by its limit and its key (a mutant that matched on either let a stranger's
/// release free another key's slot, or its refund give back another key's unit, whenever their
/// hashes met in one bucket; mutation testing found no test that noticed).
#[test]
fn strangers_releases_and_refunds_move_no_other_key() {
    let (backend, _clock) = backend();
    let slots =
        Limit::with_algorithm("among", Algorithm::Concurrency, Quota::per_second(1)).unwrap();
    let window =
        [Limit::with_algorithm("among-w", Algorithm::FixedWindow, Quota::per_hour(1)).unwrap()];
    let holds = |key: &Key| !backend.decide(&slots, key, 1).unwrap().allowed;
    let users: Vec<Key> = (0..3000u32)
        .map(|i| Key::from(format!("user-{i}")))
        .collect();
    for key in &users {
        assert!(backend.decide(&slots, key, 1).unwrap().allowed);
        assert_eq!(admitted(&backend, &window, key, 1), 1);
    }
    for i in 0..3000u32 {
        let stranger = Key::from(format!("stranger-{i}"));
        backend.release(&slots, &stranger, 1, 0);
        backend.refund(&window, &stranger, 1, Duration::ZERO);
    }
    for key in &users {
        assert!(holds(key), "{key:?}: its slot was freed");
        assert_eq!(
            admitted(&backend, &window, key, 1),
            0,
            "{key:?}: its unit was given back"
        );
    }
}
