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
pub(super) struct Heard {
    tried_again: AtomicBool,
    /// The checks of a batch, each listening on its own.
    also: Vec<Arc<Heard>>,
}

impl Heard {
    /// Whether the call met `TRYAGAIN`.
    pub(super) fn tried_again(&self) -> bool {
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
pub(super) async fn listening<T>(heard: Option<Arc<Heard>>, call: impl Future<Output = T>) -> T {
    match heard {
        Some(heard) => LISTENING.scope(heard, call).await,
        None => call.await,
    }
}

/// The `Heard` of the call under way, if it listens: a check that waits for a batch.
pub(super) fn current() -> Option<Arc<Heard>> {
    LISTENING.try_with(Arc::clone).ok()
}

/// A `Heard` for a batch that passes `TRYAGAIN` on to each of `checks`; none if none listens.
pub(super) fn for_batch(checks: impl Iterator<Item = Arc<Heard>>) -> Option<Arc<Heard>> {
    let also: Vec<Arc<Heard>> = checks.collect();
    (!also.is_empty()).then(|| {
        Arc::new(Heard {
            tried_again: AtomicBool::new(false),
            also,
        })
    })
}

/// Redis answered `TRYAGAIN`: the call under way has heard from the node.
pub(super) fn tried_again() {
    let _ = LISTENING.try_with(|heard| heard.mark());
}
