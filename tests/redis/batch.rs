//! Coalesced exact batches (src/backend/redis/speedup/batch.rs, gcra_batch.lua): concurrent checks on the
//! Lua path share script calls and still admit exactly the limit, on one server and on a Cluster;
//! the batch script decides every item as gcra.lua decides it alone, to the nanosecond, and leaves
//! the same state.

use crate::support::redis as redis_support;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use redis_support::{RedisCluster, RedisServer};
use tower_throttle::{
    redis::{RedisBackend, RedisMode},
    Key, Limit, Quota,
};

use crate::backend::calls;
use crate::gcra_group::{group_args, push_replies};
use crate::lua::{GCRA, GCRA_BATCH};
use crate::support::asks::Asks;

pub(crate) fn evalsha_calls(server: &RedisServer) -> u64 {
    calls(server, "evalsha")
}

/// `checks` checks of one unit on one key, all started at once; the limit admits 50 an hour.
/// Returns the `remaining` of each admitted check and the number rejected.
async fn flood(backend: &RedisBackend, name: &str, checks: usize) -> (Vec<u64>, usize) {
    let limit = Arc::new(Limit::new(name, Quota::per_hour(50)).unwrap());
    let key = Key::from(format!("{name}-one-key"));
    let tasks: Vec<_> = (0..checks)
        .map(|_| {
            let (backend, limit, key) = (backend.clone(), limit.clone(), key.clone());
            tokio::spawn(async move { backend.check_one(&limit, &key, 1).await.unwrap() })
        })
        .collect();
    let mut remaining = Vec::new();
    let mut rejected = 0;
    for task in tasks {
        let decision = task.await.unwrap();
        if decision.allowed {
            remaining.push(decision.remaining);
        } else {
            rejected += 1;
            assert_eq!(decision.remaining, 0);
            assert!(decision.retry_after.is_some());
        }
    }
    (remaining, rejected)
}

/// Exactly 50 admitted, each with its own `remaining` (49 down to 0): every check saw the state
/// the one before it left.
fn assert_exactly_fifty(name: &str, remaining: Vec<u64>, rejected: usize) {
    assert_eq!(remaining.len(), 50, "{name}: {} admitted", remaining.len());
    assert_eq!(rejected, 150, "{name}");
    let distinct: BTreeSet<u64> = remaining.into_iter().collect();
    assert_eq!(distinct, (0..50).collect(), "{name}");
}

/// 200 concurrent checks on one key with a quota of 50 admit exactly 50, in fewer script calls
/// than checks (they were coalesced).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_checks_share_calls_and_admit_exactly_the_limit() {
    let server = RedisServer::start();
    let backend = RedisBackend::builder()
        .url(server.url())
        .mode(RedisMode::Lua)
        .timeout(Duration::from_secs(2))
        .connect()
        .await
        .unwrap();
    let before = evalsha_calls(&server);
    let (remaining, rejected) = flood(&backend, "batched", 200).await;
    let calls = evalsha_calls(&server) - before;
    assert_exactly_fifty("one server", remaining, rejected);
    assert!(
        calls < 100,
        "200 concurrent checks took {calls} script calls: not coalesced"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_checks_on_a_cluster_admit_exactly_the_limit() {
    let cluster = RedisCluster::start();
    let backend = RedisBackend::builder()
        .cluster_urls(cluster.urls())
        .mode(RedisMode::Lua)
        .timeout(Duration::from_secs(2))
        .connect()
        .await
        .unwrap();
    let before: u64 = cluster.nodes().iter().map(evalsha_calls).sum();
    let (remaining, rejected) = flood(&backend, "batched-cluster", 200).await;
    let calls = cluster.nodes().iter().map(evalsha_calls).sum::<u64>() - before;
    assert_exactly_fifty("cluster", remaining, rejected);
    assert!(
        calls < 100,
        "200 concurrent checks took {calls} script calls: not coalesced"
    );
    // Several keys at once: each still admits exactly its limit.
    let limit = Arc::new(Limit::new("spread", Quota::per_hour(5)).unwrap());
    let tasks: Vec<_> = (0..160)
        .map(|i| {
            let (backend, limit) = (backend.clone(), limit.clone());
            let key = Key::from(format!("user-{}", i % 8));
            tokio::spawn(async move { (i % 8, backend.check_one(&limit, &key, 1).await.unwrap()) })
        })
        .collect();
    let mut admitted = [0; 8];
    for task in tasks {
        let (user, decision) = task.await.unwrap();
        admitted[user] += usize::from(decision.allowed);
    }
    assert_eq!(admitted, [5; 8]);
}

/// A key that holds another type fails its own checks, not those it shares a batch with.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_key_fails_only_its_own_checks() {
    let server = RedisServer::start();
    let backend = RedisBackend::builder()
        .url(server.url())
        .mode(RedisMode::Lua)
        .timeout(Duration::from_secs(2))
        .connect()
        .await
        .unwrap();
    let (failed, admitted) = with_a_foreign_key(&server, &backend, "mixed", 1000, 100, 10, |e| {
        assert!(format!("{e:?}").contains("WRONGTYPE"), "{e:?}");
    })
    .await;
    assert_eq!((failed, admitted), (10, 90));
}

/// `checks` concurrent checks of a limit of `per_hour`, every `every`-th on a key that holds a
/// hash: the checks on it fail (`failure` sees their errors), the others are decided. Returns how
/// many failed and how many were admitted.
async fn with_a_foreign_key(
    server: &RedisServer,
    backend: &RedisBackend,
    name: &str,
    per_hour: u64,
    checks: usize,
    every: usize,
    failure: fn(&tower_throttle::backend::BackendError),
) -> (usize, usize) {
    let limit = Arc::new(Limit::new(name, Quota::per_hour(per_hour)).unwrap());
    let bad = Key::from("bad");
    server.cli(&["HSET", &backend.redis_key(name, &bad), "f", "v"]);
    let tasks: Vec<_> = (0..checks)
        .map(|i| {
            let (backend, limit) = (backend.clone(), limit.clone());
            let key = if i % every == 0 {
                bad.clone()
            } else {
                Key::from("good")
            };
            tokio::spawn(async move { (i % every == 0, backend.check_one(&limit, &key, 1).await) })
        })
        .collect();
    let (mut failed, mut admitted) = (0, 0);
    for task in tasks {
        match task.await.unwrap() {
            (true, Err(e)) => {
                failure(&e);
                failed += 1;
            }
            (false, Ok(decision)) => admitted += usize::from(decision.allowed),
            (is_bad, other) => panic!("key bad={is_bad}: {other:?}"),
        }
    }
    (failed, admitted)
}

/// Both scripts on one test clock (the `TIME` line replaced by a read of a hash); metered_parity.rs
/// puts its scripts on it too.
pub(crate) fn on_a_test_clock(source: &str) -> redis::Script {
    const CLOCK: &str = "local time = redis.call('TIME')";
    assert_eq!(source.matches(CLOCK).count(), 1, "one clock line: {CLOCK}");
    redis::Script::new(&source.replace(
        CLOCK,
        "local time = redis.call('HMGET', 'test-clock', 's', 'us')",
    ))
}

/// Sets the test clock of [`on_a_test_clock`] to `now_s` seconds and `now_us` microseconds.
async fn set_test_clock(conn: &mut redis::aio::MultiplexedConnection, now_s: u64, now_us: u64) {
    let _: () = redis::cmd("HSET")
        .arg("test-clock")
        .arg("s")
        .arg(now_s)
        .arg("us")
        .arg(now_us)
        .query_async(conn)
        .await
        .unwrap();
}

struct Rng(u64);
impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) % n
    }
}

/// gcra_batch.lua decides a batch (several keys, repeated in any order, runs of identical items;
/// quotas that change under a key; quantities 0, within, beyond the burst; stored states none,
/// passed, within, beyond the tolerance, not a TAT, and a key of another type, whose items fail
/// with WRONGTYPE alone) exactly as gcra.lua decides its items one after the other at the same
/// instant: the same five numbers per item (its one backlog per group expanded by gcra_group.rs, as
/// the backend expands it), the same stored TAT and expiry per key.
#[tokio::test]
async fn a_batch_decides_each_item_as_gcra_lua_alone() {
    let server = RedisServer::start();
    let client = redis::Client::open(server.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let alone = on_a_test_clock(GCRA);
    let batch = on_a_test_clock(GCRA_BATCH);
    let mut rng = Rng(0x5eed);
    const MS: u64 = 1_000_000;
    let quotas: [(u64, u64, u64); 4] = [
        // interval, tolerance (interval × (burst + 1)), limit
        // Backlogs of a second or more: gcra.lua's writes expire in real time (PX), and must not
        // expire while the test sends its items one by one.
        (1000 * MS, 5000 * MS, 5),
        (7919 * MS, 7919 * MS * 3, 3),
        (1_000_000_007, 1_000_000_007 * 10, 10),
        (3_600_000 * MS, 3_600_000 * MS, 1),
    ];
    for round in 0..300 {
        let _: () = redis::cmd("FLUSHALL").query_async(&mut conn).await.unwrap();
        let now_s = 1_700_000_000 + rng.below(1_000_000);
        let now_us = rng.below(1_000_000);
        let now_ns = now_s * 1_000_000_000 + now_us * 1000;
        set_test_clock(&mut conn, now_s, now_us).await;
        let keys = 1 + rng.below(4);
        for k in 0..keys {
            let tolerance = quotas[rng.below(4) as usize].1;
            let stored = match rng.below(6) {
                0 => None,
                1 => Some((now_ns - rng.below(10 * MS)).to_string()),
                2 => Some((now_ns + rng.below(tolerance + 1)).to_string()),
                3 => Some((now_ns + tolerance + 1 + rng.below(tolerance)).to_string()),
                4 => Some("not a tat at all".to_owned()),
                _ => Some(format!("{}.5", now_ns + rng.below(tolerance))),
            };
            // Now and then a key of another type (a list), which fails its own items.
            let command = if rng.below(10) == 0 { "RPUSH" } else { "SET" };
            if let Some(stored) = stored {
                for side in ["a", "b"] {
                    let _: () = redis::cmd(command)
                        .arg(format!("{side}:{k}"))
                        .arg(&stored)
                        .query_async(&mut conn)
                        .await
                        .unwrap();
                }
            }
        }
        let groups = 1 + rng.below(20);
        let mut invocation = batch.prepare_invoke();
        let mut last = None;
        let mut sent = Vec::new();
        let mut expected = Vec::new();
        for _ in 0..groups {
            let k = rng.below(keys);
            let (interval, tolerance, limit) = if rng.below(8) == 0 {
                quotas[rng.below(4) as usize]
            } else {
                quotas[k as usize % 4]
            };
            let quantity = match rng.below(8) {
                0 => 0,
                1 => limit + 1,
                2 => 1 << 40,
                _ => 1 + rng.below(limit),
            };
            // A run of identical items (one group), mostly one item.
            let run = if rng.below(3) == 0 {
                1 + rng.below(8)
            } else {
                1
            };
            for _ in 0..run {
                let reply: Result<Vec<i64>, _> = alone
                    .key(format!("a:{k}"))
                    .arg(interval)
                    .arg(tolerance)
                    .arg(limit)
                    .arg(quantity)
                    .invoke_async(&mut conn)
                    .await;
                match reply {
                    Ok(reply) => expected.extend_from_slice(&reply[..5]),
                    Err(e) => {
                        assert_eq!(e.code(), Some("WRONGTYPE"), "round {round}: {e}");
                        expected.extend_from_slice(&[-1, 0, 0, 0, 0]);
                    }
                }
            }
            let (count, numbers) = group_args(
                &mut last,
                (interval, tolerance, tolerance),
                quantity,
                run as usize,
            );
            invocation.key(format!("b:{k}")).arg(count);
            if let Some(numbers) = numbers {
                invocation.arg(&numbers[..]);
            }
            sent.push(((interval, tolerance, limit), quantity, run));
        }
        // One backlog per group (-1: not a string), expanded as the backend expands it.
        let backlogs: Vec<i64> = invocation.invoke_async(&mut conn).await.unwrap();
        assert_eq!(backlogs.len(), sent.len(), "round {round}");
        let mut got = Vec::new();
        for (backlog, (quota, quantity, run)) in backlogs.into_iter().zip(sent) {
            let mut items = Vec::new();
            match u64::try_from(backlog) {
                Ok(backlog) => push_replies(&mut items, backlog, quota, quantity, run as usize),
                Err(_) => items.resize(run as usize, [-1, 0, 0, 0, 0]),
            }
            got.extend(items.into_iter().flatten());
        }
        assert_eq!(got, expected, "round {round}");
        for k in 0..keys {
            // DUMP: a string's value, or a list's (which must be left alone).
            let a: Option<Vec<u8>> = redis::cmd("DUMP")
                .arg(format!("a:{k}"))
                .query_async(&mut conn)
                .await
                .unwrap();
            let b: Option<Vec<u8>> = redis::cmd("DUMP")
                .arg(format!("b:{k}"))
                .query_async(&mut conn)
                .await
                .unwrap();
            assert_eq!(a, b, "round {round}, key {k}");
            let ta: i64 = redis::cmd("PEXPIRETIME")
                .arg(format!("a:{k}"))
                .query_async(&mut conn)
                .await
                .unwrap();
            let tb: i64 = redis::cmd("PEXPIRETIME")
                .arg(format!("b:{k}"))
                .query_async(&mut conn)
                .await
                .unwrap();
            // Same PX, set a few ms apart in real time; -1 (no expiry) only where nothing was
            // written (a stored value the test left as it was).
            assert_eq!(ta < 0, tb < 0, "round {round}, key {k}: {ta} vs {tb}");
            assert!(
                (ta - tb).abs() <= 1000,
                "round {round}, key {k}: {ta} vs {tb}"
            );
        }
    }
}

/// A group whose items straddle the limit (a key 2 units into a burst of 5, then 7 identical
/// checks of 1 unit, then 3 of 2 units): the first 3 admitted with remaining 2, 1, 0, the other 4
/// refused with the same retry, then the 3 of 2 units refused; each item's five numbers are the
/// lone gcra.lua call's, and the key is left as the lone calls leave it.
#[tokio::test]
async fn a_group_straddling_the_limit_answers_each_item_as_alone() {
    let server = RedisServer::start();
    let client = redis::Client::open(server.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let (alone, batch) = (on_a_test_clock(GCRA), on_a_test_clock(GCRA_BATCH));
    const S: u64 = 1_000_000_000;
    let (now_s, now_us) = (1_700_000_000_u64, 250_000_u64);
    set_test_clock(&mut conn, now_s, now_us).await;
    // 5 a minute, burst 5: one unit every 12 s; the key 2 units (24 s) ahead.
    let quota = (12 * S, 60 * S, 5);
    let tat = (now_s * S + now_us * 1000 + 24 * S).to_string();
    for key in ["a", "b"] {
        let _: () = redis::cmd("SET")
            .arg(key)
            .arg(&tat)
            .query_async(&mut conn)
            .await
            .unwrap();
    }
    let runs = [(1_u64, 7_usize), (2, 3)];
    let mut expected = Vec::new();
    let mut invocation = batch.prepare_invoke();
    let mut last = None;
    for (quantity, run) in runs {
        for _ in 0..run {
            let reply: Vec<i64> = alone
                .key("a")
                .arg(quota.0)
                .arg(quota.1)
                .arg(quota.2)
                .arg(quantity)
                .invoke_async(&mut conn)
                .await
                .unwrap();
            expected.push([reply[0], reply[1], reply[2], reply[3], reply[4]]);
        }
        let (count, numbers) = group_args(&mut last, (quota.0, quota.1, quota.1), quantity, run);
        invocation.key("b").arg(count);
        if let Some(numbers) = numbers {
            invocation.arg(&numbers[..]);
        }
    }
    let backlogs: Vec<i64> = invocation.invoke_async(&mut conn).await.unwrap();
    assert_eq!(backlogs, [24 * S as i64, 60 * S as i64]);
    let mut got = Vec::new();
    for ((quantity, run), backlog) in runs.into_iter().zip(backlogs) {
        push_replies(&mut got, backlog as u64, quota, quantity, run);
    }
    assert_eq!(got, expected);
    let admitted: Vec<i64> = got.iter().filter(|r| r[0] == 0).map(|r| r[2]).collect();
    assert_eq!(admitted, [2, 1, 0], "3 admitted, remaining 2, 1, 0");
    assert_eq!(
        got[3..7].iter().map(|r| r[3]).collect::<Vec<_>>(),
        [12 * S as i64; 4]
    );
    let stored: Vec<Option<String>> = redis::cmd("MGET")
        .arg("a")
        .arg("b")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(stored[0], stored[1]);
}

/// While Redis stalls, every check of a batch fails within its own timeout (the failure policy then
/// decides), and none waits for the stall to end; once Redis answers again, checks are decided
/// again on a state that is whole (a batch that reached Redis during the stall ran whole when it
/// woke; checks gone before their batch left were never sent).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_batch_fails_each_check_within_its_timeout() {
    let server = RedisServer::start();
    let backend = RedisBackend::builder()
        .url(server.url())
        .mode(RedisMode::Lua)
        .timeout(Duration::from_millis(200))
        .connect()
        .await
        .unwrap();
    let limit = Arc::new(Limit::new("stalled", Quota::per_hour(1000)).unwrap());
    let key = Key::from("stalled-key");
    server.cli(&["CLIENT", "PAUSE", "1500", "ALL"]);
    let started = tokio::time::Instant::now();
    let tasks: Vec<_> = (0..64)
        .map(|_| {
            let (backend, limit, key) = (backend.clone(), limit.clone(), key.clone());
            tokio::spawn(async move { backend.check_one(&limit, &key, 1).await })
        })
        .collect();
    for task in tasks {
        assert!(
            task.await.unwrap().is_err(),
            "a check answered while Redis was paused"
        );
    }
    // Generous: the timeout is 200 ms and the pause 1.5 s.
    assert!(
        started.elapsed() < Duration::from_millis(1200),
        "checks waited {:?} on a stalled Redis",
        started.elapsed()
    );
    // After the pause (and the breaker's probe), checks are decided again.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let decision = loop {
        if let Ok(decision) = backend.check_one(&limit, &key, 1).await {
            break decision;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "Redis never came back"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(decision.allowed);
    // The state Redis holds is whole: what it admitted (at most the 64 sent while paused, plus
    // the last) is what `remaining` says.
    assert!(decision.remaining >= 1000 - 66, "{decision:?}");
}

fn cl_throttle_calls(server: &RedisServer) -> u64 {
    calls(server, "cl.throttle")
}

/// The coalesced `CL.THROTTLE` path: 200 concurrent checks on one key with a quota of 50, sent in
/// pipelined batches, admit exactly 50, each seeing the state the one before it left, in one module
/// call each (every check is decided alone, none merged). (`Auto` takes the coalesced Lua path
/// where the module is loaded: batch_limits.rs.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_cl_throttle_checks_admit_exactly_the_limit() {
    let server = RedisServer::start_with_cell();
    for mode in [RedisMode::Cell] {
        // Without the deny cache: once the key is refused, the cache answers the checks that come
        // after without a call (40 of 200 in one CI run), and this test counts calls.
        let backend = RedisBackend::builder()
            .url(server.url())
            .mode(mode)
            .deny_cache(false)
            .timeout(Duration::from_secs(2))
            .connect()
            .await
            .unwrap();
        let (evals, cells) = (evalsha_calls(&server), cl_throttle_calls(&server));
        let name = format!("cell-batched-{mode}");
        let (remaining, rejected) = flood(&backend, &name, 200).await;
        assert_exactly_fifty(&name, remaining, rejected);
        assert_eq!(
            cl_throttle_calls(&server) - cells,
            200,
            "{name}: one call a check"
        );
        assert_eq!(
            evalsha_calls(&server),
            evals,
            "{name}: no check went to Lua"
        );
    }
}

/// A key that holds another type fails its own `CL.THROTTLE` checks, not the others of its
/// pipeline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_key_fails_only_its_own_cl_throttle_checks() {
    let server = RedisServer::start_with_cell();
    let backend = RedisBackend::builder()
        .url(server.url())
        .mode(RedisMode::Cell)
        .connect()
        .await
        .unwrap();
    // redis-cell's own error for a key it cannot read ("Cell: error: ..."), as alone.
    let (failed, admitted) = with_a_foreign_key(&server, &backend, "cf", 50, 60, 3, |_| {}).await;
    assert_eq!((failed, admitted), (20, 40));
}
