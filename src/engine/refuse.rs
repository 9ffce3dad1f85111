//! The refusals a [`Judge`] makes: the `429` of a request over its limit (after the `on_limited`
//! hook), the `503` of a backend that failed under
//! [`OnBackendError::Deny`](crate::OnBackendError::Deny), the `403` of a deny list, the `4xx` of a
//! request without a key — each the layer's own problem response, or the application's custom
//! rejection or refusal.

use std::time::Duration;

use bytes::Bytes;
use http::{Response, StatusCode};

use crate::decision::Decision;
use crate::engine::verdict::{Admitted, Judge, RequestContext, Verdict};
use crate::grpc;
use crate::headers::{self, RateHeaders};
use crate::key::Key;
use crate::observe::{Limited, RequestRef};
use crate::overload::Shed;
use crate::policy::{CompiledPolicy, MissingKey};
use crate::refusal::{Refusal, RefusalKind, Rejected};

impl Judge {
    /// A delayed request with no timer to wait on: a misconfigured server, not the client's fault.
    /// Admitting at once would let the queue through early.
    pub(super) fn cannot_delay(
        &self,
        rules: &CompiledPolicy,
        cx: RequestContext<'_>,
    ) -> Response<Bytes> {
        crate::observe::no_timers(&rules.name);
        self.unavailable(
            Some(&rules.name),
            Some(cx.key),
            cx.request,
            "the rate limiter cannot delay this request",
        )
    }

    /// A `503` with `Retry-After: 1` (and gRPC pushback), or the custom refusal.
    pub(super) fn unavailable(
        &self,
        policy: Option<&str>,
        key: Option<&Key>,
        request: RequestRef<'_>,
        detail: &str,
    ) -> Response<Bytes> {
        let status = StatusCode::SERVICE_UNAVAILABLE;
        let default = || {
            let mut response = self.problem(status, detail);
            if self.settings.grpc {
                grpc::set_pushback(response.headers_mut(), Duration::from_secs(1));
            }
            response
        };
        let mut response = self.refuse(
            Refusal {
                kind: RefusalKind::Unavailable,
                status,
                policy,
                key,
                decision: None,
                retry_after: Some(Duration::from_secs(1)),
                detail,
                request,
                default: &default,
            },
            &default,
        );
        headers::set_retry_after(response.headers_mut(), 1);
        response
    }

    /// The refusal of a request the overload gate shed (`policy`: the one that matched, if
    /// any): its status (`503` or `429`, as the gate's options say), a `Retry-After` of the time
    /// the requests in flight take to drain, the layer's problem body or the custom refusal.
    pub(crate) fn shed(
        &self,
        policy: Option<&CompiledPolicy>,
        shed: &Shed,
        request: RequestRef<'_>,
    ) -> Response<Bytes> {
        crate::observe::shed(&shed.partition);
        let detail = "the service is overloaded; retry later";
        let default = || {
            let mut response = self.problem(shed.status, detail);
            if self.settings.grpc {
                grpc::set_pushback(response.headers_mut(), shed.retry_after);
            }
            response
        };
        let mut response = self.refuse(
            Refusal {
                kind: RefusalKind::Overloaded,
                status: shed.status,
                policy: policy.map(|p| &*p.name),
                key: None,
                decision: None,
                retry_after: Some(shed.retry_after),
                detail,
                request,
                default: &default,
            },
            &default,
        );
        let seconds = u64::try_from(shed.retry_after.as_millis()).unwrap_or(u64::MAX);
        headers::set_retry_after(response.headers_mut(), seconds.div_ceil(1000));
        response
    }

    /// The custom refusal function's answer to `refusal`, or the layer's own (`default`): with no
    /// function set, this is one `Option` check.
    pub(super) fn refuse(
        &self,
        refusal: Refusal<'_>,
        default: &dyn Fn() -> Response<Bytes>,
    ) -> Response<Bytes> {
        match &self.settings.refusal {
            Some(custom) => custom(&refusal),
            None => default(),
        }
    }

    /// The 429 (or the custom rejection), after the `on_limited` hook.
    pub(super) fn reject(
        &self,
        rules: &CompiledPolicy,
        cx: RequestContext<'_>,
        decision: &Decision,
        fields: RateHeaders,
    ) -> Response<Bytes> {
        if let Some(hook) = &self.settings.on_limited {
            hook(&Limited {
                policy: &rules.name,
                key: cx.key,
                decision,
                method: cx.request.method,
                uri: cx.request.uri,
                headers: cx.request.headers,
                extensions: cx.request.extensions,
            });
        }
        let default = || match &self.settings.rejection {
            Some(custom) => custom(&Rejected {
                policy: &rules.name,
                decision,
            }),
            None => {
                headers::problem_response(StatusCode::TOO_MANY_REQUESTS, rules.limited_body.clone())
            }
        };
        let mut response = match &self.settings.refusal {
            None => default(),
            Some(_) => {
                let detail = format!("rate limit of policy '{}' exceeded", rules.name);
                self.refuse(
                    Refusal {
                        kind: RefusalKind::Limited,
                        status: StatusCode::TOO_MANY_REQUESTS,
                        policy: Some(&rules.name),
                        key: Some(cx.key),
                        decision: Some(decision),
                        retry_after: decision.retry_after,
                        detail: &detail,
                        request: cx.request,
                        default: &default,
                    },
                    &default,
                )
            }
        };
        headers::set_retry_after(response.headers_mut(), decision.retry_after_secs());
        fields.apply(response.headers_mut());
        response
    }

    fn problem(&self, status: StatusCode, detail: &str) -> Response<Bytes> {
        if self.settings.grpc {
            grpc::refusal(status, detail)
        } else {
            headers::problem(status, detail)
        }
    }

    /// The verdict on a client or key on a deny list (`policy`: the one that matched, if any).
    pub(crate) fn forbidden(
        &self,
        policy: Option<&CompiledPolicy>,
        key: Option<&Key>,
        request: RequestRef<'_>,
    ) -> Verdict {
        if !self.enforces(policy, RefusalKind::Denied, key) {
            return Verdict::Admit(Admitted::unlimited());
        }
        crate::observe::forbidden();
        let status = StatusCode::FORBIDDEN;
        let detail = "this client or key is on a deny list";
        let default = || self.problem(status, detail);
        Verdict::Reject(self.refuse(
            Refusal {
                kind: RefusalKind::Denied,
                status,
                policy: policy.map(|p| &*p.name),
                key,
                decision: None,
                retry_after: None,
                detail,
                request,
                default: &default,
            },
            &default,
        ))
    }

    /// The verdict on a request without a key for policy `policy` (`what` names the expected
    /// source): what its [`MissingKey`] says.
    pub(crate) fn missing_key(
        &self,
        policy: &CompiledPolicy,
        what: &str,
        request: RequestRef<'_>,
    ) -> Verdict {
        let rules = policy;
        let status = match rules.missing_key {
            MissingKey::Reject(status)
                if self.enforces(Some(rules), RefusalKind::MissingKey, None) =>
            {
                status
            }
            _ => return Verdict::Admit(Admitted::unlimited()),
        };
        rules.reporter.missing_key(&rules.name, what);
        let detail = format!(
            "no rate-limit key for policy '{}': expected {what}",
            rules.name
        );
        let default = || self.problem(status, &detail);
        Verdict::Reject(self.refuse(
            Refusal {
                kind: RefusalKind::MissingKey,
                status,
                policy: Some(&rules.name),
                key: None,
                decision: None,
                retry_after: None,
                detail: &detail,
                request,
                default: &default,
            },
            &default,
        ))
    }
}
