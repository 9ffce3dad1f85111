//! `GET /top/{policy}` and `GET /overview` of the example server's admin listener, in memory and
//! on Redis: the keys a policy limited most, largest first; redacted when the config says so.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use crate::example_server::{admin_addr, json, send, start, Server};
use crate::support::redis as redis_support;

/// A route refused after one request a minute per user, and one per client IP; shared by the admin
/// token and page tests.
pub(crate) const ADMIN_CONFIG: &str = r#"
[[route]]
name = "reply"
path = "/reply"
key = "header:x-user-id"
count = 1
period = "1m"

[[route]]
name = "index"
path = "/"
key = "ip"
max_burst = 19
count = 10
period = "1s"
"#;

/// alice is refused 5 times, bob twice, carol never.
async fn refuse(server: &Server) {
    for (user, requests) in [("alice", 6), ("bob", 3), ("carol", 1)] {
        for _ in 0..requests {
            send(server.addr, "POST", "/reply", &[("x-user-id", user)]).await;
        }
    }
}

/// Polls `GET /top/reply` until it answers `want` (Redis sums arrive once a second).
async fn top_until(admin: SocketAddr, want: &[(&str, u64)]) -> serde_json::Value {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let reply = send(admin, "GET", "/top/reply?n=20", &[]).await;
        assert_eq!(reply.status, 200, "{}", reply.body);
        let top = json(&reply.body);
        let got: Vec<(String, u64)> = top
            .as_array()
            .unwrap()
            .iter()
            .map(|t| {
                (
                    t["key"].as_str().unwrap().to_owned(),
                    t["limited"].as_u64().unwrap(),
                )
            })
            .collect();
        if got.len() == want.len()
            && got
                .iter()
                .zip(want)
                .all(|(g, w)| g.1 == w.1 && (w.0 == "*" || g.0 == w.0))
        {
            return top;
        }
        assert!(
            Instant::now() < deadline,
            "top never became {want:?}: {got:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn top_and_overview(extra: &[&str], config: &str) -> serde_json::Value {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("limits.toml");
    std::fs::write(&file, config).unwrap();
    let mut args = vec!["--config", file.to_str().unwrap(), "--admin", "127.0.0.1:0"];
    args.extend_from_slice(extra);
    let server = start(&args);
    let admin = admin_addr(&server);
    refuse(&server).await;
    let top = if config.contains("redact_keys") {
        top_until(admin, &[("*", 5), ("*", 2)]).await
    } else {
        top_until(admin, &[("alice", 5), ("bob", 2)]).await
    };

    assert_eq!(
        send(admin, "GET", "/top/reply?n=1", &[])
            .await
            .body
            .matches("limited")
            .count(),
        1
    );
    for bad in ["/top/reply?n=0", "/top/reply?n=100000", "/top/reply?n=x"] {
        assert_eq!(send(admin, "GET", bad, &[]).await.status, 400, "{bad}");
    }
    assert_eq!(send(admin, "GET", "/top/nope", &[]).await.status, 404);

    let overview = send(admin, "GET", "/overview", &[]).await;
    assert_eq!(overview.status, 200, "{}", overview.body);
    let overview = json(&overview.body);
    assert_eq!(overview["policies"][0]["name"], "reply", "{overview}");
    assert_eq!(
        overview["policies"][0]["limits"][0]["count"], 1,
        "{overview}"
    );
    assert_eq!(
        overview["policies"][0]["limits"][0]["period_ms"], 60_000,
        "{overview}"
    );
    assert_eq!(overview["up"], true, "{overview}");
    assert_eq!(overview["top_window_minutes"], 5, "{overview}");
    // The counters are sampled every 2 s: the refusals show as a rate once two samples exist.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let overview = json(&send(admin, "GET", "/overview", &[]).await.body);
        let limited: f64 = overview["rates"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|r| r["policies"]["reply"]["limited"].as_f64())
            .sum();
        if limited > 0.0 {
            break;
        }
        assert!(Instant::now() < deadline, "no limited rate: {overview}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    top
}

#[tokio::test]
async fn top_limited_keys_in_memory() {
    top_and_overview(&[], ADMIN_CONFIG).await;
}

#[tokio::test]
async fn top_limited_keys_on_redis() {
    let redis = redis_support::RedisServer::start();
    let url = redis.url();
    top_and_overview(&["--redis", &url, "--redis-mode", "lua"], ADMIN_CONFIG).await;
}

#[tokio::test]
async fn top_limited_keys_are_redacted_when_keys_are() {
    let config = format!("[logging]\nredact_keys = true\n{ADMIN_CONFIG}");
    let top = top_and_overview(&[], &config).await;
    for entry in top.as_array().unwrap() {
        let key = entry["key"].as_str().unwrap();
        assert!(key.starts_with("hmac:") && key.len() == 21, "{key}");
    }
}

/// Three routes of one request a minute: per address, per user header and per (user, address).
const SPELLING_CONFIG: &str = r#"
[[route]]
name = "by-ip"
path = "/ip"
key = "ip"
count = 1
period = "1m"

[[route]]
name = "by-user"
path = "/user"
key = "header:x-user-id"
count = 1
period = "1m"

[[route]]
name = "by-both"
path = "/both"
key = ["header:x-user-id", "ip"]
count = 1
period = "1m"
"#;

/// A path segment as `encodeURIComponent` writes it (what the admin page sends).
fn path_segment(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                char::from(b).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Every key `/top` lists is one peek and reset take as it is: an address (`!127.0.0.1`), a header
/// value that needs escaping (`user 42/x%`), and a composite of both.
#[tokio::test]
async fn every_key_the_top_list_shows_round_trips_through_peek_and_reset() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("limits.toml");
    std::fs::write(&file, SPELLING_CONFIG).unwrap();
    let server = start(&["--config", file.to_str().unwrap(), "--admin", "127.0.0.1:0"]);
    let admin = admin_addr(&server);
    let user = [("x-user-id", "user 42/x%")];
    for (policy, path) in [("by-ip", "/ip"), ("by-user", "/user"), ("by-both", "/both")] {
        assert_eq!(send(server.addr, "GET", path, &user).await.status, 200);
        assert_eq!(send(server.addr, "GET", path, &user).await.status, 429);
        let top = json(
            &send(admin, "GET", &format!("/top/{policy}"), &[])
                .await
                .body,
        );
        let key = top[0]["key"]
            .as_str()
            .unwrap_or_else(|| panic!("{top}"))
            .to_owned();
        let limits = format!("/limits/{policy}/{}", path_segment(&key));
        let peek = send(admin, "GET", &limits, &[]).await;
        assert_eq!(peek.status, 200, "{policy}: peek {key:?}: {}", peek.body);
        assert_eq!(
            json(&peek.body)["remaining"],
            0,
            "{policy}: peek {key:?}: {}",
            peek.body
        );
        let reset = send(admin, "DELETE", &limits, &[]).await;
        assert_eq!(reset.status, 204, "{policy}: reset {key:?}: {}", reset.body);
        // The reset reached the key the request counts against: it passes again.
        assert_eq!(
            send(server.addr, "GET", path, &user).await.status,
            200,
            "{policy}: {key:?}"
        );
    }
}
