//! What tests/middleware/penalty.rs and tests/http/penalty_on_redis.rs share.

use std::time::Duration;

use crate::support::{header, request};
use axum::Router;
use tower::ServiceExt;
use tower_throttle::key::Header;
use tower_throttle::{policy::Penalty, Policy, Quota};

pub(crate) fn policy(ban: Duration) -> Policy<Header> {
    Policy::builder("login")
        .quota(Quota::per_minute(2))
        .key(Header::new("x-user"))
        .penalty(Penalty::new(3, Duration::from_secs(60), ban).unwrap())
        .build()
        .unwrap()
}

/// Status and Retry-After of one request from `user`.
pub(crate) async fn send(app: &Router, user: &str) -> (u16, u64) {
    let mut r = request("/");
    r.headers_mut().insert("x-user", user.parse().unwrap());
    let res = app.clone().oneshot(r).await.unwrap();
    let retry = header(&res, "retry-after").map_or(0, |v| v.parse().unwrap());
    (res.status().as_u16(), retry)
}
