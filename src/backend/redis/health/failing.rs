//! [`Failing`]: whether the backend's decisions are failing now, for `health()` and the gauge
//! `throttle_backend_up{backend, path}`.
//!
//! The rule: decisions are failing from the first Redis call that ends in an error (any error: a
//! refused or lost connection, a timeout, `OOM command not allowed`, a script error) until the next
//! one that succeeds. While they fail, [`RedisHealth`](crate::redis::RedisHealth) is unhealthy, its
//! `last_error` is the error of the last failed call, and the gauge is 0 on every path; the first
//! call that succeeds brings both back. With no traffic, the watcher (watch.rs) probes with a
//! read-only decision every [`PROBE_EVERY`], so a Redis that recovered is seen within a second even
//! when nothing asks it (a readiness check that took the instance out of service would otherwise
//! never let a request prove it).
//!
//! A call that succeeds while decisions are not failing costs one relaxed atomic load.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime};

use redis::RedisError;

use crate::backend::redis::wire::mode::{path_name, RedisMode, CELL, LUA, UNKNOWN};

/// How long the watcher lets a failing backend go without a decision before it probes.
pub(crate) const PROBE_EVERY: Duration = Duration::from_millis(250);

/// Whether decisions are failing, and why.
pub(crate) struct Failing {
    failing: AtomicBool,
    /// The error of the last failed call, and when, while failing; taken with every transition so
    /// that the gauge follows the flag in order.
    error: Mutex<Option<(String, SystemTime)>>,
    /// The path decisions take (for the gauge's label): `UNKNOWN`, `CELL` or `LUA`.
    path: AtomicU8,
    epoch: Instant,
    /// Ms since `epoch` of the last failed call.
    last_failure_ms: AtomicU64,
    /// The gauge's `backend` label.
    name: Box<str>,
}

impl Failing {
    /// Not failing; the path unknown until detection (or the mode) names it.
    pub(crate) fn new(mode: RedisMode, name: &str) -> Self {
        let failing = Failing {
            failing: AtomicBool::new(false),
            error: Mutex::new(None),
            path: AtomicU8::new(UNKNOWN),
            epoch: Instant::now(),
            last_failure_ms: AtomicU64::new(0),
            name: name.into(),
        };
        if mode != RedisMode::Auto {
            failing.path.store(code(Some(mode)), Ordering::Relaxed);
        }
        failing
    }

    /// A call succeeded: if decisions were failing, they no longer are.
    pub(crate) fn succeeded(&self) {
        if !self.failing.load(Ordering::Relaxed) {
            return;
        }
        let _error = self.error.lock().unwrap_or_else(|e| e.into_inner());
        if self.failing.swap(false, Ordering::AcqRel) {
            crate::observe::backend_up(&self.name, Some(self.path_name()));
        }
    }

    /// A call failed with `error`: decisions are failing, and this is why.
    pub(crate) fn failed(&self, error: &dyn std::fmt::Display) {
        self.failed_with(error.to_string());
    }

    /// A call failed with Redis' `error`: an error reply reads as Redis wrote it (`OOM command not
    /// allowed when used memory > 'maxmemory'.`), not as redis-rs shows it (`"OOM": command…`).
    pub(crate) fn failed_on(&self, error: &RedisError) {
        match (error.code(), error.detail()) {
            (Some(code), Some(detail)) => self.failed_with(format!("{code} {detail}")),
            _ => self.failed_with(error.to_string()),
        }
    }

    fn failed_with(&self, text: String) {
        let mut current = self.error.lock().unwrap_or_else(|e| e.into_inner());
        self.last_failure_ms
            .store(self.epoch.elapsed().as_millis() as u64, Ordering::Relaxed);
        // Not logged here: the layer logs failed decisions (once a second), and the reconnecting
        // task the connection's transitions.
        if !self.failing.swap(true, Ordering::AcqRel) {
            crate::observe::backend_up(&self.name, None);
        }
        *current = Some((text, SystemTime::now()));
    }

    /// The error decisions are failing with now, if they are.
    pub(crate) fn current(&self) -> Option<(String, SystemTime)> {
        if !self.failing.load(Ordering::Acquire) {
            return None;
        }
        self.error.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Whether decisions are failing and none has been tried for [`PROBE_EVERY`]: time to probe.
    pub(crate) fn wants_probe(&self) -> bool {
        let quiet = (self.epoch.elapsed().as_millis() as u64)
            .saturating_sub(self.last_failure_ms.load(Ordering::Relaxed));
        self.failing.load(Ordering::Relaxed) && quiet >= PROBE_EVERY.as_millis() as u64
    }

    /// The reconnecting task connected, on `path`: the gauge says so unless decisions are failing
    /// (then the first that succeeds does). (A connection lost sets it to 0: reconnect.rs.)
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
        self.path.store(code(path), Ordering::Relaxed);
    }

    fn path_name(&self) -> &'static str {
        path_name(match self.path.load(Ordering::Relaxed) {
            CELL => Some(RedisMode::Cell),
            LUA => Some(RedisMode::Lua),
            _ => None,
        })
    }
}

fn code(path: Option<RedisMode>) -> u8 {
    match path {
        Some(RedisMode::Cell) => CELL,
        Some(RedisMode::Lua) => LUA,
        _ => UNKNOWN,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failing_from_the_first_error_until_the_first_success() {
        let failing = Failing::new(RedisMode::Lua, "test");
        assert_eq!(failing.current(), None);
        failing.failed(&"OOM command not allowed when used memory > 'maxmemory'");
        let (error, _) = failing.current().unwrap();
        assert!(error.starts_with("OOM"), "{error}");
        // The error now, not the first one.
        failing.failed(&"timed out");
        assert_eq!(failing.current().unwrap().0, "timed out");
        failing.succeeded();
        assert_eq!(failing.current(), None);
        assert!(!failing.wants_probe());
        assert_eq!(failing.path_name(), "lua");
        assert_eq!(Failing::new(RedisMode::Auto, "test").path_name(), "unknown");
    }
}
