//! Keys and estimates from the request body, through axum's `Router::layer`, from TOML: a login
//! limit keyed by a JSON field (re-spelled values share a budget, different ones do not), a form
//! field, a metered estimate from `max_tokens`, and what has no key (an ambiguous, absent or
//! oversized field, a body that is not JSON). Every admitted request's handler gets the whole body,
//! unchanged, including a streamed body far over the cap. Shared by `tests/middleware/body_keys.rs`
//! (memory) and `tests/http/body_keys_on_redis.rs`.

use std::collections::VecDeque;
use std::pin::Pin;
use std::task::{Context, Poll};

use axum::body::{Body, Bytes};
use axum::routing::post;
use axum::{Extension, Router};
use http::{Request, StatusCode};
use http_body::Frame;
use http_body_util::BodyExt;
use tower::ServiceExt;
use tower_throttle::config::Config;
use tower_throttle::{Backend, Meter, ThrottleLayer};

const TOML: &str = r#"
[[route]]
name = "login"
path = "/login"
methods = ["POST"]
key = "json:username"
count = 3
period = "1h"
max_body = 1024

[[route]]
name = "upload"
path = "/upload"
key = "json:user.name"
on_missing_key = "allow"
count = 1
period = "1h"
max_body = 64

[[route]]
name = "signup"
path = "/signup"
key = "form:email"
count = 2
period = "1h"

[[route]]
name = "chat"
path = "/chat"
key = "header:x-api-key"
metered = { unit = "tokens", count = 1000, period = "1h", estimate = "json:max_tokens" }
"#;

/// A body sent in frames of `size` bytes (as a client streams it).
pub struct Chunked(VecDeque<Bytes>);

impl Chunked {
    pub fn new(bytes: &[u8], size: usize) -> Self {
        Chunked(bytes.chunks(size).map(Bytes::copy_from_slice).collect())
    }
}

impl http_body::Body for Chunked {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        Poll::Ready(self.0.pop_front().map(|b| Ok(Frame::data(b))))
    }
}

/// The app: each handler answers with the body it got (the chat handler with its meter's
/// estimate).
pub fn app<B: Backend>(backend: B) -> Router {
    let config = Config::from_toml(TOML).unwrap();
    let layer: ThrottleLayer<_, B> = config.layer_builder(backend).unwrap().build().unwrap();
    let echo = |body: Bytes| async move { body };
    Router::new()
        .route("/login", post(echo))
        .route("/upload", post(echo))
        .route("/signup", post(echo))
        .route(
            "/chat",
            post(|Extension(meter): Extension<Meter>| async move { meter.estimate().to_string() }),
        )
        .layer(layer)
}

pub fn post_body(path: &str, content_type: &str, body: impl Into<Body>) -> Request<Body> {
    Request::post(path)
        .header("content-type", content_type)
        .body(body.into())
        .unwrap()
}

pub fn login(json: &str) -> Request<Body> {
    post_body("/login", "application/json", json.to_owned())
}

/// The status and body of `request`'s response.
pub async fn send(app: &Router, request: Request<Body>) -> (StatusCode, Bytes) {
    let response = app.clone().oneshot(request).await.unwrap();
    let status = response.status();
    (
        status,
        response.into_body().collect().await.unwrap().to_bytes(),
    )
}

/// Everything above, on `backend`.
pub async fn body_keys_count_exactly<B: Backend>(backend: B) {
    let app = app(backend);
    // Three logins per username; the handler gets each body as it was sent.
    for i in 0..3 {
        let body = format!(r#"{{"username":"alice","password":"pw{i}"}}"#);
        assert_eq!(
            send(&app, login(&body)).await,
            (StatusCode::OK, body.into())
        );
    }
    // The same username, spelled another way, is the same key.
    for respelled in [
        r#"{"username":"alice"}"#,
        r#"{"username":"\u0061lice"}"#,
        r#"{ "user\u006eame" : "ali\u0063e" , "x": [1, {"username": "bob"}] }"#,
    ] {
        let (status, _) = send(&app, login(respelled)).await;
        assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{respelled}");
    }
    // Another username has its own budget.
    for _ in 0..3 {
        assert_eq!(
            send(&app, login(r#"{"username":"bob"}"#)).await.0,
            StatusCode::OK
        );
    }
    // No key: the route's missing-key answer (400).
    let padding = "x".repeat(1100);
    for no_key in [
        r#"{"username":"carol","username":"alice"}"#.to_owned(),
        r#"{"user":"carol"}"#.to_owned(),
        r#"{"username":""}"#.to_owned(),
        r#"{"username":"carol""#.to_owned(),
        format!(r#"{{"username":"carol","padding":"{padding}"}}"#),
        String::new(),
    ] {
        let (status, _) = send(&app, login(&no_key)).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{no_key}");
    }
    let text = post_body("/login", "text/plain", r#"{"username":"carol"}"#);
    assert_eq!(send(&app, text).await.0, StatusCode::BAD_REQUEST);
    // Numbers have one spelling.
    for n in ["10", "1e1", "10.0"] {
        let status = send(&app, login(&format!(r#"{{"username":{n}}}"#))).await.0;
        assert_eq!(status, StatusCode::OK, "{n}");
    }
    let status = send(&app, login(r#"{"username":100e-1}"#)).await.0;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);

    // A streamed body far over the cap passes (on_missing_key = "allow") and arrives whole; one
    // within it counts.
    let big: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
    let request = post_body(
        "/upload",
        "application/json",
        Body::new(Chunked::new(&big, 1000)),
    );
    assert_eq!(
        send(&app, request).await,
        (StatusCode::OK, Bytes::from(big))
    );
    let small = r#"{"user":{"name":"dave"}}"#;
    let chunked = || Body::new(Chunked::new(small.as_bytes(), 3));
    let request = || post_body("/upload", "application/json", chunked());
    assert_eq!(send(&app, request()).await, (StatusCode::OK, small.into()));
    assert_eq!(send(&app, request()).await.0, StatusCode::TOO_MANY_REQUESTS);

    // A form field, percent-decoded.
    let form = |body: &'static str| post_body("/signup", "application/x-www-form-urlencoded", body);
    assert_eq!(
        send(&app, form("email=a%40b.c&x=1")).await.0,
        StatusCode::OK
    );
    assert_eq!(
        send(&app, form("x=2&email=a@b.c")).await,
        (StatusCode::OK, "x=2&email=a@b.c".into())
    );
    assert_eq!(
        send(&app, form("email=a%40b%2Ec")).await.0,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(send(&app, form("email=e@f.g")).await.0, StatusCode::OK);

    // A metered estimate from the body: 400 + 400 + 150 of 1,000 tokens, then nothing fits.
    let chat = |body: &str| {
        let mut request = post_body("/chat", "application/json", body.to_owned());
        request
            .headers_mut()
            .insert("x-api-key", "k1".parse().unwrap());
        request
    };
    for (body, reserved) in [
        (r#"{"max_tokens":400}"#, "400"),
        (r#"{"max_tokens":4e2,"model":"m"}"#, "400"),
        (r#"{"max_tokens":150}"#, "150"),
    ] {
        assert_eq!(
            send(&app, chat(body)).await,
            (StatusCode::OK, reserved.into()),
            "{body}"
        );
    }
    assert_eq!(
        send(&app, chat(r#"{"max_tokens":100}"#)).await.0,
        StatusCode::TOO_MANY_REQUESTS
    );
}
