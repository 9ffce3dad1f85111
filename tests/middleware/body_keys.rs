//! Keys and estimates from the request body on the memory backend (`tests/shared/body_keys.rs`;
//! on Redis: `tests/http/body_keys_on_redis.rs`), the body types the layer reads, and the
//! configuration errors.

use std::convert::Infallible;

use axum::body::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use tower::{Layer, ServiceExt};
use tower_throttle::key::{BodyField, KeySpec};
use tower_throttle::{MemoryBackend, Policy, Quota, ThrottleLayer};

use crate::shared::body_keys::{body_keys_count_exactly, Chunked};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

#[tokio::test]
async fn body_keys_count_exactly_on_memory() {
    body_keys_count_exactly(MemoryBackend::new()).await;
}

fn login_policy() -> Policy<KeySpec> {
    Policy::builder("login")
        .quota(Quota::per_hour(1))
        .body_key(BodyField::json("username").unwrap())
        .max_body(64)
        .build()
        .unwrap()
}

/// A hyper server's bodies, boxed (`Incoming` cannot be rebuilt): read, and handed on whole.
#[tokio::test]
async fn boxed_and_full_bodies_are_read_and_handed_on() {
    let layer = ThrottleLayer::new(login_policy());
    let echo = |request: Request<BoxBody<Bytes, BoxError>>| async move {
        let body = request.into_body().collect().await?.to_bytes();
        Ok::<_, BoxError>(Response::new(Full::new(body)))
    };
    let service = tower::ServiceBuilder::new().layer(layer).service_fn(echo);
    let request = |body: &[u8], size: usize| {
        let body = Chunked::new(body, size).map_err(BoxError::from).boxed();
        Request::post("/")
            .header("content-type", "application/json")
            .body(body)
            .unwrap()
    };
    let send = |request| {
        let service = service.clone();
        async move {
            let response = service.oneshot(request).await.unwrap();
            let status = response.status();
            (
                status,
                response.into_body().collect().await.unwrap().to_bytes(),
            )
        }
    };
    let alice = br#"{"username":"alice"}"#;
    assert_eq!(
        send(request(alice, 4)).await,
        (StatusCode::OK, Bytes::from_static(alice))
    );
    assert_eq!(
        send(request(alice, 100)).await.0,
        StatusCode::TOO_MANY_REQUESTS
    );
    let long = format!(r#"{{"username":"bob","x":"{}"}}"#, "y".repeat(100));
    assert_eq!(
        send(request(long.as_bytes(), 7)).await.0,
        StatusCode::BAD_REQUEST
    );

    let full = ThrottleLayer::new(login_policy()).layer(tower::service_fn(
        |request: Request<Full<Bytes>>| async move {
            let body = request.into_body().collect().await.unwrap().to_bytes();
            Ok::<_, Infallible>(Response::new(Full::new(body)))
        },
    ));
    let request = Request::post("/")
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from_static(br#"{"username":"carol"}"#)))
        .unwrap();
    let response = full.oneshot(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let body = response.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(body, &br#"{"username":"carol"}"#[..]);
}

/// A body type the layer cannot rebuild is not read: no key, the missing-key answer.
#[tokio::test]
async fn a_body_type_the_layer_cannot_rebuild_has_no_key() {
    let service =
        ThrottleLayer::new(login_policy()).layer(tower::service_fn(|_: Request<String>| async {
            Ok::<_, Infallible>(Response::new(Full::new(Bytes::new())))
        }));
    let request = Request::post("/")
        .header("content-type", "application/json")
        .body(r#"{"username":"alice"}"#.to_owned())
        .unwrap();
    let response = service.oneshot(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
}

#[test]
fn body_settings_that_cannot_work_are_errors() {
    let field = || BodyField::json("username").unwrap();
    let build =
        |builder: tower_throttle::PolicyBuilder<KeySpec>| builder.build().unwrap_err().to_string();
    let base = || Policy::builder("login").quota(Quota::per_hour(1));
    assert!(build(base().body_key(field()).max_body(0)).contains("max_body must be at least 1"));
    assert!(build(
        base()
            .body_key(field())
            .body_timeout(std::time::Duration::ZERO)
    )
    .contains("body_timeout must be more than 0"));
    let hours = std::time::Duration::from_secs(3601);
    assert!(build(base().body_key(field()).body_timeout(hours)).contains("at most 1 hour"));
    let gib = (1 << 30) + 1;
    assert!(build(base().body_key(field()).max_body(gib)).contains("at most 1 GiB"));
    assert!(build(base().key(KeySpec::Global).max_body(10)).contains("nothing reads the body"));
    let async_key = tower_throttle::key::AsyncKey::new(|_| async { None });
    assert!(build(base().body_key(field()).async_key(async_key)).contains("use one"));

    let error = |route: &str| {
        let toml = format!("[[route]]\nname = \"r\"\ncount = 1\nperiod = \"1s\"\n{route}\n");
        match tower_throttle::config::Config::from_toml(&toml) {
            Ok(config) => config.policies().unwrap_err().to_string(),
            Err(error) => error.to_string(),
        }
    };
    assert!(error("key = \"json:\"").contains("is not a valid name"));
    assert!(error("key = [\"ip\", \"json:user\"]").contains("cannot be part of a composite key"));
    assert!(error("key = \"ip\"\nmax_body = 10").contains("nothing reads the body"));
    assert!(error(
        "key = \"ip\"\nmetered = { count = 9, period = \"1s\", estimate = \"json:n\", estimate_header = \"x-n\" }"
    )
    .contains("use one"));
    assert!(
        error("key = \"ip\"\nmetered = { count = 9, period = \"1s\", estimate = \"xml:n\" }")
            .contains("json:<path>")
    );
    let config = tower_throttle::config::Config::from_toml(
        "[[route]]\nname = \"r\"\ncount = 1\nperiod = \"1s\"\nkey = \"form:email\"\nmax_body = 100\nbody_timeout = \"1s\"",
    )
    .unwrap();
    assert_eq!(
        config.policies().unwrap()[0].key().to_string(),
        "form:email"
    );
}

/// A body that never sends a byte.
struct Stalled;

impl http_body::Body for Stalled {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, Infallible>>> {
        std::task::Poll::Pending
    }
}

/// A request whose body the policy reads waits as long as its client makes it: it does not hold
/// what readying the inner service reserved (a permit of a concurrency limit) meanwhile, as a
/// delayed request does not; it is readied once admitted.
#[tokio::test]
async fn a_request_reading_its_body_holds_no_permit_of_the_inner_service() {
    use tower::{Service, ServiceBuilder};
    let mut service = ServiceBuilder::new()
        .layer(ThrottleLayer::new(login_policy()))
        .concurrency_limit(1)
        .service_fn(|_: Request<axum::body::Body>| async {
            Ok::<_, Infallible>(Response::new(axum::body::Body::from("ok")))
        });
    let stalled = Request::post("/login")
        .header("content-type", "application/json")
        .body(axum::body::Body::new(Stalled))
        .unwrap();
    let waiting = tokio::spawn(service.ready().await.unwrap().call(stalled));
    tokio::task::yield_now().await;
    let ready = tokio::time::timeout(std::time::Duration::from_millis(500), service.ready()).await;
    let bob = Request::post("/login")
        .header("content-type", "application/json")
        .body(axum::body::Body::from(r#"{"username":"bob"}"#))
        .unwrap();
    let served = ready
        .expect("the permit is held")
        .unwrap()
        .call(bob)
        .await
        .unwrap();
    assert_eq!(served.status(), StatusCode::OK);
    waiting.abort();
}
