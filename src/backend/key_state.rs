//! [`KeyState`]: what a key's state is under one limit, read without consuming anything
//! ([`Backend::peek`](crate::Backend::peek)).

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use crate::decision::Decision;
use crate::error::BackendError;

/// The future of [`Backend::peek`](crate::Backend::peek): one state per limit, in order.
pub type PeekFuture = Pin<Box<dyn Future<Output = Result<Vec<KeyState>, BackendError>> + Send>>;

/// The future of [`Backend::reset`](crate::Backend::reset).
pub type ResetFuture = Pin<Box<dyn Future<Output = Result<(), BackendError>> + Send>>;

/// A key's state under one limit, as a peek sees it: nothing consumed, nothing written.
///
/// The numbers mean what a [`Decision`]'s do: `limit` and `remaining` are in units of cost 1,
/// `reset_after` is how long until the key is back to its full limit, and `retry_after` is when a
/// request of cost 1 would be admitted, `None` if it would be admitted now.
///
/// ```
/// use std::time::Duration;
/// use tower_throttle::backend::KeyState;
///
/// let state = KeyState::new(10, 0, Duration::from_secs(6))
///     .with_retry_after(Some(Duration::from_millis(600)));
/// assert!(state.is_limited());
/// assert_eq!(state.retry_after, Some(Duration::from_millis(600)));
/// assert_eq!(state.banned, None);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct KeyState {
    /// The most requests the key can make at once (for the GCRA `max_burst + 1`; for the other
    /// algorithms the quota's count, or the most in flight).
    pub limit: u64,
    /// How many more requests of cost 1 the key could make right now.
    pub remaining: u64,
    /// How long until the key is back to its full limit (zero for a key with no state).
    pub reset_after: Duration,
    /// When a request of cost 1 would be admitted: `None` if it would be admitted now (or, when
    /// banned, the end of the ban or the limit's own retry time, whichever is later).
    pub retry_after: Option<Duration>,
    /// The rest of the key's [`Penalty`](crate::policy::Penalty) ban, if it is banned.
    pub banned: Option<Duration>,
}

impl KeyState {
    /// A state with `remaining` of `limit` left and back to full after `reset_after`; not limited,
    /// not banned.
    pub const fn new(limit: u64, remaining: u64, reset_after: Duration) -> Self {
        KeyState {
            limit,
            remaining,
            reset_after,
            retry_after: None,
            banned: None,
        }
    }

    /// The same state, with when a request of cost 1 would be admitted.
    #[must_use]
    pub const fn with_retry_after(mut self, retry_after: Option<Duration>) -> Self {
        self.retry_after = retry_after;
        self
    }

    /// The same state, banned for `rest`: nothing remains, and a request waits at least `rest`.
    #[must_use]
    pub fn with_ban(mut self, rest: Duration) -> Self {
        self.banned = Some(rest);
        self.remaining = 0;
        self.retry_after = Some(self.retry_after.map_or(rest, |r| r.max(rest)));
        self.reset_after = self.reset_after.max(rest);
        self
    }

    /// A request of cost 1 would be refused now (limited or banned).
    pub fn is_limited(&self) -> bool {
        self.retry_after.is_some() || self.banned.is_some()
    }

    /// The state from two decisions taken on the same stored state without recording anything: one
    /// for a quantity of 0 (how things stand) and one for a quantity of 1 (whether one more request
    /// would pass, and when). For backends that decide by a pure function, as the built-in ones do.
    pub fn from_decisions(now: &Decision, next: &Decision) -> Self {
        let retry_after = if next.allowed {
            None
        } else {
            // Never admitted (a limit below one unit cannot exist): report the reset time.
            Some(next.retry_after.unwrap_or(now.reset_after))
        };
        let state =
            KeyState::new(now.limit, now.remaining, now.reset_after).with_retry_after(retry_after);
        if now.banned {
            state.with_ban(now.retry_after.unwrap_or(now.reset_after))
        } else {
            state
        }
    }
}
