//! The top limited keys on Redis, merged across processes: each process sums its refusals in a
//! local summary and sends the sums once a second; Redis keeps a sorted set per policy and minute.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use super::base::{show, unix_minute, CAPACITY, WINDOW_MINUTES};
use super::sketch::{largest, SpaceSaving};
use crate::backend::redis::connection::RedisConnection;
use crate::error::BackendError;
use crate::key::Key;
use crate::observe::Redactor;

/// How often a process sends its sums: Redis does one `ZINCRBY` per distinct key and policy per
/// this, however many requests were refused.
const SEND_EVERY: Duration = Duration::from_secs(1);

pub(super) struct RedisTop {
    shared: Arc<Shared>,
}

struct Shared {
    conn: RedisConnection,
    prefix: String,
    redactor: Arc<OnceLock<Redactor>>,
    /// Refusals since the last send, per policy.
    pending: Mutex<HashMap<Box<str>, SpaceSaving<Key>>>,
    sending: AtomicBool,
}

/// `{<prefix>:top:<policy>}:<minute>`: one hash tag per policy, so that a Cluster keeps a policy's
/// sets in one slot and `ZUNION` can read them together.
fn set_key(prefix: &str, policy: &str, minute: u64) -> String {
    format!("{{{prefix}:top:{policy}}}:{minute}")
}

impl RedisTop {
    pub(super) fn new(
        conn: RedisConnection,
        prefix: String,
        redactor: Arc<OnceLock<Redactor>>,
    ) -> Self {
        RedisTop {
            shared: Arc::new(Shared {
                conn,
                prefix,
                redactor,
                pending: Mutex::default(),
                sending: AtomicBool::new(false),
            }),
        }
    }

    pub(super) fn record(&self, policy: &str, key: &Key) {
        let shared = &self.shared;
        {
            let mut pending = shared.pending.lock().unwrap_or_else(|e| e.into_inner());
            match pending.get_mut(policy) {
                Some(sketch) => sketch.add(key, 1),
                None => pending
                    .entry(policy.into())
                    .or_insert_with(|| SpaceSaving::new(CAPACITY))
                    .add(key, 1),
            }
        }
        if shared.sending.swap(true, Ordering::AcqRel) {
            return;
        }
        match tokio::runtime::Handle::try_current() {
            // The task ends when the store is dropped (it keeps only a weak reference).
            Ok(runtime) => drop(runtime.spawn(send_every_second(Arc::downgrade(shared)))),
            Err(_) => shared.sending.store(false, Ordering::Release),
        }
    }

    /// The `n` largest sums over the window, from every process (what they have sent).
    pub(super) async fn top(
        &self,
        policy: &str,
        n: usize,
    ) -> Result<Vec<(String, u64)>, BackendError> {
        let now = unix_minute();
        let keys: Vec<String> = (0..WINDOW_MINUTES)
            .map(|back| set_key(&self.shared.prefix, policy, now.saturating_sub(back)))
            .collect();
        let pairs: Vec<(String, f64)> = redis::cmd("ZUNION")
            .arg(keys.len())
            .arg(&keys)
            .arg("WITHSCORES")
            .query_async(&mut self.shared.conn.clone())
            .await
            .map_err(|e| BackendError::with_source("cannot read the top limited keys", e))?;
        Ok(largest(
            pairs.into_iter().map(|(key, score)| (key, score as u64)),
            n,
        ))
    }
}

async fn send_every_second(shared: Weak<Shared>) {
    let mut every = tokio::time::interval(SEND_EVERY);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        every.tick().await;
        let Some(shared) = shared.upgrade() else {
            return;
        };
        shared.send().await;
    }
}

/// Adds each sum to a minute's set of at most [`CAPACITY`] keys, as the local summary does: a key
/// new to a full set takes the place and count of its least counted, so that one refused steadily
/// after the set filled builds its count up (a plain trim dropped it every second).
const MERGE: &str = r"
local set, capacity = KEYS[1], tonumber(ARGV[1])
for i = 3, #ARGV, 2 do
  local member, count = ARGV[i], tonumber(ARGV[i + 1])
  if redis.call('ZSCORE', set, member) then
    redis.call('ZINCRBY', set, count, member)
  elseif redis.call('ZCARD', set) < capacity then
    redis.call('ZADD', set, count, member)
  else
    local least = redis.call('ZPOPMIN', set)
    redis.call('ZADD', set, tonumber(least[2]) + count, member)
  end
end
redis.call('EXPIRE', set, ARGV[2])
";

impl Shared {
    /// Sends the sums since the last send: per policy, one script ([`MERGE`]), which keeps the
    /// set to [`CAPACITY`] keys and expires it one minute past the window.
    async fn send(&self) {
        let batch = std::mem::take(&mut *self.pending.lock().unwrap_or_else(|e| e.into_inner()));
        let minute = unix_minute();
        let merge = redis::Script::new(MERGE);
        for (policy, sketch) in batch {
            if sketch.counters().is_empty() {
                continue;
            }
            let mut call = merge.key(set_key(&self.prefix, &policy, minute));
            call.arg(CAPACITY).arg((WINDOW_MINUTES + 1) * 60);
            for counter in sketch.counters() {
                call.arg(show(&counter.key, &self.redactor))
                    .arg(counter.count);
            }
            let sent: redis::RedisResult<()> = call.invoke_async(&mut self.conn.clone()).await;
            if let Err(e) = sent {
                tracing::debug!(error = %e, policy = %policy, "the top limited keys were not sent");
            }
        }
    }
}
