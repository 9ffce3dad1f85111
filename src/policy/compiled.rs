//! [`CompiledPolicy`]: a policy as the engine decides by it: its options ([`PolicySpec`]) and what
//! the layer keeps for it while its table is in force. Compiled again for each table
//! (`engine/table.rs`); a request holds it by reference, one awaiting a remote decision by `Arc`.

use std::ops::Deref;
use std::sync::Arc;

use bytes::Bytes;

use super::spec::PolicySpec;
use crate::headers;
use crate::near_limit::NearReport;
use crate::observe::Reporter;
use crate::penalty::PenaltyBox;
use crate::policy::extras::PolicyExtras;
use crate::rollout::WouldLimit;

/// A policy compiled: its options (read through `Deref`) and its state.
pub(crate) struct CompiledPolicy {
    spec: PolicySpec,
    pub(crate) reporter: Reporter,
    /// The penalty box, unless the backend keeps penalties itself (shared with the table a reload
    /// replaced, when the policy and its penalty are unchanged).
    pub(crate) penalty: Option<Arc<PenaltyBox>>,
    /// Reports the refusals a shadow limit or a staged policy only counts.
    pub(crate) would_limit: WouldLimit,
    /// Reports the requests that come near a limit.
    pub(crate) near_report: NearReport,
    /// Every admitted request gets a `PolicyDecision`.
    pub(crate) expose_decision: bool,
    /// Nothing to do on an admission beyond the fields (`Judge::admitted_plainly`).
    pub(crate) plain_admission: bool,
    /// One tier and no penalty box: between its key and the backend, a request meets no step but
    /// the access lists (`Throttle::call` goes straight on when the layer has none).
    pub(crate) straight: bool,
    /// The default 429 body, rendered once.
    pub(crate) limited_body: Bytes,
    /// The extras of its extended path: its own, or none at all (for its requests that an
    /// override or a timed ban sends there).
    pub(crate) overridable: Arc<PolicyExtras>,
}

impl CompiledPolicy {
    pub(super) fn into_spec(self) -> PolicySpec {
        self.spec
    }

    /// The options it was compiled from.
    pub(crate) fn spec(&self) -> &PolicySpec {
        &self.spec
    }

    /// `spec` compiled for a table. `previous`: the policies of the table a reload replaces, whose
    /// penalty box (strikes and bans) a policy of the same name and penalty keeps.
    pub(crate) fn new<'p>(
        spec: PolicySpec,
        decision_extension: bool,
        backend_keeps_penalties: bool,
        mut previous: impl Iterator<Item = &'p CompiledPolicy>,
    ) -> Self {
        let penalty = spec.limit().penalty().filter(|_| !backend_keeps_penalties);
        let kept = penalty.and_then(|penalty| {
            previous.find_map(|old| {
                let same = old.spec.name == spec.name;
                old.penalty
                    .as_ref()
                    .filter(|b| same && b.penalty() == *penalty)
                    .cloned()
            })
        });
        let expose_decision = decision_extension
            || spec.dry_run
            || spec.staged().is_some()
            || spec.limit().delay().is_some();
        CompiledPolicy {
            reporter: Reporter::default(),
            penalty: kept.or_else(|| penalty.map(|p| Arc::new(PenaltyBox::new(*p)))),
            would_limit: WouldLimit::default(),
            near_report: NearReport::default(),
            expose_decision,
            plain_admission: !expose_decision && spec.near.is_none(),
            straight: spec.tiers.len() == 1 && penalty.is_none(),
            limited_body: headers::limited_body(spec.name()),
            overridable: spec
                .extras
                .as_ref()
                .cloned()
                .unwrap_or_else(|| PolicyExtras::plain(spec.name(), &spec.tiers[0].limits[0])),
            spec,
        }
    }
}

impl std::fmt::Debug for CompiledPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.spec.fmt(f)
    }
}

impl Deref for CompiledPolicy {
    type Target = PolicySpec;

    fn deref(&self) -> &PolicySpec {
        &self.spec
    }
}
