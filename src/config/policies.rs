//! What the schema builds for the layer: a [`Policy`] per `[[route]]` (through
//! [`options`](super::options)'s table, with the quota helpers it shares) and the `[access]` lists.

use std::time::Duration;

use super::schema::{set, AccessConfig, BudgetConfig, RouteConfig, TierConfig};
use crate::access::{keys_named, AccessList};
use crate::budget::Budget;
use crate::error::BuildError;
use crate::key::{ClientIp, InvalidCidr, KeySpec};
use crate::limit::Algorithm;
use crate::policy::Policy;
use crate::quota::Quota;

impl RouteConfig {
    /// The route's sliced budget, if `budget` turns one on.
    pub(super) fn budget_settings(&self) -> Option<Budget> {
        match self.budget.as_ref()? {
            BudgetConfig::On(false) => None,
            BudgetConfig::On(true) => Some(Budget::new()),
            BudgetConfig::Tuned(tuning) => {
                let budget = set(Budget::new(), tuning.slice_ttl, Budget::slice_ttl);
                let budget = set(budget, tuning.max_slice, Budget::max_slice);
                Some(set(budget, tuning.hot_after, Budget::hot_after))
            }
        }
    }

    /// The policy this route describes, with no trusted proxies (`client-ip` is the peer address).
    pub fn policy(&self) -> Result<Policy<KeySpec>, BuildError> {
        self.policy_behind(&ClientIp::default())
    }

    /// The route's own quota keys, which a tier's table has too.
    pub(super) fn own_quota(&self) -> TierConfig {
        TierConfig {
            max_burst: self.max_burst,
            count: self.count,
            period: self.period,
            quotas: self.quotas.clone(),
        }
    }
}

/// `client-ip` keys (alone or in a composite) read behind `client_ip`'s proxies.
pub(super) fn bind_client_ip(key: &mut KeySpec, client_ip: &ClientIp) {
    match key {
        KeySpec::ClientIp(ip) => *ip = client_ip.clone(),
        KeySpec::Composite(composite) => {
            for part in composite.parts_mut() {
                bind_client_ip(part, client_ip);
            }
        }
        _ => {}
    }
}

/// The quotas of a route's or tier's `keys` whose `shadow` is `shadow`: the enforced ones are
/// `quotas` (but its `shadow = true` ones) or `count`/`period`/`max_burst`.
pub(super) fn quotas_of(
    algorithm: Algorithm,
    keys: &TierConfig,
    shadow: bool,
) -> Result<Vec<Quota>, String> {
    let TierConfig {
        max_burst,
        count,
        period,
        quotas,
    } = keys;
    let (count, period, max_burst) = (*count, *period, *max_burst);
    if algorithm == Algorithm::Concurrency && count.is_some() && period.is_some() {
        return Err(
            "period is not for algorithm \"concurrency\" (it counts requests in flight, \
                    not per period); remove it"
                .to_owned(),
        );
    }
    let gcra = algorithm == Algorithm::Gcra;
    let one = |count: u64, period: Option<Duration>, max_burst: Option<u64>| {
        let period = match (period, algorithm) {
            (Some(period), _) => period,
            // In flight, not per period: any period will do.
            (None, Algorithm::Concurrency) => Duration::from_secs(1),
            (None, _) => return Err("period is required with count".to_owned()),
        };
        let quota = Quota::per_period(count, period);
        match max_burst {
            Some(_) if !gcra => Err(format!(
                "max_burst is only used by algorithm \"gcra\", not {:?}; remove it",
                algorithm.as_str()
            )),
            Some(max_burst) => Ok(quota.with_max_burst(max_burst)),
            None => Ok(quota),
        }
    };
    if let Some(quotas) = quotas.as_deref() {
        if count.is_some() || period.is_some() || max_burst.is_some() {
            return Err("give either quotas or count/period/max_burst, not both".into());
        }
        if quotas.is_empty() {
            return Err("quotas is empty".into());
        }
        if !shadow && quotas.iter().all(|q| q.shadow) {
            return Err("every quota of quotas is a shadow; at least one must be enforced".into());
        }
        return quotas
            .iter()
            .filter(|q| q.shadow == shadow)
            .map(|q| one(q.count, Some(q.period), q.max_burst))
            .collect();
    }
    if shadow {
        return Ok(Vec::new());
    }
    match count {
        Some(count) => Ok(vec![one(count, period, max_burst)?]),
        None => Err("a quota is required: count and period, or quotas".into()),
    }
}

impl AccessConfig {
    /// The static lists.
    pub fn lists(&self) -> Result<AccessList, BuildError> {
        if self.redis_refresh.is_some() && self.redis_sets.is_none() {
            return Err(BuildError::Invalid(
                "[access] redis_refresh is how often redis_sets are read: set redis_sets too"
                    .into(),
            ));
        }
        if let Some(every) = self
            .redis_refresh
            .filter(|e| *e < Duration::from_millis(10))
        {
            return Err(BuildError::Invalid(format!(
                "[access] redis_refresh is at least 10ms (each is a read of the sets), not {every:?}"
            )));
        }
        let lists = AccessList::new();
        let bad =
            |setting: &str, e: InvalidCidr| BuildError::Invalid(format!("[access] {setting}: {e}"));
        for n in &self.allow_networks {
            lists
                .allow_network(n)
                .map_err(|e| bad("allow_networks", e))?;
        }
        for n in &self.deny_networks {
            lists.deny_network(n).map_err(|e| bad("deny_networks", e))?;
        }
        for k in &self.allow_keys {
            for key in keys_named(k.as_bytes()) {
                lists.allow_key(key);
            }
        }
        for k in &self.deny_keys {
            for key in keys_named(k.as_bytes()) {
                lists.deny_key(key);
            }
        }
        Ok(lists)
    }
}
