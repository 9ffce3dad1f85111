//! What tests/middleware/refusals.rs and tests/http/refusals_on_redis.rs share.

use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::Response;
use tower_throttle::refusal::{Refusal, RefusalKind};

pub(crate) type Log = Arc<Mutex<Vec<Seen>>>;

/// Records what it sees; answers HTML to browsers and the layer's own answer to everyone else.
pub(crate) fn negotiating_hook(
    log: Log,
) -> impl Fn(&Refusal<'_>) -> Response<Bytes> + Send + Sync + 'static {
    move |r: &Refusal<'_>| {
        log.lock().unwrap().push(Seen {
            kind: r.kind(),
            status: r.status().as_u16(),
            policy: r.policy().map(str::to_owned),
            key: r.key().map(|k| k.to_string()),
            retry_after_secs: r.retry_after().map(|d| d.as_secs_f64().ceil() as u64),
            method: r.method().to_string(),
            path: r.uri().path().to_owned(),
            banned: r.decision().map(|d| d.banned),
        });
        if !r.prefers_html() {
            return r.default_response();
        }
        let mut response = Response::new(Bytes::from(format!(
            "<h1>{}</h1><p>{}</p>",
            r.status().as_u16(),
            r.detail()
        )));
        *response.status_mut() = r.status();
        response
            .headers_mut()
            .insert("content-type", "text/html".parse().unwrap());
        response
    }
}

/// What the hook saw of one refusal.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Seen {
    pub(crate) kind: RefusalKind,
    pub(crate) status: u16,
    pub(crate) policy: Option<String>,
    pub(crate) key: Option<String>,
    pub(crate) retry_after_secs: Option<u64>,
    pub(crate) method: String,
    pub(crate) path: String,
    pub(crate) banned: Option<bool>,
}
