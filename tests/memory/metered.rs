//! Metered limits on the memory backend (`check_each`, `settle`): a reservation per limit, a cost
//! settled after the response that may leave the key in debt (capped), and refunds of an
//! over-estimate, exactly on a manual clock, for a lone limit (the GCRA table) and a stack (the
//! general store).

use std::time::Duration;
use tower_throttle::backend::Charges;

use crate::asks::Asks;
use crate::refund::backend;
use tower_throttle::clock::ManualClock;
use tower_throttle::{Key, Limit, MemoryBackend, Quota};

/// 10 tokens a second (one every 100 ms), metered with the default debt cap (10 tokens).
fn tokens() -> Limit {
    let limit = Limit::new("tokens", Quota::per_second(10)).unwrap();
    let debt = limit.max_debt();
    limit.with_max_debt(debt)
}

fn requests() -> Limit {
    Limit::new("requests", Quota::per_second(100)).unwrap()
}

/// The stacks a metered limit is decided in: alone (the GCRA table) and after a request limit
/// (the general store), with the metered limit's position.
fn stacks() -> [(Vec<Limit>, usize); 2] {
    [(vec![tokens()], 0), (vec![requests(), tokens()], 1)]
}

/// Reserves `estimate` under the metered limit (1 under any other), as the middleware does.
fn reserve(
    backend: &MemoryBackend<ManualClock>,
    limits: &[Limit],
    at: usize,
    estimate: u64,
) -> bool {
    let quantities: Vec<u64> = (0..limits.len())
        .map(|i| if i == at { estimate } else { 1 })
        .collect();
    let decisions = backend
        .decide_charges(Charges::stack(limits, &Key::from("k"), 0).with_quantities(&quantities))
        .unwrap();
    decisions.iter().all(|d| d.allowed)
}

fn settle(backend: &MemoryBackend<ManualClock>, limits: &[Limit], at: usize, delta: i64) {
    let mut deltas = vec![0; limits.len()];
    deltas[at] = delta;
    backend.settle(limits, &Key::from("k"), &deltas, Duration::ZERO);
}

/// The metered limit's decision for one more token now.
fn next(
    backend: &MemoryBackend<ManualClock>,
    limits: &[Limit],
    at: usize,
) -> tower_throttle::Decision {
    let mut quantities = vec![0; limits.len()];
    quantities[at] = 1;
    backend
        .decide_charges(Charges::stack(limits, &Key::from("k"), 0).with_quantities(&quantities))
        .unwrap()[at]
}

/// What the metered limit has left now (a quantity of 0 takes nothing).
fn remaining(backend: &MemoryBackend<ManualClock>, limits: &[Limit], at: usize) -> u64 {
    let quantities = vec![0; limits.len()];
    backend
        .decide_charges(Charges::stack(limits, &Key::from("k"), 0).with_quantities(&quantities))
        .unwrap()[at]
        .remaining
}

#[test]
fn the_memory_backend_settles() {
    assert!(MemoryBackend::new().can_settle());
}

#[test]
fn debt_is_refused_until_it_is_paid_back_exactly() {
    for (limits, at) in stacks() {
        let (backend, clock) = backend();
        // Reserve 2, use 16: 14 more, 6 past the burst of 10 (within the cap of 10).
        assert!(reserve(&backend, &limits, at, 2));
        settle(&backend, &limits, at, 14);
        let refused = next(&backend, &limits, at);
        assert!(!refused.allowed);
        assert_eq!(refused.remaining, 0, "debt shows as nothing left");
        // 16 tokens ahead, 10 allowed: the 17th fits once 7 have drained.
        assert_eq!(refused.retry_after, Some(Duration::from_millis(700)));
        assert_eq!(refused.reset_after, Duration::from_millis(1600));
        clock.advance(Duration::from_millis(700) - Duration::from_nanos(1));
        assert!(!next(&backend, &limits, at).allowed, "one ns early");
        clock.advance(Duration::from_nanos(1));
        assert!(
            reserve(&backend, &limits, at, 1),
            "passes when the debt is paid"
        );
    }
}

#[test]
fn debt_is_capped_at_max_debt() {
    for (limits, at) in stacks() {
        let (backend, _clock) = backend();
        assert!(reserve(&backend, &limits, at, 1));
        // A runaway request: a million tokens, capped at 10 past the burst of 10.
        settle(&backend, &limits, at, 1_000_000);
        let refused = next(&backend, &limits, at);
        assert_eq!(refused.reset_after, Duration::from_secs(2));
        assert_eq!(refused.retry_after, Some(Duration::from_millis(1100)));
    }
    // A cap of 0 forgets debt (Gubernator's DRAIN_OVER_LIMIT): the bucket is only empty.
    let (backend, _clock) = backend();
    let limits = [Limit::new("tokens", Quota::per_second(10))
        .unwrap()
        .with_max_debt(0)];
    assert!(reserve(&backend, &limits, 0, 1));
    settle(&backend, &limits, 0, 1_000);
    assert_eq!(
        next(&backend, &limits, 0).retry_after,
        Some(Duration::from_millis(100))
    );
}

#[test]
fn an_over_estimate_is_given_back() {
    for (limits, at) in stacks() {
        let (backend, _clock) = backend();
        assert!(reserve(&backend, &limits, at, 8));
        assert_eq!(remaining(&backend, &limits, at), 2);
        // Used 3 of 8: 5 back.
        settle(&backend, &limits, at, -5);
        assert_eq!(remaining(&backend, &limits, at), 7);
        // Giving back more than was taken never goes past a full bucket.
        settle(&backend, &limits, at, -100);
        assert_eq!(remaining(&backend, &limits, at), 10);
        // Nothing to give back on a key with no state, and no state is made.
        let before = backend.len();
        backend.settle(
            &limits,
            &Key::from("nobody"),
            &vec![-3; limits.len()],
            Duration::ZERO,
        );
        assert_eq!(backend.len(), before);
    }
}

#[test]
fn a_refund_gives_back_less_the_time_since_the_reservation() {
    for (limits, at) in stacks() {
        let (backend, clock) = backend();
        assert!(reserve(&backend, &limits, at, 10));
        clock.advance(Duration::from_millis(300));
        // 3 tokens drained while the request ran; of 5 given back, 300 ms' worth is not.
        let mut deltas = vec![0; limits.len()];
        deltas[at] = -5;
        backend.settle(
            &limits,
            &Key::from("k"),
            &deltas,
            Duration::from_millis(300),
        );
        // 10 - 3 drained = 7 ahead, minus (500 - 300) ms = 5 ahead: 5 remaining.
        assert_eq!(remaining(&backend, &limits, at), 5);
    }
}

/// Told the reservation's decisions, a settlement gives back all it can: the key stayed busy
/// without the units given back, so none of them drained, and the state is what it would be had the
/// request reserved its real cost.
#[test]
fn a_refund_told_the_reservations_reset_after_gives_back_what_never_drained() {
    for (limits, at) in stacks() {
        let (backend, clock) = backend();
        let quantities: Vec<u64> = (0..limits.len())
            .map(|i| if i == at { 10 } else { 1 })
            .collect();
        let key = Key::from("k");
        let charges = Charges::stack(&limits, &key, 0).with_quantities(&quantities);
        let decisions = backend.decide_charges(charges).unwrap();
        assert_eq!(decisions[at].reset_after, Duration::from_secs(1));
        clock.advance(Duration::from_millis(300));
        let mut deltas = vec![0; limits.len()];
        deltas[at] = -5;
        let since = Duration::from_millis(300);
        backend.settle_told(&limits, &key, &deltas, (since, &decisions));
        // Had it reserved 5: 500 ms ahead, 300 ms on: 200 ms ahead, 8 remaining (5 untold).
        assert_eq!(remaining(&backend, &limits, at), 8);
    }
}

#[test]
fn a_charge_on_a_key_that_reserved_nothing_is_recorded() {
    for (limits, at) in stacks() {
        let (backend, clock) = backend();
        // An estimate of 0 takes nothing (and a lone limit stores nothing).
        assert!(reserve(&backend, &limits, at, 0));
        settle(&backend, &limits, at, 4);
        assert_eq!(remaining(&backend, &limits, at), 6);
        clock.advance(Duration::from_secs(1));
        assert_eq!(remaining(&backend, &limits, at), 10);
    }
}

#[test]
fn the_other_limits_of_a_stack_take_the_request_cost() {
    let (backend, _clock) = backend();
    let limits = [requests(), tokens()];
    let key = Key::from("k");
    let decisions = backend
        .decide_charges(Charges::stack(&limits, &key, 0).with_quantities(&[1, 10]))
        .unwrap();
    assert!(decisions.iter().all(|d| d.allowed));
    assert_eq!((decisions[0].remaining, decisions[1].remaining), (99, 0));
    // The token limit refuses the next: nothing is taken from the request limit either.
    let refused = backend
        .decide_charges(Charges::stack(&limits, &key, 0).with_quantities(&[1, 1]))
        .unwrap();
    assert!(!refused[1].allowed);
    assert_eq!(refused[0].remaining, 99);
    assert!(
        backend
            .decide_charges(Charges::stack(&limits, &key, 0).with_quantities(&[1]))
            .is_err(),
        "a quantity per limit"
    );
}

#[test]
fn a_limit_without_a_debt_cap_set_is_read_as_before() {
    // Without `with_max_debt` (not metered), a TAT beyond the tolerance is another quota's state:
    // a full bucket, as the Redis scripts read it.
    let (backend, _clock) = backend();
    let plain = [Limit::new("plain", Quota::per_second(10)).unwrap()];
    assert!(!plain[0].is_metered());
    assert!(reserve(&backend, &plain, 0, 1));
    settle(&backend, &plain, 0, 15);
    assert_eq!(
        next(&backend, &plain, 0).retry_after,
        Some(Duration::from_millis(100))
    );
}

/// A settlement's negative delta on a window limit gives units back as a refund does (the Redis
/// backend's settle.lua does too); a positive one charges only a GCRA limit.
#[tokio::test]
async fn a_negative_settlement_gives_a_window_limit_its_units_back() {
    use tower_throttle::Algorithm;
    let backend = MemoryBackend::new();
    let key = Key::from("k");
    for algorithm in [
        Algorithm::FixedWindow,
        Algorithm::SlidingWindow,
        Algorithm::SlidingLog,
    ] {
        let limit = Limit::with_algorithm("settled", algorithm, Quota::per_hour(5)).unwrap();
        let limits = [limit];
        assert!(backend.check_each(&limits, &key, &[4]).await.unwrap()[0].allowed);
        backend.settle(&limits, &key, &[-3], Duration::from_secs(1));
        let left = backend.check_one(&limits[0], &key, 0).await.unwrap();
        assert_eq!(left.remaining, 4, "{algorithm}");
        backend.reset_all(&limits, &key).await.unwrap();
    }
}
