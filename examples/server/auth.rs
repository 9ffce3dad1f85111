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
    let offered = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.as_bytes().strip_prefix(b"Bearer "));
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
