//! The test of tests/middleware/body_keys.rs on a Redis server: keys and a metered estimate from
//! the request body, through the Lua script, alone and with coalesced batches.

use tower_throttle::redis::{RedisBackend, RedisMode};

use crate::shared::body_keys::body_keys_count_exactly;
use crate::support::redis as redis_support;

#[tokio::test]
async fn on_redis_body_keys_count_exactly() {
    let server = redis_support::RedisServer::start();
    for coalesce in [false, true] {
        let backend = RedisBackend::builder()
            .url(server.url())
            .mode(RedisMode::Lua)
            .coalesce(coalesce)
            .prefix(format!("body-keys-{coalesce}"))
            .connect()
            .await
            .unwrap();
        body_keys_count_exactly(backend).await;
    }
}
