//! [`Decision`]: the answer of a backend, with the meaning of `CL.THROTTLE`'s reply.

use std::cmp::Reverse;
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
    ///
    /// Its limit and remaining are the binding decision's: of a refusal, the refusing limit's that
    /// waits longest; of an admission, the one with the fewest remaining.
    pub fn combine(decisions: &[Decision]) -> Option<Decision> {
        let mut out = *Self::binding(decisions)?;
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

    /// The decision that binds among `decisions`, one per limit of a stack: of a refusal, the
    /// refusing limit whose wait is longest (never passing first), the fewest remaining of equals;
    /// of an admission, the fewest remaining, the latest reset of equals. (An admitting limit's
    /// remaining is in its own units: a request refused for tokens is no request short of its
    /// requests limit, however few that has left.)
    pub(crate) fn binding<'d, I>(decisions: I) -> Option<&'d Decision>
    where
        I: IntoIterator<Item = &'d Decision>,
        I::IntoIter: Clone,
    {
        let decisions = decisions.into_iter();
        let waits = |d: &&Decision| (d.retry_after.is_none(), d.retry_after, Reverse(d.remaining));
        match decisions.clone().filter(|d| !d.allowed).max_by_key(waits) {
            Some(refusing) => Some(refusing),
            None => decisions.min_by_key(|d| (d.remaining, Reverse(d.reset_after))),
        }
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
    fn a_refusal_shows_the_limit_that_refused_and_waits_longest() {
        let ms = Duration::from_millis;
        // A metered stack: the tokens refuse; the requests limit, with more left in its own
        // units' count, admitted.
        let requests = Decision::allowed(60, 59, ms(1_000));
        let tokens = Decision::limited(100_000, 300, Some(ms(12_000)), ms(60_000));
        let c = Decision::combine(&[requests, tokens]).unwrap();
        assert_eq!(
            (c.limit, c.remaining, c.retry_after),
            (100_000, 300, Some(ms(12_000)))
        );
        // Both refuse at 0: the one that waits longest, not the first.
        let second = Decision::limited(2, 0, Some(ms(400)), ms(900));
        let minute = Decision::limited(3, 0, Some(ms(19_400)), ms(59_400));
        assert_eq!(Decision::combine(&[second, minute]).unwrap().limit, 3);
        let never = Decision::limited(5, 5, None, ms(0));
        assert_eq!(Decision::binding(&[minute, never]), Some(&never));
        // Both admit with none left: the one whose next admission is later.
        let second = Decision::allowed(2, 0, ms(900));
        let minute = Decision::allowed(3, 0, ms(59_400));
        assert_eq!(Decision::combine(&[second, minute]).unwrap().limit, 3);
    }

    #[test]
    fn a_ban_refuses_for_its_rest_or_the_limits_own_retry_if_later() {
        let s = Duration::from_secs;
        let ban = Decision::banned(10, s(60), Some(s(5)), s(8));
        assert!(ban.banned && !ban.allowed);
        assert_eq!(
            (ban.retry_after, ban.reset_after, ban.remaining),
            (Some(s(60)), s(60), 0)
        );
        let later = Decision::banned(10, s(60), Some(s(90)), s(8));
        assert_eq!(later.retry_after, Some(s(90)));
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
