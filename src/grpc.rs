//! Answers for gRPC clients (tonic, grpc-go, grpc-java, ...): no extra dependencies.
//!
//! A gRPC client reads the outcome of a call from `grpc-status`, not from the HTTP status, so the
//! layer's usual `429` with a JSON body means nothing to it: tonic 0.14 tries to read the JSON as
//! gRPC messages and fails with `INTERNAL` (a protocol error), and gRPC's HTTP status mapping would
//! make it `UNAVAILABLE`; either way the client cannot tell that it was limited, nor for how long. [`ThrottleLayerBuilder::grpc`] makes the
//! layer answer every request it stops itself as a gRPC **trailers-only** response instead: HTTP `200`,
//! `content-type: application/grpc`, no body, and the status in the headers:
//!
//! | the layer would answer | gRPC status |
//! |---|---|
//! | `429` (over the limit, or banned by the penalty box) | `RESOURCE_EXHAUSTED` (8) |
//! | `503` ([`OnBackendError::Deny`] and the backend failed) | `UNAVAILABLE` (14) |
//! | `400` (no key, the default [`MissingKey`]) | `INVALID_ARGUMENT` (3) |
//! | `401` (no key, `MissingKey::Reject(401)`) | `UNAUTHENTICATED` (16) |
//! | `403` (on a deny list) | `PERMISSION_DENIED` (7) |
//! | any other 4xx of [`MissingKey::Reject`] | `FAILED_PRECONDITION` (9) |
//!
//! `grpc-message` carries the same text as the problem body's `detail`, percent-encoded as the gRPC
//! protocol requires. The other fields become the status's metadata:
//!
//! * `retry-after`: whole seconds, rounded up, at least 1 (as on a `429`);
//! * `grpc-retry-pushback-ms`: the same delay in milliseconds, rounded up but not to whole seconds
//!   (`retry-after` − 1000 < pushback ≤ `retry-after` × 1000). gRPC clients with a
//!   [retry policy](https://github.com/grpc/proposal/blob/master/A6-client-retries.md#pushback) that
//!   lists the status wait exactly this long before retrying; `-1`, which stops their retries, for
//!   a call that costs more than its limit ever admits;
//! * `ratelimit-policy` / `ratelimit` (and the legacy fields if switched on), as on every response.
//!
//! Admitted calls carry `ratelimit-policy` / `ratelimit` as initial metadata.
//!
//! ```
//! use bytes::Bytes;
//! use http::{Request, Response};
//! use http_body_util::Empty;
//! use tower::{service_fn, Layer, ServiceExt};
//! use tower_throttle::{key::Header, Policy, Quota, ThrottleLayer};
//!
//! # tokio::runtime::Runtime::new().unwrap().block_on(async {
//! let layer = ThrottleLayer::builder()
//!     .policy(
//!         Policy::builder("api")
//!             .quota(Quota::per_minute(1))
//!             .key(Header::new("x-api-key")) // gRPC metadata is HTTP headers
//!             .build()
//!             .unwrap(),
//!     )
//!     .grpc()
//!     .build()
//!     .unwrap();
//! // With tonic: Server::builder().layer(layer).add_service(..).serve(addr)
//! let service = layer.layer(service_fn(|_: Request<()>| async {
//!     Ok::<_, std::convert::Infallible>(Response::new(Empty::<Bytes>::new()))
//! }));
//! let call = |key: Option<&str>| {
//!     let mut request = Request::post("/helloworld.Greeter/SayHello");
//!     if let Some(key) = key {
//!         request = request.header("x-api-key", key);
//!     }
//!     service.clone().oneshot(request.body(()).unwrap())
//! };
//!
//! let admitted = call(Some("k1")).await.unwrap();
//! assert_eq!(admitted.headers()["ratelimit"], r#""api";r=0;t=60"#);
//!
//! let limited = call(Some("k1")).await.unwrap();
//! assert_eq!(limited.status(), 200); // gRPC errors travel in headers
//! assert_eq!(limited.headers()["content-type"], "application/grpc");
//! assert_eq!(limited.headers()["grpc-status"], "8"); // RESOURCE_EXHAUSTED
//! assert_eq!(limited.headers()["retry-after"], "60");
//! let pushback: u64 = limited.headers()["grpc-retry-pushback-ms"].to_str().unwrap().parse().unwrap();
//! assert!(59_000 < pushback && pushback <= 60_000);
//!
//! let no_key = call(None).await.unwrap();
//! assert_eq!(no_key.headers()["grpc-status"], "3"); // INVALID_ARGUMENT
//! # });
//! ```
//!
//! The layer goes straight into `tonic::transport::Server::builder().layer(..)`: tonic takes any
//! response body with `Bytes` data, so no body adapter is needed. To limit one method only, give the
//! policy the method's path as its route: `.route("/helloworld.Greeter/SayHello")`. Keys from
//! [`PeerIp`](crate::key::PeerIp) need a [`PeerAddr`](crate::key::PeerAddr) extension, which tonic
//! does not set (it sets its own `TcpConnectInfo`); key gRPC calls by metadata, or copy the address
//! over with `tower::ServiceBuilder::map_request`.
//!
//! [`ThrottleLayerBuilder::grpc`]: crate::ThrottleLayerBuilder::grpc
//! [`OnBackendError::Deny`]: crate::OnBackendError::Deny
//! [`MissingKey`]: crate::policy::MissingKey
//! [`MissingKey::Reject`]: crate::policy::MissingKey::Reject

use std::fmt::Write as _;
use std::time::Duration;

use bytes::Bytes;
use http::header::{HeaderMap, HeaderName, HeaderValue, CONTENT_TYPE, RETRY_AFTER};
use http::{Response, StatusCode};

use crate::refusal::Rejected;

/// `grpc-status`.
pub static GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");
/// `grpc-message`.
pub static GRPC_MESSAGE: HeaderName = HeaderName::from_static("grpc-message");
/// `grpc-retry-pushback-ms`: how long a gRPC client should wait before it retries, in milliseconds.
pub static GRPC_RETRY_PUSHBACK_MS: HeaderName = HeaderName::from_static("grpc-retry-pushback-ms");

const RESOURCE_EXHAUSTED: u8 = 8;

/// The gRPC answer to a call over the limit: a trailers-only response with `grpc-status: 8`
/// (`RESOURCE_EXHAUSTED`), a `grpc-message` naming the policy, `retry-after` (seconds) and
/// `grpc-retry-pushback-ms` (see the [module documentation](self)).
///
/// [`ThrottleLayerBuilder::grpc`](crate::ThrottleLayerBuilder::grpc) installs it (and answers the
/// layer's other refusals in gRPC too); on its own, give it the [`Refusal::rejected`](crate::refusal::Refusal::rejected)
/// of a [`refusal_response`](crate::ThrottleLayerBuilder::refusal_response).
///
/// ```
/// use tower_throttle::{grpc, key::PeerIp, Policy, Quota, ThrottleLayer};
///
/// // Only the 429 in gRPC form; `.grpc()` would convert the 400, 403 and 503 as well.
/// let layer = ThrottleLayer::builder()
///     .policy(Policy::builder("api").key(PeerIp::new()).quota(Quota::per_second(5)).build().unwrap())
///     .refusal_response(|r| {
///         r.rejected()
///             .map_or_else(|| r.default_response(), |limited| grpc::resource_exhausted(&limited))
///     })
///     .build()
///     .unwrap();
/// # let _ = layer;
/// ```
pub fn resource_exhausted(rejected: &Rejected<'_>) -> Response<Bytes> {
    let (decision, policy) = (rejected.decision, rejected.policy);
    let (why, pushback) = match decision.retry_after {
        Some(delay) => {
            let millis = ceil_millis(delay);
            (
                format!("retry after {millis} ms"),
                HeaderValue::from(millis),
            )
        }
        // Never admitted (it costs more than the limit): a negative pushback stops the retries.
        None => (
            "the call costs more than the limit admits".to_owned(),
            HeaderValue::from_static("-1"),
        ),
    };
    let detail = format!("rate limit of policy '{policy}' exceeded; {why}");
    let mut response = trailers_only(RESOURCE_EXHAUSTED, &detail);
    let headers = response.headers_mut();
    headers.insert(RETRY_AFTER, HeaderValue::from(decision.retry_after_secs()));
    headers.insert(GRPC_RETRY_PUSHBACK_MS.clone(), pushback);
    response
}

pub(crate) fn refusal(status: StatusCode, detail: &str) -> Response<Bytes> {
    trailers_only(code_for(status), detail)
}

pub(crate) fn set_pushback(headers: &mut HeaderMap, delay: Duration) {
    if !headers.contains_key(&GRPC_RETRY_PUSHBACK_MS) {
        headers.insert(
            GRPC_RETRY_PUSHBACK_MS.clone(),
            HeaderValue::from(ceil_millis(delay)),
        );
    }
}

/// The gRPC status code for an HTTP status the layer answers with (see the table above).
fn code_for(status: StatusCode) -> u8 {
    match status {
        StatusCode::TOO_MANY_REQUESTS => RESOURCE_EXHAUSTED,
        StatusCode::SERVICE_UNAVAILABLE => 14,
        StatusCode::BAD_REQUEST => 3,
        StatusCode::UNAUTHORIZED => 16,
        StatusCode::FORBIDDEN => 7,
        s if s.is_client_error() => 9,
        _ => 2, // UNKNOWN
    }
}

/// The HTTP status a gRPC response's `grpc-status` (in its headers: a trailers-only response, as
/// a handler's error is sent) stands for, as gRPC's own HTTP mapping gives it (grpc-gateway's),
/// so that counting by outcome reads a gRPC call's outcome, not the HTTP `200` every call has.
pub(crate) fn http_status_of(headers: &HeaderMap) -> Option<StatusCode> {
    let content_type = headers.get(CONTENT_TYPE)?.as_bytes();
    if !content_type.starts_with(b"application/grpc") {
        return None;
    }
    // One that is no status code (`abc`, `300`) is UNKNOWN, as a gRPC client reads it.
    let status = headers.get(&GRPC_STATUS)?;
    let code: u8 = status
        .to_str()
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2);
    let status = match code {
        0 => 200,
        1 => 499,
        3 | 9 | 11 => 400,
        4 => 504,
        5 => 404,
        6 | 10 => 409,
        7 => 403,
        8 => 429,
        12 => 501,
        14 => 503,
        16 => 401,
        _ => 500,
    };
    StatusCode::from_u16(status).ok()
}

/// A trailers-only response: HTTP 200, `content-type: application/grpc`, the status in the headers,
/// an empty body (so the server ends the stream with the headers).
fn trailers_only(code: u8, message: &str) -> Response<Bytes> {
    let mut response = Response::new(Bytes::new());
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    headers.insert(GRPC_STATUS.clone(), HeaderValue::from(u16::from(code)));
    headers.insert(
        GRPC_MESSAGE.clone(),
        HeaderValue::try_from(percent_encode(message))
            .expect("percent-encoded text is a valid header value"),
    );
    response
}

/// `grpc-message` encoding: UTF-8, with every byte outside printable ASCII, and `%`, as `%XX`.
fn percent_encode(message: &str) -> String {
    let mut out = String::with_capacity(message.len());
    for &b in message.as_bytes() {
        if (0x20..=0x7e).contains(&b) && b != b'%' {
            out.push(b as char);
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

/// Whole milliseconds, rounded up, at least 1 (as `Retry-After` is at least 1 second: never "retry
/// at once").
fn ceil_millis(d: Duration) -> u64 {
    let nanos = d.as_nanos();
    u64::try_from(nanos.div_ceil(1_000_000))
        .unwrap_or(u64::MAX)
        .max(1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decision::Decision;

    #[test]
    fn messages_are_percent_encoded() {
        assert_eq!(percent_encode("a b"), "a b");
        assert_eq!(percent_encode("100%"), "100%25");
        assert_eq!(percent_encode("é\n"), "%C3%A9%0A");
    }

    #[test]
    fn pushback_is_consistent_with_retry_after() {
        for (nanos, secs, millis) in [
            (1, 1, 1),
            (999_000_001, 1, 1000),
            (1_000_000_000, 1, 1000),
            (1_000_000_001, 2, 1001),
            (29_500_000_000, 30, 29_500),
        ] {
            let d = Decision::limited(
                16,
                0,
                Some(Duration::from_nanos(nanos)),
                Duration::from_secs(60),
            );
            let r = resource_exhausted(&Rejected {
                policy: "p",
                decision: &d,
            });
            assert_eq!(r.headers()[RETRY_AFTER], secs.to_string());
            assert_eq!(r.headers()[&GRPC_RETRY_PUSHBACK_MS], millis.to_string());
            assert!((secs - 1) * 1000 < millis && millis <= secs * 1000);
        }
        // A call over the whole limit is never admitted: no retry.
        let never = Decision::limited(16, 0, None, Duration::from_secs(60));
        let r = resource_exhausted(&Rejected {
            policy: "p",
            decision: &never,
        });
        assert_eq!(r.headers()[&GRPC_RETRY_PUSHBACK_MS], "-1");
    }

    #[test]
    fn a_grpc_status_reads_as_its_http_status_and_one_that_is_none_as_unknown() {
        let status_of = |code: &[u8]| {
            let mut headers = HeaderMap::new();
            headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
            headers.insert(GRPC_STATUS.clone(), HeaderValue::from_bytes(code).unwrap());
            http_status_of(&headers).map(|s| s.as_u16())
        };
        assert_eq!(status_of(b"0"), Some(200));
        assert_eq!(status_of(b"16"), Some(401));
        for unknown in [&b"2"[..], b"300", b"-1", b"abc", b"", b"\xff"] {
            assert_eq!(status_of(unknown), Some(500), "{unknown:?}");
        }
        // Not a gRPC response: its HTTP status stands.
        let mut plain = HeaderMap::new();
        plain.insert(GRPC_STATUS.clone(), HeaderValue::from_static("16"));
        assert_eq!(http_status_of(&plain), None);
    }

    #[test]
    fn refusals_map_to_grpc_codes() {
        for (status, code) in [
            (StatusCode::TOO_MANY_REQUESTS, "8"),
            (StatusCode::SERVICE_UNAVAILABLE, "14"),
            (StatusCode::BAD_REQUEST, "3"),
            (StatusCode::UNAUTHORIZED, "16"),
            (StatusCode::FORBIDDEN, "7"),
            (StatusCode::UNPROCESSABLE_ENTITY, "9"),
        ] {
            let r = refusal(status, "no");
            assert_eq!(r.status(), StatusCode::OK);
            assert_eq!(r.headers()[&GRPC_STATUS], code, "{status}");
            assert_eq!(r.headers()[CONTENT_TYPE], "application/grpc");
        }
    }
}
