//! The tests of tests/middleware/penalty.rs that need a Redis server.
use crate::shared::penalty::{policy, send, stacked, the_ban_shows_on_every_limit};
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

async fn layer_on(
    url: &str,
    policy: tower_throttle::Policy<tower_throttle::key::Header>,
) -> Router {
    let backend = RedisBackend::builder().url(url).connect().await.unwrap();
    let layer = ThrottleLayer::builder()
        .backend(backend)
        .policy(policy)
        .build();
    Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer.unwrap())
}

/// Refusals a staged policy does not enforce (a key outside its share) strike nobody on Redis,
/// as in memory: once the policy is enforced, the key is refused for its quota, not banned.
#[tokio::test]
async fn on_redis_refusals_not_enforced_are_no_strikes() {
    use tower_throttle::{key::Header, policy::Penalty, Policy, Quota};
    let server = redis_support::RedisServer::start();
    let policy = |fraction: f64| {
        let penalty = Penalty::new(3, Duration::from_secs(60), Duration::from_secs(600));
        Policy::builder("login")
            .quota(Quota::per_minute(2))
            .key(Header::new("x-user"))
            .penalty(penalty.unwrap())
            .enforce_fraction(fraction)
            .build()
            .unwrap()
    };
    let staged = layer_on(&server.url(), policy(0.0)).await;
    for _ in 0..6 {
        assert_eq!(send(&staged, "mallory").await.0, 200);
    }
    let enforced = layer_on(&server.url(), policy(1.0)).await;
    let (status, retry) = send(&enforced, "mallory").await;
    assert_eq!(status, 429);
    assert!(
        retry <= 60,
        "banned for refusals that were not made: {retry} s"
    );
}

/// On Redis as in memory, a key's ban is its policy's: the key stays banned under another tier.
#[tokio::test]
async fn on_redis_a_ban_holds_under_every_tier_of_its_policy() {
    use tower_throttle::{key::Header, policy::Penalty, Policy, Quota};
    let server = redis_support::RedisServer::start();
    let penalty = Penalty::new(1, Duration::from_secs(60), Duration::from_secs(600)).unwrap();
    let policy = Policy::builder("login")
        .quota(Quota::per_minute(2))
        .tier("paid", [Quota::per_minute(100)])
        .tier_header("x-plan")
        .key(Header::new("x-user"))
        .penalty(penalty)
        .build()
        .unwrap();
    let app = layer_on(&server.url(), policy).await;
    assert_eq!(send(&app, "eve").await.0, 200);
    assert_eq!(send(&app, "eve").await.0, 200);
    assert_eq!(send(&app, "eve").await, (429, 600));
    let mut paid = crate::support::request("/");
    paid.headers_mut().insert("x-user", "eve".parse().unwrap());
    paid.headers_mut().insert("x-plan", "paid".parse().unwrap());
    let status = tower::ServiceExt::oneshot(app, paid)
        .await
        .unwrap()
        .status();
    assert_eq!(
        status, 429,
        "the ban is the policy's, not the default tier's"
    );
}

#[tokio::test]
async fn on_redis_the_ban_shows_on_every_limit_of_a_stack() {
    let server = redis_support::RedisServer::start();
    let app = layer_on(&server.url(), stacked()).await;
    the_ban_shows_on_every_limit(&app).await;
}
