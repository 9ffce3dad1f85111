//! An admission with nothing more to do than its fields ends at the judge's first step
//! (`Judge::admitted_plainly`, which `Throttle::call` asks directly); a layer that hands every
//! admitted request a `PolicyDecision` goes through the rest of the verdict. Both give the same
//! fields and statuses.

use axum::routing::get;
use axum::Router;
use http::StatusCode;
use tower_throttle::key::Header;
use tower_throttle::{Policy, Quota, ThrottleLayer};

use crate::support::{backend, seen};

/// A layer with every kind of field on, on a clock that stands still (the OpenAI fields count
/// milliseconds); `full`: it also exposes each decision (the full verdict's way).
fn app(full: bool) -> Router {
    let (backend, _clock) = backend();
    let policy = Policy::builder("api")
        .quota(Quota::per_minute(3))
        .key(Header::new("x-user-id"))
        .build()
        .unwrap();
    let layer = ThrottleLayer::builder()
        .backend(backend)
        .policy(policy)
        .legacy_headers(true)
        .openai_headers(true)
        .decision_extension(full)
        .build()
        .unwrap();
    Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer)
}

#[tokio::test]
async fn the_plain_admission_answers_as_the_full_verdict_does() {
    let plain = seen(&app(false), "7", 4).await;
    let full = seen(&app(true), "7", 4).await;
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
