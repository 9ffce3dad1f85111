//! [`ClusterNodes`]: a Cluster's slot map as this backend keeps it (slot_watch.rs reads it), and a
//! breaker per primary, so that a dead primary costs only its own slots' decisions, at once.
//!
//! Why our own map: redis-rs 1.8.1 sends a request for a dead primary's slot to a random node
//! (`get_random_connection`, src/cluster_handling/async_connection/mod.rs:922; src/cluster_handling/
//! slot_map.rs:56), which answers `MOVED`; each `MOVED` starts a slot refresh under the connection
//! map's write lock (`refresh_slots`, same file:983: a dial of the dead node), so every key waits
//! (5 to 20 ms p99 measured). This can go once redis-rs fails a dead primary's slots fast and
//! refreshes without stopping the others.
//!
//! With seed URLs the task probes an open node itself (`PING` with the seed's TLS and credentials),
//! so no request reaches that refresh; with a user's Cluster client, one request probes.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::time::{Duration, Instant, SystemTime};

use redis::{ConnectionAddr, ConnectionInfo, RedisError, Value};
use tokio::sync::Notify;

use crate::backend::redis::health::circuit::{Admission, Circuit};
use crate::backend::redis::health::recorder::Clock;
use crate::backend::redis::health::report::RedisNodeHealth;
use crate::backend::redis::health::told::Told;

/// The number of hash slots of a Redis Cluster.
const SLOTS: usize = 16384;
/// No node known for the slot.
const NONE: u16 = u16::MAX;

/// One primary: its breaker and what last went wrong there.
pub(crate) struct Node {
    pub(crate) address: Box<str>,
    host: String,
    port: u16,
    pub(crate) circuit: Arc<Circuit>,
    last_error: Mutex<Option<(String, SystemTime)>>,
    /// When the node last answered `TRYAGAIN` (its circuit's `now_ms`; 0: never).
    tried_again: AtomicU64,
    /// What the log last said of its breaker (a node that flaps logs a line per quiet).
    told: Told,
}

impl Node {
    /// Whether the node answered `TRYAGAIN` since `started`: a multi-key command on a migrating slot,
    /// retried until the timeout, was answered every try, so it opens no breaker (breaker.rs).
    pub(crate) fn tried_again_since(&self, started: u64) -> bool {
        self.tried_again.load(Ordering::Relaxed) >= started
    }

    /// Whether a redirection (`error`: `MOVED`, `ASK`) names this node.
    pub(crate) fn named_by(&self, error: &RedisError) -> bool {
        let named = error
            .redirect_node()
            .and_then(|(address, _)| address.rsplit_once(':'));
        named.is_some_and(|(host, port)| self.host == host && port.parse() == Ok(self.port))
    }

    /// A call met `error` on the node now.
    pub(crate) fn met(&self, error: &dyn std::fmt::Display) {
        *self.last_error.lock().unwrap_or_else(|e| e.into_inner()) =
            Some((error.to_string(), SystemTime::now()));
    }
}

/// Logs that `node` is unreachable (`down`) or answers again, with the transitions of its breaker
/// left untold before (`flaps`: a node that flaps logs a line per quiet, health/told.rs).
fn say(node: &Node, down: bool, flaps: u32) {
    let address = &node.address;
    let flapped = match flaps {
        0 => String::new(),
        n => format!(" ({n} more openings and closings of its breaker since the last line)"),
    };
    if down {
        let error = node.last_error.lock().unwrap_or_else(|e| e.into_inner());
        let error = error.as_ref().map_or("", |(e, _)| e.as_str());
        tracing::warn!(
            node = %address,
            error = %error,
            "a Redis Cluster node is unreachable{flapped}; its slots' decisions fail fast (the failure policy answers) until a probe gets through or the slot map names another primary"
        );
    } else {
        tracing::info!(
            node = %address,
            "the Redis Cluster node answers again{flapped}; its slots' decisions come from Redis"
        );
    }
}

/// The slot map: the owner of every slot (an index in `nodes`), and each node's ranges.
#[derive(Default)]
struct Map {
    owner: Vec<u16>,
    nodes: Vec<(Arc<Node>, Ranges)>,
}

/// The slot map and the primaries' breakers, read by the calls, refreshed by slot_watch.rs.
pub(crate) struct ClusterNodes {
    map: RwLock<Map>,
    timeout: Duration,
    /// The `backend` label of the node gauge.
    name: Box<str>,
    /// Wakes the refreshing task: a node failed, the map may be stale.
    pub(crate) stale: Notify,
    /// A seed's connection settings, given seed URLs: the task probes open nodes itself.
    seed: OnceLock<ConnectionInfo>,
    /// The backend's clock, for the nodes' breakers and records.
    clock: Clock,
}

impl ClusterNodes {
    /// No map yet (every key is admitted until the first refresh); breakers on `clock`.
    pub(crate) fn new(timeout: Duration, name: &str, clock: Clock) -> Self {
        ClusterNodes {
            clock,
            map: RwLock::default(),
            timeout,
            name: name.into(),
            stale: Notify::new(),
            seed: OnceLock::new(),
        }
    }

    /// Seed URLs given: the task probes open nodes, with `seed`'s settings.
    pub(crate) fn probe_with(&self, seed: ConnectionInfo) {
        let _ = self.seed.set(seed);
    }

    /// Whether a call on `node` may go ahead (while open: none if the task probes, else one).
    pub(crate) fn admit(&self, node: &Arc<Node>) -> Admission {
        if self.seed.get().is_some() && node.circuit.tripped() {
            return Admission::FailFast;
        }
        node.circuit.admit()
    }

    /// The settings and admission of the task's probe of `node`; `None` when none is due.
    pub(crate) fn probe(&self, node: &Arc<Node>) -> Option<(ConnectionInfo, Admission)> {
        let seed = self.seed.get()?;
        if !node.circuit.tripped() {
            return None;
        }
        let admission = node.circuit.admit();
        if !matches!(admission, Admission::Probe(_)) {
            return None;
        }
        let addr = match seed.addr() {
            ConnectionAddr::TcpTls {
                insecure,
                tls_params,
                ..
            } => ConnectionAddr::TcpTls {
                host: node.host.clone(),
                port: node.port,
                insecure: *insecure,
                tls_params: tls_params.clone(),
            },
            _ => ConnectionAddr::Tcp(node.host.clone(), node.port),
        };
        Some((seed.clone().set_addr(addr), admission))
    }

    /// The nodes whose breaker is not closed.
    pub(crate) fn tripped(&self) -> Vec<Arc<Node>> {
        let map = self.map.read().unwrap_or_else(|e| e.into_inner());
        map.nodes
            .iter()
            .filter(|(n, _)| n.circuit.tripped())
            .map(|(n, _)| n.clone())
            .collect()
    }

    /// A call (or a probe) got an answer from `node`: closes its breaker, says so once.
    pub(crate) fn answered(&self, node: &Node) {
        node.circuit.stamp_answer(node.circuit.now_ms());
        if node.circuit.answered() {
            if let Some(flaps) = node.told.transition(Instant::now()) {
                say(node, false, flaps);
            }
            crate::observe::cluster_node_up(&self.name, &node.address, true);
            // Perhaps the promoted replica answered: read the map again.
            self.stale.notify_one();
        }
    }

    /// A call or probe could not reach `node` (or its slots are unserved): opens its breaker.
    pub(crate) fn failed(&self, node: &Node, was_probe: bool, error: &dyn std::fmt::Display) {
        node.met(error);
        if node.circuit.failed(was_probe) {
            if let Some(flaps) = node.told.transition(Instant::now()) {
                say(node, true, flaps);
            }
            // Not for a node gone from the map (a call under way when it left): its 1 stands.
            let map = self.map.read().unwrap_or_else(|e| e.into_inner());
            if map.nodes.iter().any(|(n, _)| n.address == node.address) {
                crate::observe::cluster_node_up(&self.name, &node.address, false);
            }
        }
        // The map may be stale (a failover): read it again soon.
        self.stale.notify_one();
    }

    /// Says the state of each node whose transitions were counted, not logged, once it is due
    /// ([`Told::due`]): at each round of the slot-map task.
    pub(crate) fn tell_flaps(&self) {
        let map = self.map.read().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        for (node, _) in &map.nodes {
            if let Some((flaps, down)) = node.told.due(now, || node.circuit.tripped()) {
                say(node, down, flaps);
            }
        }
    }

    /// The primary that owns `key`'s slot, if the map knows it.
    pub(crate) fn for_key(&self, key: &str) -> Option<Arc<Node>> {
        self.for_slot(slot_of(key.as_bytes()))
    }

    fn for_slot(&self, slot: u16) -> Option<Arc<Node>> {
        let map = self.map.read().unwrap_or_else(|e| e.into_inner());
        let owner = *map.owner.get(usize::from(slot))?;
        map.nodes.get(usize::from(owner)).map(|(n, _)| n.clone())
    }

    /// The node of `key`'s slot answered `TRYAGAIN` now, for every call on it under way.
    pub(crate) fn tried_again(&self, key: &[u8]) {
        if let Some(node) = self.for_slot(slot_of(key)) {
            node.tried_again
                .fetch_max(node.circuit.now_ms(), Ordering::Relaxed);
        }
    }

    /// Puts a map in service: a node still in it keeps its breaker; a new one starts closed; one
    /// gone is told up (no slot of it fails).
    /// Returns a slot whose primary changed since the last map: see [`Nudge`].
    pub(crate) fn install(&self, shards: Vec<(Shard, Ranges)>) -> Option<u16> {
        let mut map = self.map.write().unwrap_or_else(|e| e.into_inner());
        let before: Vec<Box<str>> = map.nodes.iter().map(|(n, _)| n.address.clone()).collect();
        let owned_before = std::mem::take(&mut map.owner);
        let mut known: HashMap<Box<str>, Arc<Node>> = map
            .nodes
            .drain(..)
            .map(|(n, _)| (n.address.clone(), n))
            .collect();
        let mut owner = vec![NONE; SLOTS];
        let mut nodes = Vec::with_capacity(shards.len());
        for ((host, port), ranges) in shards {
            let address = if host.contains(':') {
                format!("[{host}]:{port}")
            } else {
                format!("{host}:{port}")
            };
            let node = known.remove(address.as_str()).unwrap_or_else(|| {
                crate::observe::cluster_node_up(&self.name, &address, true);
                Arc::new(Node {
                    address: address.into_boxed_str(),
                    host,
                    port,
                    circuit: Arc::new(Circuit::new(self.timeout, self.clock)),
                    last_error: Mutex::new(None),
                    tried_again: AtomicU64::new(0),
                    told: Told::default(),
                })
            });
            let index = nodes.len() as u16;
            for &(start, end) in &ranges {
                for slot in start..=end.min(SLOTS as u16 - 1) {
                    owner[usize::from(slot)] = index;
                }
            }
            nodes.push((node, ranges));
        }
        // A primary gone from the map (its replica promoted) has no slot to fail: its gauge must
        // not read 0 for the life of the process.
        for gone in known.keys() {
            crate::observe::cluster_node_up(&self.name, gone, true);
        }
        let address = |i: u16| &nodes[usize::from(i)].0.address;
        let moved = (owned_before.iter().zip(&owner)).position(|(&was, &is)| {
            was != NONE && is != NONE && *before[usize::from(was)] != **address(is)
        });
        *map = Map { owner, nodes };
        moved.map(|slot| slot as u16)
    }

    /// A primary that does not own `slot` and whose breaker is closed: it answers a key of the
    /// slot with `MOVED`.
    pub(crate) fn other_than_owner(&self, slot: u16) -> Option<Shard> {
        let map = self.map.read().unwrap_or_else(|e| e.into_inner());
        let owner = usize::from(*map.owner.get(usize::from(slot))?);
        let (other, _) = (map.nodes.iter().enumerate())
            .find(|(i, (node, _))| *i != owner && !node.circuit.tripped())?
            .1;
        Some((other.host.clone(), other.port))
    }

    /// Each primary's state, in the map's order.
    pub(crate) fn health(&self) -> Vec<RedisNodeHealth> {
        let map = self.map.read().unwrap_or_else(|e| e.into_inner());
        map.nodes
            .iter()
            .map(|(node, ranges)| RedisNodeHealth {
                address: node.address.to_string(),
                slots: ranges.clone(),
                state: node.circuit.state(),
                last_error: node
                    .last_error
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .clone(),
            })
            .collect()
    }
}

/// A slot that changed primary, until redis-rs sends its keys to the new one. redis-rs 1.8.1 reads
/// its own slot map again on a `MOVED` only: a primary frozen or cut off, then replaced by its
/// replica, times out every call routed to it (redis-rs retries none: connection.rs), and would
/// keep its slots in redis-rs's map for as long as it stays silent. Another primary answers
/// `MOVED` for a key of the slot, which makes redis-rs read the map (slot_watch.rs sends it while
/// a key of the slot, routed by redis-rs, meets silence: the map it read may have come from a node
/// that had not heard of the failover yet). This can go once redis-rs reads its map again when a
/// node stops answering.
pub(crate) struct Nudge {
    pub(crate) slot: u16,
    /// A key of the slot (its hash tag the slot's) under the backend's prefix, for ACL patterns.
    pub(crate) key: String,
    pub(crate) since: std::time::Instant,
}

impl Nudge {
    pub(crate) fn new(slot: u16, prefix: &str) -> Self {
        let key = (0u32..)
            .map(|i| format!("{prefix}:slot-moved:{{{i}}}"))
            .find(|key| slot_of(key.as_bytes()) == slot)
            .expect("every slot has a key");
        Nudge {
            slot,
            key,
            since: std::time::Instant::now(),
        }
    }
}

/// The hash slot of `key`, as Redis computes it: CRC16 (XMODEM) of the hash tag (the part between
/// the first `{` and the next `}`, when not empty), else of the whole key, modulo 16384.
pub(crate) fn slot_of(key: &[u8]) -> u16 {
    let tagged = key
        .iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            let rest = &key[open + 1..];
            rest.iter()
                .position(|&b| b == b'}')
                .map(|close| &rest[..close])
        })
        .filter(|tag| !tag.is_empty());
    crc16(tagged.unwrap_or(key)) % SLOTS as u16
}

fn crc16(bytes: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &byte in bytes {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

/// A primary's host and port.
pub(crate) type Shard = (String, u16);
/// Slot ranges, inclusive.
pub(crate) type Ranges = Vec<(u16, u16)>;

/// The primaries and their slot ranges from a `CLUSTER SLOTS` reply; a range whose primary has no
/// address (empty, `?`) is left out, its keys without a breaker until a later map names one.
pub(crate) fn parse_slots(reply: &Value) -> Option<Vec<(Shard, Ranges)>> {
    let Value::Array(ranges) = reply else {
        return None;
    };
    let mut shards: Vec<(Shard, Ranges)> = Vec::new();
    for range in ranges {
        let Value::Array(fields) = range else {
            return None;
        };
        let (Some(Value::Int(start)), Some(Value::Int(end)), Some(Value::Array(primary))) =
            (fields.first(), fields.get(1), fields.get(2))
        else {
            return None;
        };
        let host = match primary.first() {
            Some(Value::BulkString(host)) => String::from_utf8_lossy(host).into_owned(),
            Some(Value::SimpleString(host)) => host.clone(),
            _ => return None,
        };
        let Some(Value::Int(port)) = primary.get(1) else {
            return None;
        };
        if host.is_empty() || host == "?" {
            continue;
        }
        let (Ok(start), Ok(end), Ok(port)) = (
            u16::try_from(*start),
            u16::try_from(*end),
            u16::try_from(*port),
        ) else {
            return None;
        };
        let shard = (host, port);
        match shards.iter_mut().find(|(s, _)| *s == shard) {
            Some((_, ranges)) => ranges.push((start, end)),
            None => shards.push((shard, vec![(start, end)])),
        }
    }
    for (_, ranges) in &mut shards {
        ranges.sort_unstable();
    }
    shards.sort_by_key(|(_, ranges)| ranges.first().copied());
    Some(shards)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::redis::health::circuit::CircuitState;

    #[test]
    fn slots_are_redis_slots() {
        // CLUSTER KEYSLOT of Redis 7 for these keys.
        assert_eq!(slot_of(b"123456789"), 12739);
        assert_eq!(slot_of(b"foo"), 12182);
        assert_eq!(slot_of(b"throttle:api:{alice}"), slot_of(b"alice"));
        assert_eq!(slot_of(b"a{}b"), slot_of(b"a{}b"));
        assert_ne!(slot_of(b"a{}b"), slot_of(b""));
        assert_eq!(slot_of(b"x{user}y{other}"), slot_of(b"user"));
    }

    fn range(start: i64, end: i64, host: &str, port: i64) -> Value {
        Value::Array(vec![
            Value::Int(start),
            Value::Int(end),
            Value::Array(vec![
                Value::BulkString(host.as_bytes().to_vec()),
                Value::Int(port),
                Value::BulkString(b"id".to_vec()),
            ]),
        ])
    }

    #[test]
    fn a_map_routes_keys_to_their_primary_and_keeps_breakers() {
        let reply = Value::Array(vec![
            range(5461, 10922, "127.0.0.1", 7001),
            range(0, 5460, "127.0.0.1", 7000),
            range(10923, 16383, "127.0.0.1", 7002),
            range(100, 100, "", 7003),
        ]);
        let shards = parse_slots(&reply).unwrap();
        assert_eq!(shards[0], (("127.0.0.1".into(), 7000), vec![(0, 5460)]));
        assert_eq!(shards.len(), 3);
        let nodes = ClusterNodes::new(Duration::from_millis(100), "test", Clock::new());
        assert!(nodes.for_key("foo").is_none());
        assert!(
            nodes.install(shards.clone()).is_none(),
            "the first map moves nothing"
        );
        assert_eq!(&*nodes.for_key("foo").unwrap().address, "127.0.0.1:7002");
        let tagged = nodes.for_key("{123456789}").unwrap();
        assert_eq!(&*tagged.address, "127.0.0.1:7002");
        let node = nodes.for_key("foo").unwrap();
        nodes.failed(&node, false, &"connection refused");
        assert_eq!(nodes.tripped().len(), 1);
        // Without seed URLs, one request probes once the wait is over; with them, none.
        assert!(matches!(nodes.admit(&node), Admission::FailFast));
        assert!(nodes.probe(&node).is_none());
        nodes.probe_with(
            redis::IntoConnectionInfo::into_connection_info("rediss://u:pw@seed:7000").unwrap(),
        );
        assert!(matches!(nodes.admit(&node), Admission::FailFast));
        // The same node in a new map keeps its breaker (and no slot moved).
        assert!(nodes.install(shards.clone()).is_none());
        let health = nodes.health();
        assert_eq!(health[2].state, CircuitState::Open);
        assert_eq!(health[2].slots, vec![(10923, 16383)]);
        let (error, _) = health[2].last_error.as_ref().unwrap();
        assert_eq!(error, "connection refused");
        assert_eq!(health[0].state, CircuitState::Closed);
        assert!(parse_slots(&Value::Int(1)).is_none());
        // 7002's slots taken over by its replica 7005: another primary is asked a key of one.
        let mut promoted = shards;
        promoted[2].0 = ("127.0.0.1".into(), 7005);
        let slot = nodes.install(promoted).unwrap();
        assert_eq!(slot, 10923);
        assert_eq!(
            nodes.other_than_owner(slot),
            Some(("127.0.0.1".into(), 7000))
        );
        let key = Nudge::new(slot, "throttle").key;
        assert!(key.starts_with("throttle:slot-moved:{"), "{key}");
        assert_eq!(slot_of(key.as_bytes()), 10923);
    }

    /// A failed primary's gauge reads 0 until its replica's promotion takes it out of the map.
    #[cfg(feature = "metrics")]
    #[test]
    fn a_primary_gone_from_the_map_is_no_longer_down() {
        let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
        let handle = recorder.handle();
        let up = |page: &str, port: u16| {
            let series =
                format!("throttle_cluster_node_up{{backend=\"gauge\",node=\"127.0.0.1:{port}\"}} ");
            let line = page.lines().find(|l| l.starts_with(&series));
            line.map(|l| l[series.len()..].to_owned())
        };
        metrics::with_local_recorder(&recorder, || {
            let one = |port| (("127.0.0.1".into(), port), vec![(0, SLOTS as u16 - 1)]);
            let nodes = ClusterNodes::new(Duration::from_millis(100), "gauge", Clock::new());
            nodes.install(vec![one(7000)]);
            let node = nodes.for_key("k").unwrap();
            nodes.failed(&node, false, &"connection refused");
            assert_eq!(up(&handle.render(), 7000).as_deref(), Some("0"));
            nodes.install(vec![one(7003)]);
            // A call under way on a node that left while it was up fails after.
            let up_then_gone = nodes.for_key("k").unwrap();
            nodes.install(vec![one(7004)]);
            nodes.failed(&up_then_gone, false, &"connection refused");
        });
        let page = handle.render();
        assert_eq!(up(&page, 7000).as_deref(), Some("1"), "{page}");
        assert_eq!(up(&page, 7003).as_deref(), Some("1"), "{page}");
        assert_eq!(up(&page, 7004).as_deref(), Some("1"), "{page}");
    }

    #[test]
    fn a_background_probe_reaches_the_node_with_the_seeds_settings() {
        let nodes = ClusterNodes::new(Duration::from_millis(100), "test", Clock::new());
        nodes.install(vec![(("10.0.0.7".into(), 7001), vec![(0, 16383)])]);
        nodes.probe_with(
            redis::IntoConnectionInfo::into_connection_info("rediss://u:pw@seed:7000/").unwrap(),
        );
        let node = nodes.for_key("k").unwrap();
        // Closed: nothing to probe.
        assert!(nodes.probe(&node).is_none());
        nodes.failed(&node, false, &"timed out");
        // Once the breaker's wait (50 ms) is over: one probe at a time.
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        let (info, admission) = loop {
            if let Some(probe) = nodes.probe(&node) {
                break probe;
            }
            assert!(std::time::Instant::now() < deadline, "no probe came due");
            std::thread::yield_now();
        };
        assert!(matches!(admission, Admission::Probe(_)));
        assert!(nodes.probe(&node).is_none());
        assert!(matches!(
            info.addr(),
            ConnectionAddr::TcpTls { host, port: 7001, .. } if host == "10.0.0.7"
        ));
        assert_eq!(info.redis_settings().password(), Some("pw"));
        nodes.answered(&node);
        drop(admission);
        assert_eq!(nodes.health()[0].state, CircuitState::Closed);
    }
}
