//! The in-memory backend: eviction, the cap, exactness under concurrency, parity with governor.

use std::sync::Arc;
use std::time::Duration;

use tower_throttle::clock::ManualClock;
use tower_throttle::{Key, Limit, MemoryBackend, Quota};

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

#[test]
fn idle_keys_are_evicted_without_any_call() {
    let (backend, clock) = backend(1_000_000);
    let limit = Limit::new("evict", Quota::per_second(10)).unwrap();
    for i in 0..10_000u32 {
        assert!(backend.decide(&limit, &Key::from(i), 1).unwrap().allowed);
    }
    assert_eq!(backend.len(), 10_000);
    // Every key refills within 1 s; 2 s later, the next decisions sweep the shard.
    clock.advance(Duration::from_secs(2));
    assert!(
        backend
            .decide(&limit, &Key::from("new"), 1)
            .unwrap()
            .allowed
    );
    assert_eq!(backend.len(), 1);
    // And a key whose state expired decides like a new key.
    assert_eq!(
        backend
            .decide(&limit, &Key::from(5u32), 1)
            .unwrap()
            .remaining,
        9
    );
}

#[test]
fn memory_is_bounded_by_the_cap_and_heavy_users_stay_limited() {
    let (backend, clock) = backend(1_000);
    let limit = Limit::new("cap", Quota::per_minute(10)).unwrap();
    // A legitimate heavy user exhausts their quota.
    let heavy = Key::from("heavy");
    for _ in 0..10 {
        assert!(backend.decide(&limit, &heavy, 1).unwrap().allowed);
    }
    assert!(!backend.decide(&limit, &heavy, 1).unwrap().allowed);
    // A flood of 100,000 distinct keys within one refill period.
    for i in 0..100_000u32 {
        clock.advance(Duration::from_micros(1));
        assert!(backend.decide(&limit, &Key::from(i), 1).unwrap().allowed);
        assert!(backend.len() <= 1_000);
    }
    // The heavy user's state was kept: still limited.
    assert!(!backend.decide(&limit, &heavy, 1).unwrap().allowed);
    // Keys forgotten at the cap start over with a full burst (documented behaviour); a peek
    // (quantity 0) shows it without changing anything.
    let forgotten = (0..100_000u32)
        .filter(|i| backend.decide(&limit, &Key::from(*i), 0).unwrap().remaining == 10)
        .count();
    assert!(forgotten >= 99_000, "{forgotten}");
}

#[test]
fn at_the_cap_keys_are_ranked_by_the_share_of_their_own_limit() {
    // A per-second limit and a per-hour limit share one backend. Keys of the per-hour limit always
    // refill later in absolute time; a limited per-second user must still outrank them.
    let (backend, clock) = backend(1_000);
    let api = Limit::new("api", Quota::per_second(10)).unwrap();
    let login = Limit::new("login", Quota::per_hour(5)).unwrap();
    let abuser = Key::from("abuser");
    for _ in 0..10 {
        assert!(backend.decide(&api, &abuser, 1).unwrap().allowed);
    }
    for i in 0..5_000u32 {
        if i % 5 == 0 {
            clock.advance(Duration::from_micros(1));
        }
        backend.decide(&login, &Key::from(i), 1).unwrap();
    }
    assert!(backend.len() <= 1_000);
    assert!(!backend.decide(&api, &abuser, 1).unwrap().allowed);
}

#[test]
fn at_the_cap_the_key_nearest_to_refilled_goes_first_even_among_ties() {
    let (backend, clock) = backend(100);
    let limit = Limit::new("ties", Quota::per_minute(10)).unwrap();
    backend.decide(&limit, &Key::from("old"), 1).unwrap();
    clock.advance(Duration::from_secs(3));
    // 99 keys with identical TATs fill the shard, then one more forces an eviction.
    for i in 0..100u32 {
        backend.decide(&limit, &Key::from(i), 1).unwrap();
    }
    assert!(backend.len() <= 100);
    assert_eq!(
        backend
            .decide(&limit, &Key::from("old"), 0)
            .unwrap()
            .remaining,
        10,
        "forgotten"
    );
    assert_eq!(
        backend
            .decide(&limit, &Key::from(99u32), 0)
            .unwrap()
            .remaining,
        9,
        "kept"
    );
}

#[test]
fn bad_sizes_are_errors() {
    let err =
        |b: tower_throttle::backend::MemoryBackendBuilder<_>| b.build().unwrap_err().to_string();
    assert!(err(MemoryBackend::builder().max_keys(0)).contains("max_keys"));
    assert!(err(MemoryBackend::builder().shards(0)).contains("shards"));
    assert!(err(MemoryBackend::builder().shards(usize::MAX)).contains("shards"));
    assert!(err(MemoryBackend::builder().max_keys(10).shards(64)).contains("at most max_keys"));
    // Small caps are exact: never more keys than max_keys.
    let clock = ManualClock::new();
    let b = MemoryBackend::builder()
        .clock(clock)
        .max_keys(10)
        .shards(4)
        .build()
        .unwrap();
    let limit = Limit::new("small", Quota::per_hour(1)).unwrap();
    for i in 0..1_000u32 {
        b.decide(&limit, &Key::from(i), 1).unwrap();
        assert!(b.len() <= 10);
    }
}

#[test]
fn exact_under_concurrency() {
    // A frozen clock: exactly the limit passes, however the threads interleave.
    let (backend, _clock) = backend(1_000);
    let backend = Arc::new(backend);
    let limit = Arc::new(Limit::new("race", Quota::per_minute(16).with_max_burst(15)).unwrap());
    let threads: Vec<_> = (0..8)
        .map(|_| {
            let (backend, limit) = (backend.clone(), limit.clone());
            std::thread::spawn(move || {
                (0..5_000)
                    .filter(|_| backend.decide(&limit, &Key::from("k"), 1).unwrap().allowed)
                    .count()
            })
        })
        .collect();
    let admitted: usize = threads.into_iter().map(|t| t.join().unwrap()).sum();
    assert_eq!(admitted, 16);
}

/// Sixteen threads, as on a sixteen-core server: on one hot key, and on 64 keys spread over every
/// shard of the default layout, each thread starting at another key, exactly each key's limit
/// passes (a frozen clock).
#[test]
fn exact_under_contention_at_sixteen_threads() {
    const THREADS: usize = 16;
    let clock = ManualClock::new();
    let backend = MemoryBackend::builder().clock(clock).build().unwrap();
    let limit = Limit::new("race16", Quota::per_minute(100).with_max_burst(99)).unwrap();
    let keys: Vec<Key> = (0..64u32).map(|i| Key::from(format!("k{i}"))).collect();
    let hot = Key::from("hot");
    let start = std::sync::Barrier::new(THREADS);
    let (hot_admitted, spread_admitted) = std::thread::scope(|s| {
        let runs: Vec<_> = (0..THREADS)
            .map(|t| {
                let (backend, limit, keys, hot, start) = (&backend, &limit, &keys, &hot, &start);
                s.spawn(move || {
                    start.wait();
                    let hot = (0..2_000)
                        .filter(|_| backend.decide(limit, hot, 1).unwrap().allowed)
                        .count();
                    let mut spread = vec![0usize; keys.len()];
                    for i in 0..20_000 {
                        let k = (t * 4 + i) % keys.len();
                        spread[k] +=
                            usize::from(backend.decide(limit, &keys[k], 1).unwrap().allowed);
                    }
                    (hot, spread)
                })
            })
            .collect();
        let mut hot = 0;
        let mut spread = vec![0usize; keys.len()];
        for run in runs {
            let (h, s) = run.join().unwrap();
            hot += h;
            for (total, n) in spread.iter_mut().zip(s) {
                *total += n;
            }
        }
        (hot, spread)
    });
    assert_eq!(hot_admitted, 100);
    assert!(
        spread_admitted.iter().all(|n| *n == 100),
        "{spread_admitted:?}"
    );
}

#[test]
fn same_decisions_as_governor() {
    use governor::clock::FakeRelativeClock;
    use governor::{Quota as GQuota, RateLimiter};
    use std::num::NonZeroU32;

    // Quotas of several shapes; a deterministic pseudo-random arrival pattern with bursts and gaps.
    for (count, period_ms, max_burst) in [
        (5u64, 1_000u64, 4u64),
        (30, 60_000, 15),
        (100, 1_000, 0),
        (3, 1_000, 9),
    ] {
        let quota =
            Quota::per_period(count, Duration::from_millis(period_ms)).with_max_burst(max_burst);
        let limit = Limit::new("gov", quota).unwrap();
        let (ours, clock) = backend(1_000);
        let gclock = FakeRelativeClock::default();
        let gquota = GQuota::with_period(quota.emission_interval().unwrap())
            .unwrap()
            .allow_burst(NonZeroU32::new(quota.limit() as u32).unwrap());
        let theirs = RateLimiter::direct_with_clock(gquota, gclock.clone());
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut agreed = 0;
        for step in 0..20_000 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let gap = match seed % 10 {
                0..=5 => 0,
                6..=8 => seed % (quota.emission_interval().unwrap().as_micros() as u64 + 1),
                _ => seed % (period_ms * 1_000 * 2),
            };
            clock.advance(Duration::from_micros(gap));
            gclock.advance(Duration::from_micros(gap));
            let a = ours.decide(&limit, &Key::from("k"), 1).unwrap().allowed;
            let b = theirs.check().is_ok();
            assert_eq!(a, b, "quota {quota}, step {step}");
            agreed += usize::from(a);
        }
        assert!(agreed > 100, "the pattern must exercise admissions too");
    }
}
