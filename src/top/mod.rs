//! Who is limited most: per policy, a bounded heavy-hitter summary (Space-Saving, in `sketch.rs`) of the
//! keys refused over the last few minutes. Kept by [`Offenders`](crate::ops::Offenders)
//! beside its distinct counts, read with [`ThrottleHandle::top`](crate::ops::ThrottleHandle::top).
//!
//! * **In memory** (one process): one summary of [`CAPACITY`] counters per policy and minute, the
//!   last [`WINDOW_MINUTES`] minutes kept; a read sums them and trims to `n`.
//! * **On Redis** (every process): each process sums its refusals locally (a summary of
//!   [`CAPACITY`] counters per policy) and once a second adds them, in one script, into a sorted
//!   set per policy and minute, `{<prefix>:top:<policy>}:<minute>`, of at most [`CAPACITY`] keys
//!   (a new key takes the least counted one's place and count) and expiring after the window; a
//!   read is one `ZUNION` of the window's sets. Redis's work is per distinct key per second, not per refusal.
//!
//! "The last few minutes" is the current minute and the [`WINDOW_MINUTES`]` - 1` before it (UTC
//! minutes): between four and five minutes. Keys appear as logs show them: with
//! [`redact_keys`](crate::ThrottleLayerBuilder::redact_keys), pseudonyms (`hmac:` and 16 hex
//! digits) under the layer's secret.

mod base;
#[cfg(feature = "redis")]
mod redis;
pub(crate) mod sketch;
#[cfg(test)]
pub(crate) mod zipf;

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, OnceLock};

use crate::error::BackendError;
use crate::key::Key;
use crate::observe::Redactor;
use base::{show, unix_minute};
pub use base::{CAPACITY, MAX_TOP, WINDOW_MINUTES};
use sketch::{largest, SpaceSaving};

#[cfg(feature = "redis")]
use crate::backend::redis::connection::RedisConnection;

/// A limited key and how many of its requests were refused over the window (an estimate: at most
/// the refusals of a minute divided by [`CAPACITY`] too many per minute).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct TopKey {
    /// The key as logs show it (a pseudonym when keys are redacted).
    pub key: String,
    /// Refused requests.
    pub limited: u64,
}

/// The summaries of every policy, and how keys are shown.
pub(crate) struct TopLimited {
    store: Store,
    /// Set once when the layer redacts keys (shared with the Redis store's sending task).
    redactor: Arc<OnceLock<Redactor>>,
}

enum Store {
    Memory(Mutex<HashMap<Box<str>, Minutes>>),
    #[cfg(feature = "redis")]
    Redis(redis::RedisTop),
}

/// One policy's summaries, the newest last.
#[derive(Default)]
struct Minutes(VecDeque<(u64, SpaceSaving<Key>)>);

impl Minutes {
    fn add(&mut self, minute: u64, key: &Key) {
        if self.0.back().is_none_or(|(m, _)| *m != minute) {
            self.0.push_back((minute, SpaceSaving::new(CAPACITY)));
        }
        while self
            .0
            .front()
            .is_some_and(|(m, _)| *m + WINDOW_MINUTES <= minute)
        {
            self.0.pop_front();
        }
        if let Some((_, sketch)) = self.0.back_mut() {
            sketch.add(key, 1);
        }
    }
}

impl TopLimited {
    pub(crate) fn in_memory() -> Self {
        TopLimited {
            store: Store::Memory(Mutex::default()),
            redactor: Arc::default(),
        }
    }

    #[cfg(feature = "redis")]
    pub(crate) fn redis(conn: RedisConnection, prefix: String) -> Self {
        let redactor = Arc::<OnceLock<Redactor>>::default();
        TopLimited {
            store: Store::Redis(redis::RedisTop::new(conn, prefix, redactor.clone())),
            redactor,
        }
    }

    /// Shows keys as pseudonyms from now on (the first redactor given stays).
    pub(crate) fn redact_with(&self, redactor: Redactor) {
        let _ = self.redactor.set(redactor);
    }

    pub(crate) fn record(&self, policy: &str, key: &Key) {
        match &self.store {
            Store::Memory(policies) => {
                let minute = unix_minute();
                let mut policies = policies.lock().unwrap_or_else(|e| e.into_inner());
                match policies.get_mut(policy) {
                    Some(minutes) => minutes.add(minute, key),
                    None => policies.entry(policy.into()).or_default().add(minute, key),
                }
            }
            #[cfg(feature = "redis")]
            Store::Redis(redis) => redis.record(policy, key),
        }
    }

    pub(crate) async fn top(&self, policy: &str, n: usize) -> Result<Vec<TopKey>, BackendError> {
        let n = n.min(MAX_TOP);
        let pairs: Vec<(String, u64)> = match &self.store {
            Store::Memory(policies) => {
                let now = unix_minute();
                let policies = policies.lock().unwrap_or_else(|e| e.into_inner());
                let counted = policies.get(policy).map(|m| &m.0).into_iter().flatten();
                let pairs: Vec<(&Key, u64)> = counted
                    .filter(|(minute, _)| minute + WINDOW_MINUTES > now)
                    .flat_map(|(_, sketch)| sketch.counters().iter().map(|c| (&c.key, c.count)))
                    .collect();
                // Summed by key before keys are shown: redaction runs n times, not per counter.
                largest(pairs, n)
                    .into_iter()
                    .map(|(key, count)| (show(key, &self.redactor), count))
                    .collect()
            }
            #[cfg(feature = "redis")]
            Store::Redis(redis) => redis.top(policy, n).await?,
        };
        Ok(pairs
            .into_iter()
            .map(|(key, limited)| TopKey { key, limited })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::zipf::{true_top, zipf_stream};
    use super::*;

    #[tokio::test]
    async fn the_true_top_10_of_a_zipf_stream_come_back_largest_first() {
        let top = TopLimited::in_memory();
        let (stream, exact) = zipf_stream(100_000, 11);
        for client in &stream {
            top.record("api", &Key::from(format!("client-{client}")));
        }
        top.record("other", &Key::from("client-1"));
        let answer = top.top("api", 20).await.unwrap();
        assert_eq!(answer.len(), 20);
        assert!(answer.windows(2).all(|w| w[0].limited >= w[1].limited));
        for client in true_top(&exact, 10) {
            let key = format!("client-{client}");
            assert!(answer.iter().any(|t| t.key == key), "{key}: {answer:?}");
        }
        assert_eq!(top.top("other", 20).await.unwrap().len(), 1);
        assert!(top.top("none", 20).await.unwrap().is_empty());
    }

    #[tokio::test]
    async fn redacted_keys_are_pseudonyms() {
        let top = TopLimited::in_memory();
        top.redact_with(
            crate::observe::RedactionSecret::new([7u8; 32])
                .unwrap()
                .hmac(),
        );
        top.record("api", &Key::from("alice"));
        let answer = top.top("api", 5).await.unwrap();
        assert_eq!(answer.len(), 1);
        assert!(answer[0].key.starts_with("hmac:"), "{answer:?}");
        assert!(!answer[0].key.contains("alice"));
    }

    #[test]
    fn old_minutes_fall_out_of_the_window() {
        let mut minutes = Minutes::default();
        for minute in 100..110 {
            minutes.add(minute, &Key::from("k"));
        }
        let kept: Vec<u64> = minutes.0.iter().map(|(m, _)| *m).collect();
        assert_eq!(kept, [105, 106, 107, 108, 109]);
    }
}
