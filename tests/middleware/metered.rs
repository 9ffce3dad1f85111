//! Metered limits through the layer (memory backend, manual clock): streamed responses charged
//! exactly what they sent, clients that hang up mid-stream included; reservations that count at
//! once; debt answered with a `Retry-After` a client can wait out exactly; a handler that reports
//! nothing keeps its reservation; a usage header; and what cannot be metered refused at build time.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tower_throttle::backend::{Charges, Uses};

use axum::body::Body;
use axum::extract::Query;
use axum::http::{Request, StatusCode};
use axum::routing::{get, MethodRouter};
use axum::{Extension, Router};
use bytes::Bytes;
use http_body::Frame;
use http_body_util::BodyExt;
use tower::ServiceExt;

use crate::support::backend;
use tower_throttle::clock::ManualClock;
use tower_throttle::key::Header;
use tower_throttle::{
    Algorithm, Backend, BuildError, Estimate, Key, Limit, MemoryBackend, Meter, Policy,
    PolicyBuilder, Quota, ThrottleLayer,
};

/// A body of `n` server-sent events, one token each, each reported on the meter as it is produced
/// (when the client polls for it: nothing is produced ahead of the client); then, if `trailer`,
/// trailers saying `x-usage-tokens`.
struct Tokens {
    left: u64,
    sent: u64,
    meter: Option<Meter>,
    trailer: Option<u64>,
}

impl http_body::Body for Tokens {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        if self.left == 0 {
            let trailers = self.trailer.take().map(|used| {
                let mut trailers = http::HeaderMap::new();
                trailers.insert("x-usage-tokens", used.into());
                Ok(Frame::trailers(trailers))
            });
            return Poll::Ready(trailers);
        }
        self.left -= 1;
        self.sent += 1;
        if let Some(meter) = &self.meter {
            meter.add(1);
        }
        let event = format!("data: token {}\n\n", self.sent);
        Poll::Ready(Some(Ok(Frame::data(Bytes::from(event)))))
    }
}

#[derive(serde::Deserialize)]
struct Stream {
    tokens: Option<u64>,
    usage: Option<u64>,
}

/// `?tokens=N` streams N tokens on the meter; `?usage=N` answers `x-usage-tokens: N` instead;
/// neither reports nothing.
async fn handler(
    Extension(meter): Extension<Meter>,
    Query(q): Query<Stream>,
) -> axum::response::Response {
    if let Some(usage) = q.usage {
        return axum::response::Response::builder()
            .header("x-usage-tokens", usage)
            .body(Body::empty())
            .unwrap();
    }
    let body = Tokens {
        left: q.tokens.unwrap_or(0),
        sent: 0,
        meter: Some(meter),
        trailer: None,
    };
    axum::response::Response::new(Body::new(body))
}

/// 1,000,000 tokens an hour per `x-api-key`, reserving `estimate` per request.
fn tokens(estimate: u64) -> PolicyBuilder<Header> {
    let limit = Limit::new("api.tokens", Quota::per_hour(1_000_000)).unwrap();
    Policy::builder("api")
        .key(Header::new("x-api-key"))
        .metered(limit, Estimate::fixed(estimate))
        .usage_header("x-usage-tokens")
}

/// `requests` a minute and `tokens` a minute ("chat.tokens", metered) per `x-api-key`.
fn chat(requests: u64, tokens: u64, estimate: Estimate) -> Policy<Header> {
    Policy::builder("chat")
        .key(Header::new("x-api-key"))
        .quota(Quota::per_minute(requests))
        .metered(
            Limit::new("chat.tokens", Quota::per_minute(tokens)).unwrap(),
            estimate,
        )
        .build()
        .unwrap()
}

fn app<B: Backend + Clone>(backend: B, policy: Policy<Header>) -> Router {
    app_on(backend, policy, get(handler))
}

/// `route` on `/`, behind a layer of `policy` on `backend`.
fn app_on<B: Backend + Clone>(backend: B, policy: Policy<Header>, route: MethodRouter) -> Router {
    let layer = ThrottleLayer::builder()
        .backend(backend)
        .policy(policy)
        .build()
        .unwrap();
    Router::new().route("/", route).layer(layer)
}

fn request(key: &str, query: &str) -> Request<Body> {
    Request::get(format!("/?{query}"))
        .header("x-api-key", key)
        .body(Body::empty())
        .unwrap()
}

/// What `key` has been charged under `limits` (nothing drains: the clock stands still).
fn charged(backend: &MemoryBackend<ManualClock>, limits: &[Limit], key: &str, at: usize) -> u64 {
    let state = backend
        .peek_now(Charges::stack(limits, &Key::from(key), 0))
        .unwrap()[at];
    state.limit - state.remaining
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_streams_are_charged_exactly_what_they_sent_hangups_included() {
    let (backend, _clock) = backend();
    // Each reserves 1 and sends at least 1: every settle charges (a give-back is exact only to
    // within the time since the reservation, see the next test).
    let policy = tokens(1).build().unwrap();
    let limits = policy.limits().to_vec();
    let app = app(backend.clone(), policy);
    let keys = ["a", "b", "c", "d", "e"];
    let streams = (0..1000u64).map(|i| {
        let app = app.clone();
        let key = keys[i as usize % keys.len()];
        // 1 to 30 tokens; every tenth client hangs up after reading a third of them.
        let n = 1 + (i * 7919) % 30;
        let hang_up_after = (i % 10 == 3).then_some((n / 3).max(1));
        tokio::spawn(async move {
            let response = app
                .oneshot(request(key, &format!("tokens={n}")))
                .await
                .unwrap();
            assert_eq!(response.status(), StatusCode::OK);
            let mut body = response.into_body();
            let mut read = 0;
            while hang_up_after != Some(read) {
                match body.frame().await {
                    Some(frame) => {
                        assert!(frame.unwrap().is_data());
                        read += 1;
                    }
                    None => break,
                }
            }
            // Dropping the body mid-stream is a client hanging up.
            drop(body);
            (key, read)
        })
    });
    let mut sent = std::collections::HashMap::new();
    for stream in streams.collect::<Vec<_>>() {
        let (key, read) = stream.await.unwrap();
        *sent.entry(key).or_insert(0u64) += read;
    }
    let mut total = (0, 0);
    for key in keys {
        assert_eq!(charged(&backend, &limits, key, 0), sent[key], "key {key}");
        total.0 += charged(&backend, &limits, key, 0);
        total.1 += sent[key];
    }
    assert_eq!(total.0, total.1);
    assert!(total.1 > 10_000, "{total:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reservations_count_at_once() {
    // 100 requests a minute and 1,000 tokens; each reserves 100: ten fit, whatever is in flight.
    let (backend, _clock) = backend();
    let policy = chat(100, 1000, Estimate::header("x-max-tokens", 100));
    let entered = Arc::new(AtomicUsize::new(0));
    let (open, gate) = tokio::sync::watch::channel(false);
    let inside = entered.clone();
    let app = app_on(
        backend.clone(),
        policy,
        get(move |Extension(meter): Extension<Meter>| {
            let (inside, mut gate) = (inside.clone(), gate.clone());
            async move {
                // Every admitted request stays in flight until all are decided, and uses its
                // estimate.
                inside.fetch_add(1, Ordering::SeqCst);
                gate.wait_for(|open| *open).await.unwrap();
                meter.add(meter.estimate());
            }
        }),
    );
    let requests: Vec<_> = (0..100)
        .map(|_| {
            let app = app.clone();
            tokio::spawn(async move { app.oneshot(request("k", "")).await.unwrap() })
        })
        .collect();
    // Until every request is either refused or in its handler.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while requests.iter().filter(|r| r.is_finished()).count() + entered.load(Ordering::SeqCst) < 100
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "requests did not arrive"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(entered.load(Ordering::SeqCst), 10);
    open.send(true).unwrap();
    let (mut admitted, mut refused) = (0, 0);
    for request in requests {
        match request.await.unwrap().status() {
            StatusCode::OK => admitted += 1,
            StatusCode::TOO_MANY_REQUESTS => refused += 1,
            other => panic!("unexpected {other}"),
        }
    }
    assert_eq!((admitted, refused), (10, 90));
}

#[tokio::test]
async fn debt_is_refused_with_a_retry_after_a_client_can_wait_out_exactly() {
    // 60 tokens a minute (one a second), 60 of debt at most; a request reserves 1 and uses 90.
    let (backend, clock) = backend();
    let policy = Policy::builder("chat")
        .key(Header::new("x-api-key"))
        .metered(
            Limit::new("chat.tokens", Quota::per_minute(60)).unwrap(),
            Estimate::fixed(1),
        )
        .usage_header("x-usage-tokens")
        .build()
        .unwrap();
    let app = app(backend, policy);
    let response = app.clone().oneshot(request("k", "usage=90")).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    drop(response);
    // 90 s ahead, 60 allowed: the next token fits in 31 s.
    let refused = app.clone().oneshot(request("k", "")).await.unwrap();
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(refused.headers()["retry-after"], "31");
    assert_eq!(refused.headers()["ratelimit"], r#""chat.tokens";r=0;t=90"#);
    clock.advance(Duration::from_secs(31) - Duration::from_nanos(1));
    let early = app.clone().oneshot(request("k", "")).await.unwrap();
    assert_eq!(early.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(early.headers()["retry-after"], "1");
    clock.advance(Duration::from_nanos(1));
    let paid = app.clone().oneshot(request("k", "")).await.unwrap();
    assert_eq!(paid.status(), StatusCode::OK);
}

#[tokio::test]
async fn a_handler_that_reports_nothing_keeps_the_reservation_and_a_usage_header_settles() {
    let (backend, _clock) = backend();
    let policy = tokens(40).build().unwrap();
    let limits = policy.limits().to_vec();
    let app = app(backend.clone(), policy);
    let response = app.clone().oneshot(request("quiet", "")).await.unwrap();
    response.into_body().collect().await.unwrap();
    assert_eq!(charged(&backend, &limits, "quiet", 0), 40);
    // The usage header says 52: 12 more.
    let response = app
        .clone()
        .oneshot(request("usage", "usage=52"))
        .await
        .unwrap();
    assert_eq!(response.headers()["x-usage-tokens"], "52");
    response.into_body().collect().await.unwrap();
    assert_eq!(charged(&backend, &limits, "usage", 0), 52);
    // A stream of 3 tokens: 37 given back, less the time since the reservation (as a refund
    // does: a later request may have found the key idle meanwhile), which the middleware bounds
    // by the time since it asked the backend plus 10 ms.
    let response = app
        .clone()
        .oneshot(request("stream", "tokens=3"))
        .await
        .unwrap();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(
        &body[..],
        b"data: token 1\n\ndata: token 2\n\ndata: token 3\n\n"
    );
    let interval = Duration::from_secs(3600) / 1_000_000;
    let ahead = backend
        .peek_now(Charges::stack(&limits, &Key::from("stream"), 0))
        .unwrap()[0]
        .reset_after;
    assert!(ahead >= 3 * interval, "{ahead:?}");
    assert!(ahead < 3 * interval + Duration::from_secs(1), "{ahead:?}");
}

#[test]
fn a_metered_limit_on_another_algorithm_is_a_build_error() {
    let window =
        Limit::with_algorithm("t", Algorithm::SlidingWindow, Quota::per_minute(9)).unwrap();
    let err = Policy::builder("p")
        .key(tower_throttle::key::PeerIp::new())
        .metered(window, Estimate::fixed(1))
        .build()
        .unwrap_err()
        .to_string();
    assert!(err.contains(r#"uses algorithm "sliding-window""#), "{err}");
    assert!(err.contains(r#"needs "gcra""#), "{err}");
    let limit = || Limit::new("p.tokens", Quota::per_minute(9)).unwrap();
    let err = |b: PolicyBuilder<_>| b.build().unwrap_err().to_string();
    assert!(err(Policy::builder("p")
        .key(tower_throttle::key::PeerIp::new())
        .quota(Quota::per_minute(5))
        .tier("paid", [Quota::per_minute(50)])
        .metered(limit(), Estimate::fixed(1)))
    .contains("tiers"));
    // The policy's other quotas in delay mode: a request that waits would hold its reservation.
    assert!(err(Policy::builder("p")
        .key(tower_throttle::key::PeerIp::new())
        .quota(Quota::per_minute(5))
        .delay(Duration::from_secs(2))
        .metered(limit(), Estimate::fixed(1)))
    .contains("delay mode"));
    assert!(err(Policy::builder("p")
        .key(tower_throttle::key::PeerIp::new())
        .metered(limit(), Estimate::header("bad header", 1)))
    .contains("not a valid header name"));
    assert!(err(Policy::builder("p")
        .key(tower_throttle::key::PeerIp::new())
        .quota(Quota::per_minute(5))
        .usage_header("x-usage"))
    .contains("no limit is metered"));
}

/// A backend that decides but cannot settle.
#[derive(Clone)]
struct NoSettle(MemoryBackend);

impl Backend for NoSettle {
    type Future = <MemoryBackend as Backend>::Future;

    fn check(&self, charges: Charges<'_>) -> Self::Future {
        self.0.check(charges)
    }

    // Decides stacks as memory does, and refuses settlements.
    fn validate(&self, limits: &[Limit], uses: Uses) -> Result<(), BuildError> {
        match uses.settles {
            true => Err(BuildError::Invalid("no settlements here".into())),
            false => self.0.validate(limits, uses),
        }
    }
}

#[test]
fn a_backend_that_cannot_settle_is_a_build_error() {
    let err = ThrottleLayer::builder()
        .backend(NoSettle(MemoryBackend::new()))
        .policy(tokens(1).build().unwrap())
        .build()
        .unwrap_err()
        .to_string();
    assert!(err.contains("cannot settle"), "{err}");
}

#[tokio::test]
async fn the_fields_carry_each_limit_by_name_and_the_openai_set_on_request() {
    let (backend, _clock) = backend();
    let policy = chat(60, 100_000, Estimate::fixed(1000));
    let layer = ThrottleLayer::builder()
        .backend(backend)
        .policy(policy)
        .openai_headers(true)
        .build()
        .unwrap();
    let app = Router::new().route("/", get(handler)).layer(layer);
    let response = app.clone().oneshot(request("k", "")).await.unwrap();
    let h = response.headers();
    assert_eq!(
        h["ratelimit-policy"],
        r#""chat";q=60;w=60, "chat.tokens";q=100000;w=60"#
    );
    // The reservation counts at once: 99,000 tokens left, full again in 0.6 s.
    assert_eq!(
        h["ratelimit"],
        r#""chat";r=59;t=1, "chat.tokens";r=99000;t=1"#
    );
    assert_eq!(h["x-ratelimit-limit-requests"], "60");
    assert_eq!(h["x-ratelimit-remaining-requests"], "59");
    assert_eq!(h["x-ratelimit-reset-requests"], "1s");
    assert_eq!(h["x-ratelimit-limit-tokens"], "100000");
    assert_eq!(h["x-ratelimit-remaining-tokens"], "99000");
    assert_eq!(h["x-ratelimit-reset-tokens"], "600ms");
}

/// A banned key's refusal shows each limit with its own size, as any refusal does.
#[tokio::test]
async fn a_banned_keys_fields_show_each_limits_own_size() {
    let (backend, _clock) = backend();
    let layer = ThrottleLayer::builder()
        .backend(backend)
        .policy(chat(60, 100_000, Estimate::fixed(1000)))
        .openai_headers(true)
        .build()
        .unwrap();
    let hour = std::time::Duration::from_secs(3600);
    layer.handle().ban("chat", "k", hour).await.unwrap();
    let app = Router::new().route("/", get(handler)).layer(layer);
    let response = app.oneshot(request("k", "")).await.unwrap();
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    let h = response.headers();
    assert_eq!(h["x-ratelimit-limit-requests"], "60");
    assert_eq!(h["x-ratelimit-limit-tokens"], "100000");
    assert_eq!(h["x-ratelimit-remaining-tokens"], "0");
}

#[tokio::test]
async fn the_usage_may_come_in_a_trailer() {
    let (backend, _clock) = backend();
    let policy = tokens(1).build().unwrap();
    let limits = policy.limits().to_vec();
    let app = app_on(
        backend.clone(),
        policy,
        get(|| async {
            let body = Tokens {
                left: 1,
                sent: 0,
                meter: None,
                trailer: Some(7),
            };
            Body::new(body)
        }),
    );
    let response = app.oneshot(request("t", "")).await.unwrap();
    let collected = response.into_body().collect().await.unwrap();
    assert_eq!(collected.trailers().unwrap()["x-usage-tokens"], "7");
    assert_eq!(charged(&backend, &limits, "t", 0), 7);
}

#[tokio::test]
async fn peek_shows_debt_in_tokens_and_reset_forgets_it() {
    let (backend, _clock) = backend();
    let layer = ThrottleLayer::builder()
        .backend(backend)
        .policy(chat(60, 60, Estimate::fixed(1)))
        .build()
        .unwrap();
    let handle = layer.handle();
    let app = Router::new()
        .route(
            "/",
            get(|Extension(meter): Extension<Meter>| async move { meter.add(90) }),
        )
        .layer(layer);
    app.clone().oneshot(request("k", "")).await.unwrap();
    let state = handle.peek("chat", "k").await.unwrap();
    let limits = &state.tiers[0].limits;
    assert_eq!(limits[0].0, "chat");
    assert_eq!((limits[0].1.remaining, limits[0].1.retry_after), (59, None));
    // 90 tokens ahead of 60: nothing left, and the next token in 31 s.
    assert_eq!(limits[1].0, "chat.tokens");
    let tokens = limits[1].1;
    assert_eq!(tokens.remaining, 0);
    assert_eq!(tokens.retry_after, Some(Duration::from_secs(31)));
    assert_eq!(tokens.reset_after, Duration::from_secs(90));
    handle.reset("chat", "k").await.unwrap();
    let state = handle.peek("chat", "k").await.unwrap();
    assert_eq!(state.tiers[0].limits[1].1.remaining, 60);
    assert_eq!(
        app.oneshot(request("k", "")).await.unwrap().status(),
        StatusCode::OK
    );
}

#[tokio::test]
async fn a_request_let_through_without_a_key_still_finds_its_meter() {
    let (backend, _clock) = backend();
    let policy = Policy::builder("chat")
        .key(Header::new("x-api-key"))
        .on_missing_key(tower_throttle::policy::MissingKey::Allow)
        .metered(
            Limit::new("chat.tokens", Quota::per_minute(60)).unwrap(),
            Estimate::fixed(1),
        )
        .build()
        .unwrap();
    let app = app(backend, policy);
    let anonymous = Request::get("/?tokens=2").body(Body::empty()).unwrap();
    let response = app.oneshot(anonymous).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    response.into_body().collect().await.unwrap();
}

/// `org`'s layer around `user`'s, on `backend`, over `route` (by default a handler that reports
/// 500 units used).
fn nested(
    backend: &MemoryBackend<ManualClock>,
    org: Policy<Header>,
    user: Policy<Header>,
    route: Option<MethodRouter>,
) -> Router {
    let layer = |policy| {
        ThrottleLayer::builder()
            .backend(backend.clone())
            .policy(policy)
            .build()
            .unwrap()
    };
    let reports = || get(|Extension(meter): Extension<Meter>| async move { meter.add(500) });
    Router::new()
        .route("/", route.unwrap_or_else(reports))
        .layer(layer(user))
        .layer(layer(org))
}

/// An organisation's metered policy of `tokens` a minute, reserving `estimate`.
fn org(tokens: u64, estimate: u64) -> Policy<Header> {
    Policy::builder("org")
        .key(Header::new("x-api-key"))
        .quota(Quota::per_minute(1000))
        .metered(
            Limit::new("org.tokens", Quota::per_minute(tokens)).unwrap(),
            Estimate::fixed(estimate),
        )
        .build()
        .unwrap()
}

/// Two metered layers, an organisation's around a user's: what the handler reports on its meter
/// (the inner layer's) is charged under both, not only the inner one; so is the inner layer's
/// usage header, the request's whole cost (not the outer's estimate, nor what was streamed).
#[tokio::test]
async fn nested_metered_layers_are_both_charged_what_the_handler_reports() {
    let header = get(|Extension(meter): Extension<Meter>| async move {
        meter.add(10);
        ([("x-usage-tokens", "500")], "ok")
    });
    for route in [None, Some(header)] {
        let (backend, _clock) = backend();
        let (org, mut user) = (org(1000, 1), chat(60, 1000, Estimate::fixed(1)));
        if route.is_some() {
            user = Policy::builder("chat")
                .key(Header::new("x-api-key"))
                .quota(Quota::per_minute(60))
                .metered(user.limits()[1].clone(), Estimate::fixed(1))
                .usage_header("x-usage-tokens")
                .build()
                .unwrap();
        }
        let (org_limits, user_limits) = (org.limits().to_vec(), user.limits().to_vec());
        let app = nested(&backend, org, user, route);
        let response = app.oneshot(request("k", "")).await.unwrap();
        response.into_body().collect().await.unwrap();
        assert_eq!(charged(&backend, &user_limits, "k", 1), 500);
        assert_eq!(charged(&backend, &org_limits, "k", 1), 500);
    }
}

/// A request the inner layer refuses (its own quota used up) is never served: the outer layer
/// that metered it is charged nothing, not its estimate, for each try a client's retries make.
#[tokio::test]
async fn a_request_an_inner_layer_refuses_gives_the_outer_layer_its_reservation_back() {
    let (backend, _clock) = backend();
    let org = org(100_000, 4000);
    let org_limits = org.limits().to_vec();
    let user = Policy::builder("user")
        .key(Header::new("x-api-key"))
        .quota(Quota::per_minute(1))
        .build()
        .unwrap();
    let app = nested(&backend, org, user, None);
    let mut statuses = Vec::new();
    for _ in 0..5 {
        let response = app.clone().oneshot(request("k", "")).await.unwrap();
        statuses.push(response.status().as_u16());
        response.into_body().collect().await.unwrap();
    }
    assert_eq!(statuses, [200, 429, 429, 429, 429]);
    // The one served request's 500 tokens; the four refused ones give back their 4000 but the
    // time since they were reserved and the refunds' 10 ms clock margin (17 tokens each here).
    let charged = charged(&backend, &org_limits, "k", 1);
    assert!((500..=500 + 4 * 40).contains(&charged), "{charged}");
}

/// A metered limit alone takes none of a quota's options (refused, not dropped), but its shadow
/// limits take the policy's algorithm and windows.
#[test]
fn a_metered_limit_alone_refuses_a_quotas_options_but_not_its_shadows_algorithm() {
    use tower_throttle::key::Global;
    use tower_throttle::policy::Penalty;
    use tower_throttle::{Algorithm, Estimate, Limit, Policy, Quota};
    let alone = || {
        let tokens = Limit::new("t.tokens", Quota::per_minute(1000)).unwrap();
        Policy::builder("t")
            .key(Global)
            .metered(tokens, Estimate::fixed(10))
    };
    let penalty = Penalty::new(3, Duration::from_secs(60), Duration::from_secs(600)).unwrap();
    let refused = alone().penalty(penalty).build().unwrap_err().to_string();
    assert!(
        refused.contains("a metered limit alone takes no"),
        "{refused}"
    );
    let windowed = alone().algorithm(Algorithm::FixedWindow);
    assert!(windowed.build().is_err());
    let shadowed = alone()
        .algorithm(Algorithm::FixedWindow)
        .shadow(Quota::per_day(100));
    let policy = shadowed.build().unwrap();
    assert_eq!(
        policy.shadow_limits()[0].algorithm(),
        Algorithm::FixedWindow
    );
}
