//! Coalesced exact batches: GCRA decisions that wait on the connection at the same moment go to
//! Redis in one call of `gcra_batch.lua`, which decides each in arrival order exactly as `gcra.lua`
//! would have alone (same decision, same stored state), and each waiting check gets its own answer.
//!
//! Why: a script call costs Redis about as much in fixed overhead (the call, `TIME`, the key's
//! `GET` and `SET`) as in deciding, and under concurrency many checks wait on the same connection
//! anyway. One call for N of them pays that overhead once, and on a hot key reads and writes its
//! state once (BENCHMARKS.md, section 8).
//!
//! How: a *lane* queues the checks that wait. A check that finds its lane with fewer than
//! [`IN_FLIGHT`] batches in flight leaves at once (alone, on `gcra.lua`: no added latency without
//! concurrency); otherwise it waits for the next batch, which leaves as soon as one in flight
//! answers and takes everything queued up to [`MAX_BATCH`]. A batch runs on a task of its own, under
//! the backend's timeout; each check keeps its own timeout and breaker (it waits for its answer
//! inside `guarded`), and a batch that fails fails each of its checks with the same error.
//!
//! One server has one lane. A Cluster has one lane per Redis key: a script's keys must share a
//! slot, and keys of one slot can still be split between two nodes while the slot migrates (Redis
//! answers `TRYAGAIN` to a multi-key call then); one key is always on one node. Checks of different
//! keys on a Cluster are not coalesced: they rarely share a slot (each client key has its own hash
//! tag).

use std::collections::HashMap;
use std::mem;
use std::sync::{Arc, LazyLock, Mutex, PoisonError};
use std::time::Duration;

use redis::{ErrorKind, RedisError, Script, ServerErrorKind};
use tokio::sync::oneshot;

use super::args::Args;
use super::connection::RedisConnection;
use super::scripts::{self, Answer};

/// See the script's header.
static GCRA_BATCH: LazyLock<Script> = LazyLock::new(|| Script::new(super::lua::GCRA_BATCH));

/// Batches in flight per lane. Two: while one is on the wire or in Redis, the next fills, and
/// leaves as soon as a batch answers; a single check never waits behind a batch when the lane is
/// idle or half busy.
const IN_FLIGHT: usize = 2;

/// Checks per batch at most: bounds one call's arguments and the time Redis spends in it (about
/// 0.6 µs an item on one key, so well under a millisecond).
pub(super) const MAX_BATCH: usize = 128;

/// A check waiting for its batch.
struct Waiter {
    key: String,
    args: Args,
    quantity: u64,
    answer: oneshot::Sender<Result<Answer, RedisError>>,
}

#[derive(Default)]
struct Lane {
    waiting: Vec<Waiter>,
    in_flight: usize,
}

/// The lanes of one backend.
pub(super) struct Batcher {
    conn: RedisConnection,
    timeout: Duration,
    /// A lane per key (a Cluster) rather than one for the connection.
    per_key: bool,
    lanes: Mutex<HashMap<Box<str>, Lane>>,
}

impl Batcher {
    /// The lanes of a backend on `conn`; a batch gives up after `timeout`.
    pub(super) fn new(conn: RedisConnection, timeout: Duration) -> Self {
        Batcher {
            per_key: conn.is_cluster(),
            conn,
            timeout,
            lanes: Mutex::new(HashMap::new()),
        }
    }

    /// One GCRA decision (no penalty box) by `gcra.lua`, alone or in a batch.
    pub(super) async fn gcra(
        self: &Arc<Self>,
        key: &str,
        args: &Args,
        quantity: u64,
    ) -> Result<Answer, RedisError> {
        debug_assert!(args.penalty.is_none(), "penalty boxes are never batched");
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            let mut conn = self.conn.clone();
            return scripts::gcra(&mut conn, key, args, quantity).await;
        };
        let lane_name: &str = if self.per_key { key } else { "" };
        let (sender, receiver) = oneshot::channel();
        let waiter = Waiter {
            key: key.to_owned(),
            args: args.clone(),
            quantity,
            answer: sender,
        };
        let leaving = {
            let mut lanes = self.lanes.lock().unwrap_or_else(PoisonError::into_inner);
            let lane = match lanes.get_mut(lane_name) {
                Some(lane) => lane,
                None => lanes.entry(lane_name.into()).or_default(),
            };
            lane.waiting.push(waiter);
            if lane.in_flight < IN_FLIGHT {
                lane.in_flight += 1;
                Some(mem::take(&mut lane.waiting))
            } else {
                None
            }
        };
        if let Some(batch) = leaving {
            let batcher = self.clone();
            let lane_name: Box<str> = lane_name.into();
            runtime.spawn(async move { batcher.run(lane_name, batch).await });
        }
        match receiver.await {
            Ok(answer) => answer,
            // The batch's task ended without answering: its runtime is shutting down.
            Err(_) => Err(RedisError::from((
                ErrorKind::Io,
                "the batch of this check was dropped",
            ))),
        }
    }

    /// Sends `batch`, then the batches that queued on `lane_name` meanwhile, until it is empty.
    async fn run(self: Arc<Self>, lane_name: Box<str>, mut batch: Vec<Waiter>) {
        let mut conn = self.conn.clone();
        // If this task is dropped half-way (its runtime shut down while the backend lives on in
        // another), the lane must not keep counting it in flight: it would hold every later check
        // in `waiting`, unsent, until its timeout.
        let mut unfinished = Unfinished {
            batcher: Some(self.clone()),
            lane: lane_name.clone(),
        };
        loop {
            // A check that went away (timed out, or its client left) before its batch left is
            // not decided: it takes nothing from the limit.
            batch.retain(|w| !w.answer.is_closed());
            if !batch.is_empty() {
                match tokio::time::timeout(self.timeout, send(&mut conn, &batch)).await {
                    Ok(Ok(answers)) => {
                        for (waiter, answer) in batch.drain(..).zip(answers) {
                            let _ = waiter.answer.send(answer);
                        }
                    }
                    Ok(Err(e)) => {
                        for waiter in batch.drain(..) {
                            let _ = waiter.answer.send(Err(e.clone()));
                        }
                    }
                    Err(_) => {
                        let e =
                            RedisError::from(std::io::Error::from(std::io::ErrorKind::TimedOut));
                        for waiter in batch.drain(..) {
                            let _ = waiter.answer.send(Err(e.clone()));
                        }
                    }
                }
            }
            let mut lanes = self.lanes.lock().unwrap_or_else(PoisonError::into_inner);
            let Some(lane) = lanes.get_mut(&*lane_name) else {
                unfinished.batcher = None;
                return;
            };
            if lane.waiting.is_empty() {
                lane.in_flight -= 1;
                if lane.in_flight == 0 && self.per_key {
                    lanes.remove(&*lane_name);
                }
                unfinished.batcher = None;
                return;
            }
            let take = lane.waiting.len().min(MAX_BATCH);
            batch = if take == lane.waiting.len() {
                mem::take(&mut lane.waiting)
            } else {
                lane.waiting.drain(..take).collect()
            };
        }
    }
}

/// The in-flight count of a lane whose task ends without finishing (dropped, or a panic): given
/// back, and when no other batch is in flight the checks still waiting are dropped (their callers
/// then fail at once, "the batch of this check was dropped", instead of waiting out the timeout).
struct Unfinished {
    batcher: Option<Arc<Batcher>>,
    lane: Box<str>,
}

impl Drop for Unfinished {
    fn drop(&mut self) {
        let Some(batcher) = self.batcher.take() else {
            return;
        };
        let mut lanes = batcher.lanes.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(lane) = lanes.get_mut(&*self.lane) {
            lane.in_flight = lane.in_flight.saturating_sub(1);
            if lane.in_flight == 0 {
                lane.waiting.clear();
                if batcher.per_key {
                    lanes.remove(&*self.lane);
                }
            }
        }
    }
}

/// One batch: alone on `gcra.lua`, several on `gcra_batch.lua`.
async fn send(
    conn: &mut RedisConnection,
    batch: &[Waiter],
) -> Result<Vec<Result<Answer, RedisError>>, RedisError> {
    if let [one] = batch {
        return scripts::gcra(conn, &one.key, &one.args, one.quantity)
            .await
            .map(|answer| vec![Ok(answer)]);
    }
    // Runs of the same key, quota and quantity travel as one group (see the script's header).
    let mut invocation = GCRA_BATCH.prepare_invoke();
    let mut ceilings = Vec::new();
    let mut rest = batch;
    while let [first, ..] = rest {
        let run = rest
            .iter()
            .take_while(|w| {
                w.key == first.key
                    && w.quantity == first.quantity
                    && (
                        w.args.interval,
                        w.args.tolerance,
                        w.args.limit,
                        w.args.ceiling,
                    ) == (
                        first.args.interval,
                        first.args.tolerance,
                        first.args.limit,
                        first.args.ceiling,
                    )
            })
            .count();
        invocation
            .key(&first.key)
            .arg(first.args.interval)
            .arg(first.args.tolerance)
            .arg(first.args.limit)
            .arg(first.quantity)
            .arg(run);
        ceilings.push(first.args.ceiling);
        rest = &rest[run..];
    }
    // A metered limit's debt is read as debt (see the script's header): only when there is one.
    if batch.iter().any(|w| w.args.metered()) {
        for ceiling in ceilings {
            invocation.arg(ceiling);
        }
    }
    let reply: Vec<i64> = invocation.invoke_async(&mut conn.redirecting()).await?;
    if reply.len() != 5 * batch.len() {
        return Err(RedisError::from((
            ErrorKind::UnexpectedReturnType,
            "the batch script returned a reply of the wrong length",
        )));
    }
    Ok(reply
        .chunks_exact(5)
        .map(|r| {
            if r[0] < 0 {
                // This item's key holds another type: the error gcra.lua alone would have met.
                return Err(RedisError::from((
                    ErrorKind::Server(ServerErrorKind::ResponseError),
                    "WRONGTYPE",
                    "Operation against a key holding the wrong kind of value".to_owned(),
                )));
            }
            Ok(Answer {
                decision: scripts::from_reply([r[0], r[1], r[2], r[3], r[4]], Duration::from_nanos),
                whole_seconds: false,
                banned: false,
            })
        })
        .collect())
}
