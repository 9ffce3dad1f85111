//! Conditions route requests to exactly the right limits: 1,000 requests of mixed headers, hosts
//! and query strings through four policies from TOML, each request decided by the first policy
//! whose conditions it meets (or none), each policy's quota exactly what its requests use.
//! Shared by `tests/middleware/conditions.rs` (memory) and `tests/http/conditions_on_redis.rs`.

use std::collections::BTreeMap;

use axum::body::Body;
use axum::routing::get;
use axum::{Extension, Router};
use http::{Request, StatusCode};
use http_body_util::BodyExt;
use tower::ServiceExt;
use tower_throttle::config::Config;
use tower_throttle::policy::PolicyDecision;
use tower_throttle::{Backend, ThrottleLayer};

/// One request's attributes.
#[derive(Clone, Copy, Debug)]
pub struct Shape {
    client: Option<&'static str>,
    plan: Option<&'static str>,
    host: &'static str,
    beta: bool,
}

const CLIENTS: [Option<&str>; 4] = [None, Some("mobile"), Some("tablet"), Some("web")];
/// `fr%65e` is `free`, percent-encoded; `Free` is not `free`.
const PLANS: [Option<&str>; 5] = [
    None,
    Some("free"),
    Some("paid"),
    Some("fr%65e"),
    Some("Free"),
];
const HOSTS: [&str; 4] = [
    "api.example.com",
    "WWW.Example.com:8080",
    "example.com",
    "other.org",
];

/// `n` requests of mixed shapes, the same every run.
pub fn shapes(n: usize) -> Vec<Shape> {
    let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = move |bound: usize| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state % bound as u64) as usize
    };
    (0..n)
        .map(|_| Shape {
            client: CLIENTS[next(CLIENTS.len())],
            plan: PLANS[next(PLANS.len())],
            host: HOSTS[next(HOSTS.len())],
            beta: next(2) == 1,
        })
        .collect()
}

/// The policy that should decide `shape`, written out apart from the crate's own matching.
pub fn expected(shape: &Shape) -> Option<&'static str> {
    let free = matches!(shape.plan, Some("free" | "fr%65e"));
    let host = shape.host.split(':').next().unwrap().to_ascii_lowercase();
    if shape.client == Some("mobile") && free {
        Some("free-mobile")
    } else if matches!(shape.client, Some("mobile" | "tablet")) {
        Some("devices")
    } else if host.ends_with(".example.com") && shape.beta {
        Some("beta-api")
    } else if free {
        Some("free")
    } else {
        None
    }
}

/// The four routes, each allowing `quota[name]` requests an hour, all on one global key.
fn config(quota: &BTreeMap<&str, usize>) -> Config {
    let route = |name: &str, when: &str| {
        let count = quota.get(name).copied().unwrap_or(1);
        format!(
            "[[route]]\nname = \"{name}\"\nkey = \"global\"\ncount = {count}\nperiod = \"1h\"\nwhen = {when}\n"
        )
    };
    let toml = [
        route(
            "free-mobile",
            r#"{ header = { "x-client" = "mobile" }, query = { plan = "free" } }"#,
        ),
        route(
            "devices",
            r#"{ header = { "x-client" = ["mobile", "tablet"] } }"#,
        ),
        route(
            "beta-api",
            r#"{ host = "*.example.com", header = { "x-beta" = "*" } }"#,
        ),
        route("free", r#"{ query = { plan = "free" } }"#),
    ]
    .concat();
    Config::from_toml(&toml).unwrap()
}

fn request(shape: &Shape) -> Request<Body> {
    let uri = match shape.plan {
        Some(plan) => format!("/items?page=2&plan={plan}"),
        None => "/items".to_owned(),
    };
    let mut request = Request::get(uri).header("host", shape.host);
    if let Some(client) = shape.client {
        request = request.header("x-client", client);
    }
    if shape.beta {
        request = request.header("x-beta", "1");
    }
    request.body(Body::empty()).unwrap()
}

/// Sends 1,000 mixed requests through the four policies on `backend`: each is decided by the
/// policy [`expected`] names (the handler reads its `PolicyDecision`) and passes; then each policy
/// is exactly spent (one more of its requests is refused) and a request no policy meets still
/// passes.
pub async fn route_exactly<B: Backend>(backend: B) {
    let shapes = shapes(1000);
    let mut quota: BTreeMap<&str, usize> = BTreeMap::new();
    for shape in &shapes {
        if let Some(name) = expected(shape) {
            *quota.entry(name).or_default() += 1;
        }
    }
    assert_eq!(quota.len(), 4, "every policy gets requests: {quota:?}");
    assert!(shapes.iter().any(|s| expected(s).is_none()));
    let layer = ThrottleLayer::builder()
        .backend(backend)
        .policies(config(&quota).policies().unwrap())
        .decision_extension(true)
        .build()
        .unwrap();
    let app = Router::new()
        .route(
            "/items",
            get(|decision: Option<Extension<PolicyDecision>>| async move {
                decision.map_or("none".to_owned(), |d| d.policy.to_string())
            }),
        )
        .layer(layer);
    for (i, shape) in shapes.iter().enumerate() {
        let response = app.clone().oneshot(request(shape)).await.unwrap();
        assert_eq!(response.status(), StatusCode::OK, "request {i}: {shape:?}");
        let body = response.into_body().collect().await.unwrap().to_bytes();
        let want = expected(shape).unwrap_or("none");
        assert_eq!(body, want, "request {i}: {shape:?}");
    }
    // Each policy counted exactly its own requests: its next one is refused.
    for shape in &shapes[..] {
        let Some(name) = expected(shape) else {
            continue;
        };
        if quota.remove(name).is_some() {
            let response = app.clone().oneshot(request(shape)).await.unwrap();
            assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS, "{name}");
        }
    }
    assert!(quota.is_empty(), "{quota:?}");
    let unmatched = shapes.iter().find(|s| expected(s).is_none()).unwrap();
    let response = app.clone().oneshot(request(unmatched)).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
}
