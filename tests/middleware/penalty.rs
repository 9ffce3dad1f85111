//! The penalty box through the layer: in process (memory backend) and shared in Redis by every
//! process, with `Retry-After` = the rest of the ban.

use std::time::Duration;

use crate::shared::penalty::{policy, send, stacked, the_ban_shows_on_every_limit};
use axum::{routing::get, Router};
use tower_throttle::config::Config;
use tower_throttle::key::Header;
use tower_throttle::{policy::Penalty, Policy, Quota, ThrottleLayer};

/// 2 pass, 3 rejections (the third earns the ban), then the ban answers.
async fn earns_a_ban(app: &Router, user: &str) {
    assert_eq!(send(app, user).await.0, 200);
    assert_eq!(send(app, user).await.0, 200);
    let (status, retry) = send(app, user).await;
    assert_eq!(status, 429);
    assert!(retry <= 30, "the quota's own retry time: {retry}");
    assert_eq!(send(app, user).await.0, 429);
    // The third rejection earns the ban: Retry-After is the ban.
    assert_eq!(send(app, user).await, (429, 600));
    let (status, retry) = send(app, user).await;
    assert_eq!(status, 429);
    assert!((599..=600).contains(&retry), "{retry}");
    // Other keys are untouched.
    assert_eq!(send(app, &format!("{user}-other")).await.0, 200);
}

#[tokio::test]
async fn in_memory_the_layer_keeps_the_penalty_box() {
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(ThrottleLayer::new(policy(Duration::from_secs(600))));
    earns_a_ban(&app, "mallory").await;
}

#[tokio::test]
async fn bans_end() {
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(ThrottleLayer::new(
            Policy::builder("short")
                .quota(Quota::per_second(1).with_max_burst(0))
                .key(Header::new("x-user"))
                .penalty(Penalty::new(1, Duration::from_secs(10), Duration::from_secs(5)).unwrap())
                .build()
                .unwrap(),
        ));
    assert_eq!(send(&app, "u").await.0, 200);
    assert_eq!(send(&app, "u").await, (429, 5));
    // Banned for 5 s. The layer's penalty box reads the real clock: the quota refills after 1 s,
    // and the ban lasts 3.9 s more, so that no stall of a loaded machine ends it before the check.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(
        send(&app, "u").await.0,
        429,
        "still banned, though the quota refilled"
    );
    tokio::time::sleep(Duration::from_millis(4000)).await;
    assert_eq!(send(&app, "u").await.0, 200);
}

#[test]
fn the_config_accepts_a_penalty_table() {
    let toml = r#"
        [[route]]
        name = "login"
        key = "header:x-user"
        count = 5
        period = "1m"
        penalty = { after = 3, within = "1m", ban = "10m" }
    "#;
    let layer = Config::from_toml(toml).unwrap().memory_layer().unwrap();
    let penalty = *layer.policies()[0].limit().penalty().unwrap();
    assert_eq!(
        penalty,
        Penalty::new(3, Duration::from_secs(60), Duration::from_secs(600)).unwrap()
    );
    let bad = toml.replace("after = 3", "after = 0");
    let err = Config::from_toml(&bad).unwrap().memory_layer().unwrap_err();
    assert!(err.to_string().contains("penalty"), "{err}");
}

#[tokio::test]
async fn in_memory_the_ban_shows_on_every_limit_of_a_stack() {
    let layer = ThrottleLayer::new(stacked());
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer);
    the_ban_shows_on_every_limit(&app).await;
}

/// A key with a quota override that earns a ban shows it when peeked, as without the override.
#[tokio::test]
async fn a_ban_shows_when_peeked_under_a_quota_override() {
    use tower_throttle::ops::Override;
    let layer = ThrottleLayer::new(policy(Duration::from_secs(600)));
    let handle = layer.handle();
    let two = Override::Quota(Quota::per_minute(2));
    handle.set_override("login", "mallory", two).await.unwrap();
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer);
    earns_a_ban(&app, "mallory").await;
    let state = handle.peek("login", "mallory").await.unwrap();
    assert_eq!(state.tiers[0].tier.as_deref(), Some("override"));
    assert!(state.summary().banned.is_some(), "{state:?}");
}
