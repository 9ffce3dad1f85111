//! `ThrottleLayer::axum_body()`: the same answers as the layer, in axum's own body; a concurrency
//! slot is still held until the body ends.

use axum::body::Body;
use axum::routing::get;
use axum::Router;
use http::{Request, StatusCode};
use http_body_util::BodyExt;
use tower::ServiceExt;
use tower_throttle::key::{Global, Header};
use tower_throttle::{Algorithm, Policy, Quota, ThrottleLayer};

use crate::support::{backend, seen, Seen};

fn policy() -> Policy<Header> {
    Policy::builder("api")
        // Two at once, then one an hour.
        .quota(Quota::per_hour(1).with_max_burst(1))
        .key(Header::new("x-user-id"))
        .build()
        .unwrap()
}

#[tokio::test]
async fn answers_as_the_layer_does_in_axums_body() {
    let hello = || Router::new().route("/", get(|| async { "hello" }));
    // Each on a clock that stands still, so that both see the same instants.
    let layer = || {
        ThrottleLayer::builder()
            .backend(backend().0)
            .policy(policy())
            .build()
            .unwrap()
    };
    let plain = seen(&hello().layer(layer()), "7", 3).await;
    let axum = seen(&hello().layer(layer().axum_body()), "7", 3).await;
    assert_eq!(plain, axum);
    let statuses: Vec<_> = axum.iter().map(|a| a.0).collect();
    assert_eq!(
        statuses,
        [
            StatusCode::OK,
            StatusCode::OK,
            StatusCode::TOO_MANY_REQUESTS
        ]
    );
    assert_eq!(axum[0].2, "hello");
    let field = |a: &Seen, name: &str| a.1.iter().find(|(n, _)| n == name).map(|(_, v)| v.clone());
    assert_eq!(
        field(&axum[1], "ratelimit").as_deref(),
        Some("\"api\";r=0;t=7200")
    );
    assert_eq!(field(&axum[2], "retry-after").as_deref(), Some("3600"));
    assert!(axum[2].2.contains("api"), "the 429's body: {:?}", axum[2].2);
}

#[tokio::test]
async fn a_concurrency_slot_is_held_until_the_body_ends() {
    let policy = Policy::builder("one-at-a-time")
        .key(Global)
        .quota(Quota::per_second(1))
        .algorithm(Algorithm::Concurrency)
        .build()
        .unwrap();
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(ThrottleLayer::new(policy).axum_body());
    let get = || Request::get("/").body(Body::empty()).unwrap();
    let first = app.clone().oneshot(get()).await.unwrap();
    assert_eq!(first.status(), StatusCode::OK);
    // Its body not yet read: the slot is held.
    let second = app.clone().oneshot(get()).await.unwrap();
    assert_eq!(second.status(), StatusCode::TOO_MANY_REQUESTS);
    let body = first.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(&body[..], b"ok");
    let third = app.clone().oneshot(get()).await.unwrap();
    assert_eq!(third.status(), StatusCode::OK);
}
