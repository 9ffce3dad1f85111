//! Sliced budgets for hot keys: the settings ([`Budget`]). The Redis backend does the work
//! (`src/backend/redis/speedup/budget.rs`).

use std::time::Duration;

use crate::error::BuildError;

/// Sliced budgets for hot keys, on the Redis backend ([`Limit::with_budget`](crate::Limit::with_budget),
/// [`PolicyBuilder::budget`](crate::PolicyBuilder::budget), `budget = true` on a route).
///
/// A key that a process decides at least [`hot_after`](Self::hot_after) times within one
/// [`slice_ttl`](Self::slice_ttl) is *hot*: instead of one Redis call per request, the process takes a
/// slice of the key's budget in one atomic call (the GCRA consumes the units exactly as that many
/// requests would, and says how many it granted) and admits from it locally until it runs out.
/// Cold keys go to Redis per request as before.
///
/// - **Exact in count**: a process never admits more than Redis granted it, so the processes
///   together never admit more than the limit allows on Redis's timeline (when the units were
///   granted). Admissions themselves may come up to a slice TTL later than the grant: over a window of
///   length `w`, at most the limit's burst plus its rate × (`w` + `slice_ttl`) pass, not rate × `w`.
///   Keep the slice TTL short where bursts matter.
/// - **Bounded loss**: units granted but unused expire a `slice_ttl` after the key's latest grant and
///   are lost (they count as used in Redis). A process loses at most one slice per key per slice TTL,
///   and a slice is at most [`max_slice`](Self::max_slice) units and at most the limit.
/// - **Adaptive**: a slice asks for about the requests the process saw on the key in the last
///   slice TTL, so it lasts about one slice TTL at a steady rate; Redis grants fewer when fewer are left.
/// - **Headers**: under a slice, `remaining` is the slice's unused units plus what Redis reported
///   remaining when it granted its latest units, at most the limit: never more than Redis would
///   have reported then without the slice. `reset` is the reset Redis reported then, less the time
///   since.
/// - **Refilled ahead**: when a quarter of the latest grant is left, the next slice is fetched in
///   the background while the rest is admitted, so a hot key's requests rarely wait for Redis.
///
/// Only the GCRA without a penalty box or delay, alone (not in a stack), can take a budget; the others are
/// refused when the limit is built. On the memory backend decisions are local already, and a budget
/// changes nothing.
///
/// ```
/// use std::time::Duration;
/// use tower_throttle::{key::PeerIp, policy::Budget, Limit, Policy, Quota};
///
/// let budget = Budget::new()
///     .slice_ttl(Duration::from_millis(200))
///     .max_slice(500)
///     .hot_after(16);
/// let policy = Policy::builder("api")
///     .key(PeerIp::new())
///     .quota(Quota::per_second(10_000))
///     .budget(budget)
///     .build()
///     .unwrap();
/// assert_eq!(policy.limits()[0].budget(), Some(&budget));
///
/// // Only a lone GCRA limit without a penalty or delay can take a budget.
/// assert!(Policy::builder("two")
///     .key(PeerIp::new())
///     .quotas([Quota::per_second(10), Quota::per_day(1000)])
///     .budget(Budget::new())
///     .build()
///     .is_err());
/// assert!(Budget::new().slice_ttl(Duration::ZERO).validate().is_err());
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Budget {
    slice_ttl: Duration,
    max_slice: u64,
    hot_after: u32,
}

impl Default for Budget {
    fn default() -> Self {
        Budget::new()
    }
}

impl Budget {
    /// The default slice lifetime: 250 ms.
    pub const DEFAULT_SLICE_TTL: Duration = Duration::from_millis(250);
    /// The default largest slice: 1,000 units.
    pub const DEFAULT_MAX_SLICE: u64 = 1000;
    /// The default decisions within a slice lifetime that make a key hot: 8.
    pub const DEFAULT_HOT_AFTER: u32 = 8;
    /// The longest slice lifetime: 60 s.
    pub const MAX_SLICE_TTL: Duration = Duration::from_secs(60);

    /// The defaults: slices that live 250 ms, slices of at most 1,000 units, hot after 8 decisions.
    pub const fn new() -> Self {
        Budget {
            slice_ttl: Self::DEFAULT_SLICE_TTL,
            max_slice: Self::DEFAULT_MAX_SLICE,
            hot_after: Self::DEFAULT_HOT_AFTER,
        }
    }

    /// How long a slice's unused units live (more than 0, at most [`MAX_SLICE_TTL`](Self::MAX_SLICE_TTL)),
    /// and the window in which hotness and the local rate are counted. Shorter loses less when a
    /// key cools down; longer calls Redis less often.
    pub const fn slice_ttl(mut self, ttl: Duration) -> Self {
        self.slice_ttl = ttl;
        self
    }

    /// The most units one slice asks for (at least 1); the limit (`max_burst + 1`) bounds it too.
    pub const fn max_slice(mut self, max_slice: u64) -> Self {
        self.max_slice = max_slice;
        self
    }

    /// Units asked for on one key within one slice lifetime (a request of cost 1 asks for one)
    /// that make it hot (at least 1).
    pub const fn hot_after(mut self, hot_after: u32) -> Self {
        self.hot_after = hot_after;
        self
    }

    /// How long a slice's unused units live.
    pub const fn slice_lifetime(&self) -> Duration {
        self.slice_ttl
    }

    /// The largest slice.
    pub const fn max_slice_units(&self) -> u64 {
        self.max_slice
    }

    /// The decisions that make a key hot.
    pub const fn hot_threshold(&self) -> u32 {
        self.hot_after
    }

    /// Checks the settings: a slice lifetime of more than 0 and at most 60 s, a slice and a threshold of at
    /// least 1.
    pub fn validate(&self) -> Result<(), BuildError> {
        if self.slice_ttl.is_zero() || self.slice_ttl > Self::MAX_SLICE_TTL {
            return Err(BuildError::Invalid(format!(
                "budget slice_ttl must be more than 0 and at most 60s, not {:?}",
                self.slice_ttl
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
