//! How the layer answers a request it refuses ([`Refusals`]): its own problem response (a gRPC
//! status under `grpc()`), or the application's custom refusal or rejection, with its
//! `Retry-After`; a `429` after the `on_limited` hook. Whether a request is refused at all is the
//! engine's call (a dry run refuses nothing); what the answer is, this file's.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Response, StatusCode};

use crate::decision::Decision;
use crate::grpc;
use crate::headers::{self, RateHeaders};
use crate::key::Key;
use crate::observe::{Limited, RequestRef};
use crate::overload::Shed;
use crate::refusal::{Refusal, RefusalKind, Rejected};

pub(crate) type RejectionFn = dyn Fn(&Rejected<'_>) -> Response<Bytes> + Send + Sync;
pub(crate) type RefusalFn = dyn Fn(&Refusal<'_>) -> Response<Bytes> + Send + Sync;
pub(crate) type LimitedHook = dyn Fn(&Limited<'_>) + Send + Sync;

/// The layer's options for the answers it makes itself, as the builder collects them.
#[derive(Clone, Default)]
pub(crate) struct Refusals {
    /// Makes the `429`s in place of the problem response (`grpc()`: `RESOURCE_EXHAUSTED`).
    pub(crate) rejection: Option<Arc<RejectionFn>>,
    /// Answers every refusal (429, 400, 403, 503) when set.
    pub(crate) custom: Option<Arc<RefusalFn>>,
    pub(crate) on_limited: Option<Arc<LimitedHook>>,
    /// Refusals (400, 403, 503) as gRPC trailers-only responses.
    pub(crate) grpc: bool,
}

impl Refusals {
    /// The custom refusal function's answer to `refusal`, or the layer's own (its `default`): with
    /// no function set, this is one `Option` check.
    fn answer(&self, refusal: Refusal<'_>) -> Response<Bytes> {
        match &self.custom {
            Some(custom) => custom(&refusal),
            None => (refusal.default)(),
        }
    }

    fn problem(&self, status: StatusCode, detail: &str) -> Response<Bytes> {
        if self.grpc {
            grpc::refusal(status, detail)
        } else {
            headers::problem(status, detail)
        }
    }

    /// A refusal that says when to come back, if `retry`: in `Retry-After` (whole seconds,
    /// rounded up) and, under `grpc()`, as gRPC pushback; without, the problem response alone.
    fn refuse(
        &self,
        (kind, status): (RefusalKind, StatusCode),
        (policy, key): (Option<&str>, Option<&Key>),
        (retry, detail): (Option<Duration>, &str),
        request: RequestRef<'_>,
    ) -> Response<Bytes> {
        let default = || {
            let mut response = self.problem(status, detail);
            if let (true, Some(retry)) = (self.grpc, retry) {
                grpc::set_pushback(response.headers_mut(), retry);
            }
            response
        };
        let mut response = self.answer(Refusal {
            kind,
            status,
            policy,
            key,
            decision: None,
            retry_after: retry,
            detail,
            request,
            default: &default,
        });
        if let Some(retry) = retry {
            headers::set_retry_after(&mut response, crate::decision::ceil_secs(retry));
        }
        response
    }

    /// A `503` with `Retry-After: 1` (and gRPC pushback): the backend failed and the layer fails
    /// closed, or a request cannot be delayed or identified.
    pub(crate) fn unavailable(
        &self,
        policy_key: (Option<&str>, Option<&Key>),
        request: RequestRef<'_>,
        detail: &str,
    ) -> Response<Bytes> {
        let refused = (RefusalKind::Unavailable, StatusCode::SERVICE_UNAVAILABLE);
        let retry = Some(Duration::from_secs(1));
        self.refuse(refused, policy_key, (retry, detail), request)
    }

    /// A request the overload gate shed (`policy`: the one that matched, if any), with a
    /// `Retry-After` of the time the requests in flight take to drain.
    pub(crate) fn shed(
        &self,
        policy: Option<&str>,
        shed: &Shed,
        request: RequestRef<'_>,
    ) -> Response<Bytes> {
        crate::observe::shed(&shed.partition);
        let detail = "the service is overloaded; retry later";
        let refused = (RefusalKind::Overloaded, shed.status);
        let retry = Some(shed.retry_after);
        self.refuse(refused, (policy, None), (retry, detail), request)
    }

    /// The `429` of a request over the limit of `policy` (whose problem body is `body`), or the
    /// custom rejection, after the `on_limited` hook; with `Retry-After` and the rate-limit
    /// `fields`.
    // Inlined into the judge, the one caller on a request's path: every 429 comes here.
    #[inline]
    pub(crate) fn limited(
        &self,
        (policy, body): (&str, &Bytes),
        (key, decision): (&Key, &Decision),
        request: RequestRef<'_>,
        fields: RateHeaders,
    ) -> Response<Bytes> {
        if let Some(hook) = &self.on_limited {
            hook(&Limited {
                policy,
                key,
                decision,
                method: request.method,
                uri: request.uri,
                headers: request.headers,
                extensions: request.extensions,
            });
        }
        let status = StatusCode::TOO_MANY_REQUESTS;
        let default = || match &self.rejection {
            Some(custom) => custom(&Rejected { policy, decision }),
            None => headers::problem_response(status, body.clone()),
        };
        let mut response = match &self.custom {
            None => default(),
            Some(_) => self.answer(Refusal {
                kind: RefusalKind::Limited,
                status,
                policy: Some(policy),
                key: Some(key),
                decision: Some(decision),
                // As `Retry-After` says it: a request that no wait admits (its cost is over
                // the limit) is told the reset time.
                retry_after: Some(decision.retry_after.unwrap_or(decision.reset_after)),
                detail: &format!("rate limit of policy '{policy}' exceeded"),
                request,
                default: &default,
            }),
        };
        headers::set_retry_after(&mut response, decision.retry_after_secs());
        fields.apply(response.headers_mut());
        response
    }

    /// The `403` of a client or key on a deny list (`policy`: the one that matched, if any).
    pub(crate) fn forbidden(
        &self,
        policy_key: (Option<&str>, Option<&Key>),
        request: RequestRef<'_>,
    ) -> Response<Bytes> {
        let refused = (RefusalKind::Denied, StatusCode::FORBIDDEN);
        let detail = "this client or key is on a deny list";
        self.refuse(refused, policy_key, (None, detail), request)
    }

    /// The `status` answer to a request without a key for `policy` (`what` names the expected
    /// source).
    pub(crate) fn missing_key(
        &self,
        (policy, status): (&str, StatusCode),
        what: &str,
        request: RequestRef<'_>,
    ) -> Response<Bytes> {
        let detail = format!("no rate-limit key for policy '{policy}': expected {what}");
        let refused = (RefusalKind::MissingKey, status);
        self.refuse(refused, (Some(policy), None), (None, &detail), request)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A shed's wait goes out in whole seconds rounded up from the nanosecond, and its gRPC
    /// pushback within the second below (`retry-after` − 1000 < pushback ≤ `retry-after` × 1000).
    #[test]
    fn a_shed_s_retry_after_is_rounded_up() {
        let request = http::Request::get("/").body(()).unwrap();
        let shed = Shed {
            partition: Arc::from("p"),
            retry_after: Duration::from_nanos(2_000_400_000),
            status: StatusCode::SERVICE_UNAVAILABLE,
        };
        for grpc in [false, true] {
            let refusals = Refusals {
                grpc,
                ..Refusals::default()
            };
            let response = refusals.shed(None, &shed, RequestRef::of(&request));
            assert_eq!(response.headers()[http::header::RETRY_AFTER], "3");
            if grpc {
                assert_eq!(response.headers()[&grpc::GRPC_RETRY_PUSHBACK_MS], "2001");
            }
        }
    }
}
