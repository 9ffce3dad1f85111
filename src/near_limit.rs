//! Near the limit ([`PolicyBuilder::near_limit`](crate::PolicyBuilder::near_limit)): a signal
//! before the 429, so an application can warn a customer who is about to be refused. An admitted
//! request whose limit is used to at least the policy's ratio (after it) is counted in
//! `throttle_requests_near_limit_total{policy,limit}` (a stream message too), shown to the layer's
//! [`on_near_limit`](crate::ThrottleLayerBuilder::on_near_limit) hook (at most once a second per
//! policy, with how many were held back), and, where the policy asks, named to the handler in the
//! request header `x-ratelimit-near`.

use std::sync::Arc;

use http::header::HeaderName;
use http::{Extensions, HeaderMap, HeaderValue, Method, Request, Uri};

use crate::decision::Decision;
use crate::key::Key;
use crate::observe::{OncePerSecond, RequestRef};

pub(crate) type NearLimitHook = dyn Fn(&NearLimit<'_>) + Send + Sync;

/// The request header that names, for the handler, the limits a request came near
/// ([`PolicyBuilder::near_limit_header`](crate::PolicyBuilder::near_limit_header)): the limit names,
/// comma-separated (stacked layers' names together, the outer layer's first). A layer with such a
/// policy removes a client's own from every request, so a client cannot send it.
pub const NEAR_LIMIT_HEADER: HeaderName = HeaderName::from_static("x-ratelimit-near");

/// Marks a request whose [`NEAR_LIMIT_HEADER`] a layer wrote (a client cannot set an extension):
/// an inner layer keeps the outer one's names and adds its own.
#[derive(Clone, Copy)]
struct NamedByLayer;

/// Removes the near-limit header a client sent, not one an outer layer wrote.
pub(crate) fn strip_clients<B>(request: &mut Request<B>) {
    if request.extensions().get::<NamedByLayer>().is_none() {
        request.headers_mut().remove(NEAR_LIMIT_HEADER);
    }
}

/// Names the limits an admitted request came near (`near`) to its handler, after an outer layer's.
pub(crate) fn name<B>(request: &mut Request<B>, near: HeaderValue) {
    let outer = match request.extensions().get::<NamedByLayer>() {
        Some(_) => request.headers().get(NEAR_LIMIT_HEADER),
        None => None,
    };
    let value = match outer {
        Some(outer) => {
            HeaderValue::from_bytes(&[outer.as_bytes(), b", ", near.as_bytes()].concat())
                .unwrap_or(near)
        }
        None => near,
    };
    request.headers_mut().insert(NEAR_LIMIT_HEADER, value);
    request.extensions_mut().insert(NamedByLayer);
}

/// An admitted request that came near a limit, as the
/// [`on_near_limit`](crate::ThrottleLayerBuilder::on_near_limit) hook sees it.
#[derive(Debug)]
#[non_exhaustive]
pub struct NearLimit<'a> {
    /// The policy.
    pub policy: &'a str,
    /// The limit it came near (for stacked quotas, each one's own name).
    pub limit: &'a str,
    /// Its key.
    pub key: &'a Key,
    /// The limit's decision: `limit - remaining` units are used.
    pub decision: &'a Decision,
    /// How many near-limit requests of this policy the hook was not shown since it last was (it is
    /// called at most once a second per policy).
    pub held_back: u64,
    /// The request's method.
    pub method: &'a Method,
    /// The request's URI.
    pub uri: &'a Uri,
    /// The request's headers.
    pub headers: &'a HeaderMap,
    /// The request's extensions.
    pub extensions: &'a Extensions,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct NearRule {
    /// The share of a limit used (after the request) from which it is near, in (0, 1].
    pub(crate) ratio: f64,
    /// Whether the handler is told, in [`NEAR_LIMIT_HEADER`].
    pub(crate) header: bool,
}

impl NearRule {
    pub(crate) fn new(policy: &str, ratio: f64, header: bool) -> Result<NearRule, String> {
        if !(ratio > 0.0 && ratio <= 1.0) {
            return Err(format!(
                "policy {policy:?}: near_limit must be above 0 and at most 1 (0.8: 80 % used), not {ratio}"
            ));
        }
        Ok(NearRule { ratio, header })
    }

    pub(crate) fn is_near(&self, decision: &Decision) -> bool {
        let used = decision.limit.saturating_sub(decision.remaining);
        decision.allowed && used as f64 >= self.ratio * decision.limit as f64
    }
}

/// A policy's near-limit reports: the counter, and the hook's once-a-second gate.
#[derive(Default)]
pub(crate) struct NearReport {
    hook: OncePerSecond,
    #[cfg(feature = "metrics")]
    counters: crate::observe::LimitCounters,
}

impl NearReport {
    pub(crate) fn count(&self, policy: &str, limit: &str) {
        #[cfg(feature = "metrics")]
        self.counters
            .increment("throttle_requests_near_limit_total", policy, limit);
        tracing::debug!(policy = %policy, limit = %limit, "request near its limit");
    }

    /// A stream message's limits that it leaves used to at least `rule`'s ratio: counted as a
    /// request's are. The hook and the header are a request's (the message's caller has its
    /// [`Decision`]).
    pub(crate) fn near_message(
        &self,
        rule: &NearRule,
        policy: &str,
        names: &[Arc<str>],
        decisions: &[Decision],
    ) {
        for (name, _) in names.iter().zip(decisions).filter(|(_, d)| rule.is_near(d)) {
            self.count(policy, name);
        }
    }

    /// An admitted request's limits (`names`, with their `decisions`) that it leaves used to at
    /// least `rule`'s ratio: each counted, shown to `hook` (once a second per policy), and named
    /// for the handler (the header's value) if the rule says so.
    pub(crate) fn near(
        &self,
        rule: &NearRule,
        hook: Option<&NearLimitHook>,
        (policy, key): (&str, &Key),
        names: &[Arc<str>],
        decisions: &[Decision],
        request: RequestRef<'_>,
    ) -> Option<Box<HeaderValue>> {
        let mut near: Vec<&str> = Vec::new();
        for (name, decision) in names.iter().zip(decisions) {
            if !rule.is_near(decision) {
                continue;
            }
            self.count(policy, name);
            if let Some(hook) = hook
                && let Some(held_back) = self.hook.open()
            {
                hook(&NearLimit {
                    policy,
                    limit: name,
                    key,
                    decision,
                    held_back,
                    method: request.method,
                    uri: request.uri,
                    headers: request.headers,
                    extensions: request.extensions,
                });
            }
            near.push(name);
        }
        if !rule.header || near.is_empty() {
            return None;
        }
        // Limit names are header-safe ([A-Za-z0-9_.-]).
        HeaderValue::from_str(&near.join(", ")).ok().map(Box::new)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_limit_is_near_from_the_ratio_of_it_used_and_the_ratio_is_checked() {
        let rule = NearRule::new("api", 0.8, false).unwrap();
        let admitted = |remaining| Decision::allowed(10, remaining, Duration::from_secs(1));
        assert!(!rule.is_near(&admitted(3)), "7 of 10 used");
        assert!(rule.is_near(&admitted(2)), "8 of 10 used");
        assert!(rule.is_near(&admitted(0)));
        let refused =
            Decision::limited(10, 0, Some(Duration::from_secs(1)), Duration::from_secs(1));
        assert!(!rule.is_near(&refused), "a refusal is not near: it is over");
        for bad in [0.0, -0.5, 1.01, f64::NAN] {
            let err = NearRule::new("api", bad, false).unwrap_err();
            assert!(
                err.starts_with("policy \"api\": near_limit must be above 0"),
                "{err}"
            );
        }
        assert!(NearRule::new("api", 1.0, true)
            .unwrap()
            .is_near(&admitted(0)));
    }
}
