//! The Redis backend against real servers: parity with the memory backend on both paths, exact
//! admission under concurrency (one server and a Cluster), mode detection, keys, quota changes.
//!
//! The servers come from `tests/support/redis.rs`; `bash scripts/test.sh` installs what they need.

use crate::support::redis as redis_support;

use std::sync::Arc;
use std::time::Duration;

use crate::support::asks::Asks;
use redis_support::{RedisCluster, RedisServer};
use tokio::time::Instant;
use tower_throttle::{
    gcra,
    policy::Penalty,
    redis::{RedisBackend, RedisMode},
    Decision, Key, Limit, MemoryBackend, Quota,
};

pub(crate) async fn connect(url: &str, mode: RedisMode) -> RedisBackend {
    RedisBackend::builder()
        .url(url)
        .mode(mode)
        .timeout(Duration::from_secs(2))
        .connect()
        .await
        .unwrap_or_else(|e| panic!("connect {url} ({mode}): {e:?}"))
}

pub(crate) async fn cluster(urls: Vec<String>, mode: RedisMode) -> RedisBackend {
    RedisBackend::builder()
        .cluster_urls(urls)
        .mode(mode)
        .timeout(Duration::from_secs(2))
        .connect()
        .await
        .unwrap_or_else(|e| panic!("connect cluster ({mode}): {e:?}"))
}

fn limit(name: &str, quota: Quota) -> Limit {
    Limit::new(name, quota).unwrap()
}

/// One request of the parity schedule: at `at` (from the start), `quantity` units.
#[derive(Clone, Copy, Debug)]
struct Step {
    at: Duration,
    quantity: u64,
}

/// A schedule of bursts (quantity 1 to 3, sometimes more than the bucket holds) and idle gaps, in
/// which no request lies within `margin` of a boundary where its decision or `remaining` would
/// change. Real clocks then give every backend the same allowed / remaining sequence, though each
/// reads its own clock a little apart from the others.
fn schedule(params: &gcra::GcraParams, steps: usize, margin: u64, seed: u64) -> Vec<Step> {
    let interval = params.emission_interval();
    let tau = params.tolerance();
    let mut rng = seed;
    let mut next = move |n: u64| {
        rng = rng
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (rng >> 33) % n
    };
    // Whether a request at `now` with this TAT is at least `margin` from every boundary. A TAT set in
    // the same burst (`anchor == now`) is exempt: within a burst the clocks only move forward, which
    // moves every boundary away (it is hit exactly, in the admitting direction).
    let clear = |tat: Option<u64>, anchor: u64, now: u64, quantity: u64| -> bool {
        let Some(tat) = tat else { return true };
        let increment = interval * quantity;
        if increment > tau || anchor == now || tat + margin <= now {
            // Never admitted; or exact within the burst; or the TAT has passed, so the decision and
            // `remaining` no longer depend on the time.
            return true;
        }
        if tat < now + margin {
            return false;
        }
        let new_tat = tat + increment;
        if (now + tau).abs_diff(new_tat) < margin {
            return false;
        }
        // remaining = floor((tau - ttl) / T), where ttl moves with the clock.
        let ttl = if new_tat <= now + tau {
            new_tat - now
        } else {
            tat - now
        };
        let x = tau.saturating_sub(ttl) % interval;
        x >= margin && interval - x >= margin
    };
    let decide = |tat: Option<u64>, anchor: u64, now: u64, quantity: u64| {
        let out = gcra::decide(tat, now, params, quantity);
        let reset = out.new_tat.is_some() && tat.is_none_or(|tat| tat <= now);
        (out.new_tat, if reset { now } else { anchor })
    };
    let mut out = Vec::new();
    let mut tat: Option<u64> = None;
    let mut anchor = 0;
    let start = 10 * tau; // any origin; only differences matter
    let mut now = start;
    while out.len() < steps {
        let burst = 1 + next(4);
        let quantities: Vec<u64> = (0..burst)
            .map(|_| match next(10) {
                0 => params.limit() + 1, // larger than the bucket
                1 | 2 => 2,
                3 => 3,
                _ => 1,
            })
            .collect();
        // An idle gap of 0 to 2 tolerances, nudged until every request of the burst is clear.
        let mut gap = if out.is_empty() { 0 } else { next(2 * tau) };
        loop {
            let (mut t, mut a) = (tat, anchor);
            let at = now + gap;
            let ok = quantities.iter().all(|&q| {
                let ok = clear(t, a, at, q);
                (t, a) = decide(t, a, at, q);
                ok
            });
            if ok {
                break;
            }
            gap += margin / 2;
        }
        now += gap;
        for q in quantities {
            (tat, anchor) = decide(tat, anchor, now, q);
            out.push(Step {
                at: Duration::from_nanos(now - start),
                quantity: q,
            });
        }
    }
    out
}

fn close(a: Duration, b: Duration, within: Duration) -> bool {
    a.abs_diff(b) <= within
}

/// Every script is loaded when a backend connects (and so after each restart or failover, which
/// Redis keeps no script across): no first call of one pays `NOSCRIPT`'s two more round trips.
#[tokio::test]
async fn every_script_is_loaded_at_connect() {
    let server = RedisServer::start();
    let cached = || {
        let info = server.cli(&["INFO", "memory"]);
        let line = info
            .lines()
            .find(|l| l.starts_with("number_of_cached_scripts:"));
        line.unwrap()
            .trim_end()
            .rsplit(':')
            .next()
            .unwrap()
            .parse::<u32>()
            .unwrap()
    };
    assert_eq!(cached(), 0);
    let _backend = connect(&server.url(), RedisMode::Lua).await;
    // The deciding scripts (GCRA, limits, their batches, CL.THROTTLE's), settle, budget, renew.
    assert_eq!(cached(), 8);
}

/// A quota of more than a million a second is not `CL.THROTTLE`'s (redis-cell counts what
/// remains in whole microseconds of the interval, and under one says i64::MAX remain): mode Cell
/// refuses it at build, and `Auto` decides it on the script, exactly.
#[tokio::test]
async fn a_quota_past_a_million_a_second_is_not_cl_throttle_s() {
    let server = RedisServer::start_with_cell();
    let fast = limit("two-million", Quota::per_second(2_000_000));
    let cell = connect(&server.url(), RedisMode::Cell).await;
    use tower_throttle::Backend as _;
    let refused = cell
        .validate(
            std::slice::from_ref(&fast),
            tower_throttle::backend::Uses::NOTHING_MORE,
        )
        .unwrap_err();
    assert!(
        refused.to_string().contains("use mode \"lua\""),
        "{refused}"
    );
    let auto = auto_alone(&server, "fast").await;
    let memory = MemoryBackend::new();
    let key = Key::from("fast");
    for _ in 0..3 {
        let (m, a) = (
            memory.check_one(&fast, &key, 1).await.unwrap(),
            auto.check_one(&fast, &key, 1).await.unwrap(),
        );
        assert_eq!((a.allowed, a.remaining), (m.allowed, m.remaining), "{a:?}");
    }
}

/// Memory, Lua and `CL.THROTTLE` see the same requests at the same times and must agree.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_lua_and_cell_agree() {
    let server = RedisServer::start_with_cell();
    let lua = connect(&server.url(), RedisMode::Lua).await;
    let cell = connect(&server.url(), RedisMode::Cell).await;
    let memory = MemoryBackend::new();
    // 5 at once, then one every 200 ms. Lua and Cell get their own policy names: their own keys.
    let quota = Quota::per_period(5, Duration::from_secs(1)).with_max_burst(4);
    let on_memory = limit("parity", quota);
    let on_lua = limit("parity-lua", quota);
    let on_cell = limit("parity-cell", quota);
    let params = *on_memory.gcra().unwrap();
    let margin = Duration::from_millis(40);
    let steps = schedule(&params, 60, margin.as_nanos() as u64, 7);
    let key = Key::from("client-1");

    let start = Instant::now() + Duration::from_millis(50);
    let mut admitted = 0;
    let mut limited = 0;
    let mut oversized = 0;
    for (i, step) in steps.iter().enumerate() {
        tokio::time::sleep_until(start + step.at).await;
        let (m, l, c) = tokio::join!(
            memory.check_one(&on_memory, &key, step.quantity),
            lua.check_one(&on_lua, &key, step.quantity),
            cell.check_one(&on_cell, &key, step.quantity),
        );
        let (m, l, c): (Decision, Decision, Decision) = (m.unwrap(), l.unwrap(), c.unwrap());
        let context = format!("step {i} {step:?}\n memory {m:?}\n lua    {l:?}\n cell   {c:?}");
        for other in [&l, &c] {
            assert_eq!(m.allowed, other.allowed, "{context}");
            assert_eq!(m.limit, other.limit, "{context}");
            assert_eq!(m.remaining, other.remaining, "{context}");
            assert_eq!(
                m.retry_after.is_some(),
                other.retry_after.is_some(),
                "{context}"
            );
        }
        // Lua: nanoseconds on the server's clock. Cell: the next whole second above the exact value.
        assert!(close(m.reset_after, l.reset_after, margin), "{context}");
        if let (Some(mr), Some(lr)) = (m.retry_after, l.retry_after) {
            assert!(close(mr, lr, margin), "{context}");
        }
        // Quantities beyond the limit never reach redis-cell (it overflows on them): Cell mode runs
        // the script for them, with the script's precision.
        let on_script = step.quantity > params.limit();
        let whole_second_above = |exact: Duration, cell: Duration| {
            if on_script {
                return close(exact, cell, margin);
            }
            cell.subsec_nanos() == 0
                && exact <= cell + margin
                && cell <= exact + Duration::from_secs(1) + margin
        };
        if m.reset_after > margin {
            assert!(
                whole_second_above(m.reset_after, c.reset_after),
                "{context}"
            );
        }
        if let (Some(mr), Some(cr)) = (m.retry_after, c.retry_after) {
            assert!(whole_second_above(mr, cr), "{context}");
            assert!(c.retry_after_secs() >= 1, "{context}");
        }
        match (m.allowed, m.retry_after) {
            (true, _) => admitted += 1,
            (false, Some(_)) => limited += 1,
            (false, None) => oversized += 1,
        }
    }
    // The schedule exercised every kind of answer.
    assert!(
        admitted > 10 && limited > 5 && oversized > 0,
        "{admitted} {limited} {oversized}"
    );
}

/// `concurrency` clients (each its own connection), `requests` each, one key: exactly the limit passes.
async fn admits_exactly_the_limit(backends: Vec<RedisBackend>, name: &str) {
    const TASKS_PER_BACKEND: usize = 4;
    const REQUESTS: usize = 40;
    // 100 at once, then one every 36 s: nothing refills during the test.
    let limit = Arc::new(limit(name, Quota::per_hour(100)));
    let key = Key::from(format!("{name}-hot-key"));
    let mut tasks = Vec::new();
    for backend in &backends {
        for _ in 0..TASKS_PER_BACKEND {
            let (backend, limit, key) = (backend.clone(), limit.clone(), key.clone());
            tasks.push(tokio::spawn(async move {
                let mut admitted = 0;
                for _ in 0..REQUESTS {
                    let decision = backend.check_one(&limit, &key, 1).await.unwrap();
                    admitted += usize::from(decision.allowed);
                }
                admitted
            }));
        }
    }
    let mut admitted = 0;
    for task in tasks {
        admitted += task.await.unwrap();
    }
    let sent = backends.len() * TASKS_PER_BACKEND * REQUESTS;
    assert_eq!(admitted, 100, "{name}: {admitted} of {sent} admitted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lua_admits_exactly_the_limit_under_concurrency() {
    let server = RedisServer::start();
    let mut backends = Vec::new();
    for _ in 0..4 {
        backends.push(connect(&server.url(), RedisMode::Lua).await);
    }
    admits_exactly_the_limit(backends, "lua").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cell_admits_exactly_the_limit_under_concurrency() {
    let server = RedisServer::start_with_cell();
    let mut backends = Vec::new();
    for _ in 0..4 {
        backends.push(connect(&server.url(), RedisMode::Cell).await);
    }
    admits_exactly_the_limit(backends, "cell").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_admits_exactly_the_limit_and_keys_live_on_their_slot() {
    let cluster_servers = RedisCluster::start();
    for mode in [RedisMode::Lua, RedisMode::Cell] {
        let mut backends = Vec::new();
        for _ in 0..3 {
            backends.push(cluster(cluster_servers.urls(), mode).await);
        }
        assert_eq!(backends[0].active_path(), Some(mode));
        let name = format!("cluster-{mode}");
        admits_exactly_the_limit(backends.clone(), &name).await;

        // Many keys spread over the slots; each is stored on the node that owns its slot (for
        // CL.THROTTLE too, which declares no key and is routed by its first argument).
        let limit = limit(&name, Quota::per_minute(10));
        for i in 0..30 {
            let key = Key::from(format!("user-{i}"));
            assert!(
                backends[0]
                    .check_one(&limit, &key, 1)
                    .await
                    .unwrap()
                    .allowed
            );
            let redis_key = backends[0].redis_key(&name, &key);
            let holders: Vec<u16> = cluster_servers
                .nodes()
                .iter()
                .filter(|node| node.cli_result(&["EXISTS", &redis_key]).as_deref() == Ok("1"))
                .map(|node| node.port())
                .collect();
            assert_eq!(holders.len(), 1, "{redis_key} on {holders:?}");
        }
    }
    // Every primary has the module, and Auto still takes the coalesced Lua path (its rule).
    let auto = cluster(cluster_servers.urls(), RedisMode::Auto).await;
    assert_eq!(auto.active_path(), Some(RedisMode::Lua));
}

/// An `Auto` backend named `name` on `server` whose checks are not coalesced: it follows the
/// module (`CL.THROTTLE` where loaded).
async fn auto_alone(server: &RedisServer, name: &str) -> RedisBackend {
    RedisBackend::builder()
        .url(server.url())
        .name(name)
        .mode(RedisMode::Auto)
        .coalesce(false)
        .timeout(Duration::from_secs(2))
        .connect()
        .await
        .unwrap()
}

#[tokio::test]
async fn auto_follows_the_module() {
    let plain = RedisServer::start();
    let auto = connect(&plain.url(), RedisMode::Auto).await;
    assert_eq!(auto.active_path(), Some(RedisMode::Lua));
    let err = RedisBackend::builder()
        .url(plain.url())
        .mode(RedisMode::Cell)
        .connect()
        .await
        .unwrap_err();
    assert!(format!("{err:?}").contains("redis-cell"), "{err:?}");

    // With the module loaded, Auto picks the coalesced Lua path (its rule), and follows the
    // module only where checks are not coalesced: below.
    let with_cell = RedisServer::start_with_cell();
    let auto = connect(&with_cell.url(), RedisMode::Auto).await;
    assert_eq!(auto.active_path(), Some(RedisMode::Lua));
    let auto = auto_alone(&with_cell, "follows").await;
    assert_eq!(auto.active_path(), Some(RedisMode::Cell));
    let limit = limit("auto", Quota::per_minute(3));
    let key = Key::from("k");
    let first = auto.check_one(&limit, &key, 1).await.unwrap();
    assert_eq!((first.allowed, first.remaining), (true, 2));

    // The module goes away: the next decision runs on Lua, from the same state.
    with_cell.cli(&["MODULE", "UNLOAD", "redis-cell"]);
    let second = auto.check_one(&limit, &key, 1).await.unwrap();
    assert_eq!(auto.active_path(), Some(RedisMode::Lua));
    assert_eq!((second.allowed, second.remaining), (true, 1));

    // It comes back and the connection is lost: after reconnecting, CL.THROTTLE again.
    let module = redis_support::redis_cell_module();
    with_cell.cli(&["MODULE", "LOAD", module.to_str().unwrap()]);
    with_cell.cli(&["CLIENT", "KILL", "TYPE", "normal"]);
    // Detected beside the first decision after it (which may still run on Lua).
    let mut third = None;
    for _ in 0..50 {
        if third.is_none() {
            third = auto.check_one(&limit, &key, 1).await.ok();
        }
        if third.is_some() && auto.active_path() == Some(RedisMode::Cell) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let third = third.expect("no decision after the reconnect");
    assert_eq!((third.allowed, third.remaining), (true, 0));
    assert_eq!(auto.active_path(), Some(RedisMode::Cell));
}

#[tokio::test]
async fn hostile_keys_stay_inside_their_namespace() {
    let server = RedisServer::start();
    let backend = RedisBackend::builder()
        .url(server.url())
        .prefix("app1")
        .mode(RedisMode::Lua)
        .connect()
        .await
        .unwrap();
    let limit = limit("api", Quota::per_minute(10));
    let hostile: Vec<Key> = vec![
        Key::from("}:other{x"),
        Key::from("app2:api:{victim}"),
        Key::from_bytes(b"\r\n*1\r\n$8\r\nFLUSHALL\r\n"),
        Key::from_bytes(&[0xff, 0x00, b'{', b'}']),
        Key::from("x".repeat(10_000)),
    ];
    for key in &hostile {
        assert!(backend.check_one(&limit, key, 1).await.unwrap().allowed);
    }
    let keys = server.cli(&["--raw", "KEYS", "*"]);
    let keys: Vec<&str> = keys.lines().collect();
    assert_eq!(keys.len(), hostile.len(), "{keys:?}");
    for k in keys {
        assert!(k.starts_with("app1:api:{") && k.ends_with('}'), "{k}");
        let tag = &k["app1:api:{".len()..k.len() - 1];
        assert!(!tag.contains(['{', '}']), "{k}");
        assert!(k.len() <= 100, "{k} is {} bytes", k.len());
        assert!(k.bytes().all(|b| b.is_ascii_graphic()), "{k:?}");
    }
}

/// A route's quota changes while keys written under the old one still exist (one process deployed
/// ahead of another): decisions follow the new quota, with no error.
#[tokio::test]
async fn a_changed_quota_reads_old_state_as_at_most_a_full_bucket() {
    let server = RedisServer::start();
    let backend = connect(&server.url(), RedisMode::Lua).await;
    let key = Key::from("user");
    // Old: 100 an hour, all used (the TAT is an hour ahead).
    let old = limit("orders", Quota::per_hour(100));
    for _ in 0..100 {
        assert!(backend.check_one(&old, &key, 1).await.unwrap().allowed);
    }
    assert!(!backend.check_one(&old, &key, 1).await.unwrap().allowed);
    // New: 5 a second. The exhausted key is an exhausted bucket under the new quota: it refills at
    // the new rate, within a second, not in an hour.
    let new = limit("orders", Quota::per_second(5));
    let now = backend.check_one(&new, &key, 1).await.unwrap();
    assert!(!now.allowed);
    assert!(
        now.retry_after.unwrap() <= Duration::from_millis(200),
        "{now:?}"
    );
    assert!(now.reset_after <= Duration::from_secs(1), "{now:?}");
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let later = backend.check_one(&new, &key, 1).await.unwrap();
    assert!(later.allowed && later.remaining == 4, "{later:?}");
    // The same rule in memory, through the pure function every backend shares.
    let params_old = old.gcra().unwrap();
    let params_new = new.gcra().unwrap();
    let now_ns = 1_000_000_000_000u64;
    let stale = now_ns + params_old.tolerance();
    let out = gcra::decide(Some(stale), now_ns, params_new, 1);
    assert_eq!(
        out.decision.reset_after,
        Duration::from_nanos(params_new.tolerance())
    );
}

#[tokio::test]
async fn invalid_settings_are_errors_before_any_request() {
    let server = RedisServer::start();
    let err = RedisBackend::builder()
        .url(server.url())
        .prefix("bad prefix{")
        .connect()
        .await
        .unwrap_err();
    assert!(err.to_string().contains("prefix"), "{err}");
    let err = RedisBackend::builder()
        .url(server.url())
        .timeout(Duration::ZERO)
        .connect()
        .await
        .unwrap_err();
    assert!(err.to_string().contains("timeout"), "{err}");
    // One no request would wait for, whose deadlines would overflow.
    for timeout in [Duration::from_secs(3601), Duration::MAX] {
        let err = RedisBackend::builder()
            .url(server.url())
            .timeout(timeout)
            .build()
            .unwrap_err();
        assert!(err.to_string().contains("at most 3600s"), "{err}");
    }
    let err = RedisBackend::builder()
        .url("redis://127.0.0.1:1/")
        .connect()
        .await
        .unwrap_err();
    assert!(err.to_string().contains("cannot connect"), "{err}");

    // A quota the Lua path cannot hold, and one CL.THROTTLE cannot express, fail the layer build.
    let lua = connect(&server.url(), RedisMode::Lua).await;
    let too_long = limit(
        "yearly",
        Quota::per_period(10, Duration::from_secs(365 * 86_400)),
    );
    assert!(lua
        .validate_one(&too_long)
        .unwrap_err()
        .to_string()
        .contains("52 days"));
    let cell_server = RedisServer::start_with_cell();
    let cell = connect(&cell_server.url(), RedisMode::Cell).await;
    let odd = limit(
        "odd",
        Quota::per_period(3, Duration::from_nanos(10_000_000_019)),
    );
    assert!(cell
        .validate_one(&odd)
        .unwrap_err()
        .to_string()
        .contains("CL.THROTTLE"));
    assert!(lua.validate_one(&odd).is_ok());
    // CL.THROTTLE could take a year, but peeks, refunds and a penalty's strikes run the script.
    let err = cell.validate_one(&too_long).unwrap_err();
    assert!(err.to_string().contains("52 days"), "{err}");
}

#[tokio::test]
async fn tls_and_acl_credentials_work() {
    let server = RedisServer::start_tls();
    let ca = std::fs::read(server.ca_cert_path().unwrap()).unwrap();
    let client = redis::Client::build_with_tls(
        server.url(),
        redis::TlsCertificates {
            client_tls: None,
            root_cert: Some(ca),
        },
    )
    .unwrap();
    let backend = RedisBackend::builder()
        .client(client)
        .mode(RedisMode::Lua)
        .timeout(Duration::from_secs(2))
        .connect()
        .await
        .unwrap();
    let limit = limit("tls", Quota::per_minute(2));
    let key = Key::from("k");
    assert!(backend.check_one(&limit, &key, 1).await.unwrap().allowed);
    assert!(backend.check_one(&limit, &key, 1).await.unwrap().allowed);
    assert!(!backend.check_one(&limit, &key, 1).await.unwrap().allowed);

    // A wrong password is an error at connect, without the password in the message.
    let wrong = server.url().replace("s3cret", "wrong-pw");
    let client = redis::Client::build_with_tls(
        wrong,
        redis::TlsCertificates {
            client_tls: None,
            root_cert: Some(std::fs::read(server.ca_cert_path().unwrap()).unwrap()),
        },
    )
    .unwrap();
    let err = RedisBackend::builder()
        .client(client)
        .connect()
        .await
        .unwrap_err();
    assert!(!format!("{err:?}").contains("wrong-pw"), "{err:?}");
}

/// The script survives `SCRIPT FLUSH` (NOSCRIPT is answered by loading it again), a rejected request
/// writes nothing, and idle keys expire when their TAT passes.
#[tokio::test]
async fn lua_reloads_after_flush_writes_nothing_on_rejection_and_expires() {
    let server = RedisServer::start();
    let backend = connect(&server.url(), RedisMode::Lua).await;
    // Two at once, then one a second: a rejection stays a rejection for a second, while the test
    // reads the key in between.
    let limit = limit("lua", Quota::per_second(1).with_max_burst(1));
    let key = Key::from("k");
    let redis_key = backend.redis_key("lua", &key);
    assert!(backend.check_one(&limit, &key, 1).await.unwrap().allowed);
    server.cli(&["SCRIPT", "FLUSH"]);
    assert!(backend.check_one(&limit, &key, 1).await.unwrap().allowed);
    let stored = server.cli(&["GET", &redis_key]);
    let ttl: i64 = server.cli(&["PTTL", &redis_key]).parse().unwrap();
    assert!(ttl > 1000 && ttl <= 2000, "{ttl}");
    let rejected = backend.check_one(&limit, &key, 1).await.unwrap();
    assert!(!rejected.allowed);
    assert_eq!(server.cli(&["GET", &redis_key]), stored);
    tokio::time::sleep(Duration::from_millis(ttl as u64 + 50)).await;
    assert_eq!(server.cli(&["EXISTS", &redis_key]), "0");
    let fresh = backend.check_one(&limit, &key, 1).await.unwrap();
    assert_eq!((fresh.allowed, fresh.remaining), (true, 1));
}

/// redis-cell 0.2.2 overflows on a huge quantity (a negative TAT, then a crash of the server on the
/// next call): such quantities never reach it; the answer is "never", like in memory.
#[tokio::test]
async fn cell_mode_never_sends_redis_cell_a_quantity_beyond_the_limit() {
    let server = RedisServer::start_with_cell();
    let cell = connect(&server.url(), RedisMode::Cell).await;
    let limit = limit("huge", Quota::per_second(5));
    let key = Key::from("k");
    for quantity in [6, 50_000_000_000, u64::MAX] {
        let d = cell.check_one(&limit, &key, quantity).await.unwrap();
        assert!(!d.allowed && d.retry_after.is_none(), "{quantity}: {d:?}");
    }
    let d = cell.check_one(&limit, &key, 0).await.unwrap();
    assert_eq!((d.allowed, d.remaining), (true, 5));
    let d = cell.check_one(&limit, &key, 1).await.unwrap();
    assert_eq!((d.allowed, d.remaining), (true, 4));
    assert_eq!(server.cli(&["PING"]), "PONG");
}

/// Calls of `command` the server has executed (`INFO commandstats`).
pub(crate) fn calls(server: &RedisServer, command: &str) -> u64 {
    let stats = server.cli(&["INFO", "commandstats"]);
    let prefix = format!("cmdstat_{command}:calls=");
    stats
        .lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()))
        .map_or(0, |rest| rest.split(',').next().unwrap().parse().unwrap())
}

/// A flood from one limited key is answered from the deny cache: no round trips until the retry
/// time, the same numbers aged, and Redis decides again once the key may pass. With the cache off,
/// every request goes to Redis.
///
/// One unit every 4 s: the flood, the `redis-cli` calls that count the server's commands and any
/// stall of a loaded machine fit many times within the retry time, and an admission is followed by
/// a refusal however slowly the next check comes. (With one unit every 500 ms a slow machine
/// admitted both legitimately.) Lua's run and Cell's overlap: one wait.
#[tokio::test]
async fn the_deny_cache_answers_a_flood_without_round_trips() {
    let server = RedisServer::start_with_cell();
    let limit = limit("flood", Quota::per_minute(15).with_max_burst(1)); // 2 at once, one per 4 s
    let flood = |mode: RedisMode, command: &'static str| {
        let (server, limit) = (&server, &limit);
        async move {
            let key = Key::from(format!("flooder-{mode}"));
            let cached = connect(&server.url(), mode).await;
            assert!(cached.check_one(limit, &key, 1).await.unwrap().allowed);
            assert!(cached.check_one(limit, &key, 1).await.unwrap().allowed);
            let first = cached.check_one(limit, &key, 1).await.unwrap();
            // Redis decided before this instant: the key may pass by `retry_after` after it (for
            // CL.THROTTLE, whose whole seconds are rounded up, by then at the latest).
            let decided = Instant::now();
            assert!(!first.allowed);
            let before = calls(server, command);
            for _ in 0..200 {
                let d = cached.check_one(limit, &key, 1).await.unwrap();
                assert!(!d.allowed);
                assert_eq!((d.limit, d.remaining), (first.limit, first.remaining));
                assert!(d.retry_after.unwrap() <= first.retry_after.unwrap());
            }
            // Lua's retry time is exact (~4 s), CL.THROTTLE's "4 s" is held a second less: either
            // way all 200 are answered here.
            assert_eq!(calls(server, command), before, "{mode}");
            // Never an extra admission, and Redis decides again once the key may pass: both
            // checks go to Redis, the second within 4 s of the first however slow the machine.
            // (20 ms: Redis rounds to microseconds and reads the clock a little after us.)
            let pass_at = decided + first.retry_after.unwrap() + Duration::from_millis(20);
            tokio::time::sleep_until(pass_at).await;
            let before = calls(server, command);
            assert!(
                cached.check_one(limit, &key, 1).await.unwrap().allowed,
                "{mode}"
            );
            assert!(
                !cached.check_one(limit, &key, 1).await.unwrap().allowed,
                "{mode}"
            );
            assert_eq!(calls(server, command), before + 2, "{mode}");
        }
    };
    tokio::join!(
        flood(RedisMode::Lua, "evalsha"),
        flood(RedisMode::Cell, "cl.throttle")
    );

    // CL.THROTTLE's retry time under a second reads "1 s", held a second less: not at all. Every
    // check goes to Redis, refused or (on a machine slower than 500 ms a check) admitted.
    let fine = self::limit("flood-fine", Quota::per_second(2).with_max_burst(1));
    let cell = connect(&server.url(), RedisMode::Cell).await;
    let key = Key::from("flooder-fine");
    let before = calls(&server, "cl.throttle");
    let mut refused = 0;
    for _ in 0..50 {
        let d = cell.check_one(&fine, &key, 1).await.unwrap();
        if !d.allowed {
            assert!(d.retry_after.unwrap() <= Duration::from_secs(1), "{d:?}");
            refused += 1;
        }
    }
    let after = calls(&server, "cl.throttle");
    assert!(after >= before + 50, "{before} -> {after}");
    // 50 admissions of 2 at once, one per 500 ms, would take 24 s: round trips 100 times slower
    // than a loaded machine's.
    assert!(refused > 0, "50 checks of 2 at once were all admitted");

    let uncached = RedisBackend::builder()
        .url(server.url())
        .mode(RedisMode::Lua)
        .deny_cache(false)
        .connect()
        .await
        .unwrap();
    let key = Key::from("flooder-uncached");
    for _ in 0..2 {
        assert!(uncached.check_one(&limit, &key, 1).await.unwrap().allowed);
    }
    let before = calls(&server, "evalsha");
    for _ in 0..50 {
        assert!(!uncached.check_one(&limit, &key, 1).await.unwrap().allowed);
    }
    assert_eq!(calls(&server, "evalsha"), before + 50);
}

/// A GCRA limit with a penalty box runs on the limits script: every rejection before the ban
/// reaches Redis (a strike each), and the ban, once struck, is answered from the deny cache with no
/// round trip, in both modes (CL.THROTTLE cannot strike: Cell takes the script for such a limit).
#[tokio::test]
async fn a_penalty_box_strikes_on_redis_and_its_ban_is_held_locally() {
    let server = RedisServer::start_with_cell();
    let penalty = Penalty::new(3, Duration::from_secs(60), Duration::from_secs(30)).unwrap();
    let limit = limit("banned", Quota::per_hour(1)).with_penalty(penalty);
    for mode in [RedisMode::Lua, RedisMode::Cell] {
        let backend = connect(&server.url(), mode).await;
        let key = Key::from(format!("striker-{mode}"));
        assert!(backend.check_one(&limit, &key, 1).await.unwrap().allowed);
        let before = calls(&server, "evalsha");
        for strike in 1..=3 {
            let d = backend.check_one(&limit, &key, 1).await.unwrap();
            assert!(!d.allowed, "{mode}: strike {strike}");
            assert_eq!(d.banned, strike == 3, "{mode}: strike {strike}");
        }
        assert_eq!(
            calls(&server, "evalsha"),
            before + 3,
            "{mode}: every strike"
        );
        assert_eq!(calls(&server, "cl.throttle"), 0, "{mode}");
        for _ in 0..50 {
            let d = backend.check_one(&limit, &key, 1).await.unwrap();
            assert!(!d.allowed && d.banned, "{mode}");
            assert!(d.retry_after.unwrap() > Duration::from_secs(25), "{mode}");
        }
        assert_eq!(
            calls(&server, "evalsha"),
            before + 3,
            "{mode}: the ban held"
        );
    }
}

/// The gauge `throttle_backend_up{path}` follows the path decisions take: when the module goes
/// away under an `Auto` backend, `lua` is up and `cell` down from the decision that finds out
/// (before, the gauge kept saying `cell` until the next reconnect).
#[test]
fn the_up_gauge_follows_the_module() {
    let with_cell = RedisServer::start_with_cell();
    let ((), page) = crate::support::with_metrics(async {
        let auto = auto_alone(&with_cell, "auto").await;
        let (limit, key) = (limit("gauge", Quota::per_minute(3)), Key::from("k"));
        assert!(auto.check_one(&limit, &key, 1).await.unwrap().allowed);
        assert_eq!(auto.active_path(), Some(RedisMode::Cell));
        with_cell.cli(&["MODULE", "UNLOAD", "redis-cell"]);
        assert!(auto.check_one(&limit, &key, 1).await.unwrap().allowed);
        assert_eq!(auto.active_path(), Some(RedisMode::Lua));
    });
    let up = |path: &str| {
        let series = format!("throttle_backend_up{{backend=\"auto\",path=\"{path}\"}}");
        crate::support::sample_or_zero(&page, &series)
    };
    assert_eq!((up("lua"), up("cell")), (1.0, 0.0), "{page}");
}

/// A refund that Redis applies after a check it let through as refused: the refusal that check
/// cached is forgotten once the refund has landed, not held to the window's end.
#[tokio::test]
async fn a_refusal_decided_before_a_refund_lands_is_not_kept_in_the_deny_cache() {
    use tower_throttle::Algorithm;
    let server = RedisServer::start();
    let backend = RedisBackend::builder()
        .url(server.url())
        .mode(RedisMode::Lua)
        .coalesce(false)
        .timeout(Duration::from_secs(2))
        .connect()
        .await
        .unwrap();
    let hour = Limit::with_algorithm("hourly", Algorithm::FixedWindow, Quota::per_hour(1)).unwrap();
    let key = Key::from("refunded");
    assert!(backend.check_one(&hour, &key, 1).await.unwrap().allowed);
    assert!(!backend.check_one(&hour, &key, 1).await.unwrap().allowed);
    // The refund goes out on a task; this check is sent before it, and refused.
    backend.refund(std::slice::from_ref(&hour), &key, 1, Duration::from_secs(1));
    assert!(!backend.check_one(&hour, &key, 1).await.unwrap().allowed);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let state = backend
        .peek_all(std::slice::from_ref(&hour), &key)
        .await
        .unwrap();
    assert_eq!(state[0].remaining, 1, "Redis took the refund");
    assert!(
        backend.check_one(&hour, &key, 1).await.unwrap().allowed,
        "the refusal cached before the refund landed was kept"
    );
}

/// A reset that Redis applies but cannot announce to the other processes (PUBLISH refused) says
/// so, rather than answering as if every process had dropped what it cached.
#[tokio::test]
async fn a_reset_the_others_were_not_told_of_is_an_error() {
    let server = RedisServer::start();
    server.cli(&[
        "ACL", "SETUSER", "resetter", "on", ">pw", "~*", "&*", "+@all",
    ]);
    let url = server.url().replacen("redis://", "redis://resetter:pw@", 1);
    let backend = connect(&url, RedisMode::Lua).await;
    let limit = limit("told", Quota::per_minute(1));
    let key = Key::from("k");
    assert!(backend.check_one(&limit, &key, 1).await.unwrap().allowed);
    backend
        .reset_all(std::slice::from_ref(&limit), &key)
        .await
        .unwrap();
    server.cli(&["ACL", "SETUSER", "resetter", "-publish"]);
    assert!(backend.check_one(&limit, &key, 1).await.unwrap().allowed);
    let error = backend
        .reset_all(std::slice::from_ref(&limit), &key)
        .await
        .unwrap_err()
        .to_string();
    assert!(error.contains("other processes were not told"), "{error}");
    // Reset all the same, here and in Redis.
    assert!(backend.check_one(&limit, &key, 1).await.unwrap().allowed);
}
