//! Speed-ups: checks coalesced into one call, and leased budgets of hot keys.

pub(crate) mod batch;
pub(crate) mod budget;
pub(crate) mod gcra_group;
