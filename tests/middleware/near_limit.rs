//! Near the limit: an admitted request that leaves its limit used to the policy's ratio is counted,
//! shown to the hook (once a second), and named to the handler; a client cannot send the name.

use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::routing::get;
use axum::Router;
use http::{HeaderMap, Request, StatusCode};
use http_body_util::BodyExt;
use tower::ServiceExt;
use tower_throttle::key::Header;
use tower_throttle::ops::NearLimit;
use tower_throttle::{Policy, Quota, ThrottleLayer};

use crate::support::{sample_or_zero as sample, with_metrics};

/// The `x-ratelimit-near` header the handler saw ("-" without one) and the status, for `n`
/// requests of `user`, the first one sending its own `x-ratelimit-near`.
async fn run(app: &Router, user: &str, n: usize) -> Vec<(u16, String)> {
    let mut out = Vec::new();
    for i in 0..n {
        let mut request = Request::get("/").header("x-user", user);
        if i == 0 {
            request = request.header("x-ratelimit-near", "spoofed");
        }
        let response = app
            .clone()
            .oneshot(request.body(Body::empty()).unwrap())
            .await
            .unwrap();
        let status = response.status().as_u16();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        out.push((status, String::from_utf8(body.to_vec()).unwrap()));
    }
    out
}

/// What the hook was shown: the limit, the key, the remaining units, how many it held back.
type Shown = (String, String, u64, u64);

#[test]
fn near_the_limit_is_counted_shown_once_a_second_and_named_to_the_handler() {
    let seen: Arc<Mutex<Vec<Shown>>> = Arc::default();
    let hook_seen = seen.clone();
    let layer = ThrottleLayer::builder()
        .policy(
            Policy::builder("api")
                .quotas([Quota::per_hour(10), Quota::per_day(100)])
                .key(Header::new("x-user"))
                .near_limit(0.8)
                .near_limit_header(true)
                .build()
                .unwrap(),
        )
        .on_near_limit(move |near: &NearLimit<'_>| {
            hook_seen.lock().unwrap().push((
                near.limit.to_owned(),
                near.key.to_string(),
                near.decision.remaining,
                near.held_back,
            ));
        })
        .build()
        .unwrap();
    let app = Router::new()
        .route(
            "/",
            get(|headers: HeaderMap| async move {
                match headers.get("x-ratelimit-near") {
                    Some(v) => v.to_str().unwrap().to_owned(),
                    None => "-".to_owned(),
                }
            }),
        )
        .layer(layer);
    let (got, page) = with_metrics(run(&app, "ann", 11));
    let names: Vec<&str> = got.iter().map(|(_, n)| n.as_str()).collect();
    // 7 of 10 used: not near; 8, 9, 10: near the hourly 10 (the 100 is far); the 11th is refused.
    assert_eq!(
        names[..10],
        ["-", "-", "-", "-", "-", "-", "-", "api.1h", "api.1h", "api.1h"]
    );
    assert_eq!(got[10].0, StatusCode::TOO_MANY_REQUESTS.as_u16());
    assert!(got[..10].iter().all(|(s, _)| *s == 200));
    let near = r#"throttle_requests_near_limit_total{policy="api",limit="api.1h"}"#;
    assert_eq!(sample(&page, near), 3.0, "{page}");
    // Once a second per policy: the first near request is shown, the two right after it held
    // back (unless the machine stalled a whole second between them).
    let seen = seen.lock().unwrap();
    assert_eq!(seen[0], ("api.1h".to_owned(), "ann".to_owned(), 2, 0));
    let shown = seen.len() as u64 + seen.iter().map(|s| s.3).sum::<u64>();
    assert!(seen.len() == 1 || shown <= 3, "{seen:?}");
}

#[tokio::test]
async fn a_client_cannot_send_the_near_limit_header_past_a_policy_it_does_not_meet() {
    let policy = Policy::builder("mobile")
        .quota(Quota::per_hour(10))
        .key(Header::new("x-user"))
        .when(tower_throttle::policy::Condition::header(
            "x-client", "mobile",
        ))
        .near_limit(0.8)
        .near_limit_header(true)
        .build()
        .unwrap();
    let app = Router::new()
        .route(
            "/",
            get(|headers: HeaderMap| async move {
                headers.contains_key("x-ratelimit-near").to_string()
            }),
        )
        .layer(ThrottleLayer::new(policy));
    // No `x-client`: the policy does not apply, and the spoofed header is gone all the same.
    let request = Request::get("/")
        .header("x-user", "ann")
        .header("x-ratelimit-near", "mobile")
        .body(Body::empty())
        .unwrap();
    let response = app.oneshot(request).await.unwrap();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(body, "false");
}

/// Stacked layers (a global one outside, a route's inside) name their limits together to the
/// handler, the outer layer's first; a client's own name is still removed.
#[tokio::test]
async fn a_stacked_inner_layer_keeps_the_outer_layers_near_limit_names() {
    let policy = |name: &str, ratio| {
        Policy::builder(name)
            .quota(Quota::per_hour(10))
            .key(Header::new("x-user"))
            .near_limit(ratio)
            .near_limit_header(true)
            .build()
            .unwrap()
    };
    let handler = |headers: HeaderMap| async move {
        match headers.get("x-ratelimit-near") {
            Some(v) => v.to_str().unwrap().to_owned(),
            None => "-".to_owned(),
        }
    };
    let app = Router::new()
        .route(
            "/",
            get(handler).layer(ThrottleLayer::new(policy("route", 0.9))),
        )
        .layer(ThrottleLayer::new(policy("global", 0.8)));
    let got = run(&app, "ann", 10).await;
    let names: Vec<&str> = got.iter().map(|(_, n)| n.as_str()).collect();
    assert_eq!(
        names,
        [
            "-",
            "-",
            "-",
            "-",
            "-",
            "-",
            "-",
            "global",
            "global, route",
            "global, route"
        ]
    );
}

#[test]
fn bad_near_limit_settings_are_errors() {
    let policy = |ratio: Option<f64>, header: bool| {
        let mut b = Policy::builder("api")
            .quota(Quota::per_hour(10))
            .key(Header::new("x-user"))
            .near_limit_header(header);
        if let Some(r) = ratio {
            b = b.near_limit(r);
        }
        b.build().map(|_| ()).map_err(|e| e.to_string())
    };
    assert!(policy(Some(1.5), false)
        .unwrap_err()
        .contains("near_limit must be above 0"));
    assert!(policy(Some(0.0), false)
        .unwrap_err()
        .contains("near_limit must be above 0"));
    assert_eq!(
        policy(None, true).unwrap_err(),
        r#"policy "api": near_limit_header needs near_limit"#
    );
    policy(Some(1.0), true).unwrap();
    let toml = "[[route]]\nname = \"api\"\nkey = \"ip\"\ncount = 10\nperiod = \"1h\"\nnear_limit = 0.9\nnear_limit_header = true\n";
    tower_throttle::config::Config::from_toml(toml)
        .unwrap()
        .policies()
        .unwrap();
}
