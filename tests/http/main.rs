//! The middleware against real servers: the example server over TCP (its runs, its command-line
//! errors, its admin page in headless Chromium, its alerting rules under promtool), the README's
//! Quick start built as a scratch crate, and the middleware's tests that need a Redis server.
//! `cargo test` alone does not build it: `bash scripts/test.sh` sets up what it needs and runs it
//! (`cargo test --all-features --test http` after a set-up). One file per concern.

// The example server's own `[admin]` and `[server]` tables (each binary uses part of it).
#[allow(dead_code)]
#[path = "../../examples/server/settings.rs"]
mod server_settings;
#[path = "../shared/mod.rs"]
mod shared;
#[path = "../support/mod.rs"]
mod support;

mod access_on_redis;
mod admin_handle_on_redis;
mod admin_page;
mod body_keys_on_redis;
mod conditions_on_redis;
mod example_server;
mod example_server_admin;
mod example_server_cli;
mod example_server_cluster;
mod example_server_edge;
mod example_server_heads;
mod example_server_login;
mod example_server_overrides;
mod example_server_reload_errors;
mod example_server_sentinel_tls;
mod example_server_state;
mod example_server_token;
mod example_server_tokens;
mod example_server_top;
mod guide_config_on_redis;
mod ops;
mod overrides_on_redis;
mod penalty_on_redis;
mod readme_quickstart;
mod redis_full;
mod refusals_on_redis;
