//! Decisions per second by thread count: tower-throttle's memory backend against governor's keyed
//! limiter (what tower_governor runs) and tokio-rate-limit's token bucket, in one run.
//!
//! ```text
//! cargo bench --bench scaling
//! SCALING_THREADS=1,2,4 SCALING_SECS=0.5 SCALING_CASES=hot,churn cargo bench --bench scaling
//! ```
//!
//! Each thread decides in a loop for `SCALING_SECS` (default 1) seconds; the three limiters take
//! turns at each thread count, `SCALING_ROUNDS` (default 1) times, and the best round of each is
//! kept. Every quota admits every call, so each limiter takes its admit path (a refusal would be
//! cheaper, and is counted and printed if one happens). Keys are IPv4 addresses, as a per-IP HTTP
//! limiter sees them (tower_governor keys governor by `IpAddr`; tokio-rate-limit takes `&str`, so
//! it gets the address's text, made once before the run).
//!
//! The four cases (`SCALING_CASES`, default all):
//!
//! - `live`: one million keys, visited in a fixed shuffled order, that stay live between visits
//!   (one cell per 3.6 s, bursts of ten million): each decision misses the cache.
//! - `per-thread`: each thread its own key (a limit per connection).
//! - `hot`: one key, every thread (one client, or one NAT, flooding).
//! - `churn`: one million keys that have refilled by the time they come back (one cell per
//!   nanosecond): tower-throttle's shards sweep refilled keys, so keys come and go; governor and
//!   tokio-rate-limit keep every key they have seen.
//! - `fresh`: every call a key never seen before (an attack from rotating addresses), live
//!   afterwards: an insertion each time, and for tower-throttle eviction at its cap of four million
//!   keys; governor grows without a bound. tokio-rate-limit is left out (its `&str` keys would have
//!   to be formatted in the loop).
//!
//! `SCALING_THREADS` (default 1, 2, 4, 8, 16 and the machine's cores) lists the thread counts;
//! `SCALING_SHARDS` gives tower-throttle's memory backend that many shards instead of its default. On a
//! machine with fewer cores than threads, the figures measure time-slicing, not contention.

use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr};
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Barrier;
use std::time::{Duration, Instant};

use governor::{DefaultKeyedRateLimiter, Quota as GQuota, RateLimiter};
use tokio_rate_limit::algorithm::{Algorithm as _, TokenBucket};
use tower_throttle::{Key, Limit, MemoryBackend, Quota};

#[path = "shared/ips.rs"]
mod ips;
use ips::shuffled_ips;

const MANY: usize = 1_000_000;

#[derive(Clone, Copy, PartialEq)]
enum Case {
    Live,
    PerThread,
    Hot,
    Churn,
    Fresh,
}

impl Case {
    const ALL: [Case; 5] = [
        Case::Live,
        Case::PerThread,
        Case::Hot,
        Case::Churn,
        Case::Fresh,
    ];

    fn name(self) -> &'static str {
        match self {
            Case::Live => "live",
            Case::PerThread => "per-thread",
            Case::Hot => "hot",
            Case::Churn => "churn",
            Case::Fresh => "fresh",
        }
    }

    fn title(self) -> &'static str {
        match self {
            Case::Live => "one million keys, live between visits",
            Case::PerThread => "a key per thread",
            Case::Hot => "one hot key, every thread",
            Case::Churn => "one million keys that refill between visits",
            Case::Fresh => "a new key every call",
        }
    }

    fn many(self) -> bool {
        matches!(self, Case::Live | Case::Churn)
    }
}

/// The three limiters, with one quota between them.
struct Limiters {
    ours: MemoryBackend,
    limit: Limit,
    governor: DefaultKeyedRateLimiter<IpAddr>,
    tokio: TokenBucket,
}

impl Limiters {
    fn new(case: Case) -> Self {
        let (quota, gquota, tokio) = match case {
            // One cell per 3.6 s, bursts of ten million: every key stays live between visits.
            Case::Live | Case::Fresh => (
                Quota::cl_throttle(9_999_999, 1000, Duration::from_secs(3600)),
                GQuota::with_period(Duration::from_millis(3600))
                    .unwrap()
                    .allow_burst(NonZeroU32::new(10_000_000).unwrap()),
                TokenBucket::new(10_000_000, 1),
            ),
            // A cell per nanosecond, bursts of one: a key has refilled before its next visit.
            Case::Churn => (
                Quota::per_second(1_000_000_000),
                GQuota::per_second(NonZeroU32::new(1_000_000_000).unwrap()),
                TokenBucket::new(1, 1_000_000_000),
            ),
            Case::PerThread | Case::Hot => (
                Quota::per_second(1_000_000_000),
                GQuota::per_second(NonZeroU32::new(1_000_000_000).unwrap()),
                TokenBucket::new(1_000_000_000, 1_000_000_000),
            ),
        };
        Limiters {
            // Room for the million keys without reaching the cap (not what is measured).
            ours: match shards() {
                Some(n) => MemoryBackend::builder().max_keys(4 * MANY).shards(n),
                None => MemoryBackend::builder().max_keys(4 * MANY),
            }
            .build()
            .unwrap(),
            limit: Limit::new("scaling", quota).unwrap(),
            governor: RateLimiter::keyed(gquota),
            tokio,
        }
    }
}

/// The keys of a case, in each limiter's form.
struct Keys {
    ours: Vec<Key>,
    governor: Vec<IpAddr>,
    tokio: Vec<String>,
}

impl Keys {
    fn new(n: usize) -> Self {
        let ips = shuffled_ips(n);
        Keys {
            ours: ips.iter().map(|ip| Key::from(*ip)).collect(),
            governor: ips.iter().map(|ip| IpAddr::V4(*ip)).collect(),
            tokio: ips.iter().map(|ip| ip.to_string()).collect(),
        }
    }
}

#[derive(Clone, Copy)]
enum Who {
    Ours,
    Governor,
    Tokio,
}

const WHO: [Who; 3] = [Who::Ours, Who::Governor, Who::Tokio];

/// `threads` threads deciding for `secs`; returns (decisions per second, refusals).
fn run(
    case: Case,
    who: Who,
    limiters: &Limiters,
    keys: &Keys,
    threads: usize,
    secs: f64,
) -> (f64, u64) {
    let stop = AtomicBool::new(false);
    let start = Barrier::new(threads + 1);
    let n = keys.ours.len();
    // Which key thread `t` decides on at its `i`th call: every thread walks the whole set from its
    // own offset (stepping by a prime coprime to 10^6), or stays on its own key, or on the one key.
    let at = move |t: usize, i: usize| match case {
        Case::Live | Case::Churn => (t * (n / threads.max(1)) + i * 7919) % n,
        Case::PerThread => t % n,
        Case::Hot | Case::Fresh => 0,
    };
    // `fresh`: thread `t`'s `i`th address, distinct across threads, calls and runs (each run
    // starts 2^26 addresses further on, so a later round meets none of an earlier one's keys).
    static RUNS: AtomicUsize = AtomicUsize::new(0);
    let base = RUNS.fetch_add(1, Ordering::Relaxed) << 26;
    let fresh = move |t: usize, i: usize| Ipv4Addr::from(base.wrapping_add(i * threads + t) as u32);
    let (counts, elapsed) = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let (stop, start) = (&stop, &start);
                s.spawn(move || {
                    start.wait();
                    let (mut done, mut refused) = (0u64, 0u64);
                    let mut i = 0usize;
                    while !stop.load(Ordering::Relaxed) {
                        // Check the flag every 256 decisions: its load stays out of the measure.
                        for _ in 0..256 {
                            let k = at(t, i);
                            i = i.wrapping_add(1);
                            let allowed = match (who, case) {
                                (Who::Ours, Case::Fresh) => {
                                    let key = Key::from(fresh(t, i));
                                    limiters
                                        .ours
                                        .decide(&limiters.limit, &key, 1)
                                        .unwrap()
                                        .allowed
                                }
                                (Who::Governor, Case::Fresh) => limiters
                                    .governor
                                    .check_key(&IpAddr::V4(fresh(t, i)))
                                    .is_ok(),
                                (Who::Tokio, Case::Fresh) => return (0, 0),
                                (Who::Ours, _) => {
                                    let key = black_box(&keys.ours[k]);
                                    limiters
                                        .ours
                                        .decide(&limiters.limit, key, 1)
                                        .unwrap()
                                        .allowed
                                }
                                (Who::Governor, _) => limiters
                                    .governor
                                    .check_key(black_box(&keys.governor[k]))
                                    .is_ok(),
                                (Who::Tokio, _) => {
                                    limiters.tokio.check(black_box(&keys.tokio[k])).permitted
                                }
                            };
                            refused += u64::from(!allowed);
                        }
                        done += 256;
                    }
                    (done, refused)
                })
            })
            .collect();
        start.wait();
        let t0 = Instant::now();
        std::thread::sleep(Duration::from_secs_f64(secs));
        stop.store(true, Ordering::Relaxed);
        let counts: Vec<(u64, u64)> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        (counts, t0.elapsed())
    });
    let done: u64 = counts.iter().map(|c| c.0).sum();
    let refused: u64 = counts.iter().map(|c| c.1).sum();
    (done as f64 / elapsed.as_secs_f64(), refused)
}

/// `SCALING_SHARDS`: tower-throttle's shard count, when not its default.
fn shards() -> Option<usize> {
    std::env::var("SCALING_SHARDS")
        .ok()
        .map(|n| n.parse().expect("SCALING_SHARDS: a count of shards"))
}

fn env_list(name: &str) -> Option<Vec<String>> {
    std::env::var(name).ok().map(|v| {
        v.split(',')
            .map(|s| s.trim().to_owned())
            .filter(|s| !s.is_empty())
            .collect()
    })
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --benches` runs this with no arguments and wants
    // it quick: one short round at 1 and 2 threads on a small key set.
    let quick = !std::env::args().any(|a| a == "--bench");
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut thread_counts: Vec<usize> = match env_list("SCALING_THREADS") {
        Some(list) => list
            .iter()
            .map(|t| {
                t.parse()
                    .expect("SCALING_THREADS: a comma-separated list of counts")
            })
            .collect(),
        None if quick => vec![1, 2],
        None => vec![1, 2, 4, 8, 16, cores],
    };
    thread_counts.sort_unstable();
    thread_counts.dedup();
    let secs: f64 = std::env::var("SCALING_SECS")
        .ok()
        .map(|s| s.parse().expect("SCALING_SECS: seconds, such as 1 or 0.5"))
        .unwrap_or(if quick { 0.05 } else { 1.0 });
    let rounds: usize = std::env::var("SCALING_ROUNDS")
        .ok()
        .map(|s| s.parse().expect("SCALING_ROUNDS: a count"))
        .unwrap_or(1);
    let cases: Vec<Case> = match env_list("SCALING_CASES") {
        Some(names) => names
            .iter()
            .map(|n| {
                *Case::ALL.iter().find(|c| c.name() == n).unwrap_or_else(|| {
                    panic!("SCALING_CASES: {n} is not one of live, per-thread, hot, churn, fresh")
                })
            })
            .collect(),
        None => Case::ALL.to_vec(),
    };
    let many = if quick { 10_000 } else { MANY };
    let layout = shards().map_or_else(|| "default shards".to_owned(), |n| format!("{n} shards"));
    println!(
        "scaling: {cores} cores; {secs} s a run, best of {rounds} round(s); tower-throttle with {layout}; decisions per second (M/s)\n"
    );
    let mut keys = None;
    for case in cases {
        let keys: &Keys = if case.many() {
            keys.get_or_insert_with(|| Keys::new(many))
        } else {
            // The hot key and the per-thread keys: the first few addresses of a small set.
            &Keys::new(thread_counts.iter().copied().max().unwrap_or(1).max(1))
        };
        println!("### {} (`{}`)\n", case.title(), case.name());
        println!("| threads | tower-throttle | governor | tokio-rate-limit | ÷ governor | ÷ tokio-rate-limit |");
        println!("|---|---|---|---|---|---|");
        for &threads in &thread_counts {
            let limiters = Limiters::new(case);
            if case.many() {
                // Every key seen once before the clock starts, in every limiter: `live` measures
                // keys that stay, `churn` keys that come back after refilling, not first visits.
                for k in 0..keys.ours.len() {
                    limiters
                        .ours
                        .decide(&limiters.limit, &keys.ours[k], 1)
                        .unwrap();
                    let _ = limiters.governor.check_key(&keys.governor[k]);
                    let _ = limiters.tokio.check(&keys.tokio[k]);
                }
            }
            let mut best = [0f64; 3];
            let mut refused = [0u64; 3];
            for _ in 0..rounds {
                for (w, who) in WHO.iter().enumerate() {
                    let (rate, r) = run(case, *who, &limiters, keys, threads, secs);
                    best[w] = best[w].max(rate);
                    refused[w] += r;
                }
            }
            let m = |r: f64| r / 1e6;
            // tokio-rate-limit sits out `fresh`.
            let (tokio, over_tokio) = if best[2] > 0.0 {
                (
                    format!("{:.1}", m(best[2])),
                    format!("{:.2}×", best[0] / best[2]),
                )
            } else {
                ("—".to_owned(), "—".to_owned())
            };
            println!(
                "| {threads} | {:.1} | {:.1} | {tokio} | {:.2}× | {over_tokio} |",
                m(best[0]),
                m(best[1]),
                best[0] / best[1],
            );
            for (w, name) in ["tower-throttle", "governor", "tokio-rate-limit"]
                .iter()
                .enumerate()
            {
                if refused[w] > 0 {
                    println!(
                        "  ({name} refused {} calls: not its admit path)",
                        refused[w]
                    );
                }
            }
        }
        println!();
    }
}
