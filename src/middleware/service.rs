//! [`Throttle`], the service: runs the steps of `steps.rs` for a synchronous key and a static
//! quota, and carries the verdict out at once when the backend decided at once (memory). A policy
//! with one tier and no penalty box, behind no access lists, has nothing to do between its key and
//! the backend (`CompiledPolicy::straight`), and a plain admission builds no verdict (`check`):
//! the commonest request meets only the steps that can change its answer.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::slice;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Instant;

use bytes::Bytes;
use http::{Request, Response};
use tower_service::Service;

use crate::backend::{Backend, Charges, Decisions};
use crate::engine::extended::{prepare, Prepared, Scope};
use crate::engine::shared::{releaser, Shared};
use crate::engine::steps;
use crate::engine::table::Table;
use crate::engine::verdict::{Judge, RequestContext};
use crate::error::BackendError;
use crate::headers::RateHeaders;
use crate::key::ahead::{BodyAhead, KeyAhead};
use crate::key::{Key, KeyExtractor};
use crate::limit::Algorithm;
use crate::middleware::body::ThrottleBody;
use crate::middleware::future::{take_readied, ResponseFuture};
use crate::near_limit;
use crate::observe::{RequestRef, MEASURE_LATENCY};
use crate::policy::extras::PolicyExtras;
use crate::policy::{CompiledPolicy, Policy};

/// The rate-limiting service made by [`ThrottleLayer`](crate::ThrottleLayer).
///
/// Clones share the layer's backend and policies.
pub struct Throttle<S, K, B> {
    inner: S,
    shared: Arc<Shared<K, B>>,
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
    // 'static: a policy that reads the body finds its type's reader by `TypeId` (key/body/read.rs).
    ReqBody: 'static,
    ResBody: http_body::Body<Data = Bytes>,
{
    type Response = Response<ThrottleBody<ResBody>>;
    type Error = S::Error;
    type Future = ResponseFuture<S, ReqBody, B::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: Request<ReqBody>) -> Self::Future {
        let Throttle { inner, shared } = self;
        // One read of the policy table: this request is decided by it from start to end. Read
        // here, not cached in the service: axum clones the service for every request, and a
        // cached table is two more reference counts that every core writes per request.
        let mut loaded = None;
        let table = shared.table.read(&mut loaded);
        let judge = &table.judge;
        // Where a policy names near limits to its handler, never a name the client sent (whether
        // or not this request meets that policy).
        if table.strips_near {
            near_limit::strip_clients(&mut request);
        }
        // 1 (steps.rs): the first matching policy decides.
        let matched = steps::match_policy(table, &request);
        // 1b: the overload gate, before any limit.
        if let Some(gate) = &judge.settings.overload {
            return match steps::overload(gate, judge, matched, &request) {
                Ok(in_flight) => {
                    decide(inner, shared, (table, matched), request).holding(in_flight)
                }
                Err(refusal) => {
                    crate::meter::unserved(request.extensions());
                    ResponseFuture::refused(refusal)
                }
            };
        }
        decide(inner, shared, (table, matched), request)
    }
}

/// Steps 2 to 9 of a request that `matched` (a policy, or none), with its table in force.
#[inline(always)]
fn decide<S, K, B, ReqBody>(
    inner: &mut S,
    shared: &Arc<Shared<K, B>>,
    (table, matched): (&Table<K>, Option<&Policy<K>>),
    request: Request<ReqBody>,
) -> ResponseFuture<S, ReqBody, B::Future>
where
    S: Service<Request<ReqBody>> + Clone,
    K: KeyExtractor<ReqBody> + Send + Sync + 'static,
    B: Backend,
    ReqBody: 'static,
{
    let judge = &table.judge;
    let Some(policy) = matched else {
        // No policy applies: only the access lists may answer.
        let head = RequestRef::of(&request);
        return match steps::access(shared, judge, None, None, head) {
            Some(verdict) => ResponseFuture::carry_out(verdict, (inner, true), request, None, None),
            None => ResponseFuture::unlimited(inner.call(request)),
        };
    };
    let rules = policy.compiled();
    // The extended path (engine/extended.rs): unused, its features cost this check.
    if let Some(extras) = steps::extras(shared, rules) {
        let extras = extras.clone();
        return call_extended(inner, shared, (judge, policy, extras), request);
    }
    // 2: the key; 3-6: access lists, a missing key, the tier, the ban, unless the policy is
    // `straight` (the commonest) and the layer has no access lists: then tier 0 at once.
    let (key, tier) = match steps::key_of(policy, &request) {
        Ok(key) if rules.straight && shared.access.is_none() => (key, 0),
        key => 'steps: {
            let head = RequestRef::of(&request);
            let verdict = match steps::keyed(shared, judge, rules, key, head) {
                Ok(key) => match steps::tier_unless_banned(judge, rules, None, &key, head) {
                    Ok(tier) => break 'steps (key, tier),
                    Err(banned) => banned,
                },
                Err(verdict) => verdict,
            };
            return ResponseFuture::carry_out(verdict, (inner, true), request, None, None);
        }
    };
    // 7-9: the backend, the verdict, carrying it out. The request is moved once, into the
    // inner service or `answered`: every move of it is a copy.
    match check(&shared.backend, judge, (rules, tier), &key, &request) {
        Ask::Passed => ResponseFuture::unlimited(inner.call(request)),
        Ask::Admitted(fields) => ResponseFuture::admitted(inner.call(request), fields),
        Ask::Other(asked, started, pressed) => {
            let asked = (asked, started, pressed);
            answered(inner, shared, (judge, rules, tier), (key, request), asked)
        }
    }
}

/// Asks the backend. A backend that decides without waiting (memory) is done after one poll, and a
/// plain admission goes out from here, with no verdict built; every other answer is [`answered`].
#[inline(always)]
fn check<B, ReqBody>(
    backend: &B,
    judge: &Judge,
    (policy, tier): (&CompiledPolicy, usize),
    key: &Key,
    request: &Request<ReqBody>,
) -> Ask<B::Future>
where
    B: Backend,
{
    let started = MEASURE_LATENCY.then(Instant::now);
    let pressed = judge.pressed_for(policy);
    let limits = judge.limits_to_ask(policy, &policy.tiers[tier], key, pressed);
    let mut decided = backend.check(Charges::stack(limits, key, policy.cost));
    let mut noop = Context::from_waker(Waker::noop());
    let asked = match Pin::new(&mut decided).poll(&mut noop) {
        // Matched by reference, so that any other answer moves on whole (a `Decision` bound by
        // value is a copy, and the answer left behind would be dropped: a call on every 429).
        Poll::Ready(answer) => {
            // One limit (the commonest policy): a plain admission wraps no answer for a stack.
            if let Ok(Decisions::One(decision)) = &answer {
                let context = RequestContext::new(policy, tier, key, request, pressed);
                if judge.admitted_plainly(context, decision) {
                    judge.backend_answered(policy, started, true);
                    if !judge.sends_fields() {
                        return Ask::Passed;
                    }
                    let fields = judge.fields(context.tier, slice::from_ref(decision), decision);
                    return Ask::Admitted(fields);
                }
            }
            Asked::Answered(answer)
        }
        Poll::Pending => Asked::Pending(decided),
    };
    Ask::Other(asked, started, pressed)
}

/// What `check` found.
enum Ask<D> {
    /// Admitted plainly by a layer that sends no fields: the request goes through as it is.
    Passed,
    /// Admitted plainly: the request goes through, and these fields on its response.
    Admitted(RateHeaders),
    /// Every other answer, when the backend was asked (if measured) and whether the request's
    /// limits bite under pressure ([`RequestContext::pressed`]): for [`answered`].
    Other(Asked<D>, Option<Instant>, bool),
}

/// Where the backend's answer stands after `check`.
enum Asked<D> {
    Answered(Result<Decisions, BackendError>),
    /// Polled once, and pending (a remote backend).
    Pending(D),
}

/// The verdict on every answer but a plain admission by one limit: judged and carried out at once
/// if the backend has answered; otherwise the response future waits for it.
// Out of line: `check` makes the commonest answer itself.
#[inline(never)]
fn answered<S, K, B, ReqBody>(
    inner: &mut S,
    shared: &Arc<Shared<K, B>>,
    (judge, policy, tier): (&Arc<Judge>, &Arc<CompiledPolicy>, usize),
    (key, request): (Key, Request<ReqBody>),
    (asked, started, pressed): (Asked<B::Future>, Option<Instant>, bool),
) -> ResponseFuture<S, ReqBody, B::Future>
where
    S: Service<Request<ReqBody>> + Clone,
    K: Send + Sync + 'static,
    B: Backend,
{
    let check = match asked {
        Asked::Pending(check) => check,
        Asked::Answered(answer) => {
            let context = RequestContext::new(policy, tier, &key, &request, pressed);
            let verdict = judge.verdict(context, context.charges(), started, answer);
            let charged = (&policy.tiers[tier], policy.cost);
            let release = steps::release_of(&verdict, shared, judge, charged, &key);
            return ResponseFuture::carry_out(verdict, (inner, true), request, release, None);
        }
    };
    // The decision is remote: the response future waits for it as for the extended path's, with
    // the readied service beside it.
    let limit = &policy.tiers[tier].limits[0];
    let release = (limit.algorithm() == Algorithm::Concurrency)
        .then(|| releaser(shared, judge, limit, policy.cost, key.clone()));
    let (judge, policy) = (judge.clone(), policy.clone());
    let (parts, body) = request.into_parts();
    let prepare = async move {
        let answer = check.await;
        let request = RequestRef::of_parts(&parts);
        let context = RequestContext::at(&policy, &policy.tiers[tier], &key, request, pressed);
        let verdict = judge.verdict(context, context.charges(), started, answer);
        let (outcome, body) = (None, None);
        Prepared {
            parts,
            verdict,
            release,
            outcome,
            body,
        }
    };
    ResponseFuture::preparing(Box::pin(prepare), (take_readied(inner), true), Some(body))
}

/// The extended path for a request that `policy` (with `extras`) applies to.
// Never inlined: the extended path boxes its future anyway, and kept out of `call` it leaves
// the fast path's code as small as before.
#[inline(never)]
fn call_extended<S, K, B, ReqBody>(
    inner: &mut S,
    shared: &Arc<Shared<K, B>>,
    (judge, policy, extras): (&Arc<Judge>, &Policy<K>, Arc<PolicyExtras>),
    request: Request<ReqBody>,
) -> ResponseFuture<S, ReqBody, B::Future>
where
    S: Service<Request<ReqBody>> + Clone,
    K: KeyExtractor<ReqBody> + Send + Sync + 'static,
    B: Backend,
    ReqBody: 'static,
{
    // A synchronous key is read here, where the body's type is known; an async one or one from
    // the body later.
    let body_key = extras.body.as_ref().is_some_and(|rule| rule.key.is_some());
    let key = match &extras.async_key {
        Some(async_key) => KeyAhead::Async(async_key.clone()),
        None if body_key => KeyAhead::Body,
        None => KeyAhead::Read(steps::key_of(policy, &request)),
    };
    let (parts, body) = request.into_parts();
    let (ahead, body) = match &extras.body {
        Some(rule) => {
            let (ahead, body) = BodyAhead::start(body, rule);
            (Some(ahead), body)
        }
        None => (None, Some(body)),
    };
    let scope = Scope {
        shared: shared.clone(),
        judge: judge.clone(),
        policy: policy.compiled().clone(),
        extras,
    };
    // As on the plain path: a verdict made at once is carried out at once.
    if scope.waits_for_backend_only(&key, ahead.as_ref())
        && let KeyAhead::Read(key) = key
    {
        return match scope.decide_now(key, parts) {
            Ok(prepared) => ResponseFuture::carry_out_prepared(prepared, (inner, true), body),
            Err(waiting) => ResponseFuture::preparing(waiting, (take_readied(inner), true), body),
        };
    }
    // A wait the client sets the length of (its body, an async key, a resolver): what readying
    // reserved (a permit of an inner concurrency limit) is not held through it, as through a
    // delay; the service is readied once admitted. (Shadow limits alone wait for the backend.)
    let client_waits = scope.client_waits(&key, ahead.as_ref());
    let service = match client_waits {
        true => {
            drop(take_readied(inner));
            inner.clone()
        }
        false => take_readied(inner),
    };
    let prepare = prepare(scope, (key, ahead), parts);
    ResponseFuture::preparing(Box::pin(prepare), (service, !client_waits), body)
}
