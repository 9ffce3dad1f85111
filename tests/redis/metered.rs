//! Metered limits on Redis (`Backend::check_each`, `Backend::settle`): settles from two processes
//! sum exactly; `CL.THROTTLE` sees the debt `settle.lua` leaves on its keys; a stack reserves a
//! quantity per limit, and parallel reservations admit no more than they allow; a debt is waited
//! out exactly; a peek shows it; a Cluster settles on the client's slot; what cannot be settled
//! exactly is refused when the layer is built.

use std::sync::Arc;
use std::time::Duration;

use redis::AsyncCommands;
use tokio::time::Instant;
use tower_throttle::{
    policy::Budget,
    redis::{RedisBackend, RedisMode},
    Key, Limit, Quota,
};

use crate::backend::connect;
use crate::support::asks::Asks;
use crate::support::redis::{RedisCluster, RedisServer};

const S: u64 = 1_000_000_000;

/// A plain connection, to read the keys as Redis holds them.
async fn raw(server: &RedisServer) -> redis::aio::MultiplexedConnection {
    let client = redis::Client::open(server.url()).unwrap();
    client.get_multiplexed_async_connection().await.unwrap()
}

/// The key's TAT in ns since the epoch (`None`: no state), as the scripts and redis-cell store it.
async fn tat(conn: &mut redis::aio::MultiplexedConnection, key: &str) -> Option<u64> {
    let stored: Option<String> = conn.get(key).await.unwrap();
    stored.map(|s| s.parse().unwrap())
}

/// Polls (5 s at most) until `key`'s TAT is `want`: settles land on tasks of their own.
async fn until_tat(conn: &mut redis::aio::MultiplexedConnection, key: &str, want: u64) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let now = tat(conn, key).await;
        if now == Some(want) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{key}: TAT {now:?}, want {want} (off by {:?} ns)",
            now.map(|n| n as i128 - want as i128)
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Two backends on one Redis, two "processes", settle 1,000 costs of random size on one key,
/// concurrently: the TAT moves by exactly the sum charged (one unit a second, the key far ahead of
/// now throughout, so no settle starts from an idle key and none reaches the cap).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settles_from_two_processes_sum_exactly() {
    let server = RedisServer::start();
    let mut conn = raw(&server).await;
    let processes = [
        connect(&server.url(), RedisMode::Lua).await,
        connect(&server.url(), RedisMode::Lua).await,
    ];
    let limit = Arc::new(
        Limit::new("tokens", Quota::per_hour(3600))
            .unwrap()
            .with_max_debt(1_000_000),
    );
    let key = Key::from("two-processes");
    let redis_key = processes[0].state_key(&limit, &key);
    // A reservation puts the TAT 100 s ahead.
    assert!(
        processes[0]
            .check_one(&limit, &key, 100)
            .await
            .unwrap()
            .allowed
    );
    let start = tat(&mut conn, &redis_key).await.unwrap();
    let mut rng = 0x2b0c_u64;
    let mut tasks = Vec::new();
    let mut total = 0;
    for process in &processes {
        let mut sizes = Vec::new();
        for _ in 0..500 {
            rng = rng
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let size = 1 + (rng >> 33) % 50;
            total += size;
            sizes.push(size as i64);
        }
        let (backend, limit, key) = (process.clone(), limit.clone(), key.clone());
        tasks.push(tokio::spawn(async move {
            for size in sizes {
                backend.settle(std::slice::from_ref(&*limit), &key, &[size], Duration::ZERO);
                tokio::task::yield_now().await;
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    until_tat(&mut conn, &redis_key, start + total * S).await;
    println!("1000 settles, {total} units: the TAT moved by exactly {total} s");
}

/// `settle.lua` charges into debt on a key that `CL.THROTTLE` decides (redis-cell's TAT format):
/// the module itself refuses the key until the debt is paid, and says when.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cl_throttle_sees_the_debt_a_settle_leaves() {
    let server = RedisServer::start_with_cell();
    let cell = connect(&server.url(), RedisMode::Cell).await;
    // 5 at once, one a second; up to 20 s of debt.
    let limit = Limit::new("tokens", Quota::per_second(1).with_max_burst(4))
        .unwrap()
        .with_max_debt(20);
    let key = Key::from("in-debt");
    let redis_key = cell.state_key(&limit, &key);
    let first = cell
        .check_each(std::slice::from_ref(&limit), &key, &[1])
        .await
        .unwrap();
    assert!(first[0].allowed);
    // Reserved 1, used 15: 14 more, 10 past the burst.
    cell.settle(std::slice::from_ref(&limit), &key, &[14], Duration::ZERO);
    let deadline = Instant::now() + Duration::from_secs(5);
    let reply: Vec<i64> = loop {
        // CL.THROTTLE key max_burst count period quantity: the module's own answer.
        let reply: Vec<i64> = server
            .cli(&["CL.THROTTLE", &redis_key, "4", "1", "1", "1"])
            .lines()
            .map(|l| l.trim().parse().unwrap())
            .collect();
        if reply[0] == 1 {
            break reply;
        }
        assert!(Instant::now() < deadline, "never refused: {reply:?}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    // limited, limit 5, remaining 0; the TAT is 15 s ahead (less the test's time): a request of
    // 1 waits 15 + 1 - 5 = 11 s, and the key is full again in 15 s (whole seconds, truncated).
    assert_eq!(reply[..3], [1, 5, 0], "{reply:?}");
    assert!((10..=11).contains(&reply[3]), "retry {reply:?}");
    assert!((14..=15).contains(&reply[4]), "reset {reply:?}");
    let refused = cell.check_one(&limit, &key, 1).await.unwrap();
    assert!(!refused.allowed);
    assert_eq!(refused.remaining, 0);
    assert!(
        (Duration::from_secs(10)..=Duration::from_secs(12)).contains(&refused.retry_after.unwrap()),
        "{refused:?}"
    );
    // A cost that comes in under its reservation gives back, on the module's key too.
    cell.settle(std::slice::from_ref(&limit), &key, &[-12], Duration::ZERO);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let out = server.cli(&["CL.THROTTLE", &redis_key, "4", "1", "1", "0"]);
        let reply: Vec<i64> = out.lines().map(|l| l.trim().parse().unwrap()).collect();
        // 12 back less the timeout (2 s, the bound on the time since admission): 10 s back.
        if reply[0] == 0 {
            assert!((0..=1).contains(&reply[2]), "{reply:?}");
            break;
        }
        assert!(Instant::now() < deadline, "never given back: {reply:?}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// A stack of "10 requests and 1,000 tokens an hour" reserves 1 request and an estimate of tokens
/// in one call; a refusal by one limit takes nothing from the other; 100 reservations of 50 in
/// parallel from two processes on an empty key admit exactly 20.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stack_reserves_a_quantity_per_limit() {
    let server = RedisServer::start();
    let a = connect(&server.url(), RedisMode::Lua).await;
    let b = connect(&server.url(), RedisMode::Lua).await;
    let stack = [
        Limit::new("requests", Quota::per_hour(10)).unwrap(),
        Limit::new("tokens", Quota::per_hour(1000))
            .unwrap()
            .with_max_debt(1000),
    ];
    a.validate_all(&stack).unwrap();
    let key = Key::from("stacked");
    let d = a.check_each(&stack, &key, &[1, 300]).await.unwrap();
    assert!(d.iter().all(|d| d.allowed), "{d:?}");
    assert_eq!((d[0].remaining, d[1].remaining), (9, 700));
    // 800 tokens do not fit: refused, and the request is not counted either.
    let d = a.check_each(&stack, &key, &[1, 800]).await.unwrap();
    assert!(d[0].allowed && !d[1].allowed, "{d:?}");
    assert_eq!((d[0].remaining, d[1].remaining), (9, 700));
    let states = a.peek_all(&stack, &key).await.unwrap();
    assert_eq!((states[0].remaining, states[1].remaining), (9, 700));
    // The settle of the first: it used 1,200 tokens, 900 more than reserved (200 past the burst).
    a.settle(&stack, &key, &[0, 900], Duration::ZERO);
    let deadline = Instant::now() + Duration::from_secs(5);
    let state = loop {
        let states = b.peek_all(&stack, &key).await.unwrap();
        if states[1].remaining == 0 {
            break states;
        }
        assert!(Instant::now() < deadline, "{states:?}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    // Requests untouched; tokens: 0 remaining, in debt for 200 tokens (3.6 s each) and one more.
    assert_eq!(state[0].remaining, 9);
    let retry = state[1].retry_after.unwrap();
    assert!(
        retry.abs_diff(Duration::from_millis(201 * 3600)) < Duration::from_secs(1),
        "{state:?}"
    );
    let d = b.check_each(&stack, &key, &[1, 1]).await.unwrap();
    assert!(d[0].allowed && !d[1].allowed, "{d:?}");

    // 100 reservations of 50 tokens on an empty key, in parallel from both: 1000 / 50 pass.
    let tokens = Arc::new([Limit::new("tokens", Quota::per_hour(1000))
        .unwrap()
        .with_max_debt(1000)]);
    let key = Key::from("parallel");
    let mut tasks = Vec::new();
    for i in 0..100 {
        let backend = if i % 2 == 0 { a.clone() } else { b.clone() };
        let (tokens, key) = (tokens.clone(), key.clone());
        tasks.push(tokio::spawn(async move {
            backend.check_each(&tokens[..], &key, &[50]).await.unwrap()[0].allowed
        }));
    }
    let mut admitted = 0;
    for task in tasks {
        admitted += usize::from(task.await.unwrap());
    }
    assert_eq!(admitted, 20);
}

/// A key in debt is refused with a retry time that a client can wait out exactly: a request at
/// that time passes, and the peek says the same (remaining 0, retry and reset as the debt).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_debt_is_waited_out_exactly() {
    let server = RedisServer::start();
    let lua = connect(&server.url(), RedisMode::Lua).await;
    // 2 at once, one every 100 ms; 3 units of debt at most.
    let limit = Limit::new("tokens", Quota::per_period(2, Duration::from_millis(200)))
        .unwrap()
        .with_max_debt(3);
    let key = Key::from("waits");
    assert!(lua.check_one(&limit, &key, 1).await.unwrap().allowed);
    // Reserved 1, used 100: capped at 3 past the burst of 2, 500 ms ahead.
    let mut conn = raw(&server).await;
    let redis_key = lua.state_key(&limit, &key);
    let before = tat(&mut conn, &redis_key).await;
    // Every bound below that depends on time is measured, not assumed: on a loaded machine any
    // step can take tens of milliseconds, and the numbers must still hold exactly.
    let settled = Instant::now();
    lua.settle(std::slice::from_ref(&limit), &key, &[99], Duration::ZERO);
    let deadline = Instant::now() + Duration::from_secs(5);
    while tat(&mut conn, &redis_key).await == before {
        assert!(Instant::now() < deadline, "the settle never landed");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let peeked = Instant::now();
    let state = lua
        .peek_all(std::slice::from_ref(&limit), &key)
        .await
        .unwrap()[0];
    assert_eq!(state.remaining, 0, "{state:?}");
    let checking = Instant::now();
    let refused = lua.check_one(&limit, &key, 1).await.unwrap();
    let (since_settle, since_peek) = (settled.elapsed(), peeked.elapsed());
    assert!(!refused.allowed, "{refused:?}");
    assert_eq!(refused.remaining, 0);
    let retry = refused.retry_after.unwrap();
    // The debt's 300 ms plus one interval for this request, less the time since the settle.
    let full = Duration::from_millis(400);
    let ms = Duration::from_millis(1);
    assert!(
        retry <= full && retry + since_settle + ms >= full,
        "{refused:?} {since_settle:?} after the settle"
    );
    assert!(state.retry_after.unwrap().abs_diff(retry) <= since_peek + ms);
    assert!(state.reset_after.abs_diff(refused.reset_after) <= since_peek + ms);
    // A little before the time: refused (from Redis or this process's cache), closer to the time
    // by as long as it waited; a check that a stall delayed past the time may pass, and only then.
    let asked = Instant::now();
    tokio::time::sleep_until(asked + retry.saturating_sub(Duration::from_millis(30))).await;
    let sent = asked.elapsed();
    let early = lua.check_one(&limit, &key, 1).await.unwrap();
    if early.allowed {
        // Redis decided `refused` after `checking`, and this one before now.
        assert!(
            checking.elapsed() + ms >= retry,
            "admitted early: {early:?}"
        );
    } else {
        assert!(
            early.retry_after.unwrap() <= retry.saturating_sub(sent) + ms,
            "{early:?}"
        );
    }
    tokio::time::sleep_until(asked + retry).await;
    let passed = lua.check_one(&limit, &key, 1).await.unwrap();
    assert!(passed.allowed, "{passed:?}");
    assert_eq!(passed.remaining, 0);
}

/// On a Cluster, a stack with a quantity per limit and its settle go to the client's slot: the
/// settle's keys share the hash tag the checks use, and the next check sees the debt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_settles_on_the_clients_slot() {
    let servers = RedisCluster::start();
    let cluster = crate::backend::cluster(servers.urls(), RedisMode::Lua).await;
    let stack = [
        Limit::new("requests", Quota::per_hour(10)).unwrap(),
        Limit::new("tokens", Quota::per_hour(100))
            .unwrap()
            .with_max_debt(100),
    ];
    for k in 0..8 {
        let key = Key::from(format!("client-{k}"));
        let d = cluster.check_each(&stack, &key, &[1, 10]).await.unwrap();
        assert!(d.iter().all(|d| d.allowed), "{d:?}");
        cluster.settle(&stack, &key, &[0, 150], Duration::ZERO);
        let deadline = Instant::now() + Duration::from_secs(5);
        while cluster.peek_all(&stack, &key).await.unwrap()[1].remaining > 0 {
            assert!(Instant::now() < deadline, "the settle never landed");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let d = cluster.check_each(&stack, &key, &[1, 1]).await.unwrap();
        assert!(d[0].allowed && !d[1].allowed, "{d:?}");
        assert_eq!(d[1].remaining, 0);
        // 160 tokens used of 100 (36 s each): 60 in debt, plus this request.
        let retry = d[1].retry_after.unwrap();
        assert!(
            retry.abs_diff(Duration::from_secs(61 * 36)) < Duration::from_secs(1),
            "{d:?}"
        );
    }
}

/// Metered limits the backend cannot settle exactly are refused when the layer is built, with
/// a message that says why: a leased budget, a debt the scripts cannot hold exactly, another
/// algorithm.
#[tokio::test]
async fn metered_limits_redis_cannot_settle_exactly_are_refused() {
    let redis = RedisBackend::builder()
        .url("redis://127.0.0.1:1/")
        .build()
        .unwrap();
    assert!(redis.can_settle());
    let tokens = Limit::new("tokens", Quota::per_minute(100_000)).unwrap();
    redis
        .validate_one(&tokens.clone().with_max_debt(100_000))
        .unwrap();
    let budgeted = tokens
        .clone()
        .with_max_debt(10)
        .with_budget(Budget::new())
        .unwrap();
    let why = redis.validate_one(&budgeted).unwrap_err().to_string();
    assert!(why.contains("leased budget"), "{why}");
    let endless = tokens.clone().with_max_debt(u64::MAX / 2);
    let why = redis.validate_one(&endless).unwrap_err().to_string();
    assert!(why.contains("max_debt"), "{why}");
    let why = redis
        .validate_all(&[Limit::new("r", Quota::per_minute(60)).unwrap(), endless])
        .unwrap_err()
        .to_string();
    assert!(why.contains("max_debt"), "{why}");
    let window = Limit::with_algorithm(
        "w",
        tower_throttle::Algorithm::FixedWindow,
        Quota::per_minute(10),
    )
    .unwrap()
    .with_max_debt(5);
    let why = redis.validate_one(&window).unwrap_err().to_string();
    assert!(why.contains("GCRA"), "{why}");
}

/// Metered checks are coalesced like the others (gcra_batch.lua with the limits' ceilings): 200
/// concurrent checks on one key admit exactly the limit in fewer calls than checks; and once the
/// key is in debt, concurrent checks are all refused until it is paid (the batch reads the debt as
/// debt, not as another quota's state).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metered_checks_are_coalesced_and_keep_the_debt() {
    let server = RedisServer::start();
    let lua = connect(&server.url(), RedisMode::Lua).await;
    // 50 at once, one every 72 s; 50 more in debt at most.
    let limit = Arc::new(
        Limit::new("tokens", Quota::per_hour(50))
            .unwrap()
            .with_max_debt(50),
    );
    let key = Key::from("coalesced");
    let flood = |n: usize| {
        let tasks: Vec<_> = (0..n)
            .map(|_| {
                let (lua, limit, key) = (lua.clone(), limit.clone(), key.clone());
                tokio::spawn(async move { lua.check_one(&limit, &key, 1).await.unwrap() })
            })
            .collect();
        async move {
            let mut decisions = Vec::new();
            for task in tasks {
                decisions.push(task.await.unwrap());
            }
            decisions
        }
    };
    let before = crate::batch::evalsha_calls(&server);
    let decisions = flood(200).await;
    let calls = crate::batch::evalsha_calls(&server) - before;
    assert_eq!(decisions.iter().filter(|d| d.allowed).count(), 50);
    assert!(calls < 100, "200 concurrent checks took {calls} calls");
    // 30 more than reserved: 30 units (36 min) in debt.
    lua.settle(std::slice::from_ref(&*limit), &key, &[30], Duration::ZERO);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let state = lua
            .peek_all(std::slice::from_ref(&*limit), &key)
            .await
            .unwrap()[0];
        if state.retry_after > Some(Duration::from_secs(30 * 72)) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the settle never landed: {state:?}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    for d in flood(100).await {
        assert!(!d.allowed, "{d:?}");
        assert_eq!(d.remaining, 0);
        let retry = d.retry_after.unwrap();
        assert!(
            retry.abs_diff(Duration::from_secs(31 * 72)) < Duration::from_secs(2),
            "{d:?}"
        );
    }
}

/// Issue 26's "1,000 streams, 10 % aborted, charged exactly the tokens sent", at the backend: on
/// each path (Lua, and `CL.THROTTLE` for the reservations), two processes run 1,000 concurrent
/// streams over 10 keys; each reserves an estimate, "sends" tokens, a tenth stop early, and each
/// settles what it sent less its estimate. Every key's TAT then moves by exactly the tokens its
/// streams sent. (Each stream sends at least its estimate here: what comes back under the
/// estimate is given back less the time since admission, by design, so only charges sum exactly.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_are_charged_exactly_the_tokens_they_sent() {
    let server = RedisServer::start_with_cell();
    let mut conn = raw(&server).await;
    for mode in [RedisMode::Lua, RedisMode::Cell] {
        let processes = [
            connect(&server.url(), mode).await,
            connect(&server.url(), mode).await,
        ];
        // One token a second, 86,400 at once: no reservation is refused (a key's streams send
        // about 5,500), and every key stays far ahead of now (so each charge counts in full).
        let limit = Arc::new(
            [Limit::new(format!("tokens-{mode}"), Quota::per_day(86_400))
                .unwrap()
                .with_max_debt(1_000_000)],
        );
        let keys: Vec<Key> = (0..10).map(|k| Key::from(format!("api-key-{k}"))).collect();
        let mut start = Vec::new();
        for key in &keys {
            assert!(
                processes[0]
                    .check_each(&limit[..], key, &[10])
                    .await
                    .unwrap()[0]
                    .allowed
            );
            start.push(
                tat(&mut conn, &processes[0].state_key(&limit[0], key))
                    .await
                    .unwrap(),
            );
        }
        let mut rng = 0x57ea_u64;
        let mut next = move |n: u64| {
            rng = rng
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (rng >> 33) % n
        };
        let mut sent = [0u64; 10];
        let mut tasks = Vec::new();
        for stream in 0..1000 {
            let k = next(10) as usize;
            let estimate = 1 + next(10);
            let planned = estimate + next(100);
            // A tenth of the clients go away mid-stream: charged what was sent, never zero.
            let aborted = stream % 10 == 0;
            let tokens = if aborted {
                estimate + next(planned - estimate + 1) / 2
            } else {
                planned
            };
            sent[k] += tokens;
            let backend = processes[stream % 2].clone();
            let (limit, key) = (limit.clone(), keys[k].clone());
            tasks.push(tokio::spawn(async move {
                let reserved = backend.check_each(&limit[..], &key, &[estimate]).await;
                assert!(reserved.unwrap()[0].allowed);
                for _ in 0..next_yield(tokens) {
                    tokio::task::yield_now().await;
                }
                let delta = (tokens - estimate) as i64;
                backend.settle(&limit[..], &key, &[delta], Duration::ZERO);
            }));
        }
        for task in tasks {
            task.await.unwrap();
        }
        for (k, key) in keys.iter().enumerate() {
            let redis_key = processes[0].state_key(&limit[0], key);
            until_tat(&mut conn, &redis_key, start[k] + sent[k] * S).await;
        }
        let total: u64 = sent.iter().sum();
        println!("{mode}: 1000 streams (100 aborted), {total} tokens, charged exactly");
    }
}

/// A stream "sends" its tokens over a few scheduler turns, so streams interleave.
fn next_yield(tokens: u64) -> u64 {
    tokens % 4
}
