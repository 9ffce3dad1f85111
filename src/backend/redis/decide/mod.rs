//! Deciding: one check's way (the deny cache, one call under the breaker), units given back and
//! metered costs settled, concurrency leases, and peek and reset.

pub(crate) mod admin;
pub(crate) mod check;
pub(crate) mod deny;
pub(crate) mod lease;
pub(crate) mod refund;
