//! The per-request features a policy may use, off the fast path. Each feature's options and state
//! are its module's types; this is the list of them a policy holds, and a policy that uses none
//! costs one `Option` check per request.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use http::request::Parts;

use crate::error::BuildError;
use crate::key::ahead::Missing;
use crate::key::body::BodyRule;
use crate::key::{AsyncKey, BodyField, Key, KeyExtractor, KeySpec};
use crate::key::{DEFAULT_BODY_TIMEOUT, DEFAULT_MAX_BODY};
use crate::limit::Limit;
use crate::meter::MeterRule;
use crate::observe::ResolveLog;
use crate::outcome::OutcomeRule;
use crate::per_customer::{ChoosesQuota, CustomerQuotas, Namespace};
use crate::policy::tier::CompiledTier;
use crate::quota::Quota;

/// What a policy's builder collects for the per-request features.
#[derive(Debug, Default)]
pub(crate) struct ExtrasBuilder {
    /// A quota chosen per key (`per_customer.rs`).
    pub(crate) quotas: ChoosesQuota,
    pub(crate) async_key: Option<AsyncKey>,
    /// A key from the body ([`PolicyBuilder::body_key`](crate::PolicyBuilder::body_key)), and
    /// how much of it may be read, for how long.
    pub(crate) body_key: Option<BodyField>,
    pub(crate) max_body: Option<usize>,
    pub(crate) body_timeout: Option<Duration>,
    pub(crate) outcome: OutcomeRule,
    pub(crate) metered: crate::meter::MeteredBuilder,
    /// Shadow limits (`rollout/`), decided beside the policy's own on the extended path.
    pub(crate) shadows: Box<[Limit]>,
    /// The key of each quota that has one of its own, by the quota's place (`None`, or missing: the
    /// policy's key); empty when none has.
    pub(crate) quota_keys: Vec<Option<KeySpec>>,
}

impl ExtrasBuilder {
    /// The extras of a policy named `name` whose default limit is `template`, or `None` when it
    /// uses none (its requests then take the fast path).
    pub(crate) fn build(
        self,
        name: &str,
        template: &Limit,
        metered: Option<MeterRule>,
    ) -> Result<Option<Arc<PolicyExtras>>, BuildError> {
        let invalid = |why: &str| BuildError::Invalid(format!("policy {name:?}: {why}"));
        if let Some(why) = self.quotas.invalid() {
            return Err(invalid(why));
        }
        if self
            .async_key
            .as_ref()
            .is_some_and(|k| k.timeout_value().is_zero())
        {
            return Err(invalid("the async key's timeout must be more than 0"));
        }
        let keyed = !self.quota_keys.is_empty();
        let body = self
            .body_rule(metered.as_ref())
            .map_err(|why| invalid(&why))?;
        if !self.quotas.is_set()
            && self.async_key.is_none()
            && body.is_none()
            && !self.outcome.is_set()
            && self.shadows.is_empty()
            && metered.is_none()
            && !keyed
        {
            return Ok(None);
        }
        Ok(Some(self.assemble(name, template, body, metered)))
    }

    /// The extras, with what `build` checked and made of the body and the metered limit.
    fn assemble(
        self,
        name: &str,
        template: &Limit,
        body: Option<BodyRule>,
        metered: Option<MeterRule>,
    ) -> Arc<PolicyExtras> {
        let keyed = !self.quota_keys.is_empty();
        Arc::new(PolicyExtras {
            name: name.into(),
            quotas: CustomerQuotas::new(name, template, self.quotas),
            async_key: self.async_key,
            body,
            outcome: self.outcome.is_set().then(|| Arc::new(self.outcome)),
            metered,
            log: ResolveLog::default(),
            shadows: self.shadows,
            limit_keys: keyed.then(|| self.quota_keys.into()),
        })
    }
}

impl ExtrasBuilder {
    /// What the policy reads from the body (its key, its metered estimate), if anything.
    fn body_rule(&self, metered: Option<&MeterRule>) -> Result<Option<BodyRule>, String> {
        let estimate = metered.and_then(|m| m.estimate.body_field());
        if self.body_key.is_none() && estimate.is_none() {
            if self.max_body.is_some() || self.body_timeout.is_some() {
                return Err(
                    "max_body and body_timeout are set but nothing reads the body (a \
                     body key or a metered estimate from the body)"
                        .into(),
                );
            }
            return Ok(None);
        }
        // A body is held whole while it is read: beyond these, a setting is a slip, not a key read.
        if self.max_body.is_some_and(|max| max == 0 || max > 1 << 30) {
            return Err("max_body must be at least 1 byte and at most 1 GiB".into());
        }
        let hour = Duration::from_secs(3600);
        if self.body_timeout.is_some_and(|t| t.is_zero() || t > hour) {
            return Err("body_timeout must be more than 0 and at most 1 hour".into());
        }
        Ok(Some(BodyRule {
            key: self.body_key.clone(),
            max: self.max_body.unwrap_or(DEFAULT_MAX_BODY),
            timeout: self.body_timeout.unwrap_or(DEFAULT_BODY_TIMEOUT),
        }))
    }
}

/// The per-request features of one policy.
pub(crate) struct PolicyExtras {
    name: Arc<str>,
    /// A quota chosen per key (a customer's, an override's).
    pub(crate) quotas: CustomerQuotas,
    pub(crate) async_key: Option<AsyncKey>,
    pub(crate) body: Option<BodyRule>,
    pub(crate) outcome: Option<Arc<OutcomeRule>>,
    /// The metered limit's rule (its place in the stack, its estimate, its usage header).
    pub(crate) metered: Option<MeterRule>,
    /// What the extended path logs about the key and the body (once a second at most).
    pub(crate) log: ResolveLog,
    pub(crate) shadows: Box<[Limit]>,
    /// The key of each of the default tier's limits that has one of its own, by the limit's
    /// place (`None`, or missing: the policy's key); `None` when none has.
    pub(crate) limit_keys: Option<Box<[Option<KeySpec>]>>,
}

impl fmt::Debug for PolicyExtras {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PolicyExtras")
            .field("async_key", &self.async_key)
            .field("body", &self.body)
            .field("outcome", &self.outcome)
            .field("metered", &self.metered)
            .finish_non_exhaustive()
    }
}

impl PolicyExtras {
    /// The extras of a policy that uses none, for its requests an override or a timed ban sends
    /// down the extended path (a quota override is a per-customer quota).
    pub(crate) fn plain(name: &str, template: &Limit) -> Arc<PolicyExtras> {
        ExtrasBuilder::default().assemble(name, template, None, None)
    }

    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// Quotas with keys of their own: the key of each of the `count` limits of a request with
    /// `parts` (its own, or the policy's `key`), or what was expected of the first one missing;
    /// `None` when the limits share the policy's key.
    pub(crate) fn limit_keys_of(
        &self,
        count: usize,
        key: &Key,
        parts: Parts,
    ) -> (Parts, Option<Result<Vec<Key>, Missing>>) {
        let Some(specs) = self.limit_keys.as_deref() else {
            return (parts, None);
        };
        let request = http::Request::from_parts(parts, ());
        let keys = (0..count).map(|i| match specs.get(i).and_then(Option::as_ref) {
            Some(spec) => (spec.extract(&request))
                .ok_or_else(|| Missing::Expected(KeyExtractor::<()>::describe(spec))),
            None => Ok(key.clone()),
        });
        let keys = keys.collect();
        (request.into_parts().0, Some(keys))
    }

    /// The tier of an override's `quota` on one key, made once (`validate`: the backend's check of
    /// its limit); `None` where the policy cannot take one (a metered policy, quotas with keys of
    /// their own) or it cannot be enforced: the key then keeps the policy's own quota.
    pub(crate) fn override_tier(
        &self,
        quota: Quota,
        cost: u64,
        validate: impl FnOnce(&Limit) -> Result<(), BuildError>,
    ) -> Option<Arc<CompiledTier>> {
        if !self.takes_quota_override() {
            return None;
        }
        (self.quotas).custom_tier(Namespace::Override, quota, cost, validate)
    }

    /// Whether a quota override can apply: not to a metered policy, nor one whose quotas have
    /// keys of their own (unlimited and blocked can).
    pub(crate) fn takes_quota_override(&self) -> bool {
        self.metered.is_none() && self.limit_keys.is_none()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quota::Quota;

    fn template() -> Limit {
        Limit::new("api", Quota::per_second(5)).unwrap()
    }

    #[test]
    fn the_extras_show_their_policy_and_features() {
        let builder = ExtrasBuilder {
            body_key: Some(BodyField::json("/user").unwrap()),
            ..ExtrasBuilder::default()
        };
        let shown = format!("{builder:?}");
        assert!(shown.starts_with("ExtrasBuilder {"), "{shown}");
        assert!(shown.contains("body_key: Some("), "{shown}");
        let extras = PolicyExtras::plain("api", &template());
        assert_eq!(extras.name(), "api");
        let shown = format!("{extras:?}");
        assert!(shown.starts_with("PolicyExtras {"), "{shown}");
        assert!(shown.contains("async_key: None"), "{shown}");
    }

    #[test]
    fn an_override_quota_is_a_tier_of_its_own_unless_the_policy_cannot_take_one() {
        let ok = |_: &Limit| Ok(());
        let plain = PolicyExtras::plain("api", &template());
        let tier = plain.override_tier(Quota::per_second(50), 1, ok).unwrap();
        assert_eq!(tier.limit_value, 50);
        let refused = |_: &Limit| Err(BuildError::Invalid("no".into()));
        assert!(plain
            .override_tier(Quota::per_second(60), 1, refused)
            .is_none());
        let keyed = ExtrasBuilder {
            quota_keys: vec![None],
            ..ExtrasBuilder::default()
        };
        let keyed = keyed.assemble("api", &template(), None, None);
        assert!(keyed.override_tier(Quota::per_second(50), 1, ok).is_none());
    }
}
