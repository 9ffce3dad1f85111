//! Leased budgets for hot keys: the settings ([`Budget`]). The Redis backend does the work
//! (`src/backend/redis/budget.rs`).

use std::time::Duration;

use crate::error::BuildError;

/// Leased budgets for hot keys, on the Redis backend ([`Limit::with_budget`](crate::Limit::with_budget),
/// [`PolicyBuilder::budget`](crate::PolicyBuilder::budget), `budget = true` on a route).
///
/// A key that a process decides at least [`hot_after`](Self::hot_after) times within one
/// [`lease`](Self::lease) is *hot*: instead of one Redis call per request, the process takes a
/// slice of the key's budget in one atomic call (the GCRA consumes the units exactly as that many
/// requests would, and says how many it granted) and admits from it locally until it runs out.
/// Cold keys go to Redis per request as before.
///
/// - **Exact in count**: a process never admits more than Redis granted it, so the processes
///   together never admit more than the limit allows on Redis's timeline (when the units were
///   granted). Admissions themselves may come up to a lease later than the grant: over a window of
///   length `w`, at most the limit's burst plus its rate × (`w` + `lease`) pass, not rate × `w`.
///   Keep the lease short where bursts matter.
/// - **Bounded loss**: units granted but unused expire a `lease` after the key's latest grant and
///   are lost (they count as used in Redis). A process loses at most one slice per key per lease,
///   and a slice is at most [`max_slice`](Self::max_slice) units and at most the limit.
/// - **Adaptive**: a slice asks for about the requests the process saw on the key in the last
///   lease, so it lasts about one lease at a steady rate; Redis grants fewer when fewer are left.
/// - **Headers**: under a slice, `remaining` is the slice's unused units plus what Redis reported
///   remaining when it granted its latest units, at most the limit: never more than Redis would
///   have reported then without the slice. `reset` is the reset Redis reported then, less the time
///   since.
/// - **Refilled ahead**: when a quarter of the latest grant is left, the next slice is fetched in
///   the background while the rest is admitted, so a hot key's requests rarely wait for Redis.
///
/// Only the GCRA without a penalty box or delay, alone (not in a stack), can lease; the others are
/// refused when the limit is built. On the memory backend decisions are local already, and a budget
/// changes nothing.
///
/// ```
/// use std::time::Duration;
/// use tower_throttle::{Budget, Limit, Policy, Quota};
///
/// let budget = Budget::new()
///     .lease(Duration::from_millis(200))
///     .max_slice(500)
///     .hot_after(16);
/// let policy = Policy::builder("api")
///     .quota(Quota::per_second(10_000))
///     .budget(budget)
///     .build()
///     .unwrap();
/// assert_eq!(policy.limits()[0].budget(), Some(&budget));
///
/// // Only a lone GCRA limit without a penalty or delay can lease.
/// assert!(Policy::builder("two")
///     .quotas([Quota::per_second(10), Quota::per_day(1000)])
///     .budget(Budget::new())
///     .build()
///     .is_err());
/// assert!(Budget::new().lease(Duration::ZERO).validate().is_err());
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Budget {
    lease: Duration,
    max_slice: u64,
    hot_after: u32,
}

impl Default for Budget {
    fn default() -> Self {
        Budget::new()
    }
}

impl Budget {
    /// The default lease: 250 ms.
    pub const DEFAULT_LEASE: Duration = Duration::from_millis(250);
    /// The default largest slice: 1,000 units.
    pub const DEFAULT_MAX_SLICE: u64 = 1000;
    /// The default decisions within a lease that make a key hot: 8.
    pub const DEFAULT_HOT_AFTER: u32 = 8;
    /// The longest lease: 60 s.
    pub const MAX_LEASE: Duration = Duration::from_secs(60);

    /// The defaults: a 250 ms lease, slices of at most 1,000 units, hot after 8 decisions.
    pub const fn new() -> Self {
        Budget {
            lease: Self::DEFAULT_LEASE,
            max_slice: Self::DEFAULT_MAX_SLICE,
            hot_after: Self::DEFAULT_HOT_AFTER,
        }
    }

    /// How long a slice's unused units live (more than 0, at most [`MAX_LEASE`](Self::MAX_LEASE)),
    /// and the window in which hotness and the local rate are counted. Shorter loses less when a
    /// key cools down; longer calls Redis less often.
    pub const fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// The most units one slice asks for (at least 1); the limit (`max_burst + 1`) bounds it too.
    pub const fn max_slice(mut self, max_slice: u64) -> Self {
        self.max_slice = max_slice;
        self
    }

    /// Decisions on one key within one lease that make it hot (at least 1).
    pub const fn hot_after(mut self, hot_after: u32) -> Self {
        self.hot_after = hot_after;
        self
    }

    /// The lease.
    pub const fn lease_length(&self) -> Duration {
        self.lease
    }

    /// The largest slice.
    pub const fn max_slice_units(&self) -> u64 {
        self.max_slice
    }

    /// The decisions that make a key hot.
    pub const fn hot_threshold(&self) -> u32 {
        self.hot_after
    }

    /// Checks the settings: a lease of more than 0 and at most 60 s, a slice and a threshold of at
    /// least 1.
    pub fn validate(&self) -> Result<(), BuildError> {
        if self.lease.is_zero() || self.lease > Self::MAX_LEASE {
            return Err(BuildError::Invalid(format!(
                "budget lease must be more than 0 and at most 60s, not {:?}",
                self.lease
            )));
        }
        if self.max_slice == 0 {
            return Err(BuildError::Invalid(
                "budget max_slice must be at least 1".into(),
            ));
        }
        if self.hot_after == 0 {
            return Err(BuildError::Invalid(
                "budget hot_after must be at least 1".into(),
            ));
        }
        Ok(())
    }
}
