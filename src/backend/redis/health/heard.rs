//! [`Heard`]: whether a Cluster call that ran out of time had heard `TRYAGAIN` meanwhile.
//!
//! Why: a command on several keys whose slot migrates, its keys split between the two nodes, is
//! answered `TRYAGAIN` until the slot has moved, and redirect.rs retries it until the backend's
//! timeout ends the call. The call then looks like one to a dead node, and opened the node's
//! breaker: every key of the node failed fast. But the node answered every try. `guarded`
//! (breaker.rs) listens on the call with a `Heard`, redirect.rs marks the one in scope at each
//! `TRYAGAIN`, and a timeout after one counts as an answer, not as a node that is gone. A check
//! coalesced into a batch (batch.rs) is sent by the batch's task: the batch listens for all of its
//! checks and passes a `TRYAGAIN` on to each.
//!
//! Only `TRYAGAIN`: `ASK` comes from a live node too, but is followed at once; `MOVED` may come
//! from a dead primary's replica, which says nothing of the primary.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

tokio::task_local! {
    static LISTENING: Arc<Heard>;
}

/// Set when the call it listens on met `TRYAGAIN`; passed on to the checks of a batch.
#[derive(Default)]
pub(crate) struct Heard {
    tried_again: AtomicBool,
    /// The checks of a batch, each listening on its own.
    also: Vec<Arc<Heard>>,
}

impl Heard {
    /// Whether the call met `TRYAGAIN`.
    pub(crate) fn tried_again(&self) -> bool {
        self.tried_again.load(Ordering::Relaxed)
    }

    fn mark(&self) {
        self.tried_again.store(true, Ordering::Relaxed);
        for heard in &self.also {
            heard.mark();
        }
    }
}

/// Runs `call` listening with `heard` (none: as it is).
pub(crate) async fn listening<T>(heard: Option<Arc<Heard>>, call: impl Future<Output = T>) -> T {
    match heard {
        Some(heard) => LISTENING.scope(heard, call).await,
        None => call.await,
    }
}

/// The `Heard` of the call under way, if it listens: a check that waits for a batch.
pub(crate) fn current() -> Option<Arc<Heard>> {
    LISTENING.try_with(Arc::clone).ok()
}

/// A `Heard` for a batch that passes `TRYAGAIN` on to each of `checks`; none if none listens.
pub(crate) fn for_batch(checks: impl Iterator<Item = Arc<Heard>>) -> Option<Arc<Heard>> {
    let also: Vec<Arc<Heard>> = checks.collect();
    (!also.is_empty()).then(|| {
        Arc::new(Heard {
            tried_again: AtomicBool::new(false),
            also,
        })
    })
}

/// Redis answered `TRYAGAIN`: the call under way has heard from the node.
pub(crate) fn tried_again() {
    let _ = LISTENING.try_with(|heard| heard.mark());
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use redis::RedisError;

    use super::*;
    use crate::backend::redis::health::breaker::{guarded, Breaker};
    use crate::backend::redis::wire::mode::RedisMode;

    /// A Cluster's breaker (no slot map: the calls below pick no node's breaker).
    fn cluster_breaker() -> Arc<Breaker> {
        Arc::new(Breaker::new(
            Duration::from_secs(1),
            false,
            None,
            RedisMode::Lua,
            "heard",
        ))
    }

    fn timed_out() -> RedisError {
        RedisError::from(std::io::Error::from(std::io::ErrorKind::TimedOut))
    }

    #[tokio::test]
    async fn a_batch_on_another_task_passes_tryagain_on_to_each_check() {
        let (a, b, quiet) = (
            Arc::new(Heard::default()),
            Arc::new(Heard::default()),
            Arc::new(Heard::default()),
        );
        let batch = for_batch([a.clone(), b.clone()].into_iter());
        tokio::spawn(listening(batch, async { tried_again() }))
            .await
            .unwrap();
        assert!(a.tried_again() && b.tried_again());
        assert!(!quiet.tried_again());
        assert!(for_batch(std::iter::empty()).is_none());
    }

    /// The batch's own timeout may end the call before the check's: its error (an I/O timeout)
    /// after `TRYAGAIN` is the migrating slot's, as the check's own timeout is.
    #[tokio::test(start_paused = true)]
    async fn a_timeout_after_tryagain_is_the_migrating_slots() {
        let breaker = cluster_breaker();
        let by_the_batch = guarded(&breaker, "k", Duration::from_secs(1), async {
            tried_again();
            Err::<(), _>(timed_out())
        })
        .await;
        assert!(
            by_the_batch.unwrap_err().to_string().contains("TRYAGAIN"),
            "the batch's timeout"
        );
        let by_the_check = guarded(&breaker, "k", Duration::from_secs(1), async {
            tried_again();
            std::future::pending::<Result<(), RedisError>>().await
        })
        .await;
        assert!(
            by_the_check.unwrap_err().to_string().contains("TRYAGAIN"),
            "the check's timeout"
        );
        // Without TRYAGAIN, a timeout is one.
        let silent = guarded(&breaker, "k", Duration::from_secs(1), async {
            Err::<(), _>(timed_out())
        })
        .await;
        assert!(!silent.unwrap_err().to_string().contains("TRYAGAIN"));
    }
}
