//! The builder's rollout options ([`PolicyBuilder::shadow`], [`PolicyBuilder::enforce_fraction`])
//! and what a built policy says of them.

use crate::limit::Limit;
use crate::policy::{Policy, PolicyBuilder, PolicySpec};
use crate::quota::Quota;
use crate::rollout::{self, Staged};

/// Rolling a limit out: what a policy enforces.
impl<K> Policy<K> {
    /// The share of keys its refusals are enforced for, from 0 to 1
    /// ([`PolicyBuilder::enforce_fraction`]; 1 unless staged, 0 in a dry run).
    pub fn enforce_fraction(&self) -> f64 {
        rollout::share(self.compiled().dry_run, self.compiled().staged)
    }

    /// Whether the policy enforces its refusals for `key` (see
    /// [`PolicyBuilder::enforce_fraction`]): the same answer in every process, for good.
    pub fn enforces(&self, key: &crate::key::Key) -> bool {
        self.compiled().enforces(key)
    }

    /// Its shadow limits ([`PolicyBuilder::shadow`]), named `{policy}.shadow.{period}`.
    pub fn shadow_limits(&self) -> &[Limit] {
        self.compiled().shadow_limits()
    }
}

impl PolicySpec {
    pub(crate) fn enforces(&self, key: &crate::key::Key) -> bool {
        !self.dry_run && self.staged.is_none_or(|s| s.enforces(key))
    }

    pub(crate) fn staged(&self) -> Option<Staged> {
        self.staged
    }

    pub(crate) fn shadow_limits(&self) -> &[Limit] {
        self.extras.as_deref().map_or(&[], |e| &e.shadows)
    }
}

/// Rolling a limit out (`rollout/`): shadow limits and staged enforcement.
impl<K> PolicyBuilder<K> {
    /// A shadow limit: `quota` is counted for every request of the policy that reaches the backend
    /// (admitted or not), decided on the backend as the policy's own limits are, but never
    /// enforced: a request it would refuse is counted in
    /// `throttle_requests_would_limit_total{policy,limit}` and logged (at info at most once a
    /// second per policy), and the policy's own limits alone decide. For trying a tighter limit on
    /// real traffic before enforcing it ("enforce 100 a minute, shadow 50 a minute").
    ///
    /// It is decided apart from the policy's limits (concurrently, on every backend), so its
    /// refusal never stops a stack from counting the request, and its state is its own: it is
    /// named `{policy}.shadow.{period}`, whatever the request's tier. It takes the policy's
    /// algorithm and cost, and no penalty, delay or budget. Several may be given (of different
    /// periods). The policy's requests take the extended path (as with per-customer quotas).
    ///
    /// ```
    /// use tower_throttle::{key::PeerIp, Policy, Quota};
    ///
    /// let api = Policy::builder("api")
    ///     .key(PeerIp::new())
    ///     .quota(Quota::per_minute(100))
    ///     .shadow(Quota::per_minute(50))
    ///     .build()
    ///     .unwrap();
    /// assert_eq!(api.shadow_limits()[0].name(), "api.shadow.1m");
    /// ```
    pub fn shadow(mut self, quota: Quota) -> Self {
        self.opts.rollout.shadows.push(quota);
        self
    }

    /// Staged enforcement: refusals are enforced for `fraction` (0 to 1) of the policy's keys and
    /// only counted for the others, as [`shadow`](Self::shadow) counts them. The keys are chosen
    /// by a fixed-seed hash of the key, the same in every process and after a restart (one client
    /// sees one behaviour), and raising the share only adds keys. A key outside the share is
    /// treated as in a [dry run](Self::dry_run) (headers, no wait, no ban, a
    /// [`PolicyDecision`](crate::policy::PolicyDecision) with `enforced: false`), except that its
    /// refusals are counted as would-limit, not as limited. A request without a key is let
    /// through unless every key is enforced. A share outside 0 to 1 is an error at build, and so
    /// is a staged dry run; 1 (the default) enforces every key.
    ///
    /// ```
    /// use tower_throttle::{key::PeerIp, Key, Policy, Quota};
    ///
    /// let api = Policy::builder("api")
    ///     .key(PeerIp::new())
    ///     .quota(Quota::per_minute(100))
    ///     .enforce_fraction(0.10)
    ///     .build()
    ///     .unwrap();
    /// let enforced = (0..1000).filter(|i| api.enforces(&Key::from(*i as u64))).count();
    /// assert!((70..=130).contains(&enforced));
    /// assert!(Policy::builder("api")
    ///     .key(PeerIp::new())
    ///     .quota(Quota::per_minute(100))
    ///     .enforce_fraction(1.1)
    ///     .build()
    ///     .is_err());
    /// ```
    pub fn enforce_fraction(mut self, fraction: f64) -> Self {
        self.opts.rollout.enforce = Some(fraction);
        self
    }
}
