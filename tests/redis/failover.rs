//! Redis failing over under a steady load, with real `redis-server` processes: the backend starts
//! while Redis is down or frozen, follows a primary demoted into a replica (directly, and through a
//! forwarder whose target moves, as a DNS name does), and a primary killed. Every call is answered
//! within the timeout (decided by Redis, or failed at once so the failure policy answers), and
//! decisions come back to Redis soon after a writable primary is reachable.
//!
//! Each scenario prints its figures (run with `--nocapture`): calls by outcome, the slowest call,
//! the time from the trigger to recovery, and the log lines the backend wrote.

use crate::support::failover::{
    cli, replicate, wait_until, Figures, Forwarder, FrozenListener, Load, Logs,
};
use crate::support::redis as redis_support;

use std::time::{Duration, Instant};

use crate::support::asks::Asks;
use redis_support::RedisServer;
use tower_throttle::{
    redis::{RedisBackend, RedisMode},
    Limit, Quota,
};

const TIMEOUT: Duration = Duration::from_millis(100);
/// What a call may take beyond the timeout on a loaded 2-core machine. A call that waited for Redis
/// to come back would take seconds.
const STALL: Duration = Duration::from_secs(1);
/// How long decisions may take to come back to Redis once a writable primary is reachable: the goal
/// is 1 s (reconnect backoff at most 500 ms); the rest is room for a loaded machine.
const RECOVERY: Duration = Duration::from_secs(3);

fn steady() -> Limit {
    Limit::new(
        "steady",
        Quota::cl_throttle(1_000_000, 1, Duration::from_secs(60)),
    )
    .unwrap()
}

fn backend_on(url: &str) -> tower_throttle::redis::RedisBackendBuilder {
    RedisBackend::builder()
        .url(url)
        .mode(RedisMode::Lua)
        .timeout(TIMEOUT)
}

/// Stops a server without blocking the runtime (the load keeps running).
async fn stop(mut server: RedisServer) -> RedisServer {
    tokio::task::spawn_blocking(move || {
        server.stop();
        server
    })
    .await
    .unwrap()
}

/// Restarts a server (same port) without blocking the runtime; returns once it answers.
async fn restart(mut server: RedisServer) -> RedisServer {
    tokio::task::spawn_blocking(move || {
        server.restart();
        server
    })
    .await
    .unwrap()
}

fn assert_bounded(scenario: &str, figures: &Figures) {
    assert!(
        figures.max_latency <= TIMEOUT + STALL,
        "[{scenario}] a call took {:?}, past the timeout",
        figures.max_latency
    );
    let recovered = figures
        .recovered_after
        .unwrap_or_else(|| panic!("[{scenario}] decisions never came back to Redis: {figures:?}"));
    assert!(
        recovered <= RECOVERY,
        "[{scenario}] recovery took {recovered:?}"
    );
}

/// Redis down at start: built at once, calls fail at once, one warning; Redis started on that port:
/// decisions come from Redis within a second.
#[tokio::test]
async fn starts_while_redis_is_down_and_moves_to_redis_once_it_answers() {
    let (logs, _guard) = Logs::capture();
    let server = stop(RedisServer::start()).await;
    let started = Instant::now();
    let backend = backend_on(&server.url()).build().unwrap();
    let built_in = started.elapsed();
    assert!(
        built_in < Duration::from_millis(500),
        "build took {built_in:?}"
    );
    assert!(!backend.health().connected);

    let load = Load::start(&backend, &steady(), 2, Duration::from_millis(5));
    load.wait_failed(20).await;
    let health = backend.health();
    assert!(!health.is_healthy(), "{health}");
    assert!(health.last_error.is_some(), "{health}");

    let _server = restart(server).await;
    let trigger = load.now();
    wait_until(Duration::from_secs(10), "never connected", || async {
        backend.health().is_healthy()
    })
    .await;
    load.wait_decided(trigger, 20).await;
    let samples = load.finish().await;
    let figures = Figures::of(&samples, trigger);
    figures.print("start-down", &logs);
    println!(
        "[start-down] built in {built_in:?}; health now: {}",
        backend.health()
    );

    assert!(figures.failed > 0, "calls during the outage should fail");
    assert_bounded("start-down", &figures);
    assert_eq!(logs.count("not reachable yet"), 1, "{:?}", logs.lines());
    assert_eq!(logs.count("connected to Redis"), 1, "{:?}", logs.lines());
    let health = backend.health();
    assert!(health.is_healthy(), "{health}");
    assert_eq!(health.path, Some(RedisMode::Lua));
    assert!(health.address.is_some());
}

/// A frozen Redis at start (accepts, never answers): no call waits past the timeout; the eager
/// `connect` fails within its start-up budget instead of hanging.
#[tokio::test]
async fn a_frozen_redis_at_start_costs_no_call_its_timeout() {
    let (logs, _guard) = Logs::capture();
    let frozen = FrozenListener::start().await;
    let backend = backend_on(&frozen.url()).build().unwrap();
    let load = Load::start(&backend, &steady(), 2, Duration::from_millis(5));
    wait_until(Duration::from_secs(10), "no warning", || async {
        logs.count("not reachable yet") > 0
    })
    .await;
    // An observation window, not a wait for a condition: the backend keeps trying (backoff up to
    // 500 ms) and must neither warn again nor make a call wait.
    let warned = load.now();
    load.wait_for(
        Duration::from_secs(20),
        "calls a second after the warning",
        |samples| {
            samples
                .iter()
                .any(|s| s.at >= warned + Duration::from_secs(1))
        },
    )
    .await;
    let samples = load.finish().await;
    let figures = Figures::of(&samples, Duration::ZERO);
    figures.print("frozen-start", &logs);
    assert_eq!(figures.decided, 0);
    assert!(figures.failed > 0);
    assert!(
        figures.max_latency <= TIMEOUT + STALL,
        "a call took {:?}",
        figures.max_latency
    );
    assert!(!backend.health().connected);
    assert_eq!(logs.count("not reachable yet"), 1, "{:?}", logs.lines());

    let started = Instant::now();
    let eager = backend_on(&frozen.url()).connect().await;
    let took = started.elapsed();
    println!(
        "[frozen-start] eager connect failed in {took:?}: {:?}",
        eager.as_ref().err()
    );
    assert!(eager.is_err());
    assert!(
        took < Duration::from_secs(1) + STALL,
        "connect took {took:?}"
    );
}

/// A primary and its replica, the replica synchronized.
async fn pair() -> (RedisServer, RedisServer) {
    let (primary, replica) = (RedisServer::start(), RedisServer::start());
    replicate(replica.port(), primary.port()).await;
    (primary, replica)
}

/// Failover by demotion behind an address that moves: the replica is promoted, the address (a
/// forwarder) switched to it, and the old primary made its replica. The open connection to the old
/// primary answers `READONLY`; the backend reconnects through the address to the new primary.
#[tokio::test]
async fn a_demoted_primary_behind_a_moving_address() {
    let (logs, _guard) = Logs::capture();
    let (old, new) = pair().await;
    let address = Forwarder::start(old.port()).await;
    let backend = backend_on(&address.url()).connect().await.unwrap();
    let load = Load::start(&backend, &steady(), 2, Duration::from_millis(2));
    load.wait_decided(Duration::ZERO, 20).await;

    let trigger = load.now();
    cli(new.port(), &["REPLICAOF", "NO", "ONE"]).await;
    address.switch_to(new.port());
    cli(
        old.port(),
        &["REPLICAOF", "127.0.0.1", &new.port().to_string()],
    )
    .await;
    // Decided after the old primary refuses writes: on the new one.
    load.wait_decided(load.now(), 20).await;
    let samples = load.finish().await;
    let figures = Figures::of(&samples, trigger);
    figures.print("demotion-forwarded", &logs);
    assert_bounded("demotion-forwarded", &figures);
    assert!(backend.health().is_healthy(), "{}", backend.health());
    // The last decisions were written on the new primary.
    let key = backend.redis_key("steady", &"steady".into());
    assert_eq!(cli(new.port(), &["EXISTS", &key]).await, "1");
}

/// Failover by demotion of the very address the backend uses: it answers `READONLY`, then `ROLE`
/// says replica, so the backend keeps reconnecting and reports itself unhealthy instead of
/// repeating the error; made primary again, it is used again.
#[tokio::test]
async fn a_demoted_primary_at_the_same_address_is_left_until_it_is_primary_again() {
    let (logs, _guard) = Logs::capture();
    let (primary, replica) = pair().await;
    let backend = backend_on(&primary.url()).connect().await.unwrap();
    let load = Load::start(&backend, &steady(), 2, Duration::from_millis(2));
    load.wait_decided(Duration::ZERO, 20).await;

    cli(replica.port(), &["REPLICAOF", "NO", "ONE"]).await;
    cli(
        primary.port(),
        &["REPLICAOF", "127.0.0.1", &replica.port().to_string()],
    )
    .await;
    wait_until(
        Duration::from_secs(5),
        "the backend kept a read-only connection",
        || async { !backend.health().connected },
    )
    .await;
    // A reconnection found the server a replica (`ROLE`), or the first call after the loss met
    // `READONLY` again.
    wait_until(Duration::from_secs(10), "no error saying why", || async {
        let last = backend.health().last_error.map(|(e, _)| e);
        last.is_some_and(|e| e.contains("replica") || e.contains("READONLY"))
    })
    .await;
    let health = backend.health();
    println!("[demotion-direct] health while demoted: {health}");
    assert!(!health.is_healthy(), "{health}");
    let last = health
        .last_error
        .as_ref()
        .map(|(e, _)| e.clone())
        .unwrap_or_default();
    assert!(
        last.contains("replica") || last.contains("READONLY"),
        "{last}"
    );

    let trigger = load.now();
    cli(primary.port(), &["REPLICAOF", "NO", "ONE"]).await;
    load.wait_decided(load.now(), 20).await;
    let samples = load.finish().await;
    let figures = Figures::of(&samples, trigger);
    figures.print("demotion-direct", &logs);
    assert_bounded("demotion-direct", &figures);
    assert!(backend.health().is_healthy(), "{}", backend.health());
    // Bounded logs: one "lost", a few "still unreachable" at most, one "connected".
    assert!(logs.lines().len() <= 6, "{:?}", logs.lines());
}

/// A replica whose `ROLE` is forbidden takes the connection and its set-up, then refuses every
/// decision (`READONLY`): each connection is lost as soon as made. They are made again at a
/// growing pace, not as fast as the server takes them, with a bounded number of log lines.
#[tokio::test]
async fn a_replica_that_hides_its_role_is_no_storm_of_connections() {
    let (logs, _guard) = Logs::capture();
    let (_primary, replica) = pair().await;
    cli(replica.port(), &["ACL", "SETUSER", "default", "-role"]).await;
    let accepted = || async {
        let stats = cli(replica.port(), &["INFO", "stats"]).await;
        let line = stats
            .lines()
            .find(|l| l.starts_with("total_connections_received:"));
        line.and_then(|l| l.split(':').nth(1)?.trim().parse::<u64>().ok())
            .expect("INFO stats names its connections")
    };
    let before = accepted().await;
    let backend = backend_on(&replica.url()).build().unwrap();
    let load = Load::start(&backend, &steady(), 2, Duration::from_millis(2));
    tokio::time::sleep(Duration::from_secs(3)).await;
    let samples = load.finish().await;
    // Our own `cli` calls are three connections; the backend's reconnections go at 100 ms, then
    // 200, 400...: about six in three seconds (hundreds a second before).
    let made = accepted().await - before;
    println!(
        "[hidden-role] {made} connections, {} calls, {} log lines",
        samples.len(),
        logs.lines().len()
    );
    assert!(made <= 20, "{made} connections in 3 s");
    assert!(logs.lines().len() <= 20, "{:?}", logs.lines());
    assert!(!backend.health().is_healthy());
}

/// The primary killed, the replica promoted and the address switched to it.
#[tokio::test]
async fn a_killed_primary_behind_a_moving_address() {
    let (logs, _guard) = Logs::capture();
    let (old, new) = pair().await;
    let address = Forwarder::start(old.port()).await;
    let backend = backend_on(&address.url()).connect().await.unwrap();
    let load = Load::start(&backend, &steady(), 2, Duration::from_millis(2));
    load.wait_decided(Duration::ZERO, 20).await;

    let trigger = load.now();
    let _old = stop(old).await;
    cli(new.port(), &["REPLICAOF", "NO", "ONE"]).await;
    address.switch_to(new.port());
    let promoted = load.now();
    load.wait_decided(promoted, 20).await;
    let samples = load.finish().await;
    let figures = Figures::of(&samples, promoted);
    figures.print("kill-forwarded", &logs);
    println!(
        "[kill-forwarded] the kill took {:?} (SHUTDOWN NOSAVE and the wait for the port)",
        promoted - trigger
    );
    assert_bounded("kill-forwarded", &figures);
    assert!(backend.health().is_healthy(), "{}", backend.health());
}

/// Redis stalls (`CLIENT PAUSE`) long enough for calls to time out and the breaker to open, then
/// recovers while no request comes: the background probe (a decision) closes the breaker, so a burst
/// of requests right after is decided on Redis, not spent finding out that Redis is back (with
/// only the breaker's own probe, one of them would go through and the others fail fast).
#[tokio::test]
async fn the_probe_finds_redis_again_before_the_next_requests() {
    let (logs, _guard) = Logs::capture();
    let server = RedisServer::start();
    let backend = backend_on(&server.url()).connect().await.unwrap();
    let limit = steady();
    let key: tower_throttle::key::Key = "probe".into();

    assert!(backend.check_one(&limit, &key, 1).await.is_ok());

    cli(server.port(), &["CLIENT", "PAUSE", "600", "ALL"]).await;
    let stalled = backend.check_one(&limit, &key, 1).await;
    assert!(stalled.is_err(), "{stalled:?}");
    assert!(backend.health().breaker_open, "{}", backend.health());
    // Paused for 600 ms; nothing is asked until the probe has closed the breaker.
    wait_until(
        Duration::from_secs(10),
        "the probe never closed the breaker",
        || async { backend.health().is_healthy() },
    )
    .await;
    let health = backend.health();
    println!("[probe] health before the burst: {health}");
    assert!(health.is_healthy(), "{health}");
    let burst: Vec<_> = (0..20)
        .map(|_| backend.check_one(&limit, &key, 1))
        .collect();
    let results = futures_join_all(burst).await;
    let decided = results.iter().filter(|r| r.is_ok()).count();
    println!(
        "[probe] {decided} of 20 concurrent calls decided by Redis right after the stall; log lines: {:?}",
        logs.lines()
    );
    assert_eq!(decided, 20, "{results:?}");
}

/// Redis holds writes (`CLIENT PAUSE .. WRITE`, as `FAILOVER` does) and answers everything else:
/// the breaker stays open while decisions cannot run, and closes once they can. The background
/// probe asks a decision, not a `PING`: here a `PING` would wait behind the held call on the same
/// connection anyway, but a proxy in front of Redis may answer one itself.
#[tokio::test]
async fn held_writes_keep_the_breaker_open_until_decisions_run() {
    let (logs, _guard) = Logs::capture();
    let server = RedisServer::start();
    let backend = backend_on(&server.url()).connect().await.unwrap();
    let (limit, key) = (steady(), "held".into());
    assert!(backend.check_one(&limit, &key, 1).await.is_ok());

    cli(server.port(), &["CLIENT", "PAUSE", "3000", "WRITE"]).await;
    let held = backend.check_one(&limit, &key, 1).await;
    assert!(held.is_err(), "{held:?}");
    // Sampled well within the second after which a silent connection is made again (whose
    // set-up, answered, closes the breaker as a reconnect does), however late the test runs.
    let held_at = Instant::now();
    let mut checked = 0;
    while held_at.elapsed() < Duration::from_millis(600) {
        tokio::time::sleep(Duration::from_millis(150)).await;
        let health = backend.health();
        if held_at.elapsed() < Duration::from_millis(700) {
            let lines = logs.lines();
            assert!(
                health.breaker_open,
                "closed while writes are held: {health} {lines:?}"
            );
            checked += 1;
        }
        assert_eq!(cli(server.port(), &["PING"]).await, "PONG");
    }
    assert!(checked >= 1, "no sample within 700 ms");
    wait_until(
        Duration::from_secs(10),
        "the probe never closed the breaker",
        || async { backend.health().is_healthy() },
    )
    .await;
    assert!(backend.check_one(&limit, &key, 1).await.is_ok());
}

/// Runs the futures concurrently (each was admitted by the breaker when it was made).
async fn futures_join_all<F>(futures: Vec<F>) -> Vec<F::Output>
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    let handles: Vec<_> = futures.into_iter().map(tokio::spawn).collect();
    let mut out = Vec::with_capacity(handles.len());
    for handle in handles {
        out.push(handle.await.unwrap());
    }
    out
}

const ROUTE: &str = "[[route]]\nname = \"r\"\nkey = \"ip\"\ncount = 5\nperiod = \"1s\"\n";

/// `Config::layer` with `[backend]` on `url` and `extra` keys; the error it fails with, if any.
async fn config_layer(url: &str, extra: &str) -> Result<(), String> {
    let config = tower_throttle::config::Config::from_toml(&format!(
        "[backend]\nkind = \"redis\"\nurl = \"{url}\"\ntimeout_ms = 100\n{extra}\n{ROUTE}"
    ))
    .unwrap();
    config.layer().await.map(|_| ()).map_err(|e| e.to_string())
}

/// Redis that refuses the configuration (a wrong or missing password, a user without the script
/// commands, mode "cell" without the module) is not "unreachable": `Config::layer` fails at start-up and says what to fix, instead
/// of starting on the failure policy for good. A replica stays a lazy start (a failover may
/// promote it), its health saying why.
#[tokio::test]
async fn configuration_errors_fail_the_start() {
    let (logs, _guard) = Logs::capture();
    let server = RedisServer::start();
    let port = server.port();

    let cell = config_layer(&server.url(), "mode = \"cell\"")
        .await
        .unwrap_err();
    assert!(cell.contains("redis-cell"), "{cell}");

    let (primary, replica) = pair().await;
    let backend = backend_on(&replica.url()).build().unwrap();
    assert!(!backend.first_attempt().await.unwrap());
    let health = backend.health();
    assert!(!health.is_healthy(), "{health}");
    let last = health.last_error.map(|(e, _)| e).unwrap_or_default();
    assert!(last.contains("replica"), "{last}");
    assert!(config_layer(&replica.url(), "").await.is_ok());
    drop((primary, replica));

    // An ACL user that may not load scripts.
    cli(
        port,
        &[
            "ACL", "SETUSER", "noscript", "on", ">pw", "~*", "+@all", "-script",
        ],
    )
    .await;
    let noperm = config_layer(&format!("redis://noscript:pw@127.0.0.1:{port}/"), "")
        .await
        .unwrap_err();
    assert!(
        noperm.contains("NOPERM") && noperm.contains("SCRIPT LOAD"),
        "{noperm}"
    );

    cli(port, &["CONFIG", "SET", "requirepass", "right"]).await;
    let wrong = config_layer(&format!("redis://:wrong@127.0.0.1:{port}/"), "")
        .await
        .unwrap_err();
    assert!(
        wrong.contains("password") && wrong.contains("authentication failed"),
        "{wrong}"
    );
    let none = config_layer(&format!("redis://127.0.0.1:{port}/"), "")
        .await
        .unwrap_err();
    assert!(none.contains("NOAUTH"), "{none}");
    // The right password starts.
    config_layer(&format!("redis://:right@127.0.0.1:{port}/"), "")
        .await
        .unwrap();
    // Said at error level, once per start.
    assert!(logs.count("ERROR") >= 4, "{:?}", logs.lines());
}

/// A user's connection manager: redis-rs reconnects it, so only the calls tell whether Redis is
/// reachable. Killed, the backend reports itself unhealthy with the error, and healthy again once
/// calls get through.
#[tokio::test]
async fn health_of_a_connection_manager_follows_the_calls() {
    let mut server = RedisServer::start();
    let manager = redis::Client::open(server.url())
        .unwrap()
        .get_connection_manager()
        .await
        .unwrap();
    let backend = RedisBackend::builder()
        .connection_manager(manager)
        .mode(RedisMode::Lua)
        .timeout(TIMEOUT)
        .build()
        .unwrap();
    let key = tower_throttle::key::Key::from("health");

    assert!(backend.check_one(&steady(), &key, 1).await.is_ok());
    assert!(backend.health().is_healthy(), "{}", backend.health());

    server = tokio::task::spawn_blocking(move || {
        server.kill();
        server
    })
    .await
    .unwrap();
    wait_until(
        Duration::from_secs(10),
        "a killed Redis still reported healthy",
        || async {
            let _ = backend.check_one(&steady(), &key, 1).await;
            !backend.health().connected
        },
    )
    .await;
    let health = backend.health();
    assert!(!health.is_healthy(), "{health}");
    assert!(health.last_error.is_some(), "{health}");

    let _server = restart(server).await;
    wait_until(
        Duration::from_secs(10),
        "never healthy again after Redis came back",
        || async {
            let _ = backend.check_one(&steady(), &key, 1).await;
            backend.health().is_healthy()
        },
    )
    .await;
}

/// Nothing outlives the backend: with access lists whose first read never succeeds (`WRONGTYPE`),
/// the retrying task says so once at error level, and once the layer is dropped, the connection
/// to Redis is closed (the task held it) and the task stops.
#[tokio::test]
async fn nothing_outlives_the_backend() {
    let (logs, _guard) = Logs::capture();
    let server = RedisServer::start();
    let port = server.port();
    cli(port, &["SET", "{acl}:allow:net", "not a set"]).await;
    let config = tower_throttle::config::Config::from_toml(&format!(
        "[backend]\nkind = \"redis\"\nurl = \"{}\"\n[access]\nredis_sets = \"acl\"\n{ROUTE}",
        server.url()
    ))
    .unwrap();
    let layer = config.layer().await.unwrap();
    let refused = "Redis refused to give the access lists";
    wait_until(Duration::from_secs(5), "no error", || async {
        logs.count(refused) > 0
    })
    .await;
    let clients = || async {
        cli(port, &["INFO", "clients"])
            .await
            .lines()
            .find_map(|l| {
                l.trim()
                    .strip_prefix("connected_clients:")?
                    .parse::<u32>()
                    .ok()
            })
            .unwrap_or(0)
    };
    // The backend's connection, and redis-cli's own.
    assert!(clients().await >= 2);
    // An observation window (the task retries meanwhile), not a wait for a condition.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(logs.count(refused), 1, "{:?}", logs.lines());

    drop(layer);
    wait_until(
        Duration::from_secs(5),
        "the connection outlived the backend",
        || async { clients().await == 1 },
    )
    .await;
}
