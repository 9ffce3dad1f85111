//! [`Circuit`]: a circuit breaker's state machine (breaker.rs, cluster_nodes.rs). A call that fails
//! to reach Redis opens it for 50 ms; then one call probes while the others fail fast; a failed
//! probe keeps it open twice as long (up to 500 ms); any answer closes it.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::recorder::Clock;

use crate::backoff::Backoff;

/// How long the circuit stays open: 50 ms, twice as long after each failed probe, at most 500 ms.
const OPEN: Backoff = Backoff::new(Duration::from_millis(50), Duration::from_millis(500));

/// Where a circuit breaker stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum CircuitState {
    /// Calls go to Redis.
    Closed,
    /// Calls fail at once, without a round trip.
    Open,
    /// One call probes whether Redis answers again; the others still fail at once.
    HalfOpen,
}

impl CircuitState {
    /// `"closed"`, `"open"` or `"half-open"`.
    pub fn name(self) -> &'static str {
        match self {
            CircuitState::Closed => "closed",
            CircuitState::Open => "open",
            CircuitState::HalfOpen => "half-open",
        }
    }
}

/// The breaker's state: lock-free, one relaxed load on a closed circuit.
pub(crate) struct Circuit {
    /// The backend's one clock (recorder.rs), shared by every breaker of a backend.
    clock: Clock,
    /// Milliseconds on `clock` (plus one) until which calls fail fast; 0 when closed.
    open_until: AtomicU64,
    /// Failed probes in a row.
    failures: AtomicU32,
    /// When the running probe started (0: none); one older than the timeout blocks nothing.
    probe_started: AtomicU64,
    probe_limit_ms: u64,
    /// When a call last got an answer: tells a timed-out call's slow node from a dead one.
    last_answer: AtomicU64,
}

/// What a call may do, given the circuit.
pub(crate) enum Admission {
    Closed,
    /// Held until the call ends, for its `Drop`.
    Probe(#[allow(dead_code)] ProbeGuard),
    FailFast,
}

/// Lets the next call probe when this one ends, however it ends (finished, failed or dropped).
pub(crate) struct ProbeGuard {
    circuit: Arc<Circuit>,
    started: u64,
}

impl Drop for ProbeGuard {
    fn drop(&mut self) {
        let _ = self.circuit.probe_started.compare_exchange(
            self.started,
            0,
            Ordering::AcqRel,
            Ordering::Relaxed,
        );
    }
}

impl Circuit {
    /// Closed, on `clock`; a probe may run for `timeout` before another may start.
    pub(crate) fn new(timeout: Duration, clock: Clock) -> Self {
        Circuit {
            clock,
            open_until: AtomicU64::new(0),
            failures: AtomicU32::new(0),
            probe_started: AtomicU64::new(0),
            probe_limit_ms: timeout.as_millis() as u64 + 1,
            last_answer: AtomicU64::new(0),
        }
    }

    /// Milliseconds on the backend's clock, plus one (0 means "never").
    pub(crate) fn now_ms(&self) -> u64 {
        self.clock.now_ms()
    }

    /// A call got an answer at `now` (a [`now_ms`](Self::now_ms) reading; stored only in a new
    /// millisecond: busy callers mostly read).
    pub(crate) fn stamp_answer(&self, now: u64) {
        if self.last_answer.load(Ordering::Relaxed) < now {
            self.last_answer.fetch_max(now, Ordering::Relaxed);
        }
    }

    /// Whether some call got an answer after `started` (a [`now_ms`](Self::now_ms) reading, or
    /// [`last_answer`](Self::last_answer) read as the call began): a call that timed out meanwhile
    /// met a slow node, not a dead one.
    pub(crate) fn answered_since(&self, started: u64) -> bool {
        self.last_answer.load(Ordering::Relaxed) > started
    }

    /// The last answer's stamp: read as a call begins, any answer after it moves it on (a stamp
    /// is a new millisecond), so [`answered_since`](Self::answered_since) needs no clock reading.
    pub(crate) fn last_answer(&self) -> u64 {
        self.last_answer.load(Ordering::Relaxed)
    }

    /// Whether the circuit was opened and no call has got through since (open or half-open).
    pub(crate) fn tripped(&self) -> bool {
        self.open_until.load(Ordering::Acquire) != 0
    }

    /// Closed, open, or half-open (its wait is over: the next call, or the running one, probes).
    pub(crate) fn state(&self) -> CircuitState {
        match self.open_until.load(Ordering::Acquire) {
            0 => CircuitState::Closed,
            until if self.now_ms() < until => CircuitState::Open,
            _ => CircuitState::HalfOpen,
        }
    }

    /// Whether a call may go ahead: closed, the one probe of an open circuit, or fail fast.
    pub(crate) fn admit(self: &Arc<Self>) -> Admission {
        let until = self.open_until.load(Ordering::Acquire);
        if until == 0 {
            return Admission::Closed;
        }
        let now = self.now_ms();
        if now < until {
            return Admission::FailFast;
        }
        let running = self.probe_started.load(Ordering::Acquire);
        if running != 0 && now < running + self.probe_limit_ms {
            return Admission::FailFast;
        }
        match self
            .probe_started
            .compare_exchange(running, now, Ordering::AcqRel, Ordering::Relaxed)
        {
            Ok(_) => Admission::Probe(ProbeGuard {
                circuit: self.clone(),
                started: now,
            }),
            Err(_) => Admission::FailFast,
        }
    }

    /// Redis answered: closes the circuit. Whether it was tripped (a transition to say).
    pub(crate) fn answered(&self) -> bool {
        if self.open_until.load(Ordering::Acquire) == 0 {
            return false;
        }
        self.failures.store(0, Ordering::Release);
        self.open_until.swap(0, Ordering::AcqRel) != 0
    }

    /// A call could not reach Redis: a probe's failure keeps the circuit open twice as long as last
    /// time; another's opens a closed circuit. Whether this call opened it (a transition to say).
    pub(crate) fn failed(&self, was_probe: bool) -> bool {
        let now = self.now_ms();
        if was_probe {
            let failures = self.failures.fetch_add(1, Ordering::AcqRel).min(8) + 1;
            let wait = OPEN.after(failures);
            self.open_until
                .store(now + wait.as_millis() as u64, Ordering::Release);
            false
        } else {
            self.open_until
                .compare_exchange(
                    0,
                    now + OPEN.first().as_millis() as u64,
                    Ordering::AcqRel,
                    Ordering::Relaxed,
                )
                .is_ok()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opens_on_a_failure_probes_once_and_closes_on_an_answer() {
        let circuit = Arc::new(Circuit::new(Duration::from_secs(60), Clock::new()));
        assert!(matches!(circuit.admit(), Admission::Closed));
        assert_eq!(circuit.state(), CircuitState::Closed);
        assert!(circuit.failed(false));
        // A second failure of a call under way says nothing new.
        assert!(!circuit.failed(false));
        assert!(circuit.tripped());
        assert_eq!(circuit.state(), CircuitState::Open);
        assert!(matches!(circuit.admit(), Admission::FailFast));
        // Past the wait: one probe, the others fail fast while it runs.
        circuit.open_until.store(1, Ordering::Release);
        assert_eq!(circuit.state(), CircuitState::HalfOpen);
        let probe = circuit.admit();
        assert!(matches!(probe, Admission::Probe(_)));
        assert!(matches!(circuit.admit(), Admission::FailFast));
        assert!(circuit.answered());
        drop(probe);
        assert!(!circuit.answered());
        assert_eq!(circuit.state(), CircuitState::Closed);
        assert!(matches!(circuit.admit(), Admission::Closed));
    }

    #[test]
    fn an_answer_after_a_call_began_tells_slow_from_dead() {
        let circuit = Arc::new(Circuit::new(Duration::from_secs(60), Clock::new()));
        let started = circuit.now_ms();
        assert!(!circuit.answered_since(started), "nothing answered yet");
        circuit.last_answer.store(started + 1, Ordering::Relaxed);
        assert!(circuit.answered_since(started));
        assert!(!circuit.answered_since(started + 1), "not after itself");
        // A stamp never moves the time back.
        circuit.last_answer.store(u64::MAX - 1, Ordering::Relaxed);
        circuit.stamp_answer(circuit.now_ms());
        assert_eq!(circuit.last_answer.load(Ordering::Relaxed), u64::MAX - 1);
    }

    #[test]
    fn a_failed_probe_waits_longer() {
        let circuit = Arc::new(Circuit::new(Duration::from_secs(60), Clock::new()));
        circuit.failed(false);
        let first = circuit.open_until.load(Ordering::Acquire);
        assert!(!circuit.failed(true));
        let second = circuit.open_until.load(Ordering::Acquire);
        assert!(second >= first + 50, "{first} then {second}");
    }
}
