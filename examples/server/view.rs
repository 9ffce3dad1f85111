//! What the admin listener shows: the page at `/` (`admin_page.html`, one static file, plain JS),
//! `GET /top/{policy}?n=20` (the keys a policy limited most over the last few minutes), and
//! `GET /overview` (the policies with their quotas, allowed and limited per second over the last
//! minutes, the backend's health) that the page draws.
//!
//! The rates come from the server's own Prometheus counters (`throttle_requests_allowed_total`,
//! `throttle_requests_limited_total`), sampled every [`SAMPLE_EVERY`] into a ring of
//! [`HISTORY`] — the page works without a Prometheus server.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::extract::{Path, Query, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use metrics_exporter_prometheus::PrometheusHandle;
use serde_json::{json, Value};
use tower_throttle::ops::{MAX_TOP, TOP_WINDOW_MINUTES};

use crate::admin::Admin;

/// The page, built into the binary: no build step, no files to ship.
const PAGE: &str = include_str!("admin_page.html");

/// How often the counters are sampled.
pub const SAMPLE_EVERY: Duration = Duration::from_secs(2);
/// How far back the rates go.
pub const HISTORY: Duration = Duration::from_secs(10 * 60);
/// `?n=` when absent.
const DEFAULT_TOP: usize = 20;

/// Per policy, the counters' totals at one instant.
#[derive(Clone)]
struct Sample {
    unix_ms: u64,
    totals: BTreeMap<String, (u64, u64)>,
}

/// The samples of the last [`HISTORY`], oldest first.
#[derive(Default)]
pub struct History(Mutex<VecDeque<Sample>>);

impl History {
    /// Samples `metrics` every [`SAMPLE_EVERY`] for as long as the history is kept.
    pub fn start(metrics: PrometheusHandle) -> Arc<History> {
        let history = Arc::new(History::default());
        let weak = Arc::downgrade(&history);
        tokio::spawn(async move {
            let mut every = tokio::time::interval(SAMPLE_EVERY);
            every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                every.tick().await;
                let Some(history) = weak.upgrade() else {
                    return;
                };
                history.sample(&metrics.render());
            }
        });
        history
    }

    fn sample(&self, exposition: &str) {
        let mut totals: BTreeMap<String, (u64, u64)> = BTreeMap::new();
        for line in exposition.lines() {
            let (name, at) =
                if let Some(rest) = line.strip_prefix("throttle_requests_allowed_total{") {
                    (rest, 0)
                } else if let Some(rest) = line.strip_prefix("throttle_requests_limited_total{") {
                    (rest, 1)
                } else {
                    continue;
                };
            // `policy="NAME"} VALUE`: the only label of these counters.
            let Some((labels, value)) = name.rsplit_once("} ") else {
                continue;
            };
            let Some(policy) = labels
                .strip_prefix("policy=\"")
                .and_then(|p| p.strip_suffix('"'))
            else {
                continue;
            };
            let value = value.trim().parse::<f64>().unwrap_or(0.0) as u64;
            let entry = totals.entry(policy.replace("\\\"", "\"")).or_default();
            if at == 0 {
                entry.0 = value;
            } else {
                entry.1 = value;
            }
        }
        let mut samples = self.0.lock().unwrap_or_else(|e| e.into_inner());
        samples.push_back(Sample {
            unix_ms: unix_ms(),
            totals,
        });
        let keep = (HISTORY.as_millis() / SAMPLE_EVERY.as_millis()) as usize + 1;
        while samples.len() > keep {
            samples.pop_front();
        }
    }

    /// Per sample after the first: its time, and per policy the allowed and limited requests per
    /// second since the one before.
    fn rates(&self) -> Vec<Value> {
        let samples = self.0.lock().unwrap_or_else(|e| e.into_inner());
        samples
            .iter()
            .zip(samples.iter().skip(1))
            .map(|(before, after)| {
                let seconds = (after.unix_ms.saturating_sub(before.unix_ms)).max(1) as f64 / 1000.0;
                let policies: serde_json::Map<String, Value> = after
                    .totals
                    .iter()
                    .map(|(policy, &(allowed, limited))| {
                        let (a0, l0) = before.totals.get(policy).copied().unwrap_or_default();
                        let rate = |now: u64, then: u64| now.saturating_sub(then) as f64 / seconds;
                        (
                            policy.clone(),
                            json!({ "allowed": rate(allowed, a0), "limited": rate(limited, l0) }),
                        )
                    })
                    .collect();
                json!({ "unix_ms": after.unix_ms, "policies": policies })
            })
            .collect()
    }
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// `GET /`: the page. It holds no data: everything it shows comes from the guarded endpoints.
/// Never framed: another site framing it could lead an operator's clicks to lift a ban (its
/// requests would come from the operator's machine).
pub async fn page() -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-store"),
            (header::X_FRAME_OPTIONS, "DENY"),
            (header::CONTENT_SECURITY_POLICY, "frame-ancestors 'none'"),
        ],
        PAGE,
    )
        .into_response()
}

#[derive(serde::Deserialize)]
pub struct TopQuery {
    n: Option<usize>,
}

/// `GET /top/{policy}?n=20`: `[{"key": "...", "limited": N}, ...]`, largest first, over the last
/// `TOP_WINDOW_MINUTES` minutes (the current one included); `n` at most `MAX_TOP`.
pub async fn top(
    State(admin): State<Admin>,
    Path(policy): Path<String>,
    Query(query): Query<TopQuery>,
) -> Response {
    let n = query.n.unwrap_or(DEFAULT_TOP);
    if n == 0 || n > MAX_TOP {
        return crate::admin::error(
            StatusCode::BAD_REQUEST,
            format!("n = {n}: ask for 1 to {MAX_TOP} keys"),
        );
    }
    match admin.handle.top(&policy, n).await {
        Ok(top) => Json(
            top.iter()
                .map(|t| json!({ "key": t.key, "limited": t.limited }))
                .collect::<Vec<_>>(),
        )
        .into_response(),
        Err(e) => crate::admin::handle_error(e),
    }
}

/// `GET /overload`: the overload gate's limit, requests in flight and shed per partition (`null`
/// without `[overload]`).
pub async fn overload(State(admin): State<Admin>) -> Response {
    Json(overload_json(&admin)).into_response()
}

fn overload_json(admin: &Admin) -> Value {
    let Some(gate) = admin.handle.overload() else {
        return Value::Null;
    };
    let partitions: Vec<Value> = gate
        .partitions()
        .enumerate()
        .map(|(i, name)| {
            json!({
                "name": name,
                "share": gate.share_of(i),
                "in_flight": gate.in_flight_of(i),
                "shed": gate.shed_of(i),
            })
        })
        .collect();
    json!({
        "limit": gate.limit(),
        "in_flight": gate.in_flight(),
        "pressed": gate.is_pressed(),
        "partitions": partitions,
    })
}

/// `GET /overview`: what the page draws.
pub async fn overview(State(admin): State<Admin>) -> Response {
    let policies: Vec<Value> = admin
        .handle
        .policies()
        .iter()
        .map(|policy| {
            json!({
                "name": policy.name(),
                "route": policy.route(),
                "limits": policy.limits().iter().map(|limit| {
                    let quota = limit.quota();
                    json!({
                        "name": limit.name(),
                        "algorithm": limit.algorithm().as_str(),
                        "count": quota.count(),
                        "period_ms": quota.period().as_millis() as u64,
                        "burst": quota.limit(),
                    })
                }).collect::<Vec<_>>(),
            })
        })
        .collect();
    let (up, health) = crate::health_json(&admin.backend);
    Json(json!({
        "policies": policies,
        "health": health,
        "up": up,
        "top_window_minutes": TOP_WINDOW_MINUTES,
        "sample_every_ms": SAMPLE_EVERY.as_millis() as u64,
        "rates": admin.history.rates(),
        "overload": overload_json(&admin),
    }))
    .into_response()
}
