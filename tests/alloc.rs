//! What the layer allocates for an admitted request on the plain path (memory backend, a synchronous
//! key, a static quota, RateLimit header fields on), counted by a global allocator that counts the
//! allocations of the thread that makes them.
//!
//! The same requests go through the inner service alone and through the layer around it; the
//! layer's own code (`Throttle::call`, its response future, the header fields it adds) must add no
//! allocation at all. Whatever the inner service and the request need is in both counts.
//!
//! Its own test binary: a `#[global_allocator]` is per binary, and no other test should pay for
//! the counting.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::pin;
use std::task::{Context, Poll, Waker};

use bytes::Bytes;
use http::{HeaderValue, Request, Response};
use http_body_util::Full;
use tower::{Layer, Service};
use tower_throttle::key::{Header, KeyExtractor, PeerAddr, PeerIp};
use tower_throttle::policy::Condition;
use tower_throttle::{Policy, PolicyBuilder, Quota, ThrottleLayer};

/// Counts allocations (and reallocations, which may move) on the calling thread, then defers to the
/// system allocator.
struct Counting;

thread_local! {
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

fn count() {
    // `try_with`: a thread's last deallocations may come after its thread-locals are gone (only
    // allocations are counted, but be safe).
    let _ = ALLOCATIONS.try_with(|n| n.set(n.get() + 1));
}

fn allocations() -> u64 {
    ALLOCATIONS.with(Cell::get)
}

// SAFETY: every call goes to `System` unchanged; counting touches only a const thread-local `Cell`,
// which never allocates.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count();
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count();
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count();
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// A hello-world answer as axum's would be: a body and two header fields (only `Content-Type` if
/// not `length`).
fn hello(length: bool) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from_static(b"Hello, World!")));
    let headers = response.headers_mut();
    headers.insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    if length {
        headers.insert(http::header::CONTENT_LENGTH, HeaderValue::from_static("13"));
    }
    response
}

/// The request of client `i` (one of 200 peers, each with its own key), made before counting.
fn request(i: u32) -> Request<()> {
    let mut request = Request::get("/hello?plan=pro")
        .header("x-user-id", HeaderValue::from_static("user-17"))
        .body(())
        .unwrap();
    let peer = SocketAddr::from(([10, 0, 0, (i % 200) as u8 + 1], 40_000));
    request.extensions_mut().insert(PeerAddr(peer));
    request
}

/// The allocations the calls of `service` (each request's call, polling its response future to the
/// end, reading the response's header fields) make for `n` requests; the requests are built and the
/// responses dropped outside the count.
fn allocations_of<S, B>(service: &mut S, n: u32) -> u64
where
    S: Service<Request<()>, Response = Response<B>, Error = Infallible>,
{
    let mut counted = 0;
    let mut cx = Context::from_waker(Waker::noop());
    for i in 0..n {
        let request = request(i);
        let before = allocations();
        let response = {
            let mut future = pin!(service.call(request));
            match future.as_mut().poll(&mut cx) {
                Poll::Ready(response) => response.unwrap(),
                Poll::Pending => panic!("the memory backend and the inner service answer at once"),
            }
        };
        counted += allocations() - before;
        assert!(response.status().is_success(), "request {i} was admitted");
        drop(response);
    }
    counted
}

/// An admission with `key`: the layer adds no allocation to the inner service's. `tune`: what else
/// the policy has (a near-limit ratio, a condition).
fn adds_nothing<K: KeyExtractor<()> + Clone>(
    key: K,
    legacy: bool,
    tune: impl FnOnce(PolicyBuilder<K>) -> PolicyBuilder<K>,
    what: &str,
) {
    adds_nothing_behind(key, legacy, tune, None, what);
}

/// [`adds_nothing`], behind an overload gate if `overload` is one.
fn adds_nothing_behind<K: KeyExtractor<()> + Clone>(
    key: K,
    legacy: bool,
    tune: impl FnOnce(PolicyBuilder<K>) -> PolicyBuilder<K>,
    overload: Option<tower_throttle::overload::Overload>,
    what: &str,
) {
    // With the legacy fields, five fields of the layer's and two of the answer's are more than the
    // 6 a `HeaderMap` first makes room for: it grows (twice, without the layer's `reserve`), which is
    // the map's own cost, not the layer's; one field of the answer's keeps the map at its size.
    let inner =
        tower::service_fn(move |_: Request<()>| async move { Ok::<_, Infallible>(hello(!legacy)) });
    let policy = Policy::builder("api")
        // Never runs out during the test: every request is admitted.
        .quota(Quota::per_second(1_000_000_000).with_max_burst(1_000_000_000))
        .key(key);
    let policy = tune(policy).build().unwrap();
    let mut layer = ThrottleLayer::builder()
        .policy(policy)
        .ratelimit_headers(true)
        .legacy_headers(legacy);
    if let Some(overload) = overload {
        layer = layer.overload(overload);
    }
    let layer = layer.build().unwrap();
    let mut bare = inner;
    let mut throttled = layer.layer(inner);
    // Warm up both: the keys' entries in the store, lazily made shared values, the thread's state.
    allocations_of(&mut bare, 1_000);
    allocations_of(&mut throttled, 1_000);
    let n = 10_000;
    let without = allocations_of(&mut bare, n);
    let with = allocations_of(&mut throttled, n);
    // A response that carries the fields (the test would pass vacuously without them).
    let mut cx = Context::from_waker(Waker::noop());
    let Poll::Ready(Ok(response)) = pin!(throttled.call(request(0))).poll(&mut cx) else {
        panic!("answered at once");
    };
    assert!(response.headers().contains_key("ratelimit"), "{what}");
    assert!(
        response.headers().contains_key("ratelimit-policy"),
        "{what}"
    );
    assert_eq!(
        response.headers().contains_key("x-ratelimit-limit"),
        legacy,
        "{what}"
    );
    assert_eq!(
        with.saturating_sub(without),
        0,
        "{what}: {n} admitted requests made {without} allocations without the layer and {with} \
         with it ({:.2} a request more)",
        (with as f64 - without as f64) / f64::from(n)
    );
}

#[test]
fn an_admitted_request_on_a_peer_ip_key_allocates_nothing_in_the_layer() {
    adds_nothing(PeerIp::new(), false, |p| p, "peer IP key");
}

#[test]
fn an_admitted_request_on_a_header_key_allocates_nothing_in_the_layer() {
    adds_nothing(Header::new("x-user-id"), false, |p| p, "header key");
}

#[test]
fn the_legacy_fields_allocate_nothing_in_the_layer_either() {
    adds_nothing(
        PeerIp::new(),
        true,
        |p| p,
        "peer IP key, X-RateLimit-* fields on",
    );
}

/// A request admitted by a policy with a near-limit rule is judged (a verdict is made: not a plain
/// admission), and the layer still allocates nothing for one that comes near no limit: no slot to
/// give back (so no releaser), no `PolicyDecision`, no limit to name.
#[test]
fn an_admission_that_is_judged_allocates_nothing_in_the_layer_either() {
    let near = |p: PolicyBuilder<PeerIp>| p.near_limit(0.9);
    adds_nothing(PeerIp::new(), false, near, "near-limit rule, near no limit");
}

/// A policy that applies to requests with a query parameter, whatever its value, finds it
/// without decoding the value.
#[test]
fn a_query_present_condition_allocates_nothing_in_the_layer_either() {
    let plan = |p: PolicyBuilder<PeerIp>| p.when(Condition::query_present("plan"));
    adds_nothing(PeerIp::new(), false, plan, "a query_present condition");
}

/// Behind an overload gate, an admitted request counts in flight with no allocation either (the
/// count is held as a concurrency slot is, and the gate's limit is far above the load).
#[test]
fn an_admission_through_the_overload_gate_allocates_nothing_in_the_layer_either() {
    let gate = tower_throttle::overload::Overload::gradient().limits(10_000, 10_000);
    adds_nothing_behind(PeerIp::new(), false, |p| p, Some(gate), "an overload gate");
}
