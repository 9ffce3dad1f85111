//! What a table of policies must hold together, checked when a layer is built and on every reload
//! (a policy alone is checked by its builder, `compat.rs`).

use std::collections::hash_map::{Entry, HashMap};

use http::Method;

use crate::backend::{Backend, Uses};
use crate::error::BuildError;
use crate::limit::Limit;
use crate::overload::{Gate, PartitionBy};
use crate::per_customer::Namespace;
use crate::policy::spec::PolicySpec;
use crate::route::Route;

/// The checks of a policy table: what the backend can enforce, what the layer has (`gate`: an
/// overload gate, whose partitions name policies or tiers of the table), limits that share a name
/// share rules and stacks, and all policies are reachable.
pub(crate) fn check_table<B: Backend>(
    backend: &B,
    policies: &[&PolicySpec],
    gate: Option<&Gate>,
) -> Result<(), BuildError> {
    if policies.is_empty() {
        return Err(BuildError::Invalid(
            "a throttle layer needs at least one policy".into(),
        ));
    }
    if let Some(gate) = gate {
        // The names a request's partition may have: its policy's, or its tier's.
        let names = policies.iter().flat_map(|spec| match gate.partition_by() {
            PartitionBy::Policy => vec![&*spec.name],
            PartitionBy::Tier => (spec.tiers.iter())
                .map(|t| t.name.as_deref().unwrap_or("default"))
                .collect(),
        });
        gate.check_partitions(names.collect())?;
    }
    for policy in policies {
        if policy.under_pressure && gate.is_none() {
            return Err(BuildError::Invalid(format!(
                "policy {:?}: under_pressure_only needs the layer's overload gate \
                 (ThrottleLayerBuilder::overload, or [overload] in the configuration)",
                policy.name
            )));
        }
        for shadow in policy.shadow_limits() {
            backend.validate(std::slice::from_ref(shadow), Uses::NOTHING_MORE)?;
        }
        // Quotas with keys of their own (one tier): decided together, each under its key. The
        // backend checks each member of a stack as it will run it.
        let extras = policy.extras.as_ref();
        let uses = match extras.is_some_and(|e| e.limit_keys.is_some()) {
            true => Uses::NOTHING_MORE.keys_apart(),
            false => Uses::NOTHING_MORE,
        };
        let tiers = match uses.keys_apart {
            true => &policy.tiers[..1],
            false => &policy.tiers,
        };
        for tier in tiers {
            backend.validate(&tier.limits, uses)?;
        }
        let limits = &policy.tiers[0].limits;
        // Counting by outcome gives units back: a backend that cannot would count them all.
        let refunds = extras.is_some_and(|e| e.outcome.is_some());
        if refunds && backend.validate(limits, uses.refunds()).is_err() {
            return Err(BuildError::Invalid(format!(
                "policy {:?} counts by outcome (count_only, refund_on), but this backend cannot \
                 give units back (Backend::validate refuses refunds)",
                policy.name()
            )));
        }
        let settles = extras.is_some_and(|e| e.metered.is_some());
        if settles && backend.validate(limits, uses.settles()).is_err() {
            return Err(BuildError::Invalid(format!(
                "policy {:?} has a metered limit, but this backend cannot settle a cost after the \
                 response (Backend::validate refuses settlements)",
                policy.name()
            )));
        }
    }
    // Every limit, with the names of the stack it belongs to.
    let limits: Vec<(&Limit, Vec<&str>)> = policies
        .iter()
        .flat_map(|p| &p.tiers)
        .flat_map(|t| {
            let stack: Vec<&str> = t.limits.iter().map(|l| l.name()).collect();
            t.limits.iter().map(move |l| (l, stack.clone()))
        })
        // A shadow limit is decided alone: a stack of one.
        .chain(
            policies
                .iter()
                .flat_map(|p| p.shadow_limits())
                .map(|l| (l, vec![l.name()])),
        )
        .collect();
    check_state_names(policies)?;
    // The first limit of each name: a table of many policies builds in linear time.
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
                "the limit {:?} appears twice with different rules ({} and {}); limits that \
                     share a name share their keys, so they need one quota, algorithm, delay, lease \
                     and penalty",
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

/// Refuses a table in which two policies would keep state under one name: where a policy's
/// overrides keep it (`<policy>.override`, `per_customer.rs`) and its per-customer quotas (its own
/// name), against every other policy's of those and its limits (`plans.paid`: policy `plans`'s
/// tier `paid`, and policy `plans.paid` choosing quotas). Policies of one name (one a method) share
/// theirs on purpose.
fn check_state_names(policies: &[&PolicySpec]) -> Result<(), BuildError> {
    let chooses = |p: &PolicySpec| {
        let extras = p.extras.as_ref();
        extras.is_some_and(|e| e.quotas.namespace(Namespace::Customer).is_some())
    };
    // Each name kept: its policy, and whether it is the customers' (else the overrides').
    let mut kept: HashMap<String, (&str, bool)> = HashMap::new();
    for policy in policies {
        let own = Some(crate::limit::override_state_name(&policy.name));
        let customers = chooses(policy).then(|| policy.name.to_string());
        for (name, customer) in [(own, false), (customers, true)] {
            let Some(name) = name else { continue };
            match kept.insert(name.clone(), (&policy.name, customer)) {
                Some((other, false)) if other != &*policy.name && !customer => {
                    return Err(BuildError::Invalid(format!(
                        "policies {other:?} and {:?} would keep their overrides' state under one \
                         name; shorten one",
                        policy.name
                    )));
                }
                // A policy's customers' state where another's overrides or customers keep theirs.
                Some((other, _)) if other != &*policy.name => {
                    let owner = if customer { &*policy.name } else { other };
                    return Err(taken(&name, owner, true));
                }
                _ => {}
            }
        }
    }
    for policy in policies {
        let limits = policy.tiers.iter().flat_map(|t| t.limits.iter());
        for limit in limits.chain(policy.shadow_limits()) {
            if let Some((owner, customer)) = kept.get(limit.name())
                && *owner != &*policy.name
            {
                return Err(taken(limit.name(), owner, *customer));
            }
        }
    }
    Ok(())
}

/// The error of a limit named where `owner`'s overrides (or, if `customer`, its per-customer
/// quotas) keep their state.
fn taken(name: &str, owner: &str, customer: bool) -> BuildError {
    let whose = if customer {
        "per-customer quotas"
    } else {
        "overrides"
    };
    BuildError::Invalid(format!(
        "the limit name {name:?} is where the {whose} of policy {owner:?} keep their state; \
         rename the policy or tier"
    ))
}

/// Refuses a list of policies in which one can never apply: the first policy whose route and
/// methods match a request decides, so a policy after one that matches every request it would
/// match is dead configuration, most likely a limit its author believes is enforced. Only routes
/// spelt alike (up to parameter names) count as the same: under axum's router, `/{*rest}` and
/// `/users` are different routes, and neither hides the other.
fn check_reachable(policies: &[&PolicySpec]) -> Result<(), BuildError> {
    // Only a route-less policy or one on the same route can cover another, so each policy is
    // compared with those alone: linear in the number of routes, which tables of thousands have.
    let mut unrouted: Vec<usize> = Vec::new();
    let mut by_route: HashMap<String, Vec<usize>> = HashMap::new();
    for (i, later) in policies.iter().enumerate() {
        let shape = later.route.as_ref().map(Route::shape);
        let same_route = shape.as_ref().and_then(|s| by_route.get(s));
        let earlier = unrouted
            .iter()
            .chain(same_route.into_iter().flatten())
            .copied()
            .filter(|&e| covers(policies[e], later))
            .min();
        if let Some(earlier) = earlier {
            let earlier = &policies[earlier];
            return Err(BuildError::Invalid(format!(
                "policy {:?} can never apply: policy {:?}, before it, matches every request it \
                 would ({}), and the first matching policy decides; put the narrower policy first \
                 or give them different routes or methods",
                later.name(),
                earlier.name(),
                scope(earlier)
            )));
        }
        match shape {
            Some(shape) => by_route.entry(shape).or_default().push(i),
            None => unrouted.push(i),
        }
    }
    Ok(())
}

/// Whether `this` matches every request that `other` matches.
fn covers(this: &PolicySpec, other: &PolicySpec) -> bool {
    let routes = match (this.route.as_ref(), other.route.as_ref()) {
        (None, _) => true,
        (Some(mine), Some(theirs)) => mine.same_route(theirs),
        (Some(_), None) => false,
    };
    let methods = match (this.methods.as_deref(), other.methods.as_deref()) {
        (None, _) => true,
        (Some(mine), Some(theirs)) => theirs.iter().all(|m| mine.contains(m)),
        (Some(_), None) => false,
    };
    // A condition narrows a policy: `this` still covers `other` if `other` has it too.
    let conditions = this.conditions.iter().all(|c| other.conditions.contains(c));
    routes && methods && conditions
}

/// The requests `policy` matches, in words.
fn scope(policy: &PolicySpec) -> String {
    let route = match policy.route.as_ref() {
        None => "every route".to_owned(),
        Some(route) => format!("route {:?}", route.pattern()),
    };
    let methods = match policy.methods.as_deref() {
        None => "every method".to_owned(),
        Some(methods) => {
            let names: Vec<&str> = methods.iter().map(Method::as_str).collect();
            format!("methods {}", names.join(", "))
        }
    };
    match policy.conditions.len() {
        0 => format!("{route}, {methods}"),
        n => format!("{route}, {methods}, {n} condition(s)"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::PeerIp;
    use crate::policy::Policy;
    use crate::quota::Quota;

    /// A long policy name's overrides keep their state under its start and a hash: a policy of
    /// that very name, or a limit, is refused.
    #[test]
    fn no_two_policies_keep_their_overrides_under_one_name() {
        let long = "p".repeat(60);
        let hashed = crate::limit::override_state_name(&long);
        let short = hashed.strip_suffix(".override").unwrap().to_owned();
        let policy = |name: &str, route: &str| {
            let policy = Policy::builder(name).key(crate::key::Global).route(route);
            policy.quota(Quota::per_second(5)).build().unwrap()
        };
        let (a, b) = (policy(&long, "/a"), policy(&short, "/b"));
        let backend = crate::backend::MemoryBackend::new();
        let error = check_table(&backend, &[a.spec(), b.spec()], None).unwrap_err();
        assert!(error.to_string().contains("under one name"), "{error}");
        let c = policy(&hashed, "/c");
        let error = check_table(&backend, &[a.spec(), c.spec()], None).unwrap_err();
        assert!(
            error.to_string().contains("where the overrides of policy"),
            "{error}"
        );
    }

    /// Per-customer quotas keep their state under their policy's name: another policy's limit of
    /// that name (a tier's) is refused.
    #[test]
    fn no_limit_shares_the_name_per_customer_quotas_keep_their_state_under() {
        let plans = Policy::builder("plans").key(crate::key::Global).route("/a");
        let plans = plans
            .quota(Quota::per_second(5))
            .tier("paid", [Quota::per_second(50)]);
        let paid_named = |name: &str| {
            let paid = Policy::builder(name).key(crate::key::Global).route("/b");
            let paid = paid.quotas([Quota::per_second(5), Quota::per_hour(100)]);
            let paid = paid.quota_from(|_: &http::request::Parts, _: &crate::key::Key| None);
            paid.build().unwrap()
        };
        let (plans, paid) = (plans.build().unwrap(), paid_named("plans.paid"));
        let backend = crate::backend::MemoryBackend::new();
        // Nor where another policy's overrides keep theirs.
        let x = Policy::builder("x").key(crate::key::Global).route("/x");
        let x = x.quota(Quota::per_second(5)).build().unwrap();
        let error = check_table(&backend, &[x.spec(), paid_named("x.override").spec()], None);
        assert!(error
            .unwrap_err()
            .to_string()
            .contains("per-customer quotas"));
        // Beside a policy it shares nothing with, a policy choosing quotas is fine.
        check_table(&backend, &[x.spec(), paid.spec()], None).unwrap();
        let error = check_table(&backend, &[plans.spec(), paid.spec()], None).unwrap_err();
        assert!(
            error.to_string().contains("per-customer quotas of policy"),
            "{error}"
        );
    }

    #[test]
    fn a_policy_hidden_by_an_earlier_one_is_an_error() {
        let q = Quota::per_second(5);
        let policy = |name: &str, route: Option<&str>, methods: Option<&[Method]>| {
            let mut b = Policy::builder(name)
                .key(crate::key::PeerIp::new())
                .quota(q);
            if let Some(route) = route {
                b = b.route(route);
            }
            if let Some(methods) = methods {
                b = b.methods(methods.to_vec());
            }
            b.build().unwrap()
        };
        let check = |policies: &[Policy<PeerIp>]| {
            let specs: Vec<&PolicySpec> = policies.iter().map(Policy::spec).collect();
            check_reachable(&specs).map_err(|e| e.to_string())
        };
        let everything = policy("all", None, None);
        let users = policy("users", Some("/users/{id}"), None);
        let users_again = policy("users2", Some("/users/{user_id}"), None);
        let users_post = policy("users-post", Some("/users/{id}"), Some(&[Method::POST]));
        let users_get = policy("users-get", Some("/users/{id}"), Some(&[Method::GET]));
        let posts = policy("posts", None, Some(&[Method::POST]));

        assert_eq!(
            check(&[everything.clone(), users.clone()]).unwrap_err(),
            r#"policy "users" can never apply: policy "all", before it, matches every request it would (every route, every method), and the first matching policy decides; put the narrower policy first or give them different routes or methods"#
        );
        assert!(check(&[users.clone(), users_again.clone()])
            .unwrap_err()
            .contains(r#"policy "users2" can never apply"#));
        assert!(check(&[users.clone(), users_post.clone()]).is_err());
        assert!(check(&[posts.clone(), users_post.clone()]).is_err());
        // Narrower first is the way to say "this route, else everything".
        check(&[users.clone(), everything.clone()]).unwrap();
        check(&[users_post.clone(), users.clone(), everything]).unwrap();
        check(&[users_post.clone(), users_get.clone()]).unwrap();
        check(&[users_post, posts]).unwrap();
        // Different routes under axum are matched by MatchedPath: neither hides the other.
        check(&[policy("rest", Some("/{*rest}"), None), users]).unwrap();
    }

    #[test]
    fn a_policy_with_conditions_hides_only_what_meets_them_too() {
        use crate::policy::Condition;
        let q = Quota::per_second(5);
        let policy = |name: &str, conditions: &[Condition]| {
            let mut b = Policy::builder(name).key(PeerIp::new()).quota(q);
            for c in conditions {
                b = b.when(c.clone());
            }
            b.build().unwrap()
        };
        let check = |policies: &[Policy<PeerIp>]| {
            let specs: Vec<&PolicySpec> = policies.iter().map(Policy::spec).collect();
            check_reachable(&specs).map_err(|e| e.to_string())
        };
        let mobile = Condition::header("x-client", "mobile");
        let free = Condition::query("plan", "free");
        let all = policy("all", &[]);
        let phones = policy("phones", std::slice::from_ref(&mobile));
        let free_phones = policy("free-phones", &[mobile.clone(), free]);
        // "Mobile clients, else everyone": the narrower one first.
        check(&[phones.clone(), all.clone()]).unwrap();
        check(&[free_phones.clone(), phones.clone()]).unwrap();
        let hidden = check(&[phones.clone(), free_phones]).unwrap_err();
        assert!(
            hidden.contains(r#"policy "free-phones" can never apply"#),
            "{hidden}"
        );
        assert!(hidden.contains("1 condition(s)"), "{hidden}");
        assert!(check(&[all, phones]).is_err());
    }
}
