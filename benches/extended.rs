//! The layer's work per request (memory backend, one hot key, always admitted, a trivial inner
//! service): the fast path, and the extended path of per-customer quotas and counting by outcome.
//!
//! ```text
//! cargo bench --bench extended
//! ```
//!
//! - `plain`: a policy that uses none of the per-request features (the fast path: their cost is one
//!   `Option` check).
//! - `count_only`: counting by outcome (every response counts, so nothing is refunded).
//! - `quota_from`: a per-customer quota closure (returning `None`: the default quota).

use std::hint::black_box;
use std::time::Duration;

use bytes::Bytes;
use criterion::{criterion_group, criterion_main, Criterion};
use http::{Request, Response};
use http_body_util::Empty;
use tower::{Service, ServiceExt};
use tower_throttle::key::Header;
use tower_throttle::{MemoryBackend, Policy, PolicyBuilder, Quota, ThrottleLayer};

fn base() -> PolicyBuilder<Header> {
    Policy::builder("api")
        .key(Header::new("x-user-id"))
        .quota(Quota::cl_throttle(
            9_999_999,
            1000,
            Duration::from_secs(3600),
        ))
}

/// A variant: its name and its policy.
type Variant = (&'static str, fn() -> Policy<Header>);

fn layer_paths(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut g = c.benchmark_group("layer");
    let variants: [Variant; 3] = [
        ("plain", || base().build().unwrap()),
        ("count_only", || {
            base().count_only(|_| true).build().unwrap()
        }),
        ("quota_from", || {
            base().quota_from(|_, _| None).build().unwrap()
        }),
    ];
    for (name, policy) in variants {
        let layer = ThrottleLayer::builder()
            .backend(MemoryBackend::new())
            .policy(policy())
            .build()
            .unwrap();
        let inner = tower::service_fn(|_: Request<()>| async {
            Ok::<_, std::convert::Infallible>(Response::new(Empty::<Bytes>::new()))
        });
        let mut svc = tower::Layer::layer(&layer, inner);
        g.bench_function(name, |b| {
            b.iter(|| {
                rt.block_on(async {
                    let req = Request::get("/")
                        .header("x-user-id", "alice")
                        .body(())
                        .unwrap();
                    let res = svc.ready().await.unwrap().call(req).await.unwrap();
                    black_box(res.status())
                })
            })
        });
    }
    g.finish();
}

criterion_group!(benches, layer_paths);
criterion_main!(benches);
