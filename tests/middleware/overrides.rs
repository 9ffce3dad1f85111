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

/// A `state_file` no file can be written at (a directory that does not exist, as in a container
/// without its volume) is a build error, not found at shutdown: every restart would start afresh.
#[test]
fn a_state_file_that_cannot_be_written_is_a_build_error() {
    let dir = tempfile::tempdir().unwrap();
    for state in [
        dir.path().join("missing/keys.state"),
        dir.path().to_path_buf(),
    ] {
        let toml = format!(
            "[backend]\nkind = \"memory\"\nstate_file = {state:?}\n\n[[route]]\nname = \"api\"\n\
             key = \"header:x-user\"\ncount = 5\nperiod = \"1h\"\n"
        );
        let config = tower_throttle::config::Config::from_toml(&toml).unwrap();
        let err = config.memory_layer().unwrap_err().to_string();
        assert!(
            err.contains("[backend] state_file") && err.contains("written"),
            "{err}"
        );
    }
    // Nothing is left behind by the check.
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
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

/// A reload that removes a policy (or renames it) leaves its overrides and bans out of force,
/// says so, and keeps them listed and removable under the old name; removed, they do not come
/// back with the name.
#[tokio::test]
async fn a_policy_removed_by_a_reload_keeps_its_overrides_listed_and_removable() {
    use tower_throttle::key::Header;
    use tower_throttle::ops::{HandleError, Override};
    use tower_throttle::{Policy, Quota, ThrottleLayer};
    let policy = |name: &str| {
        Policy::builder(name)
            .route(format!("/{name}"))
            .quota(Quota::per_minute(10))
            .key(Header::new("x-user"))
            .build()
            .unwrap()
    };
    let layer = ThrottleLayer::new(policy("api"));
    let handle = layer.handle();
    let hour = std::time::Duration::from_secs(3600);
    handle
        .set_override("api", "alice", Override::Blocked)
        .await
        .unwrap();
    handle.ban("api", "mallory", hour).await.unwrap();
    let (logs, _guard) = crate::support::failover::Logs::capture();
    handle.reload([policy("web")]).unwrap();
    let warning = "the reload removed a policy that has overrides or timed bans";
    assert_eq!(logs.count(warning), 1, "{:?}", logs.lines());
    assert!(
        logs.lines()[0].contains("policy=\"api\""),
        "{:?}",
        logs.lines()
    );
    // Listed under the old name, and not settable there.
    let overrides = handle.overrides("api").unwrap();
    assert_eq!(overrides, [("alice".to_owned(), Override::Blocked)]);
    assert_eq!(handle.bans("api").unwrap()[0].0, "mallory");
    let set = handle.set_override("api", "bob", Override::Unlimited).await;
    assert!(matches!(set, Err(HandleError::UnknownPolicy(_))), "{set:?}");
    // Removed with the keys as listed: the name is unknown once nothing is left.
    handle.remove_override("api", "alice").await.unwrap();
    handle.lift_ban("api", "mallory").await.unwrap();
    assert!(matches!(
        handle.overrides("api"),
        Err(HandleError::UnknownPolicy(_))
    ));
    assert!(matches!(
        handle.bans("api"),
        Err(HandleError::UnknownPolicy(_))
    ));
    // A reload without a removed policy that holds any says nothing; the name back, nothing
    // comes back with it.
    handle.reload([policy("web"), policy("api")]).unwrap();
    assert!(handle.overrides("api").unwrap().is_empty());
    assert!(handle.bans("api").unwrap().is_empty());
    handle.reload([policy("api")]).unwrap();
    assert_eq!(logs.count(warning), 1, "{:?}", logs.lines());
}

/// A reload that gives a policy another kind of key leaves its overrides and bans listed as they
/// were, and removable as listed (the new kind refused their keys: "not an IP address").
#[tokio::test]
async fn overrides_of_a_key_kind_a_reload_changed_are_removable_as_listed() {
    use tower_throttle::key::KeySpec;
    use tower_throttle::ops::Override;
    use tower_throttle::{Policy, Quota, ThrottleLayer};
    let policy = |key: KeySpec| {
        Policy::builder("api")
            .quota(Quota::per_minute(10))
            .key(key)
            .build()
            .unwrap()
    };
    let header: KeySpec = "header:x-user".parse().unwrap();
    let layer = ThrottleLayer::new(policy(header));
    let handle = layer.handle();
    handle
        .set_override("api", "alice", Override::Blocked)
        .await
        .unwrap();
    handle
        .set_override("api", "premium_*", Override::Unlimited)
        .await
        .unwrap();
    handle
        .ban("api", "mallory", std::time::Duration::from_secs(3600))
        .await
        .unwrap();
    handle.reload([policy("ip".parse().unwrap())]).unwrap();
    assert_eq!(handle.overrides("api").unwrap().len(), 2);
    handle.remove_override("api", "alice").await.unwrap();
    handle.remove_override("api", "premium_*").await.unwrap();
    handle.lift_ban("api", "mallory").await.unwrap();
    assert!(handle.overrides("api").unwrap().is_empty());
    assert!(handle.bans("api").unwrap().is_empty());
    // A key of the new kind is read as one.
    assert!(handle.remove_override("api", "bob").await.is_err());
}

/// A reset forgets what a key counted under an override's quota even once the override is gone:
/// set again, the override's quota starts full, as the reset promised.
#[tokio::test]
async fn a_reset_forgets_an_override_quotas_count_after_the_override_is_removed() {
    use tower_throttle::config::Config;
    use tower_throttle::ops::Override;
    use tower_throttle::Quota;

    let toml = "[[route]]\nname = \"api\"\nkey = \"header:x-user\"\ncount = 5\nperiod = \"1h\"\n";
    let layer = Config::from_toml(toml).unwrap().memory_layer().unwrap();
    let handle = layer.handle();
    let app = axum::Router::new()
        .route("/", axum::routing::get(|| async { "ok" }))
        .layer(layer);
    let two = Override::Quota(Quota::per_hour(2));
    handle.set_override("api", "acme", two).await.unwrap();
    assert_eq!(crate::shared::overrides::passed(&app, "acme", 3).await, 2);
    handle.remove_override("api", "acme").await.unwrap();
    handle.reset("api", "acme").await.unwrap();
    handle.set_override("api", "acme", two).await.unwrap();
    assert_eq!(crate::shared::overrides::passed(&app, "acme", 3).await, 2);
}

/// A timed ban's 429 shows the quota the key has under it: its override's, as the penalty box's
/// ban shows it (it showed the policy's own).
#[tokio::test]
async fn a_ban_shows_the_keys_override_quota() {
    use tower::ServiceExt;
    use tower_throttle::config::Config;
    use tower_throttle::ops::Override;
    use tower_throttle::Quota;

    let toml = "[[route]]\nname = \"api\"\nkey = \"header:x-user\"\ncount = 60\nperiod = \"1m\"\n";
    let layer = Config::from_toml(toml).unwrap().memory_layer().unwrap();
    let handle = layer.handle();
    let app = axum::Router::new()
        .route("/", axum::routing::get(|| async { "ok" }))
        .layer(layer);
    let big = Override::Quota(Quota::per_minute(6000));
    handle.set_override("api", "acme", big).await.unwrap();
    handle
        .ban("api", "acme", std::time::Duration::from_secs(3600))
        .await
        .unwrap();
    let request = http::Request::get("/").header("x-user", "acme");
    let response = app
        .oneshot(request.body(axum::body::Body::empty()).unwrap())
        .await
        .unwrap();
    assert_eq!(response.status(), http::StatusCode::TOO_MANY_REQUESTS);
    let policy = response.headers()["ratelimit-policy"].to_str().unwrap();
    assert!(policy.contains("q=6000"), "{policy}");
}
