//! `Config::from_toml` on arbitrary text, then everything that validates it.
//!
//! Invariants: parsing, `policies()`, `client_ip()`, `on_error()`, `memory_layer()` and each route's
//! `policy()` never panic (errors are fine); a layer that builds answers requests (to the routes'
//! own paths, from an IPv4 and an IPv6 peer, with and without a key header) without panicking, with
//! 200, 429 or a 4xx for a missing key.
#![no_main]

use std::future::Future;
use std::net::SocketAddr;
use std::pin::pin;
use std::task::{Context, Poll, Waker};

use http::{Method, Request, Response, StatusCode};
use libfuzzer_sys::fuzz_target;
use tower::{Layer, ServiceExt};
use tower_throttle::config::Config;
use tower_throttle::key::PeerAddr;

fn ready<F: Future>(future: F) -> Option<F::Output> {
    let mut future = pin!(future);
    let mut cx = Context::from_waker(Waker::noop());
    for _ in 0..16 {
        if let Poll::Ready(out) = future.as_mut().poll(&mut cx) {
            return Some(out);
        }
    }
    None
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(config) = Config::from_toml(text) else {
        return;
    };
    let _ = config.backend.to_string();
    let _ = config.client_ip();
    let _ = config.on_error();
    let policies = config.policies();
    for route in &config.routes {
        let _ = route.policy();
    }
    let layer = config.memory_layer();
    if let (Ok(policies), Ok(layer)) = (&policies, &layer) {
        assert_eq!(policies.len(), layer.policies().len());
    }
    let Ok(layer) = layer else {
        return;
    };

    let inner = tower::service_fn(|_: Request<()>| async {
        Ok::<_, std::convert::Infallible>(Response::new(String::from("ok")))
    });
    let service = layer.layer(inner);
    let mut paths = vec!["/".to_owned(), "/reply".to_owned()];
    paths.extend(config.routes.iter().filter_map(|r| r.path.clone()));
    for path in paths.iter().take(8) {
        for method in [Method::GET, Method::POST] {
            for peer in ["192.0.2.1:1000", "[2001:db8::1]:1000"] {
                for with_key in [false, true] {
                    let mut builder = Request::builder().method(method.clone()).uri(path.as_str());
                    if with_key {
                        builder = builder
                            .header("x-user-id", "42")
                            .header("x-forwarded-for", "203.0.113.9");
                    }
                    let Ok(mut request) = builder.body(()) else {
                        continue;
                    };
                    request
                        .extensions_mut()
                        .insert(PeerAddr(peer.parse::<SocketAddr>().unwrap()));
                    let Some(response) = ready(service.clone().oneshot(request)) else {
                        continue;
                    };
                    let status = response.unwrap().status();
                    assert!(
                        status == StatusCode::OK
                            || status == StatusCode::TOO_MANY_REQUESTS
                            || status.is_client_error(),
                        "{status}"
                    );
                }
            }
        }
    }
});
