//! Overrides and timed bans through the example server's admin listener, two server processes
//! on one Redis: what one's admin sets, the other enforces within a second, and both still do
//! after a restart.

use std::time::{Duration, Instant};

use crate::example_server::{admin_addr, json, send, send_body, start, Server};
use crate::example_server_admin::CONFIG;
use crate::support::redis as redis_support;

fn server(config: &std::path::Path, url: &str) -> Server {
    start(&[
        "--config",
        config.to_str().unwrap(),
        "--admin",
        "127.0.0.1:0",
        "--redis",
        url,
        "--redis-mode",
        "lua",
    ])
}

/// The statuses of `n` requests of `user` to `/reply` (3 a minute).
async fn replies(server: &Server, user: &str, n: usize) -> Vec<u16> {
    let mut out = Vec::new();
    for _ in 0..n {
        let reply = send(server.addr, "GET", "/reply", &[("x-user-id", user)]).await;
        out.push(reply.status);
    }
    out
}

async fn within_a_second(what: &str, server: &Server, user: &str, status: u16) {
    let started = Instant::now();
    loop {
        let got = send(server.addr, "GET", "/reply", &[("x-user-id", user)])
            .await
            .status;
        if got == status {
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "{what}: still {got} after 1 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn overrides_set_through_one_server_hold_in_the_other_and_after_restarts() {
    let redis = redis_support::RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("limits.toml");
    std::fs::write(&config, CONFIG).unwrap();
    let (one, two) = (server(&config, &redis.url()), server(&config, &redis.url()));
    let admin = admin_addr(&one);
    let json_type = [("content-type", "application/json")];

    // Limited in both; then unlimited through one's admin: through at once in both.
    assert_eq!(replies(&one, "alice", 4).await, [200, 200, 200, 429]);
    assert_eq!(replies(&two, "alice", 1).await, [429]);
    let set = send_body(
        admin,
        "PUT",
        "/overrides/reply/alice",
        &json_type,
        r#"{"unlimited":true}"#,
    )
    .await;
    assert_eq!(set.status, 204, "{}", set.body);
    assert_eq!(replies(&one, "alice", 5).await, [200; 5]);
    within_a_second("unlimited in the other", &two, "alice", 200).await;
    assert_eq!(replies(&two, "alice", 5).await, [200; 5]);

    // A quota for a pattern: every matching key, in the other too.
    let body = r#"{"count":6,"period":"1m"}"#;
    let set = send_body(admin, "PUT", "/overrides/reply/team_*", &json_type, body).await;
    assert_eq!(set.status, 204, "{}", set.body);
    // Heard when the other's peek of a matching key shows the pattern's quota (a request would
    // pass under the policy's own quota too, and count there).
    let started = Instant::now();
    loop {
        let peek = send(admin_addr(&two), "GET", "/limits/reply/team_w", &[]).await;
        if json(&peek.body)["limit"] == 6 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "pattern not heard: {}",
            peek.body
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        replies(&two, "team_x", 7).await,
        [200, 200, 200, 200, 200, 200, 429]
    );
    assert_eq!(replies(&two, "team_y", 7).await[5..], [200, 429]);
    assert_eq!(replies(&two, "other", 4).await, [200, 200, 200, 429]);
    let listed = json(&send(admin, "GET", "/overrides/reply", &[]).await.body);
    assert_eq!(listed.as_array().unwrap().len(), 2, "{listed}");
    let peek = json(
        &send(admin_addr(&two), "GET", "/limits/reply/team_z", &[])
            .await
            .body,
    );
    assert_eq!(peek["limit"], 6, "{peek}");
    assert!(
        peek["override"].as_str().unwrap().starts_with("6 per"),
        "{peek}"
    );

    // A 2 s ban: 429 with Retry-After 2 in the other, and through after.
    let ban = send(admin, "PUT", "/bans/reply/bob?for=2s", &[]).await;
    assert_eq!(ban.status, 204, "{}", ban.body);
    let banned_at = Instant::now();
    within_a_second("ban heard", &two, "bob", 429).await;
    let refused = send(two.addr, "GET", "/reply", &[("x-user-id", "bob")]).await;
    assert_eq!(
        (refused.status, refused.header("retry-after")),
        (429, Some("2"))
    );
    assert_eq!(
        json(&send(admin, "GET", "/bans/reply", &[]).await.body)[0]["key"],
        "bob"
    );
    // A peek shows the ban.
    let peek = json(&send(admin, "GET", "/limits/reply/bob", &[]).await.body);
    assert_eq!(peek["banned"], true, "{peek}");
    assert!(
        peek["ban_remaining_ms"].as_u64().unwrap() <= 2_000,
        "{peek}"
    );
    tokio::time::sleep(Duration::from_millis(2_050).saturating_sub(banned_at.elapsed())).await;
    assert_eq!(replies(&two, "bob", 1).await, [200]);

    // The policy-wide `*`: every other key's quota, in the other within a second; a reload keeps
    // it, unless asked to clear it.
    let body = r#"{"count":1,"period":"1m"}"#;
    let set = send_body(admin, "PUT", "/overrides/reply/*", &json_type, body).await;
    assert_eq!(set.status, 204, "{}", set.body);
    let started = Instant::now();
    loop {
        let peek = json(
            &send(admin_addr(&two), "GET", "/limits/reply/zed", &[])
                .await
                .body,
        );
        if peek["limit"] == 1 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "* not heard: {peek}"
        );
    }
    assert_eq!(replies(&two, "zed", 2).await, [200, 429]);
    assert_eq!(replies(&two, "team_w", 7).await[5..], [200, 429]);
    let keys = |listed: serde_json::Value| -> Vec<String> {
        let all = listed.as_array().unwrap().iter();
        all.map(|o| o["key"].as_str().unwrap().to_owned()).collect()
    };
    assert_eq!(send(admin, "POST", "/reload", &[]).await.status, 200);
    let listed = json(&send(admin, "GET", "/overrides/reply", &[]).await.body);
    assert!(keys(listed).contains(&"*".to_owned()));
    let cleared = send(admin, "POST", "/reload?clear_overrides=true", &[]).await;
    assert_eq!(cleared.status, 200, "{}", cleared.body);
    let listed = json(&send(admin, "GET", "/overrides/reply", &[]).await.body);
    assert_eq!(keys(listed), ["alice", "team_*"]);

    // Bad input: a clear 400, nothing kept.
    let bad = send_body(
        admin,
        "PUT",
        "/overrides/reply/x",
        &json_type,
        r#"{"count":5}"#,
    )
    .await;
    assert_eq!(bad.status, 400, "{}", bad.body);
    let bad = send_body(
        admin,
        "PUT",
        "/overrides/reply/a*b",
        &json_type,
        r#"{"blocked":true}"#,
    )
    .await;
    assert_eq!(bad.status, 400, "{}", bad.body);
    assert_eq!(send(admin, "PUT", "/bans/reply/x", &[]).await.status, 400);
    assert_eq!(send(admin, "GET", "/overrides/nope", &[]).await.status, 404);

    // Both restart: the overrides are in force from their first request.
    drop((one, two));
    let (three, four) = (server(&config, &redis.url()), server(&config, &redis.url()));
    assert_eq!(replies(&three, "alice", 5).await, [200; 5]);
    assert_eq!(replies(&four, "team_q", 7).await[5..], [200, 429]);
    let removed = send(admin_addr(&three), "DELETE", "/overrides/reply/alice", &[]).await;
    assert_eq!(removed.status, 204, "{}", removed.body);
    within_a_second("removal heard", &four, "alice", 429).await;
}
