//! `Backend::peek` and `Backend::reset` on the memory backend, every algorithm and a stack: a peek
//! consumes nothing (many peeks, then the full quota still passes), and a reset gives the full quota
//! back. On a manual clock, so that no window turns over during a test.

use std::time::Duration;

use crate::asks::Asks;
use tower_throttle::clock::ManualClock;
use tower_throttle::{backend::KeyState, Algorithm, Backend, Key, Limit, MemoryBackend, Quota};

fn backend() -> MemoryBackend<ManualClock> {
    MemoryBackend::builder()
        .clock(ManualClock::new())
        .build()
        .unwrap()
}

async fn peek<B: Backend>(backend: &B, limits: &[Limit], key: &Key) -> Vec<KeyState> {
    let states = backend.peek_all(limits, key).await.unwrap();
    assert_eq!(states.len(), limits.len());
    states
}

/// Admits one request of cost 1 (through `check` for one limit, `check_all` for a stack).
async fn admitted<B: Backend>(backend: &B, limits: &[Limit], key: &Key) -> bool {
    match limits {
        [one] => backend.check_one(one, key, 1).await.unwrap().allowed,
        stack => backend
            .check_all(stack, key, 1)
            .await
            .unwrap()
            .iter()
            .all(|d| d.allowed),
    }
}

/// The whole story for one limit or stack: fresh state, peeks that consume nothing, the quota spent,
/// the peek of a limited key, a reset, and the quota again.
async fn peek_then_reset<B: Backend>(backend: &B, limits: &[Limit], key: &Key) {
    let quota = limits.iter().map(|l| l.max_cost()).min().unwrap();
    for (limit, state) in limits.iter().zip(peek(backend, limits, key).await) {
        assert_eq!(state.limit, limit.max_cost(), "{}", limit.name());
        assert_eq!(state.remaining, limit.max_cost(), "{}", limit.name());
        assert_eq!(state.retry_after, None, "{}", limit.name());
        assert_eq!(state.banned, None);
        assert!(!state.is_limited());
    }
    for _ in 0..25 {
        peek(backend, limits, key).await;
    }
    for i in 0..quota {
        assert!(
            admitted(backend, limits, key).await,
            "request {i} of {quota}"
        );
        let states = peek(backend, limits, key).await;
        let remaining = states.iter().map(|s| s.remaining).min().unwrap();
        assert_eq!(remaining, quota - i - 1, "after request {i}");
    }
    assert!(!admitted(backend, limits, key).await, "over the quota");
    let states = peek(backend, limits, key).await;
    let tight = states
        .iter()
        .find(|s| s.remaining == 0)
        .expect("a limit is spent");
    assert!(tight.retry_after.is_some(), "{tight:?}");
    assert!(tight.is_limited());
    // Peeking at a limited key does not change it either.
    assert_eq!(peek(backend, limits, key).await, states);

    backend.reset_all(limits, key).await.unwrap();
    for (limit, state) in limits.iter().zip(peek(backend, limits, key).await) {
        assert_eq!(
            state.remaining,
            limit.max_cost(),
            "{} after reset",
            limit.name()
        );
        assert_eq!(state.retry_after, None);
    }
    for i in 0..quota {
        assert!(
            admitted(backend, limits, key).await,
            "request {i} after reset"
        );
    }
    assert!(!admitted(backend, limits, key).await);
}

fn every_algorithm() -> Vec<Vec<Limit>> {
    let one = |name: &str, algorithm| {
        vec![Limit::with_algorithm(name, algorithm, Quota::per_minute(5)).unwrap()]
    };
    vec![
        one("gcra", Algorithm::Gcra),
        one("log", Algorithm::SlidingLog),
        one("fixed", Algorithm::FixedWindow),
        one("sliding", Algorithm::SlidingWindow),
        one("conc", Algorithm::Concurrency),
        vec![
            Limit::new("stack.1m", Quota::per_minute(4)).unwrap(),
            Limit::with_algorithm("stack.1d", Algorithm::FixedWindow, Quota::per_day(6)).unwrap(),
        ],
        vec![
            Limit::with_algorithm("stack2.1h", Algorithm::SlidingLog, Quota::per_hour(7)).unwrap(),
            Limit::new("stack2.1m", Quota::per_minute(3)).unwrap(),
        ],
    ]
}

#[tokio::test]
async fn peek_consumes_nothing_and_reset_restores_the_quota_for_every_algorithm() {
    let backend = backend();
    for limits in every_algorithm() {
        for key in [
            Key::from("alice"),
            Key::from_ip("192.0.2.7".parse().unwrap()),
            Key::from_ip("2001:db8::1".parse().unwrap()),
        ] {
            peek_then_reset(&backend, &limits, &key).await;
        }
    }
}

#[tokio::test]
async fn a_peek_writes_nothing_and_a_reset_touches_only_its_key() {
    let backend = backend();
    let limits = every_algorithm();
    for stack in &limits {
        peek(&backend, stack, &Key::from("nobody")).await;
    }
    assert_eq!(backend.len(), 0, "peeks at unknown keys store nothing");
    let gcra = &limits[0];
    for who in ["a", "b"] {
        assert!(admitted(&backend, gcra, &Key::from(who)).await);
    }
    backend.reset_all(gcra, &Key::from("a")).await.unwrap();
    assert_eq!(peek(&backend, gcra, &Key::from("a")).await[0].remaining, 5);
    assert_eq!(peek(&backend, gcra, &Key::from("b")).await[0].remaining, 4);
    // Resetting a key that has no state is fine.
    backend.reset_all(gcra, &Key::from("never")).await.unwrap();
}

#[tokio::test]
async fn a_peek_reports_when_the_next_request_passes() {
    let clock = ManualClock::new();
    let backend = MemoryBackend::builder()
        .clock(clock.clone())
        .build()
        .unwrap();
    let limit = [Limit::new("api", Quota::per_second(2)).unwrap()];
    let key = Key::from("k");
    assert!(admitted(&backend, &limit, &key).await);
    assert!(admitted(&backend, &limit, &key).await);
    let state = peek(&backend, &limit, &key).await[0];
    assert_eq!(state.remaining, 0);
    assert_eq!(state.retry_after, Some(Duration::from_millis(500)));
    assert_eq!(state.reset_after, Duration::from_secs(1));
    clock.advance(Duration::from_millis(500));
    let state = peek(&backend, &limit, &key).await[0];
    assert_eq!((state.remaining, state.retry_after), (1, None));
}

/// A reset deletes its own key's record and no other, however many keys share a table (records
/// whose hashes share the table's 7-bit tag are compared by limit and key, both).
#[tokio::test]
async fn a_reset_among_thousands_of_keys_deletes_only_its_own() {
    let backend = backend();
    let gcra = [Limit::new("gcra", Quota::per_minute(5)).unwrap()];
    let other = [Limit::new("other", Quota::per_minute(5)).unwrap()];
    let keys: Vec<Key> = (0..2000u32)
        .flat_map(|i| {
            [
                Key::from(format!("user-{i}")),
                Key::from_ip(std::net::Ipv4Addr::from(0x0a00_0000 + i).into()),
                Key::from_ip(
                    std::net::Ipv6Addr::from(0x2001_0db8_u128 << 96 | u128::from(i)).into(),
                ),
            ]
        })
        .collect();
    for key in &keys {
        assert!(admitted(&backend, &gcra, key).await);
        assert!(admitted(&backend, &other, key).await);
    }
    // Every other key is reset, for one of the two limits.
    for key in keys.iter().step_by(2) {
        backend.reset_all(&gcra, key).await.unwrap();
    }
    for (i, key) in keys.iter().enumerate() {
        let expected = if i % 2 == 0 { 5 } else { 4 };
        assert_eq!(
            peek(&backend, &gcra, key).await[0].remaining,
            expected,
            "{key:?}"
        );
        assert_eq!(peek(&backend, &other, key).await[0].remaining, 4, "{key:?}");
    }
}
