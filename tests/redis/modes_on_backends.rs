//! Delay mode, dry run, tiers, stacked quotas and concurrency through the layer, under concurrent
//! requests, with exact counts: in memory and on a real Redis server (Lua; and a 3-master Cluster
//! for stacks and concurrency).
//!
//! Quotas are slow (a unit a few seconds) so that no unit refills while a test runs on a real clock:
//! the counts are then exact on every backend.

use crate::support::failover::wait_until;
use crate::support::redis as redis_support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::support::asks::Asks;
use axum::body::Body;
use axum::routing::get;
use axum::{Extension, Router};
use http::{Request, StatusCode};
use http_body_util::BodyExt;
use redis_support::{RedisCluster, RedisServer};
use tower::ServiceExt;
use tower_throttle::key::{Global, Header};
use tower_throttle::{
    policy::PolicyDecision,
    redis::{RedisBackend, RedisMode},
    Algorithm, Backend, MemoryBackend, Policy, Quota, ThrottleLayer,
};

fn app<B: Backend>(
    backend: B,
    policy: Policy<impl tower_throttle::key::KeyExtractor<Body>>,
) -> Router {
    let layer = ThrottleLayer::builder()
        .backend(backend)
        .policy(policy)
        .build()
        .unwrap();
    Router::new()
        .route(
            "/",
            get(|d: Option<Extension<PolicyDecision>>| async move {
                d.map_or("none".to_owned(), |Extension(d)| {
                    format!("{} {}", d.decision.allowed, d.delayed.as_millis())
                })
            }),
        )
        .layer(layer)
}

fn get_as(user: &str, plan: Option<&str>) -> Request<Body> {
    let mut r = Request::get("/").header("x-user", user);
    if let Some(plan) = plan {
        r = r.header("x-plan", plan);
    }
    r.body(Body::empty()).unwrap()
}

/// Sends `n` requests at once; returns (status, body) of each.
async fn burst(
    app: &Router,
    n: usize,
    user: &str,
    plan: Option<&str>,
) -> Vec<(StatusCode, String)> {
    let tasks: Vec<_> = (0..n)
        .map(|_| {
            let (app, req) = (app.clone(), get_as(user, plan));
            tokio::spawn(async move {
                let res = app.oneshot(req).await.unwrap();
                let status = res.status();
                let body = res.into_body().collect().await.unwrap().to_bytes();
                (status, String::from_utf8(body.to_vec()).unwrap())
            })
        })
        .collect();
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.unwrap());
    }
    out
}

fn count(replies: &[(StatusCode, String)], status: StatusCode) -> usize {
    replies.iter().filter(|(s, _)| *s == status).count()
}

/// 6 a minute with up to 30 s of delay: of 20 concurrent requests, 6 pass at once, 3 wait (10, 20
/// and 30 s) and 11 are rejected at once.
async fn delay_admits_the_burst_and_queues_exactly_what_fits<B: Backend>(backend: B) {
    let policy = Policy::builder("queued")
        .quota(Quota::per_minute(6))
        .delay(Duration::from_secs(30))
        .key(Global)
        .build()
        .unwrap();
    let app = app(backend, policy);
    let tasks: Vec<_> = (0..20)
        .map(|_| {
            let app = app.clone();
            tokio::spawn(async move {
                let res = app.oneshot(get_as("u", None)).await.unwrap();
                let status = res.status();
                let body = res.into_body().collect().await.unwrap().to_bytes();
                (status, String::from_utf8(body.to_vec()).unwrap())
            })
        })
        .collect();
    // The event to wait for: 17 answered (the burst and the rejections; the first wait is
    // 10 s, so nothing else can finish meanwhile). A generous deadline, not a guess.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(8);
    while tasks.iter().filter(|t| t.is_finished()).count() < 17 {
        assert!(tokio::time::Instant::now() < deadline, "17 never answered");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let (mut ok, mut limited, mut waiting) = (0, 0, 0);
    for task in tasks {
        if !task.is_finished() {
            waiting += 1;
            task.abort();
            continue;
        }
        match task.await.unwrap() {
            // Within the burst: no wait at all.
            (StatusCode::OK, body) => {
                assert_eq!(body, "true 0");
                ok += 1
            }
            (StatusCode::TOO_MANY_REQUESTS, _) => limited += 1,
            other => panic!("{other:?}"),
        }
    }
    assert_eq!((ok, waiting, limited), (6, 3, 11));
}

/// Where a backend's time is read: tokio's (paused) clock for a memory backend on a manual clock,
/// or the Redis server's `TIME`, the clock its scripts decide on.
#[derive(Clone)]
enum BackendClock {
    Paused(tokio::time::Instant),
    Redis(redis::aio::MultiplexedConnection),
}

impl BackendClock {
    async fn redis(server: &RedisServer) -> Self {
        let client = redis::Client::open(server.url()).unwrap();
        BackendClock::Redis(client.get_multiplexed_async_connection().await.unwrap())
    }

    async fn now(&self) -> Duration {
        match self {
            BackendClock::Paused(origin) => origin.elapsed(),
            BackendClock::Redis(conn) => {
                let (secs, micros): (u64, u64) = redis::cmd("TIME")
                    .query_async(&mut conn.clone())
                    .await
                    .unwrap();
                Duration::from_secs(secs) + Duration::from_micros(micros)
            }
        }
    }
}

/// The waits that delay mode promises are kept. Bursts of 6, a unit every `interval`, up to 3
/// intervals of delay: of 9 requests at once, 6 pass at once and 3 wait their turn, due 1, 2 and 3
/// intervals after the burst began. So the k-th wait is promised at most k intervals and is
/// answered no sooner than k intervals after the burst began: bounds that a slow machine only
/// makes easier to meet. On a paused clock (nothing moves but the waits) they are exact.
async fn delay_keeps_the_waits_it_promises<B: Backend>(
    backend: B,
    interval: Duration,
    clock: BackendClock,
) {
    let policy = Policy::builder("promised")
        .quota(Quota::per_period(6, interval * 6))
        .delay(interval * 3)
        .key(Global)
        .build()
        .unwrap();
    let app = app(backend, policy);
    let began = clock.now().await;
    let tasks: Vec<_> = (0..9)
        .map(|_| {
            let (app, clock) = (app.clone(), clock.clone());
            tokio::spawn(async move {
                let res = app.oneshot(get_as("u", None)).await.unwrap();
                let status = res.status();
                let body = res.into_body().collect().await.unwrap().to_bytes();
                let answered = clock.now().await;
                (status, String::from_utf8(body.to_vec()).unwrap(), answered)
            })
        })
        .collect();
    // The promised waits, and when each was answered, each sorted on its own: the k-th
    // shortest promise is at most k intervals, the k-th answer after the burst comes no sooner
    // than k intervals (arrivals spread over more than an interval may pair them differently).
    let (mut promised, mut answered) = (Vec::new(), Vec::new());
    for task in tasks {
        let (status, body, at) = task.await.unwrap();
        assert_eq!(status, StatusCode::OK, "{body}");
        let ms: u64 = body.strip_prefix("true ").unwrap().parse().unwrap();
        promised.push(Duration::from_millis(ms));
        answered.push(at - began);
    }
    promised.sort();
    answered.sort();
    assert!(promised[..6].iter().all(Duration::is_zero), "{promised:?}");
    for (k, (promised, answered)) in (1u32..).zip(promised[6..].iter().zip(&answered[6..])) {
        let due = interval * k;
        if matches!(clock, BackendClock::Paused(_)) {
            assert_eq!((*promised, *answered), (due, due), "wait {k}");
        } else {
            // 1 ms for the whole milliseconds the handler shows and the server's clock steps.
            let ms = Duration::from_millis(1);
            assert!(*promised <= due + ms, "wait {k}: promised {promised:?}");
            assert!(
                *answered + ms >= due,
                "wait {k}: answered after {answered:?}"
            );
        }
    }
}

/// Dry run: every request passes; exactly the quota's worth are marked allowed.
async fn dry_run_marks_exactly_the_quota<B: Backend>(backend: B) {
    let policy = Policy::builder("trial")
        .quota(Quota::per_minute(5))
        .dry_run(true)
        .key(Global)
        .build()
        .unwrap();
    let replies = burst(&app(backend, policy), 30, "u", None).await;
    assert_eq!(count(&replies, StatusCode::OK), 30);
    assert_eq!(replies.iter().filter(|(_, b)| b == "true 0").count(), 5);
    assert_eq!(replies.iter().filter(|(_, b)| b == "false 0").count(), 25);
}

/// Tiers: each plan gets exactly its own quota.
async fn tiers_admit_exactly_each_plans_quota<B: Backend>(backend: B) {
    let policy = Policy::builder("plans")
        .quota(Quota::per_minute(2))
        .tier("paid", [Quota::per_minute(7)])
        .tier_header("x-plan")
        .key(Header::new("x-user"))
        .build()
        .unwrap();
    let app = app(backend, policy);
    assert_eq!(
        count(&burst(&app, 20, "free", None).await, StatusCode::OK),
        2
    );
    assert_eq!(
        count(
            &burst(&app, 20, "payer", Some("paid")).await,
            StatusCode::OK
        ),
        7
    );
}

/// Stacked: 5 a minute and 8 an hour. 20 at once admit 5; the rejections took nothing from the hourly
/// quota, which has exactly 3 left.
async fn stacks_admit_exactly_and_rejections_consume_nothing<B: Backend>(backend: B) {
    let policy = Policy::builder("stack")
        .quotas([Quota::per_minute(5), Quota::per_hour(8)])
        .key(Global)
        .build()
        .unwrap();
    let app = app(backend, policy);
    assert_eq!(count(&burst(&app, 20, "u", None).await, StatusCode::OK), 5);
    let res = app.clone().oneshot(get_as("u", None)).await.unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    let field = res.headers()["ratelimit"].to_str().unwrap();
    assert!(
        field.starts_with(r#""stack.1m";r=0;"#) && field.contains(r#""stack.1h";r=3;"#),
        "{field}"
    );
}

/// An app behind `layer` whose handler counts the requests inside it and holds each until `open`
/// gives it a permit.
fn holding<K, B>(
    layer: ThrottleLayer<K, B>,
) -> (Router, Arc<AtomicUsize>, Arc<tokio::sync::Semaphore>)
where
    K: tower_throttle::key::KeyExtractor<Body>,
    B: Backend,
{
    let inside = Arc::new(AtomicUsize::new(0));
    let open = Arc::new(tokio::sync::Semaphore::new(0));
    let (i, o) = (inside.clone(), open.clone());
    let app = Router::new()
        .route(
            "/",
            get(move || {
                let (inside, open) = (i.clone(), o.clone());
                async move {
                    inside.fetch_add(1, Ordering::SeqCst);
                    open.acquire().await.unwrap().forget();
                    "done"
                }
            }),
        )
        .layer(layer);
    (app, inside, open)
}

/// Concurrency: 3 in flight. 20 requests held inside the handler: exactly 3 get in; when they end,
/// their slots come back.
async fn concurrency_admits_exactly_the_limit_in_flight<B: Backend + Clone>(backend: B) {
    let policy = Policy::builder("inflight")
        .quota(Quota::per_second(3))
        .algorithm(Algorithm::Concurrency)
        .key(Global)
        .build()
        .unwrap();
    let (probe, limits) = (backend.clone(), policy.limits().to_vec());
    let layer = ThrottleLayer::builder()
        .backend(backend)
        .policy(policy)
        .build()
        .unwrap();
    let (app, inside, open) = holding(layer);
    for round in 1..=3 {
        let tasks: Vec<_> = (0..20)
            .map(|_| {
                let app = app.clone();
                tokio::spawn(async move {
                    let res = app.oneshot(get_as("u", None)).await.unwrap();
                    let status = res.status();
                    res.into_body().collect().await.unwrap();
                    status
                })
            })
            .collect();
        // 17 are rejected, 3 wait inside the handler.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while tasks.iter().filter(|t| t.is_finished()).count() < 17
            || inside.load(Ordering::SeqCst) < 3 * round
        {
            assert!(
                tokio::time::Instant::now() < deadline,
                "round {round}: stuck"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(inside.load(Ordering::SeqCst), 3 * round, "round {round}");
        let (done, held): (Vec<_>, Vec<_>) = tasks.into_iter().partition(|t| t.is_finished());
        assert_eq!(held.len(), 3, "round {round}");
        for task in done {
            assert_eq!(task.await.unwrap(), StatusCode::TOO_MANY_REQUESTS);
        }
        open.add_permits(3);
        for task in held {
            assert_eq!(task.await.unwrap(), StatusCode::OK);
        }
        // The slots come back as the bodies end (on Redis, by a spawned release command): polled.
        wait_until(
            Duration::from_secs(10),
            "the slots never came back",
            || async {
                let states = probe
                    .peek_all(&limits, &tower_throttle::Key::global())
                    .await
                    .unwrap();
                states[0].remaining == 3
            },
        )
        .await;
    }
}

fn memory() -> MemoryBackend {
    MemoryBackend::new()
}

async fn redis(server: &RedisServer) -> RedisBackend {
    RedisBackend::builder()
        .url(server.url())
        .mode(RedisMode::Lua)
        .timeout(Duration::from_secs(2))
        .connect()
        .await
        .unwrap()
}

async fn redis_cluster(cluster: &RedisCluster) -> RedisBackend {
    RedisBackend::builder()
        .cluster_urls(cluster.urls())
        .mode(RedisMode::Lua)
        .timeout(Duration::from_secs(2))
        .connect()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_memory() {
    delay_admits_the_burst_and_queues_exactly_what_fits(memory()).await;
    dry_run_marks_exactly_the_quota(memory()).await;
    tiers_admit_exactly_each_plans_quota(memory()).await;
    stacks_admit_exactly_and_rejections_consume_nothing(memory()).await;
    concurrency_admits_exactly_the_limit_in_flight(memory()).await;
}

/// Delay mode's promised waits in memory, on a manual clock and tokio's paused one: exact.
#[tokio::test(start_paused = true)]
async fn delay_keeps_its_promised_waits_in_memory() {
    let clock = tower_throttle::clock::ManualClock::new();
    clock.advance(Duration::from_secs(1000));
    let backend = MemoryBackend::builder().clock(clock).build().unwrap();
    let paused = BackendClock::Paused(tokio::time::Instant::now());
    delay_keeps_the_waits_it_promises(backend, Duration::from_secs(10), paused).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_redis() {
    let server = RedisServer::start();
    delay_admits_the_burst_and_queues_exactly_what_fits(redis(&server).await).await;
    let clock = BackendClock::redis(&server).await;
    delay_keeps_the_waits_it_promises(redis(&server).await, Duration::from_millis(500), clock)
        .await;
    dry_run_marks_exactly_the_quota(redis(&server).await).await;
    tiers_admit_exactly_each_plans_quota(redis(&server).await).await;
    stacks_admit_exactly_and_rejections_consume_nothing(redis(&server).await).await;
    concurrency_admits_exactly_the_limit_in_flight(redis(&server).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_redis_cluster() {
    let cluster = RedisCluster::start();
    stacks_admit_exactly_and_rejections_consume_nothing(redis_cluster(&cluster).await).await;
    concurrency_admits_exactly_the_limit_in_flight(redis_cluster(&cluster).await).await;
    tiers_admit_exactly_each_plans_quota(redis_cluster(&cluster).await).await;
}

/// Delay mode where redis-cell is loaded: `Auto` (the default) and `Cell` still decide delayed
/// limits with the Lua script, whose answers are exact to the nanosecond (CL.THROTTLE rounds to
/// whole seconds and knows nothing of the delay).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delay_mode_on_redis_with_redis_cell_loaded() {
    let server = RedisServer::start_with_cell();
    for mode in [RedisMode::Auto, RedisMode::Cell] {
        let backend = RedisBackend::builder()
            .url(server.url())
            .mode(mode)
            .prefix(format!("cell{}", mode.as_str()))
            .timeout(Duration::from_secs(2))
            .connect()
            .await
            .unwrap();
        delay_admits_the_burst_and_queues_exactly_what_fits(backend.clone()).await;
        let clock = BackendClock::redis(&server).await;
        delay_keeps_the_waits_it_promises(backend, Duration::from_millis(500), clock).await;
    }
}

/// A request that runs longer than its Redis lease keeps its slot (the lease is renewed while the
/// request is in flight), and gives it back when it ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_request_keeps_its_redis_lease_until_it_ends() {
    let server = RedisServer::start();
    let policy = Policy::builder("long")
        .quota(Quota::per_second(1))
        .algorithm(Algorithm::Concurrency)
        .lease(Duration::from_secs(1))
        .key(Global)
        .build()
        .unwrap();
    let layer = ThrottleLayer::builder()
        .backend(redis(&server).await)
        .policy(policy)
        .build()
        .unwrap();
    let (app, inside, open) = holding(layer);
    let long = tokio::spawn(app.clone().oneshot(get_as("u", None)));
    while inside.load(Ordering::SeqCst) == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // Well past the 1 s lease, the slot is still taken.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    // (Were it admitted, it would wait inside the handler: hence the timeout.)
    let second = tokio::time::timeout(
        Duration::from_secs(2),
        app.clone().oneshot(get_as("u", None)),
    );
    let refused = second
        .await
        .expect("a second request got the slot")
        .unwrap();
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    open.add_permits(1000);
    let res = long.await.unwrap().unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    res.into_body().collect().await.unwrap();
    // Given back once the body has been sent (by a spawned command: poll, bounded).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let res = app.clone().oneshot(get_as("u", None)).await.unwrap();
        if res.status() == StatusCode::OK {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the slot never came back"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
