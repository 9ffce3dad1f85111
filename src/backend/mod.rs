//! Backends: where decisions are made and key state lives: the [`Backend`] trait, its futures
//! and the in-memory backend (the Redis backend is in [`redis`](crate::redis)).
//!
//! A [`Backend`] answers one question, asynchronously: may these [`Charges`] (each `quantity` units
//! for a `key` under a `limit`) pass now, all together? The [`Limit`](crate::Limit) carries the
//! algorithm and the quota, so that one backend serves every policy of an application and later
//! algorithms fit without changing the trait.
//!
//! The backends, one directory or file each: `memory/` (one process: the GCRA table and the
//! general store), `redis/` (many processes: `CL.THROTTLE` or Lua, one server or a Cluster), and
//! `configured.rs` (either one, as a configuration file names it).

#[cfg(feature = "memory")]
pub(crate) mod memory;

#[cfg(feature = "memory")]
pub use memory::{MemoryBackend, MemoryBackendBuilder};

#[cfg(feature = "redis")]
pub(crate) mod redis;

// The backend a configuration file names; public as `config::ConfiguredBackend`.
#[cfg(all(feature = "config", feature = "redis"))]
pub(crate) mod configured;

mod key_state;

pub use key_state::{KeyState, PeekFuture, ResetFuture};

mod records;

pub use records::{OnRecordsChange, Records, RecordsFuture};

mod charge;

pub(crate) use charge::{AdjustLater, CLOCK_MARGIN};
pub use charge::{Adjustment, Charges, Decisions, Uses};

mod api;

pub use crate::error::BackendError;
pub use api::Backend;
