//! [`Throttle`], the service, and its [`ResponseFuture`].

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll, Waker};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response};
use pin_project_lite::pin_project;
use tower_service::Service;

use crate::access::Access;
use crate::body::ThrottleBody;
use crate::headers::RateHeaders;
use crate::key::KeyExtractor;
use crate::layer::{Admitted, Decided, Responder, Shared, SlotOwner, Verdict};
use crate::observe::{RequestRef, MEASURE_LATENCY};
use crate::{Algorithm, Backend, BackendError, Decision, Key, MissingKey, StackFuture};

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
                        return ResponseFuture::calling(self.inner.call(request), None, None)
                    }
                    Access::Deny => return ResponseFuture::ready(shared.responder.forbidden()),
                    Access::Limit => {}
                }
            }
        }
        let Some(index) = index else {
            return ResponseFuture::calling(self.inner.call(request), None, None);
        };
        let policy = &shared.policies[index];
        let Some(key) = key else {
            return match policy.missing_key() {
                // A dry run never rejects, not even for a missing key.
                MissingKey::Reject(status) if !policy.is_dry_run() => ResponseFuture::ready(
                    shared
                        .responder
                        .missing_key(index, policy.key().describe(), status),
                ),
                _ => ResponseFuture::calling(self.inner.call(request), None, None),
            };
        };
        let tier = policy.tier_of(&request);
        if let Some(banned) = shared
            .responder
            .banned(index, tier, &key, RequestRef::of(&request))
        {
            return ResponseFuture::ready(banned);
        }
        let started = MEASURE_LATENCY.then(Instant::now);
        let limits = &policy.tiers()[tier].limits;
        let mut decision = match &**limits {
            [one] => Deciding::One(shared.backend.check(one, &key, policy.cost())),
            all => Deciding::All(shared.backend.check_all(all, &key, policy.cost())),
        };
        // A backend that decides without waiting (the memory backend) is done after one poll: then the
        // readied inner service is called right here, with no clone and no extra state.
        let mut noop = Context::from_waker(Waker::noop());
        match Pin::new(&mut decision).poll(&mut noop) {
            Poll::Ready(result) => {
                if let Some(started) = started {
                    shared.responder.latency(index, started.elapsed());
                }
                let request_ref = RequestRef::of(&request);
                match shared
                    .responder
                    .verdict(index, tier, result, &key, request_ref)
                {
                    Verdict::Admit(admitted) => {
                        let release = admitted
                            .slot
                            .is_some()
                            .then(|| releaser(&self.shared, index, tier, key));
                        let delay = admitted.delay;
                        let (request, headers, guard) = prepare(admitted, release, request);
                        if delay.is_zero() {
                            ResponseFuture::calling(self.inner.call(request), headers, guard)
                        } else {
                            // The readied service stays here for the next call: a request that
                            // waits must not hold what it reserved (a permit of an inner
                            // concurrency limit) while it sleeps. A clone readies after the wait.
                            let service = self.inner.clone();
                            ResponseFuture::delaying(delay, service, request, headers, guard)
                        }
                    }
                    Verdict::Reject(response) => ResponseFuture::ready(response),
                }
            }
            Poll::Pending => {
                // The decision is remote. The service that poll_ready readied goes with the request,
                // to be called once (and only if) the request is admitted.
                let release = (policy.tiers()[tier].limits[0].algorithm()
                    == Algorithm::Concurrency)
                    .then(|| releaser(&self.shared, index, tier, key.clone()));
                let responder = shared.responder.clone();
                let readied = self.take_readied();
                ResponseFuture {
                    kind: Kind::Deciding {
                        decision,
                        pending: Some(Pending {
                            service: readied,
                            request,
                            responder,
                            index,
                            tier,
                            key,
                            started,
                            release,
                        }),
                    },
                }
            }
        }
    }
}

impl<S: Clone, K, B> Throttle<S, K, B> {
    /// Takes the service that `poll_ready` readied, to call later; `self` keeps a fresh clone, which
    /// the caller must `poll_ready` before the next call, as always.
    fn take_readied(&mut self) -> S {
        let fresh = self.inner.clone();
        std::mem::replace(&mut self.inner, fresh)
    }
}

/// Gives back a concurrency slot to whoever holds it.
type Release = Box<dyn FnOnce(SlotOwner) + Send + Sync>;

/// The release of a slot of policy `index`, tier `tier`, for `key`.
fn releaser<K, B>(shared: &Arc<Shared<K, B>>, index: usize, tier: usize, key: Key) -> Release
where
    K: Send + Sync + 'static,
    B: Backend,
{
    let shared = shared.clone();
    Box::new(move |owner| match owner {
        SlotOwner::Backend { lease } => {
            let policy = &shared.policies[index];
            let limit = &policy.tiers()[tier].limits[0];
            shared.backend.release(limit, &key, policy.cost(), lease);
        }
        #[cfg(feature = "memory")]
        SlotOwner::Local => shared.responder.release_local(index, tier, &key),
    })
}

/// Readies an admitted request: its [`ThrottleDecision`](crate::ThrottleDecision) extension, its
/// headers, and the guard that gives back its concurrency slot.
fn prepare<ReqBody>(
    admitted: Admitted,
    release: Option<Release>,
    mut request: Request<ReqBody>,
) -> (Request<ReqBody>, Option<RateHeaders>, Option<SlotGuard>) {
    if let Some(decision) = admitted.decision {
        request.extensions_mut().insert(*decision);
    }
    let guard = match (admitted.slot, release) {
        (Some(owner), Some(release)) => Some(SlotGuard::new(release, owner)),
        _ => None,
    };
    (request, admitted.headers, guard)
}

/// Holds a concurrency slot; dropping it gives the slot back. It lives in the response future until
/// the inner service answers, then in the response body until the body ends, so a slot is given back
/// exactly once however the request ends: a finished or failed body, a dropped response, a cancelled
/// request, an error from the service.
pub(crate) struct SlotGuard(Option<(Release, SlotOwner)>);

impl SlotGuard {
    fn new(release: Release, owner: SlotOwner) -> Self {
        SlotGuard(Some((release, owner)))
    }
}

impl Drop for SlotGuard {
    fn drop(&mut self) {
        if let Some((release, owner)) = self.0.take() {
            release(owner);
        }
    }
}

impl fmt::Debug for SlotGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SlotGuard")
    }
}

/// A decision in flight: one limit, or a stack.
pub(crate) enum Deciding<D> {
    One(D),
    All(StackFuture),
}

impl<D> Future for Deciding<D>
where
    D: Future<Output = Result<Decision, BackendError>> + Unpin,
{
    type Output = Result<Decided, BackendError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.get_mut() {
            Deciding::One(one) => Pin::new(one).poll(cx).map(|r| r.map(Decided::One)),
            Deciding::All(all) => all.as_mut().poll(cx).map(|r| r.map(Decided::All)),
        }
    }
}

struct Pending<S, ReqBody> {
    service: S,
    request: Request<ReqBody>,
    responder: Arc<Responder>,
    index: usize,
    tier: usize,
    /// For the local limiter of `OnBackendError::Local`, the penalty box and the reports.
    key: Key,
    /// When the backend was asked (only to report its latency).
    started: Option<Instant>,
    /// For a concurrency limit: how to give the slot back.
    release: Option<Release>,
}

pin_project! {
    /// A request waiting for its turn (delay mode), then for its service to be ready.
    struct Delayed<S, ReqBody> {
        #[pin]
        sleep: tokio::time::Sleep,
        slept: bool,
        service: S,
        request: Option<Request<ReqBody>>,
        headers: Option<RateHeaders>,
        guard: Option<SlotGuard>,
    }
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
            decision: Deciding<D>,
            pending: Option<Pending<S, ReqBody>>,
        },
        Delaying {
            // Boxed: delays are rare, and a Sleep would make every request's future larger.
            delayed: Pin<Box<Delayed<S, ReqBody>>>,
        },
        Calling {
            #[pin]
            future: S::Future,
            headers: Option<RateHeaders>,
            guard: Option<SlotGuard>,
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
    fn calling(future: S::Future, headers: Option<RateHeaders>, guard: Option<SlotGuard>) -> Self {
        ResponseFuture {
            kind: Kind::Calling {
                future,
                headers,
                guard,
            },
        }
    }

    fn delaying(
        delay: Duration,
        service: S,
        request: Request<ReqBody>,
        headers: Option<RateHeaders>,
        guard: Option<SlotGuard>,
    ) -> Self {
        ResponseFuture {
            kind: Kind::Delaying {
                delayed: Box::pin(Delayed {
                    sleep: tokio::time::sleep(delay),
                    slept: false,
                    service,
                    request: Some(request),
                    headers,
                    guard,
                }),
            },
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
            Kind::Delaying { .. } => "delaying",
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
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone,
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
                        tier,
                        key,
                        started,
                        release,
                    } = pending
                        .take()
                        .expect("ResponseFuture polled after completion");
                    if let Some(started) = started {
                        responder.latency(index, started.elapsed());
                    }
                    match responder.verdict(index, tier, result, &key, RequestRef::of(&request)) {
                        Verdict::Admit(admitted) => {
                            let delay = admitted.delay;
                            let (request, headers, guard) = prepare(admitted, release, request);
                            if delay.is_zero() {
                                Kind::Calling {
                                    future: service.call(request),
                                    headers,
                                    guard,
                                }
                            } else {
                                // Give back what readying reserved while the request waits; a
                                // clone readies after the wait.
                                let fresh = service.clone();
                                drop(service);
                                ResponseFuture::delaying(delay, fresh, request, headers, guard).kind
                            }
                        }
                        Verdict::Reject(response) => Kind::Ready {
                            response: Some(response),
                        },
                    }
                }
                KindProj::Delaying { delayed } => {
                    let delayed = delayed.as_mut().project();
                    if !*delayed.slept {
                        ready!(delayed.sleep.poll(cx));
                        *delayed.slept = true;
                    }
                    ready!(delayed.service.poll_ready(cx))?;
                    let request = delayed
                        .request
                        .take()
                        .expect("ResponseFuture polled after completion");
                    Kind::Calling {
                        future: delayed.service.call(request),
                        headers: delayed.headers.take(),
                        guard: delayed.guard.take(),
                    }
                }
                KindProj::Calling {
                    future,
                    headers,
                    guard,
                } => {
                    let response = ready!(future.poll(cx))?;
                    let (mut parts, body) = response.into_parts();
                    if let Some(headers) = headers.take() {
                        headers.apply(&mut parts.headers);
                    }
                    let body = ThrottleBody::inner(body, guard.take());
                    return Poll::Ready(Ok(Response::from_parts(parts, body)));
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
