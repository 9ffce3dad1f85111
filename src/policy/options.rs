//! A [`PolicyBuilder`](super::PolicyBuilder)'s options, apart from the builder: what the
//! compatibility table (`compat.rs`) reads of a policy, and the builder's modules write.

use std::time::Duration;

use http::Method;

use super::condition::Condition;
use super::extras::ExtrasBuilder;
use super::parts::MissingKey;
use crate::budget::Budget;
use crate::limit::Algorithm;
use crate::penalty::Penalty;
use crate::quota::Quota;
use crate::rollout::RolloutBuilder;
use crate::window::{CalendarWindow, WindowStart};

/// A [`PolicyBuilder`](super::PolicyBuilder)'s options but its key.
#[derive(Debug, Default)]
pub(crate) struct Options {
    pub(crate) name: String,
    pub(super) quotas: Vec<Quota>,
    pub(crate) algorithm: Algorithm,
    pub(super) delay: Option<Duration>,
    pub(super) lease: Option<Duration>,
    pub(super) dry_run: bool,
    pub(super) under_pressure: bool,
    pub(crate) tiers: Vec<(String, Vec<Quota>)>,
    pub(super) tier_header: Option<String>,
    pub(super) cost: u64,
    pub(super) methods: Option<Vec<Method>>,
    pub(super) custom_methods: Option<Vec<Method>>,
    pub(super) route: Option<String>,
    /// Every condition a request must meet ([`when`](super::PolicyBuilder::when)).
    pub(super) conditions: Vec<Condition>,
    /// [`near_limit`](PolicyBuilder::near_limit)'s ratio, and whether the handler is told.
    pub(super) near_limit: Option<f64>,
    pub(super) near_limit_header: bool,
    pub(super) retry_after_jitter: Option<Duration>,
    pub(super) window_start: WindowStart,
    pub(super) calendar: Option<CalendarWindow>,
    pub(super) missing_key: MissingKey,
    pub(super) penalty: Option<Penalty>,
    pub(super) budget: Option<Budget>,
    pub(crate) extras: ExtrasBuilder,
    /// Its rollout options (`rollout/builder.rs`).
    pub(crate) rollout: RolloutBuilder,
}
