//! [`Recorder`]: the one record of every call's outcome, that health and the gauge read. With no
//! traffic the watcher probes a failing Redis every [`PROBE_EVERY`]: a readiness check that took
//! the instance out of service would otherwise never let a request prove it recovered (and once
//! when the resets subscription ends: [`ask_probe`](Recorder::ask_probe)). A call that succeeds
//! while decisions are not failing costs two relaxed stores and one load.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime};

use redis::RedisError;

use crate::backend::redis::wire::mode::{path_code, path_name, path_of, RedisMode, UNKNOWN};

/// How long the watcher lets a failing backend go without a decision before it probes.
pub(crate) const PROBE_EVERY: Duration = Duration::from_millis(250);

/// The one clock of a backend: every breaker and record counts milliseconds from its epoch.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Clock(Instant);

impl Clock {
    /// A clock starting now.
    pub(crate) fn new() -> Self {
        Clock(Instant::now())
    }

    /// Milliseconds since the epoch, plus one (so that 0 can mean "none").
    pub(crate) fn now_ms(&self) -> u64 {
        self.0.elapsed().as_millis() as u64 + 1
    }
}

/// Failures in a row past which Redis counts as unreachable, whenever it last answered.
const UNREACHABLE_AFTER: u32 = 3;
/// A failing Redis that has not answered for this long counts as unreachable.
const SILENT_FOR: Duration = Duration::from_secs(1);

/// What the calls met: the last answer, the failures since, whether decisions fail, and why.
pub(crate) struct Recorder {
    /// Ms on `clock` of the last answer; 0 before any.
    last_answer: AtomicU64,
    /// Calls in a row that could not reach Redis.
    failures_in_a_row: AtomicU32,
    /// The last of them: its error and time.
    last_failure: Mutex<Option<(String, SystemTime)>>,
    /// A call could not reach Redis: it may come back as another server, so `Auto` detects the
    /// module again (connection.rs), which clears this once answered.
    lost: AtomicBool,
    failing: AtomicBool,
    /// The last failed call's error and time; locked by transitions (the gauge follows in order).
    error: Mutex<Option<(String, SystemTime)>>,
    /// The path decisions take (for the gauge's label): `UNKNOWN`, `CELL` or `LUA`.
    path: AtomicU8,
    pub(crate) clock: Clock,
    /// Ms on `clock` of the last failed call.
    last_failure_ms: AtomicU64,
    /// The gauge's `backend` label.
    name: Box<str>,
    /// Something other than a call saw Redis go: the watcher probes at its next tick.
    probe_asked: AtomicBool,
}

impl Recorder {
    /// Nothing recorded, on `clock`; the path unknown until detection (or the mode) names it.
    pub(crate) fn new(mode: RedisMode, name: &str, clock: Clock) -> Self {
        let failing = Recorder {
            last_answer: AtomicU64::new(0),
            failures_in_a_row: AtomicU32::new(0),
            last_failure: Mutex::new(None),
            lost: AtomicBool::new(false),
            failing: AtomicBool::new(false),
            error: Mutex::new(None),
            path: AtomicU8::new(UNKNOWN),
            clock,
            last_failure_ms: AtomicU64::new(0),
            name: name.into(),
            probe_asked: AtomicBool::new(false),
        };
        if mode != RedisMode::Auto {
            failing.path.store(path_code(Some(mode)), Ordering::Relaxed);
        }
        failing
    }

    /// One call's outcome at `now` (a [`Clock::now_ms`] reading): whether Redis answered (an error
    /// reply included), and its error.
    pub(crate) fn record(&self, answered: bool, error: Option<String>, now: u64) {
        if answered {
            if self.last_answer.load(Ordering::Relaxed) != now {
                self.last_answer.store(now, Ordering::Relaxed);
            }
            if self.failures_in_a_row.load(Ordering::Relaxed) != 0 {
                self.failures_in_a_row.store(0, Ordering::Relaxed);
            }
        } else {
            self.lost.store(true, Ordering::Relaxed);
            self.failures_in_a_row.fetch_add(1, Ordering::Relaxed);
            *self.last_failure.lock().unwrap_or_else(|e| e.into_inner()) =
                error.clone().map(|error| (error, SystemTime::now()));
        }
        match error {
            // If decisions were failing, they no longer are.
            None if self.failing.load(Ordering::Relaxed) => {
                let _error = self.error.lock().unwrap_or_else(|e| e.into_inner());
                if self.failing.swap(false, Ordering::AcqRel) {
                    crate::observe::backend_up(&self.name, Some(self.path_name()));
                }
            }
            None => {}
            Some(text) => {
                let mut current = self.error.lock().unwrap_or_else(|e| e.into_inner());
                self.last_failure_ms.store(now, Ordering::Relaxed);
                // Not logged: the layer logs failed decisions, the reconnecting task the
                // transitions.
                if !self.failing.swap(true, Ordering::AcqRel) {
                    crate::observe::backend_up(&self.name, None);
                }
                *current = Some((text, SystemTime::now()));
            }
        }
    }

    /// From the calls alone: whether Redis is reachable, and the last failure.
    pub(crate) fn reachability(&self) -> (bool, Option<(String, SystemTime)>) {
        let failures = self.failures_in_a_row.load(Ordering::Relaxed);
        let last_answer = self.last_answer.load(Ordering::Relaxed);
        let silent = self.clock.now_ms().saturating_sub(last_answer);
        let reachable = failures == 0
            || (failures < UNREACHABLE_AFTER
                && last_answer != 0
                && silent <= SILENT_FOR.as_millis() as u64);
        let last_failure = self
            .last_failure
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        (reachable, last_failure)
    }

    /// Whether a call failed to reach Redis since [`forget_loss`](Self::forget_loss) was last called.
    pub(crate) fn lost(&self) -> bool {
        self.lost.load(Ordering::Relaxed)
    }

    /// Redis was found again (detection answered, or a connection made): forget the loss.
    pub(crate) fn forget_loss(&self) {
        self.lost.store(false, Ordering::Relaxed);
    }

    /// The error decisions are failing with now, if they are.
    pub(crate) fn current(&self) -> Option<(String, SystemTime)> {
        if !self.failing.load(Ordering::Acquire) {
            return None;
        }
        self.error.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Whether it is time to probe: a probe was asked for ([`ask_probe`](Self::ask_probe)), or
    /// decisions are failing and none has been tried for [`PROBE_EVERY`]. Takes the request.
    pub(crate) fn wants_probe(&self) -> bool {
        let quiet = self
            .clock
            .now_ms()
            .saturating_sub(self.last_failure_ms.load(Ordering::Relaxed));
        self.probe_asked.swap(false, Ordering::Relaxed)
            || self.failing.load(Ordering::Relaxed) && quiet >= PROBE_EVERY.as_millis() as u64
    }

    /// Redis may be gone, as something other than a call saw (the resets subscription ended):
    /// the watcher probes at its next tick, so that health says so with no request to find out.
    pub(crate) fn ask_probe(&self) {
        self.probe_asked.store(true, Ordering::Relaxed);
    }

    /// The reconnecting task connected, or detection changed the path, on `path`: the gauge says
    /// so, unless decisions fail.
    pub(crate) fn connected(&self, path: Option<RedisMode>) {
        let _error = self.error.lock().unwrap_or_else(|e| e.into_inner());
        self.set_path(path);
        if !self.failing.load(Ordering::Acquire) {
            crate::observe::backend_up(&self.name, Some(self.path_name()));
        }
    }

    /// The reconnecting task lost the connection: the gauge is 0 on every path.
    pub(crate) fn disconnected(&self) {
        crate::observe::backend_up(&self.name, None);
    }

    /// Detection found the path decisions take.
    pub(crate) fn set_path(&self, path: Option<RedisMode>) {
        self.path.store(path_code(path), Ordering::Relaxed);
    }

    fn path_name(&self) -> &'static str {
        path_name(path_of(self.path.load(Ordering::Relaxed)))
    }
}

/// Why a call failed, as Redis wrote it (`OOM command not allowed…`, not redis-rs' `"OOM": …`).
pub(crate) fn error_text(error: &RedisError) -> String {
    match (error.code(), error.detail()) {
        (Some(code), Some(detail)) => format!("{code} {detail}"),
        _ => error.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failing_from_the_first_error_until_the_first_success() {
        let failing = Recorder::new(RedisMode::Lua, "test", Clock::new());
        assert_eq!(failing.current(), None);
        let oom = "OOM command not allowed when used memory > 'maxmemory'";
        failing.record(true, Some(oom.to_owned()), failing.clock.now_ms());
        let (error, _) = failing.current().unwrap();
        assert!(error.starts_with("OOM"), "{error}");
        let answered = failing.reachability().0 && !failing.lost();
        assert!(answered, "an error reply is an answer");
        // The error now, not the first one.
        failing.record(false, Some("timed out".to_owned()), failing.clock.now_ms());
        assert_eq!(failing.current().unwrap().0, "timed out");
        assert!(failing.lost());
        failing.record(true, None, failing.clock.now_ms());
        assert_eq!(failing.current(), None);
        assert!(!failing.wants_probe());
        assert_eq!(failing.path_name(), "lua");
        let auto = Recorder::new(RedisMode::Auto, "test", Clock::new());
        assert_eq!(auto.path_name(), "unknown");
    }
}
