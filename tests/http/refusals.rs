//! Every refusal through one hook (`refusal_response`): 429, 400, 403 on memory, 503 with a dead
//! Redis under `deny`; content negotiation from the request's parts. And every layer's decision side by side (`RequestDecisions`).

use crate::support::redis as redis_support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::support::{body_string, header};
use axum::body::Body;
use axum::{routing::get, Extension, Router};
use bytes::Bytes;
use http::{header::ACCEPT, Request, Response, StatusCode};
use tower::ServiceExt;
use tower_throttle::key::{Global, Header};
use tower_throttle::ops::AccessList;
use tower_throttle::refusal::{Refusal, RefusalKind};
use tower_throttle::{
    policy::{PolicyDecision, RequestDecisions},
    redis::RedisBackend,
    OnBackendError, Policy, Quota, ThrottleLayer,
};

/// What the hook saw of one refusal.
#[derive(Debug, Clone, PartialEq)]
struct Seen {
    kind: RefusalKind,
    status: u16,
    policy: Option<String>,
    key: Option<String>,
    retry_after_secs: Option<u64>,
    method: String,
    path: String,
    banned: Option<bool>,
}

type Log = Arc<Mutex<Vec<Seen>>>;

/// Records what it sees; answers HTML to browsers and the layer's own answer to everyone else.
fn negotiating_hook(log: Log) -> impl Fn(&Refusal<'_>) -> Response<Bytes> + Send + Sync + 'static {
    move |r: &Refusal<'_>| {
        log.lock().unwrap().push(Seen {
            kind: r.kind(),
            status: r.status().as_u16(),
            policy: r.policy().map(str::to_owned),
            key: r.key().map(|k| k.to_string()),
            retry_after_secs: r.retry_after().map(|d| d.as_secs_f64().ceil() as u64),
            method: r.method().to_string(),
            path: r.uri().path().to_owned(),
            banned: r.decision().map(|d| d.banned),
        });
        if !r.prefers_html() {
            return r.default_response();
        }
        let mut response = Response::new(Bytes::from(format!(
            "<h1>{}</h1><p>{}</p>",
            r.status().as_u16(),
            r.detail()
        )));
        *response.status_mut() = r.status();
        response
            .headers_mut()
            .insert("content-type", "text/html".parse().unwrap());
        response
    }
}

fn memory_app(log: Log) -> (Router, AccessList) {
    let lists = AccessList::new();
    lists.deny_key("stolen");
    let layer = ThrottleLayer::builder()
        .policy(
            Policy::builder("api")
                .quota(Quota::per_minute(1))
                .key(Header::new("x-api-key"))
                .build()
                .unwrap(),
        )
        .access_list(lists.clone())
        .refusal_response(negotiating_hook(log))
        .build()
        .unwrap();
    let app = Router::new()
        .route("/items", get(|| async { "ok" }).post(|| async { "posted" }))
        .layer(layer);
    (app, lists)
}

fn call(key: Option<&str>, accept: &str) -> Request<Body> {
    let mut r = Request::post("/items?x=1").header(ACCEPT, accept);
    if let Some(key) = key {
        r = r.header("x-api-key", key);
    }
    r.body(Body::empty()).unwrap()
}

#[tokio::test]
async fn one_hook_answers_429_400_and_403_and_sees_the_request() {
    let log = Log::default();
    let (app, _lists) = memory_app(log.clone());
    let html = "text/html,application/xhtml+xml;q=0.9,*/*;q=0.8";

    let ok = app.clone().oneshot(call(Some("k1"), html)).await.unwrap();
    assert_eq!(ok.status(), StatusCode::OK);
    assert!(
        log.lock().unwrap().is_empty(),
        "admitted: the hook is not called"
    );

    // 429, to a browser: the hook's HTML, with Retry-After and the RateLimit fields added.
    let limited = app.clone().oneshot(call(Some("k1"), html)).await.unwrap();
    assert_eq!(limited.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&limited, "content-type"), Some("text/html"));
    assert_eq!(header(&limited, "retry-after"), Some("60"));
    assert_eq!(header(&limited, "ratelimit"), Some(r#""api";r=0;t=60"#));
    assert!(body_string(limited).await.starts_with("<h1>429</h1>"));

    // 429, to an API client: the layer's own problem+json, through default_response.
    let json = app
        .clone()
        .oneshot(call(Some("k1"), "application/json"))
        .await
        .unwrap();
    assert_eq!(json.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        header(&json, "content-type"),
        Some("application/problem+json")
    );
    assert_eq!(header(&json, "retry-after"), Some("60"));

    // 400: no key.
    let no_key = app.clone().oneshot(call(None, html)).await.unwrap();
    assert_eq!(no_key.status(), StatusCode::BAD_REQUEST);
    assert_eq!(header(&no_key, "content-type"), Some("text/html"));
    assert!(body_string(no_key)
        .await
        .contains("expected header x-api-key"));

    // 403: a key on the deny list.
    let denied = app
        .clone()
        .oneshot(call(Some("stolen"), "application/json"))
        .await
        .unwrap();
    assert_eq!(denied.status(), StatusCode::FORBIDDEN);
    assert_eq!(
        header(&denied, "content-type"),
        Some("application/problem+json")
    );
    assert_eq!(header(&denied, "retry-after"), None);

    let seen = log.lock().unwrap().clone();
    let expect = |kind, status, key: Option<&str>, retry: Option<u64>, banned| Seen {
        kind,
        status,
        policy: Some("api".into()),
        key: key.map(str::to_owned),
        retry_after_secs: retry,
        method: "POST".into(),
        path: "/items".into(),
        banned,
    };
    assert_eq!(
        seen,
        vec![
            expect(RefusalKind::Limited, 429, Some("k1"), Some(60), Some(false)),
            expect(RefusalKind::Limited, 429, Some("k1"), Some(60), Some(false)),
            expect(RefusalKind::MissingKey, 400, None, None, None),
            expect(RefusalKind::Denied, 403, Some("stolen"), None, None),
        ]
    );
}

/// Redis is dead and the layer fails closed: the hook answers the 503, which keeps its Retry-After.
#[tokio::test]
async fn the_hook_answers_the_503_of_a_dead_redis_under_deny() {
    let mut server = redis_support::RedisServer::start();
    let backend = RedisBackend::builder()
        .url(server.url())
        .timeout(Duration::from_millis(100))
        .connect()
        .await
        .unwrap();
    server.stop();
    let log = Log::default();
    let layer = ThrottleLayer::builder()
        .backend(backend)
        .policy(
            Policy::builder("api")
                .quota(Quota::per_minute(100))
                .key(Global)
                .build()
                .unwrap(),
        )
        .on_backend_error(OnBackendError::Deny)
        .refusal_response(negotiating_hook(log.clone()))
        .build()
        .unwrap();
    let app = Router::new()
        .route("/items", get(|| async { "ok" }))
        .layer(layer);
    for accept in ["text/html", "application/json"] {
        let req = Request::get("/items")
            .header(ACCEPT, accept)
            .body(Body::empty())
            .unwrap();
        let response = tokio::time::timeout(Duration::from_secs(5), app.clone().oneshot(req))
            .await
            .expect("answered within the timeout")
            .unwrap();
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(header(&response, "retry-after"), Some("1"));
        let expected_type = if accept == "text/html" {
            "text/html"
        } else {
            "application/problem+json"
        };
        assert_eq!(header(&response, "content-type"), Some(expected_type));
    }
    let seen = log.lock().unwrap().clone();
    assert_eq!(seen.len(), 2, "{seen:?}");
    for s in &seen {
        assert_eq!(s.kind, RefusalKind::Unavailable);
        assert_eq!(s.status, 503);
        assert_eq!(s.policy.as_deref(), Some("api"));
        assert_eq!(s.retry_after_secs, Some(1));
        assert_eq!(s.key.as_deref(), Some("*"));
    }
}

/// Two layers on one route, each exposing its decision: the handler sees both (and each quota of
/// a stack); the single `PolicyDecision` is the inner layer's, as it always was.
#[tokio::test]
async fn handlers_see_every_layers_decision_and_every_limits() {
    // Manual clocks: the per-second quota must not refill between the two requests.
    let per_user = ThrottleLayer::builder()
        .backend(crate::support::backend().0)
        .policy(
            Policy::builder("user")
                .quota(Quota::per_minute(10))
                .key(Header::new("x-user"))
                .build()
                .unwrap(),
        )
        .decision_extension(true)
        .build()
        .unwrap();
    let site = ThrottleLayer::builder()
        .backend(crate::support::backend().0)
        .policy(
            Policy::builder("site")
                .quotas([Quota::per_second(100), Quota::per_day(1000)])
                .key(Global)
                .build()
                .unwrap(),
        )
        .decision_extension(true)
        .build()
        .unwrap();
    let app = Router::new()
        .route(
            "/",
            get(
                |Extension(all): Extension<RequestDecisions>,
                 Extension(one): Extension<PolicyDecision>| async move {
                    let mut out: Vec<String> = all
                        .iter()
                        .map(|d| {
                            let limits: Vec<String> = d
                                .limits
                                .iter()
                                .map(|l| format!("{}:{}", l.name, l.decision.remaining))
                                .collect();
                            format!(
                                "{}={}[{}]",
                                d.policy,
                                d.decision.remaining,
                                limits.join(",")
                            )
                        })
                        .collect();
                    out.push(format!("single={}", one.policy));
                    out.push(format!("user={}", all.get("user").is_some()));
                    out.join(" ")
                },
            ),
        )
        .layer(per_user)
        .layer(site);
    let req = || {
        Request::get("/")
            .header("x-user", "7")
            .body(Body::empty())
            .unwrap()
    };
    let first = body_string(app.clone().oneshot(req()).await.unwrap()).await;
    assert_eq!(
        first,
        "site=99[site.1s:99,site.1d:999] user=9[user:9] single=user user=true"
    );
    let second = body_string(app.clone().oneshot(req()).await.unwrap()).await;
    assert_eq!(
        second,
        "site=98[site.1s:98,site.1d:998] user=8[user:8] single=user user=true"
    );
}

/// The same on a live Redis (Lua path): the hook answers its 429 with the decision Redis made, and
/// a handler sees every quota of a stack decided there, keyed by a composite of query and path.
#[tokio::test]
async fn on_redis_the_hook_and_the_per_limit_decisions_work_alike() {
    use tower_throttle::key::{Composite, KeySpec, PathParam, QueryParam};

    let server = redis_support::RedisServer::start();
    let backend = RedisBackend::builder()
        .url(server.url())
        .mode(tower_throttle::redis::RedisMode::Lua)
        .connect()
        .await
        .unwrap();
    let key = Composite::new([
        KeySpec::from(QueryParam::new("api_key")),
        KeySpec::from(PathParam::new("/orgs/{org}", "org").unwrap()),
    ])
    .unwrap();
    let log = Log::default();
    let layer = ThrottleLayer::builder()
        .backend(backend)
        .policy(
            Policy::builder("org")
                .quotas([Quota::per_minute(2), Quota::per_day(100)])
                .key(KeySpec::from(key))
                .build()
                .unwrap(),
        )
        .decision_extension(true)
        .refusal_response(negotiating_hook(log.clone()))
        .build()
        .unwrap();
    let app = Router::new()
        .route(
            "/orgs/{org}",
            get(|Extension(all): Extension<RequestDecisions>| async move {
                let d = all.get("org").expect("this layer's decision");
                let limits: Vec<String> = d
                    .limits
                    .iter()
                    .map(|l| format!("{}:{}", l.name, l.decision.remaining))
                    .collect();
                limits.join(",")
            }),
        )
        .layer(layer);
    let call = |uri: &str| {
        Request::get(uri)
            .header(ACCEPT, "text/html")
            .body(Body::empty())
            .unwrap()
    };
    let first = app
        .clone()
        .oneshot(call("/orgs/acme?api_key=k"))
        .await
        .unwrap();
    assert_eq!(body_string(first).await, "org.1m:1,org.1d:99");
    let second = app
        .clone()
        .oneshot(call("/orgs/ac%6De?api_key=k"))
        .await
        .unwrap();
    assert_eq!(body_string(second).await, "org.1m:0,org.1d:98");
    let limited = app
        .clone()
        .oneshot(call("/orgs/acme?api_key=k"))
        .await
        .unwrap();
    assert_eq!(limited.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&limited, "content-type"), Some("text/html"));
    let retry: u64 = header(&limited, "retry-after").unwrap().parse().unwrap();
    assert!((29..=30).contains(&retry), "{retry}");
    let other = app
        .clone()
        .oneshot(call("/orgs/other?api_key=k"))
        .await
        .unwrap();
    assert_eq!(other.status(), StatusCode::OK);
    let seen = log.lock().unwrap().clone();
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(seen[0].kind, RefusalKind::Limited);
    assert_eq!(seen[0].policy.as_deref(), Some("org"));
}
