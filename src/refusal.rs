//! Refusals: the requests the layer answers itself (`429`, `400`, `403`, `503`), as a custom
//! answer ([`ThrottleLayerBuilder::refusal_response`](crate::ThrottleLayerBuilder::refusal_response))
//! and the [`on_limited`](crate::ThrottleLayerBuilder::on_limited) hook see them.
//!
//! ```
//! use bytes::Bytes;
//! use http::{header, Request, Response, StatusCode};
//! use tower::{service_fn, Layer, ServiceExt};
//! use tower_throttle::refusal::{Refusal, RefusalKind};
//! use tower_throttle::{key::Header, Policy, Quota, ThrottleLayer};
//!
//! # tokio::runtime::Runtime::new().unwrap().block_on(async {
//! let layer = ThrottleLayer::builder()
//!     .policy(
//!         Policy::builder("api")
//!             .quota(Quota::per_minute(1))
//!             .key(Header::new("x-api-key"))
//!             .build()
//!             .unwrap(),
//!     )
//!     .refusal_response(|r: &Refusal<'_>| {
//!         if !r.prefers_html() {
//!             return r.default_response(); // problem+json for API clients
//!         }
//!         let text = match r.kind() {
//!             RefusalKind::Limited => format!(
//!                 "<p>Slow down: try again in {} s.</p>",
//!                 r.retry_after().map_or(1, |d| d.as_secs_f64().ceil() as u64)
//!             ),
//!             RefusalKind::MissingKey => "<p>Sign in first.</p>".to_owned(),
//!             _ => format!("<p>{}</p>", r.detail()),
//!         };
//!         let mut res = Response::new(Bytes::from(text));
//!         *res.status_mut() = r.status();
//!         res.headers_mut().insert(header::CONTENT_TYPE, "text/html".parse().unwrap());
//!         res
//!     })
//!     .build()
//!     .unwrap();
//! let service = layer.layer(service_fn(|_: Request<()>| async {
//!     Ok::<_, std::convert::Infallible>(Response::new(http_body_util::Empty::<Bytes>::new()))
//! }));
//! let call = |key: Option<&str>, accept: &str| {
//!     let mut request = Request::get("/").header(header::ACCEPT, accept);
//!     if let Some(key) = key {
//!         request = request.header("x-api-key", key);
//!     }
//!     service.clone().oneshot(request.body(()).unwrap())
//! };
//! assert_eq!(call(Some("k"), "text/html").await.unwrap().status(), StatusCode::OK);
//! let limited = call(Some("k"), "text/html").await.unwrap();
//! assert_eq!(limited.status(), StatusCode::TOO_MANY_REQUESTS);
//! assert_eq!(limited.headers()["content-type"], "text/html");
//! assert_eq!(limited.headers()["retry-after"], "60");
//! let no_key = call(None, "application/json").await.unwrap();
//! assert_eq!(no_key.status(), StatusCode::BAD_REQUEST);
//! assert_eq!(no_key.headers()["content-type"], "application/problem+json");
//! # });
//! ```

use std::fmt;
use std::time::Duration;

use bytes::Bytes;
use http::header::HeaderMap;
use http::{Response, StatusCode};

use crate::decision::Decision;
use crate::headers::{limited_body, problem_response};
pub use crate::observe::Limited;

pub(crate) mod respond;

/// A request that a policy limited: what [`Refusal::rejected`] gives for a `429`, and what
/// [`grpc::resource_exhausted`](crate::grpc::resource_exhausted) answers.
#[derive(Debug)]
#[non_exhaustive]
pub struct Rejected<'a> {
    /// The name of the policy that rejected the request.
    pub policy: &'a str,
    /// The decision.
    pub decision: &'a Decision,
}

impl Rejected<'_> {
    /// The default rejection: `429 Too Many Requests` with an RFC 9457 `application/problem+json` body
    /// naming the policy (the middleware adds `Retry-After`).
    pub fn default_response(&self) -> Response<Bytes> {
        problem_response(StatusCode::TOO_MANY_REQUESTS, limited_body(self.policy))
    }
}

/// Why the layer refused a request itself, as a [`Refusal`] tells it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum RefusalKind {
    /// Over the limit, or banned by a penalty (`429`; [`Refusal::decision`] says which).
    Limited,
    /// The matching policy found no key in the request (`400` by default, see
    /// [`MissingKey`](crate::policy::MissingKey)), or found it ambiguous (a key header sent twice).
    MissingKey,
    /// The client or key is on a deny list (`403`).
    Denied,
    /// The backend failed under [`OnBackendError::Deny`](crate::OnBackendError::Deny), or a delayed
    /// request has no timer to wait on (`503`).
    Unavailable,
    /// The layer's overload gate shed it: too many requests in flight (`503`, or `429` as
    /// [`Overload::status`](crate::overload::Overload::status) says).
    Overloaded,
}

impl RefusalKind {
    /// `"limited"`, `"missing_key"`, `"denied"`, `"unavailable"` or `"overloaded"`.
    pub fn as_str(self) -> &'static str {
        match self {
            RefusalKind::Limited => "limited",
            RefusalKind::MissingKey => "missing_key",
            RefusalKind::Denied => "denied",
            RefusalKind::Unavailable => "unavailable",
            RefusalKind::Overloaded => "overloaded",
        }
    }
}

/// A request the layer refuses, as a custom refusal function
/// ([`ThrottleLayerBuilder::refusal_response`](crate::ThrottleLayerBuilder::refusal_response)) sees
/// it: why (its [`kind`](Self::kind) and default [`status`](Self::status)), what was decided (the
/// policy, the key, the [`Decision`], the retry time), and the request's method, URI, headers and
/// extensions, for content negotiation (JSON for API clients, HTML for browsers).
#[non_exhaustive]
pub struct Refusal<'a> {
    pub(crate) kind: RefusalKind,
    pub(crate) status: StatusCode,
    pub(crate) policy: Option<&'a str>,
    pub(crate) key: Option<&'a crate::key::Key>,
    pub(crate) decision: Option<&'a Decision>,
    pub(crate) retry_after: Option<Duration>,
    pub(crate) detail: &'a str,
    pub(crate) request: crate::observe::RequestRef<'a>,
    /// Makes the layer's own answer, only if the function asks for it.
    pub(crate) default: &'a dyn Fn() -> Response<Bytes>,
}

impl<'a> Refusal<'a> {
    /// Why the request is refused.
    pub fn kind(&self) -> RefusalKind {
        self.kind
    }

    /// The status the layer would answer with (`429`, `400` or the [`MissingKey`](crate::policy::MissingKey)
    /// status, `403`, `503`).
    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// The policy that matched the request (`None` for a deny list that refused a request no policy
    /// matched).
    pub fn policy(&self) -> Option<&'a str> {
        self.policy
    }

    /// The request's key (`None` when it has none).
    pub fn key(&self) -> Option<&'a crate::key::Key> {
        self.key
    }

    /// A [`RefusalKind::Limited`] refusal as a [`Rejected`] (its policy and decision), for functions
    /// written for it such as [`grpc::resource_exhausted`](crate::grpc::resource_exhausted) (whose
    /// example calls it); `None` for the other kinds.
    pub fn rejected(&self) -> Option<Rejected<'a>> {
        match (self.kind, self.policy, self.decision) {
            (RefusalKind::Limited, Some(policy), Some(decision)) => {
                Some(Rejected { policy, decision })
            }
            _ => None,
        }
    }

    /// The decision of a [`RefusalKind::Limited`] refusal (for stacked quotas, the combined one);
    /// `decision.banned` tells a penalty-box ban from a plain limit.
    pub fn decision(&self) -> Option<&'a Decision> {
        self.decision
    }

    /// When the client may retry: the decision's retry time for a `429` (the rest of a ban for a
    /// banned key; the reset time for a request that no wait admits), the time the requests in
    /// flight take to drain for an overload shed, one second for another `503`, `None` otherwise.
    /// The layer sends it as `Retry-After` (rounded up to whole seconds, at least one for a `429`)
    /// unless the response sets its own.
    pub fn retry_after(&self) -> Option<Duration> {
        self.retry_after
    }

    /// The reason in words, as the default problem body's `detail` says it.
    pub fn detail(&self) -> &'a str {
        self.detail
    }

    /// The request's method.
    pub fn method(&self) -> &'a http::Method {
        self.request.method
    }

    /// The request's URI.
    pub fn uri(&self) -> &'a http::Uri {
        self.request.uri
    }

    /// The request's headers (`Accept`, `Accept-Language`, ...).
    pub fn headers(&self) -> &'a HeaderMap {
        self.request.headers
    }

    /// The request's extensions (axum's `ConnectInfo`, your authenticated user, ...).
    pub fn extensions(&self) -> &'a http::Extensions {
        self.request.extensions
    }

    /// Whether the client's `Accept` header asks for HTML rather than JSON (a browser): a quick
    /// test for content negotiation, by quality (`q`; `q=0` refuses a type), then by order.
    /// Absent or `*/*`: false.
    pub fn prefers_html(&self) -> bool {
        // The best (quality, place) of each.
        let (mut html, mut json) = ((0.0, usize::MAX), (0.0, usize::MAX));
        let accept = self.request.headers.get_all(http::header::ACCEPT).iter();
        let items = accept
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','));
        for (place, item) in items.enumerate() {
            let mut parts = item.split(';');
            let media = parts.next().unwrap_or("").trim();
            let best = if media.eq_ignore_ascii_case("text/html") {
                &mut html
            } else if media.eq_ignore_ascii_case("application/json")
                || media.eq_ignore_ascii_case("application/problem+json")
            {
                &mut json
            } else {
                continue;
            };
            let q = parts.find_map(|p| {
                let (name, value) = p.split_once('=')?;
                name.trim()
                    .eq_ignore_ascii_case("q")
                    .then(|| value.trim().parse().ok())?
            });
            let q: f32 = q.unwrap_or(1.0);
            if q > best.0 {
                *best = (q, place);
            }
        }
        html.0 > json.0 || (html.0 > 0.0 && html.0 == json.0 && html.1 < json.1)
    }

    /// The answer the layer would give: an RFC 9457 problem (or the gRPC status with
    /// [`grpc`](crate::ThrottleLayerBuilder::grpc)).
    pub fn default_response(&self) -> Response<Bytes> {
        (self.default)()
    }
}

impl fmt::Debug for Refusal<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Refusal")
            .field("kind", &self.kind)
            .field("status", &self.status)
            .field("policy", &self.policy)
            .field("key", &self.key)
            .field("decision", &self.decision)
            .field("retry_after", &self.retry_after)
            .field("detail", &self.detail)
            .field("method", self.request.method)
            .field("uri", self.request.uri)
            .finish_non_exhaustive()
    }
}
