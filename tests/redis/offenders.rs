//! Distinct limited clients counted in Redis (HyperLogLog), shared by every process.

use crate::support::redis as redis_support;

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

fn unix_minute() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        / 60
}

/// Waits (generously) until `done`, letting the background writes run meanwhile.
async fn until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !done() {
        assert!(std::time::Instant::now() < deadline, "never: {what}");
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn two_processes_count_distinct_limited_clients_in_redis() {
    let server = redis_support::RedisServer::start();
    let connect = || async {
        let client = redis::Client::open(server.url()).unwrap();
        redis::aio::ConnectionManager::new(client).await.unwrap()
    };
    let a = Offenders::redis(connect().await, "app");
    let b = Offenders::redis(connect().await, "app");
    let minute = unix_minute();
    for i in 0..300 {
        a.record("login", &Key::from(format!("user-{i}")));
        b.record("login", &Key::from(format!("user-{}", i + 200))); // 100 in common
    }
    for _ in 0..1000 {
        a.record("login", &Key::from("flooder"));
    }
    let one_minute = unix_minute() == minute;
    // The test's runtime has one thread, so nothing was sent before this first await: each process
    // now sends everything it recorded as one batch, one PFADD per counter (minute, hour, day).
    // Their six PFADDs having run is the event that every count is final.
    until("both batches are written", || calls(&server, "pfadd") >= 6).await;
    if one_minute {
        // (Had a minute begun meanwhile, a batch would write to two minute counters.)
        assert_eq!(calls(&server, "pfadd"), 6);
    }
    let counts = a.count("login").await.unwrap();
    // 501 distinct (user-0 .. user-499, and the flooder), within HyperLogLog's error.
    for n in [counts.minute, counts.hour, counts.day] {
        assert!((490..=512).contains(&n), "{counts:?}");
    }
    assert_eq!(b.count("login").await.unwrap(), counts);
    assert_eq!(a.count("other").await.unwrap().day, 0);
    // The distinct counts, and the policy's top limited keys (a sorted set per minute).
    let keys = server.cli(&["KEYS", "*"]);
    assert!(
        keys.lines()
            .all(|k| k.starts_with("{app:offenders:login}:") || k.starts_with("{app:top:login}:")),
        "{keys}"
    );
}

/// A flood from one key is written once a minute per process: the second and later rejections of
/// a key within the minute cost Redis nothing.
#[tokio::test]
async fn a_limited_key_is_written_once_a_minute() {
    let server = redis_support::RedisServer::start();
    let client = redis::Client::open(server.url()).unwrap();
    let offenders = Offenders::redis(
        redis::aio::ConnectionManager::new(client).await.unwrap(),
        "app",
    );
    // A minute boundary in the middle would rightly write the flooder again: then try once more,
    // with fresh names, in the next minute.
    for attempt in 0..2 {
        let (policy, marker) = (format!("login-{attempt}"), format!("marker-{attempt}"));
        let minute = unix_minute();
        let before = calls(&server, "pfadd");
        offenders.record(&policy, &Key::from("flooder"));
        until("the first rejection is written", || {
            calls(&server, "pfadd") == before + 3
        })
        .await;
        // The same key again, while the first write's task may still be finishing or not.
        for _ in 0..3 {
            offenders.record(&policy, &Key::from("flooder"));
        }
        // Then another policy's key: one process's records reach Redis in the order recorded, so
        // once the marker's three counters exist, anything the repeats sent has been written.
        offenders.record(&marker, &Key::from("someone"));
        let pattern = format!("{{app:offenders:{marker}}}:*");
        until("the marker is written", || {
            server.cli(&["KEYS", &pattern]).lines().count() == 3
        })
        .await;
        if unix_minute() != minute {
            continue;
        }
        // The marker's three PFADDs, none for the repeated flooder.
        assert_eq!(calls(&server, "pfadd"), before + 6);
        assert_eq!(offenders.count(&policy).await.unwrap().minute, 1);
        return;
    }
    panic!("two minute boundaries in two attempts");
}

/// A flood of invented keys on one policy (past the 100,000 keys a process remembers a minute)
/// does not stop another policy's limited clients from being counted.
#[tokio::test]
async fn a_flood_of_invented_keys_leaves_other_policies_counted() {
    let server = redis_support::RedisServer::start();
    let client = redis::Client::open(server.url()).unwrap();
    let conn = redis::aio::ConnectionManager::new(client).await.unwrap();
    let offenders = Offenders::redis(conn, "app");
    for batch in 0..20 {
        let written = calls(&server, "pfadd");
        for i in 0..5_000 {
            offenders.record("search", &Key::from(format!("invented-{batch}-{i}")));
        }
        until("the batch is written", || {
            calls(&server, "pfadd") >= written + 3
        })
        .await;
    }
    let written = calls(&server, "pfadd");
    offenders.record("login", &Key::from("eve"));
    until("eve is written", || calls(&server, "pfadd") >= written + 3).await;
    assert_eq!(offenders.count("login").await.unwrap().minute, 1);
}
