//! The middleware over HTTP: the layer in axum, hyper and tonic apps, its contract as a tower
//! service, keys behind proxies, access lists, penalties, modes, the `on_limited` hook, the example
//! server over real TCP (its runs and its command-line errors), the guide's configuration (and
//! its reference, complete), the README's Quick start (built as a scratch crate), and route matching against axum's router. One binary: each file below is one concern.

#[path = "../support/mod.rs"]
mod support;

mod access;
mod admin_handle;
mod admin_page;
mod concurrency;
mod config_builder;
mod config_reference;
mod contract;
mod count_outcome;
mod example_server;
mod example_server_admin;
mod example_server_cli;
mod example_server_cluster;
mod example_server_edge;
mod example_server_heads;
mod example_server_reload_errors;
mod example_server_sentinel_tls;
mod example_server_token;
mod example_server_tokens;
mod example_server_top;
mod grpc;
mod guide_config;
mod hyper;
mod key_sources;
mod layer;
mod metered;
mod modes;
mod observe;
mod ops;
mod penalty;
mod per_customer;
mod readme_quickstart;
mod redis_full;
mod refusals;
mod rollout;
mod route_matching;
mod spoofing;
