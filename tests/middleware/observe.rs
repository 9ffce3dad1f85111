//! The on_limited hook, and the metrics counted exactly on a local recorder (the log events are in
//! tests/observability/logs.rs; the example server's /metrics in tests/http/example_server.rs).

use std::sync::{Arc, Mutex};

use crate::support::{from_user as from, per_user_policy as policy, status_of};
use axum::{routing::get, Router};
use http::Method;
use tower_throttle::{refusal::Limited, ThrottleLayer};

#[tokio::test]
async fn the_hook_sees_each_limited_request_with_its_parts() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let record = seen.clone();
    let layer = ThrottleLayer::builder()
        .policy(policy())
        .on_limited(move |l: &Limited<'_>| {
            record.lock().unwrap().push((
                l.policy.to_owned(),
                l.key.to_string(),
                l.method.clone(),
                l.uri.to_string(),
                l.decision.retry_after_secs(),
                l.headers.contains_key("x-user"),
            ));
        })
        .build()
        .unwrap();
    let app = Router::new()
        .route("/items", get(|| async { "ok" }))
        .layer(layer);
    for _ in 0..3 {
        status_of(&app, from("carol")).await;
    }
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 2, "only the limited ones");
    assert_eq!(
        seen[0],
        (
            "api".to_owned(),
            "carol".to_owned(),
            Method::GET,
            "/items?page=2".to_owned(),
            60,
            true
        )
    );
}

/// A backend that is down: each decision waits one poll (so the layer takes its pending path),
/// then fails.
struct Down;

impl tower_throttle::Backend for Down {
    type Future = DownFuture;

    fn check(&self, _charges: tower_throttle::backend::Charges<'_>) -> DownFuture {
        DownFuture { polled: false }
    }
}

struct DownFuture {
    polled: bool,
}

impl std::future::Future for DownFuture {
    type Output = Result<tower_throttle::backend::Decisions, tower_throttle::backend::BackendError>;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        if !self.polled {
            self.polled = true;
            cx.waker().wake_by_ref();
            return std::task::Poll::Pending;
        }
        std::task::Poll::Ready(Err(tower_throttle::backend::BackendError::new("down")))
    }
}

/// The value of the series `series` (name and labels, as rendered) in a Prometheus text page.
fn sample(page: &str, series: &str) -> f64 {
    page.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("no {series} in\n{page}"))
        .trim()
        .parse()
        .unwrap()
}

/// Every counter and the latency histogram, exactly, for a scripted sequence on a recorder of this
/// test's own: a key that earns a penalty ban and then is answered by it, a deny-listed key, and a
/// backend that fails. Only requests that reached the backend are timed.
#[test]
fn metrics_count_bans_forbidden_requests_failures_and_timed_decisions() {
    use http::StatusCode;
    use std::time::Duration;
    use tower_throttle::key::{Global, Header};
    use tower_throttle::ops::AccessList;
    use tower_throttle::{policy::Penalty, OnBackendError, Policy, Quota};

    let (statuses, page) = crate::support::with_metrics(async {
        {
            // Two a minute; the third rejection within a minute earns a 10-minute ban.
            let login = Policy::builder("login")
                .quota(Quota::per_minute(2))
                .key(Header::new("x-user"))
                .penalty(
                    Penalty::new(3, Duration::from_secs(60), Duration::from_secs(600)).unwrap(),
                )
                .build()
                .unwrap();
            let lists = AccessList::new();
            lists.deny_key("stolen");
            let guarded = Router::new().route("/items", get(|| async { "ok" })).layer(
                ThrottleLayer::builder()
                    .policy(login)
                    .access_list(lists)
                    .build()
                    .unwrap(),
            );
            let flaky = Policy::builder("flaky")
                .quota(Quota::per_minute(100))
                .key(Global)
                .build()
                .unwrap();
            let failing = Router::new().route("/items", get(|| async { "ok" })).layer(
                ThrottleLayer::builder()
                    .backend(Down)
                    .policy(flaky)
                    .on_backend_error(OnBackendError::Allow)
                    .build()
                    .unwrap(),
            );
            // The same outage under `deny`: refused by the failure policy.
            let strict = Policy::builder("strict")
                .quota(Quota::per_minute(100))
                .key(Global)
                .build()
                .unwrap();
            let refusing = Router::new().route("/items", get(|| async { "ok" })).layer(
                ThrottleLayer::builder()
                    .backend(Down)
                    .policy(strict)
                    .on_backend_error(OnBackendError::Deny)
                    .build()
                    .unwrap(),
            );
            let mut statuses = Vec::new();
            // 2 admitted, 3 limited (the third earns the ban), 2 answered by the ban.
            for _ in 0..7 {
                statuses.push(status_of(&guarded, from("mallory")).await);
            }
            for _ in 0..2 {
                statuses.push(status_of(&guarded, from("stolen")).await);
            }
            for _ in 0..3 {
                statuses.push(status_of(&failing, from("anyone")).await);
            }
            for _ in 0..2 {
                statuses.push(status_of(&refusing, from("anyone")).await);
            }
            // A stream's message of a blocked key counts as a forbidden request does.
            let blocked = Policy::builder("chat")
                .quota(Quota::per_minute(100))
                .key(Header::new("x-user"))
                .build()
                .unwrap();
            let handle = ThrottleLayer::builder()
                .policy(blocked)
                .build()
                .unwrap()
                .handle();
            let block = tower_throttle::ops::Override::Blocked;
            handle.set_override("chat", "eve", block).await.unwrap();
            assert!(!handle.check("chat", "eve", 1).await.unwrap().allowed);
            statuses
        }
    });
    let (ok, limited, forbidden, down) = (
        StatusCode::OK,
        StatusCode::TOO_MANY_REQUESTS,
        StatusCode::FORBIDDEN,
        StatusCode::SERVICE_UNAVAILABLE,
    );
    assert_eq!(
        statuses,
        [
            ok, ok, limited, limited, limited, limited, limited, forbidden, forbidden, ok, ok, ok,
            down, down
        ]
    );
    let count = |series: &str| sample(&page, series);
    for (series, value) in [
        ("throttle_requests_allowed_total{policy=\"login\"}", 2.0),
        ("throttle_requests_limited_total{policy=\"login\"}", 5.0),
        ("throttle_requests_banned_total{policy=\"login\"}", 3.0),
        ("throttle_backend_failures_total{policy=\"login\"}", 0.0),
        // The ban answers without the backend: 2 admitted and 3 limited were timed.
        (
            "throttle_backend_latency_seconds_count{policy=\"login\"}",
            5.0,
        ),
        // Deny-listed requests reach no policy; the blocked message counts too.
        ("throttle_requests_forbidden_total", 3.0),
        // A failure admitted by the failure policy is no decision: counted only as a failure.
        ("throttle_requests_allowed_total{policy=\"flaky\"}", 0.0),
        ("throttle_requests_limited_total{policy=\"flaky\"}", 0.0),
        ("throttle_requests_banned_total{policy=\"flaky\"}", 0.0),
        ("throttle_backend_failures_total{policy=\"flaky\"}", 3.0),
        (
            "throttle_backend_latency_seconds_count{policy=\"flaky\"}",
            3.0,
        ),
        // What the failure policy answered instead, by outcome: how much the outage let through.
        (
            "throttle_fallback_decisions_total{policy=\"flaky\",on_error=\"allow\",outcome=\"admitted\"}",
            3.0,
        ),
        (
            "throttle_fallback_decisions_total{policy=\"strict\",on_error=\"deny\",outcome=\"refused\"}",
            2.0,
        ),
        ("throttle_backend_failures_total{policy=\"strict\"}", 2.0),
    ] {
        assert_eq!(count(series), value, "{series} in\n{page}");
    }
}
