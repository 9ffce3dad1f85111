//! limits_batch.lua against limits.lua alone (src/backend/redis/wire/limits_batch.lua): random batches
//! of every algorithm and stacks, run once as one batch and once as lone calls, on a test clock,
//! leave the same replies and the same keys (values, members, scores and expiries), including
//! batches one after the other across window boundaries, hot keys checked by several items of a
//! batch (the batch's cache of string states), and keys used by two limits of another kind.

use crate::support::redis::RedisServer;

use crate::algorithms::Rng;
use crate::batch::on_a_test_clock;
use crate::lua::{LIMITS, LIMITS_BATCH};

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

/// One item of a batch: its keys' names on a side (`{c}:<side>:<name>`) and its arguments.
struct Item {
    names: Vec<String>,
    args: Vec<u64>,
}

/// The odd items of a round: a key named twice by one item (which limits_batch.lua runs directly),
/// of which by limits of two kinds, and a limit of another algorithm or quota on a limit's key (as
/// a reloaded table may send).
#[derive(Default)]
struct Odd {
    twice: usize,
    mixed: usize,
    reshaped: usize,
}

/// One random item on `limits`: one limit or a stack of them (now and then an odd one, counted in
/// `odd`), a quantity (0, 1, 7, or one per limit), and now and then a penalty box.
fn random_item(rng: &mut Rng, limits: &[[u64; 4]], token: u64, odd: &mut Odd) -> Item {
    let mut chosen: Vec<usize> = Vec::new();
    let repeat = rng.below(8) == 0;
    for _ in 0..1 + rng.below(3) {
        let l = rng.below(limits.len() as u64) as usize;
        if repeat || !chosen.contains(&l) {
            chosen.push(l);
        }
    }
    let mut specs: Vec<[u64; 4]> = chosen.iter().map(|&l| limits[l]).collect();
    if let Some(i) = (1..chosen.len()).find(|&i| chosen[..i].contains(&chosen[i])) {
        odd.twice += 1;
        if rng.below(2) == 0 {
            specs[i] = random_limit(rng);
            odd.mixed += usize::from(specs[i][0] != limits[chosen[i]][0]);
        }
    }
    if rng.below(16) == 0 {
        odd.reshaped += 1;
        specs[0] = random_limit(rng);
    }
    let n = chosen.len() as u64;
    let quantity = match rng.below(6) {
        0 => 0,
        1 => 7,
        _ => 1,
    };
    let penalty = rng.below(4) == 0;
    let mut args: Vec<u64> = vec![n, quantity, token, 0, 0, 0];
    if penalty {
        args[3..6].copy_from_slice(&[2, 60_000, 60_000]);
    }
    for spec in &specs {
        args.extend_from_slice(spec);
    }
    if rng.below(3) == 0 {
        // Ceilings (the tolerance: none metered here), then one quantity per limit.
        args.extend(specs.iter().map(|spec| spec[3]));
        args.extend(chosen.iter().map(|_| rng.below(3)));
    }
    let mut names: Vec<String> = chosen.iter().map(|l| l.to_string()).collect();
    if penalty {
        names.extend(["strikes".to_owned(), "ban".to_owned()]);
    }
    Item { names, args }
}

fn side_key(side: &str, name: &str) -> String {
    format!("{{c}}:{side}:{name}")
}

/// The server's own clock (not the scripts' test clock), in ms, rounded down or up.
async fn server_ms(conn: &mut redis::aio::MultiplexedConnection, up: bool) -> i64 {
    let (s, us): (i64, i64) = redis::cmd("TIME").query_async(conn).await.unwrap();
    s * 1000 + (us + if up { 999 } else { 0 }) / 1000
}

/// The next instant of the test clock: a little later (the same windows), or just past the next
/// boundary of 10 s, 1 min or 1 h (the second true). Either way at least 1.4 s before the next
/// boundary of every period used, if `now_us` was 2 s before (the first instant of a round) or
/// less than 1 s after one.
fn advance(rng: &mut Rng, now_us: u64) -> (u64, bool) {
    match rng.below(4) {
        0 => (now_us + rng.below(300_000), false),
        k => {
            let period = [10, 60, 3600][k as usize - 1] * 1_000_000;
            ((now_us / period + 1) * period + rng.below(300_000), true)
        }
    }
}

/// limits_batch.lua decides a batch (single limits of every algorithm and stacks, on keys shared
/// between items in any order, several items on one key, with and without a penalty box,
/// quantities 0, within and beyond the limit, one quantity per limit; stored states none, partial,
/// full and foreign; a key named twice by one item; a key used by a limit of another kind) exactly
/// as limits.lua decides its items one after the other at the same instant, and so do the next
/// batches of the round at later instants, across window boundaries: the same reply per item, the
/// same keys left behind after each batch (values, members and scores, and expiries: each set by
/// the same PX, so the batch's expiry is at most the round's run time after the lone calls').
#[tokio::test]
async fn a_limits_batch_decides_each_item_as_limits_lua_alone() {
    let server = RedisServer::start();
    let client = redis::Client::open(server.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let alone = on_a_test_clock(LIMITS);
    let batch = on_a_test_clock(LIMITS_BATCH);
    let mut rng = Rng(0xba7c);
    let (mut failed, mut banned, mut hot, mut crossed) = (0, 0, 0, 0);
    let mut odd = Odd::default();
    for round in 0..200 {
        run(&mut conn, &strings(&["FLUSHALL"])).await;
        // At least 2 s before a boundary of every period used (10 s, 1 min, 1 h): no key is
        // written with an expiry that may pass while the test runs.
        let now_s = 1_700_000_000 + 10 * rng.below(100_000) + rng.below(8);
        let mut now_us = now_s * 1_000_000 + rng.below(1_000_000);
        // A few clients' limits: each limit's kind is fixed by its key, as a backend's would be.
        let limits: Vec<[u64; 4]> = (0..1 + rng.below(6))
            .map(|_| random_limit(&mut rng))
            .collect();
        for (l, spec) in limits.iter().enumerate() {
            // The same seed on both sides.
            let state = rng.0;
            for side in ["a", "b"] {
                rng.0 = state;
                for command in seed(&side_key(side, &l.to_string()), spec[0], now_us, &mut rng) {
                    run(&mut conn, &command).await;
                }
            }
        }
        let started_ms = server_ms(&mut conn, false).await;
        for step in 0..1 + rng.below(3) {
            if step > 0 {
                let (next, boundary) = advance(&mut rng, now_us);
                now_us = next;
                crossed += usize::from(boundary);
            }
            let clock = [
                "HSET".to_owned(),
                "test-clock".to_owned(),
                "s".to_owned(),
                (now_us / 1_000_000).to_string(),
                "us".to_owned(),
                (now_us % 1_000_000).to_string(),
            ];
            run(&mut conn, &clock).await;
            let items = 1 + rng.below(12);
            let mut batch_call = batch.prepare_invoke();
            batch_call.arg(items);
            let mut expected: Vec<redis::Value> = Vec::new();
            // Per limit, the items that check its key (a hot key: several in one batch).
            let mut uses = vec![0; limits.len()];
            for item in 0..items {
                let Item { names, args } =
                    random_item(&mut rng, &limits, 1000 * step + item, &mut odd);
                for (l, count) in uses.iter_mut().enumerate() {
                    *count += usize::from(names.contains(&l.to_string()));
                }
                let n = args[0];
                let mut call = alone.prepare_invoke();
                for name in &names {
                    call.key(side_key("a", name));
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
                batch_call.arg(names.len()).arg(args.len());
                for arg in &args {
                    batch_call.arg(*arg);
                }
                for name in &names {
                    batch_call.key(side_key("b", name));
                }
            }
            // A string state (GCRA, fixed or sliding window) checked by 3 items or more.
            hot += usize::from(
                (0..limits.len()).any(|l| uses[l] >= 3 && limits[l][0] != 1 && limits[l][0] != 4),
            );
            let got: Vec<redis::Value> = batch_call.invoke_async(&mut conn).await.unwrap();
            let ended_ms = server_ms(&mut conn, true).await;
            let at = format!("round {round}, step {step}");
            same_replies(&got, &expected, &at);
            let mut names: Vec<String> = (0..limits.len()).map(|l| l.to_string()).collect();
            names.extend(["strikes".to_owned(), "ban".to_owned()]);
            for name in names {
                let at = format!("{at}, {name}");
                same_keys(&mut conn, &name, ended_ms - started_ms, &at).await;
            }
        }
    }
    let Odd {
        twice,
        mixed,
        reshaped,
    } = odd;
    assert!(
        failed > 10 && banned > 10 && hot > 100 && crossed > 50,
        "{failed} items failed, {banned} banned, {hot} batches with a hot key, {crossed} crossed \
         a boundary: too few"
    );
    assert!(
        twice > 20 && mixed > 5 && reshaped > 20,
        "{twice} items named a key twice, {mixed} by two kinds, {reshaped} reshaped: too few"
    );
}

/// The batch's reply against the lone calls': the same, but for an error's text (its code,
/// WRONGTYPE, is what both share) and a ban's time left, read from its key's expiry (PTTL, real
/// time, whole ms), which moves on while the items are sent one at a time: within 100 ms.
fn same_replies(got: &[redis::Value], expected: &[redis::Value], at: &str) {
    let got: Vec<redis::Value> = got
        .iter()
        .map(|v| match v {
            redis::Value::BulkString(text) => {
                let text = String::from_utf8_lossy(text).into_owned();
                let code = text.split(' ').next().unwrap_or("").to_owned();
                redis::Value::BulkString(code.into_bytes())
            }
            other => other.clone(),
        })
        .collect();
    assert_eq!(got.len(), expected.len(), "{at}: {got:?}\n{expected:?}");
    for (i, (g, e)) in got.iter().zip(expected).enumerate() {
        let ban_time = match (g, e) {
            (redis::Value::Int(g), redis::Value::Int(e)) => {
                g % 1_000_000 == 0 && e % 1_000_000 == 0 && (g - e).abs() <= 100_000_000
            }
            _ => false,
        };
        assert!(
            g == e || ban_time,
            "{at}, value {i}: {g:?} vs {e:?}\n{got:?}\n{expected:?}"
        );
    }
}

/// Key `name` the same on both sides: its type, its value (a string's, or a sorted set's members
/// and scores), and its expiry: none on both, or set by the same PX, the batch's after the lone
/// calls' by at most `elapsed_ms` (the round's run time so far).
async fn same_keys(
    conn: &mut redis::aio::MultiplexedConnection,
    name: &str,
    elapsed_ms: i64,
    at: &str,
) {
    let (a, b) = (side_key("a", name), side_key("b", name));
    let type_of = |key: &str| strings(&["TYPE", key]);
    let kind: String = redis::from_redis_value(run(conn, &type_of(&a)).await).unwrap();
    let kind_b: String = redis::from_redis_value(run(conn, &type_of(&b)).await).unwrap();
    assert_eq!(kind, kind_b, "{at}");
    let dump = |key: &str| match kind.as_str() {
        "zset" => Some(strings(&["ZRANGE", key, "0", "-1", "WITHSCORES"])),
        "string" => Some(strings(&["GET", key])),
        _ => None,
    };
    if let (Some(da), Some(db)) = (dump(&a), dump(&b)) {
        let (va, vb) = (run(conn, &da).await, run(conn, &db).await);
        assert_eq!(va, vb, "{at}");
    }
    let expiry = |key: &str| strings(&["PEXPIRETIME", key]);
    let ta: i64 = redis::from_redis_value(run(conn, &expiry(&a)).await).unwrap();
    let tb: i64 = redis::from_redis_value(run(conn, &expiry(&b)).await).unwrap();
    assert_eq!(ta < 0, tb < 0, "{at}: expiries {ta} vs {tb}");
    assert!(
        ta < 0 || (0..=elapsed_ms).contains(&(tb - ta)),
        "{at}: expiries {ta} vs {tb}, {elapsed_ms} ms apart at most"
    );
}
