//! Concurrency leases: the tokens that name a request's slots, their renewal while the request runs
//! (`renew.lua`), and their release.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::task::AbortHandle;

use crate::backend::redis::conn::connection::RedisConnection;
use crate::backend::redis::conn::server::is_unreachable;
use crate::backend::redis::wire::scripts::RENEW;
use crate::backoff::Backoff;
use crate::timer::spawn;

/// The concurrency leases of one backend: tokens to draw, the renewal task of each lease in flight
/// (holding this weakly: they stop with the backend), and the connection they go through.
pub(crate) struct Leases {
    /// A per-process random seed and a counter: see [`next_token`](Self::next_token).
    seed: u64,
    next: AtomicU64,
    conn: RedisConnection,
    timeout: Duration,
    /// The renewal task of each concurrency lease held by a request in flight, by token.
    held: Mutex<HashMap<u64, AbortHandle>>,
}

impl Leases {
    /// No lease held; each call on `conn` bounded by `timeout`.
    pub(crate) fn new(conn: RedisConnection, timeout: Duration) -> Self {
        use std::hash::BuildHasher;
        let seed = std::collections::hash_map::RandomState::new()
            .hash_one((std::process::id(), std::time::SystemTime::now()));
        Leases {
            seed,
            next: AtomicU64::new(0),
            conn,
            timeout,
            held: Mutex::default(),
        }
    }

    /// A fresh token, never 0, naming one call's units: unique in the process (a bijection of a
    /// counter and a seed), so no release removes another's; across processes, 2^-64 to collide.
    pub(crate) fn next_token(&self) -> u64 {
        loop {
            let n = self.next.fetch_add(1, Ordering::Relaxed);
            // splitmix64: distinct counters give distinct tokens. 0 means "no lease".
            let mut z = self
                .seed
                .wrapping_add(n.wrapping_mul(0x9e37_79b9_7f4a_7c15));
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^= z >> 31;
            if z != 0 {
                return z;
            }
        }
    }

    /// Extends a request's leases every third of the lease, counted from when the check that
    /// took them was `sent` (the lease runs from then, not from its answer), until
    /// [`release`](Self::release).
    pub(crate) fn hold(
        self: &Arc<Self>,
        (key, token, quantity): (String, u64, u64),
        lease: Duration,
        sent: Instant,
    ) {
        let weak = Arc::downgrade(self);
        let lease_us = lease.as_micros().max(1) as u64;
        let every = (lease / 3).max(Duration::from_millis(10));
        let mut next = tokio::time::Instant::from_std(sent);
        let Some(task) = spawn(async move {
            loop {
                // A renewal due before the answer came goes at once, and once.
                next = (next + every).max(tokio::time::Instant::now());
                tokio::time::sleep_until(next).await;
                let Some(leases) = weak.upgrade() else {
                    return;
                };
                let mut invocation = RENEW.prepare_invoke();
                invocation.key(&key).arg(token).arg(quantity).arg(lease_us);
                let mut conn = leases.conn.clone();
                let renew = invocation.invoke_async::<i64>(&mut conn);
                match tokio::time::timeout(leases.timeout, renew).await {
                    // Every lease is gone (ended, or released meanwhile): nothing left to keep.
                    Ok(Ok(0)) => {
                        leases.held_mut().remove(&token);
                        return;
                    }
                    Ok(Ok(_)) => {}
                    // Redis is away: try again at the next tick, while the leases still run.
                    Ok(Err(e)) => {
                        tracing::debug!(error = %e, "a concurrency lease was not renewed")
                    }
                    Err(_) => tracing::debug!("a concurrency lease was not renewed in time"),
                }
            }
        }) else {
            return;
        };
        self.held_mut().insert(token, task.abort_handle());
    }

    /// A request is done with its slots: stops renewing its lease and removes its units.
    pub(crate) fn release(
        self: &Arc<Self>,
        key: String,
        token: u64,
        quantity: u64,
        lease: Duration,
    ) {
        if let Some(renewal) = self.held_mut().remove(&token) {
            renewal.abort();
        }
        self.give_back(key, token, quantity, lease);
    }

    /// Removes a request's units on a spawned task, past the breaker, retried until Redis answers or
    /// the lease ends (a lost release holds a slot a whole lease; without a runtime, it expires).
    fn give_back(self: &Arc<Self>, key: String, token: u64, quantity: u64, lease: Duration) {
        if quantity == 0 {
            return;
        }
        let leases = self.clone();
        let give_up = Instant::now() + lease;
        spawn(async move {
            let members: Vec<String> = (0..quantity).map(|i| format!("{token}:{i}")).collect();
            let mut backoff = Backoff::new(Duration::from_millis(20), Duration::from_secs(1));
            loop {
                let mut cmd = redis::cmd("ZREM");
                cmd.arg(&key).arg(&members);
                let mut conn = leases.conn.clone();
                let call = cmd.query_async::<u64>(&mut conn);
                match tokio::time::timeout(leases.timeout, call).await {
                    Ok(Ok(_)) => return,
                    // A failover's READONLY too is tried again: the slot is held until it ends.
                    Ok(Err(e)) if !is_unreachable(&e) => {
                        tracing::debug!(error = %e, "a concurrency slot was not released; its lease will expire");
                        return;
                    }
                    _ => {}
                }
                let wait = backoff.wait();
                if Instant::now() + wait >= give_up {
                    tracing::debug!("Redis stayed unreachable; a concurrency slot will be freed when its lease expires");
                    return;
                }
                tokio::time::sleep(wait).await;
            }
        });
    }

    fn held_mut(&self) -> MutexGuard<'_, HashMap<u64, AbortHandle>> {
        self.held
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// The units a concurrency check may have taken; dropped unanswered, it gives them back.
pub(crate) struct Unanswered {
    pub(crate) leases: Arc<Leases>,
    pub(crate) key: String,
    pub(crate) token: u64,
    pub(crate) quantity: u64,
    pub(crate) lease: Duration,
}

impl Drop for Unanswered {
    fn drop(&mut self) {
        let key = std::mem::take(&mut self.key);
        self.leases
            .give_back(key, self.token, self.quantity, self.lease);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::redis::conn::lazy_cluster::LazyCluster;

    #[test]
    fn lease_tokens_are_distinct_and_never_zero() {
        let nowhere = Arc::new(LazyCluster::new(String::new()));
        let leases = Leases::new(RedisConnection::Cluster(nowhere), Duration::ZERO);
        let drawn: std::collections::HashSet<u64> =
            (0..100_000).map(|_| leases.next_token()).collect();
        assert_eq!(drawn.len(), 100_000);
        assert!(!drawn.contains(&0));
    }
}
