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
