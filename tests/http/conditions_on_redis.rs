//! The test of tests/middleware/conditions.rs on a Redis server: the same 1,000 mixed requests,
//! through the Lua script and through redis-cell's `CL.THROTTLE`.

use tower_throttle::redis::{RedisBackend, RedisMode};

use crate::shared::conditions::route_exactly;
use crate::support::redis as redis_support;

#[tokio::test]
async fn on_redis_conditions_route_a_thousand_mixed_requests_to_exactly_the_right_limits() {
    let server = redis_support::RedisServer::start_with_cell();
    for mode in [RedisMode::Lua, RedisMode::Cell] {
        let backend = RedisBackend::builder()
            .url(server.url())
            .mode(mode)
            .prefix(format!("conditions-{}", mode.as_str()))
            .connect()
            .await
            .unwrap();
        route_exactly(backend).await;
    }
}
