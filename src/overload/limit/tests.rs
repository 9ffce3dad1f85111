//! The limit's unit tests (apart: `limit.rs` stays readable).

use super::*;
use crate::overload::{Gate, Overload};
use std::sync::Arc;

const MS: u64 = 1_000_000;
const SECOND: u64 = 1_000 * MS;

fn limit(overload: Overload, min: u32, max: u32, initial: u32) -> AdaptiveLimit {
    AdaptiveLimit::new(&overload.limits(min, max).initial_limit(initial).settings())
}

/// `n` intervals of 20 samples (virtual time `t`) of the latency `latency` gives at the
/// concurrency in flight (`busy` of the limit).
fn drive(l: &AdaptiveLimit, t: &mut u64, n: u32, busy: f64, latency: impl Fn(u32) -> u64) {
    for _ in 0..n * 20 {
        let in_flight = ((f64::from(l.current()) * busy) as u32).max(1);
        let lat = latency(in_flight);
        *t += 4 * MS.max(lat / 6);
        l.record(*t, lat, false, in_flight);
    }
}

#[test]
fn bounds_hold_and_nothing_panics_on_any_input() {
    for overload in [Overload::aimd(), Overload::gradient()] {
        let l = limit(overload, 3, 50, 10);
        let mut x = 1u64;
        for i in 0..20_000u64 {
            x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            let now = if i % 7 == 0 { x >> 40 } else { x }; // backwards, too
            let latency = [0, 1, u64::MAX, x >> 20][(x >> 60) as usize % 4];
            l.record(now, latency, x & 1 == 0, (x >> 32) as u32);
            assert!((3..=50).contains(&l.current()), "{}", l.current());
        }
    }
    // Unvalidated bounds are made sane, not a panic.
    assert_eq!(limit(Overload::gradient(), 0, 0, 9).current(), 1);
}

#[test]
fn aimd_grows_when_used_not_when_idle_and_backs_off_on_drops_and_slowness() {
    let (l, mut t) = (limit(Overload::aimd(), 4, 200, 20), 0);
    drive(&l, &mut t, 10, 0.1, |_| 10 * MS);
    assert_eq!(l.current(), 20, "idle: no growth");
    drive(&l, &mut t, 10, 1.0, |_| 10 * MS);
    let grown = l.current();
    assert!(grown >= 27, "{grown}");
    for _ in 0..60 {
        t += 4 * MS;
        l.record(t, 10 * MS, true, l.current());
    }
    assert!(l.current() < grown, "drops back off");
    let before = l.current();
    drive(&l, &mut t, 3, 1.0, |_| 40 * MS);
    assert!(l.current() < before, "slowness backs off");
}

#[test]
fn gradient_shrinks_under_a_queue_without_drifting_up() {
    // 20 workers: above 20 in flight, latency grows in proportion (a queue).
    let queue = |n: u32| 10 * MS * u64::from(n.max(20)) / 20;
    let (l, mut t) = (limit(Overload::gradient(), 4, 1_000, 100), 0);
    drive(&l, &mut t, 5, 0.1, |_| 10 * MS);
    drive(&l, &mut t, 40, 1.0, queue);
    assert!(l.current() <= 40, "shrank to the workers: {}", l.current());
    let mut highest = 0;
    for _ in 0..300 {
        drive(&l, &mut t, 1, 1.0, queue);
        highest = highest.max(l.current());
    }
    assert!(
        (10..=40).contains(&highest),
        "no drift under a steady queue: {highest}"
    );
}

/// Virtual time `secs` of a closed loop at the limit: `latency(n)` at `n` in flight, and a
/// completion every `latency / n` (Little's law: the throughput the service gives at `n`).
fn drive_closed(l: &AdaptiveLimit, t: &mut u64, secs: u64, latency: impl Fn(u32) -> u64) -> u32 {
    let (end, mut highest) = (*t + secs * 1_000 * MS, 0);
    while *t < end {
        let in_flight = l.current();
        let lat = latency(in_flight);
        *t += lat / u64::from(in_flight);
        l.record(*t, lat, false, in_flight);
        highest = highest.max(l.current());
    }
    highest
}

#[test]
fn gradient_finds_the_workers_when_the_service_was_never_seen_unloaded() {
    // 20 workers of 10 ms, 100 in flight from the first sample: every latency it ever sees is
    // a queue's (5x), and the throughput is flat past 20.
    let queue = |n: u32| 10 * MS * u64::from(n.max(20)) / 20;
    let (l, mut t) = (limit(Overload::gradient(), 4, 1_000, 100), 0);
    drive_closed(&l, &mut t, 5, queue);
    assert!(l.current() <= 40, "drained to the workers: {}", l.current());
    let highest = drive_closed(&l, &mut t, 30, queue);
    assert!(
        (16..=40).contains(&highest) && l.current() >= 10,
        "held near the workers, not drifting up nor stuck: {highest}, {}",
        l.current()
    );
    // The service 4x faster under the same queue: the baseline comes down to a queue's
    // latency, which the throughput tells apart again.
    let fast = |n: u32| 10 * MS * u64::from(n.max(20)) / 80;
    drive_closed(&l, &mut t, 5, fast);
    let highest = drive_closed(&l, &mut t, 30, fast);
    assert!((16..=40).contains(&highest), "{highest}");
}

#[test]
fn gradient_recovers_from_the_minimum_and_follows_a_latency_step() {
    let (l, mut t) = (limit(Overload::gradient(), 4, 1_000, 40), 0);
    drive(&l, &mut t, 5, 1.0, |_| 10 * MS);
    // A slow dependency: 5x, whatever the concurrency. Not stuck at the minimum.
    drive(&l, &mut t, 60, 1.0, |_| 50 * MS);
    assert!(
        l.current() >= 20,
        "the step became the baseline: {}",
        l.current()
    );
    // Overload to the minimum, then the latency back to the baseline: at least +1 each.
    drive(&l, &mut t, 30, 1.0, |n| 50 * MS * u64::from(n.max(4)) / 4);
    drive(&l, &mut t, 20, 1.0, |_| 10 * MS);
    assert!(l.current() >= 24, "recovered: {}", l.current());
}

#[test]
fn no_sample_is_lost_under_16_threads() {
    let l = Arc::new(limit(Overload::gradient(), 1, 1_000, 100));
    let clock = Arc::new(AtomicU64::new(0));
    std::thread::scope(|scope| {
        for i in 0..16u64 {
            let (l, clock) = (l.clone(), clock.clone());
            scope.spawn(move || {
                for j in 0..5_000u64 {
                    let now = clock.fetch_add(100_000, Ordering::Relaxed);
                    l.record(now, MS * (1 + (i + j) % 30), j % 97 == 0, 50);
                }
            });
        }
    });
    let counted = l.state.lock().map_or(0, |s| s.counted);
    let pending = l.samples.load(Ordering::Relaxed) >> SUM_BITS;
    let stale = l.stale.load(Ordering::Relaxed);
    assert_eq!(counted + pending + stale, 16 * 5_000);
}

#[test]
fn partitions_never_exceed_the_global_limit_under_16_threads() {
    let overload = Overload::aimd()
        .limits(8, 8)
        .partition("paid", 0.8)
        .partition("free", 0.2);
    let gate = Arc::new(Gate::new(&overload).unwrap());
    let (clock, inside, highest) = (AtomicU64::new(0), AtomicU32::new(0), AtomicU32::new(0));
    std::thread::scope(|scope| {
        for i in 0..16usize {
            let gate = gate.clone();
            let (clock, inside, highest) = (&clock, &inside, &highest);
            scope.spawn(move || {
                for _ in 0..20_000 {
                    let now = clock.fetch_add(1_000, Ordering::Relaxed);
                    if gate.try_admit(i % 2, now) {
                        let n = inside.fetch_add(1, Ordering::AcqRel) + 1;
                        highest.fetch_max(n.max(gate.in_flight()), Ordering::AcqRel);
                        inside.fetch_sub(1, Ordering::AcqRel);
                        gate.finish(i % 2, now, clock.load(Ordering::Relaxed), false);
                    }
                }
            });
        }
    });
    assert!(
        highest.load(Ordering::Relaxed) <= 8,
        "{}",
        highest.load(Ordering::Relaxed)
    );
    assert_eq!(gate.in_flight(), 0);
}

/// The queue test alone: past the knee (the throughput did not follow the concurrency) it
/// drains; a drain step whose concurrency did not move (the demand fell) proves nothing and
/// confirms nothing; one whose throughput fell with the concurrency is below the knee.
#[test]
fn the_queue_test_drains_past_the_knee_and_confirms_only_below_it() {
    use little::{Little, Sample, Verdict};
    let baseline = 20f64.log2();
    let at = |in_flight: f64, rate: f64| {
        Some(Sample {
            in_flight: in_flight.ln(),
            rate: rate.ln(),
            log: baseline,
            clean: true,
        })
    };
    let judge = |little: &mut Little, in_flight, rate| {
        little.judge(at(in_flight, rate), true, baseline, 1.0)
    };
    let past_the_knee = || {
        let mut little = Little::default();
        assert_eq!(judge(&mut little, 40.0, 1000.0), Verdict::Go);
        let drain = judge(&mut little, 60.0, 1000.0);
        assert!(
            matches!(drain, Verdict::Cut(to) if (to - 30.0).abs() < 1e-6),
            "{drain:?}"
        );
        little
    };
    // The next interval ran at the same concurrency: inconclusive, the baseline not confirmed.
    let mut little = past_the_knee();
    assert_eq!(judge(&mut little, 40.0, 1000.0), Verdict::Go);
    let again = judge(&mut little, 60.0, 1000.0);
    assert!(
        matches!(again, Verdict::Cut(_)),
        "still unconfirmed: {again:?}"
    );
    // A drain step whose concurrency rose a little (less than a step) cuts nothing more.
    let mut little = past_the_knee();
    assert_eq!(judge(&mut little, 44.0, 1000.0), Verdict::Go);
    // Two intervals each (concurrency, throughput: what follows), under a minimum limit:
    for (why, mut little, minimum, steps) in [
        (
            "no drain where the lower concurrency is within a tenth of the minimum",
            Little::default(),
            38.0,
            [(40.0, 1000.0, Verdict::Go), (60.0, 1000.0, Verdict::Go)],
        ),
        (
            "the throughput fell with the concurrency: below the knee, the baseline confirmed",
            past_the_knee(),
            1.0,
            [(30.0, 750.0, Verdict::Baseline), (60.0, 750.0, Verdict::Go)],
        ),
    ] {
        for (concurrency, rate, want) in steps {
            let got = little.judge(at(concurrency, rate), true, baseline, minimum);
            assert_eq!(got, want, "{why}: at {concurrency}");
        }
    }
}

/// A clock gone back (a restored VM, a reset test clock) starts a new interval at once: the limit
/// goes on adapting rather than waiting for the clock to reach the old interval's end.
#[test]
fn a_clock_gone_back_does_not_stall_the_limit() {
    for overload in [Overload::aimd(), Overload::gradient()] {
        let l = limit(overload, 1, 100, 50);
        let counted = |l: &AdaptiveLimit| l.state.lock().map_or(0, |s| s.counted);
        let mut t = 3_600_000 * MS; // an hour in
        drive(&l, &mut t, 5, 1.0, |_| 10 * MS);
        let (before, limit_before) = (counted(&l), l.current());
        let mut t = 0;
        drive(&l, &mut t, 5, 1.0, |_| 100 * MS);
        // Five intervals' samples, all but the last one's counted in closed intervals.
        assert!(counted(&l) >= before + 80, "{:?}", l.settings.algorithm);
        assert_ne!(l.current(), limit_before, "{:?}", l.settings.algorithm);
        assert!(
            l.latency() >= Duration::from_millis(99),
            "{:?}",
            l.latency()
        );
    }
}

/// A request that read the clock just before another closed an interval with a cut, and records
/// after it, is no clock gone back: the requests from before the cut stay stale, and their drops
/// cut the limit no further.
#[test]
fn a_clock_read_just_before_a_cut_is_no_clock_gone_back() {
    let l = limit(Overload::aimd(), 1, 100, 100);
    l.record(30 * MS, 30 * MS, true, 100);
    let cut = l.current();
    assert!(cut < 100, "a drop cuts: {cut}");
    l.record(30 * MS - 1, 30 * MS - 1, false, 99);
    for in_flight in (79..99).rev() {
        l.record(60 * MS, 60 * MS, true, in_flight);
    }
    assert_eq!(l.current(), cut);
}

/// At a very high rate an interval closes on its sample count, not its end; and the typical
/// latency it measured is what a shed request's `Retry-After` is derived from.
#[test]
fn an_interval_closes_early_on_its_sample_count() {
    let l = limit(Overload::gradient(), 1, 100, 50);
    let counted = |l: &AdaptiveLimit| l.state.lock().map_or(0, |s| s.counted);
    // The first interval closes on its tenth sample (its end is 0); the next at the count.
    for _ in 0..MIN_SAMPLES {
        l.record(SECOND, 100 * MS, false, 50);
    }
    assert_eq!(counted(&l), MIN_SAMPLES);
    for _ in 0..MAX_SAMPLES {
        l.record(SECOND, 100 * MS, false, 50); // the clock frozen: only the count can close it
    }
    assert_eq!(counted(&l), MIN_SAMPLES + MAX_SAMPLES);
    let typical = l.latency().as_secs_f64();
    assert!((0.099..=0.101).contains(&typical), "{typical}");
}
