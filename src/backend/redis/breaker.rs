//! The circuit breaker and its admission logic, and `guarded`: one Redis call under the breaker and
//! the timeout.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use redis::RedisError;

use super::failing::Failing;
use super::mode::RedisMode;
use super::server::{is_not_primary, SingleServer};
use crate::error::BackendError;

/// Fails calls at once while Redis is known to be unreachable, instead of letting each wait for its
/// timeout. A call that fails to reach Redis (an I/O error, a dropped connection, a timeout) opens the
/// circuit for 50 ms. Then one call probes while the others still fail fast: if the probe fails too,
/// the circuit stays open twice as long (up to 500 ms); any reply from Redis, even an error reply,
/// closes it. So an outage costs requests nothing beyond the failure policy, and a Redis that comes
/// back is used again within half a second. Only single-server connections use it: on a Cluster one
/// node's trouble must not stop the decisions that other nodes can make.
pub(super) struct Breaker {
    /// False on a Cluster: every call is admitted, and failures open nothing.
    enabled: bool,
    epoch: Instant,
    /// Milliseconds since `epoch` until which calls fail fast; 0 when closed.
    open_until: AtomicU64,
    /// Failed probes in a row.
    failures: AtomicU32,
    /// When the running probe started (ms since `epoch`), 0 when none. A probe older than the
    /// timeout no longer blocks the next one, even if its future was never finished nor dropped.
    probe_started: AtomicU64,
    probe_limit_ms: u64,
    /// Set when a call could not reach Redis, on every topology: the connection may come back to
    /// another server, so `Auto` mode detects the module again ([`Detector`]), which clears it once
    /// detection has answered.
    ///
    /// [`Detector`]: super::connection::Detector
    lost: AtomicBool,
    /// The reconnecting server under this breaker, if any: told about timeouts (it drops a
    /// connection that stopped answering), and its task logs the transitions instead.
    server: Option<Arc<SingleServer>>,
    /// What the calls met, for `health()` where no reconnecting server knows (a Cluster, a user's
    /// connection manager).
    outcomes: Outcomes,
    /// Whether decisions are failing now, whatever the error (failing.rs).
    pub(super) failing: Failing,
}

/// The outcome of the last calls: when one last got an answer, and the failures to reach Redis
/// since.
#[derive(Default)]
struct Outcomes {
    /// Ms since `epoch` (plus one) of the last answer; 0 before any.
    last_answer: AtomicU64,
    /// Calls in a row that could not reach Redis.
    failures_in_a_row: AtomicU32,
    /// The last of them: its error and time.
    last_failure: Mutex<Option<(String, SystemTime)>>,
}

/// Failures in a row past which Redis counts as unreachable, whenever it last answered.
const UNREACHABLE_AFTER: u32 = 3;
/// A failing Redis that has not answered for this long counts as unreachable.
const SILENT_FOR: Duration = Duration::from_secs(1);

const BREAKER_MIN: Duration = Duration::from_millis(50);
const BREAKER_MAX: Duration = Duration::from_millis(500);

/// What a call may do, given the breaker.
pub(super) enum Admission {
    Closed,
    /// Held until the call ends, for its `Drop`.
    Probe(#[allow(dead_code)] ProbeGuard),
    FailFast,
}

/// Lets the next call probe when this one ends, however it ends (finished, failed or dropped).
pub(super) struct ProbeGuard {
    breaker: Arc<Breaker>,
    started: u64,
}

impl Drop for ProbeGuard {
    fn drop(&mut self) {
        let _ = self.breaker.probe_started.compare_exchange(
            self.started,
            0,
            Ordering::AcqRel,
            Ordering::Relaxed,
        );
    }
}

impl Breaker {
    /// A closed breaker; `enabled` is false on a Cluster; `server`, the reconnecting server it guards.
    pub(super) fn new(
        timeout: Duration,
        enabled: bool,
        server: Option<Arc<SingleServer>>,
        mode: RedisMode,
        name: &str,
    ) -> Self {
        Breaker {
            enabled,
            epoch: Instant::now(),
            open_until: AtomicU64::new(0),
            failures: AtomicU32::new(0),
            probe_started: AtomicU64::new(0),
            probe_limit_ms: timeout.as_millis() as u64 + 1,
            lost: AtomicBool::new(false),
            server,
            outcomes: Outcomes::default(),
            failing: Failing::new(mode, name),
        }
    }

    /// A call got an answer from Redis (an error reply included).
    fn call_answered(&self) {
        self.outcomes
            .last_answer
            .store(self.now_ms(), Ordering::Relaxed);
        self.outcomes.failures_in_a_row.store(0, Ordering::Relaxed);
    }

    /// A call could not reach Redis: `error` says why.
    fn call_failed(&self, error: &dyn std::fmt::Display) {
        self.outcomes
            .failures_in_a_row
            .fetch_add(1, Ordering::Relaxed);
        *self
            .outcomes
            .last_failure
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = Some((error.to_string(), SystemTime::now()));
    }

    /// From the calls alone: whether Redis is reachable (the last calls did not all fail to reach
    /// it: fewer than three in a row, and an answer within the last second), and the last failure.
    pub(super) fn reachability(&self) -> (bool, Option<(String, SystemTime)>) {
        let failures = self.outcomes.failures_in_a_row.load(Ordering::Relaxed);
        let last_answer = self.outcomes.last_answer.load(Ordering::Relaxed);
        let silent = self.now_ms().saturating_sub(last_answer);
        let reachable = failures == 0
            || (failures < UNREACHABLE_AFTER
                && last_answer != 0
                && silent <= SILENT_FOR.as_millis() as u64);
        let last_failure = self
            .outcomes
            .last_failure
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        (reachable, last_failure)
    }

    /// Whether the circuit was opened and no call has got through since (open, or waiting for its
    /// probe).
    pub(super) fn tripped(&self) -> bool {
        self.open_until.load(Ordering::Acquire) != 0
    }

    /// A call ran out of time: the server may drop a connection that stopped answering.
    fn timed_out(&self) {
        if let Some(server) = &self.server {
            server.timed_out();
        }
    }

    /// Milliseconds since the breaker was made, plus one (so that 0 can mean "none").
    pub(super) fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64 + 1
    }

    /// Whether a call failed to reach Redis since [`forget_loss`](Self::forget_loss) was last called.
    pub(super) fn lost(&self) -> bool {
        self.lost.load(Ordering::Relaxed)
    }

    /// Redis was found again (detection answered): forget the loss.
    pub(super) fn forget_loss(&self) {
        self.lost.store(false, Ordering::Relaxed);
    }

    /// Whether a call may go ahead: closed, the one probe of an open circuit, or fail fast.
    pub(super) fn admit(self: &Arc<Self>) -> Admission {
        if !self.enabled {
            return Admission::Closed;
        }
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
                breaker: self.clone(),
                started: now,
            }),
            Err(_) => Admission::FailFast,
        }
    }

    /// A call could not reach Redis.
    pub(super) fn unreachable(&self, was_probe: bool) {
        self.lost.store(true, Ordering::Relaxed);
        if self.enabled {
            self.failed(was_probe);
        }
    }

    /// Redis answered.
    pub(super) fn answered(&self) {
        if self.enabled && self.open_until.load(Ordering::Acquire) != 0 {
            self.failures.store(0, Ordering::Release);
            self.open_until.store(0, Ordering::Release);
            // With a reconnecting server, its task says so (once per reconnection).
            if self.server.is_none() {
                tracing::info!("Redis answers again; rate-limit decisions come from Redis");
            }
        }
    }

    fn failed(&self, was_probe: bool) {
        let now = self.now_ms();
        if was_probe {
            let failures = self.failures.fetch_add(1, Ordering::AcqRel).min(8) + 1;
            let wait = BREAKER_MIN.saturating_mul(1 << failures).min(BREAKER_MAX);
            self.open_until
                .store(now + wait.as_millis() as u64, Ordering::Release);
        } else if self
            .open_until
            .compare_exchange(
                0,
                now + BREAKER_MIN.as_millis() as u64,
                Ordering::AcqRel,
                Ordering::Relaxed,
            )
            .is_ok()
        {
            // Calls that were already under way when the circuit opened fail too; they say nothing
            // new. With a reconnecting server, its task says so (once per loss).
            if self.server.is_none() {
                tracing::warn!("Redis is unreachable; failing fast until a probe gets through");
            }
        }
    }
}

/// Runs one Redis call under the circuit breaker and the timeout, as every decision does.
pub(super) fn guarded<T, F>(
    breaker: &Arc<Breaker>,
    timeout: Duration,
    call: F,
) -> Pin<Box<dyn Future<Output = Result<T, BackendError>> + Send>>
where
    T: Send + 'static,
    F: Future<Output = Result<T, RedisError>> + Send + 'static,
{
    let admission = breaker.admit();
    if let Admission::FailFast = admission {
        return Box::pin(std::future::ready(Err(BackendError::new(
            "Redis is unreachable (failing fast until a probe gets through)",
        ))));
    }
    let breaker = breaker.clone();
    Box::pin(async move {
        let was_probe = matches!(admission, Admission::Probe(_));
        let result = match tokio::time::timeout(timeout, call).await {
            Ok(Ok(value)) => {
                breaker.answered();
                breaker.call_answered();
                breaker.failing.succeeded();
                Ok(value)
            }
            Ok(Err(e)) => {
                breaker.failing.failed_on(&e);
                if e.is_io_error() || e.is_connection_dropped() || e.is_timeout() {
                    breaker.unreachable(was_probe);
                    breaker.call_failed(&e);
                    if e.is_timeout() {
                        breaker.timed_out();
                    }
                } else if is_not_primary(&e) {
                    // Redis answered, but cannot decide here until a failover ends: as unreachable.
                    breaker.unreachable(was_probe);
                    breaker.call_failed(&e);
                } else {
                    // An error reply (OOM, NOPERM...) still proves Redis is there.
                    breaker.answered();
                    breaker.call_answered();
                }
                Err(BackendError::with_source("Redis failed to decide", e))
            }
            Err(_) => {
                breaker
                    .failing
                    .failed(&format_args!("Redis did not answer within {timeout:?}"));
                breaker.unreachable(was_probe);
                breaker.call_failed(&format_args!("Redis did not answer within {timeout:?}"));
                breaker.timed_out();
                Err(BackendError::new(format!(
                    "Redis did not decide within {timeout:?}"
                )))
            }
        };
        drop(admission);
        result
    })
}
