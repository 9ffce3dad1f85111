//! [`Throttle`], the service: the request path in one place — policy → key → access lists → ban →
//! backend — handing the backend's answer to the verdict and the verdict to the response future.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Instant;

use bytes::Bytes;
use http::{Request, Response};
use tower_service::Service;

use crate::access::{Access, AccessList, AddressSource};
use crate::backend::Backend;
use crate::key::{Key, KeyExtractor};
use crate::limit::Algorithm;
use crate::middleware::body::ThrottleBody;
use crate::middleware::future::{AwaitingVerdict, BackendCheck, ResponseFuture};
use crate::middleware::slot::{Release, SlotOwner};
use crate::middleware::verdict::{Judge, RequestContext, Verdict};
use crate::observe::MEASURE_LATENCY;
use crate::policy::{MissingKey, Policy};

/// The rate-limiting service made by [`ThrottleLayer`](crate::ThrottleLayer).
///
/// Clones share the layer's backend and policies.
pub struct Throttle<S, K, B> {
    pub(super) inner: S,
    pub(super) shared: Arc<Shared<K, B>>,
}

/// What every service of one layer shares: the backend, the policies, the verdict's rules and the
/// access lists.
pub(crate) struct Shared<K, B> {
    pub(crate) backend: B,
    pub(crate) policies: Box<[Policy<K>]>,
    /// Its own `Arc`: a response future waiting for a remote decision holds the judge, not the backend.
    pub(crate) judge: Arc<Judge>,
    pub(crate) access: Option<(AccessList, AddressSource)>,
}

impl<S, K, B> Throttle<S, K, B> {
    pub(crate) fn new(inner: S, shared: Arc<Shared<K, B>>) -> Self {
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
        // The first policy whose route and methods match decides.
        let policy = shared.policies.iter().position(|p| p.applies_to(&request));
        // Per-customer quotas, async keys, counting by outcome (middleware/extended.rs): unused,
        // they cost this one check.
        if let Some((i, extras)) = policy.and_then(|i| Some((i, shared.policies[i].extras()?))) {
            let extras = extras.clone();
            return self.call_extended(i, extras, request);
        }
        let key = policy.and_then(|i| shared.policies[i].key().extract(&request));
        // Access lists come before limits (an allowed client has none), and may name keys.
        if let Some((lists, source)) = &shared.access {
            if !lists.is_empty() {
                match lists.check(source.address(&request), key.as_ref()) {
                    Access::Allow => return ResponseFuture::unlimited(self.inner.call(request)),
                    Access::Deny => return ResponseFuture::refused(shared.judge.forbidden()),
                    Access::Limit => {}
                }
            }
        }
        let Some(policy) = policy else {
            return ResponseFuture::unlimited(self.inner.call(request));
        };
        let Some(key) = key else {
            return self.without_key(policy, request);
        };
        let tier = shared.policies[policy].tier_of(&request);
        let context = RequestContext::new(policy, tier, &key, &request);
        if let Some(banned) = shared.judge.banned(context) {
            return ResponseFuture::refused(banned);
        }
        self.check(policy, tier, key, request)
    }
}

impl<S, K, B> Throttle<S, K, B>
where
    B: Backend,
    K: Send + Sync + 'static,
{
    /// A request the matching policy found no key in.
    fn without_key<ReqBody>(
        &mut self,
        policy: usize,
        request: Request<ReqBody>,
    ) -> ResponseFuture<S, ReqBody, B::Future>
    where
        S: Service<Request<ReqBody>>,
        K: KeyExtractor<ReqBody>,
    {
        let shared = &*self.shared;
        let rules = &shared.policies[policy];
        match rules.missing_key() {
            // A dry run never rejects, not even for a missing key.
            MissingKey::Reject(status) if !rules.is_dry_run() => ResponseFuture::refused(
                shared
                    .judge
                    .missing_key(policy, rules.key().describe(), status),
            ),
            _ => ResponseFuture::unlimited(self.inner.call(request)),
        }
    }

    /// Asks the backend, and carries out the verdict at once if the backend decided without waiting
    /// (memory); otherwise the response future waits for it.
    fn check<ReqBody>(
        &mut self,
        policy: usize,
        tier: usize,
        key: Key,
        request: Request<ReqBody>,
    ) -> ResponseFuture<S, ReqBody, B::Future>
    where
        S: Service<Request<ReqBody>> + Clone,
    {
        let shared = &*self.shared;
        let started = MEASURE_LATENCY.then(Instant::now);
        let rules = &shared.policies[policy];
        let limits = &rules.tiers()[tier].limits;
        let mut check = match &**limits {
            [one] => BackendCheck::One(shared.backend.check(one, &key, rules.cost())),
            all => BackendCheck::Stack(shared.backend.check_all(all, &key, rules.cost())),
        };
        // A backend that decides without waiting is done after one poll: then the readied inner
        // service is called right here, with no clone and no extra state.
        let mut noop = Context::from_waker(Waker::noop());
        if let Poll::Ready(answer) = Pin::new(&mut check).poll(&mut noop) {
            if let Some(started) = started {
                shared.judge.latency(policy, started.elapsed());
            }
            let context = RequestContext::new(policy, tier, &key, &request);
            let verdict = shared.judge.verdict(context, answer);
            let release = match &verdict {
                Verdict::Admit(admitted) if admitted.slot.is_some() => {
                    Some(releaser(&self.shared, policy, tier, key))
                }
                _ => None,
            };
            return ResponseFuture::carry_out(verdict, &mut self.inner, request, release);
        }
        // The decision is remote. The service that poll_ready readied goes with the request, to be
        // called once (and only if) the request is admitted.
        let release = (limits[0].algorithm() == Algorithm::Concurrency)
            .then(|| releaser(&self.shared, policy, tier, key.clone()));
        let judge = shared.judge.clone();
        let service = self.take_readied();
        ResponseFuture::checking(
            check,
            AwaitingVerdict {
                service,
                request,
                judge,
                policy,
                tier,
                key,
                started,
                release,
            },
        )
    }

    /// Takes the service that `poll_ready` readied, to call later; `self` keeps a fresh clone, which
    /// the caller must `poll_ready` before the next call, as always.
    pub(super) fn take_readied(&mut self) -> S
    where
        S: Clone,
    {
        let fresh = self.inner.clone();
        std::mem::replace(&mut self.inner, fresh)
    }
}

/// The release of a concurrency slot of policy `policy`, tier `tier`, for `key`.
pub(super) fn releaser<K, B>(
    shared: &Arc<Shared<K, B>>,
    policy: usize,
    tier: usize,
    key: Key,
) -> Release
where
    K: Send + Sync + 'static,
    B: Backend,
{
    let shared = shared.clone();
    Box::new(move |owner| match owner {
        SlotOwner::Backend { lease } => {
            let rules = &shared.policies[policy];
            let limit = &rules.tiers()[tier].limits[0];
            shared.backend.release(limit, &key, rules.cost(), lease);
        }
        #[cfg(feature = "memory")]
        SlotOwner::Local => shared.judge.release_local(policy, tier, &key),
    })
}
