//! What a middleware test file (`tests/middleware/<name>.rs`) shares with its tests that need a
//! Redis server (`tests/http/<name>_on_redis.rs`): one module per file, included by those two
//! binaries only.
#![allow(dead_code)]

pub mod access;
pub mod admin_handle;
pub mod body_keys;
pub mod conditions;
pub mod guide_config;
pub mod multikey;
pub mod overrides;
pub mod penalty;
pub mod refusals;
