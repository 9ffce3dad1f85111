//! What a policy cannot use together: one table of the features that exclude each other, checked
//! once when the policy is built, each refusal with its reason. A feature that adds a conflict adds
//! a row here (and to the test that lists them), not a check of its own elsewhere.

use super::options::Options;
use crate::error::BuildError;
use crate::limit::Algorithm;
use crate::window::WindowStart;

/// A feature of a policy, as far as another one can exclude it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Feature {
    /// A metered limit (`PolicyBuilder::metered`).
    Metered,
    /// A metered limit and no quota of the policy's own.
    MeteredAlone,
    /// An option of the policy's own quotas: an algorithm but GCRA, a penalty, a budget, a
    /// delay, a lease, a calendar or each key's own window start.
    QuotaOptions,
    /// `quota_from`: a per-customer quota from a closure.
    QuotaFrom,
    /// `quota_resolver`: a per-customer quota from a resolver.
    Resolver,
    /// Counting by outcome (`count_only`, `refund_on`).
    CountOnly,
    /// Quotas with keys of their own (`quota_keyed`).
    KeysApart,
    /// Shadow limits (`shadow_quota`).
    Shadow,
    Budget,
    Concurrency,
    /// Delay mode (`delay`).
    Delay,
    Tiers,
    Penalty,
    AsyncKey,
    BodyKey,
    /// Limits enforced only under pressure (`under_pressure_only`).
    UnderPressure,
    DryRun,
    /// A staged roll-out (`enforce`).
    Enforce,
}

use Feature::*;

/// Every pair a policy may not use together, and why (after `policy "<name>": `); a policy using
/// both features of a row is refused with the first such row.
#[rustfmt::skip]
pub(crate) const EXCLUDED: &[(Feature, Feature, &str)] = &[
    (KeysApart, Tiers, "quotas with keys of their own cannot be used with tiers"),
    (KeysApart, Penalty, "quotas with keys of their own cannot be used with a penalty (whose key would it ban?)"),
    (KeysApart, Budget, "quotas with keys of their own cannot be used with a leased budget"),
    (Metered, Tiers, "a metered limit cannot be used with tiers yet"),
    (Metered, QuotaFrom, "a metered limit cannot be used with per-customer quotas (quota_from, quota_resolver) yet"),
    (Metered, Resolver, "a metered limit cannot be used with per-customer quotas (quota_from, quota_resolver) yet"),
    (Metered, CountOnly, "a metered limit settles its cost after the response; count_only and refund_on cannot be used with it"),
    (Metered, Delay, "a metered limit cannot be used with delay mode (a request that waits holds its reservation)"),
    (Metered, Budget, "a metered limit cannot be used with a leased budget yet (a slice would lease the policy's quota without the tokens)"),
    (MeteredAlone, QuotaOptions, "a metered limit alone takes no algorithm, penalty, budget, delay, lease, calendar or window start; they are options of the policy's own quota (quota, or count in a configuration)"),
    (QuotaFrom, Resolver, "quota_from and quota_resolver both choose the quota; use one"),
    (CountOnly, Concurrency, "count_only and refund_on need a rate (a concurrency slot is given back anyway when its request ends)"),
    (CountOnly, Budget, "count_only and refund_on cannot be used with a budget (a slice's units were charged when granted, so a refund could give back more than was taken)"),
    (CountOnly, Shadow, "count_only and refund_on cannot be used with a shadow limit yet (the shadow limit would count every response)"),
    (KeysApart, QuotaFrom, "quotas with keys of their own cannot be used with per-customer quotas (quota_from, quota_resolver)"),
    (KeysApart, Resolver, "quotas with keys of their own cannot be used with per-customer quotas (quota_from, quota_resolver)"),
    (KeysApart, CountOnly, "quotas with keys of their own cannot be used with count_only or refund_on yet"),
    (KeysApart, Metered, "quotas with keys of their own cannot be used with a metered limit yet"),
    (KeysApart, Concurrency, "quotas with keys of their own cannot be used with a concurrency limit (whose key would hold the slot?)"),
    (BodyKey, AsyncKey, "a body key and an async key both choose the key; use one"),
    (DryRun, Enforce, "dry_run and enforce both say how many refusals are enforced; use one"),
    (DryRun, UnderPressure, "dry_run and under_pressure_only both say when refusals are enforced; use one"),
];

/// The features of [`EXCLUDED`] a policy of these options uses.
pub(super) fn features(o: &Options) -> Vec<Feature> {
    let (extras, metered) = (&o.extras, o.extras.metered.limit.is_some());
    // An option of the policy's own quotas (which a metered limit alone would not have; its
    // shadow limits take the algorithm and windows).
    let windows = o.algorithm != Algorithm::Gcra
        || o.calendar.is_some()
        || o.window_start != WindowStart::Aligned;
    let options = [
        o.penalty.is_some(),
        o.budget.is_some(),
        o.delay.is_some(),
        o.lease.is_some(),
    ];
    let quota_options =
        options.into_iter().any(|set| set) || (windows && o.rollout.shadows.is_empty());
    [
        (Metered, metered),
        (MeteredAlone, metered && o.quotas.is_empty()),
        (QuotaOptions, quota_options),
        (QuotaFrom, extras.quotas.quota_from.is_some()),
        (Resolver, extras.quotas.resolver.is_some()),
        (CountOnly, extras.outcome.is_set()),
        (KeysApart, extras.quota_keys.iter().any(Option::is_some)),
        (Shadow, !o.rollout.shadows.is_empty()),
        (Budget, o.budget.is_some()),
        (Concurrency, o.algorithm == Algorithm::Concurrency),
        (Delay, o.delay.is_some()),
        (Tiers, !o.tiers.is_empty()),
        (Penalty, o.penalty.is_some()),
        (AsyncKey, extras.async_key.is_some()),
        (BodyKey, extras.body_key.is_some()),
        (DryRun, o.dry_run),
        (UnderPressure, o.under_pressure),
        (Enforce, o.rollout.enforce.is_some()),
    ]
    .into_iter()
    .filter_map(|(feature, used)| used.then_some(feature))
    .collect()
}

/// Refuses policy `policy` if it uses two features that exclude each other (`uses`: those it uses).
pub(crate) fn check(policy: &str, uses: &[Feature]) -> Result<(), BuildError> {
    match EXCLUDED
        .iter()
        .find(|(a, b, _)| uses.contains(a) && uses.contains(b))
    {
        Some((_, _, why)) => Err(BuildError::Invalid(format!("policy {policy:?}: {why}"))),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The table, as a user reads it: every pair refused, each with its reason, and one feature
    /// alone never refused.
    #[test]
    fn the_excluded_pairs_are_these() {
        #[rustfmt::skip]
        let listed = [
            (KeysApart, Tiers), (KeysApart, Penalty), (KeysApart, Budget), (Metered, Tiers),
            (Metered, QuotaFrom), (Metered, Resolver), (Metered, CountOnly), (Metered, Delay),
            (Metered, Budget), (MeteredAlone, QuotaOptions),
            (QuotaFrom, Resolver), (CountOnly, Concurrency), (CountOnly, Budget),
            (CountOnly, Shadow), (KeysApart, QuotaFrom), (KeysApart, Resolver),
            (KeysApart, CountOnly), (KeysApart, Metered), (KeysApart, Concurrency),
            (BodyKey, AsyncKey), (DryRun, Enforce), (DryRun, UnderPressure),
        ];
        let pairs: Vec<(Feature, Feature)> = EXCLUDED.iter().map(|(a, b, _)| (*a, *b)).collect();
        assert_eq!(pairs, listed);
        for (a, b, why) in EXCLUDED {
            let refused = check("api", &[*b, *a]).unwrap_err().to_string();
            assert!(refused.starts_with("policy \"api\": "), "{refused}");
            assert!(refused.ends_with(why), "{refused}");
            assert!(check("api", &[*a]).is_ok() && check("api", &[*b]).is_ok());
        }
    }
}
