//! The Redis backend against real `redis-server` processes (plain, with redis-cell, TLS, a
//! 3-master Cluster): decisions, algorithms, failures, modes through the layer, offender counts, and
//! the harness that starts those servers (`tests/support/redis.rs`).

#[path = "../support/mod.rs"]
mod support;

/// The test of several keys in one decision, shared with `tests/middleware/multikey.rs`.
#[allow(dead_code)]
#[path = "../shared/multikey.rs"]
mod multikey_shared;

/// The scripts exactly as the backend assembles them (shebang, prelude, body).
#[path = "../../src/backend/redis/wire/lua.rs"]
#[allow(dead_code)]
mod lua;

/// The client's expansion of `gcra_batch.lua`'s reply (one backlog per group) into each item's reply.
#[path = "../../src/backend/redis/speedup/gcra_group.rs"]
mod gcra_group;

mod algorithms;
mod auto_without_command;
mod backend;
mod batch;
mod batch_limits;
mod budget;
mod calendar;
mod cluster_failover;
mod cluster_lazy;
mod cluster_resharding;
mod cluster_tryagain;
mod count_outcome;
mod failover;
mod failure;
mod faults;
mod full;
mod harness;
mod limits_batch_parity;
mod metered;
mod metered_parity;
mod modes_on_backends;
mod multikey;
mod offenders;
mod peek_reset;
mod replication_loss;
mod reset_broadcast;
mod rollout;
mod sentinel;
mod top;
mod window_start;
