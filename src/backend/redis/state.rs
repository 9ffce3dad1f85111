//! `RedisState`: what every clone of a `RedisBackend` shares, built once. The ways of a check are
//! `impl RedisState` blocks above it (check.rs), so this file sits below everything that uses it.

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::conn::cluster_nodes::ClusterNodes;
use super::conn::connection::{Detector, RedisConnection};
use super::decide::deny::DenyCache;
use super::decide::lease::Leases;
use super::health::breaker::Breaker;
use super::health::memory::Seen;
use super::health::recorder::Clock;
use super::speedup::batch::Batcher;
use super::speedup::budget::Budgets;
use super::wire::mode::RedisMode;
use crate::backend::records::OnRecordsChange;

pub(super) struct RedisState {
    pub(super) conn: RedisConnection,
    /// The configured mode, and the path it runs on now.
    pub(super) detector: Arc<Detector>,
    pub(super) prefix: Box<str>,
    pub(super) timeout: Duration,
    pub(super) breaker: Arc<Breaker>,
    pub(super) deny: Option<DenyCache>,
    pub(super) leases: Arc<Leases>,
    /// Where checks wait to be coalesced (batch.rs); `None` when `coalesce` is off.
    pub(super) batches: Option<Arc<Batcher>>,
    /// Leased budgets of hot keys (budget.rs).
    pub(super) budgets: Arc<Budgets>,
    /// What the watcher saw of Redis' memory settings and evictions (watch.rs).
    pub(super) memory: Mutex<Seen>,
    /// Whether `CL.THROTTLE` goes through `cell.lua` rather than bare (coalesced): while Redis may be
    /// full. The command is not `deny-oom` (bare, it writes past `maxmemory`); the script is refused.
    pub(super) cell_through_script: AtomicBool,
    /// The layers told when a table of records changes (records.rs).
    pub(super) records_heard: Mutex<Vec<OnRecordsChange>>,
}

/// A backend's settings, checked (builder.rs).
pub(super) struct Settings {
    pub(super) name: Box<str>,
    pub(super) mode: RedisMode,
    pub(super) prefix: Box<str>,
    pub(super) timeout: Duration,
    pub(super) deny_cache: bool,
    pub(super) coalesce: bool,
}

impl RedisState {
    /// The state of a backend just connected: nothing detected, cached or held yet.
    pub(super) fn new(conn: RedisConnection, settings: Settings) -> Self {
        let Settings { timeout, .. } = settings;
        let detector = Detector::new(settings.mode, settings.coalesce);
        // One clock for every breaker and record (a reconnecting server's too); on a Cluster, the
        // slot map and breakers, told about `TRYAGAIN` by redirect.rs.
        let clock = conn.server().map_or_else(Clock::new, |server| server.clock);
        let nodes = conn
            .is_cluster()
            .then(|| Arc::new(ClusterNodes::new(timeout, &settings.name, clock)));
        if let (Some(lazy), Some(nodes)) = (conn.lazy_cluster(), &nodes) {
            let _ = lazy.nodes.set(nodes.clone());
        }
        RedisState {
            breaker: Arc::new(Breaker::new(
                timeout,
                nodes,
                conn.server().cloned(),
                // The gauge's path: known from the start where detection cannot change it.
                detector.set_up_mode,
                &settings.name,
                clock,
            )),
            leases: Arc::new(Leases::new(conn.clone(), timeout)),
            batches: settings
                .coalesce
                .then(|| Arc::new(Batcher::new(conn.clone(), timeout))),
            conn,
            detector: Arc::new(detector),
            prefix: settings.prefix,
            timeout,
            deny: settings.deny_cache.then(DenyCache::new),
            budgets: Arc::default(),
            memory: Mutex::default(),
            // Until the watcher has read the settings: the safe way.
            cell_through_script: AtomicBool::new(true),
            records_heard: Mutex::default(),
        }
    }
}
