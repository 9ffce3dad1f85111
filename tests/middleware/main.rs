//! The middleware in process, with nothing installed: the layer in axum, hyper and tonic apps, its
//! contract as a tower service, keys behind proxies, access lists, penalties, modes, refusals,
//! rollouts, metered limits, the `on_limited` hook, the handle, the guide's configuration (and its
//! reference, complete), and route matching against axum's router. `cargo test` runs it; what
//! needs a Redis server, the example server, Chromium or promtool is in the `http` binary. One
//! file per concern.

// The example server's own `[admin]` and `[server]` tables (each binary uses part of it).
#[allow(dead_code)]
#[path = "../../examples/server/settings.rs"]
mod server_settings;
#[path = "../shared/mod.rs"]
mod shared;
#[path = "../support/mod.rs"]
mod support;

mod access;
mod admin_handle;
mod axum_body;
mod body_keys;
mod calendar;
mod concurrency;
mod conditions;
mod config_builder;
mod config_reference;
mod contract;
mod count_outcome;
mod failure_local;
mod front;
mod grpc;
mod guide_config;
mod hyper;
mod jitter;
mod key_sources;
mod layer;
mod messages;
mod metered;
mod modes;
mod multikey;
mod near_limit;
mod observe;
mod overload;
mod overrides;
mod penalty;
mod per_customer;
mod plain_admission;
mod refusals;
mod rollout;
mod route_matching;
mod spoofing;
