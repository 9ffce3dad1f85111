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

/// A stack of two limits with a penalty that bans at the first refusal.
pub(crate) fn stacked() -> Policy<Header> {
    Policy::builder("stack")
        .quotas([Quota::per_second(1), Quota::per_minute(100)])
        .key(Header::new("x-user"))
        .penalty(Penalty::new(1, Duration::from_secs(60), Duration::from_secs(600)).unwrap())
        .build()
        .unwrap()
}

/// The refusal that earns the ban shows it on every limit's `RateLimit` field, not only in
/// `Retry-After`: both limits wait the ban out.
pub(crate) async fn the_ban_shows_on_every_limit(app: &Router) {
    assert_eq!(send(app, "stacker").await.0, 200);
    let mut r = request("/");
    r.headers_mut().insert("x-user", "stacker".parse().unwrap());
    let res = app.clone().oneshot(r).await.unwrap();
    assert_eq!(res.status().as_u16(), 429);
    assert_eq!(header(&res, "retry-after"), Some("600"));
    let fields = header(&res, "ratelimit").unwrap().to_owned();
    assert_eq!(fields.matches("t=600").count(), 2, "{fields}");
}
