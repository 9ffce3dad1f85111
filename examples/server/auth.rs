//! The admin listener's token (`--admin-token-env NAME` or `[admin] token_env`): with one, every
//! admin request needs `Authorization: Bearer <token>`, else 401 — but the page at `/`, which is
//! static and holds no data (a browser cannot send a bearer token when it navigates): the page
//! asks for the token and sends it with every call it makes.
//!
//! The comparison takes the same time whatever the request sends: both sides are hashed with
//! SHA-256 and the digests compared byte by byte without an early exit, so neither a wrong prefix
//! nor a wrong length answers sooner.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use sha2::{Digest, Sha256};

/// The expected token's digest (the token itself is not kept).
#[derive(Clone)]
pub struct AdminToken(Arc<[u8; 32]>);

impl AdminToken {
    pub fn new(token: &str) -> Self {
        AdminToken(Arc::new(Sha256::digest(token.as_bytes()).into()))
    }

    /// Whether `offered` is the token, in time independent of where they differ.
    fn matches(&self, offered: &[u8]) -> bool {
        let offered: [u8; 32] = Sha256::digest(offered).into();
        let diff = self
            .0
            .iter()
            .zip(offered.iter())
            .fold(0u8, |acc, (a, b)| acc | (a ^ b));
        std::hint::black_box(diff) == 0
    }
}

/// `axum::middleware::from_fn_with_state` over the admin router: 401 unless the request carries
/// `Authorization: Bearer <token>`.
pub async fn require_token(
    State(token): State<AdminToken>,
    request: Request,
    next: Next,
) -> Response {
    let offered = request.headers().get(header::AUTHORIZATION).and_then(|v| {
        // The scheme's name is case-insensitive (RFC 9110 §11.1).
        let (scheme, token) = v.as_bytes().split_at_checked(7)?;
        scheme.eq_ignore_ascii_case(b"Bearer ").then_some(token)
    });
    match offered {
        Some(offered) if token.matches(offered) => next.run(request).await,
        _ => (
            StatusCode::UNAUTHORIZED,
            [(
                header::WWW_AUTHENTICATE,
                "Bearer realm=\"tower-throttle admin\"",
            )],
            axum::Json(serde_json::json!({
                "error": "this admin listener needs Authorization: Bearer <token>"
            })),
        )
            .into_response(),
    }
}

/// Over a token-less admin listener (loopback only): 403 for a request a web page made the
/// operator's browser send — from another site (`Origin`, `Sec-Fetch-Site`), or through a name
/// that resolves to this machine (DNS rebinding: a `Host` that is not a loopback one). A simple
/// cross-site POST needs no preflight, and `/reload?clear_overrides=true` takes no body.
pub async fn same_machine_only(request: Request, next: Next) -> Response {
    let headers = request.headers();
    // Every value of the header passes: one that is not text (no browser sends such bytes) or a
    // second line fails closed, as a missing header passes.
    let all = |name: &str, ok: fn(&str) -> bool| {
        let mut values = headers.get_all(name).iter();
        values.all(|v| v.to_str().is_ok_and(ok))
    };
    let host_ok = all(header::HOST.as_str(), is_loopback);
    let origin_ok = all(header::ORIGIN.as_str(), |origin| {
        let host = origin
            .strip_prefix("http://")
            .or(origin.strip_prefix("https://"));
        host.is_some_and(is_loopback)
    });
    let site_ok = all("sec-fetch-site", |site| {
        !site.eq_ignore_ascii_case("cross-site")
    });
    if host_ok && origin_ok && site_ok {
        return next.run(request).await;
    }
    let error = "this admin listener answers requests made on this machine only \
                 (a loopback Host and Origin): set a token to reach it otherwise";
    (
        StatusCode::FORBIDDEN,
        axum::Json(serde_json::json!({ "error": error })),
    )
        .into_response()
}

/// Whether `authority` (`host[:port]`) names this machine: `localhost`, 127.0.0.0/8 or `[::1]`,
/// and nothing after it but a port (`localhost:80@evil.example` names another host).
fn is_loopback(authority: &str) -> bool {
    let (host, port) = match authority.strip_prefix('[') {
        Some(v6) => v6.split_once(']').unwrap_or(("", "?")),
        None => {
            let host = authority.split(':').next().unwrap_or("");
            (host, &authority[host.len()..])
        }
    };
    let port_ok = port.is_empty()
        || port
            .strip_prefix(':')
            .is_some_and(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()));
    port_ok
        && (host.eq_ignore_ascii_case("localhost")
            || host
                .parse::<std::net::IpAddr>()
                .is_ok_and(|ip| ip.is_loopback()))
}
