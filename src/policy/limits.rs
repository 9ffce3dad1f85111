//! How a policy's quotas become named limits: one per quota, named after the policy, its tier and
//! the quota's period; the stack rule; and no two limits of one policy under one name.

use std::collections::HashMap;

use super::keyed::key_label;
use super::{period_label, CompiledTier, PolicyBuilder};
use crate::error::BuildError;
use crate::key::KeySpec;
use crate::limit::{Algorithm, Limit, MAX_STACKED_QUOTAS};
use crate::quota::Quota;

impl<K> PolicyBuilder<K> {
    /// The limits of one tier's quotas, named `base` (one quota) or `base.{period}` (a stack), and
    /// `.{key}` after it for a quota with a key of its own (`keys[i]`, if any, for `quotas[i]`).
    pub(super) fn limits_of(
        &self,
        base: &str,
        quotas: &[Quota],
        keys: &[Option<KeySpec>],
    ) -> Result<Box<[Limit]>, BuildError> {
        let invalid =
            |why: String| BuildError::Invalid(format!("policy {:?}: {why}", self.opts.name));
        if quotas.len() > MAX_STACKED_QUOTAS {
            return Err(invalid(format!(
                "{} quotas are stacked; at most {MAX_STACKED_QUOTAS} are allowed",
                quotas.len()
            )));
        }
        if quotas.len() > 1 && self.opts.algorithm == Algorithm::Concurrency {
            return Err(invalid(
                "algorithm \"concurrency\" takes one quota (requests in flight), not a stack"
                    .into(),
            ));
        }
        let mut limits: Vec<Limit> = Vec::with_capacity(quotas.len());
        for (i, quota) in quotas.iter().enumerate() {
            let mut name = if quotas.len() == 1 {
                base.to_owned()
            } else {
                format!("{base}.{}", period_label(quota.period()))
            };
            let own_key = keys.get(i).and_then(Option::as_ref);
            if let Some(key) = own_key {
                name = format!("{name}.{}", key_label(key));
            }
            if limits.iter().any(|l| l.name() == name) {
                let keyed = if own_key.is_some() { " and key" } else { "" };
                return Err(invalid(format!(
                    "two stacked quotas have the period{keyed} {:?}; stack quotas of different \
                     periods (or keys)",
                    quota.period()
                )));
            }
            let mut limit = Limit::with_algorithm(name, self.opts.algorithm, *quota)?;
            // A dry run never bans.
            if let Some(penalty) = self.opts.penalty.filter(|_| !self.opts.dry_run) {
                limit = limit.with_penalty(penalty).in_penalty_box(&self.opts.name);
            }
            if let Some(delay) = self.opts.delay {
                limit = limit.with_delay(delay)?;
            }
            if let Some(lease) = self.opts.lease {
                limit = limit.with_lease(lease)?;
            }
            limit = limit.with_window_start(self.opts.window_start)?;
            if let Some(calendar) = &self.opts.calendar {
                limit = limit.with_calendar(calendar.clone())?;
            }
            if let Some(budget) = self.opts.budget {
                if quotas.len() > 1 {
                    return Err(invalid(
                        "a leased budget takes one quota, not a stack (a slice would have to \
                         lease every quota at once)"
                            .into(),
                    ));
                }
                limit = limit.with_budget(budget)?;
            }
            limits.push(limit);
        }
        Ok(limits.into())
    }
}

impl<K> PolicyBuilder<K> {
    /// Refuses two limits of one policy under one name. Tiers never share state, and a backend keys
    /// state by limit name: a stacked `1s` quota and a tier named `1s` both make "<policy>.1s".
    pub(super) fn check_names(tiers: &[CompiledTier]) -> Result<(), String> {
        let mut named: HashMap<&str, Option<&str>> = HashMap::new();
        for tier in tiers {
            for limit in tier.limits.iter() {
                if let Some(other) = named.insert(limit.name(), tier.name.as_deref()) {
                    let by = |tier: Option<&str>| match tier {
                        None => "the policy's own quotas".to_owned(),
                        Some(t) => format!("tier {t:?}"),
                    };
                    return Err(format!(
                        "the limit name {:?} is made twice, by {} and by {}; limits of one policy \
                     never share state: rename the tier",
                        limit.name(),
                        by(other),
                        by(tier.name.as_deref())
                    ));
                }
            }
        }
        Ok(())
    }
}
