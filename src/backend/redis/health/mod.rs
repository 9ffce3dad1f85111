//! Guarding against Redis' failures and reporting its health: the circuit breakers and the timeout,
//! the one recorder of every call's outcome (one clock), the keepers' attempts, what the backend
//! reports, and the watch on Redis' memory.

pub(crate) mod attempts;
pub(crate) mod breaker;
pub(crate) mod circuit;
pub(crate) mod memory;
pub(crate) mod recorder;
pub(crate) mod report;
pub(crate) mod watch;
