//! [`AxumBody`]: the layer, its service and its response future, answering with axum's own `Body`
//! (feature `axum`), so that axum does not box the layer's body around every response.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use axum::body::Body;
use http::{Request, Response};
use pin_project_lite::pin_project;
use tower_layer::Layer;
use tower_service::Service;

use crate::backend::{Backend, Decisions};
use crate::error::BackendError;
use crate::key::KeyExtractor;
use crate::middleware::body::ThrottleBody;
use crate::middleware::future::ResponseFuture;
use crate::middleware::layer::ThrottleLayer;
use crate::middleware::service::Throttle;

pin_project! {
    /// A [`ThrottleLayer`] whose responses carry axum's own [`Body`]: made by
    /// [`ThrottleLayer::axum_body`]. The same type is the layer (around a `ThrottleLayer`), its
    /// service (around a [`Throttle`]) and that service's future.
    ///
    /// axum puts every response body that is not its `Body` in a box (`Body::new`): behind
    /// `ThrottleLayer`, whose responses carry a [`ThrottleBody`], that is one allocation and two
    /// indirections a response. Here a response goes out with the inner service's body as it
    /// came, and a refusal with its own small body; only a response whose request holds something
    /// until its body ends (a concurrency slot, a metered cost) is boxed, as before.
    ///
    /// ```
    /// use axum::{routing::get, Router};
    /// use tower_throttle::{key::PeerIp, Policy, Quota, ThrottleLayer};
    ///
    /// let policy = Policy::builder("api")
    ///     .quota(Quota::per_second(5))
    ///     .key(PeerIp::new())
    ///     .build()
    ///     .unwrap();
    /// let app: Router = Router::new()
    ///     .route("/", get(|| async { "hello" }))
    ///     .layer(ThrottleLayer::new(policy).axum_body());
    /// ```
    #[derive(Clone, Debug)]
    pub struct AxumBody<T> {
        #[pin]
        inner: T,
    }
}

impl<T> AxumBody<T> {
    /// What it wraps: the layer, the service or the future.
    pub fn get_ref(&self) -> &T {
        &self.inner
    }

    /// Consumes it, returning what it wraps.
    pub fn into_inner(self) -> T {
        self.inner
    }
}

impl<K, B> ThrottleLayer<K, B> {
    /// This layer, answering with axum's own [`Body`] rather than a [`ThrottleBody`]: see
    /// [`AxumBody`]. The same limits, fields and refusals; what changes is the response type,
    /// `Response<axum::body::Body>`, which axum takes as it is.
    pub fn axum_body(self) -> AxumBody<Self> {
        AxumBody { inner: self }
    }
}

impl<S, K, B> Layer<S> for AxumBody<ThrottleLayer<K, B>> {
    type Service = AxumBody<Throttle<S, K, B>>;

    fn layer(&self, inner: S) -> Self::Service {
        AxumBody {
            inner: self.inner.layer(inner),
        }
    }
}

impl<S, K, B, ReqBody> Service<Request<ReqBody>> for AxumBody<Throttle<S, K, B>>
where
    S: Service<Request<ReqBody>, Response = Response<Body>> + Clone,
    K: KeyExtractor<ReqBody>,
    B: Backend,
    ReqBody: 'static,
{
    type Response = Response<Body>;
    type Error = S::Error;
    type Future = AxumBody<ResponseFuture<S, ReqBody, B::Future>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        AxumBody {
            inner: self.inner.call(request),
        }
    }
}

impl<S, ReqBody, D> Future for AxumBody<ResponseFuture<S, ReqBody, D>>
where
    S: Service<Request<ReqBody>, Response = Response<Body>> + Clone,
    ReqBody: 'static,
    D: Future<Output = Result<Decisions, BackendError>> + Unpin,
{
    type Output = Result<Response<Body>, S::Error>;

    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        // The inner body goes out as it came; a body that holds something until it ends is boxed.
        let (plain, held) = (|body| body, ThrottleBody::into_axum);
        self.project().inner.poll_as(cx, plain, held)
    }
}
