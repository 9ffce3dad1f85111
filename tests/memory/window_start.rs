//! `WindowStart::PerKey`: each key's fixed window starts at a phase of its own — the same for the
//! key every time, different across keys, with `Retry-After` and refunds on the key's own window,
//! and its entry expiring at the key's own boundary.

use std::collections::BTreeSet;
use std::time::Duration;

use crate::asks::Asks;
use tower_throttle::clock::ManualClock;
use tower_throttle::window::WindowStart;
use tower_throttle::{Algorithm, Key, Limit, MemoryBackend, Quota};

const PERIOD: Duration = Duration::from_secs(10);

fn per_key() -> Limit {
    Limit::with_algorithm(
        "fixed",
        Algorithm::FixedWindow,
        Quota::per_period(2, PERIOD),
    )
    .unwrap()
    .with_window_start(WindowStart::PerKey)
    .unwrap()
}

fn backend() -> (MemoryBackend<ManualClock>, ManualClock) {
    let clock = ManualClock::new();
    let backend = MemoryBackend::builder()
        .clock(clock.clone())
        .shards(1)
        .build()
        .unwrap();
    (backend, clock)
}

/// When `key`'s window ends, seen from now: the wait of its refusal.
fn wait_of(backend: &MemoryBackend<ManualClock>, limit: &Limit, key: &Key) -> Duration {
    while backend.decide(limit, key, 1).unwrap().allowed {}
    backend.decide(limit, key, 1).unwrap().retry_after.unwrap()
}

#[test]
fn each_key_has_its_own_boundary_the_same_every_time() {
    let (backend, _) = backend();
    let limit = per_key();
    let keys: Vec<Key> = (0..200).map(|i| Key::from(format!("user-{i}"))).collect();
    let waits: Vec<Duration> = keys.iter().map(|k| wait_of(&backend, &limit, k)).collect();
    // Spread over the period: 200 keys fall on many different boundaries (in whole 100 ms).
    let spread: BTreeSet<u128> = waits.iter().map(|w| w.as_millis() / 100).collect();
    assert!(spread.len() > 50, "{spread:?}");
    assert!(waits.iter().all(|w| *w > Duration::ZERO && *w <= PERIOD));
    // At its boundary each key gets its quota back, not a moment before.
    for (key, wait) in keys.iter().zip(&waits).take(20) {
        let (backend, clock) = self::backend();
        wait_of(&backend, &limit, key);
        clock.advance(*wait - Duration::from_micros(1));
        assert!(
            !backend.decide(&limit, key, 1).unwrap().allowed,
            "{key} a µs early"
        );
        clock.advance(Duration::from_micros(1));
        assert!(
            backend.decide(&limit, key, 1).unwrap().allowed,
            "{key} at its boundary"
        );
    }
    // The same key, 1,000 periods later, in another backend: the same phase.
    let (again, again_clock) = self::backend();
    again_clock.set(PERIOD * 1000);
    for (key, wait) in keys.iter().zip(&waits).take(20) {
        assert_eq!(wait_of(&again, &limit, key), *wait, "{key}");
    }
}

#[tokio::test]
async fn a_refund_goes_back_to_the_keys_own_window() {
    let (backend, clock) = backend();
    let limit = per_key();
    let key = Key::from("ann");
    let wait = wait_of(&backend, &limit, &key);
    // Given back within the key's window: one more passes.
    backend.refund(std::slice::from_ref(&limit), &key, 1, Duration::ZERO);
    assert!(backend.decide(&limit, &key, 1).unwrap().allowed);
    assert!(!backend.decide(&limit, &key, 1).unwrap().allowed);
    // Past the key's boundary the entry has expired: a sweep drops it.
    clock.advance(wait + Duration::from_secs(2));
    backend.sweep();
    assert!(backend.is_empty(), "{} entries left", backend.len());
}

#[test]
fn per_key_starts_are_only_for_the_fixed_window() {
    let sliding =
        Limit::with_algorithm("s", Algorithm::SlidingWindow, Quota::per_period(2, PERIOD)).unwrap();
    let error = sliding.with_window_start(WindowStart::PerKey).unwrap_err();
    assert_eq!(
        error.to_string(),
        r#"policy "s": window_start = "per-key" is for the fixed window, not sliding-window"#
    );
    // Limits that share a name must agree on it.
    let aligned = Limit::with_algorithm(
        "fixed",
        Algorithm::FixedWindow,
        Quota::per_period(2, PERIOD),
    )
    .unwrap();
    assert!(!aligned.same_rules(&per_key()));
}
