//! `OnBackendError::Local`: while the backend fails, the local limiter decides the charges the
//! backend was asked for, as the memory backend would: quotas keyed apart each under their own key,
//! a metered limit at the request's estimate.

use std::future::{ready, Ready};

use axum::body::Body;
use axum::routing::get;
use axum::Router;
use http::{Request, StatusCode};
use tower::ServiceExt;
use tower_throttle::backend::{BackendError, Charges, Decisions, Uses};
use tower_throttle::config::Config;
use tower_throttle::key::Header;
use tower_throttle::{
    Backend, BuildError, Estimate, Limit, OnBackendError, Policy, Quota, ThrottleLayer,
};

/// A backend that takes every policy and decides none.
#[derive(Clone)]
struct Down;

impl Backend for Down {
    type Future = Ready<Result<Decisions, BackendError>>;

    fn check(&self, _: Charges<'_>) -> Self::Future {
        ready(Err(BackendError::new("down")))
    }

    fn validate(&self, _: &[Limit], _: Uses) -> Result<(), BuildError> {
        Ok(())
    }
}

fn app<K>(policies: Vec<Policy<K>>) -> Router
where
    K: tower_throttle::key::KeyExtractor<Body> + Send + Sync + 'static,
{
    app_and_handle(policies).0
}

/// [`app`], and its layer's handle.
fn app_and_handle<K>(
    policies: Vec<Policy<K>>,
) -> (Router, tower_throttle::ops::ThrottleHandle<K, Down>)
where
    K: tower_throttle::key::KeyExtractor<Body> + Send + Sync + 'static,
{
    let layer = ThrottleLayer::builder()
        .backend(Down)
        .policies(policies)
        .on_backend_error(OnBackendError::Local)
        .build()
        .unwrap();
    let handle = layer.handle();
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer);
    (app, handle)
}

/// How many of `requests` (each a list of headers) pass, sent one after another.
async fn passed(app: &Router, requests: &[&[(&str, &str)]]) -> usize {
    let mut ok = 0;
    for headers in requests {
        let mut request = Request::get("/");
        for (name, value) in *headers {
            request = request.header(*name, *value);
        }
        let response = app
            .clone()
            .oneshot(request.body(Body::empty()).unwrap())
            .await;
        ok += usize::from(response.unwrap().status() == StatusCode::OK);
    }
    ok
}

#[tokio::test]
async fn the_local_limiter_counts_quotas_keyed_apart_under_their_own_keys() {
    let config = Config::from_toml(
        r#"
        [[route]]
        name = "api"
        key = "header:x-user-id"
        quotas = [
          { count = 10, period = "1h", key = "header:x-user-id" },
          { count = 3, period = "1h", key = "header:x-org-id" },
        ]
        "#,
    )
    .unwrap();
    let app = app(config.policies().unwrap());
    let user = |id| [("x-user-id", id), ("x-org-id", "acme")];
    let (ann, bob, cy) = (user("ann"), user("bob"), user("cy"));
    // Three users of one organisation, two requests each: the organisation's 3 an hour.
    let requests: [&[(&str, &str)]; 6] = [&ann, &bob, &cy, &ann, &bob, &cy];
    assert_eq!(passed(&app, &requests).await, 3);
}

#[tokio::test]
async fn the_local_limiter_reserves_a_metered_requests_estimate() {
    let tokens = Limit::new("chat.tokens", Quota::per_minute(1000)).unwrap();
    let policy = Policy::builder("chat")
        .key(Header::new("x-api-key"))
        .quota(Quota::per_minute(100))
        .metered(tokens, Estimate::fixed(600))
        .build()
        .unwrap();
    let app = app(vec![policy]);
    let key: &[(&str, &str)] = &[("x-api-key", "k")];
    assert_eq!(passed(&app, &[key, key, key]).await, 1);
}

/// What the local limiter took is adjusted there after the response, as the backend's would be:
/// responses that do not count are given back, and a metered request is charged what it used.
#[tokio::test]
async fn the_local_limiter_takes_refunds_and_settlements() {
    let counted = Policy::builder("login")
        .key(Header::new("x-user-id"))
        .quota(Quota::per_hour(2))
        .count_only(|status| status == StatusCode::UNAUTHORIZED)
        .build()
        .unwrap();
    let user: &[(&str, &str)] = &[("x-user-id", "ann")];
    assert_eq!(passed(&app(vec![counted]), &[user; 5]).await, 5);

    assert_eq!(metered_chat_passes(Down).await, 3);
}

/// How many of three requests pass on `backend` (under `OnBackendError::Local`), each using 10
/// tokens of an estimate of 600 a minute's 1,000: all three, where each is settled.
async fn metered_chat_passes<B: Backend>(backend: B) -> usize {
    let tokens = Limit::new("chat.tokens", Quota::per_minute(1000)).unwrap();
    let metered = Policy::builder("chat")
        .key(Header::new("x-api-key"))
        .quota(Quota::per_minute(100))
        .metered(tokens, Estimate::fixed(600))
        .build()
        .unwrap();
    let layer = ThrottleLayer::builder()
        .backend(backend)
        .policy(metered)
        .on_backend_error(OnBackendError::Local)
        .build()
        .unwrap();
    let used_ten = |axum::Extension(meter): axum::Extension<tower_throttle::Meter>| async move {
        meter.add(10);
        "ok"
    };
    let chat = Router::new().route("/", get(used_ten)).layer(layer);
    let key: &[(&str, &str)] = &[("x-api-key", "k")];
    passed(&chat, &[key; 3]).await
}

/// A backend that answers one decision whatever it is asked: for a stack, a failure.
#[derive(Clone)]
struct Short;

impl Backend for Short {
    type Future = Ready<Result<Decisions, BackendError>>;

    fn check(&self, _: Charges<'_>) -> Self::Future {
        let one = tower_throttle::Decision::allowed(1, 0, std::time::Duration::ZERO);
        ready(Ok(Decisions::Many(vec![one])))
    }

    fn validate(&self, _: &[Limit], _: Uses) -> Result<(), BuildError> {
        Ok(())
    }
}

/// An answer of the wrong length is a failure the local limiter decides, and what it took is
/// settled there (it was settled on the backend, and the local limiter kept each estimate).
#[tokio::test]
async fn a_malformed_answer_is_settled_where_the_local_limiter_took_it() {
    assert_eq!(metered_chat_passes(Short).await, 3);
}

/// A request the local limiter refused, let through by a dry run, took nothing there: its response
/// that does not count gives nothing back (it would undo another request's count). One it admitted
/// is given back, dry run or not.
#[tokio::test]
async fn a_refusal_let_through_gives_nothing_back_to_the_local_limiter() {
    use tower_throttle::policy::PolicyDecision;
    let counted = Policy::builder("login")
        .key(Header::new("x-user-id"))
        .quota(Quota::per_hour(2))
        .count_only(|status| status == StatusCode::UNAUTHORIZED)
        .dry_run(true)
        .build()
        .unwrap();
    let layer = ThrottleLayer::builder()
        .backend(Down)
        .policy(counted)
        .on_backend_error(OnBackendError::Local)
        .decision_extension(true)
        .build()
        .unwrap();
    // 401 unless `x-ok`; the body says whether the local limiter admitted the request.
    let handler = |axum::Extension(d): axum::Extension<PolicyDecision>, h: http::HeaderMap| async move {
        let status = match h.contains_key("x-ok") {
            true => StatusCode::OK,
            false => StatusCode::UNAUTHORIZED,
        };
        (
            status,
            if d.decision.allowed {
                "admitted"
            } else {
                "refused"
            },
        )
    };
    let app = Router::new().route("/", get(handler)).layer(layer);
    let send = |ok: bool| {
        let app = app.clone();
        async move {
            let mut request = Request::get("/").header("x-user-id", "ann");
            if ok {
                request = request.header("x-ok", "1");
            }
            let response = app
                .oneshot(request.body(Body::empty()).unwrap())
                .await
                .unwrap();
            let fields = response.headers()["ratelimit"].to_str().unwrap().to_owned();
            let body = axum::body::to_bytes(response.into_body(), 64)
                .await
                .unwrap();
            (String::from_utf8(body.to_vec()).unwrap(), fields)
        }
    };
    // A success the local limiter admitted is given back there, dry run or not.
    assert_eq!(send(true).await.0, "admitted");
    // (Given back less the time since its admission, a few ms that drain as fast.)
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    assert_eq!(send(false).await.0, "admitted");
    assert_eq!(send(false).await.0, "admitted");
    // Over the quota, let through by the dry run, and not counted: nothing to give back.
    assert_eq!(send(true).await.0, "refused");
    let (admitted, fields) = send(false).await;
    assert_eq!(admitted, "refused");
    // Both failures still count: full for an hour (given back, half an hour).
    assert_eq!(
        fields, r#""login";r=0;t=3600"#,
        "a counted failure was given back"
    );
}

/// A reset forgets what the local limiter counted of the key under an override's quota too (it
/// counts there apart from the policy's own limits).
#[tokio::test]
async fn a_reset_forgets_the_local_limiters_count_under_an_override() {
    use tower_throttle::ops::Override;
    let policy = Policy::builder("api")
        .quota(Quota::per_minute(10))
        .key(Header::new("x-user-id"))
        .build()
        .unwrap();
    let (app, handle) = app_and_handle(vec![policy]);
    let quota = Override::Quota(Quota::per_minute(1));
    handle.set_override("api", "acme", quota).await.unwrap();
    let acme: &[(&str, &str)] = &[("x-user-id", "acme")];
    assert_eq!(passed(&app, &[acme, acme]).await, 1);
    // The backend cannot reset (it is down): the layer's own state is forgotten first.
    let _ = handle.reset("api", "acme").await;
    assert_eq!(passed(&app, &[acme]).await, 1);
}

/// A reset forgets what the local limiter counted of a quota keyed apart, under its own key.
#[tokio::test]
async fn a_reset_forgets_the_local_limiters_count_of_a_quota_keyed_apart() {
    let config = Config::from_toml(
        r#"
        [[route]]
        name = "api"
        key = "header:x-user-id"
        quotas = [
          { count = 10, period = "1h" },
          { count = 1, period = "1h", key = "header:x-org-id" },
        ]
        "#,
    )
    .unwrap();
    let (app, handle) = app_and_handle(config.policies().unwrap());
    let ann: &[(&str, &str)] = &[("x-user-id", "ann"), ("x-org-id", "acme")];
    assert_eq!(passed(&app, &[ann, ann]).await, 1);
    let _ = handle.reset("api", "acme").await;
    assert_eq!(passed(&app, &[ann]).await, 1);
}
