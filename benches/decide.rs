//! The in-memory decision against governor's keyed limiter, side by side in one run.
//!
//! ```text
//! cargo bench --bench decide
//! ```
//!
//! Both use their default clock (quanta: tower-throttle's `QuantaClock`, governor's `QuantaClock`) and a quota that admits
//! every request (so both take the same path: read, compute, store). Keys are IPv4 addresses, as a
//! per-IP HTTP limiter sees them (tower_governor keys governor by `IpAddr`).
//!
//! - `hot_key`: one key, every call.
//! - `1M_keys`: one million live keys, visited in a shuffled order (each decision misses the cache).
//! - `/2_threads`: two threads deciding at once (iteration time = wall time for both to do one).
//! - `governor-std-clock` and `tower-throttle-std-clock`: each on `std::time::Instant` (governor's
//!   `MonotonicClock`, tower-throttle's `SystemClock`), to separate the limiter from the clock.
//! - `clock`: what one reading of each clock costs.

use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr};
use std::num::NonZeroU32;
use std::time::{Duration, Instant};

use criterion::{criterion_group, Criterion};
use governor::clock::{Clock as _, MonotonicClock, QuantaClock};
use governor::middleware::NoOpMiddleware;
use governor::state::keyed::DefaultKeyedStateStore;
use governor::{DefaultKeyedRateLimiter, Quota as GQuota, RateLimiter};
use tower_throttle::clock::{Clock as _, QuantaClock as OurQuantaClock, SystemClock};
use tower_throttle::{Key, Limit, MemoryBackend, Quota};

#[path = "shared/ips.rs"]
mod ips;
use ips::shuffled_ips;

const MANY: usize = 1_000_000;

/// The hot key: one cell per nanosecond (always admitted). The million keys: one cell per 3.6 s,
/// bursts of ten million, so that every key stays live between two visits and is always admitted.
fn quotas(many: bool) -> (Quota, GQuota) {
    if many {
        (
            Quota::cl_throttle(9_999_999, 1000, Duration::from_secs(3600)),
            GQuota::with_period(Duration::from_millis(3600))
                .unwrap()
                .allow_burst(NonZeroU32::new(10_000_000).unwrap()),
        )
    } else {
        (
            Quota::per_second(1_000_000_000),
            GQuota::per_second(NonZeroU32::new(1_000_000_000).unwrap()),
        )
    }
}

fn ours(many: bool) -> (MemoryBackend, Limit) {
    // Room for the million keys without reaching the cap (the cap's eviction is not what is measured).
    let backend = MemoryBackend::builder().max_keys(4 * MANY).build().unwrap();
    let limit = Limit::new("bench", quotas(many).0).unwrap();
    (backend, limit)
}

fn ours_std_clock() -> (MemoryBackend<SystemClock>, Limit) {
    let backend = MemoryBackend::builder()
        .clock(SystemClock::new())
        .build()
        .unwrap();
    (backend, Limit::new("bench", quotas(false).0).unwrap())
}

fn governor(many: bool) -> DefaultKeyedRateLimiter<IpAddr> {
    RateLimiter::keyed(quotas(many).1)
}

type StdClockLimiter = RateLimiter<
    IpAddr,
    DefaultKeyedStateStore<IpAddr>,
    MonotonicClock,
    NoOpMiddleware<std::time::Instant>,
>;

fn governor_std_clock(many: bool) -> StdClockLimiter {
    RateLimiter::dashmap_with_clock(quotas(many).1, MonotonicClock)
}

fn clocks(c: &mut Criterion) {
    let mut g = c.benchmark_group("clock");
    let ours = SystemClock::new();
    let our_quanta = OurQuantaClock::new();
    let quanta = QuantaClock::default();
    let monotonic = MonotonicClock;
    g.bench_function("tower-throttle SystemClock", |b| {
        b.iter(|| black_box(ours.now_nanos()))
    });
    g.bench_function("tower-throttle QuantaClock (default)", |b| {
        b.iter(|| black_box(our_quanta.now_nanos()))
    });
    g.bench_function("governor QuantaClock (default)", |b| {
        b.iter(|| black_box(quanta.now()))
    });
    g.bench_function("governor MonotonicClock", |b| {
        b.iter(|| black_box(monotonic.now()))
    });
    g.finish();
}

/// Runs `f(thread, i)` for `iters` iterations on each of `threads` threads, returning the wall time.
fn concurrent<F: Fn(usize, u64) + Sync>(threads: usize, iters: u64, f: F) -> Duration {
    let start = std::sync::Barrier::new(threads + 1);
    std::thread::scope(|s| {
        for t in 0..threads {
            let (f, start) = (&f, &start);
            s.spawn(move || {
                start.wait();
                for i in 0..iters {
                    f(t, i);
                }
            });
        }
        start.wait();
        let t0 = Instant::now();
        // The scope joins every thread before returning.
        t0
    })
    .elapsed()
}

fn hot_key(c: &mut Criterion) {
    let mut g = c.benchmark_group("hot_key");
    let (backend, limit) = ours(false);
    let key = Key::from(Ipv4Addr::new(192, 0, 2, 7));
    let gov = governor(false);
    let gkey = IpAddr::V4(Ipv4Addr::new(192, 0, 2, 7));
    let gov_std = governor_std_clock(false);
    let (backend_std, limit_std) = ours_std_clock();
    assert!(backend.decide(&limit, &key, 1).unwrap().allowed);
    assert!(gov.check_key(&gkey).is_ok());
    assert!(gov_std.check_key(&gkey).is_ok());

    g.bench_function("tower-throttle/1_thread", |b| {
        b.iter(|| black_box(backend.decide(&limit, black_box(&key), 1).unwrap()))
    });
    g.bench_function("governor/1_thread", |b| {
        b.iter(|| black_box(gov.check_key(black_box(&gkey)).is_ok()))
    });
    g.bench_function("governor-std-clock/1_thread", |b| {
        b.iter(|| black_box(gov_std.check_key(black_box(&gkey)).is_ok()))
    });
    g.bench_function("tower-throttle-std-clock/1_thread", |b| {
        b.iter(|| black_box(backend_std.decide(&limit_std, black_box(&key), 1).unwrap()))
    });
    g.bench_function("tower-throttle/2_threads", |b| {
        b.iter_custom(|iters| {
            concurrent(2, iters, |_, _| {
                black_box(backend.decide(&limit, black_box(&key), 1).unwrap());
            })
        })
    });
    g.bench_function("governor/2_threads", |b| {
        b.iter_custom(|iters| {
            concurrent(2, iters, |_, _| {
                black_box(gov.check_key(black_box(&gkey)).is_ok());
            })
        })
    });
    g.bench_function("governor-std-clock/2_threads", |b| {
        b.iter_custom(|iters| {
            concurrent(2, iters, |_, _| {
                black_box(gov_std.check_key(black_box(&gkey)).is_ok());
            })
        })
    });
    g.finish();
}

fn many_keys(c: &mut Criterion) {
    let mut g = c.benchmark_group("1M_keys");
    let addrs = shuffled_ips(MANY);
    let keys: Vec<Key> = addrs.iter().map(|ip| Key::from(*ip)).collect();
    let gkeys: Vec<IpAddr> = addrs.iter().map(|ip| IpAddr::V4(*ip)).collect();
    let (backend, limit) = ours(true);
    let gov = governor(true);
    for (k, gk) in keys.iter().zip(&gkeys) {
        assert!(backend.decide(&limit, k, 1).unwrap().allowed);
        assert!(gov.check_key(gk).is_ok());
    }
    assert_eq!(backend.len(), MANY);
    assert_eq!(gov.len(), MANY);
    let at = |i: u64| (i as usize * 7919) % MANY; // visits every key (7919 is prime, coprime to 10^6)

    g.bench_function("tower-throttle/1_thread", |b| {
        let mut i = 0u64;
        b.iter(|| {
            i += 1;
            black_box(backend.decide(&limit, &keys[at(i)], 1).unwrap())
        })
    });
    g.bench_function("governor/1_thread", |b| {
        let mut i = 0u64;
        b.iter(|| {
            i += 1;
            black_box(gov.check_key(&gkeys[at(i)]).is_ok())
        })
    });
    g.bench_function("tower-throttle/2_threads", |b| {
        b.iter_custom(|iters| {
            concurrent(2, iters, |t, i| {
                let k = &keys[at(i * 2 + t as u64)];
                black_box(backend.decide(&limit, k, 1).unwrap());
            })
        })
    });
    g.bench_function("governor/2_threads", |b| {
        b.iter_custom(|iters| {
            concurrent(2, iters, |t, i| {
                let k = &gkeys[at(i * 2 + t as u64)];
                black_box(gov.check_key(k).is_ok());
            })
        })
    });
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3));
    targets = hot_key, many_keys, clocks
}

/// `DECIDE_BENCH_ITERS=n DECIDE_BENCH_CASE=<case> [DECIDE_BENCH_THREADS=t]`: `n` decisions on the hot
/// key per thread and nothing else, for counting cycles and instructions
/// (`perf stat -e cycles:u,instructions:u`), which a machine busy with other work disturbs less than
/// wall time. Cases: `tower-throttle`, `tower-throttle-std-clock`, `governor`, `governor-std-clock`.
fn counted(iterations: u64, case: &str, threads: usize) {
    let key = Key::from(Ipv4Addr::new(192, 0, 2, 7));
    let gkey = IpAddr::V4(Ipv4Addr::new(192, 0, 2, 7));
    let run: Box<dyn Fn() -> bool + Sync> = match case {
        "tower-throttle" => {
            let (backend, limit) = ours(false);
            Box::new(move || backend.decide(&limit, black_box(&key), 1).unwrap().allowed)
        }
        "tower-throttle-std-clock" => {
            let (backend, limit) = ours_std_clock();
            Box::new(move || backend.decide(&limit, black_box(&key), 1).unwrap().allowed)
        }
        "governor" => {
            let gov = governor(false);
            Box::new(move || gov.check_key(black_box(&gkey)).is_ok())
        }
        "governor-std-clock" => {
            let gov = governor_std_clock(false);
            Box::new(move || gov.check_key(black_box(&gkey)).is_ok())
        }
        other => panic!("unknown DECIDE_BENCH_CASE {other}"),
    };
    let took = concurrent(threads, iterations, |_, _| assert!(black_box(run())));
    println!(
        "{case}: {} ns per iteration (wall), {threads} thread(s)",
        took.as_nanos() as u64 / iterations
    );
}

fn main() {
    let iterations = std::env::var("DECIDE_BENCH_ITERS")
        .ok()
        .and_then(|n| n.parse::<u64>().ok());
    if let Some(iterations) = iterations {
        let case = std::env::var("DECIDE_BENCH_CASE").unwrap_or_else(|_| "tower-throttle".into());
        let threads = std::env::var("DECIDE_BENCH_THREADS")
            .ok()
            .and_then(|t| t.parse::<usize>().ok())
            .unwrap_or(1);
        counted(iterations, &case, threads);
        return;
    }
    benches();
    Criterion::default().configure_from_args().final_summary();
}
