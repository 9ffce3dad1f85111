//! The policy [`Table`] a layer decides by, and the one function that builds it — checked against
//! the backend, with the verdict's rules made for it — for the builder and for every reload.

use std::collections::HashMap;
use std::sync::Arc;

use crate::backend::Backend;
use crate::engine::settings::Settings;
use crate::engine::verdict::Judge;
use crate::error::BuildError;
use crate::limit::Limit;
use crate::per_customer::Namespace;
use crate::policy::{check_table, Policy, PolicySpec};

/// The policies in the order they are tried, each compiled for this table, and their judge.
pub(crate) struct Table<K> {
    pub(crate) policies: Box<[Policy<K>]>,
    /// Its own `Arc`: a response future waiting for a remote decision holds the judge and its
    /// policy's [`CompiledPolicy`], not the table (whose key extractors it has no use for).
    pub(crate) judge: Arc<Judge>,
    /// Whether a policy names near limits to its handler (`near_limit_header`): then no request
    /// keeps an `x-ratelimit-near` of its own, whichever policy it meets.
    pub(crate) strips_near: bool,
}

impl<K> Table<K> {
    /// Each policy's name with the names its limits keep state under (tiers, customers, overrides).
    pub(crate) fn limit_names(&self) -> Vec<(String, Vec<String>)> {
        let policies = self.policies.iter().map(|p| {
            let rules = p.compiled();
            let quotas = &rules.overridable.quotas;
            let overridden = quotas.namespace(Namespace::Override);
            let override_name = overridden.map(|l| l.name().to_owned());
            let mut names = vec![rules.name().to_owned()];
            names.extend(override_name);
            let limits = rules.tiers.iter().flat_map(|t| t.limits.iter());
            names.extend(limits.map(|l| l.name().to_owned()));
            (rules.name().to_owned(), names)
        });
        policies.collect()
    }

    /// The names of this table's limits that `next` changes (any setting) or no longer has: what
    /// a backend may have cached under them no longer holds ([`Backend::reloaded`]). The
    /// customers' and overrides' limits too, which take the policy's algorithm and penalty.
    pub(crate) fn changed_in(&self, next: &Table<K>) -> Vec<String> {
        let next_limits = kept_limits(&next.policies);
        let next: HashMap<(u8, &str), &Limit> = (next_limits.iter())
            .map(|(kind, l)| ((*kind, l.name()), l))
            .collect();
        let mut changed: Vec<String> = (kept_limits(&self.policies).iter())
            .filter(|(kind, l)| next.get(&(*kind, l.name())) != Some(&l))
            .map(|(_, l)| l.name().to_owned())
            .collect();
        changed.sort_unstable();
        changed.dedup();
        changed
    }

    /// Checks `policies` against `backend` and compiles them. With `previous` (a reload), the new
    /// table takes over the in-process state of the one it replaces (penalty boxes, local limiter).
    pub(crate) fn build<B: Backend>(
        backend: &B,
        policies: impl Into<Box<[Policy<K>]>>,
        settings: Settings,
        previous: Option<&Table<K>>,
    ) -> Result<Self, BuildError> {
        let policies: Box<[Policy<K>]> = policies.into();
        let specs: Vec<&PolicySpec> = policies.iter().map(Policy::spec).collect();
        check_table(backend, &specs, settings.overload.as_deref())?;
        let exposed = settings.decision_extension;
        let mut judge = Judge::new(settings);
        if let Some(previous) = previous {
            judge.fallback.carry_over(&previous.judge.fallback);
            judge.errors = previous.judge.errors.clone();
        }
        let old = previous.map_or(&[][..], |t| &t.policies[..]);
        let keeps_penalties = backend.keeps_penalties();
        let policies = Vec::from(policies)
            .into_iter()
            .map(|policy| {
                let kept = old.iter().map(|p| &**p.compiled());
                policy.compile(exposed, keeps_penalties, kept)
            })
            .collect();
        let policies: Box<[Policy<K>]> = policies;
        let strips_near = policies
            .iter()
            .any(|p| p.spec().near.is_some_and(|near| near.header));
        Ok(Table {
            policies,
            judge: Arc::new(judge),
            strips_near,
        })
    }
}

/// Every limit of `policies` the backend keeps state under (state is found by name), each with its
/// kind, to be compared with its own kind's: 0 for a tier's or a shadow (counted by the backend
/// too), 1 for the customers' (which may share a tier limit's name, without its budget), 2 for the
/// overrides'.
pub(crate) fn kept_limits<K>(policies: &[Policy<K>]) -> Vec<(u8, Limit)> {
    let of = |p: &Policy<K>| {
        let quotas = &p.compiled().overridable.quotas;
        let spaces = [Namespace::Customer, Namespace::Override].map(|ns| quotas.namespace(ns));
        let spaces = (1..).zip(spaces).filter_map(|(kind, l)| Some((kind, l?)));
        let spec = p.spec();
        let tiers = spec.tiers.iter().flat_map(|t| t.limits.iter());
        let own = tiers.chain(spec.shadow_limits()).map(|l| (0, l.clone()));
        own.chain(spaces).collect::<Vec<_>>()
    };
    policies.iter().flat_map(of).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::PeerIp;
    use crate::quota::Quota;

    #[test]
    fn a_reload_names_the_limits_it_changed_or_removed() {
        let backend = crate::backend::MemoryBackend::new();
        let policy = |name: &str, count| {
            let quota = Quota::per_second(count);
            Policy::builder(name)
                .key(crate::key::PeerIp::new())
                .route(format!("/{name}"))
                .quota(quota)
                .build()
                .unwrap()
        };
        // A table of a policy for each (name, count a second), on route `/{name}`.
        let table = |policies: &[(&str, u64)]| {
            let policies: Box<[Policy<PeerIp>]> =
                policies.iter().map(|&(n, c)| policy(n, c)).collect();
            Table::build(&backend, policies, Settings::default(), None).unwrap()
        };
        let before = table(&[("same", 5), ("faster", 5), ("gone", 5)]);
        let after = table(&[("same", 5), ("faster", 10), ("new", 5)]);
        let overrides = ["faster.override", "gone.override"];
        assert_eq!(
            before.changed_in(&after),
            ["faster", overrides[0], "gone", overrides[1]]
        );
        let again = table(&[("same", 5), ("faster", 5), ("gone", 5)]);
        assert!(before.changed_in(&again).is_empty(), "the same table again");
        // A leased budget and quotas per customer, whose limit has the policy's name without the
        // budget: unchanged, each compared with its own.
        let budgeted = || {
            let policy = Policy::builder("plans")
                .key(PeerIp::new())
                .quota(Quota::per_second(5));
            let policy = policy.budget(crate::budget::Budget::default());
            let policy = policy.quota_from(|_: &http::request::Parts, _: &crate::key::Key| None);
            let policies: Box<[Policy<PeerIp>]> = Box::new([policy.build().unwrap()]);
            Table::build(&backend, policies, Settings::default(), None).unwrap()
        };
        assert!(budgeted().changed_in(&budgeted()).is_empty());
        // The failure policy's log is the one before the reload: an outage is one across it.
        let before = budgeted();
        let policies: Box<[Policy<PeerIp>]> = before.policies.clone();
        let after = Table::build(&backend, policies, Settings::default(), Some(&before)).unwrap();
        assert!(Arc::ptr_eq(&before.judge.errors, &after.judge.errors));
    }
}
