//! The top limited keys in Redis, merged across processes: two processes refuse a Zipf stream over
//! 10,000 clients; each reads the true top 10 in its answer, and Redis did a small fraction of a
//! command per refusal.

use std::time::{Duration, Instant};

use crate::support::redis as redis_support;
use crate::support::zipf::{true_top, zipf_stream};

use tower_throttle::ops::Offenders;
use tower_throttle::Key;

/// How many times the server ran `command` (`INFO commandstats`; 0 before the first).
fn calls(server: &redis_support::RedisServer, command: &str) -> u64 {
    server
        .cli(&["INFO", "commandstats"])
        .lines()
        .find_map(|l| l.strip_prefix(&format!("cmdstat_{command}:calls=")))
        .map_or(0, |rest| rest.split(',').next().unwrap().parse().unwrap())
}

#[tokio::test]
async fn two_processes_find_the_true_top_10_of_a_zipf_stream() {
    let server = redis_support::RedisServer::start();
    let connect = || async {
        let client = redis::Client::open(server.url()).unwrap();
        redis::aio::ConnectionManager::new(client).await.unwrap()
    };
    let a = Offenders::redis(connect().await, "app");
    let b = Offenders::redis(connect().await, "app");
    let events = 100_000;
    let (stream, exact) = zipf_stream(events, 23);
    for (i, client) in stream.iter().enumerate() {
        // Each refusal lands in one process or the other.
        let process = if i % 2 == 0 { &a } else { &b };
        process.record("api", &Key::from(format!("client-{client}")));
    }
    a.record("other", &Key::from("client-0"));
    let want: Vec<String> = true_top(&exact, 10)
        .into_iter()
        .map(|c| format!("client-{c}"))
        .collect();
    // Sent once a second by each process: poll until both sums have landed.
    let deadline = Instant::now() + Duration::from_secs(10);
    let top = loop {
        let top = b.top("api", 20).await.unwrap();
        let total: u64 = top.iter().map(|t| t.limited).sum();
        if want.iter().all(|w| top.iter().any(|t| &t.key == w))
            && top.first().is_some_and(|t| t.limited == exact[0])
        {
            break top;
        }
        assert!(
            Instant::now() < deadline,
            "the true top 10 {want:?} never all came back: {top:?} (total {total})"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(top.len(), 20);
    assert!(
        top.windows(2).all(|w| w[0].limited >= w[1].limited),
        "{top:?}"
    );
    // Both processes' refusals of the heaviest client, summed: exact while it stays counted.
    assert_eq!(top[0].key, "client-0");
    assert_eq!(top[0].limited, exact[0], "{top:?}");
    assert_eq!(a.top("api", 20).await.unwrap(), top);
    assert_eq!(a.top("other", 5).await.unwrap().len(), 1);
    // Redis's share of the work: one ZINCRBY per distinct key and process per second, not one per
    // refusal.
    let zincrby = calls(&server, "zincrby");
    eprintln!("{events} refusals: {zincrby} ZINCRBY");
    assert!(
        zincrby * 10 < events as u64,
        "{zincrby} ZINCRBY for {events} refusals"
    );
    // The sets are bounded and expire.
    let keys = server.cli(&["KEYS", "{app:top:api}:*"]);
    let key = keys
        .lines()
        .next()
        .expect("a set per policy and minute")
        .trim();
    let size: u64 = server.cli(&["ZCARD", key]).trim().parse().unwrap();
    assert!(size <= tower_throttle::ops::TOP_CAPACITY as u64, "{size}");
    let ttl: i64 = server.cli(&["TTL", key]).trim().parse().unwrap();
    assert!(ttl > 0 && ttl <= 360, "{ttl}");
}

/// On a Redis Cluster: each policy's sets share a hash tag, so `ZUNION` reads them in one slot;
/// two policies (two slots) are sent and read apart.
#[tokio::test]
async fn the_top_limited_keys_on_a_cluster() {
    let cluster = redis_support::RedisCluster::start();
    let conn = redis::cluster::ClusterClient::builder(cluster.urls())
        .retries(0)
        .build()
        .unwrap()
        .get_async_connection()
        .await
        .unwrap();
    let offenders = Offenders::redis_cluster(conn, "app");
    for (policy, key, times) in [("api", "a", 5), ("api", "b", 2), ("login", "c", 3)] {
        for _ in 0..times {
            offenders.record(policy, &Key::from(key));
        }
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let api = offenders.top("api", 10).await.unwrap();
        let login = offenders.top("login", 10).await.unwrap();
        let shown = |top: &[tower_throttle::ops::TopKey]| -> Vec<(String, u64)> {
            top.iter().map(|t| (t.key.clone(), t.limited)).collect()
        };
        if shown(&api) == [("a".to_owned(), 5), ("b".to_owned(), 2)]
            && shown(&login) == [("c".to_owned(), 3)]
        {
            break;
        }
        assert!(Instant::now() < deadline, "{api:?} {login:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A key refused steadily after a minute's set filled is listed: it takes the least counted
/// key's place and count (a trim to the largest 1,024 dropped its second's count every second).
#[tokio::test]
async fn a_key_refused_after_the_set_filled_builds_its_count_up() {
    let server = redis_support::RedisServer::start();
    let client = redis::Client::open(server.url()).unwrap();
    let conn = redis::aio::ConnectionManager::new(client).await.unwrap();
    let offenders = Offenders::redis(conn, "fill");
    // The sets are a minute's each: the whole test within one, so that no fresh set lets it in.
    let into_minute = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        % 60;
    if into_minute > 45 {
        tokio::time::sleep(Duration::from_secs(61 - into_minute)).await;
    }
    for burst in 0..1024 {
        for _ in 0..10 {
            offenders.record("api", &Key::from(format!("burst-{burst}")));
        }
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    for _ in 0..5 {
        for _ in 0..5 {
            offenders.record("api", &Key::from("steady"));
        }
        tokio::time::sleep(Duration::from_millis(1100)).await;
    }
    let top = offenders.top("api", 1024).await.unwrap();
    let steady = top.iter().find(|t| t.key == "steady");
    assert!(steady.is_some_and(|t| t.limited >= 25), "{:?}", &top[..5]);
}
