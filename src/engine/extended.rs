//! The extended path of [`Throttle`]: requests of a policy that uses per-customer quotas, an async
//! key, a key or estimate from the body, quotas with keys of their own, counting by outcome, shadow
//! limits, or whose keys an override or timed ban names. It runs the steps of `steps.rs` with these
//! features' own between them, and stays synchronous until the first step that must wait: a
//! request that waits for nothing but the backend is decided at once ([`Scope::decide_now`]), any
//! other by one boxed future ([`prepare`]). Policies that use none of this never come here: for
//! them the whole cost is the `Option` check in `Throttle::call`.
//!
//! [`Throttle`]: crate::Throttle

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use http::request::Parts;

use crate::backend::{AdjustLater, Adjustment, Backend, Charges, Decisions};
use crate::decision::Decision;
use crate::engine::shared::Shared;
use crate::engine::slot::Release;
use crate::engine::steps::{self, Overridden};
use crate::engine::verdict::{not_one_per_limit, Admitted, Judge, RequestContext, Verdict};
use crate::error::BackendError;
use crate::key::ahead::{BodyAhead, KeyAhead, Missing};
use crate::key::body::read::ErasedBody;
use crate::key::Key;
use crate::limit::MAX_STACKED_QUOTAS;
use crate::meter::{Meter, MeterGuard};
use crate::observe::{RequestRef, MEASURE_LATENCY};
use crate::outcome::OutcomeGuard;
use crate::per_customer::Namespace;
use crate::policy::extras::PolicyExtras;
use crate::policy::{CompiledPolicy, CompiledTier};
use crate::quota::Quota;
use crate::rollout::shadows::with_shadows;

/// The extended path's verdict, with what carrying it out needs besides a body kept aside.
pub(crate) struct Prepared {
    pub(crate) parts: http::request::Parts,
    pub(crate) verdict: Verdict,
    pub(crate) release: Option<Release>,
    pub(crate) outcome: Option<Box<OutcomeGuard>>,
    /// The request body, rebuilt after the policy read it (an `Option` of the request's body
    /// type); `None` when it was not read (the response future kept it).
    pub(crate) body: Option<ErasedBody>,
}

/// The future that makes a [`Prepared`] verdict: key, quota, access lists, ban and backend.
pub(crate) type Preparing = Pin<Box<dyn Future<Output = Prepared> + Send>>;

/// What every step of the extended path reads (`judge`, `policy`: of the table the request read).
pub(crate) struct Scope<K, B> {
    pub(crate) shared: Arc<Shared<K, B>>,
    pub(crate) judge: Arc<Judge>,
    pub(crate) policy: Arc<CompiledPolicy>,
    pub(crate) extras: Arc<PolicyExtras>,
}

/// The steps of [`Scope::decide_now`], with the awaits between them (the body, an async key, a
/// resolver's quota, shadow limits beside the backend).
pub(crate) async fn prepare<K, B>(
    scope: Scope<K, B>,
    (key, body): (KeyAhead, Option<BodyAhead>),
    parts: Parts,
) -> Prepared
where
    K: Send + Sync + 'static,
    B: Backend,
{
    let extras = &scope.extras;
    let unreadable = |why: &str| {
        let log = &extras.log;
        log.record(extras.name(), "request body", why, "no key from the body");
    };
    let (read, whole) = match body {
        Some(body) => body.read(unreadable).await,
        None => (None, None),
    };
    let mut prepared = scope.prepare_read(key, parts, whole.as_deref()).await;
    prepared.body = read;
    prepared
}

/// How a request of the extended path comes by its quota: given by an override in force (`None`:
/// the policy's own), or the policy's own way (a customer's, which a resolver may be awaited for).
enum QuotaAhead {
    Given(Option<Arc<CompiledTier>>),
    Own,
}

/// A request past its pre-checks: what its charges and, with the answer, its verdict are made of.
pub(crate) struct Asking {
    key: Key,
    parts: Parts,
    tier: usize,
    custom: Option<Arc<CompiledTier>>,
    /// Quotas with keys of their own: each limit's key.
    limit_keys: Option<Vec<Key>>,
    /// A metered limit's reservation.
    estimate: Option<u64>,
    asked: Instant,
    /// [`RequestContext::pressed`], read once for what is asked and what is made of the answer.
    pressed: bool,
}

impl Asking {
    /// The tier the request is charged under: a customer's or override's, or one of `policy`'s.
    fn tier<'a>(&'a self, policy: &'a CompiledPolicy) -> &'a CompiledTier {
        self.custom.as_deref().unwrap_or(&policy.tiers[self.tier])
    }
}

impl<K, B> Scope<K, B>
where
    K: Send + Sync + 'static,
    B: Backend,
{
    /// Whether the request waits for nothing but the backend: then [`Self::decide_now`] decides it,
    /// with no future boxed unless the backend is remote.
    pub(crate) fn waits_for_backend_only(&self, key: &KeyAhead, body: Option<&BodyAhead>) -> bool {
        !self.client_waits(key, body) && self.extras.shadows.is_empty()
    }

    /// Whether the request waits for something its client sets the length of: its body, an async
    /// key (which may read it), a quota resolver.
    pub(crate) fn client_waits(&self, key: &KeyAhead, body: Option<&BodyAhead>) -> bool {
        !matches!(key, KeyAhead::Read(_)) || body.is_some() || self.extras.quotas.resolves()
    }

    /// The steps at once: `Ok` with the verdict, or `Err` with the future that awaits it remotely.
    pub(crate) fn decide_now(
        self,
        key: Result<Key, Missing>,
        parts: Parts,
    ) -> Result<Prepared, Preparing> {
        let (key, parts, limit_keys, quota) = match self.keyed(key, parts) {
            Ok(keyed) => keyed,
            Err(answered) => return Ok(answered),
        };
        let custom = match quota {
            QuotaAhead::Given(custom) => custom,
            QuotaAhead::Own => {
                let quota = self.extras.quotas.quota_now(&parts, &key);
                quota.and_then(|quota| self.customer_quota(quota))
            }
        };
        let asking = match self.asking((key, parts), limit_keys, custom, None) {
            Ok(asking) => asking,
            Err(answered) => return Ok(answered),
        };
        let mut check = self.ask(&asking);
        let mut noop = Context::from_waker(Waker::noop());
        match Pin::new(&mut check).poll(&mut noop) {
            Poll::Ready(answer) => Ok(self.finish(asking, answer, None)),
            Poll::Pending => Err(Box::pin(async move {
                let answer = check.await;
                self.finish(asking, answer, None)
            })),
        }
    }

    /// [`prepare`], once the body (if the policy reads it) is read: `whole`, if it came whole.
    async fn prepare_read(&self, key: KeyAhead, parts: Parts, whole: Option<&[u8]>) -> Prepared {
        let extras = &self.extras;
        let field = extras.body.as_ref().and_then(|rule| rule.key.as_ref());
        let late = |timeout| {
            let why = format!("no key within {timeout:?}");
            (extras.log).record(extras.name(), "async key", &why, "the failure policy");
        };
        let (parts, key) = key.resolve(parts, (whole, field), late).await;
        let (key, parts, limit_keys, quota) = match self.keyed(key, parts) {
            Ok(keyed) => keyed,
            Err(answered) => return answered,
        };
        let custom = match quota {
            QuotaAhead::Given(custom) => custom,
            QuotaAhead::Own => {
                let quota = extras.quotas.quota_of(&parts, &key).await;
                quota.and_then(|quota| self.customer_quota(quota))
            }
        };
        let asking = match self.asking((key, parts), limit_keys, custom, whole) {
            Ok(asking) => asking,
            Err(answered) => return answered,
        };
        let check = self.ask(&asking);
        if extras.shadows.is_empty() {
            return self.finish(asking, check.await, None);
        }
        let (shared, cost) = (&self.shared, self.policy.cost);
        let shadows = &extras.shadows;
        let (answer, shadowed) =
            with_shadows(check, &shared.backend, shadows, &asking.key, cost).await;
        self.finish(asking, answer, Some(shadowed))
    }

    /// Steps 3 and 4 (with a quota's own key), and what an override or timed ban in force makes of
    /// the request; `Err`: answered before the backend.
    #[allow(clippy::type_complexity, clippy::result_large_err)] // the verdict by value, as `steps::keyed`'s
    fn keyed(
        &self,
        key: Result<Key, Missing>,
        parts: Parts,
    ) -> Result<(Key, Parts, Option<Vec<Key>>, QuotaAhead), Prepared> {
        let (shared, judge, rules) = (&self.shared, &self.judge, &*self.policy);
        let extras = &self.extras;
        let key = match steps::keyed(shared, judge, rules, key, RequestRef::of_parts(&parts)) {
            Ok(key) => key,
            Err(verdict) => return Err(with_meter(answered(parts, verdict), extras)),
        };
        let (parts, limit_keys) = extras.limit_keys_of(rules.tiers[0].limits.len(), &key, parts);
        let limit_keys = match limit_keys.transpose() {
            Ok(keys) => keys,
            Err(missing) => {
                let request = RequestRef::of_parts(&parts);
                let verdict = steps::without_key(judge, rules, missing, request);
                return Err(answered(parts, verdict));
            }
        };
        let request = RequestRef::of_parts(&parts);
        let own = || &rules.tiers[rules.tier_in(request.headers, request.extensions)];
        let banned = |tier: &_, rest| {
            let cx = RequestContext::at(rules, tier, &key, request, judge.pressed_for(rules));
            judge.banned_for(cx, rest)
        };
        let verdict =
            match steps::overridden(shared, (rules, extras, rules.cost), &key, own, banned) {
                Overridden::Own => return Ok((key, parts, limit_keys, QuotaAhead::Own)),
                Overridden::Quota(custom) => {
                    return Ok((key, parts, limit_keys, QuotaAhead::Given(custom)));
                }
                Overridden::Unlimited => Verdict::Admit(Admitted::unlimited()),
                Overridden::Blocked => judge.forbidden(Some(rules), Some(&key), request),
                Overridden::Banned(verdict) => verdict,
            };
        Err(with_meter(answered(parts, verdict), extras))
    }

    /// Steps 5 and 6, and the metered estimate (from the parts and `whole` body); `Err`: banned.
    #[allow(clippy::result_large_err)] // as `keyed`'s
    fn asking(
        &self,
        (key, parts): (Key, Parts),
        limit_keys: Option<Vec<Key>>,
        custom: Option<Arc<CompiledTier>>,
        whole: Option<&[u8]>,
    ) -> Result<Asking, Prepared> {
        let request = RequestRef::of_parts(&parts);
        let rules = &*self.policy;
        let custom_tier = custom.as_deref();
        let tier = match steps::tier_unless_banned(&self.judge, rules, custom_tier, &key, request) {
            Ok(tier) => tier,
            Err(banned) => return Err(answered(parts, banned)),
        };
        let estimate = self
            .extras
            .metered
            .as_ref()
            .map(|m| m.estimate(&parts, whole));
        Ok(Asking {
            key,
            parts,
            tier,
            custom,
            limit_keys,
            estimate,
            asked: Instant::now(),
            pressed: self.judge.pressed_for(rules),
        })
    }

    /// Step 7: asks the backend for the request's [`charges`](Self::charges).
    fn ask(&self, asking: &Asking) -> B::Future {
        let mut quantities = [0; MAX_STACKED_QUOTAS];
        self.shared
            .backend
            .check(self.charges(asking, &mut quantities))
    }

    /// A metered limit reserves the request's estimate, the others take its cost (`quantities`:
    /// room for one per limit); an override's quota counts against the policy's key alone.
    fn charges<'a>(
        &'a self,
        asking: &'a Asking,
        quantities: &'a mut [u64; MAX_STACKED_QUOTAS],
    ) -> Charges<'a> {
        let (rules, extras) = (&*self.policy, &self.extras);
        let limits =
            self.judge
                .limits_to_ask(rules, asking.tier(rules), &asking.key, asking.pressed);
        let key = &asking.key;
        match (&extras.metered, asking.estimate) {
            (Some(metered), Some(estimate)) => {
                metered.charges((limits, key), (rules.cost, estimate), quantities)
            }
            _ => match asking
                .limit_keys
                .as_deref()
                .filter(|_| asking.custom.is_none())
            {
                Some(keys) => Charges::keyed(limits, keys, rules.cost),
                None => Charges::stack(limits, key, rules.cost),
            },
        }
    }

    /// Step 8: the verdict on the backend's `answer` (the shadow limits' decisions reported), with
    /// the guards that settle an admitted request after its response.
    fn finish(
        &self,
        asking: Asking,
        answer: Result<Decisions, BackendError>,
        shadowed: Option<Vec<Result<Decision, BackendError>>>,
    ) -> Prepared {
        let (judge, rules, extras) = (&self.judge, &*self.policy, &self.extras);
        let mut quantities = [0; MAX_STACKED_QUOTAS];
        let charges = self.charges(&asking, &mut quantities);
        let request = RequestRef::of_parts(&asking.parts);
        let tier = asking.tier(rules);
        let cx = RequestContext::at(rules, tier, &asking.key, request, asking.pressed);
        if let Some(shadowed) = shadowed {
            judge.shadowed((rules, &asking.key), &extras.shadows, shadowed);
        }
        // Only what the backend took can be given back, and only while it counts there (the
        // longest `reset_after`: each limit bounds its own give-back by `since`, so a stack's
        // shorter limit does not forfeit its longer one's). A failed backend took nothing; the
        // local limiter that decides in its stead (`OnBackendError::Local`) is adjusted instead,
        // as long as it keeps the key.
        // An answer of the wrong length is a failure (the judge's too), before anything is taken
        // as given back: the local limiter decides it, and is adjusted.
        let answer = answer.and_then(|all| match all.len() == charges.limits().len() {
            true => Ok(all),
            false => Err(not_one_per_limit(all.len(), charges.limits().len())),
        });
        let local = answer.is_err() && judge.fallback.is_local();
        // And the decisions, for what is given back: a GCRA gives a busy key's units back whole.
        let (mut counts_for, admitted) = match &answer {
            Ok(all) if all.iter().all(|d| d.allowed) => {
                let gives_back = extras.outcome.is_some() || extras.metered.is_some();
                let gives_back = gives_back && all.len() == charges.limits().len();
                let admitted = match gives_back {
                    true => Arc::from(&all[..]),
                    false => Arc::default(),
                };
                (all.iter().map(|d| d.reset_after).max(), admitted)
            }
            _ => (None, Arc::default()),
        };
        let asked = asking.asked;
        let started = MEASURE_LATENCY.then_some(asked);
        let verdict = match answer {
            // The local limiter keeps what it took (every limit admitting) until adjusted; a
            // refusal a dry run let through took nothing there.
            Err(error) if local => {
                judge.backend_answered(rules, started, false);
                let (verdict, took) = judge.failed_taking(cx, charges, error);
                counts_for = took.then_some(Duration::MAX);
                verdict
            }
            answer => judge.verdict(cx, charges, started, answer),
        };
        let Asking {
            key,
            parts,
            tier,
            custom,
            estimate,
            ..
        } = asking;
        let taken = Taken {
            asked,
            counts_for,
            local,
            admitted,
        };
        let charged = custom.as_deref().unwrap_or(&rules.tiers[tier]);
        let release = steps::release_of(&verdict, &self.shared, judge, (charged, rules.cost), &key);
        let mut prepared = answered(parts, verdict);
        prepared.release = release;
        if let Verdict::Admit(_) = prepared.verdict {
            let parts = &mut prepared.parts;
            prepared.outcome = self.settle_later(parts, &taken, (tier, custom), key, estimate);
        }
        prepared
    }

    /// The limits of a customer's `quota`, if they can be enforced for this policy's requests.
    fn customer_quota(&self, quota: Quota) -> Option<Arc<CompiledTier>> {
        let validate = |limit: &_| self.shared.validate_one(limit);
        let quotas = &self.extras.quotas;
        quotas.custom_tier(Namespace::Customer, quota, self.policy.cost, validate)
    }

    /// What settles an admitted request after its response: its handler's meter (a metered
    /// policy, whether or not the backend took the reservation: the handler reports on it either
    /// way), and the guard that settles its cost, or gives its units back if the response does not
    /// count, when the backend (or the local limiter in its stead) took them.
    fn settle_later(
        &self,
        parts: &mut Parts,
        taken: &Taken,
        (tier, custom): (usize, Option<Arc<CompiledTier>>),
        key: Key,
        estimate: Option<u64>,
    ) -> Option<Box<OutcomeGuard>> {
        let meter = estimate.map(|estimate| Meter::for_request(parts, estimate));
        let guard = match (meter, &self.extras.metered, &self.extras.outcome) {
            (Some(meter), Some(rule), _) => Ok((meter, rule)),
            (_, _, Some(rule)) => Err(rule),
            _ => return None,
        };
        let counts_for = taken.counts_for?;
        let adjust = self.adjust_later(taken, (tier, custom), key);
        Some(Box::new(match guard {
            Ok((meter, rule)) => {
                OutcomeGuard::metered(MeterGuard::new(meter, rule, adjust, taken.asked))
            }
            Err(rule) => OutcomeGuard::new(rule.clone(), adjust, taken.asked, counts_for),
        }))
    }

    /// Adjusts what an admitted request took, after its response, where it was taken: the backend,
    /// or the local limiter that decided in its stead (`taken.local`).
    fn adjust_later(
        &self,
        taken: &Taken,
        (tier, custom): (usize, Option<Arc<CompiledTier>>),
        key: Key,
    ) -> AdjustLater {
        // Only the one it adjusts is kept (each clone is a count every core writes).
        let to = match taken.local {
            true => Err(self.judge.clone()),
            false => Ok(self.shared.clone()),
        };
        let (policy, admitted) = (self.policy.clone(), taken.admitted.clone());
        Box::new(move |deltas, since| {
            let limits = &custom.as_deref().unwrap_or(&policy.tiers[tier]).limits;
            let admitted = &admitted;
            let (charges, adjustment) = match deltas {
                None => {
                    let charges = Charges::stack(limits, &key, policy.cost);
                    (charges, Adjustment::Refund { since, admitted })
                }
                Some(deltas) => {
                    let deltas = &deltas[..limits.len()];
                    let settle = Adjustment::Settle {
                        deltas,
                        since,
                        admitted,
                    };
                    (Charges::stack(limits, &key, 0), settle)
                }
            };
            match &to {
                Ok(shared) => shared.backend.adjust(charges, adjustment),
                Err(judge) => judge.fallback.adjust(charges, adjustment),
            }
        })
    }
}

/// When the backend was asked, and how long the units it took count there (`None`: it took none).
struct Taken {
    asked: Instant,
    counts_for: Option<Duration>,
    /// Taken by the local limiter, the backend having failed.
    local: bool,
    /// Each limit's decision as the backend took the units, for a policy that gives units back
    /// (else empty).
    admitted: Arc<[Decision]>,
}

/// A metered policy's request let through before the backend (an allowed client, a missing key):
/// its handler still finds a [`Meter`], on which nothing is settled (nothing was reserved).
fn with_meter(mut prepared: Prepared, extras: &PolicyExtras) -> Prepared {
    if let (Some(_), Verdict::Admit(_)) = (&extras.metered, &prepared.verdict) {
        Meter::for_request(&mut prepared.parts, 0);
    }
    prepared
}

/// Answered before the backend (a refusal, or let through unlimited).
fn answered(parts: Parts, verdict: Verdict) -> Prepared {
    Prepared {
        parts,
        verdict,
        release: None,
        outcome: None,
        body: None,
    }
}
