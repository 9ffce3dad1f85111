//! The example server's admin listener (`--admin ADDR`, off by default; keep it on loopback or a
//! private network: it can lift any client's limit).
//!
//! ```text
//! GET    /limits/{policy}/{key}   a key's state, without consuming anything (JSON)
//! DELETE /limits/{policy}/{key}   forget the key's state, strikes and penalty ban (204; a timed
//!                                 ban stays: DELETE /bans/…)
//! POST   /reload                  re-read the --config file (200, or 400 with the error: the running
//!                                 policies stay in force); `?clear_overrides=true` also removes the
//!                                 policy-wide overrides (`*`), which otherwise stay in force
//! GET    /health                  the backend's state (200 when it decides, 503 when it cannot)
//! GET    /top/{policy}?n=20       the keys the policy limited most over the last few minutes (JSON)
//! GET    /overview                policies, quotas, allowed/limited per second, health (JSON)
//! GET    /overload                the overload gate: its limit, in flight and shed (JSON)
//! …      /overrides/…, /bans/…    overrides and timed bans (see `overrides.rs`)
//! GET    /                        the admin page (static; it calls the routes above)
//! ```
//!
//! With a token (`--admin-token-env`, `[admin] token_env`; see `auth.rs`), every route but the
//! static page answers 401 without `Authorization: Bearer <token>`.
//!
//! `{key}` is what the policy extracts: the `x-user-id` value for `key = "header:x-user-id"`, an
//! address for `key = "ip"`, the values joined by `|` for a composite key. SIGHUP reloads as
//! `POST /reload` does.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{json, Value};
use tower_throttle::config::{BackendConfig, Config, ConfiguredBackend};
use tower_throttle::key::KeySpec;
use tower_throttle::{
    backend::KeyState,
    ops::{HandleError, ThrottleHandle},
};

/// What the admin endpoints share: the layer's handle, and how to reload.
#[derive(Clone)]
pub struct Admin {
    pub(crate) handle: ThrottleHandle<KeySpec, ConfiguredBackend>,
    pub(crate) backend: ConfiguredBackend,
    reload: Arc<Reloader>,
    /// Allowed and limited per second, for the page.
    pub(crate) history: Arc<crate::view::History>,
}

/// Re-reads the `--config` file and applies its routes to the running layer.
pub struct Reloader {
    /// The file; `None` with the built-in config (nothing to re-read).
    path: Option<String>,
    /// The configuration in force, as the server applied it (with `--redis`, its backend).
    running: Mutex<Config>,
    /// What `--redis` put in place of the file's `[backend]`, applied to every re-read file too.
    backend_override: Option<BackendConfig>,
    /// The paths the server routes: a reload cannot add or remove one (the router is built once).
    paths: BTreeSet<String>,
}

/// Reloads, by result (`ok`, `error`): from `POST /reload` and SIGHUP.
pub const RELOADS: &str = "throttle_config_reloads_total";

/// Shows both series at 0 from start-up, so that an alert on their increase has a baseline.
pub fn register_reload_metrics() {
    for result in ["ok", "error"] {
        metrics::counter!(RELOADS, "result" => result).increment(0);
    }
}

impl Reloader {
    pub fn new(
        path: Option<String>,
        running: Config,
        backend_override: Option<BackendConfig>,
    ) -> Self {
        let paths = route_paths(&running);
        Reloader {
            path,
            running: Mutex::new(running),
            backend_override,
            paths,
        }
    }

    /// Reloads the routes of the `--config` file: `Ok` with how many policies are in force, or why
    /// nothing changed.
    pub fn reload(
        &self,
        handle: &ThrottleHandle<KeySpec, ConfiguredBackend>,
    ) -> Result<usize, String> {
        let outcome = self.reload_file(handle);
        // Counted for the alert on failed reloads (ops/alerts.yml): a file that does not load
        // is not what runs. Without a file there is nothing to count.
        if self.path.is_some() {
            let result = if outcome.is_ok() { "ok" } else { "error" };
            metrics::counter!(RELOADS, "result" => result).increment(1);
        }
        outcome
    }

    fn reload_file(
        &self,
        handle: &ThrottleHandle<KeySpec, ConfiguredBackend>,
    ) -> Result<usize, String> {
        let Some(path) = &self.path else {
            return Err(
                "the server runs the built-in config: start it with --config FILE to reload".into(),
            );
        };
        // Held from the read on: of two reloads at once, the later file is the one in force.
        let mut running = self.running.lock().unwrap_or_else(|e| e.into_inner());
        // On one line, as at start-up: a TOML error's excerpt would split the log line.
        let source = crate::Source(path.clone());
        let text = tokio::task::block_in_place(|| std::fs::read_to_string(path))
            .map_err(|e| source.error(e))?;
        let mut config = Config::from_toml(&text).map_err(|e| source.error(e))?;
        if let Some(backend) = &self.backend_override {
            config.backend = backend.clone();
        }
        let paths = route_paths(&config);
        if paths != self.paths {
            let added: Vec<&String> = paths.difference(&self.paths).collect();
            let removed: Vec<&String> = self.paths.difference(&paths).collect();
            return Err(format!(
                "{path}: the server routes the paths it started with; restart to change them (added {added:?}, removed {removed:?})"
            ));
        }
        let config = handle
            .reload_config_checked(&running, config)
            .map_err(|e| source.error(e))?;
        let policies = config.routes.len();
        *running = config;
        Ok(policies)
    }
}

fn route_paths(config: &Config) -> BTreeSet<String> {
    config
        .routes
        .iter()
        .filter_map(|r| r.path.clone())
        .collect()
}

impl Admin {
    pub fn new(
        handle: ThrottleHandle<KeySpec, ConfiguredBackend>,
        backend: ConfiguredBackend,
        reload: Arc<Reloader>,
        history: Arc<crate::view::History>,
    ) -> Self {
        Admin {
            handle,
            backend,
            reload,
            history,
        }
    }

    /// The admin endpoints, behind `token` when there is one, and the page at `/` (static: it
    /// holds no data, and a browser cannot send a bearer token when it navigates).
    pub fn router(self, token: Option<crate::auth::AdminToken>) -> Router {
        let api = Router::new()
            .route("/limits/{policy}/{*key}", get(peek).delete(reset))
            .route("/reload", post(reload))
            .route("/health", get(health))
            .route("/top/{policy}", get(crate::view::top))
            .route("/overview", get(crate::view::overview))
            .route("/overload", get(crate::view::overload))
            .merge(crate::overrides::routes())
            .with_state(self);
        let api = match token {
            Some(token) => api.layer(axum::middleware::from_fn_with_state(
                token,
                crate::auth::require_token,
            )),
            None => api.layer(axum::middleware::from_fn(crate::auth::same_machine_only)),
        };
        api.route("/", get(crate::view::page))
    }
}

/// Reloads on every SIGHUP, logging the outcome (Unix only): with or without the admin listener,
/// as a SIGHUP nobody listens for ends the process (and its state file is not saved).
pub fn reload_on_sighup(handle: ThrottleHandle<KeySpec, ConfiguredBackend>, reload: Arc<Reloader>) {
    #[cfg(unix)]
    {
        let Ok(mut hangups) =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
        else {
            tracing::warn!("cannot listen for SIGHUP; reload with POST /reload");
            return;
        };
        tokio::spawn(async move {
            while hangups.recv().await.is_some() {
                match reload.reload(&handle) {
                    Ok(n) => tracing::info!(policies = n, "SIGHUP: configuration reloaded"),
                    Err(e) => {
                        tracing::warn!(error = %e, "SIGHUP: reload refused; the running configuration stays in force")
                    }
                }
            }
        });
    }
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

fn state_json(state: &KeyState) -> Value {
    json!({
        "limit": state.limit,
        "remaining": state.remaining,
        "reset_after_ms": ms(state.reset_after),
        "retry_after_ms": state.retry_after.map(ms),
        "banned": state.banned.is_some(),
        "ban_remaining_ms": state.banned.map(ms),
    })
}

pub(crate) fn error(status: StatusCode, message: impl Into<String>) -> Response {
    (status, Json(json!({ "error": message.into() }))).into_response()
}

pub(crate) fn handle_error(e: HandleError) -> Response {
    let status = match &e {
        HandleError::UnknownPolicy(_) | HandleError::NotCounted => StatusCode::NOT_FOUND,
        HandleError::InvalidKey { .. } => StatusCode::BAD_REQUEST,
        _ => StatusCode::SERVICE_UNAVAILABLE,
    };
    error(status, e.to_string())
}

/// `GET /limits/{policy}/{key}`: the default tier's state (`limit`, `remaining`, `reset_after_ms`,
/// `banned`...), and every tier's limits.
async fn peek(State(admin): State<Admin>, Path((policy, key)): Path<(String, String)>) -> Response {
    match admin.handle.peek(&policy, &key).await {
        Ok(state) => {
            let mut body = state_json(&state.summary());
            body["policy"] = json!(state.policy);
            body["key"] = json!(key);
            // An operator's timed ban (`PUT /bans`) and override (`PUT /overrides`) in force; with
            // the penalty box's ban too, the key is refused until the later one ends.
            if let Some(until) = state.banned_until {
                let rest = until.duration_since(std::time::SystemTime::now());
                let penalty = state.summary().banned.unwrap_or_default();
                body["banned"] = json!(true);
                body["ban_remaining_ms"] = json!(ms(rest.unwrap_or_default().max(penalty)));
            }
            body["override"] = json!(state.override_in_force.map(|o| o.to_string()));
            body["tiers"] = state
                .tiers
                .iter()
                .map(|tier| {
                    json!({
                        "tier": tier.tier,
                        "limits": tier.limits.iter().map(|(name, s)| {
                            let mut limit = state_json(s);
                            limit["name"] = json!(name);
                            limit
                        }).collect::<Vec<_>>(),
                    })
                })
                .collect();
            Json(body).into_response()
        }
        Err(e) => handle_error(e),
    }
}

/// `DELETE /limits/{policy}/{key}`: 204 once the key is forgotten.
async fn reset(
    State(admin): State<Admin>,
    Path((policy, key)): Path<(String, String)>,
) -> Response {
    match admin.handle.reset(&policy, &key).await {
        Ok(()) => {
            tracing::info!(policy = %policy, "admin: a key was reset");
            StatusCode::NO_CONTENT.into_response()
        }
        Err(e) => handle_error(e),
    }
}

#[derive(serde::Deserialize)]
struct ReloadQuery {
    #[serde(default)]
    clear_overrides: bool,
}

/// `POST /reload`: 200 with the number of policies in force, or 400 with why nothing changed.
/// A policy-wide quota set at run time (the override `*`) stays in force over the file's, unless
/// `?clear_overrides=true` removes every policy's.
async fn reload(State(admin): State<Admin>, Query(query): Query<ReloadQuery>) -> Response {
    match admin.reload.reload(&admin.handle) {
        Ok(policies) => {
            tracing::info!(policies, "admin: configuration reloaded");
            // Every policy's `*` tried, whatever fails: the reload is in force either way, and
            // the answer says which could not be cleared (to try again).
            let mut not_cleared = Vec::new();
            if query.clear_overrides {
                for policy in admin.handle.policies().iter() {
                    if let Err(e) = admin.handle.remove_override(policy.name(), "*").await {
                        not_cleared
                            .push(json!({ "policy": policy.name(), "error": e.to_string() }));
                    }
                }
            }
            let mut body = json!({ "reloaded": true, "policies": policies });
            if !not_cleared.is_empty() {
                body["overrides_not_cleared"] = json!(not_cleared);
            }
            Json(body).into_response()
        }
        Err(e) => {
            tracing::warn!(error = %e, "admin: reload refused; the running configuration stays in force");
            error(StatusCode::BAD_REQUEST, e)
        }
    }
}

/// `GET /health`: the backend's state; 503 while decisions cannot come from it.
async fn health(State(admin): State<Admin>) -> Response {
    crate::health_response(&admin.backend)
}
