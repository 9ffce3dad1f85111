//! Redis Sentinel: three real `redis-server --sentinel` processes over a primary and its replica;
//! `SENTINEL FAILOVER` under load. Also the `[backend]` keys for Sentinel and for the lazy start.

use crate::support::failover::{
    cli, free_port, replicate, wait_until, Figures, Load, Logs, Sentinels, SERVICE,
};
use crate::support::redis as redis_support;

use std::time::{Duration, Instant};

use redis_support::RedisServer;
use tower_throttle::config::{BackendHealth, Config};
use tower_throttle::{
    redis::{RedisBackend, RedisMode},
    Limit, Quota,
};

const TIMEOUT: Duration = Duration::from_millis(100);
const STALL: Duration = Duration::from_secs(1);

fn steady() -> Limit {
    Limit::new(
        "steady",
        Quota::cl_throttle(1_000_000, 1, Duration::from_secs(60)),
    )
    .unwrap()
}

#[tokio::test]
async fn a_sentinel_failover_under_load() {
    let (logs, _guard) = Logs::capture();
    let (primary, replica) = (RedisServer::start(), RedisServer::start());
    replicate(replica.port(), primary.port()).await;
    let sentinels = Sentinels::start(primary.port()).await;
    let replica_port = replica.port().to_string();
    wait_until(
        Duration::from_secs(30),
        "the sentinels never saw the replica and each other",
        || async {
            let replicas = cli(sentinels.port(0), &["SENTINEL", "REPLICAS", SERVICE]).await;
            let master = cli(sentinels.port(0), &["SENTINEL", "MASTER", SERVICE]).await;
            let others = master
                .lines()
                .skip_while(|l| *l != "num-other-sentinels")
                .nth(1)
                .and_then(|n| n.parse::<u32>().ok())
                .unwrap_or(0);
            replicas.contains(&replica_port) && others >= 2
        },
    )
    .await;

    let backend = RedisBackend::builder()
        .sentinel(sentinels.urls(), SERVICE)
        .mode(RedisMode::Lua)
        .timeout(TIMEOUT)
        .connect()
        .await
        .unwrap();
    let address = |b: &RedisBackend| b.health().address.unwrap_or_default();
    assert!(
        address(&backend).ends_with(&format!(":{}", primary.port())),
        "{}",
        backend.health()
    );
    let load = Load::start(&backend, &steady(), 2, Duration::from_millis(2));
    load.wait_decided(Duration::ZERO, 20).await;

    let trigger = load.now();
    let started = Instant::now();
    wait_until(
        Duration::from_secs(10),
        "SENTINEL FAILOVER was refused",
        || async { cli(sentinels.port(0), &["SENTINEL", "FAILOVER", SERVICE]).await == "OK" },
    )
    .await;
    wait_until(
        Duration::from_secs(20),
        "the backend never moved to the new primary",
        || async {
            address(&backend).ends_with(&format!(":{}", replica.port()))
                && backend.health().is_healthy()
        },
    )
    .await;
    let moved_after = started.elapsed();
    load.wait_decided(load.now(), 20).await;
    let samples = load.finish().await;
    let figures = Figures::of(&samples, trigger);
    figures.print("sentinel-failover", &logs);
    println!(
        "[sentinel-failover] decisions on the new primary {moved_after:?} after SENTINEL FAILOVER; health: {}",
        backend.health()
    );
    assert!(
        figures.max_latency <= TIMEOUT + STALL,
        "a call took {:?}\n{}",
        figures.max_latency,
        sentinels.logs()
    );
    assert!(
        figures.recovered_after.is_some(),
        "ended on a failure: {figures:?}"
    );
    assert!(
        moved_after <= Duration::from_secs(15),
        "took {moved_after:?}"
    );
    let key = backend.redis_key("steady", &"steady".into());
    assert_eq!(cli(replica.port(), &["EXISTS", &key]).await, "1");
    // The resets listener followed too: the demoted primary still answers it, but hears nothing
    // published on the new one.
    wait_until(
        Duration::from_secs(10),
        "the resets listener stayed on the demoted primary",
        || async {
            let subscribers = cli(replica.port(), &["PUBSUB", "NUMSUB", "throttle:resets"]).await;
            subscribers.lines().nth(1).map(str::trim) == Some("1")
        },
    )
    .await;
}

const ROUTE: &str = "[[route]]\nname = \"r\"\nkey = \"ip\"\ncount = 5\nperiod = \"1s\"\n";

async fn layer_error(backend: &str) -> String {
    let config = Config::from_toml(&format!("[backend]\n{backend}\n{ROUTE}")).unwrap();
    match config.layer().await {
        Ok(_) => panic!("accepted: {backend}"),
        Err(e) => e.to_string(),
    }
}

#[tokio::test]
async fn sentinel_keys_parse_and_conflicts_are_refused() {
    let free = crate::support::failover::free_port();
    let sentinels = format!("sentinels = [\"redis://127.0.0.1:{free}\"]");
    let config = Config::from_toml(&format!(
        "[backend]\nkind = \"redis\"\n{sentinels}\nsentinel_service = \"mymaster\"\n{ROUTE}"
    ))
    .unwrap();
    // Lazy by default: no sentinel answers, and the layer is built anyway (an eager start would
    // fail; the deadline only catches a hang, it is not a speed claim).
    let layer = tokio::time::timeout(Duration::from_secs(10), config.layer())
        .await
        .expect("a lazy start waits for no sentinel")
        .unwrap();
    drop(layer);

    let redis = "kind = \"redis\"";
    let both = layer_error(&format!(
        "{redis}\nurl = \"redis://127.0.0.1:{free}\"\n{sentinels}\nsentinel_service = \"m\""
    ))
    .await;
    assert!(both.contains("not both"), "{both}");
    let no_service = layer_error(&format!("{redis}\n{sentinels}")).await;
    assert!(no_service.contains("sentinel_service"), "{no_service}");
    let no_sentinels = layer_error(&format!(
        "{redis}\nurl = \"redis://127.0.0.1:{free}\"\nsentinel_service = \"m\""
    ))
    .await;
    assert!(no_sentinels.contains("needs sentinels"), "{no_sentinels}");
    let with_cluster = layer_error(&format!(
        "{redis}\n{sentinels}\nsentinel_service = \"m\"\ncluster = true"
    ))
    .await;
    assert!(with_cluster.contains("cluster"), "{with_cluster}");
    let password_without_sentinels = layer_error(&format!(
        "{redis}\nurl = \"redis://127.0.0.1:{free}\"\nprimary_password = \"pw\""
    ))
    .await;
    assert!(
        password_without_sentinels.contains("go with sentinels"),
        "{password_without_sentinels}"
    );
    let bad_name = layer_error(&format!(
        "{redis}\nurl = \"redis://127.0.0.1:{free}\"\nname = \"\""
    ))
    .await;
    assert!(bad_name.contains("backend name"), "{bad_name}");
    let bad_connect = layer_error(&format!(
        "{redis}\nurl = \"redis://127.0.0.1:{free}\"\nconnect = \"soon\""
    ))
    .await;
    assert!(
        bad_connect.contains("[backend] connect = \"soon\" is not \"lazy\" or \"eager\""),
        "{bad_connect}"
    );
    let zero = layer_error(&format!(
        "{redis}\nurl = \"redis://127.0.0.1:{free}\"\ntimeout_ms = 0"
    ))
    .await;
    assert!(
        zero.contains("[backend] timeout_ms must be more than 0"),
        "{zero}"
    );
    assert!(
        Config::from_toml(&format!("[backend]\n{redis}\nsentinel = [\"x\"]\n{ROUTE}")).is_err()
    );
}

/// `Config::layer` starts while Redis is down (lazily, the default; access lists from Redis
/// included), reports it unhealthy, and
/// moves to Redis once it answers; `connect = "eager"` refuses to start instead.
#[tokio::test]
async fn config_layer_starts_while_redis_is_down() {
    let mut server = RedisServer::start();
    let url = server.url();
    server = tokio::task::spawn_blocking(move || {
        server.stop();
        server
    })
    .await
    .unwrap();
    let backend = format!("[backend]\nkind = \"redis\"\nurl = \"{url}\"\n");
    // The access lists mirrored from Redis and the offender counts do not stop the start either.
    let access = "[access]\nredis_sets = \"acl\"\n";
    let config = Config::from_toml(&format!("{backend}{access}{ROUTE}")).unwrap();
    let started = Instant::now();
    // Built although Redis is down (eager, below, fails): the deadline only catches a hang.
    let layer = tokio::time::timeout(Duration::from_secs(10), config.layer())
        .await
        .expect("a lazy start waits for no server")
        .unwrap();
    println!(
        "[config-start-down] Config::layer() returned in {:?}",
        started.elapsed()
    );

    let eager = Config::from_toml(&format!("{backend}connect = \"eager\"\n{ROUTE}")).unwrap();
    assert!(eager.layer().await.is_err());

    // The backend the config names reports its health.
    let redis = layer.backend();
    assert!(!redis.health().is_healthy(), "{}", redis.health());
    let _server = tokio::task::spawn_blocking(move || {
        server.restart();
        server
    })
    .await
    .unwrap();
    wait_until(Duration::from_secs(5), "never connected", || async {
        redis.health().is_healthy()
    })
    .await;
    assert!(matches!(redis.health(), BackendHealth::Redis(_)));
}

/// `total_connections_received` of the server on `port` (`args` before the command: a password).
async fn connections_received(port: u16, args: &[&str]) -> u64 {
    let mut all = args.to_vec();
    all.extend(["INFO", "stats"]);
    cli(port, &all)
        .await
        .lines()
        .find_map(|l| {
            l.trim()
                .strip_prefix("total_connections_received:")?
                .parse()
                .ok()
        })
        .unwrap_or(0)
}

/// A primary, three sentinels that name it, and a backend that follows them (Lua, the timeout).
async fn followed_primary() -> (RedisServer, Sentinels, RedisBackend) {
    let primary = RedisServer::start();
    let sentinels = Sentinels::start(primary.port()).await;
    wait_until(
        Duration::from_secs(10),
        "the sentinels never named the primary",
        || async { sentinels.primary_port().await == Some(primary.port()) },
    )
    .await;
    let backend = RedisBackend::builder()
        .sentinel(sentinels.urls(), SERVICE)
        .mode(RedisMode::Lua)
        .timeout(TIMEOUT)
        .connect()
        .await
        .unwrap();
    (primary, sentinels, backend)
}

/// One sentinel that lags the others (it names a primary that does not answer, as one that has
/// not seen a failover names the old one) does not make the backend drop its connection to the
/// right primary every second: its answer is confirmed first, and doubted for a while.
#[tokio::test]
async fn a_lagging_sentinel_does_not_drop_the_connection_to_the_primary() {
    let (primary, sentinels, backend) = followed_primary().await;
    // The first sentinel, the one the backend asks, now names a server that is not there.
    let (logs, _guard) = Logs::capture();
    let nowhere = free_port().to_string();
    sentinels.cli(0, &["SENTINEL", "REMOVE", SERVICE]).await;
    let monitor = ["SENTINEL", "MONITOR", SERVICE, "127.0.0.1", &nowhere, "2"];
    sentinels.cli(0, &monitor).await;
    let before = connections_received(primary.port(), &[]).await;
    // An observation window of four rounds of following (one a second).
    tokio::time::sleep(Duration::from_millis(4500)).await;
    let after = connections_received(primary.port(), &[]).await;
    assert_eq!(
        logs.count("the sentinels name a new primary"),
        0,
        "{:?}",
        logs.lines()
    );
    assert!(backend.health().is_healthy(), "{}", backend.health());
    // The confirmations' checks of the primary's role (the two sentinels that name it, each
    // time: after 1 s, then 1 and 2 s more, doubted), and redis-cli's.
    assert!(
        after - before <= 8,
        "{} connections to the primary in 4.5 s",
        after - before
    );
}

/// Following the sentinels costs the primary nothing: the backend asks one kept sentinel
/// connection where the primary is, instead of opening a connection to the primary every second to
/// check its role. And `sentinel_node` given before `sentinel` is not lost: its password logs in.
#[tokio::test]
async fn following_the_sentinels_opens_no_connection_to_the_primary() {
    let (primary, sentinels, backend) = followed_primary().await;
    let before = connections_received(primary.port(), &[]).await;
    // An observation window of three rounds of following (one a second), not a wait for a condition.
    tokio::time::sleep(Duration::from_millis(3500)).await;
    let after = connections_received(primary.port(), &[]).await;
    assert!(backend.health().is_healthy(), "{}", backend.health());
    // The one redis-cli opened to ask, and whatever the sentinels opened (they keep theirs).
    assert!(
        after - before <= 2,
        "{} connections to the primary in 3.5 s",
        after - before
    );
    drop(backend);

    cli(primary.port(), &["CONFIG", "SET", "requirepass", "pw"]).await;
    let node = redis::sentinel::SentinelNodeConnectionInfo::default()
        .set_redis_connection_info(redis::RedisConnectionInfo::default().set_password("pw"));
    let backend = RedisBackend::builder()
        .sentinel_node(node)
        .sentinel(sentinels.urls(), SERVICE)
        .mode(RedisMode::Lua)
        .timeout(TIMEOUT)
        .connect()
        .await;
    assert!(backend.is_ok(), "{:?}", backend.err());
}
