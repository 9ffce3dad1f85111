//! Overload protection: an adaptive limit on the requests a layer has in flight, shared by
//! partitions with guaranteed shares, and quotas that bite only while the service is under
//! pressure. Rate limits protect a service from one client; this protects it from all of them at
//! once.
//!
//! * `options.rs`: [`Overload`], the options and their validation;
//! * `gate.rs`: [`Gate`], the admission of a request and its count in flight;
//! * `limit.rs`: [`AdaptiveLimit`], the limit and the algorithms that adapt it.
//!
//! The guide's [overload page](crate::guide) says when to use it and what the defaults mean.

mod gate;
mod limit;
mod options;

pub use gate::Gate;
pub(crate) use gate::{InFlight, Shed};
pub use limit::{AdaptiveLimit, LimitAlgorithm};
pub use options::{Overload, PartitionBy, MAX_LIMIT, MAX_PARTITIONS};
