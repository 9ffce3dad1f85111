//! Overload protection for a service of bounded capacity: 8 workers, each request holding one for
//! `?work_ms=N` (10 by default). Behind the layer's overload gate, requests past its adaptive
//! limit are answered `503` with a `Retry-After` at once, instead of queueing for a worker; paid
//! clients (`x-plan: paid`) keep 80 % of the limit under pressure, and the `search` route's quota
//! bites only then.
//!
//! ```text
//! cargo run --example overload                              # 127.0.0.1:3002
//! oha -z 10s -c 64 'http://127.0.0.1:3002/api?work_ms=20'    # eight times the workers
//! curl -s http://127.0.0.1:3002/gate                         # the limit, in flight, shed
//! ```

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Query, State};
use axum::routing::get;
use axum::{Json, Router};
use serde::Deserialize;
use tokio::sync::Semaphore;
use tower_throttle::key::KeySpec;
use tower_throttle::overload::{Overload, PartitionBy};
use tower_throttle::{MemoryBackend, Policy, Quota, ThrottleLayer};

/// The service's workers: its capacity is `WORKERS` requests at a time.
const WORKERS: usize = 8;

#[derive(Deserialize)]
struct Work {
    work_ms: Option<u64>,
}

/// Holds a worker for the request's work (at most a second).
async fn work(State(workers): State<Arc<Semaphore>>, Query(work): Query<Work>) -> &'static str {
    // The semaphore is never closed: `acquire` cannot fail.
    if let Ok(_worker) = workers.acquire().await {
        let ms = work.work_ms.unwrap_or(10).min(1_000);
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
    "done\n"
}

/// The layer: `api` (paid or free by `x-plan`, with a quota the load never reaches) and `search`
/// (five a second, only under pressure), behind an overload gate partitioned by tier.
fn layer() -> ThrottleLayer<KeySpec, MemoryBackend> {
    let key = || KeySpec::Global;
    let api = Policy::builder("api")
        .route("/api")
        .key(key())
        .quota(Quota::per_second(100_000))
        .tier_header("x-plan")
        .tier("paid", [Quota::per_second(100_000)])
        .build()
        .expect("a valid policy");
    let search = Policy::builder("search")
        .route("/search")
        .key(key())
        .quota(Quota::per_second(5))
        .under_pressure_only(true)
        .build()
        .expect("a valid policy");
    ThrottleLayer::builder()
        .policies([api, search])
        .overload(
            Overload::gradient()
                .limits(2, 256)
                .partition_by(PartitionBy::Tier)
                .partition("paid", 0.8)
                .partition("default", 0.2),
        )
        .build()
        .expect("a valid layer")
}

fn app() -> (Router, ThrottleLayer<KeySpec, MemoryBackend>) {
    let layer = layer();
    let gate = layer.clone();
    let workers = Arc::new(Semaphore::new(WORKERS));
    let router = Router::new()
        .route("/api", get(work))
        .route("/search", get(work))
        .with_state(workers)
        .layer(layer.clone())
        .route(
            "/gate",
            get(move || {
                let gate = gate.overload().expect("the layer has a gate");
                let shed: Vec<u64> = (0..2).map(|p| gate.shed_of(p)).collect();
                let answer = serde_json::json!({
                    "limit": gate.limit(),
                    "in_flight": gate.in_flight(),
                    "shed": { "paid": shed[0], "default": shed[1] },
                });
                async move { Json(answer) }
            }),
        );
    (router, layer)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let addr: SocketAddr = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:3002".into())
        .parse()?;
    let listener = tokio::net::TcpListener::bind(addr).await?;
    println!("overload example on http://{addr} ({WORKERS} workers; GET /gate for the gate)");
    axum::serve(listener, app().0).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::{Request, StatusCode};
    use tower::ServiceExt;

    /// Four times as many requests at once as there are workers, each holding one for 200 ms:
    /// the gate sheds some at once (503 with `Retry-After`), free ones before paid ones, and the
    /// rest are served.
    #[tokio::test]
    async fn a_burst_past_the_workers_is_shed_at_once_free_first() {
        let (router, layer) = app();
        let send = |plan: Option<&'static str>| {
            let router = router.clone();
            tokio::spawn(async move {
                let mut request = Request::get("/api?work_ms=200");
                if let Some(plan) = plan {
                    request = request.header("x-plan", plan);
                }
                let response = router.oneshot(request.body(axum::body::Body::empty()).unwrap());
                let response = response.await.unwrap();
                let retry = response.headers().get("retry-after").cloned();
                (response.status(), retry)
            })
        };
        let tasks: Vec<_> = (0..4 * WORKERS)
            .map(|i| send((i % 2 == 0).then_some("paid")))
            .collect();
        let mut answers = Vec::new();
        for task in tasks {
            answers.push(task.await.unwrap());
        }
        let shed = answers
            .iter()
            .filter(|(status, _)| *status == StatusCode::SERVICE_UNAVAILABLE);
        assert!(shed.clone().all(|(_, retry)| retry.is_some()));
        let served = answers
            .iter()
            .filter(|(status, _)| *status == StatusCode::OK);
        assert!(served.count() >= WORKERS, "{answers:?}");
        assert!(shed.count() > 0, "{answers:?}");
        let gate = layer.overload().unwrap();
        assert!(gate.shed_of(1) >= gate.shed_of(0), "free is shed first");
        assert_eq!(gate.in_flight(), 0);
    }
}
