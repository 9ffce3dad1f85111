//! The tests of tests/middleware/guide_config.rs that need a Redis server.
use crate::shared::guide_config::toml_block;
use tower_throttle::config::Config;

use crate::support::redis as redis_support;

/// The guide's Redis `[backend]` table parses as written, and connects once its URL points at a
/// running server.
#[tokio::test]
async fn the_guide_redis_backend_table_is_valid() {
    use tower_throttle::config::BackendConfig;
    use tower_throttle::OnBackendError;

    let page = include_str!("../../src/guide/policies.md");
    let toml = toml_block(page, "For Redis, the `[backend]` table is:");
    let config = Config::from_toml(toml).unwrap();
    let BackendConfig::Redis(redis) = &config.backend else {
        panic!("not a redis backend: {:?}", config.backend)
    };
    assert_eq!(redis.url.as_deref(), Some("redis://127.0.0.1:6379/"));
    assert_eq!(redis.mode.as_deref(), Some("auto"));
    assert_eq!(redis.timeout_ms, Some(100));
    assert!(!redis.cluster);
    assert_eq!(config.on_error().unwrap(), OnBackendError::Allow);

    let server = redis_support::RedisServer::start();
    let with_route = format!(
        "{}\n[[route]]\nname = \"api\"\nkey = \"global\"\ncount = 2\nperiod = \"1m\"\n",
        toml.replace("redis://127.0.0.1:6379/", &server.url())
    );
    let layer = Config::from_toml(&with_route)
        .unwrap()
        .layer()
        .await
        .unwrap();
    assert_eq!(layer.policies().len(), 1);

    let bad = toml.replace("mode = \"auto\"", "mode = \"fast\"");
    let err = Config::from_toml(&bad).unwrap().layer().await.unwrap_err();
    assert!(
        err.to_string().contains("unknown Redis mode \"fast\""),
        "{err}"
    );
    let clash = format!("on_backend_error = \"deny\"\n{toml}");
    let err = Config::from_toml(&clash).unwrap().on_error().unwrap_err();
    assert!(err.to_string().contains("disagree"), "{err}");
}
