//! One request through the layer's service (`Throttle::call` and its ready response future) on the
//! memory backend, with a trivial inner service: the whole per-request path of the middleware.
//!
//! ```text
//! cargo bench --bench layer
//! LAYER_BENCH_ITERS=120000 valgrind --tool=callgrind target/release/deps/layer-<hash>
//! ```
//!
//! - `admit`: a key with room left (a quota that never runs out during the bench).
//! - `reject`: a key over its limit (the 429 path).
//! - `admit/reloading`: as `admit`, while another thread reloads the layer's policies without
//!   pause (the cost of noticing a new table: the next load reads the new one; a layer never
//!   reloaded reads its first table in place, with no load).
//!
//! `admit` and `reject` use only the API that predates reloads, so they measure an older tree
//! too: copy this file into that tree's `benches/` without `reloading` and compare the two runs
//! (the hot-path cost of reloads that are never used).

use std::convert::Infallible;
use std::future::Future;
use std::hint::black_box;
use std::pin::pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::Bytes;
use criterion::{criterion_group, Criterion};
use http::{Request, Response};
use http_body_util::Empty;
use tower::{Layer, Service};
use tower_throttle::key::Header;
use tower_throttle::{Policy, Quota, ThrottleLayer};

fn policy(count: u64, burst: u64) -> Policy<Header> {
    Policy::builder("bench")
        .quota(Quota::per_second(count).with_max_burst(burst))
        .key(Header::new("x-user-id"))
        .build()
        .unwrap()
}

/// Calls the service once and polls its response future to the end (it is ready at once: the memory
/// backend decides in the call, and the inner service answers in its first poll).
fn one<S>(service: &mut S, user: &'static str) -> u16
where
    S: Service<Request<()>, Response = Response<tower_throttle::body::ThrottleBody<Empty<Bytes>>>>,
    S::Error: std::fmt::Debug,
{
    let request = Request::get("/")
        .header("x-user-id", user)
        .body(())
        .unwrap();
    let mut future = pin!(service.call(request));
    let mut cx = Context::from_waker(Waker::noop());
    match future.as_mut().poll(&mut cx) {
        Poll::Ready(response) => response.unwrap().status().as_u16(),
        Poll::Pending => unreachable!("the memory backend and the inner service are ready at once"),
    }
}

fn layer(c: &mut Criterion) {
    let inner = tower::service_fn(|_: Request<()>| async {
        Ok::<_, Infallible>(Response::new(Empty::<Bytes>::new()))
    });
    let throttle = ThrottleLayer::new(policy(1_000_000_000, 1_000_000_000));
    let mut service = throttle.layer(inner);
    let mut g = c.benchmark_group("layer");
    g.bench_function("admit", |b| b.iter(|| black_box(one(&mut service, "room"))));
    // Spend one key's quota (1 a second, burst 1): every later call is the 429 path.
    let strict = ThrottleLayer::builder()
        .policy(policy(1, 0))
        .build()
        .unwrap();
    let mut strict_service = strict.layer(inner);
    one(&mut strict_service, "spent");
    g.bench_function("reject", |b| {
        b.iter(|| black_box(one(&mut strict_service, "spent")))
    });
    g.finish();
    reloading(c, &throttle, inner);
}

fn reloading<S>(
    c: &mut Criterion,
    throttle: &ThrottleLayer<Header, tower_throttle::MemoryBackend>,
    inner: S,
) where
    S: Service<Request<()>, Response = Response<Empty<Bytes>>, Error = Infallible> + Clone,
{
    let handle = throttle.handle();
    let stop = Arc::new(AtomicBool::new(false));
    let reloader = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut reloads = 0u64;
            while !stop.load(Ordering::Relaxed) {
                handle
                    .reload([policy(1_000_000_000, 1_000_000_000)])
                    .unwrap();
                reloads += 1;
            }
            reloads
        })
    };
    let mut service = throttle.layer(inner);
    c.bench_function("layer/admit/reloading", |b| {
        b.iter(|| black_box(one(&mut service, "room")))
    });
    stop.store(true, Ordering::Relaxed);
    let reloads = reloader.join().unwrap();
    eprintln!("layer/admit/reloading: {reloads} reloads during the run");
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3));
    targets = layer
}
/// `LAYER_BENCH_ITERS=n`: `n` admitted requests through the layer and nothing else, for counting
/// instructions (callgrind), which a busy machine does not disturb as it
/// does times.
fn main() {
    if let Some(iterations) = std::env::var("LAYER_BENCH_ITERS")
        .ok()
        .and_then(|n| n.parse::<u64>().ok())
    {
        let inner = tower::service_fn(|_: Request<()>| async {
            Ok::<_, Infallible>(Response::new(Empty::<Bytes>::new()))
        });
        let mut service = ThrottleLayer::new(policy(1_000_000_000, 1_000_000_000)).layer(inner);
        // LAYER_BENCH_CLONE=1: a clone of the service per request, as axum's router makes.
        let clone_each = std::env::var_os("LAYER_BENCH_CLONE").is_some();
        // LAYER_BENCH_THREADS=t: t threads at once (clones of one service), wall time printed.
        if let Some(threads) = std::env::var("LAYER_BENCH_THREADS")
            .ok()
            .and_then(|t| t.parse::<u64>().ok())
        {
            let started = std::time::Instant::now();
            std::thread::scope(|scope| {
                for _ in 0..threads {
                    let mut service = service.clone();
                    scope.spawn(move || {
                        for _ in 0..iterations {
                            let status = if clone_each {
                                one(&mut service.clone(), "room")
                            } else {
                                one(&mut service, "room")
                            };
                            assert_eq!(status, 200);
                        }
                    });
                }
            });
            let per_request = started.elapsed().as_nanos() as u64 / (iterations * threads);
            println!("{per_request} ns per request (wall / requests), {threads} threads");
            return;
        }
        let admitted = (0..iterations)
            .filter(|_| {
                if clone_each {
                    one(&mut service.clone(), "room") == 200
                } else {
                    one(&mut service, "room") == 200
                }
            })
            .count();
        assert_eq!(admitted as u64, iterations);
        return;
    }
    benches();
    Criterion::default().configure_from_args().final_summary();
}
