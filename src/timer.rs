//! Timers without a panic: whether tokio's timer can be made here, and a future awaited within a
//! timeout when it can (an async key, a quota resolver). Below every module that waits.

use std::future::Future;
use std::time::Duration;

/// Whether a tokio timer can be made here: a runtime with its time driver. Delay mode sleeps on one,
/// and without it `tokio::time::sleep` panics, so this tries (only for delayed requests; a timer that
/// is never polled costs next to nothing).
pub(crate) fn timers_available() -> bool {
    tokio::runtime::Handle::try_current().is_ok()
        && std::panic::catch_unwind(|| drop(tokio::time::sleep(Duration::ZERO))).is_ok()
}

/// Spawns `task` on the tokio runtime running here; outside one, drops it (nothing could run it).
#[cfg(feature = "redis")]
pub(crate) fn spawn<F>(task: F) -> Option<tokio::task::JoinHandle<()>>
where
    F: Future<Output = ()> + Send + 'static,
{
    Some(tokio::runtime::Handle::try_current().ok()?.spawn(task))
}

/// `future`'s output, or `None` if it takes longer than `timeout` (with no timer to measure it,
/// outside a tokio runtime with time enabled, it is awaited as it is).
pub(crate) async fn within<F: Future>(timeout: Duration, future: F) -> Option<F::Output> {
    if timers_available() {
        tokio::time::timeout(timeout, future).await.ok()
    } else {
        Some(future.await)
    }
}

/// A number in [0, 1), different on each call: a per-thread xorshift seeded from the standard
/// library's random hasher keys. For spreading retries, not for anything secret.
pub(crate) fn unit_random() -> f64 {
    use std::cell::Cell;
    use std::hash::{BuildHasher, RandomState};
    thread_local! {
        static STATE: Cell<u64> = Cell::new(RandomState::new().hash_one(0u64) | 1);
    }
    STATE.with(|state| {
        let mut x = state.get();
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        state.set(x);
        (x >> 11) as f64 / (1u64 << 53) as f64
    })
}
