//! What the schema builds for the layer: a [`Policy`] per `[[route]]` (its quotas, tiers, mode,
//! methods, penalty) and the static `[access]` lists.

use std::time::Duration;

use http::{Method, StatusCode};

use super::schema::{AccessConfig, BudgetConfig, QuotaConfig, RouteConfig};
use crate::access::{keys_named, AccessList};
use crate::budget::Budget;
use crate::error::BuildError;
use crate::key::{ClientIp, InvalidCidr, KeySpec, PeerIp};
use crate::limit::Algorithm;
use crate::outcome::StatusSet;
use crate::penalty::Penalty;
use crate::policy::{MissingKey, Policy};
use crate::quota::Quota;

impl RouteConfig {
    /// The route's sliced budget, if `budget` turns one on.
    fn budget_settings(&self) -> Option<Budget> {
        match self.budget.as_ref()? {
            BudgetConfig::On(false) => None,
            BudgetConfig::On(true) => Some(Budget::new()),
            BudgetConfig::Tuned(tuning) => {
                let mut budget = Budget::new();
                if let Some(ttl) = tuning.slice_ttl {
                    budget = budget.slice_ttl(ttl);
                }
                if let Some(max_slice) = tuning.max_slice {
                    budget = budget.max_slice(max_slice);
                }
                if let Some(hot_after) = tuning.hot_after {
                    budget = budget.hot_after(hot_after);
                }
                Some(budget)
            }
        }
    }

    /// The policy this route describes, with no trusted proxies (`client-ip` is the peer address).
    pub fn policy(&self) -> Result<Policy<KeySpec>, BuildError> {
        self.policy_behind(&ClientIp::default())
    }

    /// The policy this route describes, `client-ip` keys read behind `client_ip`'s proxies.
    pub(super) fn policy_behind(
        &self,
        client_ip: &ClientIp,
    ) -> Result<Policy<KeySpec>, BuildError> {
        let invalid = |what: String| BuildError::Invalid(format!("policy {:?}: {what}", self.name));
        let mut key = self.key.clone();
        bind_client_ip(&mut key, client_ip);
        key = key.for_route(self.path.as_deref()).map_err(&invalid)?;
        if let Some(on_duplicate) = &self.on_duplicate {
            key = key.with_on_duplicate(on_duplicate.parse().map_err(&invalid)?);
        }
        match (&mut key, self.ipv6_prefix) {
            (KeySpec::PeerIp(ip), Some(prefix)) => {
                *ip = PeerIp::new()
                    .with_ipv6_prefix(prefix)
                    .map_err(|e| invalid(e.to_string()))?;
            }
            (KeySpec::ClientIp(ip), Some(prefix)) => {
                *ip = ip
                    .clone()
                    .with_ipv6_prefix(prefix)
                    .map_err(|e| invalid(e.to_string()))?;
            }
            (_, Some(_)) => {
                return Err(invalid(
                    "ipv6_prefix only applies to key = \"ip\" or \"client-ip\"".into(),
                ))
            }
            _ => {}
        }
        let algorithm: Algorithm = match &self.algorithm {
            Some(a) => a.parse().map_err(invalid)?,
            None => Algorithm::Gcra,
        };
        let quotas = quotas_of(
            algorithm,
            self.count,
            self.period,
            self.max_burst,
            self.quotas.as_deref(),
        )
        .map_err(invalid)?;
        let mut builder = Policy::builder(self.name.clone())
            .quotas(quotas)
            .algorithm(algorithm)
            .key(key)
            .cost(self.cost.unwrap_or(1));
        match (self.mode.as_deref(), self.max_delay) {
            (None | Some("enforce"), None) => {}
            (Some("dry-run"), None) => builder = builder.dry_run(true),
            (Some("delay"), Some(max_delay)) => builder = builder.delay(max_delay),
            (Some("delay"), None) => {
                return Err(invalid(
                    "mode = \"delay\" needs max_delay, such as \"2s\"".into(),
                ))
            }
            (None | Some("enforce" | "dry-run"), Some(_)) => {
                return Err(invalid(
                    "max_delay is only used with mode = \"delay\"".into(),
                ))
            }
            (Some(other), _) => {
                return Err(invalid(format!(
                    "mode {other:?} is not \"enforce\", \"dry-run\" or \"delay\""
                )))
            }
        }
        if let Some(lease) = self.lease {
            builder = builder.lease(lease);
        }
        for (name, tier) in self.tiers.iter().flatten() {
            let quotas = quotas_of(
                algorithm,
                tier.count,
                tier.period,
                tier.max_burst,
                tier.quotas.as_deref(),
            )
            .map_err(|why| invalid(format!("tier {name:?}: {why}")))?;
            builder = builder.tier(name.clone(), quotas);
        }
        if let Some(header) = &self.tier_header {
            builder = builder.tier_header(header.clone());
        }
        if let Some(path) = &self.path {
            builder = builder.route(path.clone());
        }
        // Parsed alike; the builder tells standard methods (`methods`) from opted-in ones.
        let parse_methods = |names: &[String]| {
            names
                .iter()
                .map(|m| {
                    Method::from_bytes(m.to_ascii_uppercase().as_bytes())
                        .map_err(|_| invalid(format!("method {m:?} is not a valid method")))
                })
                .collect::<Result<Vec<_>, _>>()
        };
        if let Some(methods) = &self.methods {
            builder = builder.methods(parse_methods(methods)?);
        }
        if let Some(methods) = &self.custom_methods {
            builder = builder.custom_methods(parse_methods(methods)?);
        }
        if let Some(budget) = self.budget_settings() {
            builder = builder.budget(budget);
        }
        if let Some(p) = &self.penalty {
            let penalty =
                Penalty::new(p.after, p.within, p.ban).map_err(|e| invalid(e.to_string()))?;
            builder = builder.penalty(penalty);
        }
        // Counting by outcome.
        if let Some(statuses) = &self.count_statuses {
            let set = StatusSet::parse(statuses, "count_statuses").map_err(&invalid)?;
            builder = builder.count_only(move |status| set.contains(status));
        }
        if let Some(statuses) = &self.refund_statuses {
            let set = StatusSet::parse(statuses, "refund_statuses").map_err(&invalid)?;
            builder = builder.refund_on(move |status| set.contains(status));
        }
        builder = builder.on_missing_key(match self.on_missing_key.as_deref() {
            None | Some("reject") => MissingKey::Reject(StatusCode::BAD_REQUEST),
            Some("allow") => MissingKey::Allow,
            Some(other) => {
                return Err(invalid(format!(
                    "on_missing_key {other:?} is not \"reject\" or \"allow\""
                )))
            }
        });
        builder.build()
    }
}

/// `client-ip` keys (alone or in a composite) read behind `client_ip`'s proxies.
fn bind_client_ip(key: &mut KeySpec, client_ip: &ClientIp) {
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

/// The quotas of a route or tier: `quotas`, or `count`/`period`/`max_burst`.
fn quotas_of(
    algorithm: Algorithm,
    count: Option<u64>,
    period: Option<Duration>,
    max_burst: Option<u64>,
    quotas: Option<&[QuotaConfig]>,
) -> Result<Vec<Quota>, String> {
    let gcra = algorithm == Algorithm::Gcra;
    let one = |count: u64, period: Option<Duration>, max_burst: Option<u64>| {
        let period = match (period, algorithm) {
            (Some(period), _) => period,
            // In flight, not per period: any period will do.
            (None, Algorithm::Concurrency) => Duration::from_secs(1),
            (None, _) => return Err("period is required with count".to_owned()),
        };
        let mut quota = Quota::per_period(count, period);
        match max_burst {
            Some(_) if !gcra => Err(format!(
                "max_burst is only used by algorithm \"gcra\", not {:?}; remove it",
                algorithm.as_str()
            )),
            Some(max_burst) => {
                quota = quota.with_max_burst(max_burst);
                Ok(quota)
            }
            None => Ok(quota),
        }
    };
    if let Some(quotas) = quotas {
        if count.is_some() || period.is_some() || max_burst.is_some() {
            return Err("give either quotas or count/period/max_burst, not both".into());
        }
        if quotas.is_empty() {
            return Err("quotas is empty".into());
        }
        return quotas
            .iter()
            .map(|q| one(q.count, Some(q.period), q.max_burst))
            .collect();
    }
    match count {
        Some(count) => Ok(vec![one(count, period, max_burst)?]),
        None => Err("a quota is required: count and period, or quotas".into()),
    }
}

impl AccessConfig {
    /// The static lists.
    pub fn lists(&self) -> Result<AccessList, BuildError> {
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
