//! RFC 9112 §3.2: a server must answer 400 to an HTTP/1.1 request without a `Host` field, and to
//! any request with more than one. hyper leaves that to the application; this is the example
//! server's outermost layer, so it holds for every route, `/metrics` included, before any limit.
//! (HTTP/2 carries the authority in `:authority`; HTTP/1.0 may omit `Host`.)

use axum::extract::Request;
use axum::http::{header, StatusCode, Version};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

/// Passes requests whose `Host` is as RFC 9112 wants it; answers 400 to the others.
pub(crate) async fn require_host(request: Request, next: Next) -> Response {
    let hosts = request.headers().get_all(header::HOST).iter().count();
    let missing = hosts == 0 && request.version() == Version::HTTP_11;
    if missing || hosts > 1 {
        let why = if missing {
            "an HTTP/1.1 request needs one Host header\n"
        } else {
            "a request may carry only one Host header\n"
        };
        return (StatusCode::BAD_REQUEST, why).into_response();
    }
    next.run(request).await
}
