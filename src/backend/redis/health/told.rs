//! [`Told`]: what the log last said of a Cluster node's breaker, so that a node that flaps (a
//! promoted replica that drops connections under load) logs a line per [`QUIET`], not a pair per
//! cycle. A transition is logged at once unless a line about the node went out less than [`QUIET`]
//! ago; then it is only counted, and the slot-map task says the node's state, with that count, once
//! the state has held for [`STEADY`] or the quiet is over. A line that no longer tells the node's
//! state stands for [`QUIET`] at most; the node gauge follows every transition.

use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

/// After a line about a node, how long its transitions are only counted.
const QUIET: Duration = Duration::from_secs(10);
/// How long a node's state, counted and not logged, holds before the slot-map task says it.
const STEADY: Duration = Duration::from_secs(1);

#[derive(Default)]
pub(crate) struct Told(Mutex<Said>);

#[derive(Default)]
struct Said {
    /// When the last line about the node went out.
    at: Option<Instant>,
    /// Transitions since, not logged, and when the last of them was.
    untold: u32,
    changed: Option<Instant>,
}

impl Told {
    /// A transition of the node's breaker at `now`: `Some` with the transitions left untold before
    /// it, to log it now; `None` when it is only counted.
    pub(crate) fn transition(&self, now: Instant) -> Option<u32> {
        let mut said = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if said
            .at
            .is_some_and(|at| now.saturating_duration_since(at) < QUIET)
        {
            said.untold += 1;
            said.changed = Some(now);
            return None;
        }
        said.at = Some(now);
        Some(std::mem::take(&mut said.untold))
    }

    /// At a round of the slot-map task: the untold transitions and the node's `state`, to say now,
    /// when there are some and their last state has held for [`STEADY`] or the quiet is over. The
    /// state is read under the lock: a transition after it is counted again, and said later.
    pub(crate) fn due<T>(&self, now: Instant, state: impl FnOnce() -> T) -> Option<(u32, T)> {
        let mut said = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let since = |t: Option<Instant>, d| t.is_none_or(|t| now.saturating_duration_since(t) >= d);
        if said.untold == 0 || !(since(said.changed, STEADY) || since(said.at, QUIET)) {
            return None;
        }
        said.at = Some(now);
        Some((std::mem::take(&mut said.untold), state()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flapping_node_is_told_once_steady_or_once_a_quiet() {
        let told = Told::default();
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        // The first transition goes out; a cycle within the quiet is counted.
        assert_eq!(told.transition(t0), Some(0));
        assert_eq!(told.transition(at(200)), None);
        assert_eq!(told.transition(at(400)), None);
        assert_eq!(told.due(at(1_000), || "down"), None, "not steady yet");
        // Steady for a second: said once, with the count, and the quiet starts again.
        assert_eq!(told.due(at(1_400), || "down"), Some((2, "down")));
        assert_eq!(told.due(at(5_000), || "down"), None, "nothing untold");
        assert_eq!(told.transition(at(1_500)), None);
        // Flapping without a steady second: said when the quiet is over.
        for ms in (1_600..11_400).step_by(500) {
            assert_eq!(told.transition(at(ms)), None);
            assert_eq!(told.due(at(ms + 100), || "up"), None, "at {ms} ms");
        }
        assert_eq!(told.due(at(11_400), || "up").map(|d| d.1), Some("up"));
        // Once the quiet after the last line is over (to the nanosecond), a transition goes out
        // at once.
        let quiet_over = t0 + Duration::from_millis(11_400) + QUIET;
        assert_eq!(told.transition(quiet_over - Duration::from_nanos(1)), None);
        assert_eq!(told.due(quiet_over, || "up").map(|d| d.0), Some(1));
        assert_eq!(told.transition(quiet_over + QUIET), Some(0));
    }
}
