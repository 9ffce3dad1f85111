//! Counting by outcome: which responses count against a policy's quota
//! ([`PolicyBuilder::count_only`](crate::PolicyBuilder::count_only),
//! [`refund_on`](crate::PolicyBuilder::refund_on)), and the guard that gives a request's units back
//! when its response does not count.
//!
//! Exact under concurrency: a request takes its units when it is admitted, like any other, so
//! requests in flight count; once the inner service answers, the units of a response that does not
//! count are given back ([`Adjustment::Refund`](crate::backend::Adjustment::Refund)). A policy
//! counting failures thus admits at most its quota of failures per period, however many requests
//! are in flight.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use http::{HeaderMap, StatusCode};

use crate::backend::{AdjustLater, CLOCK_MARGIN};
use crate::meter::MeterGuard;

pub(crate) type StatusFilter = Arc<dyn Fn(StatusCode) -> bool + Send + Sync>;

/// Which responses count: those `count_only` accepts (all, without it), except those `refund_on`
/// accepts.
#[derive(Clone, Default)]
pub(crate) struct OutcomeRule {
    pub(crate) count_only: Option<StatusFilter>,
    pub(crate) refund_on: Option<StatusFilter>,
}

impl OutcomeRule {
    pub(crate) fn counts(&self, status: StatusCode) -> bool {
        self.count_only.as_ref().is_none_or(|f| f(status))
            && !self.refund_on.as_ref().is_some_and(|f| f(status))
    }

    pub(crate) fn is_set(&self) -> bool {
        self.count_only.is_some() || self.refund_on.is_some()
    }
}

impl fmt::Debug for OutcomeRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OutcomeRule")
            .field("count_only", &self.count_only.is_some())
            .field("refund_on", &self.refund_on.is_some())
            .finish()
    }
}

/// An admitted request whose response decides whether it counts. Settled once, with the response's
/// status. A request whose response never comes (the inner service fails, or the response future is
/// dropped: the client went away) counts, whatever the rules say: otherwise a client could send
/// expensive requests and hang up before each answer, and never be counted.
///
/// It also carries a metered request's [`MeterGuard`] to the response: the response's headers
/// may say what it cost, and its body then takes the guard along until it ends.
pub(crate) struct OutcomeGuard {
    rule: Arc<OutcomeRule>,
    /// Gives the request's units back (called with `None`).
    refund: Option<AdjustLater>,
    /// When the backend was asked: the admission came after.
    asked: Instant,
    /// How long the request's units count in the backend (the longest `reset_after` of its
    /// limits): after that nothing is left to give back. Each limit bounds its own share by the
    /// time since the admission (a sliding log gives back nothing once a period has passed).
    counts_for: Duration,
    meter: Option<Box<MeterGuard>>,
}

impl OutcomeGuard {
    pub(crate) fn new(
        rule: Arc<OutcomeRule>,
        refund: AdjustLater,
        asked: Instant,
        counts_for: Duration,
    ) -> Self {
        OutcomeGuard {
            rule,
            refund: Some(refund),
            asked,
            counts_for,
            meter: None,
        }
    }

    /// A metered request's guard, which counts every response (its cost is settled by `meter`).
    pub(crate) fn metered(meter: MeterGuard) -> Self {
        OutcomeGuard {
            rule: Arc::default(),
            refund: None,
            asked: Instant::now(),
            counts_for: Duration::ZERO,
            meter: Some(Box::new(meter)),
        }
    }

    /// The response has this status and these headers: its units are given back if it does not
    /// count (a gRPC response by its `grpc-status`, when its headers have it). Returns a metered
    /// request's guard, for the response's body to settle when it ends (after reading the usage
    /// header, if the headers have it).
    pub(crate) fn settle(
        mut self,
        status: StatusCode,
        headers: &HeaderMap,
    ) -> Option<Box<MeterGuard>> {
        if let Some(refund) = self.refund.take()
            && !(self.rule).counts(crate::grpc::http_status_of(headers).unwrap_or(status))
        {
            let since = self.asked.elapsed() + CLOCK_MARGIN;
            if since < self.counts_for {
                refund(None, since);
            }
        }
        let meter = self.meter.take()?;
        meter.read_usage(headers);
        Some(meter)
    }
}

/// A set of statuses from the configuration: codes (`401`) and classes (`"4xx"`).
#[cfg(feature = "config")]
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct StatusSet {
    codes: Vec<u16>,
    /// Hundreds digits: 4 for "4xx".
    classes: Vec<u16>,
}

#[cfg(feature = "config")]
impl StatusSet {
    /// Parses `entries` (codes 100–599 or classes "1xx"–"5xx"); `what` names the setting in errors.
    pub(crate) fn parse(entries: &[String], what: &str) -> Result<StatusSet, String> {
        if entries.is_empty() {
            return Err(format!(
                "{what} is empty (leave it out to count every response)"
            ));
        }
        let mut set = StatusSet {
            codes: Vec::new(),
            classes: Vec::new(),
        };
        for entry in entries {
            let e = entry.trim();
            let class = e
                .strip_suffix("xx")
                .or_else(|| e.strip_suffix("XX"))
                .and_then(|d| d.parse::<u16>().ok())
                .filter(|d| (1..=5).contains(d));
            if let Some(class) = class {
                set.classes.push(class);
                continue;
            }
            match e.parse::<u16>() {
                Ok(code) if (100..=599).contains(&code) => set.codes.push(code),
                _ => {
                    return Err(format!(
                        "{what}: {entry:?} is not a status (100 to 599) nor a class (\"1xx\" to \"5xx\")"
                    ))
                }
            }
        }
        Ok(set)
    }

    pub(crate) fn contains(&self, status: StatusCode) -> bool {
        let code = status.as_u16();
        self.codes.contains(&code) || self.classes.contains(&(code / 100))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    /// How many refunds a guard under `rule` gives, settled with `status` (dropped without one).
    fn refunds(rule: &OutcomeRule, status: Option<u16>) -> u32 {
        let refunds = Arc::new(AtomicU32::new(0));
        let seen = refunds.clone();
        let refund: AdjustLater = Box::new(move |deltas, _| {
            assert!(deltas.is_none(), "a refund, not a settlement");
            seen.fetch_add(1, Ordering::SeqCst);
        });
        let guard = OutcomeGuard::new(
            Arc::new(rule.clone()),
            refund,
            Instant::now(),
            Duration::from_secs(3600),
        );
        match status.map(|code| StatusCode::from_u16(code).unwrap()) {
            Some(status) => drop(guard.settle(status, &HeaderMap::new())),
            None => drop(guard),
        }
        refunds.load(Ordering::SeqCst)
    }

    #[test]
    fn a_response_that_does_not_count_is_refunded_once_and_a_dropped_one_counts() {
        let failures = OutcomeRule {
            count_only: Some(Arc::new(|s: StatusCode| s == 401 || s == 403)),
            refund_on: None,
        };
        assert_eq!(refunds(&failures, Some(401)), 0, "a 401 counts");
        assert_eq!(refunds(&failures, Some(200)), 1, "a 200 is given back");
        assert_eq!(refunds(&failures, None), 0, "no response: it counts");

        let server_errors = OutcomeRule {
            count_only: None,
            refund_on: Some(Arc::new(|s: StatusCode| s.is_server_error())),
        };
        assert_eq!(refunds(&server_errors, Some(200)), 0);
        assert_eq!(refunds(&server_errors, Some(502)), 1);
    }

    #[cfg(feature = "config")]
    #[test]
    fn status_sets_parse_codes_and_classes_and_refuse_the_rest() {
        let set = StatusSet::parse(&["401".into(), "403".into(), "5xx".into()], "t").unwrap();
        assert!(set.contains(StatusCode::UNAUTHORIZED));
        assert!(set.contains(StatusCode::SERVICE_UNAVAILABLE));
        assert!(!set.contains(StatusCode::NOT_FOUND));
        assert!(StatusSet::parse(&[], "count_statuses")
            .unwrap_err()
            .contains("is empty"));
        for bad in ["6xx", "99", "600", "4x", "abc"] {
            let err = StatusSet::parse(&[bad.into()], "count_statuses").unwrap_err();
            assert!(err.contains("is not a status"), "{bad}: {err}");
        }
    }
}
