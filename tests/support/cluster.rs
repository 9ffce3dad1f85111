//! Redis Cluster operations for the resharding and failover tests: which node owns a slot, moving a
//! slot the way `redis-cli --cluster reshard` does (`SETSLOT IMPORTING/MIGRATING`, `MIGRATE ... KEYS`,
//! `SETSLOT NODE`), and load and log counting shared by those tests.
//!
//! Everything here that talks to Redis is blocking (`redis-cli`), like [`super::redis`]; the tests run
//! it on a blocking thread beside their load.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::redis::{RedisCluster, RedisServer};

/// The slot of `key` (`CLUSTER KEYSLOT`).
pub fn key_slot(cluster: &RedisCluster, key: &str) -> u16 {
    let first = running(cluster).next().expect("no node runs");
    first
        .cli(&["CLUSTER", "KEYSLOT", key])
        .parse()
        .expect("CLUSTER KEYSLOT answers a number")
}

/// The node's id (`CLUSTER MYID`).
pub fn node_id(node: &RedisServer) -> String {
    node.cli(&["CLUSTER", "MYID"])
}

/// The index (in [`RedisCluster::nodes`]) of the primary that owns `slot`, as the first running
/// node sees it.
pub fn owner(cluster: &RedisCluster, slot: u16) -> usize {
    let first = running(cluster).next().expect("no node runs");
    let nodes = first.cli(&["CLUSTER", "NODES"]);
    for line in nodes.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.len() < 8 || !fields[2].contains("master") || fields[2].contains("fail") {
            continue;
        }
        let owns = fields[8..].iter().any(|range| {
            if range.starts_with('[') {
                return false; // a migration marker, not ownership
            }
            match range.split_once('-') {
                Some((lo, hi)) => {
                    (lo.parse::<u16>().unwrap()..=hi.parse::<u16>().unwrap()).contains(&slot)
                }
                None => range.parse::<u16>().unwrap() == slot,
            }
        });
        if owns {
            let port = port_of(fields[1]);
            return cluster
                .nodes()
                .iter()
                .position(|n| n.port() == port)
                .expect("the owner is one of the cluster's nodes");
        }
    }
    panic!("no primary owns slot {slot}:\n{nodes}");
}

/// The index of the replica of the primary `primary`.
pub fn replica_of(cluster: &RedisCluster, primary: usize) -> usize {
    let nodes = cluster.nodes();
    let id = node_id(&nodes[primary]);
    let listing = nodes[primary].cli(&["CLUSTER", "NODES"]);
    for line in listing.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.len() >= 4 && fields[2].contains("slave") && fields[3] == id {
            let port = port_of(fields[1]);
            return nodes.iter().position(|n| n.port() == port).unwrap();
        }
    }
    panic!("node {primary} has no replica:\n{listing}");
}

/// Three primaries with a replica each, ready to fail over: `cluster-node-timeout` 1000 ms,
/// `cluster-require-full-coverage no` (otherwise every node refuses every key, `CLUSTERDOWN`,
/// while one slot has no primary), every replica synchronized.
pub fn cluster_ready_to_fail_over() -> RedisCluster {
    let cluster = RedisCluster::start_with_replicas();
    for node in cluster.nodes() {
        node.cli(&["CONFIG", "SET", "cluster-node-timeout", "1000"]);
        node.cli(&["CONFIG", "SET", "cluster-require-full-coverage", "no"]);
    }
    wait_for_replicas(&cluster);
    cluster
}

/// Waits (up to 30 s) until every replica has synchronized with its primary
/// (`master_link_status:up`): a replica that never synchronized cannot take over.
pub fn wait_for_replicas(cluster: &RedisCluster) {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    for node in running(cluster) {
        loop {
            let info = node.cli(&["INFO", "replication"]);
            if info.contains("role:master") || info.contains("master_link_status:up") {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "a replica did not synchronize:\n{info}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// Whether the server on `port` says it is a primary (`ROLE`); false when it does not answer. Plain
/// `redis-cli`, so that it can run on a blocking thread without borrowing the cluster.
pub fn is_primary(port: u16) -> bool {
    std::process::Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &port.to_string(), "ROLE"])
        .output()
        .is_ok_and(|out| String::from_utf8_lossy(&out.stdout).starts_with("master"))
}

/// A client key (`{prefix}-{i}` for the first `i` that fits) whose Redis key, as `redis_key` names
/// it, lives on the primary `node`.
pub fn key_on(
    cluster: &RedisCluster,
    node: usize,
    prefix: &str,
    redis_key: impl Fn(&str) -> String,
) -> String {
    (0..10_000)
        .map(|i| format!("{prefix}-{i}"))
        .find(|key| owner(cluster, key_slot(cluster, &redis_key(key))) == node)
        .expect("some key lands on every primary")
}

fn port_of(address: &str) -> u16 {
    address
        .split(['@', ','])
        .next()
        .and_then(|addr| addr.rsplit_once(':'))
        .and_then(|(_, port)| port.parse().ok())
        .expect("CLUSTER NODES names host:port@bus")
}

fn running(cluster: &RedisCluster) -> impl Iterator<Item = &RedisServer> {
    cluster.nodes().iter().filter(|n| n.is_running())
}

/// One slot moving from one primary to another, step by step, as `redis-cli --cluster reshard`
/// moves it.
pub struct Migration {
    pub slot: u16,
    pub from: usize,
    pub to: usize,
    from_id: String,
    to_id: String,
}

impl Migration {
    /// `SETSLOT slot IMPORTING` on the target, then `MIGRATING` on the source: from now on the
    /// source answers `ASK` for the slot's keys it no longer has.
    pub fn begin(cluster: &RedisCluster, slot: u16, to: usize) -> Migration {
        let from = owner(cluster, slot);
        assert_ne!(from, to, "slot {slot} is on node {to} already");
        let nodes = cluster.nodes();
        let (from_id, to_id) = (node_id(&nodes[from]), node_id(&nodes[to]));
        let slot_arg = slot.to_string();
        nodes[to].cli(&["CLUSTER", "SETSLOT", &slot_arg, "IMPORTING", &from_id]);
        nodes[from].cli(&["CLUSTER", "SETSLOT", &slot_arg, "MIGRATING", &to_id]);
        Migration {
            slot,
            from,
            to,
            from_id,
            to_id,
        }
    }

    /// The slot's keys still on the source (`CLUSTER GETKEYSINSLOT`, up to 1000).
    pub fn keys_left(&self, cluster: &RedisCluster) -> Vec<String> {
        let reply = cluster.nodes()[self.from].cli(&[
            "CLUSTER",
            "GETKEYSINSLOT",
            &self.slot.to_string(),
            "1000",
        ]);
        reply
            .lines()
            .map(str::to_owned)
            .filter(|k| !k.is_empty())
            .collect()
    }

    /// `MIGRATE` of `keys` (atomically, one call) to the target.
    pub fn move_keys(&self, cluster: &RedisCluster, keys: &[String]) {
        if keys.is_empty() {
            return;
        }
        let nodes = cluster.nodes();
        let port = nodes[self.to].port().to_string();
        let mut args = vec!["MIGRATE", "127.0.0.1", &port, "", "0", "5000", "KEYS"];
        args.extend(keys.iter().map(String::as_str));
        nodes[self.from].cli(&args);
    }

    /// `SETSLOT slot NODE target` on the target, the source, then every other primary: the slot is
    /// the target's, and the source answers `MOVED`.
    pub fn finish(self, cluster: &RedisCluster) {
        let slot = self.slot.to_string();
        let nodes = cluster.nodes();
        let mut order = vec![self.to, self.from];
        order.extend((0..nodes.len()).filter(|i| *i != self.to && *i != self.from));
        for i in order {
            if nodes[i].is_running() {
                nodes[i].cli(&["CLUSTER", "SETSLOT", &slot, "NODE", &self.to_id]);
            }
        }
        let _ = &self.from_id;
    }
}

/// Outcomes of the decisions one kind of load made: admitted, limited, failed (with the first
/// errors), the slowest.
#[derive(Default)]
pub struct Tally {
    pub allowed: AtomicU64,
    pub limited: AtomicU64,
    pub failed: AtomicU64,
    max_latency_us: AtomicU64,
    errors: Mutex<BTreeMap<String, u64>>,
    last_failure: Mutex<Option<std::time::Instant>>,
}

impl Tally {
    pub fn new() -> Arc<Tally> {
        Arc::default()
    }

    pub fn record<E: fmt::Display>(&self, outcome: Result<bool, E>, latency: Duration) {
        match outcome {
            Ok(true) => self.allowed.fetch_add(1, Ordering::Relaxed),
            Ok(false) => self.limited.fetch_add(1, Ordering::Relaxed),
            Err(e) => {
                *self.last_failure.lock().unwrap() = Some(std::time::Instant::now());
                let mut errors = self.errors.lock().unwrap();
                *errors.entry(format!("{e:#}")).or_default() += 1;
                self.failed.fetch_add(1, Ordering::Relaxed)
            }
        };
        self.max_latency_us
            .fetch_max(latency.as_micros() as u64, Ordering::Relaxed);
    }

    pub fn allowed(&self) -> u64 {
        self.allowed.load(Ordering::Relaxed)
    }

    pub fn limited(&self) -> u64 {
        self.limited.load(Ordering::Relaxed)
    }

    pub fn failed(&self) -> u64 {
        self.failed.load(Ordering::Relaxed)
    }

    pub fn total(&self) -> u64 {
        self.allowed() + self.limited() + self.failed()
    }

    pub fn max_latency(&self) -> Duration {
        Duration::from_micros(self.max_latency_us.load(Ordering::Relaxed))
    }

    /// When the last failed decision was answered.
    pub fn last_failure(&self) -> Option<std::time::Instant> {
        *self.last_failure.lock().unwrap()
    }

    /// Starts counting afresh (the errors' list too).
    pub fn reset(&self) {
        self.allowed.store(0, Ordering::Relaxed);
        self.limited.store(0, Ordering::Relaxed);
        self.failed.store(0, Ordering::Relaxed);
        self.max_latency_us.store(0, Ordering::Relaxed);
        self.errors.lock().unwrap().clear();
        *self.last_failure.lock().unwrap() = None;
    }

    /// The distinct errors and how often each came.
    pub fn errors(&self) -> BTreeMap<String, u64> {
        self.errors.lock().unwrap().clone()
    }
}

impl fmt::Display for Tally {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} decisions: {} allowed, {} limited, {} failed; max latency {:?}",
            self.total(),
            self.allowed(),
            self.limited(),
            self.failed(),
            self.max_latency()
        )?;
        for (error, n) in self.errors() {
            write!(f, "\n    {n} x {error}")?;
        }
        Ok(())
    }
}

/// Counts every event (tracing's, and the `log` crate's such as redis-rs's) by level and target,
/// as a subscriber capturing everything would print them: one line each.
#[derive(Clone, Default)]
pub struct LogLines {
    lines: Arc<Mutex<BTreeMap<(tracing::Level, String), u64>>>,
}

impl LogLines {
    /// The lines counted so far.
    pub fn total(&self) -> u64 {
        self.lines.lock().unwrap().values().sum()
    }

    /// Lines at `level` or above (`INFO`: what a default filter prints).
    pub fn at_least(&self, level: tracing::Level) -> u64 {
        self.lines
            .lock()
            .unwrap()
            .iter()
            .filter(|((l, _), _)| *l <= level)
            .map(|(_, n)| n)
            .sum()
    }

    /// Lines a subscriber filtered by `info,redis=error` would print: redis-rs's at `ERROR` only,
    /// the others at `INFO` and above.
    pub fn quiet_filter(&self) -> u64 {
        self.lines
            .lock()
            .unwrap()
            .iter()
            .filter(|((level, target), _)| {
                if target.starts_with("redis::") || target == "redis" {
                    *level <= tracing::Level::ERROR
                } else {
                    *level <= tracing::Level::INFO
                }
            })
            .map(|(_, n)| n)
            .sum()
    }

    /// Per level and target.
    pub fn by_target(&self) -> BTreeMap<(tracing::Level, String), u64> {
        self.lines.lock().unwrap().clone()
    }
}

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for LogLines {
    fn on_event(
        &self,
        event: &tracing::Event<'_>,
        _ctx: tracing_subscriber::layer::Context<'_, S>,
    ) {
        let meta = event.metadata();
        // Events forwarded from the `log` crate all have the target "log"; the module is in a field.
        let mut fields = Fields {
            target: meta.target().to_owned(),
            message: String::new(),
        };
        event.record(&mut fields);
        let mut target = fields.target;
        if *meta.level() <= tracing::Level::WARN {
            // Which warnings: the message, cut short (an address or a count in it makes a new one).
            let message: String = fields.message.chars().take(60).collect();
            target = format!("{target}: {message}");
        }
        *self
            .lines
            .lock()
            .unwrap()
            .entry((*meta.level(), target))
            .or_default() += 1;
    }
}

struct Fields {
    target: String,
    message: String,
}

impl tracing::field::Visit for Fields {
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        if field.name() == "log.target" {
            self.target = value.to_owned();
        }
    }

    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn fmt::Debug) {
        if field.name() == "message" {
            self.message = format!("{value:?}");
        }
    }
}
