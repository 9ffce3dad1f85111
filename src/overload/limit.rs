//! [`AdaptiveLimit`]: a limit on requests in flight that follows the service's latency.
//!
//! (Skeleton: the algorithms land in the next commit.)

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

/// Which algorithm adapts the limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum LimitAlgorithm {
    /// Additive increase, multiplicative decrease: one more while requests succeed quickly, a
    /// fraction less when one fails or takes longer than a threshold.
    Aimd,
    /// Follows the gradient of latency against its unloaded baseline.
    #[default]
    Gradient,
}

/// What adapts the limit, validated by [`Overload`](super::Overload)'s build.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct LimitSettings {
    pub(crate) algorithm: LimitAlgorithm,
    pub(crate) min: u32,
    pub(crate) max: u32,
    pub(crate) initial: u32,
}

/// A limit on requests in flight, adapted to the latency of the requests that end.
#[derive(Debug)]
pub struct AdaptiveLimit {
    limit: AtomicU32,
    settings: LimitSettings,
}

impl AdaptiveLimit {
    pub(crate) fn new(settings: &LimitSettings) -> Self {
        AdaptiveLimit {
            limit: AtomicU32::new(settings.initial),
            settings: settings.clone(),
        }
    }

    /// The limit now.
    pub fn current(&self) -> u32 {
        self.limit.load(Ordering::Relaxed)
    }

    /// A request ended at `now_nanos` (the clock the gate was given) after `latency_nanos`;
    /// `dropped`: it failed or timed out; `in_flight`: requests in flight when it ended.
    /// `Some(limit)`: the limit was adapted (a sampling interval ended with this request).
    pub fn record(
        &self,
        now_nanos: u64,
        latency_nanos: u64,
        dropped: bool,
        in_flight: u32,
    ) -> Option<u32> {
        let _ = (now_nanos, latency_nanos, dropped, in_flight, &self.settings);
        None
    }

    /// The recent latency of a request, for a refusal's `Retry-After`.
    pub fn latency(&self) -> Duration {
        Duration::ZERO
    }
}
