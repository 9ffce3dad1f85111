//! The layer's log events, in a binary of their own: `tracing` caches per call site whether anyone
//! listens, so a test without a subscriber running in the same process could make the log test miss
//! its events. (The `on_limited` hook is in `tests/middleware/observe.rs`, the metrics in
//! `tests/http/example_server.rs`: neither needs a process of its own.)

#[path = "../support/mod.rs"]
mod support;

mod logs;
mod redaction;
