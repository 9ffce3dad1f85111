//! Helpers shared by the integration-test binaries: a memory backend on a manual clock, requests
//! from a peer or a user, statuses, headers and bodies of responses; and, in [`redis`], real Redis
//! servers.
//!
//! Each binary (`tests/<area>/main.rs`) includes this directory with
//!
//! ```ignore
//! #[path = "../support/mod.rs"]
//! mod support;
//! ```
//!
//! and uses only part of it, hence the `dead_code` allowance.
#![allow(dead_code)]

pub mod asks;
pub mod cluster;
pub mod failover;
pub mod fault_proxy;
pub mod redis;
#[path = "../../src/top/zipf.rs"]
pub mod zipf;

use std::net::SocketAddr;
use std::time::Duration;

use axum::body::Body;
use axum::extract::ConnectInfo;
use http::{Request, Response};
use http_body_util::BodyExt;
use tower_throttle::clock::ManualClock;
use tower_throttle::MemoryBackend;

pub fn backend() -> (MemoryBackend<ManualClock>, ManualClock) {
    let clock = ManualClock::new();
    // Start well after zero, as a real clock would be.
    clock.advance(Duration::from_secs(1000));
    let backend = MemoryBackend::builder()
        .clock(clock.clone())
        .build()
        .unwrap();
    (backend, clock)
}

pub fn request(uri: &str) -> Request<Body> {
    Request::get(uri).body(Body::empty()).unwrap()
}

/// The status of `req` sent to a clone of `app`.
pub async fn status_of(app: &axum::Router, req: Request<Body>) -> http::StatusCode {
    use tower::ServiceExt;
    app.clone().oneshot(req).await.unwrap().status()
}

pub fn from_peer(mut req: Request<Body>, peer: &str) -> Request<Body> {
    let addr: SocketAddr = peer.parse().unwrap();
    req.extensions_mut().insert(ConnectInfo(addr));
    req
}

pub fn header<'a, B>(res: &'a Response<B>, name: &str) -> Option<&'a str> {
    res.headers().get(name).map(|v| v.to_str().unwrap())
}

pub async fn body_string<B>(res: Response<B>) -> String
where
    B: http_body::Body,
    B::Error: std::fmt::Debug,
{
    let bytes = res.into_body().collect().await.unwrap().to_bytes();
    String::from_utf8(bytes.to_vec()).unwrap()
}

/// What a client sees of a response: its status, its headers but the date (sorted), its body.
pub type Seen = (http::StatusCode, Vec<(String, String)>, String);

/// `n` requests `GET /` with `x-user-id: user`, sent to `app` one after another, as seen.
pub async fn seen(app: &axum::Router, user: &str, n: usize) -> Vec<Seen> {
    use tower::ServiceExt;
    let mut out = Vec::new();
    for _ in 0..n {
        let request = Request::get("/")
            .header("x-user-id", user)
            .body(Body::empty())
            .unwrap();
        let response = app.clone().oneshot(request).await.unwrap();
        let mut headers: Vec<_> = response
            .headers()
            .iter()
            .filter(|(name, _)| *name != "date")
            .map(|(n, v)| (n.to_string(), v.to_str().unwrap().to_owned()))
            .collect();
        headers.sort();
        out.push((response.status(), headers, body_string(response).await));
    }
    out
}

/// "api": one request a minute per `x-user` header (the hook and log tests).
pub fn per_user_policy() -> tower_throttle::Policy<tower_throttle::key::Header> {
    tower_throttle::Policy::builder("api")
        .quota(tower_throttle::Quota::per_minute(1))
        .key(tower_throttle::key::Header::new("x-user"))
        .build()
        .unwrap()
}

/// `GET /items?page=2` from `user` (`x-user`).
pub fn from_user(user: &str) -> Request<Body> {
    let mut r = request("/items?page=2");
    r.headers_mut().insert("x-user", user.parse().unwrap());
    r
}

/// Runs `body` on a current-thread runtime with a Prometheus recorder of its own (so tests running
/// at once never see each other's counts); returns what `body` returned and the rendered page.
pub fn with_metrics<T>(body: impl std::future::Future<Output = T>) -> (T, String) {
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let out = metrics::with_local_recorder(&recorder, || runtime.block_on(body));
    (out, handle.render())
}

/// The value of `series` (name and labels, as rendered) in a Prometheus page, 0 when absent.
pub fn sample_or_zero(page: &str, series: &str) -> f64 {
    page.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .map_or(0.0, |v| v.trim().parse().unwrap())
}

/// A layer of the one policy `policy` on `backend`.
pub fn layer_on<K, B>(
    backend: B,
    policy: tower_throttle::Policy<K>,
) -> tower_throttle::ThrottleLayer<K, B>
where
    B: tower_throttle::Backend,
{
    tower_throttle::ThrottleLayer::builder()
        .backend(backend)
        .policy(policy)
        .build()
        .unwrap()
}
