//! [`Decision`]: the answer of a backend, with the meaning of `CL.THROTTLE`'s reply.

use std::time::Duration;

/// Whether a request is admitted, and the state of its key afterwards.
///
/// The fields mean what the five values of `CL.THROTTLE`'s reply mean, with exact durations instead
/// of whole seconds, and `retry_after` an `Option` (`None` where `CL.THROTTLE` says -1):
///
/// | `CL.THROTTLE` | here |
/// |---|---|
/// | `limited` (0/1) | [`allowed`](Self::allowed) (`!limited`) |
/// | `limit` | [`limit`](Self::limit): `max_burst + 1` |
/// | `remaining` | [`remaining`](Self::remaining): requests the key could make right now |
/// | `retry_after` (-1 if allowed) | [`retry_after`](Self::retry_after): `None` if allowed, or if the request can never pass |
/// | `reset_after` | [`reset_after`](Self::reset_after): until the key is back to its full limit |
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Decision {
    /// The request is admitted.
    pub allowed: bool,
    /// The most requests the key can make at once (`max_burst + 1`).
    pub limit: u64,
    /// How many more requests (of cost 1) the key could make right now.
    pub remaining: u64,
    /// When the same request would be admitted. `None` when it was admitted, and when it costs more
    /// than the whole limit, so that it can never be admitted.
    pub retry_after: Option<Duration>,
    /// How long until the key is back to its full limit.
    pub reset_after: Duration,
    /// The key is banned by a [`Penalty`](crate::policy::Penalty): `retry_after` is the end of the
    /// ban.
    pub banned: bool,
    /// For an admitted request under a [concurrency](crate::Algorithm::Concurrency) limit, the
    /// token its slot is given back with ([`Adjustment::Release`](crate::backend::Adjustment));
    /// `None` otherwise, and for backends that need no token.
    pub lease: Option<u64>,
}

impl Decision {
    /// An admitted request.
    pub const fn allowed(limit: u64, remaining: u64, reset_after: Duration) -> Self {
        Decision {
            allowed: true,
            limit,
            remaining,
            retry_after: None,
            reset_after,
            banned: false,
            lease: None,
        }
    }

    /// A rejected request.
    pub const fn limited(
        limit: u64,
        remaining: u64,
        retry_after: Option<Duration>,
        reset_after: Duration,
    ) -> Self {
        Decision {
            allowed: false,
            retry_after,
            ..Decision::allowed(limit, remaining, reset_after)
        }
    }

    /// A request of a key banned for `rest` (or longer, if the limit's own retry time is later).
    pub fn banned(
        limit: u64,
        rest: Duration,
        retry_after: Option<Duration>,
        reset_after: Duration,
    ) -> Self {
        let retry = retry_after.map_or(rest, |r| r.max(rest));
        Decision {
            banned: true,
            ..Decision::limited(limit, 0, Some(retry), reset_after.max(retry))
        }
    }

    /// The same decision with a lease token.
    #[must_use]
    pub const fn with_lease(mut self, lease: u64) -> Self {
        self.lease = Some(lease);
        self
    }

    /// Several decisions taken together (a [stack of quotas](crate::PolicyBuilder::quotas)), as
    /// one: admitted when every one admits; otherwise the rejecting decision that waits longest
    /// (never, if one can never pass) and the fewest remaining. `None` for no decisions.
    pub fn combine(decisions: &[Decision]) -> Option<Decision> {
        let tightest = decisions.iter().min_by_key(|d| d.remaining)?;
        let mut out = *tightest;
        out.allowed = decisions.iter().all(|d| d.allowed);
        out.reset_after = decisions.iter().map(|d| d.reset_after).max()?;
        out.banned = decisions.iter().any(|d| d.banned);
        out.lease = decisions.iter().find_map(|d| d.lease);
        out.retry_after = if out.allowed {
            None
        } else {
            // Rejected until every rejecting limit admits it; never, if one never will.
            decisions
                .iter()
                .filter(|d| !d.allowed)
                .map(|d| d.retry_after)
                .try_fold(Duration::ZERO, |wait, retry| retry.map(|r| wait.max(r)))
        };
        Some(out)
    }

    /// `retry_after` in whole seconds for a `Retry-After` header: rounded **up**, and at least 1,
    /// so that a client is never told to retry at once. A request that can never pass gets
    /// `reset_after`.
    pub fn retry_after_secs(&self) -> u64 {
        ceil_secs(self.retry_after.unwrap_or(self.reset_after)).max(1)
    }

    /// `reset_after` rounded up to whole seconds.
    pub fn reset_after_secs(&self) -> u64 {
        ceil_secs(self.reset_after)
    }
}

pub(crate) fn ceil_secs(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn combined_decisions_wait_for_every_rejection() {
        let s = Duration::from_secs;
        let ok = Decision::allowed(10, 4, s(1));
        let day = Decision::allowed(1000, 2, s(80_000));
        let both = Decision::combine(&[ok, day]).unwrap();
        assert!(both.allowed);
        assert_eq!(
            (both.limit, both.remaining, both.reset_after),
            (1000, 2, s(80_000))
        );
        let no = Decision::limited(10, 0, Some(s(3)), s(5));
        let later = Decision::limited(1000, 0, Some(s(40)), s(90_000));
        let c = Decision::combine(&[no, ok, later]).unwrap();
        assert!(!c.allowed);
        assert_eq!(c.retry_after, Some(s(40)));
        assert_eq!(c.reset_after, s(90_000));
        let never = Decision::limited(10, 10, None, s(0));
        assert_eq!(Decision::combine(&[no, never]).unwrap().retry_after, None);
        assert_eq!(Decision::combine(&[]), None);
    }

    #[test]
    fn retry_after_rounds_up_and_is_never_zero() {
        let d = |ms| Decision::limited(5, 0, Some(Duration::from_millis(ms)), Duration::ZERO);
        assert_eq!(d(0).retry_after_secs(), 1);
        assert_eq!(d(1).retry_after_secs(), 1);
        assert_eq!(d(999).retry_after_secs(), 1);
        assert_eq!(d(1000).retry_after_secs(), 1);
        assert_eq!(d(1001).retry_after_secs(), 2);
        let never = Decision::limited(5, 5, None, Duration::from_millis(2500));
        assert_eq!(never.retry_after_secs(), 3);
    }
}
