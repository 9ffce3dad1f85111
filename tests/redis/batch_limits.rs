//! `limits.lua` coalesced (src/backend/redis/batch.rs, limits_batch.lua): concurrent checks of every
//! other algorithm than the GCRA, and stacks, share script calls and still admit exactly the limit,
//! with the decisions the memory backend makes, on one server and on a Cluster; the batch script
//! decides every item as `limits.lua` decides it alone and leaves the same state. (`limits.lua`
//! alone against `window.rs` and `gcra.rs`: algorithms.rs.)

use crate::support::redis as redis_support;

use std::sync::Arc;
use std::time::Duration;

use redis_support::{RedisCluster, RedisServer};
use tower_throttle::{
    Algorithm, Backend, Decision, Key, Limit, MemoryBackend, Quota, RedisBackend,
    RedisBackendBuilder, RedisMode,
};

use crate::algorithms::{within_one_window, Rng};
use crate::backend::calls;
use crate::batch::{evalsha_calls, on_a_test_clock};
use crate::lua::{LIMITS, LIMITS_BATCH};

const CHECKS: usize = 200;
const QUOTA: u64 = 50;

/// What the flood runs: one limit of each algorithm but the GCRA, and a stack.
fn cases(prefix: &str) -> Vec<(String, Vec<Limit>)> {
    let hourly = |name: String, algorithm| {
        Limit::with_algorithm(name, algorithm, Quota::per_hour(QUOTA)).unwrap()
    };
    let mut cases: Vec<(String, Vec<Limit>)> = [
        Algorithm::SlidingLog,
        Algorithm::FixedWindow,
        Algorithm::SlidingWindow,
        Algorithm::Concurrency,
    ]
    .into_iter()
    .map(|a| {
        let name = format!("{prefix}-{a}");
        (name.clone(), vec![hourly(name, a)])
    })
    .collect();
    let stack = format!("{prefix}-stack");
    cases.push((
        stack.clone(),
        vec![
            Limit::new(format!("{stack}-gcra"), Quota::per_hour(QUOTA + 30)).unwrap(),
            hourly(format!("{stack}-log"), Algorithm::SlidingLog),
            hourly(format!("{stack}-fixed"), Algorithm::FixedWindow),
            Limit::with_algorithm(
                format!("{stack}-sliding"),
                Algorithm::SlidingWindow,
                Quota::per_hour(QUOTA + 10),
            )
            .unwrap(),
        ],
    ));
    cases
}

/// One check of one unit: `check` for one limit, `check_all` for a stack; the decision that binds
/// (a stack's combined one) as `(allowed, remaining)`.
async fn one<B: Backend>(backend: &B, limits: &[Limit], key: &Key) -> (bool, u64) {
    let decision = if let [limit] = limits {
        backend.check(limit, key, 1).await.unwrap()
    } else {
        let decisions = backend.check_all(limits, key, 1).await.unwrap();
        Decision::combine(&decisions).unwrap()
    };
    (decision.allowed, decision.remaining)
}

/// `CHECKS` checks on one key, all at once; each decision's `(allowed, remaining)`, sorted.
async fn flood(backend: &RedisBackend, limits: &[Limit], key: &str) -> Vec<(bool, u64)> {
    let limits = Arc::new(limits.to_vec());
    let key = Key::from(key);
    let tasks: Vec<_> = (0..CHECKS)
        .map(|_| {
            let (backend, limits, key) = (backend.clone(), limits.clone(), key.clone());
            tokio::spawn(async move { one(&backend, &limits, &key).await })
        })
        .collect();
    let mut decisions = Vec::new();
    for task in tasks {
        decisions.push(task.await.unwrap());
    }
    decisions.sort_unstable();
    decisions
}

/// The same checks one after the other on the memory backend: the decisions a limiter that decides
/// one check at a time makes.
async fn on_memory(limits: &[Limit], key: &str) -> Vec<(bool, u64)> {
    let memory = MemoryBackend::new();
    let key = Key::from(key);
    let mut decisions = Vec::new();
    for _ in 0..CHECKS {
        decisions.push(one(&memory, limits, &key).await);
    }
    decisions.sort_unstable();
    decisions
}

/// Every case: exactly the limit admitted, each admitted check with its own `remaining` (49 down
/// to 0: each saw the state the one before it left), the same decisions as the memory backend's,
/// in fewer script calls than checks (coalesced).
async fn every_case_through_batches(
    backend: &RedisBackend,
    prefix: &str,
    evalsha: impl Fn() -> u64,
    zcard: impl Fn(&str) -> u64,
) {
    for (name, limits) in cases(prefix) {
        let before = evalsha();
        let got = flood(backend, &limits, &format!("{name}-key")).await;
        let calls = evalsha() - before;
        let admitted = got.iter().filter(|(allowed, _)| *allowed).count();
        assert_eq!(admitted, QUOTA as usize, "{name}: {admitted} admitted");
        let remaining: Vec<u64> = got.iter().filter(|d| d.0).map(|d| d.1).collect();
        assert_eq!(remaining, (0..QUOTA).collect::<Vec<_>>(), "{name}");
        assert_eq!(
            got,
            on_memory(&limits, &name).await,
            "{name}: against memory"
        );
        assert!(
            calls < (CHECKS / 2) as u64,
            "{name}: {CHECKS} concurrent checks took {calls} script calls: not coalesced"
        );
        // A concurrency slot per admitted check, each under its own token, no more.
        if limits[0].concurrency().is_some() {
            let state = backend.state_key(&limits[0], &Key::from(format!("{name}-key")));
            assert_eq!(zcard(&state), QUOTA, "{name}");
        }
    }
}

/// The backend of `builder` in Lua mode without the deny cache (every check reaches Redis), once
/// the server at `url` is at least 30 s from an hour's boundary (the floods run in one window).
async fn on_lua(builder: RedisBackendBuilder, url: &str) -> RedisBackend {
    let backend = builder
        .mode(RedisMode::Lua)
        .deny_cache(false)
        .timeout(Duration::from_secs(2))
        .connect()
        .await
        .unwrap();
    within_one_window(url, Duration::from_secs(3600), Duration::from_secs(30)).await;
    backend
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_checks_of_every_algorithm_share_calls_and_admit_exactly_the_limit() {
    let server = RedisServer::start();
    let backend = on_lua(RedisBackend::builder().url(server.url()), &server.url()).await;
    let zcard = |key: &str| server.cli(&["ZCARD", key]).parse().unwrap();
    every_case_through_batches(&backend, "batched", || evalsha_calls(&server), zcard).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_checks_of_every_algorithm_on_a_cluster_admit_exactly_the_limit() {
    let cluster = RedisCluster::start();
    let builder = RedisBackend::builder().cluster_urls(cluster.urls());
    let backend = on_lua(builder, &cluster.urls()[0]).await;
    let evalsha = || cluster.nodes().iter().map(evalsha_calls).sum::<u64>();
    // The node that owns the key answers; the others redirect (an error here).
    let zcard = |key: &str| {
        cluster
            .nodes()
            .iter()
            .filter_map(|n| n.cli_result(&["ZCARD", key]).ok()?.parse::<u64>().ok())
            .sum()
    };
    every_case_through_batches(&backend, "batched-cluster", evalsha, zcard).await;
}

/// One random limit as `limits.lua` takes it: kind, limit, and its two parameters (GCRA: interval
/// and tolerance in ns; windows: the period in µs; concurrency: the lease in µs).
fn random_limit(rng: &mut Rng) -> [u64; 4] {
    const MS_US: u64 = 1000;
    let kind = rng.below(5);
    let limit = 1 + rng.below(6);
    match kind {
        0 => {
            // Backlogs of seconds: writes expire in real time (PX), not while the test runs.
            let interval = rng.pick(&[1_000_000_000, 7_919_000_000, 1_000_000_007]);
            [0, limit, interval, interval * limit]
        }
        4 => [4, limit, rng.pick(&[60_000 * MS_US, 90_000 * MS_US]), 0],
        _ => [
            kind,
            limit,
            rng.pick(&[10_000 * MS_US, 60_000 * MS_US, 3_600_000 * MS_US]),
            0,
        ],
    }
}

/// A stored state for `kind` under `key`, as another call may have left it (none, some units,
/// full, or for a string a value that is not the algorithm's).
fn seed(key: &str, kind: u64, now_us: u64, rng: &mut Rng) -> Vec<Vec<String>> {
    let mut commands = Vec::new();
    let mut cli = |args: &[&str]| commands.push(args.iter().map(|a| a.to_string()).collect());
    match (kind, rng.below(4)) {
        (_, 0) => {}
        // Another type: the items that read it fail (WRONGTYPE), alone and in a batch.
        (_, 1) if rng.below(6) == 0 => {
            cli(&["HSET", key, "f", "v"]);
        }
        (1 | 4, _) => {
            for i in 0..rng.below(8) {
                // Members of the log (times in the last minute) or leases (ends around now).
                let score = if kind == 1 {
                    now_us - rng.below(60_000_000)
                } else {
                    now_us + rng.below(120_000_000) - 60_000_000
                };
                cli(&["ZADD", key, &score.to_string(), &format!("old:{i}")]);
            }
        }
        (0, _) => {
            let tat = now_us * 1000 + rng.below(10_000_000_000);
            cli(&["SET", key, &tat.to_string()]);
        }
        (2, 1) | (3, 1) => {
            cli(&["SET", key, "not:a:window:state"]);
        }
        (2, _) => {
            let window = now_us / 10_000_000;
            cli(&["SET", key, &format!("{window}:{}", rng.below(8))]);
        }
        _ => {
            let window = now_us / 60_000_000;
            let w = window - rng.below(2);
            cli(&[
                "SET",
                key,
                &format!("{w}:{}:{}", rng.below(8), rng.below(8)),
            ]);
        }
    }
    commands
}

/// One command on `conn`, its reply as it comes.
async fn run(conn: &mut redis::aio::MultiplexedConnection, args: &[String]) -> redis::Value {
    let mut cmd = redis::cmd(&args[0]);
    for arg in &args[1..] {
        cmd.arg(arg);
    }
    cmd.query_async(conn).await.unwrap()
}

fn strings(args: &[&str]) -> Vec<String> {
    args.iter().map(|a| a.to_string()).collect()
}

/// limits_batch.lua decides a batch (single limits of every algorithm and stacks, on keys shared
/// between items in any order, with and without a penalty box, quantities 0, within and beyond
/// the limit, one quantity per limit; stored states none, partial, full and foreign) exactly as
/// limits.lua decides its items one after the other at the same instant: the same reply per item,
/// the same keys left behind (values, members and scores; expiries within the test's run time).
#[tokio::test]
async fn a_limits_batch_decides_each_item_as_limits_lua_alone() {
    let server = RedisServer::start();
    let client = redis::Client::open(server.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let alone = on_a_test_clock(LIMITS);
    let batch = on_a_test_clock(LIMITS_BATCH);
    let mut rng = Rng(0xba7c);
    let (mut failed, mut banned) = (0, 0);
    for round in 0..200 {
        run(&mut conn, &strings(&["FLUSHALL"])).await;
        // At least 2 s before a boundary of every period used (10 s, 1 min, 1 h): no key is
        // written with an expiry that may pass while the test runs.
        let now_s = 1_700_000_000 + 10 * rng.below(100_000) + rng.below(8);
        let now_us_part = rng.below(1_000_000);
        let now_us = now_s * 1_000_000 + now_us_part;
        let clock = [
            "HSET",
            "test-clock",
            "s",
            &now_s.to_string(),
            "us",
            &now_us_part.to_string(),
        ];
        run(&mut conn, &strings(&clock)).await;
        // A few clients' limits: each limit's kind is fixed by its key, as a backend's would be.
        let limits: Vec<[u64; 4]> = (0..1 + rng.below(6))
            .map(|_| random_limit(&mut rng))
            .collect();
        for (l, spec) in limits.iter().enumerate() {
            let sides: Vec<String> = ["a", "b"]
                .iter()
                .map(|s| format!("{{c}}:{s}:{l}"))
                .collect();
            // The same seed on both sides.
            let state = rng.0;
            for key in &sides {
                rng.0 = state;
                for command in seed(key, spec[0], now_us, &mut rng) {
                    run(&mut conn, &command).await;
                }
            }
        }
        let items = 1 + rng.below(12);
        let mut batch_call = batch.prepare_invoke();
        batch_call.arg(items);
        let mut expected: Vec<redis::Value> = Vec::new();
        for item in 0..items {
            // One limit, or a stack of distinct limits.
            let mut chosen: Vec<usize> = Vec::new();
            for _ in 0..1 + rng.below(3) {
                let l = rng.below(limits.len() as u64) as usize;
                if !chosen.contains(&l) {
                    chosen.push(l);
                }
            }
            let n = chosen.len() as u64;
            let quantity = match rng.below(6) {
                0 => 0,
                1 => 7,
                _ => 1,
            };
            let penalty = rng.below(4) == 0;
            let mut args: Vec<u64> = vec![n, quantity, 1000 + item, 0, 0, 0];
            if penalty {
                args[3..6].copy_from_slice(&[2, 60_000, 60_000]);
            }
            for &l in &chosen {
                args.extend_from_slice(&limits[l]);
            }
            if rng.below(3) == 0 {
                // Ceilings (the tolerance: none metered here), then one quantity per limit.
                args.extend(chosen.iter().map(|&l| limits[l][3]));
                args.extend(chosen.iter().map(|_| rng.below(3)));
            }
            let keys = |side: &str| -> Vec<String> {
                let mut keys: Vec<String> =
                    chosen.iter().map(|l| format!("{{c}}:{side}:{l}")).collect();
                if penalty {
                    keys.push(format!("{{c}}:{side}:strikes"));
                    keys.push(format!("{{c}}:{side}:ban"));
                }
                keys
            };
            let mut call = alone.prepare_invoke();
            for key in keys("a") {
                call.key(key);
            }
            for arg in &args {
                call.arg(*arg);
            }
            match call.invoke_async::<Vec<i64>>(&mut conn).await {
                Ok(reply) => {
                    banned += usize::from(reply[0] == 1);
                    expected.extend(reply.into_iter().map(redis::Value::Int));
                }
                Err(e) => {
                    failed += 1;
                    // The batch reports the error's text in place of `banned`, then zeros.
                    let code = e.code().unwrap_or("?").to_owned();
                    expected.push(redis::Value::BulkString(code.into_bytes()));
                    expected.extend((0..5 * n).map(|_| redis::Value::Int(0)));
                }
            }
            let b_keys = keys("b");
            batch_call.arg(b_keys.len()).arg(args.len());
            for arg in &args {
                batch_call.arg(*arg);
            }
            for key in b_keys {
                batch_call.key(key);
            }
        }
        let got: Vec<redis::Value> = batch_call.invoke_async(&mut conn).await.unwrap();
        // An error's text: its code (WRONGTYPE) is what alone and batched share.
        let got: Vec<redis::Value> = got
            .into_iter()
            .map(|v| match v {
                redis::Value::BulkString(text) => {
                    let text = String::from_utf8_lossy(&text).into_owned();
                    let code = text.split(' ').next().unwrap_or("").to_owned();
                    redis::Value::BulkString(code.into_bytes())
                }
                other => other,
            })
            .collect();
        assert_eq!(
            got.len(),
            expected.len(),
            "round {round}: {got:?}\n{expected:?}"
        );
        for (i, (g, e)) in got.iter().zip(&expected).enumerate() {
            // A ban's time left is read from its key's expiry (PTTL, real time, whole ms), which
            // moves on while the items are sent one at a time: within 100 ms, in whole ms.
            let ban_time = match (g, e) {
                (redis::Value::Int(g), redis::Value::Int(e)) => {
                    g % 1_000_000 == 0 && e % 1_000_000 == 0 && (g - e).abs() <= 100_000_000
                }
                _ => false,
            };
            assert!(
                g == e || ban_time,
                "round {round}, value {i}: {g:?} vs {e:?}\n{got:?}\n{expected:?}"
            );
        }
        let mut names: Vec<String> = (0..limits.len()).map(|l| l.to_string()).collect();
        names.extend(["strikes".to_owned(), "ban".to_owned()]);
        for name in names {
            let (a, b) = (format!("{{c}}:a:{name}"), format!("{{c}}:b:{name}"));
            let type_of = |key: &str| strings(&["TYPE", key]);
            let kind: String = redis::from_redis_value(run(&mut conn, &type_of(&a)).await).unwrap();
            let kind_b: String =
                redis::from_redis_value(run(&mut conn, &type_of(&b)).await).unwrap();
            assert_eq!(kind, kind_b, "round {round}, {name}");
            let dump = |key: &str| match kind.as_str() {
                "zset" => Some(strings(&["ZRANGE", key, "0", "-1", "WITHSCORES"])),
                "string" => Some(strings(&["GET", key])),
                _ => None,
            };
            if let (Some(da), Some(db)) = (dump(&a), dump(&b)) {
                let (va, vb) = (run(&mut conn, &da).await, run(&mut conn, &db).await);
                assert_eq!(va, vb, "round {round}, {name}");
            }
            let expiry = |key: &str| strings(&["PEXPIRETIME", key]);
            let ta: i64 = redis::from_redis_value(run(&mut conn, &expiry(&a)).await).unwrap();
            let tb: i64 = redis::from_redis_value(run(&mut conn, &expiry(&b)).await).unwrap();
            assert_eq!(ta < 0, tb < 0, "round {round}, {name}: {ta} vs {tb}");
            assert!(
                (ta - tb).abs() <= 2000,
                "round {round}, {name}: {ta} vs {tb}"
            );
        }
    }
    assert!(
        failed > 10 && banned > 10,
        "{failed} items failed, {banned} banned: too few"
    );
}

/// `CHECKS` GCRA checks at once on one key, quota `QUOTA`: exactly the quota admitted. Returns the
/// script calls and `CL.THROTTLE` calls they took.
async fn flood_gcra(server: &RedisServer, backend: RedisBackend, name: &str) -> (u64, u64) {
    let limit = Limit::new(name, Quota::per_hour(QUOTA)).unwrap();
    let (evals, cells) = (evalsha_calls(server), calls(server, "cl.throttle"));
    let got = flood(&backend, &[limit], name).await;
    let admitted = got.iter().filter(|(allowed, _)| *allowed).count();
    assert_eq!(admitted, QUOTA as usize, "{name}");
    (
        evalsha_calls(server) - evals,
        calls(server, "cl.throttle") - cells,
    )
}

/// `Auto`'s rule where the module is loaded: the coalesced Lua path (fewer script calls than checks,
/// no `CL.THROTTLE`), exactly the limit; `Cell` still forces `CL.THROTTLE`; `Auto` without
/// coalescing takes `CL.THROTTLE`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_with_the_module_loaded_takes_the_coalesced_lua_path() {
    let server = RedisServer::start_with_cell();
    let connect = |mode: RedisMode, coalesce: bool| {
        RedisBackend::builder()
            .url(server.url())
            .mode(mode)
            .coalesce(coalesce)
            .deny_cache(false)
            .timeout(Duration::from_secs(2))
            .connect()
    };
    let auto = connect(RedisMode::Auto, true).await.unwrap();
    assert_eq!(auto.active_path(), Some(RedisMode::Lua));
    let (evals, cells) = flood_gcra(&server, auto, "auto").await;
    assert_eq!(cells, 0, "auto: no CL.THROTTLE");
    assert!(evals < (CHECKS / 2) as u64, "auto: {evals} script calls");

    let cell = connect(RedisMode::Cell, true).await.unwrap();
    assert_eq!(cell.active_path(), Some(RedisMode::Cell));
    let (evals, cells) = flood_gcra(&server, cell, "cell").await;
    assert_eq!(
        (evals, cells),
        (0, CHECKS as u64),
        "cell: one CL.THROTTLE a check"
    );

    let alone = connect(RedisMode::Auto, false).await.unwrap();
    assert_eq!(alone.active_path(), Some(RedisMode::Cell));
    let (evals, cells) = flood_gcra(&server, alone, "auto-alone").await;
    assert_eq!((evals, cells), (0, CHECKS as u64), "auto, not coalesced");
}

/// On a Cluster, checks of keys in different slots that wait at the same time are batched by their
/// first key's slot, never together (one script call must not span slots): every case's flood at
/// once, and each case admits exactly its limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn floods_of_keys_in_different_slots_at_once_on_a_cluster_each_admit_their_limit() {
    let cluster = RedisCluster::start();
    let builder = RedisBackend::builder().cluster_urls(cluster.urls());
    let backend = on_lua(builder, &cluster.urls()[0]).await;
    let floods: Vec<_> = cases("slots")
        .into_iter()
        .map(|(name, limits)| {
            let backend = backend.clone();
            tokio::spawn(async move {
                let got = flood(&backend, &limits, &format!("{name}-key")).await;
                (name, got)
            })
        })
        .collect();
    for flood in floods {
        let (name, got) = flood.await.unwrap();
        let admitted = got.iter().filter(|(allowed, _)| *allowed).count();
        assert_eq!(admitted, QUOTA as usize, "{name}: {admitted} admitted");
    }
}
