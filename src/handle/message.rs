//! One message of a long-lived stream (`ThrottleHandle::check`), checked as the layer checks a
//! request, with no request to answer: the handler gets the [`Decision`].

use std::sync::Arc;
use std::time::Duration;

use crate::access::Access;

use crate::backend::{Backend, Charges, Decisions};
use crate::decision::Decision;
use crate::engine::shared::Shared;
use crate::engine::steps::{self, Overridden};
use crate::engine::verdict::{not_one_per_limit, Judge};
use crate::error::BackendError;
use crate::key::Key;
use crate::limit::Algorithm;
use crate::policy::{CompiledPolicy, CompiledTier};
use crate::rollout::shadows::with_shadows;

/// Why a policy cannot check messages, if it cannot.
pub(crate) fn unsupported(policy: &CompiledPolicy, cost: u64) -> Option<String> {
    let limits = &policy.tiers[0].limits;
    if limits[0].algorithm() == Algorithm::Concurrency {
        return Some("a concurrency limit holds a slot per request, not per message".into());
    }
    if limits.iter().any(|l| l.delay().is_some()) {
        return Some(
            "a delayed limit makes a request wait for its turn, which a message cannot".into(),
        );
    }
    if limits.iter().any(|l| l.is_metered()) {
        return Some(
            "a metered limit settles a cost after a response, which a message has not".into(),
        );
    }
    if policy
        .extras
        .as_ref()
        .is_some_and(|e| e.limit_keys.is_some())
    {
        return Some(
            "its quotas have keys of their own, read from a request, which a message check (one \
             key) does not give"
                .into(),
        );
    }
    match cost {
        0 => too_costly(policy, cost),
        _ => None,
    }
}

/// Why a message of `cost` cannot be checked under `policy`'s own quota, if it cannot: asked only
/// where no override is in force (an override's quota judges the cost itself, an unlimited one
/// or an allowed key takes any).
pub(crate) fn too_costly(policy: &CompiledPolicy, cost: u64) -> Option<String> {
    let most = (policy.tiers[0].limits.iter())
        .map(|l| l.max_cost())
        .min()
        .unwrap_or(0);
    (cost == 0 || cost > most).then(|| format!("a message costs 1 to {most} units, not {cost}"))
}

/// A message's steps before the backend, as a request's with its key given: the access lists by key
/// (and, for a key that is an address, by network: the key's address, as the policy's key groups
/// it, where the upgrade met them by its client's), then an override or timed ban in force on the
/// key (a ban the policy does not enforce leaves the key the quota it has without it). `Ok`: the
/// limits of its quota override, if any; `Err`: its answer.
pub(crate) fn before_backend<K, B: Backend>(
    shared: &Shared<K, B>,
    judge: &Judge,
    policy: &CompiledPolicy,
    key: &Key,
) -> Result<Option<Arc<CompiledTier>>, Decision> {
    let limit = policy.tiers[0].limit_value;
    let unlimited = Decision::allowed(limit, limit, Duration::ZERO);
    let mut blocked = Decision::banned(limit, Duration::ZERO, None, Duration::ZERO);
    blocked.retry_after = None;
    let own = || &policy.tiers[0];
    let pressed = || judge.pressed_for(policy);
    let banned = |tier: &_, rest| judge.message_banned(policy, tier, key, (rest, pressed()));
    // The lists first: an allowed key is let through and a denied one refused, as an override
    // would. Then, whatever the cost: one past an override's quota is refused for good there, not
    // checked against the policy's more generous quota. A quota the backend cannot enforce falls
    // back to the policy's (logged), as for a request.
    let access = shared
        .access
        .as_ref()
        .map(|(lists, _)| lists.check(key.ip(), Some(key)));
    let before = match access {
        Some(Access::Allow) => Overridden::Unlimited,
        Some(Access::Deny) => Overridden::Blocked,
        Some(Access::Limit) | None => {
            steps::overridden(shared, (policy, &policy.overridable, 0), key, own, banned)
        }
    };
    match before {
        Overridden::Own => Ok(None),
        Overridden::Quota(custom) => Ok(custom),
        Overridden::Unlimited => Err(unlimited),
        Overridden::Blocked => {
            crate::observe::forbidden();
            Err(blocked)
        }
        Overridden::Banned(refused) => Err(refused),
    }
}

impl Judge {
    /// Checks a message of `cost` units for `key` under `policy`'s default tier: its ban first,
    /// then the backend, then the steps a request's verdict opens and closes with
    /// ([`Judge::weigh`], [`Judge::report`]). A refusal the policy does not enforce comes back
    /// allowed.
    pub(crate) async fn message<B: Backend>(
        &self,
        backend: &B,
        policy: &CompiledPolicy,
        key: &Key,
        cost: u64,
        custom: Option<&CompiledTier>,
    ) -> Result<Decision, BackendError> {
        let tier = custom.unwrap_or(&policy.tiers[0]);
        // Read once: what the backend is asked and what is made of its answer agree.
        let pressed = self.pressed_for(policy);
        if let Some(rest) = policy.penalty.as_ref().and_then(|p| p.banned(key))
            && let Some(refused) = self.message_banned(policy, tier, key, (rest, pressed))
        {
            return Ok(refused);
        }
        let limits = self.limits_to_ask(policy, tier, key, pressed);
        let check = backend.check(Charges::stack(limits, key, cost));
        // Shadow limits count messages as they count requests, beside the policy's own.
        let shadows = policy.shadow_limits();
        let answer = match shadows.is_empty() {
            true => check.await,
            false => {
                let (answer, shadowed) = with_shadows(check, backend, shadows, key, cost).await;
                self.shadowed((policy, key), shadows, shadowed);
                answer
            }
        };
        // As a request's verdict takes them: a stack's decisions one per limit.
        let mut decisions = match answer {
            Ok(Decisions::Many(all)) if all.len() != limits.len() => {
                let error = not_one_per_limit(all.len(), limits.len());
                return Err(self.message_failed(policy, error));
            }
            Ok(all) => {
                self.errors.decided();
                all.into_vec()
            }
            Err(error) => return Err(self.message_failed(policy, error)),
        };
        let mut weighed = self.weigh(policy, tier, key, &mut decisions, (true, pressed));
        self.report(policy, tier, key, &decisions, &mut weighed);
        let decision = weighed.decision;
        // As a request's: what a dry run lets through counts as near too.
        if let Some(near) = policy
            .near
            .as_ref()
            .filter(|_| decision.allowed || !weighed.enforced)
        {
            policy
                .near_report
                .near_message(near, &policy.name, &tier.names, &decisions);
        }
        Ok(match decision.allowed || weighed.enforced {
            true => decision,
            false => Decision::allowed(decision.limit, decision.remaining, decision.reset_after),
        })
    }

    /// The refusal of a message whose key is banned for `rest` yet (by the penalty box or an
    /// operator's timed ban), reported; `None` where the policy does not enforce it (a dry run, a
    /// key outside a staged share): the message is checked, and counted, as without it.
    fn message_banned(
        &self,
        policy: &CompiledPolicy,
        tier: &CompiledTier,
        key: &Key,
        (rest, pressed): (Duration, bool),
    ) -> Option<Decision> {
        let mut decisions = tier.banned_for(rest);
        let mut weighed = self.weigh(policy, tier, key, &mut decisions, (false, pressed));
        // Not enforced: the message goes on to the backend, whose decision is the one reported.
        if !weighed.enforced {
            return None;
        }
        self.report(policy, tier, key, &decisions, &mut weighed);
        Some(weighed.decision)
    }

    /// A message the backend could not decide: reported as a request's failure is, and returned
    /// (the failure policy answers requests; for a message the choice is the caller's).
    fn message_failed(&self, policy: &CompiledPolicy, error: BackendError) -> BackendError {
        policy.reporter.failure(&policy.name);
        self.errors
            .aside(&policy.name, &error, "the caller's choice");
        error
    }
}
