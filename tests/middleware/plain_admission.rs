//! An admission with nothing more to do than its fields takes a shorter way through the layer
//! (`Judge::admitted_plainly`); a layer that hands every admitted request a `PolicyDecision` takes
//! the full verdict. Both must give the same answers, fields for fields.

use axum::body::Body;
use axum::routing::get;
use axum::Router;
use http::{Request, StatusCode};
use tower::ServiceExt;
use tower_throttle::key::Header;
use tower_throttle::{Policy, Quota, ThrottleLayer};

/// Status and headers (without the date) of `n` requests for one user, through a layer with every
/// kind of field on; `full`: the layer also exposes each decision (the full verdict's way).
async fn answers(full: bool, n: usize) -> Vec<(StatusCode, Vec<(String, String)>)> {
    let policy = Policy::builder("api")
        .quota(Quota::per_minute(3))
        .key(Header::new("x-user-id"))
        .build()
        .unwrap();
    let layer = ThrottleLayer::builder()
        .policy(policy)
        .legacy_headers(true)
        .openai_headers(true)
        .decision_extension(full)
        .build()
        .unwrap();
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer);
    let mut out = Vec::new();
    for _ in 0..n {
        let request = Request::get("/")
            .header("x-user-id", "7")
            .body(Body::empty())
            .unwrap();
        let response = app.clone().oneshot(request).await.unwrap();
        let mut headers: Vec<_> = response
            .headers()
            .iter()
            .filter(|(name, _)| *name != "date")
            .map(|(n, v)| (n.to_string(), v.to_str().unwrap().to_owned()))
            .collect();
        headers.sort();
        out.push((response.status(), headers));
    }
    out
}

#[tokio::test]
async fn the_plain_admission_answers_as_the_full_verdict_does() {
    let plain = answers(false, 4).await;
    let full = answers(true, 4).await;
    assert_eq!(plain, full);
    let statuses: Vec<_> = plain.iter().map(|a| a.0).collect();
    assert_eq!(statuses[..3], [StatusCode::OK; 3]);
    assert_eq!(statuses[3], StatusCode::TOO_MANY_REQUESTS);
    // Every kind of field was there to compare.
    let names: Vec<&str> = plain[0].1.iter().map(|(n, _)| n.as_str()).collect();
    for field in [
        "ratelimit",
        "ratelimit-policy",
        "x-ratelimit-remaining",
        "x-ratelimit-remaining-requests",
    ] {
        assert!(names.contains(&field), "{field} missing from {names:?}");
    }
}
