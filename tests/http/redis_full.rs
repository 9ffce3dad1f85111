//! The example server on a Redis that runs out of memory (issue 27): the admin listener's
//! `/health` answers 503 with the reason, the path and the OOM error, and the gauge
//! `throttle_backend_up{backend, path}` is 0, within a second of the first refused decision; both come back
//! within a second of Redis having room again, with no request to prove it.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use crate::example_server::admin_addr;
use crate::example_server::{send, start};
use crate::support::redis::RedisServer;

/// `throttle_backend_up{path="lua"}` on the server's `/metrics`.
async fn up_gauge(addr: SocketAddr) -> Option<f64> {
    let metrics = send(addr, "GET", "/metrics", &[]).await;
    metrics
        .body
        .lines()
        .find(|l| l.starts_with("throttle_backend_up") && l.contains("path=\"lua\""))
        .map(|l| l.rsplit(' ').next().unwrap().parse().unwrap())
}

/// `/health`'s status and body.
async fn health(admin: SocketAddr) -> (u16, serde_json::Value) {
    let r = send(admin, "GET", "/health", &[]).await;
    let body = serde_json::from_str(&r.body).unwrap_or_else(|e| panic!("{e}: {}", r.body));
    (r.status, body)
}

/// Polls `/health` and the gauge until both say `up`, or a second has passed since `from`.
async fn until(addr: SocketAddr, admin: SocketAddr, from: Instant, up: bool) {
    loop {
        let (status, body) = health(admin).await;
        let gauge = up_gauge(addr).await;
        let want = if up {
            (200, Some(1.0))
        } else {
            (503, Some(0.0))
        };
        if (status, gauge) == want {
            return;
        }
        assert!(
            from.elapsed() < Duration::from_secs(1),
            "after {:?}: /health {status} {body}, gauge {gauge:?}",
            from.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn health_and_the_up_gauge_follow_oom_failures_and_recovery_within_a_second() {
    let redis = RedisServer::start();
    let server = start(&[
        "--redis",
        &redis.url(),
        "--redis-mode",
        "lua",
        "--admin",
        "127.0.0.1:0",
    ]);
    let admin = admin_addr(&server);
    let user = [("x-user-id", "oom")];
    assert_eq!(send(server.addr, "POST", "/reply", &user).await.status, 200);
    until(server.addr, admin, Instant::now(), true).await;

    // Less room than Redis uses already, writes refused: the failure policy (allow) answers.
    let used: u64 = redis
        .cli(&["INFO", "memory"])
        .lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    redis.cli(&["CONFIG", "SET", "maxmemory-policy", "noeviction"]);
    redis.cli(&["CONFIG", "SET", "maxmemory", &(used / 2).to_string()]);
    assert_eq!(send(server.addr, "POST", "/reply", &user).await.status, 200);
    until(server.addr, admin, Instant::now(), false).await;
    let (_, body) = health(admin).await;
    assert_eq!(body["up"], false, "{body}");
    assert_eq!(body["reason"], "decisions failing", "{body}");
    assert_eq!(body["path"], "lua", "{body}");
    assert_eq!(body["decisions_failing"], true, "{body}");
    let error = body["last_error"].as_str().unwrap();
    assert!(
        error.starts_with("OOM command not allowed when used memory > 'maxmemory'"),
        "{body}"
    );

    // Room again, and no request: the backend's probe finds out.
    redis.cli(&["CONFIG", "SET", "maxmemory", "0"]);
    until(server.addr, admin, Instant::now(), true).await;
    let (_, body) = health(admin).await;
    assert_eq!(body["reason"], serde_json::Value::Null, "{body}");
    assert_eq!(body["decisions_failing"], false, "{body}");
}
