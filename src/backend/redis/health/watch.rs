//! The backend's watcher: a task that probes a failing Redis when no request does, and reads Redis'
//! memory settings and evictions every 30 s ([`MemoryReport`]). An evicted key silently gives its
//! client a fresh burst, and every limiter key has a TTL, so only `noeviction` keeps them: an
//! evicting policy is warned about once, evictions are counted and logged.

use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use redis::cluster_routing::{MultipleNodeRoutingInfo, RoutingInfo};
use redis::{RedisError, Value};

use super::memory::MemoryReport;
use crate::backend::redis::conn::connection::RedisConnection;
use crate::backend::redis::state::RedisState;
use crate::error::BackendError;
use crate::key::Key;
use crate::limit::Limit;
use crate::quota::Quota;

/// How often the memory settings are read once they have been.
const MEMORY_EVERY: Duration = Duration::from_secs(30);
/// How soon to read them again while they have never been read (not connected yet).
const MEMORY_RETRY: Duration = Duration::from_secs(1);

/// Starts the watcher of `state`; it ends when the backend (every clone) is dropped.
pub(crate) fn spawn(state: &Arc<RedisState>) {
    let weak = Arc::downgrade(state);
    crate::timer::spawn(async move {
        let mut next_memory = Instant::now();
        // Every second until a read succeeds; then every 30 s, whatever the outcome.
        let mut read_once = false;
        let mut tick = tokio::time::interval(super::recorder::PROBE_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let Some(state) = Weak::upgrade(&weak) else {
                return;
            };
            if state.breaker.recorder.wants_probe() {
                state.probe().await;
            }
            if Instant::now() >= next_memory {
                read_once |= read_memory(&state).await.is_ok();
                let every = if read_once {
                    MEMORY_EVERY
                } else {
                    MEMORY_RETRY
                };
                next_memory = Instant::now() + every;
            }
        }
    });
}

impl RedisState {
    /// Asks Redis a decision of 0 units on a key of its own: the script runs (refused when Redis
    /// is full, held while Redis holds writes, as the real ones) but writes nothing; recorded like
    /// any decision, so its answer closes the breaker. Not a `PING`, which Redis answers while it
    /// holds writes (on a connection with no write waiting) and a proxy may answer itself.
    pub(crate) async fn probe(self: &Arc<Self>) {
        let probe = Limit::new("health-probe", Quota::per_second(1)).expect("a valid quota");
        let _ = self.check(&probe, &Key::from("probe"), 0).await;
    }
}

/// Reads the policy and the evictions, counts the new evictions, and logs (see the module docs).
pub(crate) async fn read_memory(state: &RedisState) -> Result<MemoryReport, BackendError> {
    let mut conn = state.conn.clone();
    let budget = state
        .timeout
        .saturating_mul(5)
        .max(Duration::from_millis(250));
    let (config, info) = tokio::time::timeout(budget, async {
        let mut config = redis::cmd("CONFIG");
        config.arg("GET").arg("maxmemory-policy").arg("maxmemory");
        let mut info = redis::cmd("INFO");
        info.arg("stats");
        let config = ask_primaries(&mut conn, config).await;
        let info = ask_primaries(&mut conn, info).await;
        (config, info)
    })
    .await
    .map_err(|_| BackendError::new(format!("Redis did not answer within {budget:?}")))?;
    // An error reply (`ERR unknown command`, `NOPERM`) is a refusal; anything else: not reached.
    let refused = |e: &RedisError| e.code().is_some() && !e.is_io_error();
    let unread = |what, e| BackendError::with_source(format!("cannot read Redis' {what}"), e);
    let (policy, maxmemory) = match config {
        Ok(value) => config_of(&value),
        Err(e) if refused(&e) => {
            let mut seen = state.memory.lock().unwrap_or_else(|e| e.into_inner());
            if !seen.said_config_refused {
                seen.said_config_refused = true;
                tracing::info!(
                    error = %e,
                    "Redis refuses CONFIG GET: the limiter cannot tell whether Redis may evict its keys; give it a dedicated Redis with maxmemory-policy noeviction"
                );
            }
            (None, None)
        }
        Err(e) => return Err(unread("memory settings", e)),
    };
    let evicted_keys = match info {
        Ok(value) => evicted_keys_of(&value),
        Err(e) if refused(&e) => Vec::new(),
        Err(e) => return Err(unread("statistics", e)),
    };
    // Bare CL.THROTTLE only where Redis cannot refuse it for memory (it evicts, or has no cap).
    let may_refuse =
        !policy.as_deref().is_some_and(MemoryReport::policy_evicts) && maxmemory != Some(0);
    state
        .cell_through_script
        .store(may_refuse, std::sync::atomic::Ordering::Relaxed);
    let mut seen = state.memory.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(policy) = policy.as_deref().filter(|p| MemoryReport::policy_evicts(p))
        && seen.warned_policy.as_deref() != Some(policy)
    {
        seen.warned_policy = Some(policy.to_owned());
        tracing::warn!(
            maxmemory_policy = policy,
            "Redis may evict the limiter's keys (maxmemory-policy {policy}; every limiter key has a TTL, so volatile-* policies evict them too): an evicted key forgets its client's usage and admits it again; use maxmemory-policy noeviction on the limiter's Redis"
        );
    }
    let total = (!evicted_keys.is_empty()).then(|| evicted_keys.iter().map(|(_, n)| n).sum());
    if !evicted_keys.is_empty() {
        let new = newly_evicted(&seen.evicted_keys, &evicted_keys);
        seen.evicted_keys = evicted_keys;
        if new > 0 {
            seen.evictions_seen += new;
            crate::observe::redis_evictions(new);
            tracing::warn!(
                evicted = new,
                maxmemory_policy = policy.as_deref().unwrap_or("unknown"),
                "Redis evicted keys since the last look; evicted limiter keys admit their clients again"
            );
        }
    }
    Ok(MemoryReport {
        policy,
        maxmemory,
        evicted_keys: total,
        evictions_seen: seen.evictions_seen,
    })
}

/// `cmd` on the server, or on every primary of a Cluster (the replies gathered in one value).
async fn ask_primaries(conn: &mut RedisConnection, cmd: redis::Cmd) -> Result<Value, RedisError> {
    match conn.cluster() {
        Some(cluster) => {
            let routing = RoutingInfo::MultiNode((MultipleNodeRoutingInfo::AllMasters, None));
            cluster?.route_command(cmd, routing).await
        }
        None => cmd.query_async(conn).await,
    }
}

/// Every string in `value`, in order, however nested (one reply per node on a Cluster).
fn strings(value: &Value, out: &mut Vec<String>) {
    match value {
        Value::BulkString(bytes) => out.push(String::from_utf8_lossy(bytes).into_owned()),
        Value::SimpleString(s) => out.push(s.clone()),
        Value::VerbatimString { text, .. } => out.push(text.clone()),
        Value::Array(items) | Value::Set(items) => items.iter().for_each(|v| strings(v, out)),
        Value::Map(pairs) => pairs.iter().for_each(|(k, v)| {
            strings(k, out);
            strings(v, out);
        }),
        _ => {}
    }
}

/// `maxmemory-policy` and `maxmemory` in `CONFIG GET` replies (one per node): the first policy
/// that can evict, or the first; the largest `maxmemory` (0: no cap anywhere).
fn config_of(value: &Value) -> (Option<String>, Option<u64>) {
    let mut all = Vec::new();
    strings(value, &mut all);
    let values = |name: &'static str| {
        all.windows(2)
            .filter(move |w| w[0].eq_ignore_ascii_case(name))
            .map(|w| &w[1])
    };
    let policy = values("maxmemory-policy")
        .find(|p| MemoryReport::policy_evicts(p))
        .or_else(|| values("maxmemory-policy").next());
    let maxmemory = values("maxmemory").filter_map(|v| v.parse().ok()).max();
    (policy.cloned(), maxmemory)
}

/// `evicted_keys` in `INFO stats` replies: one count per node (a Cluster's replies are a map by
/// node address; one server's is the only one, unnamed).
fn evicted_keys_of(value: &Value) -> Vec<(String, u64)> {
    let replies: Vec<(String, &Value)> = match value {
        Value::Map(pairs) => pairs
            .iter()
            .map(|(node, reply)| {
                let mut name = Vec::new();
                strings(node, &mut name);
                (name.concat(), reply)
            })
            .collect(),
        one => vec![(String::new(), one)],
    };
    let count = |reply: &Value| {
        let mut all = Vec::new();
        strings(reply, &mut all);
        all.iter()
            .flat_map(|s| s.lines())
            .find_map(|line| line.trim().strip_prefix("evicted_keys:")?.parse().ok())
    };
    (replies.into_iter())
        .filter_map(|(node, reply)| Some((node, count(reply)?)))
        .collect()
}

/// The keys evicted between two reads of each node's count (`before`, `now`). A node whose count
/// went down restarted: all its count is new. A node not read before (the first read, a new
/// primary) starts its count: nothing new yet.
fn newly_evicted(before: &[(String, u64)], now: &[(String, u64)]) -> u64 {
    let was = |node: &str| before.iter().find(|(n, _)| n == node).map(|(_, c)| *c);
    now.iter()
        .map(|(node, count)| match was(node) {
            Some(before) if *count >= before => count - before,
            Some(_) => *count,
            None => 0,
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A Cluster's counts are read per node: one node's restart (its count back to 0) does not
    /// count the other nodes' evictions again, as a drop of their sum would.
    #[test]
    fn evictions_are_counted_per_node() {
        let info = |counts: &[(&str, u64)]| {
            let reply = |n| Value::VerbatimString {
                format: redis::VerbatimFormat::Text,
                text: format!("# Stats\r\nevicted_keys:{n}\r\nexpired_keys:3\r\n"),
            };
            Value::Map(
                (counts.iter())
                    .map(|(node, n)| (Value::BulkString(node.as_bytes().to_vec()), reply(*n)))
                    .collect(),
            )
        };
        let first = evicted_keys_of(&info(&[("a:7000", 50), ("b:7001", 70)]));
        assert_eq!(
            first,
            [("a:7000".to_owned(), 50), ("b:7001".to_owned(), 70)]
        );
        assert_eq!(newly_evicted(&[], &first), 0);
        // a restarted (5 since), b evicted 2 more, c is new.
        let then = evicted_keys_of(&info(&[("a:7000", 5), ("b:7001", 72), ("c:7002", 9)]));
        assert_eq!(newly_evicted(&first, &then), 7);
        // One server's reply: one unnamed count.
        let one = Value::BulkString(b"evicted_keys:12\r\n".to_vec());
        assert_eq!(evicted_keys_of(&one), [(String::new(), 12)]);
        assert_eq!(
            newly_evicted(&[(String::new(), 10)], &[(String::new(), 12)]),
            2
        );
    }
}
