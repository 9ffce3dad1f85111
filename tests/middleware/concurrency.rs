//! 1,000 concurrent requests against a limit of 16 admit exactly 16.

use axum::body::Body;
use axum::routing::get;
use axum::Router;
use http::{Request, StatusCode};
use tower::ServiceExt;
use tower_throttle::key::Header;
use tower_throttle::{Policy, Quota, ThrottleLayer};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_thousand_concurrent_requests_admit_exactly_the_limit() {
    let policy = Policy::builder("burst")
        // Limit 16, refilling one an hour: no refill during the test.
        .quota(Quota::per_hour(1).with_max_burst(15))
        .key(Header::new("x-user-id"))
        .build()
        .unwrap();
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(ThrottleLayer::new(policy));
    let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(1_000));
    let tasks: Vec<_> = (0..1_000)
        .map(|_| {
            let (app, barrier) = (app.clone(), barrier.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                let req = Request::get("/")
                    .header("x-user-id", "7")
                    .body(Body::empty())
                    .unwrap();
                app.oneshot(req).await.unwrap().status()
            })
        })
        .collect();
    let mut ok = 0;
    let mut limited = 0;
    for t in tasks {
        match t.await.unwrap() {
            StatusCode::OK => ok += 1,
            StatusCode::TOO_MANY_REQUESTS => limited += 1,
            other => panic!("unexpected {other}"),
        }
    }
    assert_eq!((ok, limited), (16, 984));
}
