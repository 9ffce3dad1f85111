//! tower's contract: the service that `poll_ready` readied is the one called, and the inner service is
//! not called before (or unless) the backend admits the request. Checked for a backend that decides at
//! once (memory) and for one that decides later (as Redis does).

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use tower_throttle::backend::{Charges, Decisions};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use tokio::sync::oneshot;
use tower::{Service, ServiceExt};
use tower_throttle::key::Global;
use tower_throttle::{
    backend::BackendError, Backend, Decision, MemoryBackend, Policy, Quota, ThrottleLayer,
    ThrottleLayerBuilder,
};

/// An inner service that records every call made without a preceding `poll_ready` on the same instance.
#[derive(Default)]
struct Strict {
    ready: bool,
    calls: Arc<AtomicUsize>,
    violations: Arc<AtomicUsize>,
}

impl Clone for Strict {
    fn clone(&self) -> Self {
        // A clone has not been polled ready.
        Strict {
            ready: false,
            calls: self.calls.clone(),
            violations: self.violations.clone(),
        }
    }
}

impl Service<Request<()>> for Strict {
    type Response = Response<Full<Bytes>>;
    type Error = std::convert::Infallible;
    type Future = std::future::Ready<Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.ready = true;
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Request<()>) -> Self::Future {
        if !std::mem::take(&mut self.ready) {
            self.violations.fetch_add(1, Ordering::SeqCst);
        }
        self.calls.fetch_add(1, Ordering::SeqCst);
        std::future::ready(Ok(Response::new(Full::new(Bytes::from_static(b"ok")))))
    }
}

type Answer = oneshot::Sender<Result<Decision, BackendError>>;

/// A backend whose decisions arrive only when the test sends them.
#[derive(Clone, Default)]
struct Remote {
    waiting: Arc<Mutex<Vec<Answer>>>,
}

type Pending = Pin<Box<dyn Future<Output = Result<Decisions, BackendError>> + Send>>;

impl Backend for Remote {
    type Future = Pending;

    fn check(&self, _: Charges<'_>) -> Pending {
        let (tx, rx) = oneshot::channel();
        self.waiting.lock().unwrap().push(tx);
        Box::pin(async move {
            rx.await
                .unwrap_or_else(|_| Err(BackendError::new("dropped")))
                .map(Decisions::One)
        })
    }
}

impl Remote {
    /// A layer with [`policy`] deciding through this backend.
    fn layer(&self) -> ThrottleLayer<Global, Remote> {
        ThrottleLayerBuilder::with_backend(self.clone())
            .policy(policy())
            .build()
            .unwrap()
    }

    fn answer(&self, decision: Decision) {
        let tx = self.waiting.lock().unwrap().remove(0);
        tx.send(Ok(decision)).unwrap();
    }
}

fn policy() -> Policy<Global> {
    Policy::builder("p")
        .quota(Quota::per_second(2))
        .key(Global)
        .build()
        .unwrap()
}

#[tokio::test]
async fn the_readied_service_is_called_with_a_synchronous_backend() {
    let inner = Strict::default();
    let (calls, violations) = (inner.calls.clone(), inner.violations.clone());
    let mut svc = tower::ServiceBuilder::new()
        .layer(ThrottleLayer::new(policy()))
        .service(inner);
    let mut statuses = Vec::new();
    for _ in 0..4 {
        let res = svc
            .ready()
            .await
            .unwrap()
            .call(Request::new(()))
            .await
            .unwrap();
        statuses.push(res.status());
    }
    assert_eq!(
        statuses,
        [
            StatusCode::OK,
            StatusCode::OK,
            StatusCode::TOO_MANY_REQUESTS,
            StatusCode::TOO_MANY_REQUESTS
        ]
    );
    assert_eq!(
        calls.load(Ordering::SeqCst),
        2,
        "rejected requests never reach the inner service"
    );
    assert_eq!(violations.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn the_inner_service_waits_for_a_remote_decision() {
    let inner = Strict::default();
    let (calls, violations) = (inner.calls.clone(), inner.violations.clone());
    let remote = Remote::default();
    let layer = remote.layer();
    let mut svc = tower::ServiceBuilder::new().layer(layer).service(inner);

    // Admitted: nothing is called until the decision arrives, then the readied service is.
    let fut = svc.ready().await.unwrap().call(Request::new(()));
    let task = tokio::spawn(fut);
    tokio::task::yield_now().await;
    assert_eq!(calls.load(Ordering::SeqCst), 0);
    remote.answer(Decision::allowed(
        2,
        1,
        std::time::Duration::from_millis(500),
    ));
    let res = task.await.unwrap().unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(res.headers()["ratelimit"], r#""p";r=1;t=1"#);
    assert_eq!(calls.load(Ordering::SeqCst), 1);

    // Rejected: never called.
    let fut = svc.ready().await.unwrap().call(Request::new(()));
    let task = tokio::spawn(fut);
    tokio::task::yield_now().await;
    remote.answer(Decision::limited(
        2,
        0,
        Some(std::time::Duration::from_millis(1200)),
        std::time::Duration::from_secs(1),
    ));
    let res = task.await.unwrap().unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(res.headers()["retry-after"], "2");
    assert_eq!(calls.load(Ordering::SeqCst), 1);

    // Several in flight at once, each decided differently, answered out of the order they were
    // made in: each gets its own decision, and is called (if admitted) on a service that was
    // readied for it.
    let mut tasks = Vec::new();
    let mut asked = Vec::new();
    for _ in 0..5 {
        let fut = svc.ready().await.unwrap().call(Request::new(()));
        tasks.push(Some(tokio::spawn(fut)));
        // Its decision is asked for before the next request is made, so the n-th question is
        // the n-th request's.
        // For 10 s at most: a pipeline that never asks fails here instead of hanging.
        let asking = async {
            while remote.waiting.lock().unwrap().is_empty() {
                tokio::task::yield_now().await;
            }
        };
        let waited = tokio::time::timeout(std::time::Duration::from_secs(10), asking).await;
        assert!(waited.is_ok(), "the backend was never asked");
        asked.push(Some(remote.waiting.lock().unwrap().remove(0)));
    }
    // Request n: admitted with n remaining if n is even, else refused with a wait of n + 1 s.
    let decision = |n: u64| {
        if n.is_multiple_of(2) {
            Decision::allowed(10, n, std::time::Duration::from_secs(n + 1))
        } else {
            Decision::limited(
                10,
                0,
                Some(std::time::Duration::from_secs(n + 1)),
                std::time::Duration::from_secs(1),
            )
        }
    };
    for n in [3usize, 0, 4, 1, 2] {
        asked[n]
            .take()
            .unwrap()
            .send(Ok(decision(n as u64)))
            .unwrap();
        let res = tasks[n].take().unwrap().await.unwrap().unwrap();
        if n.is_multiple_of(2) {
            assert_eq!(res.status(), StatusCode::OK, "request {n}");
            assert_eq!(
                res.headers()["ratelimit"],
                format!(r#""p";r={n};t={}"#, n + 1),
                "request {n}"
            );
        } else {
            assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS, "request {n}");
            assert_eq!(
                res.headers()["retry-after"],
                (n + 1).to_string(),
                "request {n}"
            );
        }
        // The others still wait for their own decisions.
        for (other, task) in tasks.iter().enumerate() {
            if let Some(task) = task {
                tokio::task::yield_now().await;
                assert!(!task.is_finished(), "request {other} finished undecided");
            }
        }
    }
    // 1 admitted above, and requests 0, 2 and 4.
    assert_eq!(calls.load(Ordering::SeqCst), 4);
    assert_eq!(
        violations.load(Ordering::SeqCst),
        0,
        "a call reached a service that poll_ready had not readied"
    );
}

#[tokio::test]
async fn dropping_a_pending_request_calls_nothing() {
    let inner = Strict::default();
    let calls = inner.calls.clone();
    let remote = Remote::default();
    let layer = remote.layer();
    let mut svc = tower::ServiceBuilder::new().layer(layer).service(inner);
    let fut = svc.ready().await.unwrap().call(Request::new(()));
    drop(fut);
    assert_eq!(calls.load(Ordering::SeqCst), 0);
    // The dropped decision's channel is closed; nothing panics.
    let tx = remote.waiting.lock().unwrap().remove(0);
    assert!(tx
        .send(Ok(Decision::allowed(1, 0, std::time::Duration::ZERO)))
        .is_err());
}

#[tokio::test]
async fn clones_share_one_limiter() {
    let backend = MemoryBackend::new();
    let layer = ThrottleLayer::builder()
        .backend(backend)
        .policy(policy())
        .build()
        .unwrap();
    let svc = tower::ServiceBuilder::new()
        .layer(layer)
        .service(Strict::default());
    let mut admitted = 0;
    for _ in 0..10 {
        let res = svc.clone().oneshot(Request::new(())).await.unwrap();
        admitted += usize::from(res.status() == StatusCode::OK);
    }
    assert_eq!(admitted, 2);
}

#[tokio::test]
async fn a_rejection_releases_what_poll_ready_reserved() {
    // ConcurrencyLimit reserves a permit in poll_ready. A request rejected after a remote decision
    // must give it back, or the next poll_ready waits forever.
    let remote = Remote::default();
    let layer = remote.layer();
    let mut svc = tower::ServiceBuilder::new()
        .layer(layer)
        .concurrency_limit(1)
        .service(Strict::default());
    for _ in 0..3 {
        let ready = tokio::time::timeout(std::time::Duration::from_secs(5), svc.ready())
            .await
            .expect("poll_ready hung: a permit leaked")
            .unwrap();
        let task = tokio::spawn(ready.call(Request::new(())));
        tokio::task::yield_now().await;
        remote.answer(Decision::limited(
            2,
            0,
            None,
            std::time::Duration::from_secs(1),
        ));
        assert_eq!(
            task.await.unwrap().unwrap().status(),
            StatusCode::TOO_MANY_REQUESTS
        );
    }
}

/// The service shows the inner service it wraps in `Debug` (and its accessors give it back).
#[tokio::test]
async fn the_service_shows_and_gives_back_its_inner_service() {
    use tower::Layer;

    #[derive(Clone, Debug, PartialEq)]
    struct Inner(&'static str);

    let mut svc = ThrottleLayer::new(policy()).layer(Inner("app"));
    let shown = format!("{svc:?}");
    assert!(shown.starts_with("Throttle"), "{shown}");
    assert!(shown.contains(r#"Inner("app")"#), "{shown}");
    assert_eq!(svc.get_ref(), &Inner("app"));
    svc.get_mut().0 = "changed";
    assert_eq!(svc.clone().into_inner(), Inner("changed"));
}
