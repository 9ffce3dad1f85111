//! The policy [`Table`] a layer decides by, and the one function that builds it — checked against
//! the backend, with the verdict's rules made for it — for the builder and for every reload.

use std::collections::hash_map::{Entry, HashMap};
use std::sync::Arc;

use crate::backend::Backend;
use crate::error::BuildError;
use crate::limit::Limit;
use crate::middleware::settings::Settings;
use crate::middleware::verdict::Judge;
use crate::policy::{check_reachable, Policy};

/// The policy table: the policies in the order they are tried, and the verdict's rules for them.
pub(crate) struct Table<K> {
    pub(crate) policies: Box<[Policy<K>]>,
    /// Its own `Arc`: a response future waiting for a remote decision holds the judge, not the table.
    pub(crate) judge: Arc<Judge>,
}

impl<K> Table<K> {
    /// Checks `policies` against `backend` ([`validate_table`]) and makes the verdict's rules for
    /// them. With `previous` (a reload), the new judge takes over the in-process state it shares
    /// with the table it replaces (penalty boxes, the local limiter).
    pub(crate) fn build<B: Backend>(
        backend: &B,
        policies: impl Into<Box<[Policy<K>]>>,
        settings: Settings,
        previous: Option<&Judge>,
    ) -> Result<Self, BuildError> {
        let policies: Box<[Policy<K>]> = policies.into();
        validate_table(backend, &policies)?;
        let mut judge = Judge::new(settings, &policies, backend.keeps_penalties());
        if let Some(previous) = previous {
            judge.carry_over(previous);
        }
        Ok(Table {
            policies,
            judge: Arc::new(judge),
        })
    }
}

/// The checks of a policy table, for [`ThrottleLayerBuilder::build`] and for a reload: what the
/// backend can enforce, limits that share a name share their rules and stacks, and every policy can
/// be reached.
fn validate_table<K, B: Backend>(
    backend: &B,
    policies: &[Policy<K>],
) -> Result<(), BuildError> {
    if policies.is_empty() {
        return Err(BuildError::Invalid(
            "a throttle layer needs at least one policy".into(),
        ));
    }
    for policy in policies {
        // Counting by outcome gives units back: a backend that cannot would count them all.
        if policy.extras().is_some_and(|e| e.outcome.is_some()) && !backend.can_refund() {
            return Err(BuildError::Invalid(format!(
                "policy {:?} counts by outcome (count_only, refund_on), but this backend cannot \
                 give units back (Backend::can_refund)",
                policy.name()
            )));
        }
        for tier in policy.tiers() {
            match &*tier.limits {
                [one] => backend.validate(one)?,
                // The backend checks each member of a stack as it will run it.
                all => backend.validate_all(all)?,
            }
        }
    }
    // Every limit, with the names of the stack it belongs to.
    let limits: Vec<(&Limit, Vec<&str>)> = policies
        .iter()
        .flat_map(|p| p.tiers())
        .flat_map(|t| {
            let stack: Vec<&str> = t.limits.iter().map(|l| l.name()).collect();
            t.limits.iter().map(move |l| (l, stack.clone()))
        })
        .collect();
    // The first limit of each name, looked up by name: a table of many policies builds in
    // linear time.
    let mut first_named: HashMap<&str, &(&Limit, Vec<&str>)> = HashMap::new();
    for entry in &limits {
        let (limit, stack) = entry;
        // Limits that share a name share their keys' state, which only makes sense with the same
        // rules: a TAT written under a one-hour tolerance would lock users out of a per-second
        // one, and a delayed policy's queue would be erased by one without the delay.
        let (other, other_stack) = match first_named.entry(limit.name()) {
            Entry::Vacant(vacant) => {
                vacant.insert(entry);
                continue;
            }
            Entry::Occupied(occupied) => *occupied.get(),
        };
        if !other.same_rules(limit) {
            return Err(BuildError::Invalid(format!(
                "policy {:?} appears twice with different rules ({} and {}); policies that share \
                     a name share their keys, so they need one quota, algorithm, delay, lease and \
                     penalty",
                limit.name(),
                other.quota(),
                limit.quota()
            )));
        }
        if stack != other_stack {
            return Err(BuildError::Invalid(format!(
                "the limit name {:?} is used by two different stacks of quotas ({} and {}); \
                     rename a policy or tier",
                limit.name(),
                other_stack.join(" + "),
                stack.join(" + ")
            )));
        }
    }
    check_reachable(policies)
}
