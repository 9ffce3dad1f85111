//! [`Overload`]: the options of a layer's overload protection, validated when the layer is built.

use std::time::Duration;

use http::StatusCode;

use super::limit::{LimitAlgorithm, LimitSettings};
use crate::error::BuildError;

/// The most partitions a layer's limit is shared by.
pub const MAX_PARTITIONS: usize = 4;
/// The highest limit on requests in flight (each partition's count has 16 bits).
pub const MAX_LIMIT: u32 = u16::MAX as u32;

/// Protection from overload for a whole layer: an adaptive limit on the requests in flight
/// (from admission to the end of the response body), shared by partitions with guaranteed shares,
/// and the answer to a request it sheds.
///
/// ```
/// use tower_throttle::overload::{Overload, PartitionBy};
/// use tower_throttle::{key::PeerIp, Policy, Quota, ThrottleLayer};
///
/// let overload = Overload::gradient()
///     .limits(4, 2_000)
///     .partition_by(PartitionBy::Tier)
///     .partition("paid", 0.8)
///     .partition("free", 0.2);
/// let api = Policy::builder("api")
///     .key(PeerIp::new())
///     .quota(Quota::per_second(50))
///     .tier_header("x-plan")
///     .tier("paid", [Quota::per_second(500)])
///     .build()
///     .unwrap();
/// let layer = ThrottleLayer::builder()
///     .policy(api)
///     .overload(overload)
///     .build()
///     .unwrap();
/// # let _ = layer;
/// assert!(Overload::aimd().limits(10, 5).validate().is_err()); // min above max
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct Overload {
    pub(crate) algorithm: LimitAlgorithm,
    pub(crate) min: u32,
    pub(crate) max: u32,
    pub(crate) initial: Option<u32>,
    pub(crate) partitions: Vec<(String, f64)>,
    pub(crate) partition_by: PartitionBy,
    pub(crate) status: StatusCode,
}

/// What names the partition a request is counted in.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum PartitionBy {
    /// The name of the policy that matched it (a request no policy matched: the last partition).
    #[default]
    Policy,
    /// The name of its policy's tier (a policy without tiers: `default`).
    Tier,
}

impl Overload {
    /// The latency-gradient algorithm (the default): the limit follows the ratio of the
    /// unloaded latency to the latency now.
    pub fn gradient() -> Self {
        Overload::with(LimitAlgorithm::Gradient)
    }

    /// Additive increase, multiplicative decrease.
    pub fn aimd() -> Self {
        Overload::with(LimitAlgorithm::Aimd)
    }

    fn with(algorithm: LimitAlgorithm) -> Self {
        Overload {
            algorithm,
            min: 4,
            max: 1_000,
            initial: None,
            partitions: Vec::new(),
            partition_by: PartitionBy::Policy,
            status: StatusCode::SERVICE_UNAVAILABLE,
        }
    }

    /// The limit's bounds (default 4 and 1,000): it never goes below `min` nor above `max`.
    pub fn limits(mut self, min: u32, max: u32) -> Self {
        self.min = min;
        self.max = max;
        self
    }

    /// The limit at start (default: `min`'s tenfold, within the bounds).
    pub fn initial_limit(mut self, initial: u32) -> Self {
        self.initial = Some(initial);
        self
    }

    /// A partition with a guaranteed `share` of the limit (0 to 1). Partitions borrow what
    /// others leave idle; under pressure, a partition beyond its share is refused first.
    pub fn partition(mut self, name: impl Into<String>, share: f64) -> Self {
        self.partitions.push((name.into(), share));
        self
    }

    /// What names a request's partition (default: its policy's name).
    pub fn partition_by(mut self, by: PartitionBy) -> Self {
        self.partition_by = by;
        self
    }

    /// The status of a shed request: `503 Service Unavailable` (default) or `429 Too Many
    /// Requests`.
    pub fn status(mut self, status: StatusCode) -> Self {
        self.status = status;
        self
    }

    pub(crate) fn initial(&self) -> u32 {
        self.initial
            .unwrap_or(self.min.saturating_mul(10))
            .clamp(self.min, self.max.max(self.min))
    }

    pub(crate) fn settings(&self) -> LimitSettings {
        LimitSettings {
            algorithm: self.algorithm,
            min: self.min,
            max: self.max,
            initial: self.initial(),
        }
    }

    /// Checks the options: the error a layer with them fails to build with.
    pub fn validate(&self) -> Result<(), BuildError> {
        let invalid = |why: String| Err(BuildError::Invalid(format!("overload: {why}")));
        if self.min == 0 || self.min > self.max || self.max > MAX_LIMIT {
            return invalid(format!(
                "the limit's bounds must satisfy 1 <= min <= max <= {MAX_LIMIT}; got min {} and \
                 max {}",
                self.min, self.max
            ));
        }
        if let Some(initial) = self.initial
            && !(self.min..=self.max).contains(&initial)
        {
            return invalid(format!(
                "initial_limit {initial} is outside the bounds {}..={}",
                self.min, self.max
            ));
        }
        if !matches!(self.status.as_u16(), 429 | 503) {
            return invalid(format!("status must be 429 or 503, not {}", self.status));
        }
        if self.partitions.len() > MAX_PARTITIONS {
            return invalid(format!(
                "{} partitions; at most {MAX_PARTITIONS}",
                self.partitions.len()
            ));
        }
        let mut total = 0.0;
        for (i, (name, share)) in self.partitions.iter().enumerate() {
            if name.is_empty() || self.partitions[..i].iter().any(|(n, _)| n == name) {
                return invalid(format!(
                    "partition names must be unique and not empty: '{name}'"
                ));
            }
            if !(share.is_finite() && *share > 0.0 && *share <= 1.0) {
                return invalid(format!(
                    "partition '{name}' has share {share}; a share is above 0 and at most 1"
                ));
            }
            total += share;
        }
        if total > 1.0 + 1e-9 {
            return invalid(format!("the partitions' shares add up to {total}, above 1"));
        }
        Ok(())
    }
}

/// How long a shed request is told to wait: the time the requests in flight take to drain, at
/// least a second (`Retry-After` counts whole seconds).
pub(crate) fn drain_time(latency: Duration, in_flight: u32, limit: u32) -> Duration {
    let drain = latency.mul_f64(f64::from(in_flight) / f64::from(limit.max(1)));
    drain.max(Duration::from_secs(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shed_request_waits_for_the_requests_in_flight_to_drain_a_second_at_least() {
        let secs = Duration::from_secs;
        assert_eq!(drain_time(secs(3), 10, 10), secs(3));
        assert_eq!(drain_time(secs(4), 5, 10), secs(2));
        assert_eq!(drain_time(Duration::from_millis(100), 10, 10), secs(1));
        assert_eq!(drain_time(secs(2), 4, 0), secs(8)); // no limit yet: as of a limit of 1
    }
}
