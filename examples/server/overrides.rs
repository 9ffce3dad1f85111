//! The admin listener's overrides and timed bans (see `admin.rs` for the listener):
//!
//! ```text
//! GET    /overrides/{policy}          the policy's overrides (JSON list)
//! PUT    /overrides/{policy}/{key}    set one: {"count":1000,"period":"1m"}, {"unlimited":true} or
//!                                     {"blocked":true} (204); {key}: a key, a pattern `premium_*`,
//!                                     or `*` for every key of the policy
//! DELETE /overrides/{policy}/{key}    remove it (204)
//! GET    /bans/{policy}               the policy's timed bans that have not ended (JSON list)
//! PUT    /bans/{policy}/{key}?for=1h  ban the key (or pattern) for that long (204)
//! DELETE /bans/{policy}/{key}         lift the ban (204)
//! ```
//!
//! On Redis every process sharing it applies a change within a second, and they outlive restarts.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{json, Value};
use tower_throttle::ops::{HandleError, Override};
use tower_throttle::Quota;

use crate::admin::{error, handle_error, Admin};

/// The routes, to merge into the admin router.
pub fn routes() -> Router<Admin> {
    Router::new()
        .route("/overrides/{policy}", get(list_overrides))
        .route(
            "/overrides/{policy}/{*key}",
            axum::routing::put(set_override).delete(remove_override),
        )
        .route("/bans/{policy}", get(list_bans))
        .route(
            "/bans/{policy}/{*key}",
            axum::routing::put(ban).delete(lift_ban),
        )
}

/// The body of `PUT /overrides/…`: exactly one of a quota, `unlimited` or `blocked`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct OverrideBody {
    count: Option<u64>,
    period: Option<String>,
    #[serde(default)]
    unlimited: bool,
    #[serde(default)]
    blocked: bool,
}

impl OverrideBody {
    fn parse(self) -> Result<Override, String> {
        match (self.count, self.period, self.unlimited, self.blocked) {
            (Some(count), Some(period), false, false) => {
                let period = humantime::parse_duration(&period)
                    .map_err(|e| format!("period {period:?}: {e}"))?;
                Ok(Override::Quota(Quota::per_period(count, period)))
            }
            (None, None, true, false) => Ok(Override::Unlimited),
            (None, None, false, true) => Ok(Override::Blocked),
            _ => Err(
                "give {\"count\":N,\"period\":\"1m\"}, {\"unlimited\":true} or {\"blocked\":true}"
                    .to_owned(),
            ),
        }
    }
}

fn override_json(key: &str, value: &Override) -> Value {
    match value {
        Override::Quota(q) => json!({
            "key": key,
            "count": q.count(),
            "period_ms": u64::try_from(q.period().as_millis()).unwrap_or(u64::MAX),
        }),
        Override::Unlimited => json!({ "key": key, "unlimited": true }),
        Override::Blocked => json!({ "key": key, "blocked": true }),
        _ => json!({ "key": key, "other": value.to_string() }),
    }
}

fn refused(e: HandleError) -> Response {
    match e {
        HandleError::InvalidOverride { .. } => error(StatusCode::BAD_REQUEST, e.to_string()),
        e => handle_error(e),
    }
}

async fn list_overrides(State(admin): State<Admin>, Path(policy): Path<String>) -> Response {
    match admin.handle.overrides(&policy) {
        Ok(all) => Json(
            all.iter()
                .map(|(key, value)| override_json(key, value))
                .collect::<Vec<_>>(),
        )
        .into_response(),
        Err(e) => refused(e),
    }
}

async fn set_override(
    State(admin): State<Admin>,
    Path((policy, key)): Path<(String, String)>,
    body: Result<Json<OverrideBody>, axum::extract::rejection::JsonRejection>,
) -> Response {
    let value = match body.map_err(|e| e.body_text()).and_then(|b| b.0.parse()) {
        Ok(value) => value,
        Err(why) => return error(StatusCode::BAD_REQUEST, why),
    };
    match admin.handle.set_override(&policy, &key, value).await {
        Ok(()) => StatusCode::NO_CONTENT.into_response(),
        Err(e) => refused(e),
    }
}

async fn remove_override(
    State(admin): State<Admin>,
    Path((policy, key)): Path<(String, String)>,
) -> Response {
    match admin.handle.remove_override(&policy, &key).await {
        Ok(()) => StatusCode::NO_CONTENT.into_response(),
        Err(e) => refused(e),
    }
}

fn unix_ms(at: SystemTime) -> u64 {
    let ms = at
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_millis();
    u64::try_from(ms).unwrap_or(u64::MAX)
}

async fn list_bans(State(admin): State<Admin>, Path(policy): Path<String>) -> Response {
    let now = SystemTime::now();
    match admin.handle.bans(&policy) {
        Ok(all) => Json(
            all.iter()
                .map(|(key, until)| {
                    let rest = until.duration_since(now).unwrap_or_default();
                    json!({
                        "key": key,
                        "until_unix_ms": unix_ms(*until),
                        "remaining_ms": u64::try_from(rest.as_millis()).unwrap_or(u64::MAX),
                    })
                })
                .collect::<Vec<_>>(),
        )
        .into_response(),
        Err(e) => refused(e),
    }
}

#[derive(Deserialize)]
struct BanQuery {
    #[serde(rename = "for")]
    duration: Option<String>,
}

async fn ban(
    State(admin): State<Admin>,
    Path((policy, key)): Path<(String, String)>,
    Query(query): Query<BanQuery>,
) -> Response {
    let Some(text) = query.duration else {
        return error(StatusCode::BAD_REQUEST, "say for how long: ?for=1h");
    };
    let duration: Duration = match humantime::parse_duration(&text) {
        Ok(d) => d,
        Err(e) => return error(StatusCode::BAD_REQUEST, format!("for={text:?}: {e}")),
    };
    match admin.handle.ban(&policy, &key, duration).await {
        Ok(_) => StatusCode::NO_CONTENT.into_response(),
        Err(e) => refused(e),
    }
}

async fn lift_ban(
    State(admin): State<Admin>,
    Path((policy, key)): Path<(String, String)>,
) -> Response {
    match admin.handle.lift_ban(&policy, &key).await {
        Ok(()) => StatusCode::NO_CONTENT.into_response(),
        Err(e) => refused(e),
    }
}
