//! Overrides and timed bans on the memory backend (tests/shared/overrides.rs; the Redis fleet in
//! tests/http/overrides_on_redis.rs).

use tower_throttle::MemoryBackend;

use crate::shared::overrides::{
    an_overridden_concurrency_slot_is_given_back, overrides_and_bans_apply,
};

#[tokio::test]
async fn overrides_and_bans_apply_in_memory() {
    overrides_and_bans_apply(MemoryBackend::new()).await;
}

#[tokio::test]
async fn an_overridden_concurrency_slot_is_given_back_in_memory() {
    an_overridden_concurrency_slot_is_given_back(MemoryBackend::new()).await;
}

/// `[backend] state_file` keeps what a key's override quota counted: set again after a restart
/// (in memory, overrides live in the process), it finds the key's state where it was.
#[tokio::test]
async fn an_override_quota_s_state_is_kept_in_the_state_file() {
    use tower_throttle::config::Config;
    use tower_throttle::ops::Override;
    use tower_throttle::Quota;

    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("keys.state");
    let toml = format!(
        "[backend]\nkind = \"memory\"\nstate_file = {state:?}\n\n[[route]]\nname = \"api\"\n\
         key = \"header:x-user\"\ncount = 5\nperiod = \"1h\"\n"
    );
    let config = Config::from_toml(&toml).unwrap();
    let one = Override::Quota(Quota::per_hour(1));
    let app = |layer: tower_throttle::ThrottleLayer<_, MemoryBackend>| {
        axum::Router::new()
            .route("/", axum::routing::get(|| async { "ok" }))
            .layer(layer)
    };
    let before = config.memory_layer().unwrap();
    before
        .handle()
        .set_override("api", "eve", one)
        .await
        .unwrap();
    let (layer, served) = (before.clone(), app(before));
    assert_eq!(crate::shared::overrides::passed(&served, "eve", 2).await, 1);
    assert_eq!(config.save_state(&layer).unwrap(), Some(1));

    let after = config.memory_layer().unwrap();
    after
        .handle()
        .set_override("api", "eve", one)
        .await
        .unwrap();
    assert_eq!(
        crate::shared::overrides::passed(&app(after), "eve", 1).await,
        0
    );
}

/// A timed ban the policy does not enforce (a dry run) leaves the key the quota it has without
/// the ban: its customer quota, or its quota override (it was decided under the policy's own).
#[tokio::test]
async fn an_unenforced_ban_leaves_the_key_its_quota() {
    use http::request::Parts;
    use tower::ServiceExt;
    use tower_throttle::key::{Header, Key};
    use tower_throttle::ops::Override;
    use tower_throttle::{Policy, Quota, ThrottleLayer};
    let policy = Policy::builder("api")
        .quota(Quota::per_minute(10))
        .key(Header::new("x-user"))
        .dry_run(true)
        .quota_from(|_: &Parts, key: &Key| {
            (*key == Key::from("pro")).then(|| Quota::per_minute(6000))
        })
        .build()
        .unwrap();
    let layer = ThrottleLayer::new(policy);
    let handle = layer.handle();
    let hour = std::time::Duration::from_secs(3600);
    for user in ["pro", "vip"] {
        handle.ban("api", user, hour).await.unwrap();
    }
    let vip = Override::Quota(Quota::per_minute(500));
    handle.set_override("api", "vip", vip).await.unwrap();
    let app = axum::Router::new()
        .route("/", axum::routing::get(|| async { "ok" }))
        .layer(layer);
    for (user, policy) in [
        ("pro", r#""api";q=6000;w=60"#),
        ("vip", r#""api.override";q=500;w=60"#),
    ] {
        let request = http::Request::get("/")
            .header("x-user", user)
            .body(axum::body::Body::empty())
            .unwrap();
        let response = app.clone().oneshot(request).await.unwrap();
        assert_eq!(response.status(), http::StatusCode::OK, "{user}");
        assert_eq!(response.headers()["ratelimit-policy"], policy, "{user}");
    }
    // A stream's message too: checked and charged under the quota it has without the ban.
    handle.ban("api", "eve", hour).await.unwrap();
    for (user, limit, remaining) in [("vip", 500, 498), ("eve", 10, 9)] {
        let decision = handle.check("api", user, 1).await.unwrap();
        assert!(decision.allowed, "{user}");
        assert_eq!(
            (decision.limit, decision.remaining),
            (limit, remaining),
            "{user}"
        );
    }
}
