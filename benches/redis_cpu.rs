//! Redis CPU per decision on one hot key, with 50 callers at once (`INFO commandstats`), for each
//! way a decision can reach Redis: alone (`coalesce(false)`, one call a check), coalesced, and for
//! the GCRA `CL.THROTTLE` pipelined. Run by `CLIENT=1 bash scripts/batch-bench.sh`, which starts the Redis.
//!
//! Redis's time per decision is the `usec` of the commands the client sends (`EVALSHA`,
//! `CL.THROTTLE`), whose time includes the commands a script calls inside it (`TIME`, `GET`,
//! `ZADD`…; those are counted in `INFO commandstats` too, and are not added again), divided by the
//! decisions. It is Redis's own time, much less sensitive to the machine's load than requests per
//! second (also printed, for what it is worth on a shared machine), as is the latency each check
//! sees from its caller's side (from the call of `check` to its answer: median and 99th
//! percentile over the case's decisions).
//!
//! A case whose name ends in `-1m` decides on one million keys instead of one: before it, one
//! million GCRA states (an old TAT each: a key as a limit leaves it) are written, and each check
//! picks one of them at random, so nearly every check is of another key (one group per item in a
//! batch) in a database of a million keys.
//!
//! Environment: `REDIS_URL` (required), `CALLERS` (50), `DECISIONS` per case (20,000), `ROUNDS` (3,
//! interleaved; medians printed), `CASES` (a comma-separated subset of the names).

use std::sync::Arc;
use std::time::{Duration, Instant};

use tower_throttle::backend::Charges;
use tower_throttle::{
    redis::{RedisBackend, RedisMode},
    Algorithm, Backend, Decision, Key, Limit, Quota,
};

/// Commands a client sends; the others run inside them.
const TOP_LEVEL: [&str; 3] = ["evalsha", "eval", "cl.throttle"];

fn env(name: &str, default: usize) -> usize {
    std::env::var(name).map_or(default, |v| v.parse().expect(name))
}

/// A quota the load never reaches: every decision admits and writes.
fn never_reached(name: &str, algorithm: Algorithm) -> Limit {
    Limit::with_algorithm(name, algorithm, Quota::per_hour(500_000)).unwrap()
}

fn limits_of(case: &str) -> Vec<Limit> {
    if case.starts_with("sliding-window") {
        vec![never_reached("sw", Algorithm::SlidingWindow)]
    } else if case.starts_with("fixed-window") {
        vec![never_reached("fw", Algorithm::FixedWindow)]
    } else if case.starts_with("stack") {
        vec![
            never_reached("st-gcra", Algorithm::Gcra),
            never_reached("st-fixed", Algorithm::FixedWindow),
            never_reached("st-sliding", Algorithm::SlidingWindow),
        ]
    } else {
        vec![Limit::new("gcra", Quota::per_second(1_000_000_000)).unwrap()]
    }
}

/// The keys of a `-1m` case.
const MANY: u64 = 1_000_000;

/// The case's backend: `alone` is `coalesce(false)`.
async fn backend(url: &str, case: &str) -> RedisBackend {
    let case = case.trim_end_matches("-1m");
    let mode = if case.ends_with("cell") {
        RedisMode::Cell
    } else {
        RedisMode::Lua
    };
    RedisBackend::builder()
        .url(url)
        .mode(mode)
        .coalesce(!case.ends_with("alone"))
        .deny_cache(false)
        .timeout(Duration::from_secs(5))
        .connect()
        .await
        .unwrap_or_else(|e| panic!("connect {url}: {e:?}"))
}

/// `(usec, calls)` summed over the top-level commands, and the calls of every command.
async fn stats(conn: &mut redis::aio::MultiplexedConnection) -> (f64, f64, f64) {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await
        .unwrap();
    let (mut usec, mut calls, mut all) = (0.0, 0.0, 0.0);
    for line in info.lines() {
        let Some((name, rest)) = line
            .strip_prefix("cmdstat_")
            .and_then(|l| l.split_once(':'))
        else {
            continue;
        };
        if name == "info" || name == "config" {
            continue;
        }
        let field = |key: &str| -> f64 {
            rest.split(',')
                .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
                .map_or(0.0, |v| v.parse().unwrap())
        };
        all += field("calls");
        if TOP_LEVEL.contains(&name) {
            usec += field("usec");
            calls += field("calls");
        }
    }
    (usec, calls, all)
}

/// One case: `decisions` by `callers` tasks at once on one key. Returns (Redis µs per decision,
/// top-level calls per decision, commands per decision, decisions per second, and the latency a
/// check sees from the caller's side in µs: median and 99th percentile).
async fn run(url: &str, case: &str, callers: usize, decisions: usize) -> [f64; 6] {
    let backend = backend(url, case).await;
    let limits = Arc::new(limits_of(case));
    let client = redis::Client::open(url).unwrap();
    // Filling a million keys takes seconds on a loaded machine: past the default response timeout.
    let config =
        redis::AsyncConnectionConfig::new().set_response_timeout(Some(Duration::from_secs(120)));
    let mut conn = client
        .get_multiplexed_async_connection_with_config(&config)
        .await
        .unwrap();
    let _: () = redis::cmd("FLUSHALL").query_async(&mut conn).await.unwrap();
    let many = case.ends_with("-1m");
    if many {
        // `prefix:gcra:{u<i>}` for i < MANY, each an old TAT (2001: no backlog), by scripts of
        // 50,000 keys.
        let pattern = backend.state_key(&limits[0], &Key::from("u@"));
        let (head, tail) = pattern.split_once('@').unwrap();
        let fill = "for i = tonumber(ARGV[3]), tonumber(ARGV[4]) - 1 do \
            redis.call('SET', ARGV[1] .. i .. ARGV[2], '1000000000000000000') end";
        for from in (0..MANY).step_by(50_000) {
            let _: () = redis::cmd("EVAL")
                .arg(fill)
                .arg(0)
                .arg(head)
                .arg(tail)
                .arg(from)
                .arg(from + 50_000)
                .query_async(&mut conn)
                .await
                .unwrap();
        }
        let probe = backend.state_key(&limits[0], &Key::from(format!("u{}", MANY - 1)));
        let found: bool = redis::cmd("EXISTS")
            .arg(probe)
            .query_async(&mut conn)
            .await
            .unwrap();
        assert!(found, "the million keys are the ones the checks take");
    }
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(&mut conn)
        .await
        .unwrap();
    let started = Instant::now();
    let tasks: Vec<_> = (0..callers)
        .map(|caller| {
            let (backend, limits) = (backend.clone(), limits.clone());
            let mut key = Key::from("hot");
            // xorshift64, a stream per caller: which of the MANY keys each check takes.
            let mut x = 0x9E37_79B9_7F4A_7C15_u64 ^ (caller as u64 + 1);
            tokio::spawn(async move {
                let mut latencies = Vec::with_capacity(decisions / callers);
                for _ in 0..decisions / callers {
                    if many {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        key = Key::from(format!("u{}", x % MANY));
                    }
                    let asked = Instant::now();
                    let allowed = if let [limit] = &limits[..] {
                        backend.check(Charges::one(limit, &key, 1)).await.unwrap()[0].allowed
                    } else {
                        let all = backend
                            .check(Charges::stack(&limits, &key, 1))
                            .await
                            .unwrap();
                        Decision::combine(&all).unwrap().allowed
                    };
                    latencies.push(asked.elapsed().as_secs_f64() * 1e6);
                    assert!(allowed, "the quota is never reached");
                }
                latencies
            })
        })
        .collect();
    let mut latencies = Vec::with_capacity(decisions);
    for task in tasks {
        latencies.extend(task.await.unwrap());
    }
    let elapsed = started.elapsed().as_secs_f64();
    let (usec, calls, all) = stats(&mut conn).await;
    let n = ((decisions / callers) * callers) as f64;
    latencies.sort_by(f64::total_cmp);
    let percentile =
        |p: f64| latencies[((latencies.len() as f64 * p) as usize).min(latencies.len() - 1)];
    [
        usec / n,
        calls / n,
        all / n,
        n / elapsed,
        percentile(0.5),
        percentile(0.99),
    ]
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let url = std::env::var("REDIS_URL")
        .expect("REDIS_URL (CLIENT=1 bash scripts/batch-bench.sh sets it)");
    let callers = env("CALLERS", 50);
    let decisions = env("DECISIONS", 20_000);
    let rounds = env("ROUNDS", 3);
    let all = [
        "gcra-alone",
        "gcra-coalesced",
        "gcra-cell",
        "gcra-coalesced-1m",
        "gcra-cell-1m",
        "sliding-window-alone",
        "sliding-window-coalesced",
        "stack-alone",
        "stack-coalesced",
        "fixed-window-alone",
        "fixed-window-coalesced",
    ];
    let wanted = std::env::var("CASES").unwrap_or_default();
    let cases: Vec<&str> = all
        .into_iter()
        .filter(|c| wanted.is_empty() || wanted.split(',').any(|w| w == *c))
        .collect();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut figures: Vec<Vec<[f64; 6]>> = vec![Vec::new(); cases.len()];
    for _ in 0..rounds {
        for (i, case) in cases.iter().enumerate() {
            figures[i].push(runtime.block_on(run(&url, case, callers, decisions)));
        }
    }
    println!(
        "{callers} callers, one key (-1m: a million), {decisions} decisions per case, medians of {rounds} rounds"
    );
    println!("| case | Redis µs / decision | range | calls / decision | commands / decision | decisions/s | latency p50 µs | p99 µs |");
    println!("|---|---:|---|---:|---:|---:|---:|---:|");
    for (case, runs) in cases.iter().zip(figures) {
        let col = |j: usize| runs.iter().map(|r| r[j]).collect::<Vec<_>>();
        let us = col(0);
        let (lo, hi) = (
            us.iter().copied().fold(f64::MAX, f64::min),
            us.iter().copied().fold(0.0, f64::max),
        );
        println!(
            "| {case} | {:.2} | {lo:.2}-{hi:.2} | {:.3} | {:.2} | {:.0} | {:.0} | {:.0} |",
            median(us),
            median(col(1)),
            median(col(2)),
            median(col(3)),
            median(col(4)),
            median(col(5))
        );
    }
}
