//! The example server's admin listener (`--admin`): peek, reset, reload (HTTP and SIGHUP) and
//! health, over real TCP, in memory and on Redis.

use std::time::Duration;

use crate::example_server::{admin_addr, json, send, start, Server};
use crate::support::redis as redis_support;

pub(crate) const CONFIG: &str = r#"
[[route]]
name = "reply"
path = "/reply"
key = "header:x-user-id"
count = 3
period = "1m"

[[route]]
name = "index"
path = "/"
key = "ip"
count = 5
period = "1s"
"#;

async fn replies(server: &Server, user: &str, n: usize) -> Vec<u16> {
    let mut statuses = Vec::new();
    for _ in 0..n {
        statuses.push(
            send(server.addr, "GET", "/reply", &[("x-user-id", user)])
                .await
                .status,
        );
    }
    statuses
}

async fn peek_reset_reload(extra: &[&str]) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("limits.toml");
    std::fs::write(&file, CONFIG).unwrap();
    let mut args = vec!["--config", file.to_str().unwrap(), "--admin", "127.0.0.1:0"];
    args.extend_from_slice(extra);
    let server = start(&args);
    let admin = admin_addr(&server);

    assert_eq!(replies(&server, "alice", 4).await, [200, 200, 200, 429]);
    let peek = send(admin, "GET", "/limits/reply/alice", &[]).await;
    assert_eq!(peek.status, 200, "{}", peek.body);
    let state = json(&peek.body);
    assert_eq!(state["limit"], 3, "{state}");
    assert_eq!(state["remaining"], 0, "{state}");
    assert_eq!(state["banned"], false, "{state}");
    assert!(
        state["reset_after_ms"].as_u64().unwrap() > 50_000,
        "{state}"
    );
    // A peek consumes nothing: another user still has the full quota after peeks.
    for _ in 0..5 {
        let state = json(&send(admin, "GET", "/limits/reply/bob", &[]).await.body);
        assert_eq!(state["remaining"], 3, "{state}");
    }
    assert_eq!(replies(&server, "bob", 4).await, [200, 200, 200, 429]);

    let reset = send(admin, "DELETE", "/limits/reply/alice", &[]).await;
    assert_eq!(reset.status, 204, "{}", reset.body);
    assert_eq!(
        json(&send(admin, "GET", "/limits/reply/alice", &[]).await.body)["remaining"],
        3
    );
    assert_eq!(replies(&server, "alice", 4).await, [200, 200, 200, 429]);

    // Errors: an unknown policy, a key the policy cannot have.
    assert_eq!(
        send(admin, "GET", "/limits/nope/alice", &[]).await.status,
        404
    );
    assert_eq!(
        send(admin, "GET", "/limits/index/not-an-ip", &[])
            .await
            .status,
        400
    );
    assert_eq!(
        send(admin, "GET", "/limits/index/127.0.0.1", &[])
            .await
            .status,
        200
    );

    // Reload: a larger quota applies to the running server; an invalid file changes nothing.
    std::fs::write(&file, CONFIG.replace("count = 3", "count = 10")).unwrap();
    let reload = send(admin, "POST", "/reload", &[]).await;
    assert_eq!(reload.status, 200, "{}", reload.body);
    assert_eq!(
        json(&send(admin, "GET", "/limits/reply/carol", &[]).await.body)["limit"],
        10
    );
    std::fs::write(&file, CONFIG.replace("count = 3", "count = 0")).unwrap();
    let refused = send(admin, "POST", "/reload", &[]).await;
    assert_eq!(refused.status, 400, "{}", refused.body);
    assert!(
        json(&refused.body)["error"]
            .as_str()
            .unwrap()
            .contains("count"),
        "{}",
        refused.body
    );
    let statuses = replies(&server, "carol", 11).await;
    assert_eq!(
        statuses.iter().filter(|s| **s == 200).count(),
        10,
        "{statuses:?}"
    );
    // A new path cannot come by reload: the router is built once.
    std::fs::write(&file, CONFIG.replace("/reply", "/other")).unwrap();
    assert_eq!(send(admin, "POST", "/reload", &[]).await.status, 400);

    // SIGHUP reloads as POST /reload does.
    std::fs::write(&file, CONFIG.replace("count = 3", "count = 7")).unwrap();
    let pid = server.pid().to_string();
    assert!(std::process::Command::new("kill")
        .args(["-HUP", &pid])
        .status()
        .unwrap()
        .success());
    let mut limit = serde_json::Value::Null;
    for _ in 0..100 {
        limit = json(&send(admin, "GET", "/limits/reply/dave", &[]).await.body)["limit"].clone();
        if limit == 7 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(limit, 7, "SIGHUP did not reload");

    // A policy renamed by a reload is the one `/metrics` counts limited clients of, and the old
    // name's counts read 0, not what they were before the reload.
    let old_counts = |metrics: &str| -> Vec<String> {
        let old = "throttle_distinct_limited_clients{policy=\"reply\"";
        metrics
            .lines()
            .filter(|l| l.starts_with(old))
            .map(str::to_owned)
            .collect()
    };
    let metrics = send(server.addr, "GET", "/metrics", &[]).await.body;
    let before = old_counts(&metrics);
    assert!(
        before.len() == 3 && before.iter().all(|l| !l.ends_with(" 0")),
        "{metrics}"
    );
    std::fs::write(&file, CONFIG.replace("\"reply\"", "\"answer\"")).unwrap();
    assert_eq!(send(admin, "POST", "/reload", &[]).await.status, 200);
    replies(&server, "erin", 4).await;
    let metrics = send(server.addr, "GET", "/metrics", &[]).await.body;
    let distinct = "throttle_distinct_limited_clients{policy=\"answer\"";
    assert!(metrics.contains(distinct), "{metrics}");
    let after = old_counts(&metrics);
    assert!(
        after.len() == 3 && after.iter().all(|l| l.ends_with(" 0")),
        "{metrics}"
    );

    let health = send(admin, "GET", "/health", &[]).await;
    assert_eq!(health.status, 200, "{}", health.body);
    assert_eq!(json(&health.body)["up"], true, "{}", health.body);
}

#[tokio::test]
async fn admin_listener_in_memory() {
    peek_reset_reload(&[]).await;
}

#[tokio::test]
async fn admin_listener_on_redis() {
    let redis = redis_support::RedisServer::start();
    let url = redis.url();
    peek_reset_reload(&["--redis", &url, "--redis-mode", "lua"]).await;
}

#[test]
fn admin_is_off_by_default() {
    let server = start(&[]);
    assert!(!server.line.contains("admin on"), "{}", server.line);
}

/// Without `--admin`, SIGHUP still reloads the file, and the server lives on (a SIGHUP nobody
/// listens for ends the process).
#[tokio::test]
async fn sighup_reloads_without_the_admin_listener() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("limits.toml");
    std::fs::write(&file, CONFIG).unwrap();
    let server = start(&["--config", file.to_str().unwrap()]);
    assert_eq!(replies(&server, "alice", 4).await, [200, 200, 200, 429]);
    std::fs::write(&file, CONFIG.replace("count = 3", "count = 7")).unwrap();
    let pid = server.pid().to_string();
    let hup = std::process::Command::new("kill")
        .args(["-HUP", &pid])
        .status();
    assert!(hup.unwrap().success());
    // Seven a minute once reloaded: a new user's fourth request passes.
    let mut reloaded = false;
    for probe in 0..100 {
        tokio::time::sleep(Duration::from_millis(20)).await;
        if replies(&server, &format!("probe-{probe}"), 4).await == [200; 4] {
            reloaded = true;
            break;
        }
    }
    assert!(reloaded, "SIGHUP did not reload");
    let served = replies(&server, "carol", 8).await;
    assert_eq!(
        served.iter().filter(|s| **s == 200).count(),
        7,
        "{served:?}"
    );
}

/// A token-less admin listener answers what is sent from this machine only: not a request a web
/// page made the operator's browser send (another site's `Origin`, `Sec-Fetch-Site: cross-site`),
/// nor one through a name that resolves here (DNS rebinding: a `Host` that is not a loopback one).
#[tokio::test]
async fn a_tokenless_admin_listener_refuses_what_a_web_page_sends() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("limits.toml");
    std::fs::write(&file, CONFIG).unwrap();
    let server = start(&["--config", file.to_str().unwrap(), "--admin", "127.0.0.1:0"]);
    let admin = admin_addr(&server);
    for headers in [
        &[("origin", "http://evil.example")][..],
        &[("origin", "null")],
        &[("sec-fetch-site", "cross-site")],
        &[("host", "evil.example:80")],
        // Fail closed: bytes no browser sends, a host after the port, a second line.
        &[("host", "évil.example")],
        &[("origin", "http://évil.example")],
        &[("origin", "http://localhost:80@evil.example")],
        &[("sec-fetch-site", "Cross-Site")],
        &[
            ("origin", "http://localhost"),
            ("origin", "http://evil.example"),
        ],
    ] {
        let reply = send(admin, "POST", "/reload?clear_overrides=true", headers).await;
        assert_eq!(reply.status, 403, "{headers:?}: {}", reply.body);
    }
    let own = format!("http://{admin}");
    let same = send(admin, "POST", "/reload", &[("origin", &own)]).await;
    assert_eq!(same.status, 200, "{}", same.body);
    let local = send(admin, "GET", "/health", &[("host", "localhost")]).await;
    assert_eq!(local.status, 200, "{}", local.body);
    // Nor can another site frame the page, to lead the operator's clicks.
    let page = send(admin, "GET", "/", &[]).await;
    assert_eq!(page.status, 200);
    assert_eq!(page.header("x-frame-options"), Some("DENY"));
}

/// The built-in config has no file to reload: a reload says so, and is no failed reload for the
/// alert on them (which says the file on disk is not what runs).
#[tokio::test]
async fn a_reload_of_the_built_in_config_is_refused_and_not_counted_as_failed() {
    let server = start(&["--admin", "127.0.0.1:0"]);
    let admin = admin_addr(&server);
    let reload = send(admin, "POST", "/reload", &[]).await;
    assert_eq!(reload.status, 400, "{}", reload.body);
    assert!(reload.body.contains("built-in config"), "{}", reload.body);
    let metrics = send(server.addr, "GET", "/metrics", &[]).await.body;
    let failed = "throttle_config_reloads_total{result=\"error\"} 0";
    assert!(metrics.lines().any(|l| l == failed), "{metrics}");
}
