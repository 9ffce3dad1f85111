//! Plain hyper over real TCP, as in examples/hyper.rs: ServiceBuilder + hyper-util, no axum.

use std::convert::Infallible;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use tower::ServiceBuilder;
use tower_throttle::key::{PeerAddr, PeerIp};
use tower_throttle::{Policy, Quota, ThrottleLayer};

#[tokio::test]
async fn hyper_service_builder_over_tcp() {
    let throttle = ThrottleLayer::new(
        Policy::builder("hello")
            .quota(Quota::per_minute(3))
            .key(PeerIp::new())
            .build()
            .unwrap(),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (stream, peer) = listener.accept().await.unwrap();
            let service = ServiceBuilder::new()
                .map_request(move |mut req: Request<Incoming>| {
                    req.extensions_mut().insert(PeerAddr(peer));
                    req
                })
                .layer(throttle.clone())
                .service_fn(|_: Request<Incoming>| async {
                    Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"hello"))))
                });
            tokio::spawn(async move {
                let _ = auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), TowerToHyperService::new(service))
                    .await;
            });
        }
    });

    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let mut statuses = Vec::new();
    for _ in 0..5 {
        let res = client
            .get(format!("http://{addr}/").parse().unwrap())
            .await
            .unwrap();
        statuses.push(res.status());
        if res.status() == StatusCode::TOO_MANY_REQUESTS {
            assert_eq!(res.headers()["retry-after"], "20");
        } else {
            assert_eq!(res.into_body().collect().await.unwrap().to_bytes(), "hello");
        }
    }
    assert_eq!(statuses[..3], [StatusCode::OK; 3]);
    assert_eq!(statuses[3..], [StatusCode::TOO_MANY_REQUESTS; 2]);
}
