//! [`Throttle`], the service, and its [`ResponseFuture`].

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll, Waker};
use std::time::Instant;

use bytes::Bytes;
use http::{Request, Response};
use pin_project_lite::pin_project;
use tower_service::Service;

use crate::access::Access;
use crate::body::ThrottleBody;
use crate::headers::RateHeaders;
use crate::key::KeyExtractor;
use crate::layer::{Responder, Shared, Verdict};
use crate::observe::{RequestRef, MEASURE_LATENCY};
use crate::{Backend, BackendError, Decision, Key, MissingKey};

/// The rate-limiting service made by [`ThrottleLayer`](crate::ThrottleLayer).
///
/// Clones share the layer's backend and policies.
pub struct Throttle<S, K, B> {
    inner: S,
    shared: Arc<Shared<K, B>>,
}

impl<S, K, B> Throttle<S, K, B> {
    pub(crate) fn from_shared(inner: S, shared: Arc<Shared<K, B>>) -> Self {
        Throttle { inner, shared }
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// Consumes `self`, returning the inner service.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S: Clone, K, B> Clone for Throttle<S, K, B> {
    fn clone(&self) -> Self {
        Throttle {
            inner: self.inner.clone(),
            shared: self.shared.clone(),
        }
    }
}

impl<S: fmt::Debug, K, B> fmt::Debug for Throttle<S, K, B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Throttle")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

impl<S, K, B, ReqBody, ResBody> Service<Request<ReqBody>> for Throttle<S, K, B>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone,
    K: KeyExtractor<ReqBody>,
    B: Backend,
    ResBody: http_body::Body<Data = Bytes>,
{
    type Response = Response<ThrottleBody<ResBody>>;
    type Error = S::Error;
    type Future = ResponseFuture<S, ReqBody, B::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        let shared = &*self.shared;
        let index = shared.policies.iter().position(|p| p.applies_to(&request));
        let key = index.and_then(|i| shared.policies[i].key().extract(&request));
        if let Some((lists, source)) = &shared.access {
            if !lists.is_empty() {
                match lists.check(source.address(&request), key.as_ref()) {
                    Access::Allow => {
                        return ResponseFuture::calling(self.inner.call(request), None)
                    }
                    Access::Deny => return ResponseFuture::ready(shared.responder.forbidden()),
                    Access::Limit => {}
                }
            }
        }
        let Some(index) = index else {
            return ResponseFuture::calling(self.inner.call(request), None);
        };
        let policy = &shared.policies[index];
        let Some(key) = key else {
            return match policy.missing_key() {
                MissingKey::Allow => ResponseFuture::calling(self.inner.call(request), None),
                MissingKey::Reject(status) => ResponseFuture::ready(shared.responder.missing_key(
                    index,
                    policy.key().describe(),
                    status,
                )),
            };
        };
        if let Some(banned) = shared
            .responder
            .banned(index, &key, RequestRef::of(&request))
        {
            return ResponseFuture::ready(banned);
        }
        let started = MEASURE_LATENCY.then(Instant::now);
        let mut decision = shared.backend.check(policy.limit(), &key, policy.cost());
        // A backend that decides without waiting (the memory backend) is done after one poll: then the
        // readied inner service is called right here, with no clone and no extra state.
        let mut noop = Context::from_waker(Waker::noop());
        match Pin::new(&mut decision).poll(&mut noop) {
            Poll::Ready(result) => {
                if let Some(started) = started {
                    shared.responder.latency(index, started.elapsed());
                }
                let request_ref = RequestRef::of(&request);
                match shared.responder.verdict(index, result, &key, request_ref) {
                    Verdict::Admit(headers) => {
                        ResponseFuture::calling(self.inner.call(request), headers)
                    }
                    Verdict::Reject(response) => ResponseFuture::ready(response),
                }
            }
            Poll::Pending => {
                // The decision is remote. The service that poll_ready readied goes with the request,
                // to be called once (and only if) the request is admitted; `self` keeps a fresh clone,
                // which the caller must poll_ready before the next call, as always.
                let fresh = self.inner.clone();
                let readied = std::mem::replace(&mut self.inner, fresh);
                ResponseFuture {
                    kind: Kind::Deciding {
                        decision,
                        pending: Some(Pending {
                            service: readied,
                            request,
                            responder: shared.responder.clone(),
                            index,
                            key,
                            started,
                        }),
                    },
                }
            }
        }
    }
}

struct Pending<S, ReqBody> {
    service: S,
    request: Request<ReqBody>,
    responder: Arc<Responder>,
    index: usize,
    /// For the local limiter of `OnBackendError::Local`, the penalty box and the reports.
    key: Key,
    /// When the backend was asked (only to report its latency).
    started: Option<Instant>,
}

pin_project! {
    /// The response future of [`Throttle`].
    pub struct ResponseFuture<S, ReqBody, D>
    where
        S: Service<Request<ReqBody>>,
    {
        #[pin]
        kind: Kind<S, ReqBody, D>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<S, ReqBody, D>
    where
        S: Service<Request<ReqBody>>,
    {
        Deciding {
            decision: D,
            pending: Option<Pending<S, ReqBody>>,
        },
        Calling {
            #[pin]
            future: S::Future,
            headers: Option<RateHeaders>,
        },
        Ready {
            response: Option<Response<Bytes>>,
        },
    }
}

impl<S, ReqBody, D> ResponseFuture<S, ReqBody, D>
where
    S: Service<Request<ReqBody>>,
{
    fn calling(future: S::Future, headers: Option<RateHeaders>) -> Self {
        ResponseFuture {
            kind: Kind::Calling { future, headers },
        }
    }

    fn ready(response: Response<Bytes>) -> Self {
        ResponseFuture {
            kind: Kind::Ready {
                response: Some(response),
            },
        }
    }
}

impl<S, ReqBody, D> fmt::Debug for ResponseFuture<S, ReqBody, D>
where
    S: Service<Request<ReqBody>>,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.kind {
            Kind::Deciding { .. } => "deciding",
            Kind::Calling { .. } => "calling",
            Kind::Ready { .. } => "ready",
        };
        f.debug_struct("ResponseFuture")
            .field("state", &state)
            .finish()
    }
}

impl<S, ReqBody, ResBody, D> Future for ResponseFuture<S, ReqBody, D>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    D: Future<Output = Result<Decision, BackendError>> + Unpin,
{
    type Output = Result<Response<ThrottleBody<ResBody>>, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut kind = self.project().kind;
        loop {
            let next = match kind.as_mut().project() {
                KindProj::Deciding { decision, pending } => {
                    let result = ready!(Pin::new(decision).poll(cx));
                    let Pending {
                        mut service,
                        request,
                        responder,
                        index,
                        key,
                        started,
                    } = pending
                        .take()
                        .expect("ResponseFuture polled after completion");
                    if let Some(started) = started {
                        responder.latency(index, started.elapsed());
                    }
                    match responder.verdict(index, result, &key, RequestRef::of(&request)) {
                        Verdict::Admit(headers) => Kind::Calling {
                            future: service.call(request),
                            headers,
                        },
                        Verdict::Reject(response) => Kind::Ready {
                            response: Some(response),
                        },
                    }
                }
                KindProj::Calling { future, headers } => {
                    let response = ready!(future.poll(cx))?;
                    let (mut parts, body) = response.into_parts();
                    if let Some(headers) = headers.take() {
                        headers.apply(&mut parts.headers);
                    }
                    return Poll::Ready(Ok(Response::from_parts(parts, ThrottleBody::inner(body))));
                }
                KindProj::Ready { response } => {
                    let response = response
                        .take()
                        .expect("ResponseFuture polled after completion");
                    return Poll::Ready(Ok(response.map(ThrottleBody::full)));
                }
            };
            kind.set(next);
        }
    }
}
