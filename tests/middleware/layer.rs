//! The middleware in axum apps: statuses, headers, keys, per-route policies, failure handling.

use std::net::SocketAddr;
use std::time::Duration;

use crate::support::*;
use axum::body::Body;
use axum::extract::connect_info::MockConnectInfo;
use axum::routing::{get, post};
use axum::Router;
use http::{Method, Request, StatusCode};
use tower::ServiceExt;
use tower_throttle::key::{Extension, Global, Header, KeySpec, PeerIp};
use tower_throttle::{policy::MissingKey, OnBackendError, Policy, Quota, ThrottleLayer};

/// A policy with one key for every request.
fn global_policy(name: &str, quota: Quota) -> Policy<Global> {
    Policy::builder(name)
        .quota(quota)
        .key(Global)
        .build()
        .unwrap()
}

fn reply_policy() -> Policy<Header> {
    Policy::builder("reply")
        .quota(Quota::per_minute(30).with_max_burst(15))
        .key(Header::new("x-user-id"))
        .build()
        .unwrap()
}

fn reply_request(user: &str) -> Request<Body> {
    Request::post("/reply")
        .header("x-user-id", user)
        .body(Body::empty())
        .unwrap()
}

#[tokio::test]
async fn route_layer_admits_the_burst_then_429_with_headers() {
    let (backend, clock) = backend();
    let layer = ThrottleLayer::builder()
        .backend(backend)
        .policy(reply_policy())
        .legacy_headers(true)
        .build()
        .unwrap();
    let app = Router::new()
        .route("/reply", post(|| async { "replied" }))
        .route_layer(layer)
        // Added after route_layer: not limited.
        .route("/free", get(|| async { "free" }));

    for i in 0..16u64 {
        let res = app.clone().oneshot(reply_request("u1")).await.unwrap();
        assert_eq!(res.status(), StatusCode::OK, "request {i}");
        assert_eq!(
            header(&res, "ratelimit-policy"),
            Some(r#""reply";q=16;w=32"#)
        );
        let expected = format!(r#""reply";r={};t={}"#, 15 - i, 2 * (i + 1));
        assert_eq!(header(&res, "ratelimit"), Some(expected.as_str()));
        assert_eq!(
            header(&res, "x-ratelimit-remaining"),
            Some((15 - i).to_string().as_str())
        );
        assert_eq!(body_string(res).await, "replied");
    }
    let res = app.clone().oneshot(reply_request("u1")).await.unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&res, "retry-after"), Some("2"));
    assert_eq!(header(&res, "ratelimit"), Some(r#""reply";r=0;t=32"#));
    assert_eq!(header(&res, "x-ratelimit-limit"), Some("16"));
    assert_eq!(header(&res, "x-ratelimit-reset"), Some("32"));
    assert_eq!(
        header(&res, "content-type"),
        Some("application/problem+json")
    );
    let problem: serde_json::Value = serde_json::from_str(&body_string(res).await).unwrap();
    assert_eq!(problem["status"], 429);

    // Another user has their own bucket; an unlimited route has no headers.
    let res = app.clone().oneshot(reply_request("u2")).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let res = app.clone().oneshot(request("/free")).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(header(&res, "ratelimit"), None);

    // Retry-After is rounded up: 1.5 s later, 0.5 s remain → 1.
    clock.advance(Duration::from_millis(1500));
    let res = app.clone().oneshot(reply_request("u1")).await.unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&res, "retry-after"), Some("1"));
    clock.advance(Duration::from_millis(500));
    let res = app.clone().oneshot(reply_request("u1")).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let res = app.clone().oneshot(reply_request("u1")).await.unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
}

#[tokio::test]
async fn retry_after_is_at_least_one_second_at_high_rates() {
    let (backend, _clock) = backend();
    let policy = global_policy("fast", Quota::per_second(100_000).with_max_burst(0));
    let layer = ThrottleLayer::builder()
        .backend(backend)
        .policy(policy)
        .build()
        .unwrap();
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer);
    assert_eq!(status_of(&app, request("/")).await, StatusCode::OK);
    let res = app.clone().oneshot(request("/")).await.unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    // 10 µs to wait, but a client told 0 would hammer: 1.
    assert_eq!(header(&res, "retry-after"), Some("1"));
}

#[tokio::test]
async fn headers_can_be_switched_off() {
    let layer = ThrottleLayer::builder()
        .policy(global_policy("p", Quota::per_second(1)))
        .ratelimit_headers(false)
        .build()
        .unwrap();
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer);
    let res = app.clone().oneshot(request("/")).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert!(res.headers().get("ratelimit").is_none());
    assert!(res.headers().get("x-ratelimit-limit").is_none());
    let res = app.clone().oneshot(request("/")).await.unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&res, "retry-after"), Some("1"));
    assert!(res.headers().get("ratelimit-policy").is_none());
}

/// With the RateLimit fields off, a layer that sends only the legacy fields, or only the OpenAI
/// ones, still sends them on an admitted request (and on a refusal).
#[tokio::test]
async fn either_other_kind_of_field_is_sent_without_the_ratelimit_fields() {
    for (legacy, openai, field) in [
        (true, false, "x-ratelimit-remaining"),
        (false, true, "x-ratelimit-remaining-requests"),
    ] {
        let layer = ThrottleLayer::builder()
            .policy(global_policy("p", Quota::per_second(2)))
            .ratelimit_headers(false)
            .legacy_headers(legacy)
            .openai_headers(openai)
            .build()
            .unwrap();
        let app = Router::new()
            .route("/", get(|| async { "ok" }))
            .layer(layer);
        for (n, status) in [
            StatusCode::OK,
            StatusCode::OK,
            StatusCode::TOO_MANY_REQUESTS,
        ]
        .into_iter()
        .enumerate()
        {
            let res = app.clone().oneshot(request("/")).await.unwrap();
            assert_eq!(res.status(), status, "{field}: request {n}");
            let remaining = if n == 0 { "1" } else { "0" };
            assert_eq!(header(&res, field), Some(remaining), "{field}: request {n}");
            assert!(res.headers().get("ratelimit").is_none(), "{field}");
        }
    }
}

#[tokio::test]
async fn peer_ip_from_connect_info_groups_ipv6_by_64() {
    let policy = Policy::builder("ip")
        .quota(Quota::per_minute(1))
        .key(PeerIp::new())
        .build()
        .unwrap();
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(ThrottleLayer::new(policy));
    let status = |peer: &'static str| {
        let app = app.clone();
        async move {
            app.oneshot(from_peer(request("/"), peer))
                .await
                .unwrap()
                .status()
        }
    };
    assert_eq!(status("192.0.2.1:1000").await, StatusCode::OK);
    assert_eq!(
        status("192.0.2.1:2000").await,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(
        status("[::ffff:192.0.2.1]:3000").await,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(status("192.0.2.2:1000").await, StatusCode::OK);
    assert_eq!(status("[2001:db8:1:1::1]:1").await, StatusCode::OK);
    assert_eq!(
        status("[2001:db8:1:1:dead:beef:0:1]:1").await,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(status("[2001:db8:1:2::1]:1").await, StatusCode::OK);
}

#[tokio::test]
async fn mock_connect_info_and_spoofed_forwarded_headers() {
    let policy = Policy::builder("ip")
        .key(tower_throttle::key::PeerIp::new())
        .quota(Quota::per_minute(1))
        .build()
        .unwrap();
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(ThrottleLayer::new(policy))
        .layer(MockConnectInfo(SocketAddr::from(([198, 51, 100, 7], 4000))));
    assert_eq!(status_of(&app, request("/")).await, StatusCode::OK);
    for forged in ["203.0.113.1", "203.0.113.2"] {
        let req = Request::get("/")
            .header("x-forwarded-for", forged)
            .header("x-real-ip", forged)
            .body(Body::empty())
            .unwrap();
        let res = app.clone().oneshot(req).await.unwrap();
        assert_eq!(
            res.status(),
            StatusCode::TOO_MANY_REQUESTS,
            "forged {forged}"
        );
    }
}

#[tokio::test]
async fn missing_keys_are_a_clear_4xx_or_pass_never_500() {
    // No ConnectInfo at all: a clear 400 naming what is missing.
    let policy = Policy::builder("ip")
        .key(tower_throttle::key::PeerIp::new())
        .quota(Quota::per_minute(1))
        .build()
        .unwrap();
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(ThrottleLayer::new(policy));
    let res = app.clone().oneshot(request("/")).await.unwrap();
    assert_eq!(res.status(), StatusCode::BAD_REQUEST);
    assert!(body_string(res).await.contains("peer IP"));

    let header_policy = |missing| {
        Policy::builder("user")
            .quota(Quota::per_minute(1))
            .key(Header::new("x-user-id"))
            .on_missing_key(missing)
            .build()
            .unwrap()
    };
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(ThrottleLayer::new(header_policy(MissingKey::Reject(
            StatusCode::UNAUTHORIZED,
        ))));
    let res = app.clone().oneshot(request("/")).await.unwrap();
    assert_eq!(res.status(), StatusCode::UNAUTHORIZED);
    assert!(body_string(res).await.contains("header x-user-id"));

    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(ThrottleLayer::new(header_policy(MissingKey::Allow)));
    for _ in 0..3 {
        assert_eq!(status_of(&app, request("/")).await, StatusCode::OK);
    }
}

#[tokio::test]
async fn extension_and_closure_keys() {
    #[derive(Clone)]
    struct UserId(u64);
    impl From<UserId> for tower_throttle::Key {
        fn from(u: UserId) -> Self {
            u.0.into()
        }
    }
    let by_user = Policy::builder("by-user")
        .quota(Quota::per_minute(1))
        .key(Extension::<UserId>::new())
        .build()
        .unwrap();
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(ThrottleLayer::new(by_user))
        // Runs first: an "authentication" layer that sets the user id.
        .layer(axum::middleware::from_fn(
            |mut req: Request<Body>, next: axum::middleware::Next| async move {
                let id = req
                    .headers()
                    .get("x-user")
                    .and_then(|v| v.to_str().ok()?.parse().ok());
                if let Some(id) = id {
                    req.extensions_mut().insert(UserId(id));
                }
                next.run(req).await
            },
        ));
    let as_user = |id: &str| {
        Request::get("/")
            .header("x-user", id)
            .body(Body::empty())
            .unwrap()
    };
    assert_eq!(status_of(&app, as_user("1")).await, StatusCode::OK);
    assert_eq!(
        status_of(&app, as_user("1")).await,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(status_of(&app, as_user("2")).await, StatusCode::OK);

    // A closure: key by the first path segment, ignoring the query string.
    let by_tenant = Policy::builder("tenant")
        .quota(Quota::per_minute(1))
        .key(|req: &Request<Body>| req.uri().path().split('/').nth(1).map(str::to_owned))
        .build()
        .unwrap();
    let app = Router::new()
        .route("/{tenant}", get(|| async { "ok" }))
        .layer(ThrottleLayer::new(by_tenant));
    assert_eq!(status_of(&app, request("/acme?x=1")).await, StatusCode::OK);
    assert_eq!(
        status_of(&app, request("/acme?x=2")).await,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(status_of(&app, request("/other")).await, StatusCode::OK);
}

#[tokio::test]
async fn a_table_of_policies_matched_by_route_and_method() {
    let (backend, _clock) = backend();
    let login = Policy::builder("login")
        .quota(Quota::per_minute(2))
        .key(KeySpec::Global)
        .route("/login")
        .methods([Method::POST])
        .build()
        .unwrap();
    let items = Policy::builder("items")
        .quota(Quota::per_minute(1))
        .key(KeySpec::Global)
        .route("/items/{id}")
        .build()
        .unwrap();
    let costly = Policy::builder("export")
        .quota(Quota::per_minute(10))
        .key(KeySpec::Global)
        .route("/export")
        .cost(5)
        .build()
        .unwrap();
    let layer = ThrottleLayer::builder()
        .backend(backend)
        .policies([login, items, costly])
        .build()
        .unwrap();
    let app = Router::new()
        .route("/login", get(|| async { "form" }).post(|| async { "in" }))
        .route("/items/{id}", get(|| async { "item" }))
        .route("/export", get(|| async { "csv" }))
        .layer(layer);
    let status = |method: Method, uri: &'static str| {
        let app = app.clone();
        async move {
            let req = Request::builder()
                .method(method)
                .uri(uri)
                .body(Body::empty())
                .unwrap();
            app.oneshot(req).await.unwrap().status()
        }
    };
    // Only POST /login is limited.
    for _ in 0..5 {
        assert_eq!(status(Method::GET, "/login").await, StatusCode::OK);
    }
    assert_eq!(status(Method::POST, "/login").await, StatusCode::OK);
    assert_eq!(status(Method::POST, "/login").await, StatusCode::OK);
    assert_eq!(
        status(Method::POST, "/login").await,
        StatusCode::TOO_MANY_REQUESTS
    );
    // Every /items/{id} shares the route's policy (matched by MatchedPath).
    assert_eq!(status(Method::GET, "/items/1").await, StatusCode::OK);
    assert_eq!(
        status(Method::GET, "/items/2").await,
        StatusCode::TOO_MANY_REQUESTS
    );
    // A cost of 5 out of 10: two exports, then limited.
    assert_eq!(status(Method::GET, "/export").await, StatusCode::OK);
    assert_eq!(status(Method::GET, "/export").await, StatusCode::OK);
    assert_eq!(
        status(Method::GET, "/export").await,
        StatusCode::TOO_MANY_REQUESTS
    );
    // Unknown paths are not throttled (and 404 as usual).
    assert_eq!(status(Method::GET, "/nope").await, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn method_router_layer_and_shared_backend() {
    let (backend, _clock) = backend();
    let policy = |name: &str| {
        Policy::builder(name)
            .quota(Quota::per_minute(1))
            .key(Global)
            .build()
            .unwrap()
    };
    let layer_a = ThrottleLayer::builder()
        .backend(backend.clone())
        .policy(policy("a"))
        .build()
        .unwrap();
    let layer_b = ThrottleLayer::builder()
        .backend(backend.clone())
        .policy(policy("b"))
        .build()
        .unwrap();
    let app = Router::new()
        .route("/a", get(|| async { "a" }).layer(layer_a))
        .route("/b", get(|| async { "b" }).layer(layer_b));
    // Different names never collide, even in one backend.
    assert_eq!(status_of(&app, request("/a")).await, StatusCode::OK);
    assert_eq!(status_of(&app, request("/b")).await, StatusCode::OK);
    assert_eq!(
        status_of(&app, request("/a")).await,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(
        status_of(&app, request("/b")).await,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(backend.len(), 2);
}

#[tokio::test]
async fn custom_rejection_gets_retry_after_and_fields() {
    let layer = ThrottleLayer::builder()
        .policy(global_policy("p", Quota::per_minute(1)))
        .refusal_response(|r| {
            let policy = r.policy().unwrap_or_default();
            let mut res = http::Response::new(bytes::Bytes::from(format!("{policy} says no")));
            *res.status_mut() = StatusCode::TOO_MANY_REQUESTS;
            res
        })
        .build()
        .unwrap();
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer);
    app.clone().oneshot(request("/")).await.unwrap();
    let res = app.clone().oneshot(request("/")).await.unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&res, "retry-after"), Some("60"));
    assert_eq!(header(&res, "ratelimit"), Some(r#""p";r=0;t=60"#));
    assert_eq!(body_string(res).await, "p says no");
}

#[tokio::test]
async fn stacked_layers_append_their_fields() {
    let global = global_policy("global", Quota::per_second(100));
    let route = global_policy("route", Quota::per_second(10));
    let app = Router::new()
        .route("/", get(|| async { "ok" }).layer(ThrottleLayer::new(route)))
        .layer(ThrottleLayer::new(global));
    let res = app.oneshot(request("/")).await.unwrap();
    let fields: Vec<&str> = res
        .headers()
        .get_all("ratelimit")
        .iter()
        .map(|v| v.to_str().unwrap())
        .collect();
    assert_eq!(fields, [r#""route";r=9;t=1"#, r#""global";r=99;t=1"#]);
}

#[tokio::test]
async fn on_backend_error_allow_or_deny() {
    use std::future::{ready, Ready};
    use tower_throttle::backend::{BackendError, Charges, Decisions};
    use tower_throttle::Backend;

    #[derive(Clone)]
    struct Broken;
    impl Backend for Broken {
        type Future = Ready<Result<Decisions, BackendError>>;
        fn check(&self, _: Charges<'_>) -> Self::Future {
            ready(Err(BackendError::new("connection refused")))
        }
    }
    let policy = || global_policy("p", Quota::per_second(1));
    for (mode, expected) in [
        (OnBackendError::Allow, StatusCode::OK),
        (OnBackendError::Deny, StatusCode::SERVICE_UNAVAILABLE),
    ] {
        let layer = tower_throttle::ThrottleLayerBuilder::with_backend(Broken)
            .policy(policy())
            .on_backend_error(mode)
            .build()
            .unwrap();
        let app = Router::new()
            .route("/", get(|| async { "ok" }))
            .layer(layer);
        for _ in 0..3 {
            let res = app.clone().oneshot(request("/")).await.unwrap();
            assert_eq!(res.status(), expected, "{mode:?}");
            if expected == StatusCode::SERVICE_UNAVAILABLE {
                assert_eq!(header(&res, "retry-after"), Some("1"));
            }
        }
    }
}

#[tokio::test]
async fn head_counts_as_get() {
    let policy = Policy::builder("get-only")
        .quota(Quota::per_minute(1))
        .key(Global)
        .methods([Method::GET])
        .build()
        .unwrap();
    let app = Router::new()
        .route("/", get(|| async { "ok" }).post(|| async { "posted" }))
        .layer(ThrottleLayer::new(policy));
    let status = |method: Method| {
        let app = app.clone();
        async move {
            let req = Request::builder()
                .method(method)
                .uri("/")
                .body(Body::empty())
                .unwrap();
            app.oneshot(req).await.unwrap().status()
        }
    };
    assert_eq!(status(Method::GET).await, StatusCode::OK);
    // axum runs the GET handler for HEAD: it must not be a way around the limit.
    assert_eq!(status(Method::HEAD).await, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(status(Method::GET).await, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(status(Method::POST).await, StatusCode::OK);
}

#[tokio::test]
async fn routes_in_nested_routers_match_by_full_or_nested_path() {
    let policy = |name: &str, route: &str| {
        Policy::builder(name)
            .quota(Quota::per_minute(1))
            .key(Global)
            .route(route)
            .build()
            .unwrap()
    };
    // Nested at "/api" or "/api/" (axum's NestedPath keeps the slash), or two levels deep.
    for (outer, inner) in [("/api", None), ("/api/", None), ("/api", Some("/v2/"))] {
        let layer = ThrottleLayer::builder()
            .policy(policy("users", "/users/{id}"))
            .policy(policy("orders", "/api/orders/{id}"))
            .build()
            .unwrap();
        let api = Router::new()
            .route("/users/{id}", get(|| async { "user" }))
            .route("/orders/{id}", get(|| async { "order" }))
            .layer(layer);
        let (app, paths) = match inner {
            None => (
                Router::new().nest(outer, api),
                ["/api/users/1", "/api/orders/1"],
            ),
            Some(inner) => (
                Router::new().nest(outer, Router::new().nest(inner, api)),
                ["/api/v2/users/1", "/api/v2/orders/1"],
            ),
        };
        // The orders policy names the route as seen from `/api`: not two levels deep.
        let orders = if inner.is_some() {
            StatusCode::OK
        } else {
            StatusCode::TOO_MANY_REQUESTS
        };
        for (path, second) in paths
            .into_iter()
            .zip([StatusCode::TOO_MANY_REQUESTS, orders])
        {
            let first = status_of(&app, request(path)).await;
            let then = status_of(&app, request(path)).await;
            assert_eq!(
                (first, then),
                (StatusCode::OK, second),
                "{outer} {inner:?} {path}"
            );
        }
    }
}

#[tokio::test]
async fn a_path_key_of_a_route_written_whole_is_read_inside_a_nested_router() {
    use tower_throttle::key::PathParam;
    // The layer on the router nested at "/api", its route written as the app's whole path.
    // `/apikeys` starts with the text `/api`, not with its segment.
    for (route, inner, path) in [
        ("/api/orders/{id}", "/orders/{id}", "/api/orders/"),
        ("/api/apikeys/{id}", "/apikeys/{id}", "/api/apikeys/"),
    ] {
        let policy = Policy::builder("orders")
            .quota(Quota::per_minute(1))
            .key(PathParam::new(route, "id").unwrap())
            .route(route)
            .build()
            .unwrap();
        let api = Router::new()
            .route(inner, get(|| async { "order" }))
            .layer(ThrottleLayer::new(policy));
        let app = Router::new().nest("/api", api);
        let statuses = [
            status_of(&app, request(&format!("{path}1"))).await,
            status_of(&app, request(&format!("{path}1"))).await,
            status_of(&app, request(&format!("{path}2"))).await,
        ];
        let [ok, limited] = [StatusCode::OK, StatusCode::TOO_MANY_REQUESTS];
        assert_eq!(statuses, [ok, limited, ok], "one quota per {route}");
    }
    // A key whose parameter stands where the nest has its literal prefix reads the prefix (a
    // policy of every route, keyed by a path of its own).
    let section = PathParam::new("/{section}/orders/{id}", "section").unwrap();
    let policy = Policy::builder("sections")
        .quota(Quota::per_minute(1))
        .key(section);
    let layer = ThrottleLayer::new(policy.build().unwrap());
    let handle = layer.handle();
    let api = Router::new()
        .route("/orders/{id}", get(|| async { "order" }))
        .layer(layer);
    let app = Router::new().nest("/api", api);
    let first = status_of(&app, request("/api/orders/1")).await;
    let second = status_of(&app, request("/api/orders/2")).await;
    assert_eq!(
        (first, second),
        (StatusCode::OK, StatusCode::TOO_MANY_REQUESTS)
    );
    let state = handle.peek_key("sections", &"api".into()).await.unwrap();
    let remaining = state.tiers[0].combined().remaining;
    assert_eq!(remaining, 0, "the key is the prefix's section");
}

#[tokio::test]
async fn a_layer_refuses_one_name_with_two_quotas() {
    let a = global_policy("same", Quota::per_second(1));
    let b = global_policy("same", Quota::per_hour(1));
    let err = ThrottleLayer::builder()
        .policies([a.clone(), b])
        .build()
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("appears twice with different rules"),
        "{err}"
    );
    // The same quota twice, one policy per method, is fine.
    let per_method = |method: Method| {
        Policy::builder("same")
            .quota(Quota::per_second(1))
            .key(Global)
            .methods([method])
            .build()
            .unwrap()
    };
    assert!(ThrottleLayer::builder()
        .policies([per_method(Method::GET), per_method(Method::POST)])
        .build()
        .is_ok());
    // The same policy twice is refused: the first matching policy decides, so the second could
    // never apply.
    let err = ThrottleLayer::builder()
        .policies([a.clone(), a])
        .build()
        .unwrap_err();
    assert!(err.to_string().contains("can never apply"), "{err}");
    // Nor a limit named where another policy's overrides keep their state.
    let owner = Policy::builder("api")
        .quota(Quota::per_minute(1000))
        .key(Global)
        .route("/a");
    let owner = owner.build().unwrap();
    let err = ThrottleLayer::builder()
        .policies([owner, global_policy("api.override", Quota::per_minute(10))])
        .build()
        .unwrap_err();
    assert!(
        err.to_string().ends_with(
            r#"is where the overrides of policy "api" keep their state; rename the policy or tier"#
        ),
        "{err}"
    );
}
