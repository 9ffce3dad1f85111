//! The tests of tests/middleware/penalty.rs that need a Redis server.
use crate::shared::penalty::{policy, send};
use crate::support::redis as redis_support;

use std::time::Duration;

use axum::{routing::get, Router};
use tower_throttle::{
    redis::{RedisBackend, RedisMode},
    ThrottleLayer,
};

#[tokio::test]
async fn on_redis_every_process_shares_strikes_and_bans() {
    let server = redis_support::RedisServer::start_with_cell();
    for mode in [RedisMode::Lua, RedisMode::Cell, RedisMode::Auto] {
        let process = |_: usize| async {
            let backend = RedisBackend::builder()
                .url(server.url())
                .mode(mode)
                .connect()
                .await
                .unwrap();
            Router::new().route("/", get(|| async { "ok" })).layer(
                ThrottleLayer::builder()
                    .backend(backend)
                    .policy(policy(Duration::from_secs(600)))
                    .build()
                    .unwrap(),
            )
        };
        let (a, b) = (process(0).await, process(1).await);
        let user = format!("mallory-{mode}");
        assert_eq!(send(&a, &user).await.0, 200);
        assert_eq!(send(&b, &user).await.0, 200);
        assert_eq!(send(&a, &user).await.0, 429);
        assert_eq!(send(&b, &user).await.0, 429);
        assert_eq!(send(&a, &user).await, (429, 600));
        // The other process sees the ban.
        let (status, retry) = send(&b, &user).await;
        assert_eq!(status, 429);
        assert!((599..=600).contains(&retry), "{retry}");
        let ttl: i64 = server
            .cli(&["PTTL", &format!("throttle:login:{{{user}}}:ban")])
            .parse()
            .unwrap();
        assert!(ttl > 590_000, "{ttl}");
    }
}
