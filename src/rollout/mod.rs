//! Rolling a limit out safely ([`PolicyBuilder::shadow`](crate::PolicyBuilder::shadow),
//! [`PolicyBuilder::enforce_fraction`](crate::PolicyBuilder::enforce_fraction)): which keys a
//! staged policy enforces its refusals for, the shadow limits a policy counts but never enforces,
//! and how the refusals that are only counted are reported.
//!
//! The share of keys is chosen by a hash with a fixed seed (FNV-1a, then a 64-bit finaliser for
//! its high bits), never by `RandomState`: every process, before and after a restart, picks the
//! same keys, so one client sees one behaviour. A key is in the share when its hash is below
//! `share × 2^64`, so raising the share only adds keys (the 10 % are among the 20 %).

//!
//! The whole feature lives here: the builder's options (`builder.rs`), what a policy keeps of them
//! (`Staged`, `WouldLimit`) and the engine's part (`shadows.rs`).

mod builder;
pub(crate) mod shadows;

use std::time::Duration;

use crate::error::BuildError;
use crate::key::Key;
use crate::limit::{Algorithm, Limit, MAX_STACKED_QUOTAS};
use crate::observe::{sampled, OncePerSecond, ShownKey};
use crate::quota::Quota;

#[derive(Debug, Default)]
pub(crate) struct RolloutBuilder {
    pub(crate) shadows: Vec<Quota>,
    pub(crate) enforce: Option<f64>,
}

impl RolloutBuilder {
    /// The stage and shadow limits of `policy` (a staged dry run is refused in `policy/compat.rs`).
    pub(crate) fn build(
        self,
        policy: &str,
        algorithm: Algorithm,
        cost: u64,
        label: fn(Duration) -> String,
        taken: &[&str],
    ) -> Result<(Option<Staged>, Box<[Limit]>), BuildError> {
        let staged = match self.enforce {
            Some(fraction) => Staged::of(policy, fraction)?,
            None => None,
        };
        let shadows = shadow_limits(policy, algorithm, cost, &self.shadows, label, taken)?;
        Ok((staged, shadows))
    }
}

/// The share of a policy's keys whose refusals are enforced.
pub(crate) fn share(dry_run: bool, staged: Option<Staged>) -> f64 {
    match (dry_run, staged) {
        (true, _) => 0.0,
        (false, None) => 1.0,
        (false, Some(staged)) => staged.fraction(),
    }
}

/// Staged enforcement: the keys a refusal is enforced for (the others only count it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Staged {
    /// A key is enforced when its hash is below this.
    below: u64,
}

impl Staged {
    /// The stage of a policy enforced for `fraction` of its keys; `None` when that is all of them.
    pub(crate) fn of(policy: &str, fraction: f64) -> Result<Option<Staged>, BuildError> {
        if !(0.0..=1.0).contains(&fraction) {
            return Err(BuildError::Invalid(format!(
                "policy {policy:?}: enforce must be a share of keys from 0% to 100%, not {}%",
                fraction * 100.0
            )));
        }
        if fraction == 1.0 {
            return Ok(None);
        }
        // `as` saturates: a share just under 1 stays below u64::MAX, and 0 enforces no key.
        let below = (fraction * 18_446_744_073_709_551_616.0) as u64;
        Ok(Some(Staged { below }))
    }

    pub(crate) fn fraction(&self) -> f64 {
        self.below as f64 / 18_446_744_073_709_551_616.0
    }

    pub(crate) fn enforces(&self, key: &Key) -> bool {
        key.stable_hash() < self.below
    }
}

/// A share written as a percentage (`"10%"`, `"2.5%"`, `"100%"`), as a fraction from 0 to 1.
#[cfg_attr(not(feature = "config"), allow(dead_code))]
pub(crate) fn parse_percent(text: &str) -> Result<f64, String> {
    let bad = || format!("{text:?} is not a percentage from \"0%\" to \"100%\" (such as \"10%\")");
    let number = text.trim().strip_suffix('%').ok_or_else(bad)?;
    let percent: f64 = number.trim().parse().map_err(|_| bad())?;
    if !(0.0..=100.0).contains(&percent) {
        return Err(bad());
    }
    Ok(percent / 100.0)
}

/// The shadow limits of a policy called `policy`: one per quota, named `{policy}.shadow.{period}`
/// (`label` spells the period as stacks do), with the policy's algorithm. `taken`: the names of
/// the policy's own limits, which a shadow limit may not share (it keeps its own state). Every
/// request of the policy costs `cost` on each.
pub(crate) fn shadow_limits(
    policy: &str,
    algorithm: Algorithm,
    cost: u64,
    quotas: &[Quota],
    label: fn(Duration) -> String,
    taken: &[&str],
) -> Result<Box<[Limit]>, BuildError> {
    let invalid = |why: String| BuildError::Invalid(format!("policy {policy:?}: {why}"));
    if quotas.is_empty() {
        return Ok(Box::new([]));
    }
    if algorithm == Algorithm::Concurrency {
        return Err(invalid(
            "a shadow limit needs a rate: algorithm \"concurrency\" counts requests in flight, \
             and a shadow slot would never be given back"
                .into(),
        ));
    }
    if quotas.len() > MAX_STACKED_QUOTAS {
        return Err(invalid(format!(
            "{} shadow quotas; at most {MAX_STACKED_QUOTAS} are allowed",
            quotas.len()
        )));
    }
    let mut limits: Vec<Limit> = Vec::with_capacity(quotas.len());
    for quota in quotas {
        let name = format!("{policy}.shadow.{}", label(quota.period()));
        if taken.contains(&name.as_str()) || limits.iter().any(|l| l.name() == name) {
            return Err(invalid(format!(
                "the shadow limit {name:?} is named twice; shadow quotas need different periods, \
                 and no tier may be called \"shadow\""
            )));
        }
        let limit = Limit::with_algorithm(name, algorithm, *quota)?;
        if cost > limit.max_cost() {
            return Err(BuildError::Cost {
                policy: policy.to_owned(),
                cost,
                limit: limit.max_cost(),
            });
        }
        limits.push(limit);
    }
    Ok(limits.into())
}

/// Why a refusal was only counted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Unenforced {
    /// A shadow limit's.
    Shadow,
    /// A staged policy's, for a key outside its share.
    Staged,
}

/// Reports one policy's refusals that were only counted: a count per limit, and a line at info at
/// most once a second per policy (with how many were left out), the rest at debug.
#[derive(Default)]
pub(crate) struct WouldLimit {
    log: OncePerSecond,
    #[cfg(feature = "metrics")]
    counters: crate::observe::LimitCounters,
}

impl WouldLimit {
    pub(crate) fn record(&self, policy: &str, limit: &str, key: ShownKey<'_>, why: Unenforced) {
        #[cfg(feature = "metrics")]
        self.counters
            .increment("throttle_requests_would_limit_total", policy, limit);
        let message = match why {
            Unenforced::Shadow => "request would be limited (shadow limit)",
            Unenforced::Staged => "request would be limited (not enforced for this key yet)",
        };
        sampled!(self.log, info, (policy = %policy, limit = %limit, key = %key,), "{message}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentages_parse_and_out_of_range_shares_are_errors() {
        assert_eq!(parse_percent("10%"), Ok(0.10));
        assert_eq!(parse_percent(" 2.5 % "), Ok(0.025));
        assert_eq!(parse_percent("100%"), Ok(1.0));
        assert_eq!(parse_percent("0%"), Ok(0.0));
        for bad in ["110%", "-1%", "10", "ten%", "NaN%", "%"] {
            let err = parse_percent(bad).unwrap_err();
            assert!(err.contains("is not a percentage"), "{bad}: {err}");
        }
        for bad in [1.1, -0.01, f64::NAN] {
            let err = Staged::of("api", bad).unwrap_err().to_string();
            assert!(err.starts_with("policy \"api\": enforce must be"), "{err}");
        }
        assert_eq!(Staged::of("api", 1.0).unwrap(), None);
    }

    /// Shadow quotas stop at the stack bound, [`MAX_STACKED_QUOTAS`]: that many build, one more
    /// is refused; a shadow limit takes the cost it can hold, and no more.
    #[test]
    fn shadow_quotas_are_bounded_like_a_stack_and_by_the_cost() {
        let label = |d: Duration| format!("{}s", d.as_secs());
        let quotas = |n: u64| -> Vec<Quota> {
            (1..=n)
                .map(|i| Quota::cl_throttle(1, 10, Duration::from_secs(i)))
                .collect()
        };
        let most = MAX_STACKED_QUOTAS as u64;
        let built = shadow_limits("api", Algorithm::Gcra, 1, &quotas(most), label, &[]).unwrap();
        assert_eq!(built.len(), MAX_STACKED_QUOTAS);
        let err = shadow_limits("api", Algorithm::Gcra, 1, &quotas(most + 1), label, &[])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains(&format!("{} shadow quotas", most + 1)),
            "{err}"
        );

        // A shadow limit of 10 a second with bursts of 2 holds a cost of at most 2 (max_burst + 1).
        let quota = [Quota::cl_throttle(1, 10, Duration::from_secs(1))];
        let max = Limit::with_algorithm("x", Algorithm::Gcra, quota[0])
            .unwrap()
            .max_cost();
        assert!(shadow_limits("api", Algorithm::Gcra, max, &quota, label, &[]).is_ok());
        let err = shadow_limits("api", Algorithm::Gcra, max + 1, &quota, label, &[]).unwrap_err();
        assert!(
            matches!(err, BuildError::Cost { cost, limit, .. } if cost == max + 1 && limit == max)
        );
    }

    #[test]
    fn the_share_is_stable_monotone_and_close_to_its_size() {
        let keys: Vec<Key> = (0..10_000)
            .map(|i| Key::from(format!("user-{i}")))
            .collect();
        let ten = Staged::of("api", 0.10).unwrap().unwrap();
        let twenty = Staged::of("api", 0.20).unwrap().unwrap();
        let none = Staged::of("api", 0.0).unwrap().unwrap();
        let in_ten = keys.iter().filter(|k| ten.enforces(k)).count();
        assert!((900..=1100).contains(&in_ten), "{in_ten} of 10000");
        assert!(keys.iter().all(|k| !ten.enforces(k) || twenty.enforces(k)));
        assert!(keys.iter().all(|k| !none.enforces(k)));
        assert!((ten.fraction() - 0.10).abs() < 1e-12);
        // Fixed seed: these hashes are the same in every process and release (a change here moves
        // clients between behaviours, so it must be deliberate).
        // (Checked against an independent FNV-1a + fmix64 in Python.)
        assert_eq!(Key::from("alice").stable_hash(), 0x3507_d047_a67c_08f4);
    }
}
