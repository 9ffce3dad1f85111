//! What an admitted request carries ([`Admitted`], inside a [`Verdict`]), and how it is made from
//! its [`CompiledPolicy`] and the backend's decisions: the delay of delay mode, each limit's
//! decision, the [`PolicyDecision`] handlers see.

use std::time::Duration;

use bytes::Bytes;
use http::Response;

use crate::decision::Decision;
use crate::engine::slot::SlotOwner;
use crate::headers::RateHeaders;
use crate::policy::CompiledPolicy;
use crate::policy::CompiledTier;
use crate::policy_decision::LimitDecision;
use crate::policy_decision::PolicyDecision;

/// What happens to a request.
pub(crate) enum Verdict {
    Admit(Admitted),
    Reject(Response<Bytes>),
}

/// How a request is let through.
pub(crate) struct Admitted {
    pub(crate) headers: Option<RateHeaders>,
    /// Delay mode: how long to wait before calling the service.
    pub(crate) delay: Duration,
    /// Boxed: it is rarely asked for, and a smaller verdict moves faster on every request.
    pub(crate) decision: Option<Box<PolicyDecision>>,
    /// A concurrency slot to give back when the response ends.
    pub(crate) slot: Option<SlotOwner>,
}

impl Admitted {
    /// Through with no limit applied (and no headers): the backend failed and the layer fails open.
    pub(crate) fn unlimited() -> Self {
        Admitted {
            headers: None,
            delay: Duration::ZERO,
            decision: None,
            slot: None,
        }
    }
}

/// Delay mode: an admitted request waits for the part of its TAT beyond its quota's own tolerance,
/// and what remains is counted against that tolerance, not the delay's. Returns the wait (the longest
/// of a stack's) and corrects each delayed limit's `remaining` in place.
pub(crate) fn queue_delay(tier: &CompiledTier, decisions: &mut [Decision]) -> Duration {
    let mut delay = Duration::ZERO;
    if !tier.delays {
        return delay;
    }
    for (decision, limit) in decisions.iter_mut().zip(tier.limits.iter()) {
        if limit.delay().is_some() {
            delay = delay.max(limit.delay_for(decision));
            if let (Some(tolerance), Some(gcra)) = (limit.tolerance(), limit.gcra()) {
                let ahead = u64::try_from(decision.reset_after.as_nanos()).unwrap_or(u64::MAX);
                decision.remaining = (tolerance.saturating_sub(ahead) / gcra.emission_interval())
                    .min(decision.limit);
            }
        }
    }
    delay
}

/// Adds each limit's decision to an admitted request's [`PolicyDecision`], if it has one.
pub(crate) fn add_limits(admitted: &mut Admitted, tier: &CompiledTier, decisions: &[Decision]) {
    if let Some(exposed) = admitted.decision.as_deref_mut() {
        exposed.limits = tier
            .names
            .iter()
            .zip(decisions)
            .map(|(name, decision)| LimitDecision {
                name: name.clone(),
                decision: *decision,
            })
            .collect();
    }
}

/// An admitted request: its headers, its wait, its slot, and the [`PolicyDecision`] handlers see.
/// `enforced`: whether the verdict enforces the decision (not a dry run, which reports the wait in
/// its `PolicyDecision` but does not wait).
pub(crate) fn admit(
    rules: &CompiledPolicy,
    tier: &CompiledTier,
    decision: Decision,
    fields: RateHeaders,
    delay: Duration,
    enforced: bool,
    slot: Option<SlotOwner>,
) -> Admitted {
    let exposed = rules.expose_decision.then(|| PolicyDecision {
        policy: rules.name.clone(),
        tier: tier.name.clone(),
        decision,
        enforced,
        delayed: delay,
        limits: Box::new([]),
    });
    Admitted {
        headers: Some(fields),
        delay: if enforced { delay } else { Duration::ZERO },
        decision: exposed.map(Box::new),
        slot,
    }
}
