//! The in-memory backend without HTTP: every algorithm exactly on a manual clock, the store's cap
//! and eviction, the sliding window's error, and a rotating-IP attack.
//!
//! It needs none of `tests/support/` (no HTTP requests, no Redis), so it does not include it.

/// The shapes the tests ask the backend in, as lists of charges.
#[path = "../support/asks.rs"]
mod asks;

mod algorithms;
mod attack;
mod backend;
mod calendar;
mod limits;
mod metered;
mod peek_reset;
mod refund;
mod window_accuracy;
mod window_start;
