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
//! - `overrides_10k_exact`: 10,000 overrides of other keys (the key is looked up once, found in
//!   none; the policy's requests take the extended path while it has any override).
//! - `overridden_of_10k`: the key's own quota override, one of 10,000.
//! - `patterns_10k`: 10,000 patterns (`MAX_OVERRIDE_PATTERNS`), none matching.

use std::hint::black_box;
use std::time::Duration;

use bytes::Bytes;
use criterion::{criterion_group, criterion_main, Criterion};
use http::{Request, Response};
use http_body_util::Empty;
use tower::{Service, ServiceExt};
use tower_throttle::key::Header;
use tower_throttle::ops::Override;
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

/// The overrides a variant sets: the `i`th's key, and whether it is the requests' own (`alice`).
type Setup = Option<fn(usize) -> (String, bool)>;

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
    let big = Override::Quota(Quota::cl_throttle(
        9_999_999,
        1000,
        Duration::from_secs(3600),
    ));
    let overrides: [(&str, Setup); 4] = [
        ("plain", None),
        ("overrides_10k_exact", Some(|i| (format!("user{i}"), false))),
        ("overridden_of_10k", Some(|i| (format!("user{i}"), i == 0))),
        ("patterns_10k", Some(|i| (format!("p{i}_*"), false))),
    ];
    let variants = variants
        .into_iter()
        .map(|(name, policy)| (name, policy, None))
        .chain(
            overrides
                .into_iter()
                .skip(1)
                .map(|(name, setup)| (name, variants[0].1, setup)),
        );
    for (name, policy, setup) in variants {
        let layer = ThrottleLayer::builder()
            .backend(MemoryBackend::new())
            .policy(policy())
            .build()
            .unwrap();
        if let Some(setup) = setup {
            let handle = layer.handle();
            rt.block_on(async {
                for i in 0..10_000 {
                    let (key, is_alice) = setup(i);
                    let key = if is_alice { "alice".to_owned() } else { key };
                    handle.set_override("api", &key, big).await.unwrap();
                }
            });
        }
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
