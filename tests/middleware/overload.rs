//! The overload gate (`[overload]`, `ThrottleLayerBuilder::overload`): requests in flight past
//! its limit are shed with the configured status and a `Retry-After`; partitions keep their
//! shares for each other; a request counts until its response body ends; quotas enforced only
//! under pressure pass while there is none.

use std::sync::Arc;

use axum::body::{to_bytes, Body};
use axum::routing::get;
use axum::Router;
use http::{Request, Response, StatusCode};
use tokio::sync::Semaphore;
use tower::ServiceExt;
use tower_throttle::config::Config;
use tower_throttle::key::Global;
use tower_throttle::overload::{Overload, PartitionBy};
use tower_throttle::{Policy, Quota, ThrottleLayer};

/// A policy named `name` on route `/{name}`, one key for all, `quota`.
fn policy(name: &str, quota: Quota) -> Policy<Global> {
    Policy::builder(name)
        .route(format!("/{name}"))
        .key(Global)
        .quota(quota)
        .build()
        .unwrap()
}

/// An app whose `/hold/...` routes answer only when the test adds a permit to the semaphore it
/// returns, and whose other routes answer at once, behind `layer`.
fn app(layer: ThrottleLayer<Global, tower_throttle::MemoryBackend>) -> (Router, Arc<Semaphore>) {
    let release = Arc::new(Semaphore::new(0));
    let router = Router::new()
        .route("/paid", held(&release))
        .route("/free", held(&release))
        .route("/hold", held(&release))
        .route("/soft", get(|| async { "ok" }))
        .layer(layer);
    (router, release)
}

/// A `GET` route that answers only when the test adds a permit to `release`.
fn held(release: &Arc<Semaphore>) -> axum::routing::MethodRouter {
    let release = release.clone();
    get(move || {
        let release = release.clone();
        async move {
            release.acquire().await.unwrap().forget();
            "done"
        }
    })
}

fn get_(path: &str) -> Request<Body> {
    Request::get(path).body(Body::empty()).unwrap()
}

/// Starts a request that waits in the handler until released.
fn hold(app: &Router, path: &str) -> tokio::task::JoinHandle<Response<Body>> {
    let (app, request) = (app.clone(), get_(path));
    tokio::spawn(async move { app.oneshot(request).await.unwrap() })
}

/// Lets the tasks spawned so far reach the handler.
async fn settle() {
    for _ in 0..20 {
        tokio::task::yield_now().await;
    }
}

/// A fixed limit of `n` (no adaptation: its bounds are equal).
fn fixed(n: u32) -> Overload {
    Overload::aimd().limits(n, n)
}

#[tokio::test]
async fn requests_past_the_limit_are_shed_until_one_ends() {
    let layer = ThrottleLayer::builder()
        .policy(policy("hold", Quota::per_second(1_000)))
        .overload(fixed(2))
        .build()
        .unwrap();
    let gate = layer.overload().unwrap();
    assert_eq!(gate.limit(), 2);
    let (app, release) = app(layer.clone());
    let first = hold(&app, "/hold");
    let second = hold(&app, "/hold");
    settle().await;
    assert_eq!(layer.overload().unwrap().in_flight(), 2);
    let shed = app.clone().oneshot(get_("/hold")).await.unwrap();
    assert_eq!(shed.status(), StatusCode::SERVICE_UNAVAILABLE);
    let retry: u64 = shed.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(retry >= 1, "{retry}");
    assert_eq!(shed.headers()["content-type"], "application/problem+json");
    let body = to_bytes(shed.into_body(), 1 << 16).await.unwrap();
    assert!(
        String::from_utf8_lossy(&body).contains("overloaded"),
        "{body:?}"
    );
    // A request that was not shed is not counted once it is answered and its body read.
    let (gate, shed_count) = (
        layer.overload().unwrap(),
        layer.overload().unwrap().shed_of(0),
    );
    assert_eq!(shed_count, 1);
    assert_eq!(gate.in_flight(), 2);
    release.add_permits(1);
    let response = first.await.unwrap();
    // Answered, but its body has not ended: still in flight.
    assert_eq!(gate.in_flight(), 2);
    to_bytes(response.into_body(), 1 << 16).await.unwrap();
    assert_eq!(gate.in_flight(), 1);
    // Room again.
    let third = hold(&app, "/hold");
    settle().await;
    assert_eq!(gate.in_flight(), 2);
    release.add_permits(2);
    drop(second.await.unwrap()); // a body dropped unread ends the count too
    drop(third.await.unwrap());
    assert_eq!(gate.in_flight(), 0);
}

#[tokio::test]
async fn the_status_may_be_429_and_a_request_no_policy_matched_counts_too() {
    let layer = ThrottleLayer::builder()
        .policy(policy("soft", Quota::per_second(1_000)))
        .overload(fixed(1).status(StatusCode::TOO_MANY_REQUESTS))
        .build()
        .unwrap();
    let (app, release) = app(layer.clone());
    // `/hold` matches no policy: the gate counts it all the same.
    let held = hold(&app, "/hold");
    settle().await;
    let shed = app.clone().oneshot(get_("/soft")).await.unwrap();
    assert_eq!(shed.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(shed.headers().contains_key("retry-after"));
    release.add_permits(1);
    drop(held.await.unwrap());
    let fine = app.oneshot(get_("/soft")).await.unwrap();
    assert_eq!(fine.status(), StatusCode::OK);
}

#[tokio::test]
async fn a_refused_request_gives_its_place_back_at_once() {
    // A quota of one an hour: the second request is refused by its policy, after the gate
    // admitted it; its place is given back with the 429.
    let layer = ThrottleLayer::builder()
        .policy(policy("soft", Quota::per_hour(1)))
        .overload(fixed(1))
        .build()
        .unwrap();
    let (app, _) = app(layer.clone());
    let ok = app.clone().oneshot(get_("/soft")).await.unwrap();
    assert_eq!(ok.status(), StatusCode::OK);
    drop(ok);
    for _ in 0..3 {
        let limited = app.clone().oneshot(get_("/soft")).await.unwrap();
        assert_eq!(limited.status(), StatusCode::TOO_MANY_REQUESTS);
        drop(limited);
        assert_eq!(layer.overload().unwrap().in_flight(), 0);
    }
}

#[tokio::test]
async fn partitions_borrow_idle_shares_and_keep_an_active_ones() {
    let overload = fixed(4)
        .partition_by(PartitionBy::Policy)
        .partition("paid", 0.5)
        .partition("free", 0.5);
    let layer = ThrottleLayer::builder()
        .policies([
            policy("paid", Quota::per_second(1_000)),
            policy("free", Quota::per_second(1_000)),
        ])
        .overload(overload)
        .build()
        .unwrap();
    let gate = layer.overload().unwrap();
    assert_eq!(gate.partitions().collect::<Vec<_>>(), ["paid", "free"]);
    // A name no partition has is the last partition's.
    assert_eq!(gate.partition_of(Some("other")), 1);
    assert_eq!((gate.shed_of(0), gate.shed_of(1)), (0, 0));
    let (app, release) = app(layer.clone());
    // `paid` has never asked: `free` borrows its share, up to the limit.
    let free: Vec<_> = (0..4).map(|_| hold(&app, "/free")).collect();
    settle().await;
    assert_eq!((gate.in_flight_of(0), gate.in_flight_of(1)), (0, 4));
    // The limit is never exceeded, not even for a partition under its share...
    let shed = app.clone().oneshot(get_("/paid")).await.unwrap();
    assert_eq!(shed.status(), StatusCode::SERVICE_UNAVAILABLE);
    drop(shed);
    // ...but once a place frees, `paid` (active now, under its share) gets it, and `free`
    // (beyond its share) may not take what `paid` is owed.
    release.add_permits(1);
    let mut free = free.into_iter();
    drop(free.next().unwrap().await.unwrap());
    settle().await;
    assert_eq!(gate.in_flight(), 3);
    let paid = hold(&app, "/paid");
    settle().await;
    assert_eq!((gate.in_flight_of(0), gate.in_flight_of(1)), (1, 3));
    let refused = app.clone().oneshot(get_("/free")).await.unwrap();
    assert_eq!(refused.status(), StatusCode::SERVICE_UNAVAILABLE);
    drop(refused);
    assert_eq!(gate.shed_of(1), 1);
    assert_eq!(gate.shed_of(0), 1);
    release.add_permits(4);
    drop(paid.await.unwrap());
    for task in free {
        drop(task.await.unwrap());
    }
    assert_eq!(gate.in_flight(), 0);
}

#[tokio::test]
async fn a_quota_enforced_under_pressure_only_bites_while_the_service_is_pressed() {
    let soft = Policy::builder("soft")
        .route("/soft")
        .key(Global)
        .quota(Quota::per_hour(1))
        .under_pressure_only(true)
        .build()
        .unwrap();
    let layer = ThrottleLayer::builder()
        .policies([soft, policy("hold", Quota::per_second(1_000))])
        .overload(fixed(10))
        .build()
        .unwrap();
    let (app, release) = app(layer.clone());
    // No pressure: past its quota of one an hour, the route still answers.
    for _ in 0..3 {
        let response = app.clone().oneshot(get_("/soft")).await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
    }
    // Nine of ten places taken: under pressure, the quota bites (429, not a shed 503).
    let held: Vec<_> = (0..9).map(|_| hold(&app, "/hold")).collect();
    settle().await;
    assert_eq!(layer.overload().unwrap().in_flight(), 9);
    let limited = app.clone().oneshot(get_("/soft")).await.unwrap();
    assert_eq!(limited.status(), StatusCode::TOO_MANY_REQUESTS);
    release.add_permits(9);
    for task in held {
        drop(task.await.unwrap());
    }
}

/// Whether a quota enforced only under pressure bites is read once a request: the pressure the
/// backend was asked under (with the penalty that strikes a refusal, or without it) is the one its
/// answer is judged under, however the pressure changed while it decided. Otherwise a backend
/// that keeps penalties could strike a refusal that is not made, or a refusal be made unstruck.
#[tokio::test]
async fn a_request_is_judged_under_the_pressure_it_was_asked_under() {
    use std::future::Future;
    use std::pin::Pin;
    use std::sync::Mutex;
    use std::time::Duration;
    use tower_throttle::backend::{Adjustment, BackendError, Charges, Decisions, Uses};
    use tower_throttle::policy::Penalty;
    use tower_throttle::{Backend, Decision};

    /// Refuses every request, once the test adds a permit, as a backend that keeps penalties
    /// (Redis): `asked` records whether each was asked with its limit's penalty.
    #[derive(Clone)]
    struct Striking {
        answer: Arc<Semaphore>,
        asked: Arc<Mutex<Vec<bool>>>,
    }

    impl Backend for Striking {
        type Future = Pin<Box<dyn Future<Output = Result<Decisions, BackendError>> + Send>>;

        fn check(&self, charges: Charges<'_>) -> Self::Future {
            let limit = &charges.limits()[0];
            if limit.name() != "soft" {
                let admitted = Decision::allowed(1_000, 999, Duration::from_secs(1));
                return Box::pin(async move { Ok(Decisions::One(admitted)) });
            }
            self.asked.lock().unwrap().push(limit.penalty().is_some());
            let answer = self.answer.clone();
            Box::pin(async move {
                answer.acquire().await.unwrap().forget();
                let second = Duration::from_secs(1);
                Ok(Decisions::One(Decision::limited(
                    1,
                    0,
                    Some(second),
                    second,
                )))
            })
        }

        fn validate(
            &self,
            _: &[tower_throttle::Limit],
            _: Uses,
        ) -> Result<(), tower_throttle::BuildError> {
            Ok(())
        }

        fn adjust(&self, _: Charges<'_>, _: Adjustment<'_>) {}

        fn keeps_penalties(&self) -> bool {
            true
        }
    }

    // Pressure changes while the backend decides: from pressed to not (the held requests end),
    // and from not to pressed (they start).
    let cases = [(true, false), (false, false), (true, true), (false, true)];
    for (pressed_when_asked, extended) in cases {
        let backend = Striking {
            answer: Arc::new(Semaphore::new(0)),
            asked: Arc::default(),
        };
        let soft = Policy::builder("soft")
            .route("/soft")
            .key(Global)
            .quota(Quota::per_hour(1))
            .under_pressure_only(true)
            .penalty(Penalty::new(2, Duration::from_secs(60), Duration::from_secs(600)).unwrap());
        // Counting by outcome takes the extended path.
        let soft = match extended {
            true => soft.count_only(|_| true),
            false => soft,
        };
        let soft = soft.build().unwrap();
        let layer = ThrottleLayer::builder()
            .backend(backend.clone())
            .policies([soft, policy("hold", Quota::per_second(1_000))])
            .overload(fixed(20))
            .build()
            .unwrap();
        let release = Arc::new(Semaphore::new(0));
        let app = Router::new()
            .route("/hold", held(&release))
            .route("/soft", get(|| async { "ok" }))
            .layer(layer.clone());
        let gate = layer.overload().unwrap();
        // 18 of 20 in flight (with `/soft`'s own): under pressure.
        let holds = if pressed_when_asked { 18 } else { 0 };
        let mut holding: Vec<_> = (0..holds).map(|_| hold(&app, "/hold")).collect();
        settle().await;
        let soft = hold(&app, "/soft");
        settle().await;
        assert_eq!(*backend.asked.lock().unwrap(), [pressed_when_asked]);
        if pressed_when_asked {
            release.add_permits(18);
            for task in holding.drain(..) {
                drop(task.await.unwrap());
            }
            assert!(!gate.is_pressed());
        } else {
            holding = (0..17).map(|_| hold(&app, "/hold")).collect();
            settle().await;
            assert!(gate.is_pressed());
        }
        backend.answer.add_permits(1);
        let status = soft.await.unwrap().status();
        let expected = match pressed_when_asked {
            true => StatusCode::TOO_MANY_REQUESTS,
            false => StatusCode::OK,
        };
        let case = format!("pressed when asked: {pressed_when_asked}, extended: {extended}");
        assert_eq!(status, expected, "{case}");
        release.add_permits(holding.len());
        for task in holding {
            drop(task.await.unwrap());
        }
    }
}

#[test]
fn bad_options_fail_the_build_with_a_clear_error() {
    let build = |overload: Overload| {
        ThrottleLayer::builder()
            .policy(policy("a", Quota::per_second(1)))
            .overload(overload)
            .build()
            .map(drop)
            .unwrap_err()
            .to_string()
    };
    assert!(build(Overload::gradient().limits(0, 5)).contains("1 <= min <= max"));
    assert!(build(Overload::gradient().limits(9, 5)).contains("min 9 and max 5"));
    assert!(build(Overload::gradient().limits(1, 70_000)).contains("65535"));
    assert!(build(Overload::aimd().initial_limit(2_000)).contains("initial_limit 2000"));
    assert!(build(Overload::aimd().status(StatusCode::BAD_GATEWAY)).contains("429 or 503"));
    let shares = Overload::aimd().partition("a", 0.7).partition("b", 0.7);
    assert!(build(shares).contains("add up to 1.4"));
    let twice = Overload::aimd().partition("a", 0.2).partition("a", 0.2);
    assert!(build(twice).contains("unique"));
    assert!(build(Overload::aimd().partition("a", f64::NAN)).contains("share NaN"));
    assert!(build(Overload::aimd().partition("a", 0.0)).contains("share 0"));
    assert!(build(Overload::aimd().partition("a", 1.5)).contains("share 1.5"));
    let whole = Overload::aimd().partition("a", 0.8).partition("b", 0.2);
    assert!(whole.validate().is_ok(), "shares adding up to 1 exactly");
    let five = (0..5).fold(Overload::aimd(), |o, i| o.partition(format!("p{i}"), 0.1));
    assert!(build(five).contains("at most 4"));
    // A quota enforced only under pressure needs a gate to say when.
    let soft = Policy::builder("soft")
        .key(Global)
        .quota(Quota::per_second(1))
        .under_pressure_only(true)
        .build()
        .unwrap();
    let err = ThrottleLayer::builder().policy(soft).build().unwrap_err();
    assert!(
        err.to_string().contains("needs the layer's overload gate"),
        "{err}"
    );
    let dry = Policy::builder("dry")
        .key(Global)
        .quota(Quota::per_second(1))
        .under_pressure_only(true)
        .dry_run(true)
        .build()
        .unwrap_err();
    assert!(dry.to_string().contains("use one"), "{dry}");
}

#[test]
fn the_overload_table_configures_the_gate() {
    let toml = r#"
        [overload]
        algorithm = "aimd"
        min_limit = 8
        max_limit = 64
        initial_limit = 16
        partition_by = "tier"
        status = 429
        partitions = [{ name = "paid", share = 0.8 }, { name = "free", share = 0.2 }]

        [[route]]
        name = "api"
        key = "global"
        count = 100
        period = "1s"
        mode = "under-pressure"
        tier_header = "x-plan"

        [route.tiers.paid]
        count = 1000
        period = "1s"
    "#;
    let layer = Config::from_toml(toml).unwrap().memory_layer().unwrap();
    let gate = layer.overload().unwrap();
    assert_eq!(gate.limit(), 16);
    assert_eq!(gate.partitions().collect::<Vec<_>>(), ["paid", "free"]);
    // A partition but the last names a tier (or a policy) of the layer: a misspelled one is an
    // error, not requests left to the last partition.
    let typo = toml.replace("name = \"paid\"", "name = \"payd\"");
    let err = Config::from_toml(&typo)
        .unwrap()
        .memory_layer()
        .unwrap_err();
    assert!(err.to_string().contains("\"payd\" names no tier"), "{err}");
    let bad = |table: &str, expected: &str| {
        let toml = format!("[overload]\n{table}\n[[route]]\nname = \"a\"\nkey = \"global\"\ncount = 1\nperiod = \"1s\"\n");
        let err = Config::from_toml(&toml)
            .unwrap()
            .memory_layer()
            .unwrap_err();
        assert!(err.to_string().contains(expected), "{table}: {err}");
    };
    bad("algorithm = \"vegas\"", "\"gradient\" or \"aimd\"");
    bad("partition_by = \"route\"", "\"policy\" or \"tier\"");
    bad("status = 502", "429 or 503");
    bad("min_limit = 0", "1 <= min <= max");
    let typo = Config::from_toml("[overload]\nmax_limt = 5\n").unwrap_err();
    assert!(typo.to_string().contains("max_limt"), "{typo}");
    // A route enforced under pressure only, with no gate: refused at build.
    let toml = "[[route]]\nname = \"a\"\nkey = \"global\"\ncount = 1\nperiod = \"1s\"\nmode = \"under-pressure\"\n";
    let err = Config::from_toml(toml).unwrap().memory_layer().unwrap_err();
    assert!(err.to_string().contains("overload gate"), "{err}");
}

#[test]
fn shed_requests_are_counted_by_partition_apart_from_limited_ones() {
    use crate::support::{sample_or_zero, with_metrics};
    // Built before the recorder is installed: the gate's metrics are made on first use, as the
    // policies' are (they were no-ops then).
    let layer = ThrottleLayer::builder()
        .policies([
            policy("paid", Quota::per_second(1_000)),
            policy("soft", Quota::per_hour(1)),
        ])
        .overload(fixed(1).partition("paid", 0.5).partition("soft", 0.5))
        .build()
        .unwrap();
    let ((), page) = with_metrics(async move {
        let (app, release) = app(layer.clone());
        // One 200 and one 429 of its quota, then a request held: the next one is shed.
        for expected in [StatusCode::OK, StatusCode::TOO_MANY_REQUESTS] {
            let response = app.clone().oneshot(get_("/soft")).await.unwrap();
            assert_eq!(response.status(), expected);
        }
        let held = hold(&app, "/paid");
        settle().await;
        for _ in 0..2 {
            let shed = app.clone().oneshot(get_("/soft")).await.unwrap();
            assert_eq!(shed.status(), StatusCode::SERVICE_UNAVAILABLE);
        }
        release.add_permits(1);
        drop(held.await.unwrap());
    });
    let count = |series: &str| sample_or_zero(&page, series);
    assert_eq!(
        count("throttle_requests_shed_total{partition=\"soft\"}"),
        2.0,
        "{page}"
    );
    assert_eq!(
        count("throttle_requests_shed_total{partition=\"paid\"}"),
        0.0
    );
    assert_eq!(
        count("throttle_requests_limited_total{policy=\"soft\"}"),
        1.0
    );
    assert_eq!(count("throttle_overload_limit"), 1.0, "{page}");
}

/// `throttle_overload_in_flight` follows the count: one while a request is held, none once every
/// request has ended (it was set only as a sampling interval closed, before its request left).
#[test]
fn the_in_flight_gauge_follows_the_requests() {
    use crate::support::{sample_or_zero, with_metrics};
    let gauge = |page: &str| sample_or_zero(page, "throttle_overload_in_flight");
    let run = |hold_one: bool| {
        with_metrics(async move {
            let layer = ThrottleLayer::builder()
                .policy(policy("soft", Quota::per_second(1_000)))
                .overload(fixed(100))
                .build()
                .unwrap();
            let (app, release) = app(layer);
            // Past a sampling interval (ten requests and 25 ms).
            for _ in 0..12 {
                let response = app.clone().oneshot(get_("/soft")).await.unwrap();
                assert_eq!(response.status(), StatusCode::OK);
                tokio::time::sleep(std::time::Duration::from_millis(3)).await;
            }
            if hold_one {
                let held = hold(&app, "/hold");
                settle().await;
                std::mem::forget((held, release));
            }
        })
        .1
    };
    let ended = run(false);
    assert_eq!(gauge(&ended), 0.0, "{ended}");
    assert_eq!(gauge(&run(true)), 1.0);
}

/// Requests that begin and end on many threads at once leave the gauge at what is in flight (0),
/// not at a count one thread read before another's end (each wrote what it read).
#[test]
fn the_in_flight_gauge_reads_none_once_every_thread_is_done() {
    use crate::support::sample_or_zero;
    use tower_throttle::overload::Gate;
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
    let page = recorder.handle();
    let gate = Arc::new(Gate::new(&fixed(64)).unwrap());
    // The gate's gauges are made at its first admission, on this recorder.
    metrics::with_local_recorder(&recorder, || {
        assert!(gate.try_admit(0, 0));
        gate.finish(0, 0, 1, false);
    });
    let threads: Vec<_> = (0..8)
        .map(|_| {
            let gate = gate.clone();
            std::thread::spawn(move || {
                for i in 0..20_000 {
                    if gate.try_admit(0, i) {
                        gate.finish(0, i, i + 1, false);
                    }
                }
            })
        })
        .collect();
    threads.into_iter().for_each(|t| t.join().unwrap());
    assert_eq!(gate.in_flight(), 0);
    let gauge = sample_or_zero(&page.render(), "throttle_overload_in_flight");
    assert_eq!(gauge, 0.0);
}

/// A request the gate admitted and its quota refused is out of flight on the gauge too (it stayed
/// at 1 after a 429, with nothing in flight).
#[test]
fn the_in_flight_gauge_falls_back_after_a_refusal() {
    use crate::support::{sample_or_zero, with_metrics};
    let ((), page) = with_metrics(async {
        let layer = ThrottleLayer::builder()
            .policy(policy("soft", Quota::per_hour(1)))
            .overload(fixed(100))
            .build()
            .unwrap();
        let (app, _release) = app(layer);
        let served = app.clone().oneshot(get_("/soft")).await.unwrap();
        assert_eq!(served.status(), StatusCode::OK);
        drop(served);
        let refused = app.clone().oneshot(get_("/soft")).await.unwrap();
        assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    });
    assert_eq!(
        sample_or_zero(&page, "throttle_overload_in_flight"),
        0.0,
        "{page}"
    );
}

#[test]
fn a_finish_without_its_admission_takes_nothing_from_another_partition() {
    use tower_throttle::overload::Gate;
    let overload = fixed(10).partition("a", 0.5).partition("b", 0.5);
    let gate = Gate::new(&overload).unwrap();
    assert!(gate.try_admit(1, 0));
    // Partition 0 has nothing in flight: ending one there is a caller's mistake, not a borrow
    // from partition 1's count.
    gate.finish(0, 0, 1, false);
    assert_eq!((gate.in_flight_of(0), gate.in_flight_of(1)), (0, 1));
    gate.finish(1, 0, 1, false);
    assert_eq!(gate.in_flight(), 0);
    // Unvalidated options are an error, not a panic.
    let five = (0..5).fold(Overload::aimd(), |o, i| o.partition(format!("p{i}"), 0.1));
    assert!(Gate::new(&five).is_err());
}

/// A request counts in flight to the end of its body whatever way it goes: decided later (a
/// remote backend), holding a concurrency slot too, delayed, or on the extended path; and the
/// slot it holds beside is given back as before.
#[tokio::test]
async fn every_path_counts_in_flight_to_the_end_of_the_body() {
    use std::future::Future;
    use std::pin::Pin;
    use std::task::Poll;
    use std::time::Duration;
    use tower_throttle::backend::{Adjustment, BackendError, Charges, Decisions};
    use tower_throttle::{Algorithm, Backend, MemoryBackend};

    /// The memory backend; `.1`: pending when first polled (as Redis is).
    #[derive(Clone)]
    struct Later(MemoryBackend, bool);

    type Deciding = Pin<Box<dyn Future<Output = Result<Decisions, BackendError>> + Send>>;

    impl Backend for Later {
        type Future = Deciding;

        fn check(&self, charges: Charges<'_>) -> Deciding {
            let mut decided = Box::pin(self.0.check(charges));
            let mut pending = self.1;
            Box::pin(std::future::poll_fn(move |cx| {
                if std::mem::take(&mut pending) {
                    cx.waker().wake_by_ref();
                    return Poll::Pending;
                }
                decided.as_mut().poll(cx)
            }))
        }

        fn validate(
            &self,
            limits: &[tower_throttle::Limit],
            uses: tower_throttle::backend::Uses,
        ) -> Result<(), tower_throttle::BuildError> {
            self.0.validate(limits, uses)
        }

        fn adjust(&self, charges: Charges<'_>, adjustment: Adjustment<'_>) {
            self.0.adjust(charges, adjustment);
        }
    }

    let release = Arc::new(Semaphore::new(0));
    let build = |policy: Policy<Global>, deferred: bool| {
        ThrottleLayer::builder()
            .backend(Later(MemoryBackend::new(), deferred))
            .policy(policy)
            .overload(fixed(10))
            .build()
            .unwrap()
    };
    let policies = [
        // Decided later, plainly.
        policy("a", Quota::per_second(1_000)),
        // A concurrency limit: its slot and the count, given back together.
        Policy::builder("c")
            .key(Global)
            .quota(Quota::per_second(5))
            .algorithm(Algorithm::Concurrency)
            .build()
            .unwrap(),
        // Delay mode (a burst of one: the second request waits).
        Policy::builder("d")
            .key(Global)
            .quota(Quota::per_second(20).with_max_burst(0))
            .delay(Duration::from_secs(1))
            .build()
            .unwrap(),
        // The extended path: counted by its outcome.
        Policy::builder("e")
            .key(Global)
            .quota(Quota::per_second(1_000))
            .count_only(|_| true)
            .build()
            .unwrap(),
    ];
    for (policy, deferred) in policies.iter().flat_map(|p| [(p, true), (p, false)]) {
        let name = format!("{} (decided later: {deferred})", policy.name());
        let layer = build(policy.clone(), deferred);
        let app = Router::new()
            .route("/", held(&release))
            .layer(layer.clone());
        let tasks: Vec<_> = (0..2).map(|_| hold(&app, "/")).collect();
        tokio::time::sleep(Duration::from_millis(100)).await;
        let gate = layer.overload().unwrap();
        assert_eq!(gate.in_flight(), 2, "{name}: both in flight");
        release.add_permits(2);
        let mut bodies = Vec::new();
        for task in tasks {
            let response = task.await.unwrap();
            assert_eq!(response.status(), StatusCode::OK, "{name}");
            bodies.push(response.into_body());
        }
        assert_eq!(gate.in_flight(), 2, "{name}: answered, bodies not read");
        for body in bodies {
            to_bytes(body, 1 << 16).await.unwrap();
        }
        assert_eq!(gate.in_flight(), 0, "{name}: bodies read");
        if policy.name() == "c" {
            // The concurrency slots were given back with the counts: five fit again.
            let again: Vec<_> = (0..5).map(|_| hold(&app, "/")).collect();
            tokio::time::sleep(Duration::from_millis(100)).await;
            release.add_permits(5);
            for task in again {
                assert_eq!(task.await.unwrap().status(), StatusCode::OK, "{name}");
            }
        }
    }
}

/// What the gate learns from: the time from admission to the end of the response, of requests the
/// service answered — not of those the layer refused itself after the gate admitted them.
#[tokio::test]
async fn the_gate_learns_the_latency_of_served_requests_only() {
    use std::time::Duration;
    let layer = ThrottleLayer::builder()
        .policies([
            policy("slow", Quota::per_second(1_000_000)),
            policy("soft", Quota::per_hour(1)),
        ])
        .overload(fixed(64).partition("soft", 0.5).partition("slow", 0.5))
        .build()
        .unwrap();
    let app = Router::new()
        .route(
            "/slow",
            get(|| async {
                tokio::time::sleep(Duration::from_millis(20)).await;
                "slow"
            }),
        )
        .route("/soft", get(|| async { "ok" }))
        .layer(layer.clone());
    let gate = layer.overload().unwrap();
    assert_eq!(gate.latency(), Duration::ZERO);
    // Batches of served requests of 20 ms at least, until an interval has closed on them.
    for _ in 0..50 {
        let batch: Vec<_> = (0..10)
            .map(|_| app.clone().oneshot(get_("/slow")))
            .collect();
        for response in futures_util::future::join_all(batch).await {
            to_bytes(response.unwrap().into_body(), 64).await.unwrap();
        }
        if gate.latency() > Duration::ZERO {
            break;
        }
    }
    assert!(
        gate.latency() >= Duration::from_millis(20),
        "{:?}",
        gate.latency()
    );
    // Requests of `soft` past its quota: admitted by the gate, refused by the policy at once, for
    // longer than an interval. They teach the limit nothing (no sample), and give their place back.
    let until = std::time::Instant::now() + Duration::from_millis(200);
    let mut refused = 0;
    while std::time::Instant::now() < until {
        let response = app.clone().oneshot(get_("/soft")).await.unwrap();
        refused += usize::from(response.status() == StatusCode::TOO_MANY_REQUESTS);
        drop(response);
        assert_eq!((gate.in_flight_of(0), gate.in_flight_of(1)), (0, 0));
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    assert!(refused > 10, "{refused}");
    assert!(
        gate.latency() >= Duration::from_millis(20),
        "{:?}",
        gate.latency()
    );
}

/// Requests their clients give up on before the service answers teach the gate nothing: how
/// soon a client hangs up is no latency of the service's (a client resetting its requests after a
/// millisecond would otherwise read as a fast service, and the next normal latency as pressure).
#[tokio::test]
async fn requests_abandoned_before_the_answer_teach_the_gate_nothing() {
    use std::time::Duration;
    let layer = ThrottleLayer::builder()
        .policy(policy("slow", Quota::per_second(1_000_000)))
        .overload(fixed(64))
        .build()
        .unwrap();
    let slow = || async {
        tokio::time::sleep(Duration::from_millis(50)).await;
        "slow"
    };
    let app = Router::new()
        .route("/", get(slow))
        .route("/never", get(std::future::pending::<&str>))
        .layer(layer.clone());
    let gate = layer.overload().unwrap();
    // Longer than an interval (25 ms at the least) of requests dropped after 2 ms.
    let abandon = || async {
        let until = std::time::Instant::now() + Duration::from_millis(300);
        while std::time::Instant::now() < until {
            let batch = (0..10).map(|_| {
                let request = app.clone().oneshot(get_("/never"));
                tokio::time::timeout(Duration::from_millis(2), request)
            });
            futures_util::future::join_all(batch).await;
        }
        assert_eq!(gate.in_flight(), 0);
    };
    abandon().await;
    let latency = gate.latency();
    assert_eq!(latency, Duration::ZERO, "learned from abandoned requests");
    let learned = learned_latency(&app, gate, "/").await;
    assert!(learned >= Duration::from_millis(50), "{learned:?}");
    // Nor once it has learned the service's latency: they end sooner than that.
    abandon().await;
    let latency = gate.latency();
    assert!(latency >= Duration::from_millis(50), "{latency:?}");
    // But requests abandoned after longer than that say the service is at least that slow (a
    // service drowning while its clients time out).
    for _ in 0..20 {
        let batch = (0..10).map(|_| {
            let request = app.clone().oneshot(get_("/never"));
            tokio::time::timeout(Duration::from_millis(300), request)
        });
        futures_util::future::join_all(batch).await;
        if gate.latency() >= Duration::from_millis(150) {
            break;
        }
    }
    let latency = gate.latency();
    assert!(latency >= Duration::from_millis(150), "{latency:?}");
}

/// A router whose `path` answers in about a millisecond.
fn a_millisecond(path: &str) -> Router {
    let handler = || async {
        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        "ok"
    };
    Router::new().route(path, get(handler))
}

/// What `gate` learns of batches of ten requests to `path` on `app`, each read to its end as it
/// comes, once an interval has closed on them.
async fn learned_latency(
    app: &Router,
    gate: &tower_throttle::overload::Gate,
    path: &str,
) -> std::time::Duration {
    for _ in 0..20 {
        let batch = (0..10).map(|_| async {
            let response = app.clone().oneshot(get_(path)).await.unwrap();
            assert_eq!(response.status(), StatusCode::OK);
            to_bytes(response.into_body(), 64).await.unwrap();
        });
        futures_util::future::join_all(batch).await;
        if !gate.latency().is_zero() {
            break;
        }
    }
    gate.latency()
}

/// Route `/wait`: one request every 50 ms, the others waiting their turn (up to 2 s).
fn one_every_50_ms() -> Policy<Global> {
    Policy::builder("wait")
        .route("/wait")
        .key(Global)
        .quota(Quota::per_second(20).bursts_of(1))
        .delay(std::time::Duration::from_secs(2))
        .build()
        .unwrap()
}

/// A request delay mode makes wait teaches the gate the service's latency, not the wait: the
/// service's time starts when it is called (and the request still ends in its own partition).
#[tokio::test]
async fn the_gate_learns_the_service_latency_of_a_delayed_request_not_its_wait() {
    use std::time::Duration;
    let waits = one_every_50_ms();
    let layer = ThrottleLayer::builder()
        .policies([policy("soft", Quota::per_hour(1)), waits])
        .overload(fixed(64).partition("soft", 0.5).partition("wait", 0.5))
        .build()
        .unwrap();
    let app = a_millisecond("/wait").layer(layer.clone());
    let gate = layer.overload().unwrap();
    // Batches of ten, waiting 0 to 450 ms each: the handler's millisecond at least (not
    // nothing), and not the waits.
    let learned = learned_latency(&app, gate, "/wait").await;
    assert!(learned >= Duration::from_millis(1), "{learned:?}");
    assert!(
        learned < Duration::from_millis(40),
        "{learned:?}: the waits were learned"
    );
    assert_eq!((gate.in_flight_of(0), gate.in_flight_of(1)), (0, 0));
}

/// A delayed request whose client goes away while it waits teaches the gate nothing: its service
/// was never called, and its wait is not the service's latency.
#[tokio::test]
async fn a_request_dropped_while_it_waits_teaches_the_gate_nothing() {
    use std::time::Duration;
    let waits = one_every_50_ms();
    let layer = ThrottleLayer::builder()
        .policies([waits])
        .overload(fixed(64))
        .build()
        .unwrap();
    let app = a_millisecond("/wait").layer(layer.clone());
    let gate = layer.overload().unwrap();
    // Batches of ten waiting 0 to 450 ms, their clients gone after 100 ms: two served, eight
    // dropped while they wait (each a 100 ms latency, were it learned).
    for _ in 0..20 {
        let batch = (0..10).map(|_| async {
            let call = app.clone().oneshot(get_("/wait"));
            if let Ok(response) = tokio::time::timeout(Duration::from_millis(100), call).await {
                to_bytes(response.unwrap().into_body(), 64).await.unwrap();
            }
        });
        futures_util::future::join_all(batch).await;
        if !gate.latency().is_zero() {
            break;
        }
        // The waits of the dropped requests drain: the next batch starts afresh.
        tokio::time::sleep(Duration::from_millis(450)).await;
    }
    // The two served requests' millisecond (learned: the loop ended), not the 100 ms waits.
    let learned = gate.latency();
    assert!(
        learned < Duration::from_millis(20),
        "{learned:?}: the dropped requests' waits were learned"
    );
    assert_eq!(gate.in_flight(), 0);
}

/// A request whose backend is slow to decide (a Redis over a slow link), or that takes the
/// extended path while it waits, teaches the gate the service's latency, not the backend's.
#[tokio::test]
async fn the_gate_learns_the_service_latency_not_a_slow_backend_s() {
    use std::future::Future;
    use std::pin::Pin;
    use std::time::Duration;
    use tower_throttle::backend::{BackendError, Charges, Decisions, Uses};
    use tower_throttle::{Backend, MemoryBackend};

    /// The memory backend, deciding 100 ms late.
    #[derive(Clone)]
    struct Slow(MemoryBackend);

    impl Backend for Slow {
        type Future = Pin<Box<dyn Future<Output = Result<Decisions, BackendError>> + Send>>;

        fn check(&self, charges: Charges<'_>) -> Self::Future {
            let decided = self.0.check(charges);
            Box::pin(async move {
                tokio::time::sleep(Duration::from_millis(100)).await;
                decided.await
            })
        }

        fn validate(
            &self,
            limits: &[tower_throttle::Limit],
            uses: Uses,
        ) -> Result<(), tower_throttle::BuildError> {
            self.0.validate(limits, uses)
        }

        fn adjust(
            &self,
            charges: Charges<'_>,
            adjustment: tower_throttle::backend::Adjustment<'_>,
        ) {
            self.0.adjust(charges, adjustment);
        }
    }

    let plain = policy("a", Quota::per_second(1_000));
    let extended = Policy::builder("e")
        .key(Global)
        .quota(Quota::per_second(1_000))
        .count_only(|_| true)
        .build()
        .unwrap();
    for policy in [plain, extended] {
        let layer = ThrottleLayer::builder()
            .backend(Slow(MemoryBackend::new()))
            .policy(policy)
            .overload(fixed(64))
            .build()
            .unwrap();
        let app = a_millisecond("/").layer(layer.clone());
        let learned = learned_latency(&app, layer.overload().unwrap(), "/").await;
        assert!(learned >= Duration::from_millis(1), "{learned:?}");
        assert!(
            learned < Duration::from_millis(40),
            "{learned:?}: the backend's wait was learned"
        );
        assert_eq!(layer.overload().unwrap().in_flight(), 0);
    }
}

/// The gate's own API with a clock of the caller's: pressure lasts a second after a shed; a
/// partition out of range is the last one; the shares read back.
#[test]
fn pressure_lasts_a_second_after_a_shed_and_partitions_are_clamped() {
    use tower_throttle::overload::Gate;
    let second = 1_000_000_000;
    let gate = Gate::new(&fixed(10).partition("a", 0.25).partition("b", 0.75)).unwrap();
    assert_eq!(
        (gate.share_of(0), gate.share_of(1), gate.share_of(2)),
        (0.25, 0.75, 0.0)
    );
    for _ in 0..10 {
        assert!(gate.try_admit(1, second));
    }
    assert!(!gate.try_admit(0, second));
    for _ in 0..10 {
        gate.finish(1, second, second + 1_000, false);
    }
    assert_eq!(gate.in_flight(), 0);
    // Nothing in flight, but a request was shed a moment ago: under pressure for a second.
    assert!(gate.pressed(second + second / 2));
    assert!(!gate.pressed(3 * second));
    // A partition past the last is the last one, admitted and finished alike.
    assert!(gate.try_admit(7, 3 * second));
    assert_eq!(gate.in_flight_of(1), 1);
    gate.finish(9, 3 * second, 3 * second + 1, false);
    assert_eq!(gate.in_flight(), 0);
    // A limit of one is under pressure with its one request in flight, not idle.
    let one = Gate::new(&fixed(1)).unwrap();
    assert!(!one.pressed(second));
    assert!(one.try_admit(0, second));
    assert!(one.pressed(second));
}

/// An AIMD gate cuts its limit when requests fail — the service's error or its body's — and not
/// when they are served, however many: a failure is a drop, whatever its latency.
#[tokio::test]
async fn an_aimd_gate_cuts_its_limit_on_failed_requests_only() {
    use std::time::Duration;
    #[derive(Clone, Copy, Debug)]
    enum End {
        Served,
        ServiceError,
        BodyError,
    }
    for end in [End::Served, End::ServiceError, End::BodyError] {
        let layer = ThrottleLayer::builder()
            .policies([
                policy("other", Quota::per_second(1)),
                policy("all", Quota::per_second(1_000_000)),
            ])
            // Its requests in the second partition: a failure ends in its own.
            .overload(
                Overload::aimd()
                    .limits(4, 100)
                    .initial_limit(40)
                    .partition("other", 0.5)
                    .partition("all", 0.5),
            )
            .build()
            .unwrap();
        let gate = layer.overload().unwrap();
        let service = tower::ServiceBuilder::new()
            .layer(layer.clone())
            .service_fn(move |_: Request<Body>| async move {
                let body = match end {
                    End::ServiceError => return Err(std::io::Error::other("down")),
                    End::BodyError => {
                        Body::from_stream(futures_util::stream::iter([
                            Err::<axum::body::Bytes, _>(std::io::Error::other("cut")),
                        ]))
                    }
                    End::Served => Body::from("ok"),
                };
                Ok(Response::new(body))
            });
        // Rounds of twelve requests, one at a time, each a sampling interval (25 ms) apart.
        for _ in 0..8 {
            for _ in 0..12 {
                if let Ok(response) = service.clone().oneshot(get_("/all")).await {
                    let _ = to_bytes(Body::new(response.into_body()), 64).await;
                }
            }
            tokio::time::sleep(Duration::from_millis(30)).await;
        }
        assert_eq!(
            (gate.in_flight_of(0), gate.in_flight_of(1)),
            (0, 0),
            "{end:?}"
        );
        // Their latency, from their admission: well under a second.
        assert!(gate.latency() < Duration::from_secs(1), "{end:?}");
        match end {
            End::Served => assert_eq!(gate.limit(), 40, "{end:?}"),
            _ => assert!(gate.limit() < 40, "{end:?}: {}", gate.limit()),
        }
    }
}

#[tokio::test]
async fn a_grpc_layer_sheds_with_a_grpc_status_and_pushback() {
    for (status, code) in [
        (StatusCode::SERVICE_UNAVAILABLE, "14"), // UNAVAILABLE
        (StatusCode::TOO_MANY_REQUESTS, "8"),    // RESOURCE_EXHAUSTED
    ] {
        let layer = ThrottleLayer::builder()
            .policy(policy("hold", Quota::per_second(1_000)))
            .overload(fixed(1).status(status))
            .grpc()
            .build()
            .unwrap();
        let (app, release) = app(layer.clone());
        let held = hold(&app, "/hold");
        settle().await;
        let shed = app.clone().oneshot(get_("/hold")).await.unwrap();
        // Trailers-only: HTTP 200, the outcome in `grpc-status`, the wait in both headers.
        assert_eq!(shed.status(), StatusCode::OK);
        assert_eq!(shed.headers()["content-type"], "application/grpc");
        assert_eq!(shed.headers()["grpc-status"], code);
        assert!(shed.headers()["grpc-message"]
            .to_str()
            .unwrap()
            .contains("overloaded"));
        let seconds: u64 = shed.headers()["retry-after"]
            .to_str()
            .unwrap()
            .parse()
            .unwrap();
        let pushback: u64 = shed.headers()["grpc-retry-pushback-ms"]
            .to_str()
            .unwrap()
            .parse()
            .unwrap();
        assert!(seconds >= 1 && pushback <= seconds * 1000 && pushback > (seconds - 1) * 1000);
        assert_eq!(layer.overload().unwrap().shed_of(0), 1);
        release.add_permits(1);
        drop(held.await.unwrap());
    }
}
