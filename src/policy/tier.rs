//! [`CompiledTier`]: one tier of a policy as a request is decided under it, computed at build.

use std::sync::Arc;
use std::time::Duration;

use http::HeaderValue;

use crate::decision::Decision;
use crate::headers;
use crate::limit::{Algorithm, Limit};

/// One tier's limits (or a per-customer quota's), with what the verdict reads of them.
#[derive(Clone, Debug)]
pub(crate) struct CompiledTier {
    pub(crate) name: Option<Arc<str>>,
    pub(crate) limits: Box<[Limit]>,
    pub(crate) names: Box<[Arc<str>]>,
    pub(crate) policy_field: HeaderValue,
    /// `limits[0].max_cost()`: a message's limit, a quota's room for a cost.
    pub(crate) limit_value: u64,
    pub(crate) concurrency: bool,
    /// Whether a limit of the tier is in delay mode (most are not: no request waits).
    pub(crate) delays: bool,
    /// One limit, neither a concurrency limit nor in delay mode: an admission by it is its
    /// decision's fields and nothing more (`Judge::admitted_plainly`).
    pub(crate) plain_admission: bool,
    /// `limits` without their penalty, where they have one: what a request whose refusal its
    /// policy does not enforce (a staged key outside the share, no pressure) is asked under, so
    /// that a backend that keeps penalties (Redis) strikes only refusals that are made.
    pub(crate) unenforced: Option<Box<[Limit]>>,
}

impl CompiledTier {
    /// The rules of `limits` (at least one), the tier called `name` (`None`: the default).
    pub(crate) fn of(name: Option<Arc<str>>, limits: &[Limit]) -> Self {
        let concurrency = limits[0].algorithm() == Algorithm::Concurrency;
        let delays = limits.iter().any(|limit| limit.delay().is_some());
        CompiledTier {
            name,
            limits: limits.into(),
            names: limits.iter().map(|l| l.name().into()).collect(),
            policy_field: headers::policy_field(limits),
            limit_value: limits[0].max_cost(),
            concurrency,
            delays,
            plain_admission: limits.len() == 1 && !concurrency && !delays,
            unenforced: (limits.iter().any(|l| l.penalty().is_some()))
                .then(|| limits.iter().map(Limit::without_penalty).collect()),
        }
    }

    /// The decisions of a key banned for `rest` yet, one per limit, each with its own limit.
    pub(crate) fn banned_for(&self, rest: Duration) -> Vec<Decision> {
        let ban = |limit: &Limit| Decision::banned(limit.max_cost(), rest, None, rest);
        self.limits.iter().map(ban).collect()
    }

    /// Delay mode: an admitted request waits for the part of its TAT beyond its quota's own tolerance,
    /// and what remains is counted against that tolerance, not the delay's. Returns the wait (the
    /// longest of a stack's) and corrects each delayed limit's `remaining` in place. (Asked only
    /// of a tier that `delays`.)
    pub(crate) fn queue_delay(&self, decisions: &mut [Decision]) -> Duration {
        let mut delay = Duration::ZERO;
        for (decision, limit) in decisions.iter_mut().zip(self.limits.iter()) {
            if limit.delay().is_some() {
                delay = delay.max(limit.delay_for(decision));
                let (ahead, remaining) = (decision.reset_after, decision.remaining);
                decision.remaining = limit.remaining_in_quota(ahead, remaining, decision.limit);
            }
        }
        delay
    }
}
