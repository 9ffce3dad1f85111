//! The server's edge: an HTTP/1 and HTTP/2 accept loop that holds against slow and numerous clients, for both
//! listeners (`axum::serve` sets no header read timeout, so a client that sends half a request
//! head keeps its connection, and a file descriptor, for as long as it likes).
//!
//! * An HTTP/1 connection whose request head has not fully arrived within `[server]
//!   header_read_timeout` (default 5 s) is closed (hyper's `header_read_timeout`, which needs a
//!   timer). HTTP/2 has no such setting in hyper; the connection cap bounds it.
//! * At most `[server] max_connections` (default 10,000) connections are open at once: at the cap
//!   the loop stops accepting, and new connections wait in the kernel's accept queue until one
//!   closes, instead of the process running out of file descriptors.
//! * On shutdown (Ctrl-C or SIGTERM) the listener is closed, idle connections are closed, and the
//!   requests in flight get up to 10 s to finish.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::ConnectInfo;
use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tower::ServiceExt;

/// How the listeners treat connections.
#[derive(Clone, Copy, Debug)]
pub struct Edge {
    pub header_read_timeout: Duration,
    pub max_connections: usize,
}

/// Serves `router` on `listener` until `shutdown` completes; each request carries its peer's
/// address as `ConnectInfo<SocketAddr>` (what `key = "ip"` reads).
pub async fn serve(
    listener: TcpListener,
    router: Router,
    edge: Edge,
    shutdown: impl std::future::Future<Output = ()>,
) {
    let open = Arc::new(Semaphore::new(edge.max_connections));
    let graceful = GracefulShutdown::new();
    tokio::pin!(shutdown);
    loop {
        let permit = tokio::select! {
            permit = open.clone().acquire_owned() => permit.expect("the semaphore is never closed"),
            () = &mut shutdown => break,
        };
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of file descriptors, or a connection reset before it was accepted: the
                    // next accept may succeed; a short pause keeps an error from spinning.
                    tracing::debug!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let _ = stream.set_nodelay(true);
        let (router, watcher) = (router.clone(), graceful.watcher());
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |mut request: hyper::Request<_>| {
                request.extensions_mut().insert(ConnectInfo(peer));
                router.clone().oneshot(request.map(axum::body::Body::new))
            });
            // HTTP/1 and HTTP/2 (h2c with prior knowledge), as `axum::serve` serves them.
            let mut builder = auto::Builder::new(TokioExecutor::new());
            builder
                .http1()
                .timer(TokioTimer::new())
                .header_read_timeout(edge.header_read_timeout);
            let connection = builder.serve_connection_with_upgrades(TokioIo::new(stream), service);
            let served = watcher.watch(connection.into_owned()).await;
            if let Err(e) = served {
                tracing::debug!(error = %e, %peer, "connection closed");
            }
            drop(permit);
        });
    }
    // Stopped accepting, as axum's graceful shutdown does: new connections are refused at once,
    // idle ones closed, and the requests in flight given up to SHUTDOWN_GRACE to finish.
    drop(listener);
    let _ = tokio::time::timeout(SHUTDOWN_GRACE, graceful.shutdown()).await;
}

/// How long a shutdown waits for open connections.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// The edge that `[server]` describes (defaults where it says nothing).
pub fn of(config: &tower_throttle::config::Config) -> Result<Edge, String> {
    let server = crate::settings::ServerConfig::of(config)?;
    Ok(Edge {
        header_read_timeout: server.header_read_timeout().map_err(|e| e.to_string())?,
        max_connections: server.max_connections().map_err(|e| e.to_string())?,
    })
}
