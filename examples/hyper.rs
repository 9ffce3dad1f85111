//! Plain hyper (no axum): tower-throttle through `tower::ServiceBuilder` and hyper-util.
//!
//! ```text
//! cargo run --example hyper            # listens on 127.0.0.1:3001
//! curl -i http://127.0.0.1:3001/       # twice a second per client IP
//! ```

use std::convert::Infallible;
use std::net::SocketAddr;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use tower::ServiceBuilder;
use tower_throttle::key::{PeerAddr, PeerIp};
use tower_throttle::{Policy, Quota, ThrottleLayer};

async fn hello(_: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    Ok(Response::new(Full::new(Bytes::from_static(b"hello\n"))))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let addr: SocketAddr = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:3001".into())
        .parse()?;
    let throttle = ThrottleLayer::new(
        Policy::builder("hello")
            .quota(Quota::per_second(2))
            .key(PeerIp::new())
            .build()?,
    );
    let listener = tokio::net::TcpListener::bind(addr).await?;
    println!(
        "hyper example listening on http://{}",
        listener.local_addr()?
    );
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            // Out of file descriptors under a flood, or a connection reset before it was
            // accepted: the server goes on; a short pause keeps the error from spinning.
            Err(_) => {
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                continue;
            }
        };
        // hyper has no ConnectInfo: put the peer address in each request's extensions for PeerIp.
        let service = ServiceBuilder::new()
            .map_request(move |mut req: Request<Incoming>| {
                req.extensions_mut().insert(PeerAddr(peer));
                req
            })
            .layer(throttle.clone())
            .service_fn(hello);
        tokio::spawn(async move {
            let _ = auto::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(stream), TowerToHyperService::new(service))
                .await;
        });
    }
}
