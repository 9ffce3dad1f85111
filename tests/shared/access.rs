//! What tests/middleware/access.rs and tests/http/access_on_redis.rs share.

use crate::support::{from_peer, request, status_of};
use axum::{routing::get, Router};
use tower_throttle::key::{ClientIp, Header};
use tower_throttle::ops::AccessList;
use tower_throttle::{Policy, Quota, ThrottleLayer};

pub(crate) fn app(lists: &AccessList, behind: Option<ClientIp>) -> Router {
    let policy = Policy::builder("api")
        .quota(Quota::per_minute(2))
        .key(Header::new("x-api-key"))
        .build()
        .unwrap();
    let builder = ThrottleLayer::builder().policy(policy);
    let builder = match behind {
        Some(client_ip) => builder.access_list_behind(lists.clone(), client_ip),
        None => builder.access_list(lists.clone()),
    };
    Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(builder.build().unwrap())
}

pub(crate) async fn statuses(app: &Router, peer: &str, api_key: &str, n: usize) -> Vec<u16> {
    let mut out = Vec::new();
    for _ in 0..n {
        out.push(status_of(app, req(peer, api_key)).await.as_u16());
    }
    out
}

pub(crate) fn req(peer: &str, api_key: &str) -> http::Request<axum::body::Body> {
    let mut r = from_peer(request("/"), peer);
    r.headers_mut()
        .insert("x-api-key", api_key.parse().unwrap());
    r
}
