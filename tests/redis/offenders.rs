//! Distinct limited clients counted in Redis (HyperLogLog), shared by every process.

use crate::support::redis as redis_support;

use tower_throttle::offenders::Offenders;
use tower_throttle::Key;

#[tokio::test]
async fn two_processes_count_distinct_limited_clients_in_redis() {
    let server = redis_support::RedisServer::start();
    let connect = || async {
        let client = redis::Client::open(server.url()).unwrap();
        redis::aio::ConnectionManager::new(client).await.unwrap()
    };
    let a = Offenders::redis(connect().await, "app");
    let b = Offenders::redis(connect().await, "app");
    for i in 0..300 {
        a.record("login", &Key::from(format!("user-{i}")));
        b.record("login", &Key::from(format!("user-{}", i + 200))); // 100 in common
    }
    // A flood from one key is written once a minute per process.
    for _ in 0..1000 {
        a.record("login", &Key::from("flooder"));
    }
    // Writes are sent in the background: wait until the counts stop moving.
    let mut counts = a.count("login").await.unwrap();
    for _ in 0..100 {
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        let again = a.count("login").await.unwrap();
        if again == counts && counts.minute > 0 {
            break;
        }
        counts = again;
    }
    // 501 distinct (user-0 .. user-499, and the flooder), within HyperLogLog's error.
    for n in [counts.minute, counts.hour, counts.day] {
        assert!((490..=512).contains(&n), "{counts:?}");
    }
    assert_eq!(b.count("login").await.unwrap(), counts);
    assert_eq!(a.count("other").await.unwrap().day, 0);
    let keys = server.cli(&["KEYS", "*"]);
    assert!(
        keys.lines()
            .all(|k| k.starts_with("{app:offenders:login}:")),
        "{keys}"
    );
    let pfadds: u64 = server
        .cli(&["INFO", "commandstats"])
        .lines()
        .find_map(|l| l.strip_prefix("cmdstat_pfadd:calls="))
        .map(|rest| rest.split(',').next().unwrap().parse().unwrap())
        .unwrap();
    // (Twice that if a minute began during the test: each process sends a key again.)
    assert!(
        pfadds <= 2 * 3 * 601,
        "{pfadds} writes for 601 distinct records"
    );
}
