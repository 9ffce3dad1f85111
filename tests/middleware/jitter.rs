//! `retry_after_jitter`: refused clients come back spread out, never earlier than the limit asks.

use std::collections::BTreeSet;
use std::time::Duration;

use axum::body::Body;
use axum::routing::get;
use axum::Router;
use http::Request;
use tower::ServiceExt;
use tower_throttle::key::Header;
use tower_throttle::{Policy, Quota, ThrottleLayer};

fn app(jitter: Option<Duration>, grpc: bool) -> Router {
    let mut policy = Policy::builder("api")
        .quota(Quota::per_hour(1))
        .key(Header::new("x-user"));
    if let Some(jitter) = jitter {
        policy = policy.retry_after_jitter(jitter);
    }
    let mut layer = ThrottleLayer::builder().policy(policy.build().unwrap());
    if grpc {
        layer = layer.grpc();
    }
    Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer.build().unwrap())
}

/// The `Retry-After` (seconds) and `grpc-retry-pushback-ms` of a refusal for each of `users`, each
/// refused on its second request.
async fn waits(app: &Router, users: usize) -> Vec<(u64, Option<u64>)> {
    let mut out = Vec::new();
    for user in 0..users {
        let send = || {
            let request = Request::get("/")
                .header("x-user", user.to_string())
                .body(Body::empty())
                .unwrap();
            app.clone().oneshot(request)
        };
        assert_eq!(send().await.unwrap().status(), 200);
        let refused = send().await.unwrap();
        let header = |name: &str| -> Option<u64> {
            Some(refused.headers().get(name)?.to_str().ok()?.parse().unwrap())
        };
        out.push((
            header("retry-after").unwrap(),
            header("grpc-retry-pushback-ms"),
        ));
    }
    out
}

#[tokio::test]
async fn jitter_only_ever_adds_to_retry_after_and_spreads_it() {
    // One an hour: the exact wait is 3600 s (rounded up: 3600 or, a few ms in, still 3600).
    let exact = waits(&app(None, false), 50).await;
    assert!(exact.iter().all(|(s, _)| *s == 3600), "{exact:?}");
    let jittered = waits(&app(Some(Duration::from_secs(60)), false), 200).await;
    let seconds: BTreeSet<u64> = jittered.iter().map(|(s, _)| *s).collect();
    assert!(
        seconds.iter().all(|s| (3600..=3660).contains(s)),
        "{seconds:?}"
    );
    // Spread over the minute: 200 draws land on many different seconds.
    assert!(seconds.len() > 30, "{seconds:?}");
    // gRPC: the pushback carries the same jittered wait, never under the exact one.
    let grpc = waits(&app(Some(Duration::from_secs(60)), true), 100).await;
    for (retry_after, pushback) in &grpc {
        let pushback = pushback.expect("grpc-retry-pushback-ms");
        assert!((3_599_000..=3_660_000).contains(&pushback), "{pushback}");
        assert_eq!(
            *retry_after,
            pushback.div_ceil(1000),
            "{retry_after} {pushback}"
        );
    }
}

#[test]
fn a_jitter_of_zero_or_over_an_hour_is_an_error() {
    for bad in [Duration::ZERO, Duration::from_secs(3601)] {
        let error = Policy::builder("api")
            .quota(Quota::per_hour(1))
            .key(Header::new("x-user"))
            .retry_after_jitter(bad)
            .build()
            .unwrap_err();
        assert!(
            error
                .to_string()
                .contains("retry_after_jitter must be above 0"),
            "{error}"
        );
    }
}
