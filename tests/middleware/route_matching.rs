//! A policy's route matches a request exactly when axum's router routes it there: a table of
//! patterns × paths checked against a real `axum::Router`, with the throttle layer both outside the
//! router (no `MatchedPath`: the policy matches the path itself) and inside it (`MatchedPath`).

use axum::body::Body;
use axum::routing::get;
use axum::Router;
use http::{Request, StatusCode};
use tower::{ServiceBuilder, ServiceExt};
use tower_throttle::key::Global;
use tower_throttle::{Policy, Quota, ThrottleLayer};

const PATTERNS: &[&str] = &[
    "/",
    "/users/{id}",
    "/users/{id}/posts",
    "/users/me",
    "/files/{*path}",
    "/{*rest}",
    "/v{version}/status",
    "/trailing/",
    "/a/{{b}}",
    "/caf%C3%A9",
];

const PATHS: &[&str] = &[
    "/",
    "/users",
    "/users/",
    "/users/7",
    "/users/me",
    "/users/7/",
    "/users//posts",
    "/users/7/posts",
    "/users/7/posts/",
    "/users/a%2Fb",
    "/files",
    "/files/",
    "/files/a",
    "/files/a/b/c",
    "/files//",
    "/v2/status",
    "/v/status",
    "/vv/status",
    "/trailing",
    "/trailing/",
    "/a/{b}",
    "/a/b",
    "/caf%C3%A9",
    "/caf%c3%a9",
    "//",
    "/x",
];

/// At most one request an hour: the second request a policy applies to is a 429.
fn policy(pattern: &str) -> Policy<Global> {
    Policy::builder("route")
        .quota(Quota::per_hour(1))
        .key(Global)
        .route(pattern)
        .build()
        .unwrap_or_else(|e| panic!("{pattern}: {e}"))
}

fn router(pattern: &str) -> Router {
    Router::new().route(pattern, get(|| async { "routed" }))
}

fn request(path: &str) -> Request<Body> {
    Request::get(path).body(Body::empty()).unwrap()
}

/// Whether axum's router routes `path` to `pattern`.
async fn axum_routes(pattern: &str, path: &str) -> bool {
    let status = router(pattern)
        .oneshot(request(path))
        .await
        .unwrap()
        .status();
    assert!(
        status == StatusCode::OK || status == StatusCode::NOT_FOUND,
        "{pattern} {path}: {status}"
    );
    status == StatusCode::OK
}

#[tokio::test]
async fn a_policy_applies_exactly_when_axum_routes() {
    let mut routed = 0;
    let mut mismatches = Vec::new();
    for pattern in PATTERNS {
        let policy = policy(pattern);
        for path in PATHS {
            let axum = axum_routes(pattern, path).await;
            routed += usize::from(axum);
            // No `MatchedPath` on a bare request: the policy matches the path with axum's matcher.
            let applies = policy.applies_to(&request(path));
            if applies != axum {
                mismatches.push(format!(
                    "{pattern:?} {path:?}: axum routes: {axum}, policy applies: {applies}"
                ));
            }
        }
    }
    assert!(mismatches.is_empty(), "{}", mismatches.join("\n"));
    // The table exercises both outcomes, many times over.
    assert!(
        routed > 20 && routed < PATTERNS.len() * PATHS.len() / 2,
        "{routed}"
    );
}

/// The same table through the middleware wrapped around the whole router, where no `MatchedPath`
/// exists yet: the second request is limited exactly when axum routes the path.
#[tokio::test]
async fn a_layer_around_the_router_limits_exactly_what_axum_routes() {
    for pattern in PATTERNS {
        for path in PATHS {
            let app = ServiceBuilder::new()
                .layer(ThrottleLayer::new(policy(pattern)))
                .service(router(pattern));
            let routed = axum_routes(pattern, path).await;
            let first = app.clone().oneshot(request(path)).await.unwrap().status();
            let second = app.oneshot(request(path)).await.unwrap().status();
            let expected = if routed {
                (StatusCode::OK, StatusCode::TOO_MANY_REQUESTS)
            } else {
                (StatusCode::NOT_FOUND, StatusCode::NOT_FOUND)
            };
            assert_eq!((first, second), expected, "{pattern:?} {path:?}");
        }
    }
}

/// Inside the router the policy compares `MatchedPath`, whatever the parameters are called.
#[tokio::test]
async fn matched_path_is_compared_up_to_parameter_names() {
    let layer = ThrottleLayer::new(policy("/users/{user_id}"));
    let app = Router::new()
        .route("/users/me", get(|| async { "me" }))
        .route("/users/{id}", get(|| async { "user" }))
        .layer(layer);
    let status = |path: &'static str| {
        let app = app.clone();
        async move { app.oneshot(request(path)).await.unwrap().status() }
    };
    assert_eq!(status("/users/7").await, StatusCode::OK);
    assert_eq!(status("/users/8").await, StatusCode::TOO_MANY_REQUESTS);
    // `/users/me` is its own route in the router, so the policy on `/users/{id}` does not apply.
    assert_eq!(status("/users/me").await, StatusCode::OK);
    assert_eq!(status("/users/me").await, StatusCode::OK);
}

#[test]
fn patterns_axum_refuses_are_errors() {
    for (pattern, why) in [
        ("/users/:id", "axum 0.8 writes a parameter as {id}"),
        ("/files/*path", "axum 0.8 writes a wildcard as {*path}"),
        ("/files/{*path}/x", "must be the end of the route"),
        ("users", "must start with '/'"),
    ] {
        let err = Policy::builder("route")
            .key(tower_throttle::key::PeerIp::new())
            .quota(Quota::per_hour(1))
            .route(pattern)
            .build()
            .unwrap_err()
            .to_string();
        assert!(err.contains(why), "{pattern}: {err}");
        let axum = std::panic::catch_unwind(|| router(pattern));
        assert!(axum.is_err(), "axum accepts {pattern}");
    }
}
