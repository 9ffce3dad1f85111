//! [`PolicySpec`]: what [`PolicyBuilder::build`](super::PolicyBuilder::build) writes.

use std::sync::Arc;
use std::time::Duration;

use http::header::HeaderName;
use http::{Method, Request};

use super::condition::Rule;
use super::parts::{MissingKey, Tier};
use super::tier::CompiledTier;
use crate::key::OnDuplicate;
use crate::limit::Limit;
use crate::near_limit::NearRule;
use crate::policy::extras::PolicyExtras;
use crate::rollout::Staged;
use crate::route::Route;

/// A policy apart from its key extractor and state, as the engine reads it via [`CompiledPolicy`].
#[derive(Clone, Debug)]
pub(crate) struct PolicySpec {
    pub(crate) name: Arc<str>,
    /// The default tier first, then the named ones.
    pub(crate) tiers: Box<[CompiledTier]>,
    pub(crate) tier_header: Option<HeaderName>,
    pub(crate) dry_run: bool,
    /// Its limits are enforced only while the layer's overload gate is under pressure.
    pub(crate) under_pressure: bool,
    /// Staged enforcement: the keys its refusals are enforced for (`None`: all).
    pub(crate) staged: Option<Staged>,
    pub(crate) cost: u64,
    pub(crate) methods: Option<Box<[Method]>>,
    pub(crate) route: Option<Route>,
    /// Every condition a request must meet besides its route and methods (none: nothing to check).
    pub(crate) conditions: Box<[Rule]>,
    /// Near the limit: from which share used, and whether the handler is told.
    pub(crate) near: Option<NearRule>,
    /// At most this much added, at random, to each refusal's `Retry-After` (none: exact).
    pub(crate) retry_after_jitter: Option<Duration>,
    pub(crate) missing_key: MissingKey,
    /// Per-customer quotas, an async key, counting by outcome: `None` (the fast path) unless used.
    pub(crate) extras: Option<Arc<PolicyExtras>>,
}

impl PolicySpec {
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// The limit of the default tier's first quota (the only one, unless quotas are stacked).
    pub(crate) fn limit(&self) -> &Limit {
        &self.tiers[0].limits[0]
    }

    /// The limits of the default tier, one per stacked quota.
    pub(crate) fn limits(&self) -> &[Limit] {
        &self.tiers[0].limits
    }

    /// The limits of tier `name`, or `None` for a tier the policy does not have.
    pub(crate) fn tier_limits(&self, name: &str) -> Option<&[Limit]> {
        self.tiers[1..]
            .iter()
            .find(|t| t.name.as_deref() == Some(name))
            .map(|t| &*t.limits)
    }

    /// The tier that applies to a request: its [`Tier`] extension, else its tier header, else the
    /// default (index 0; also for a tier the policy does not know).
    pub(crate) fn tier_in(
        &self,
        headers: &http::HeaderMap,
        extensions: &http::Extensions,
    ) -> usize {
        if self.tiers.len() == 1 {
            return 0;
        }
        let named = match extensions.get::<Tier>() {
            Some(tier) => Some(tier.as_str()),
            None => self
                .tier_header
                .as_ref()
                // Sent twice, it is ambiguous (a client's own before the one a gateway appends).
                .and_then(|h| OnDuplicate::Refuse.pick(headers.get_all(h).iter()))
                .and_then(|v| v.to_str().ok()),
        };
        named
            .and_then(|name| {
                self.tiers[1..]
                    .iter()
                    .position(|t| t.name.as_deref() == Some(name.trim()))
            })
            .map_or(0, |i| i + 1)
    }

    pub(crate) fn route(&self) -> Option<&str> {
        self.route.as_ref().map(Route::pattern)
    }

    // Inlined, the commonest answer only: every request asks it of each policy until one
    // matches, and most policies match every request (no methods, route or condition).
    #[inline]
    pub(crate) fn applies_to<B>(&self, request: &Request<B>) -> bool {
        let everywhere = self.methods.is_none() && self.route.is_none();
        (everywhere && self.conditions.is_empty()) || self.selects(request)
    }

    #[inline(never)]
    fn selects<B>(&self, request: &Request<B>) -> bool {
        if let Some(methods) = &self.methods
            && !methods.contains(request.method())
        {
            return false;
        }
        let on_route = match &self.route {
            None => true,
            Some(route) => route.matches(request),
        };
        on_route
            && self
                .conditions
                .iter()
                .all(|c| c.holds(request.uri(), request.headers()))
    }
}
