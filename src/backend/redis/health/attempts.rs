//! [`Attempts`]: what a connection's keeper records of its attempts, for `health()` and
//! `first_attempt()`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime};

/// An attempt Redis refused for a reason retrying alone will not fix: retried slowly, logged as an
/// error and, but for a replica, fails `Config::layer` at start-up.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Misconfigured {
    /// The server is a replica: a failover may promote it, so the start stays lazy.
    Replica(String),
    /// Wrong password or user, no password, missing ACL permissions, mode "cell" without the module.
    Fatal(String),
}

#[derive(Default)]
struct Record {
    address: Option<String>,
    last_error: Option<(String, SystemTime)>,
    /// The last attempt failed on the configuration, not on reachability (cleared by a connection).
    misconfigured: Option<Misconfigured>,
}

/// The attempts of one connection's keeper.
#[derive(Default)]
pub(crate) struct Attempts {
    /// Attempts ended, connected or not, so that `first_attempt` knows when to stop waiting.
    ended: AtomicU64,
    record: Mutex<Record>,
}

impl Attempts {
    fn record(&self) -> std::sync::MutexGuard<'_, Record> {
        self.record.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// An attempt connected (to `address`, where known).
    pub(crate) fn connected(&self, address: Option<String>) {
        let mut record = self.record();
        if address.is_some() {
            record.address = address;
        }
        record.misconfigured = None;
        drop(record);
        self.ended.fetch_add(1, Ordering::AcqRel);
    }

    /// An attempt failed with `error`, on the configuration (`misconfigured`) or not.
    pub(crate) fn failed(&self, error: String, misconfigured: Option<Misconfigured>) {
        let mut record = self.record();
        record.last_error = Some((error, SystemTime::now()));
        record.misconfigured = misconfigured;
        drop(record);
        self.ended.fetch_add(1, Ordering::AcqRel);
    }

    /// The connection was lost: `why`.
    pub(crate) fn lost(&self, why: &str) {
        self.record().last_error = Some((why.to_owned(), SystemTime::now()));
    }

    /// Where it connected last, and the last error with its time.
    pub(crate) fn snapshot(&self) -> (Option<String>, Option<(String, SystemTime)>) {
        let record = self.record();
        (record.address.clone(), record.last_error.clone())
    }

    /// Waits until `connected` or the first attempt ended: whether connected, or its fatal error.
    pub(crate) async fn first_attempt(
        &self,
        budget: Duration,
        connected: impl Fn() -> bool,
    ) -> Result<bool, String> {
        let deadline = Instant::now() + budget;
        while !connected() && self.ended.load(Ordering::Acquire) == 0 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        if connected() {
            return Ok(true);
        }
        match self.record().misconfigured.clone() {
            Some(Misconfigured::Fatal(message)) => Err(message),
            _ => Ok(false),
        }
    }
}
