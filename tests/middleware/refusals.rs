//! Every refusal through one hook (`refusal_response`): 429, 400, 403 on memory, 503 with a dead
//! Redis under `deny`; content negotiation from the request's parts. And every layer's decision side by side (`RequestDecisions`).

use crate::shared::refusals::{negotiating_hook, Log, Seen};
use crate::support::{body_string, header};
use axum::body::Body;
use axum::{routing::get, Extension, Router};
use http::{header::ACCEPT, Request, StatusCode};
use tower::ServiceExt;
use tower_throttle::key::{Global, Header};
use tower_throttle::ops::AccessList;
use tower_throttle::refusal::RefusalKind;
use tower_throttle::{
    policy::{PolicyDecision, RequestDecisions},
    Policy, Quota, ThrottleLayer,
};

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
