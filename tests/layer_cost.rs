//! The per-request cost of the layer on the plain path (one GCRA policy, memory backend, admitted),
//! in batches, so that one run gives a median rather than one number:
//!
//! ```text
//! cargo test --release --all-features --test layer_cost -- --nocapture
//! ```
//!
//! Prints heap allocations per request (a counting global allocator), the size of the response
//! future, and ns/request for 31 batches of 20 000 requests (median, min, max), through
//! `ThrottleLayer::new(policy)` over a `service_fn`, and the same `service_fn` bare (the difference is
//! the layer). Same method as the review's tests/alloc_bench.rs.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use tower::{Service, ServiceBuilder, ServiceExt};
use tower_throttle::key::Global;
use tower_throttle::{Policy, Quota, ThrottleLayer};

struct Counting;
static ALLOCS: AtomicUsize = AtomicUsize::new(0);
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        System.alloc(l)
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        System.dealloc(p, l)
    }
}
#[global_allocator]
static A: Counting = Counting;

const BATCHES: usize = 31;
const PER_BATCH: usize = 20_000;

async fn measure<S, B>(label: &str, mut svc: S)
where
    S: Service<Request<()>, Response = Response<B>>,
    S::Error: std::fmt::Debug,
{
    for _ in 0..5_000 {
        drop(svc.ready().await.unwrap().call(Request::new(())).await.unwrap());
    }
    let mut ns = Vec::with_capacity(BATCHES);
    let before = ALLOCS.load(Ordering::Relaxed);
    for _ in 0..BATCHES {
        let t = Instant::now();
        for _ in 0..PER_BATCH {
            let r = svc.ready().await.unwrap().call(Request::new(())).await.unwrap();
            drop(r);
        }
        ns.push(t.elapsed().as_nanos() as f64 / PER_BATCH as f64);
    }
    let allocs = (ALLOCS.load(Ordering::Relaxed) - before) as f64 / (BATCHES * PER_BATCH) as f64;
    ns.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let size = std::mem::size_of_val(&svc.ready().await.unwrap().call(Request::new(())));
    println!(
        "{label}: allocs/request {allocs:.2}, future {size} B, ns/request median {:.1} min {:.1} max {:.1}",
        ns[BATCHES / 2],
        ns[0],
        ns[BATCHES - 1]
    );
}

fn hello(_r: Request<()>) -> impl std::future::Future<Output = Result<Response<Full<Bytes>>, std::convert::Infallible>> {
    async { Ok(Response::new(Full::new(Bytes::new()))) }
}

#[tokio::test]
async fn layer_cost() {
    let policy = Policy::builder("p")
        .quota(Quota::per_second(1_000_000_000))
        .key(Global)
        .build()
        .unwrap();
    // Alternate, so that both halves see the same interference.
    for round in 0..3 {
        measure(
            &format!("round {round} bare    "),
            ServiceBuilder::new().service_fn(hello),
        )
        .await;
        measure(
            &format!("round {round} throttle"),
            ServiceBuilder::new()
                .layer(ThrottleLayer::new(policy.clone()))
                .service_fn(hello),
        )
        .await;
    }
}
