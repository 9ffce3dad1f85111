//! [`Throttle`], the service: the request path in one place — policy → key → access lists → ban →
//! backend — handing the backend's answer to the verdict and the verdict to the response future.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Instant;

use arc_swap::{ArcSwap, Cache};
use bytes::Bytes;
use http::{Request, Response};
use tower_service::Service;

use crate::access::Access;
use crate::backend::Backend;
use crate::key::{Key, KeyExtractor};
use crate::limit::Algorithm;
use crate::middleware::admitted::Verdict;
use crate::middleware::body::ThrottleBody;
use crate::middleware::extended::call_extended;
use crate::middleware::future::{AwaitingVerdict, BackendCheck, ResponseFuture};
use crate::middleware::shared::{releaser, take_readied, Shared};
use crate::middleware::table::Table;
use crate::middleware::verdict::RequestContext;
use crate::observe::{RequestRef, MEASURE_LATENCY};

/// The rate-limiting service made by [`ThrottleLayer`](crate::ThrottleLayer).
///
/// Clones share the layer's backend and policies.
pub struct Throttle<S, K, B> {
    inner: S,
    shared: Arc<Shared<K, B>>,
    /// The policy table this service last used: loading it again costs one atomic load while no
    /// reload has replaced it (a reload is seen by the next request of every service).
    table: Cache<Arc<ArcSwap<Table<K>>>, Arc<Table<K>>>,
}

impl<S, K, B> Throttle<S, K, B> {
    pub(crate) fn new(inner: S, shared: Arc<Shared<K, B>>) -> Self {
        let table = Cache::new(shared.table.clone());
        Throttle {
            inner,
            shared,
            table,
        }
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
            table: self.table.clone(),
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
        let Throttle {
            inner,
            shared,
            table,
        } = self;
        // One load of the policy table: this request is decided by it from start to end.
        let table: &Arc<Table<K>> = table.load();
        // The first policy whose route and methods match decides.
        let policy = table.policies.iter().position(|p| p.applies_to(&request));
        // Per-customer quotas, async keys, counting by outcome (middleware/extended.rs): unused,
        // they cost this one check.
        if let Some((i, extras)) = policy.and_then(|i| Some((i, table.policies[i].extras()?))) {
            let (extras, table) = (extras.clone(), table.clone());
            return call_extended(inner, shared, table, i, extras, request);
        }
        let key = policy.and_then(|i| table.policies[i].key().extract(&request));
        // Access lists come before limits (an allowed client has none), and may name keys.
        if let Some((lists, source)) = &shared.access {
            if !lists.is_empty() {
                match lists.check(source.address(&request), key.as_ref()) {
                    Access::Allow => return ResponseFuture::unlimited(inner.call(request)),
                    Access::Deny => {
                        let head = RequestRef::of(&request);
                        let verdict = table.judge.forbidden(policy, key.as_ref(), head);
                        return ResponseFuture::carry_out(verdict, inner, request, None);
                    }
                    Access::Limit => {}
                }
            }
        }
        let Some(policy) = policy else {
            return ResponseFuture::unlimited(inner.call(request));
        };
        let Some(key) = key else {
            return without_key(inner, table, policy, request);
        };
        let tier = table.policies[policy].tier_of(&request);
        let context = RequestContext::new(policy, tier, &key, &request);
        if let Some(banned) = table.judge.banned(context) {
            return ResponseFuture::carry_out(banned, inner, request, None);
        }
        check(inner, shared, table, policy, tier, key, request)
    }
}

/// A request the matching policy found no key in.
fn without_key<S, K, ReqBody, F>(
    inner: &mut S,
    table: &Table<K>,
    policy: usize,
    request: Request<ReqBody>,
) -> ResponseFuture<S, ReqBody, F>
where
    S: Service<Request<ReqBody>> + Clone,
    K: KeyExtractor<ReqBody>,
{
    let what = table.policies[policy].key().describe();
    let verdict = table
        .judge
        .missing_key(policy, &what, RequestRef::of(&request));
    ResponseFuture::carry_out(verdict, inner, request, None)
}

/// Asks the backend, and carries out the verdict at once if the backend decided without waiting
/// (memory); otherwise the response future waits for it.
fn check<S, K, B, ReqBody>(
    inner: &mut S,
    shared: &Arc<Shared<K, B>>,
    table: &Arc<Table<K>>,
    policy: usize,
    tier: usize,
    key: Key,
    request: Request<ReqBody>,
) -> ResponseFuture<S, ReqBody, B::Future>
where
    S: Service<Request<ReqBody>> + Clone,
    K: Send + Sync + 'static,
    B: Backend,
{
    let started = MEASURE_LATENCY.then(Instant::now);
    let rules = &table.policies[policy];
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
            table.judge.latency(policy, started.elapsed());
        }
        let context = RequestContext::new(policy, tier, &key, &request);
        let verdict = table.judge.verdict(context, answer);
        let release = match &verdict {
            Verdict::Admit(admitted) if admitted.slot.is_some() => {
                Some(releaser(shared, table, policy, tier, key))
            }
            _ => None,
        };
        return ResponseFuture::carry_out(verdict, inner, request, release);
    }
    // The decision is remote. The service that poll_ready readied goes with the request, to be
    // called once (and only if) the request is admitted.
    let release = (limits[0].algorithm() == Algorithm::Concurrency)
        .then(|| releaser(shared, table, policy, tier, key.clone()));
    let judge = table.judge.clone();
    let service = take_readied(inner);
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
