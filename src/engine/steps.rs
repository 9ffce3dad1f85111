//! The steps of a request, each written once, in the order the request meets them:
//!
//! 1. [`match_policy`]: the first policy whose route, methods and conditions match (none: no
//!    limit); then [`overload`], the layer's overload gate, for every request;
//! 2. the key: the policy's extractor, at once (`Throttle::call`) or awaited (an async key, on the
//!    extended path);
//! 3. [`access`]: the allow and deny lists, before any limit;
//! 4. [`without_key`]: a request its policy found no key in; then [`overridden`], an operator's
//!    override or timed ban on the key (the extended path and a stream message);
//! 5. the quota: the policy's tier ([`tier_unless_banned`]), or a customer's own quota resolved on
//!    the extended path (a tier of its own);
//! 6. the ban: [`Judge::banned`], before the backend is asked;
//! 7. the backend's check of the request's charges, `Backend::check`;
//! 8. [`Judge::verdict`]: the verdict on its answer, with the backend's latency reported;
//! 9. carrying the verdict out (the response future), with [`release_of`] for a concurrency slot;
//! 10. settling a request counted by its outcome, or a metered request's cost (the extended path).
//!
//! Both paths run this one sequence: `Throttle::call` (middleware/service.rs) for a synchronous key
//! and a static quota, and the extended path (extended.rs), which adds only its awaits — the async
//! key before [`keyed`], the customer's quota before [`tier_unless_banned`], the shadow limits
//! beside the check. A stream message's check (`handle/message.rs`) has its key given: it runs the
//! pre-checks by key, the check, `Judge::weigh` and `Judge::report`. Steps 3–4 and 5–6 are each
//! one function, so their order is written once. Each step is handed the policy that matched
//! (never found again by its place in the table), and reads the request as a [`RequestRef`], which
//! the whole request and its parts both give.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http::{Request, Response};

use crate::access::Access;
use crate::backend::Backend;
use crate::engine::shared::{releaser, Shared};
use crate::engine::slot::Release;
use crate::engine::table::Table;
use crate::engine::verdict::{Admitted, Judge, RequestContext, Verdict};
use crate::key::ahead::Missing;
use crate::key::{Key, KeyExtractor};
use crate::observe::RequestRef;
use crate::overload::{Gate, InFlight, PartitionBy};
use crate::overrides::{InForce, Override};
use crate::policy::extras::PolicyExtras;
use crate::policy::{CompiledPolicy, CompiledTier, Policy};

/// Step 1: the first policy of `table` that matches `request`.
#[inline(always)]
pub(crate) fn match_policy<'t, K, B>(
    table: &'t Table<K>,
    request: &Request<B>,
) -> Option<&'t Policy<K>> {
    table.policies.iter().find(|p| p.applies_to(request))
}

/// Step 1b, before any limit: the overload gate admits the request in its partition (its policy's
/// or its tier's), counting it in flight until its response ends, or sheds it.
// The refusal by value, as every step returns one (boxing it would allocate for every shed). Out
// of line: most layers have no gate.
#[allow(clippy::result_large_err)]
#[inline(never)]
pub(crate) fn overload<K, B>(
    gate: &Arc<Gate>,
    judge: &Judge,
    policy: Option<&Policy<K>>,
    request: &Request<B>,
) -> Result<InFlight, Response<Bytes>> {
    let rules = policy.map(Policy::compiled);
    let name = rules.map(|rules| match gate.partition_by() {
        PartitionBy::Policy => &*rules.name,
        PartitionBy::Tier => {
            let tier = rules.tier_in(request.headers(), request.extensions());
            rules.tiers[tier].name.as_deref().unwrap_or("default")
        }
    });
    gate.admit(gate.partition_of(name)).map_err(|shed| {
        let policy = rules.map(|rules| rules.name());
        (judge.settings.refusals).shed(policy, &shed, RequestRef::of(request))
    })
}

/// Whether `policy`'s requests take the extended path, and with what: its per-request features,
/// or an override or timed ban on one of its keys.
// Always inlined, as `key_of`: every request meets both, and out of line they cost ~50
// instructions a request.
#[inline(always)]
pub(crate) fn extras<'t, K, B>(
    shared: &Shared<K, B>,
    policy: &'t CompiledPolicy,
) -> Option<&'t Arc<PolicyExtras>> {
    policy.extras.as_ref().or_else(|| {
        shared
            .overrides
            .touches(policy.name())
            .then_some(&policy.overridable)
    })
}

/// Step 2, a synchronous key: `request`'s key under `policy`, or what was expected of it.
#[inline(always)]
pub(crate) fn key_of<K, B>(policy: &Policy<K>, request: &Request<B>) -> Result<Key, Missing>
where
    K: KeyExtractor<B>,
{
    let extractor = policy.key();
    extractor
        .extract(request)
        .ok_or_else(|| Missing::Expected(extractor.describe()))
}

/// Step 3: the access lists, which come before limits (an allowed client has none) and may name
/// keys. `Some` when they answer the request: through unlimited, or refused.
pub(crate) fn access<K, B>(
    shared: &Shared<K, B>,
    judge: &Judge,
    policy: Option<&CompiledPolicy>,
    key: Option<&Key>,
    request: RequestRef<'_>,
) -> Option<Verdict> {
    let (lists, source) = shared.access.as_ref()?;
    if lists.is_empty() {
        return None;
    }
    match lists.check(source.address(request.headers, request.extensions), key) {
        Access::Allow => Some(Verdict::Admit(Admitted::unlimited())),
        Access::Deny => Some(judge.forbidden(policy, key, request)),
        Access::Limit => None,
    }
}

/// Step 4: the verdict on a request that `policy` found no key for.
pub(crate) fn without_key(
    judge: &Judge,
    policy: &CompiledPolicy,
    missing: Missing,
    request: RequestRef<'_>,
) -> Verdict {
    match missing {
        Missing::Expected(what) => judge.missing_key(policy, &what, request),
        // The application's key service is slow: not the client's fault (no 400).
        Missing::Late => judge.key_unavailable(policy, request),
    }
}

/// Steps 3 and 4, as both paths run them once the key is known. `Ok`: the key the request goes on
/// with to its limits; `Err`: the verdict that answers it before them.
// The verdict is returned by value, as every step returns it (boxing it would allocate for every
// refusal and every allowed client).
#[allow(clippy::result_large_err)]
pub(crate) fn keyed<K, B>(
    shared: &Shared<K, B>,
    judge: &Judge,
    policy: &CompiledPolicy,
    key: Result<Key, Missing>,
    request: RequestRef<'_>,
) -> Result<Key, Verdict> {
    if let Some(verdict) = access(shared, judge, Some(policy), key.as_ref().ok(), request) {
        return Err(verdict);
    }
    key.map_err(|missing| without_key(judge, policy, missing, request))
}

/// What an operator's override or timed ban in force on a key makes of it ([`overridden`]) (a
/// stream message's access lists answer in its terms too).
pub(crate) enum Overridden<R> {
    /// None in force: the quota the key has without one.
    Own,
    /// An override's quota (`None`: one the policy or the backend cannot take: its own).
    Quota(Option<Arc<CompiledTier>>),
    /// Let through unlimited.
    Unlimited,
    /// Refused as a deny list refuses.
    Blocked,
    /// Refused for a timed ban.
    Banned(R),
}

/// Step 4b, after the access lists and the key, for a request and a stream message alike: the
/// override or timed ban in force on `key` under `policy` (`extras`: the quotas it overrides with,
/// for charges of `cost`). A ban is refused by `banned`, given the tier the key has under it (its
/// override's quota, else `own`'s, as the penalty box's ban shows it) and its rest; `None` where
/// the policy does not enforce it (a dry run, a key outside a staged share): then the key keeps
/// what it has without the ban.
// Inlined: the extended path meets it on every request, and most find nothing in force.
#[inline]
pub(crate) fn overridden<'t, K, B: Backend, R>(
    shared: &Shared<K, B>,
    (policy, extras, cost): (&'t CompiledPolicy, &PolicyExtras, u64),
    key: &Key,
    own: impl FnOnce() -> &'t CompiledTier,
    banned: impl FnOnce(&CompiledTier, Duration) -> Option<R>,
) -> Overridden<R> {
    let (overrides, now) = (&shared.overrides, SystemTime::now());
    let under = match overrides.find(policy.name(), key, now) {
        None => return Overridden::Own,
        Some(InForce::Override(under)) => Some(under),
        Some(InForce::Banned(rest)) => {
            let under = overrides.both(policy.name(), key, now).0;
            let custom = shared.override_tier(extras, under, cost);
            let tier = match custom.as_deref() {
                Some(tier) => tier,
                None => own(),
            };
            if let Some(refusal) = banned(tier, rest) {
                return Overridden::Banned(refusal);
            }
            under
        }
    };
    match under {
        None => Overridden::Own,
        Some(Override::Unlimited) => Overridden::Unlimited,
        Some(Override::Blocked) => Overridden::Blocked,
        quota => Overridden::Quota(shared.override_tier(extras, quota, cost)),
    }
}

/// Steps 5 and 6, as both paths run them once the quota is known (`custom`: a customer's, in place
/// of the policy's tiers). `Ok`: the tier's number (0 for a customer's); `Err`: the ban's refusal.
#[allow(clippy::result_large_err)] // as `keyed`'s
pub(crate) fn tier_unless_banned(
    judge: &Judge,
    policy: &CompiledPolicy,
    custom: Option<&CompiledTier>,
    key: &Key,
    request: RequestRef<'_>,
) -> Result<usize, Verdict> {
    let (number, tier) = match custom {
        Some(custom) => (0, custom),
        None => {
            let number = policy.tier_in(request.headers, request.extensions);
            (number, &policy.tiers[number])
        }
    };
    let pressed = judge.pressed_for(policy);
    match judge.banned(RequestContext::at(policy, tier, key, request, pressed)) {
        Some(banned) => Err(banned),
        None => Ok(number),
    }
}

/// Step 9: the release of an admitted request's concurrency slot, if it holds one, under `tier`'s
/// first limit (a customer's or an override's tier has limits of its own).
pub(crate) fn release_of<K, B>(
    verdict: &Verdict,
    shared: &Arc<Shared<K, B>>,
    judge: &Arc<Judge>,
    (tier, cost): (&CompiledTier, u64),
    key: &Key,
) -> Option<Release>
where
    K: Send + Sync + 'static,
    B: Backend,
{
    match verdict {
        Verdict::Admit(admitted) if admitted.slot.is_some() => {
            Some(releaser(shared, judge, &tier.limits[0], cost, key.clone()))
        }
        _ => None,
    }
}
