//! Guarding against Redis' failures and reporting its health: breakers, the recorder of every
//! call's outcome, the keepers' attempts, the report, and the watch on Redis' memory.

pub(crate) mod attempts;
pub(crate) mod breaker;
pub(crate) mod circuit;
pub(crate) mod memory;
pub(crate) mod recorder;
pub(crate) mod report;
pub(crate) mod told;
pub(crate) mod watch;
