//! The memory backend's decision for each algorithm, side by side in one run, on one hot key.
//!
//! ```text
//! cargo bench --bench algorithms
//! ```
//!
//! Every limit admits every call (so each takes its admit path: read, decide, store), on one IPv4
//! key, one thread, with the default clock (`SystemClock`), through the public API:
//!
//! - `gcra`: `Limit::new`, a billion a second (as `benches/decide.rs`' hot key): the GCRA table.
//! - `fixed-window`, `sliding-window`: the same quota with `Limit::with_algorithm`: the general store.
//! - `fixed-window-calendar`: a fixed window on the calendar (`Limit::with_calendar`, days in
//!   Paris), admitting every call: the fixed window's path with the calendar's cached bounds.
//! - `sliding-log`: 10 000 (the cap, `MAX_UNIT_COUNT`) per 200 µs, admitted up to one call per 20 ns:
//!   the log keeps the last 200 µs of admissions (about 2 000 at 100 ns a call), one popped and one
//!   pushed per call.
//! - `gcra+fixed-window`: a stack of two (`decide_charges`: one lock, one `Vec` of decisions).
//! - `concurrency`: acquire (`decide`) then release (`Backend::release`), one unit in flight.

use std::hint::black_box;
use std::net::Ipv4Addr;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion};
use tower_throttle::backend::{Adjustment, Charges};
use tower_throttle::window::{CalendarPeriod, CalendarWindow};
use tower_throttle::{Algorithm, Backend, Key, Limit, MemoryBackend, Quota};

const QUOTA: Quota = Quota::per_second(1_000_000_000);

fn backend() -> MemoryBackend {
    MemoryBackend::builder().build().unwrap()
}

fn with(name: &str, algorithm: Algorithm, quota: Quota) -> Limit {
    Limit::with_algorithm(name, algorithm, quota).unwrap()
}

fn hot_key(c: &mut Criterion) {
    let key = Key::from(Ipv4Addr::new(192, 0, 2, 7));
    // `ALGORITHMS_BENCH_ITERS=n ALGORITHMS_BENCH_CASE=<fixed-window|fixed-window-calendar|gcra>`: `n`
    // admitted decisions of that case and nothing else, for callgrind (instructions per decision:
    // the count at n = 1,000,001 less the count at n = 1, over a million).
    if let Ok(iterations) = std::env::var("ALGORITHMS_BENCH_ITERS") {
        let iterations: u64 = iterations.parse().unwrap();
        let case = std::env::var("ALGORITHMS_BENCH_CASE").unwrap();
        let limit = match case.as_str() {
            "gcra" => Limit::new("gcra", QUOTA).unwrap(),
            "fixed-window" => with("fixed", Algorithm::FixedWindow, QUOTA),
            "fixed-window-calendar" => with(
                "calendar",
                Algorithm::FixedWindow,
                Quota::per_period(1 << 50, CalendarPeriod::Day.nominal()),
            )
            .with_calendar(CalendarWindow::day().timezone("Europe/Paris"))
            .unwrap(),
            other => panic!("unknown ALGORITHMS_BENCH_CASE {other}"),
        };
        let backend = backend();
        for _ in 0..iterations {
            assert!(backend.decide(&limit, black_box(&key), 1).unwrap().allowed);
        }
        std::process::exit(0);
    }
    let mut g = c.benchmark_group("algorithms_hot_key");

    // A fixed window on the calendar (days in Paris): the same admit path, plus the calendar's
    // cached bounds (recomputed once a day).
    let calendar = with(
        "calendar",
        Algorithm::FixedWindow,
        Quota::per_period(1 << 50, CalendarPeriod::Day.nominal()),
    )
    .with_calendar(CalendarWindow::day().timezone("Europe/Paris"))
    .unwrap();
    let single: [(&str, Limit); 5] = [
        ("gcra", Limit::new("gcra", QUOTA).unwrap()),
        ("fixed-window", with("fixed", Algorithm::FixedWindow, QUOTA)),
        ("fixed-window-calendar", calendar),
        (
            "sliding-window",
            with("sliding", Algorithm::SlidingWindow, QUOTA),
        ),
        (
            "sliding-log",
            with(
                "log",
                Algorithm::SlidingLog,
                Quota::per_period(10_000, Duration::from_micros(200)),
            ),
        ),
    ];
    for (name, limit) in &single {
        let backend = backend();
        assert!(backend.decide(limit, &key, 1).unwrap().allowed, "{name}");
        g.bench_function(*name, |b| {
            b.iter(|| black_box(backend.decide(limit, black_box(&key), 1).unwrap()))
        });
        // Still on the admit path after the measurement.
        assert!(backend.decide(limit, &key, 1).unwrap().allowed, "{name}");
    }

    let stack = [
        Limit::new("stack", QUOTA).unwrap(),
        with("stack-fixed", Algorithm::FixedWindow, QUOTA),
    ];
    let stacked = backend();
    assert!(stacked
        .decide_charges(Charges::stack(&stack, &key, 1))
        .unwrap()
        .iter()
        .all(|d| d.allowed));
    g.bench_function("gcra+fixed-window", |b| {
        b.iter(|| {
            black_box(
                stacked
                    .decide_charges(Charges::stack(&stack, black_box(&key), 1))
                    .unwrap(),
            )
        })
    });

    let conc = with("conc", Algorithm::Concurrency, Quota::per_second(10_000));
    let inflight = backend();
    g.bench_function("concurrency acquire+release", |b| {
        b.iter(|| {
            let d = inflight.decide(&conc, black_box(&key), 1).unwrap();
            debug_assert!(d.allowed);
            let lease = d.lease.unwrap_or(0);
            inflight.adjust(Charges::one(&conc, &key, 1), Adjustment::Release { lease });
            black_box(d)
        })
    });
    assert!(inflight.is_empty(), "every slot given back");
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3));
    targets = hot_key
}
criterion_main!(benches);
