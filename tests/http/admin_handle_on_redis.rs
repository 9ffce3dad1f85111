//! The tests of tests/middleware/admin_handle.rs that need a Redis server.
use crate::shared::admin_handle::{
    peek_and_reset_through_the_layer, reload_under_load, table, tiers_and_stacks,
};
use crate::support::redis as redis_support;

use std::time::Duration;

use tower_throttle::key::Header;
use tower_throttle::{
    redis::{RedisBackend, RedisMode},
    Algorithm, Policy, Quota, ThrottleLayer,
};

async fn redis(url: &str) -> RedisBackend {
    RedisBackend::builder()
        .url(url)
        .mode(RedisMode::Lua)
        .timeout(Duration::from_secs(2))
        .connect()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_reload_under_load_keeps_exact_counts() {
    let server = redis_support::RedisServer::start();
    reload_under_load(redis(&server.url()).await).await;
}

#[tokio::test]
async fn redis_peek_and_reset_through_the_layer() {
    let server = redis_support::RedisServer::start();
    peek_and_reset_through_the_layer(redis(&server.url()).await).await;
}

#[tokio::test]
async fn a_redis_backend_refuses_what_it_cannot_enforce_in_a_reload() {
    let server = redis_support::RedisServer::start();
    let layer = ThrottleLayer::builder()
        .backend(redis(&server.url()).await)
        .policies(table(1))
        .build()
        .unwrap();
    let handle = layer.handle();
    // A sliding window whose count × period is beyond what the Redis script computes exactly.
    let mut too_big = table(1);
    too_big.push(
        Policy::builder("huge")
            .route("/extra")
            .quota(Quota::per_day(1_000_000))
            .algorithm(Algorithm::SlidingWindow)
            .key(Header::new("x-user-id"))
            .build()
            .unwrap(),
    );
    let err = handle.reload(too_big).unwrap_err();
    assert!(err.to_string().contains("sliding window"), "{err}");
    assert_eq!(handle.policies().len(), 2);
}

#[tokio::test]
async fn redis_peek_and_reset_cover_every_tier_and_stacked_limit() {
    let server = redis_support::RedisServer::start();
    tiers_and_stacks(redis(&server.url()).await).await;
}
