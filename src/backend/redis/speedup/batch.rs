//! Coalesced exact batches: checks waiting on the connection at the same moment go to Redis in one
//! call, each decided in arrival order exactly as alone. A script call's fixed cost (the call,
//! `TIME`, `GET`, `SET`) is about that of deciding: one call for N pays it once (BENCHMARKS.md, 8).
//!
//! - GCRA: one `gcra_batch.lua` call; a run of identical checks (a hot key's) is one group,
//!   answered with one backlog, from which gcra_group.rs derives each answer.
//! - `CL.THROTTLE`: one pipelined write, a command per check (on a Cluster, alone: `cell.lua`).
//! - `limits.lua` (other algorithms, stacks): one `limits_batch.lua` call, an item per check; a
//!   failed item (`WRONGTYPE`) fails alone.
//!
//! A *lane* queues the waiting checks. One that finds its lane idle leaves at once; the others
//! leave with the next batch: when a batch in flight answers, once [`Lane::full`] (at once when
//! [`MAX_BATCH`] wait, however many are in flight: [`Lane::due`]), or when the *window* of a batch
//! in flight ends (the timeout / 20, at most 5 ms, from its sending) before it answers; a check
//! that finds no batch's window open leaves at once. So a check waits at most the window and one
//! round trip, never for the batch ahead of it: on a slow link (a round trip of 45 ms, a timeout
//! of 100 ms) that took two round trips and timed out (issue 50); where Redis answers within the
//! window, the window never ends a wait. A batch runs on a task of its own, whose one timer is its
//! window's, then its timeout's; each check keeps its timeout and breaker (it waits inside
//! `guarded`). One server has a lane per kind of call; a Cluster one per key (a migrating slot's
//! keys may be split between nodes; one key never is): a lane may then hold both kinds, one call
//! per run.

use std::collections::HashMap;
use std::future::Future;
use std::mem;
use std::pin::pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::Poll;
use std::time::Duration;

use redis::{ErrorKind, RedisError, ServerErrorKind};
use tokio::sync::oneshot;

use super::gcra_group;
use crate::backend::redis::conn::connection::RedisConnection;
use crate::backend::redis::conn::redirect::{left_mid_script, timed_out, unexpected};
use crate::backend::redis::wire::args::{Args, CellArgs};
use crate::backend::redis::wire::limits_call::LimitsCall;
use crate::backend::redis::wire::scripts::{self, Answer, GCRA_BATCH, LIMITS_BATCH};
use crate::decision::Decision;

/// Batches in flight per lane at most: while one is on the wire or in Redis, the next fills.
const IN_FLIGHT: usize = 2;

/// The window (see the module docs) at most; it is the timeout / 20 below 100 ms.
const WINDOW: Duration = Duration::from_millis(5);

/// Checks per batch at most: bounds one call's arguments and time in Redis (well under 1 ms).
pub(crate) const MAX_BATCH: usize = 128;

/// The lane of `CL.THROTTLE` checks on one server (the Lua lane is `""`; keys name a Cluster's).
const CELL_LANE: &str = "CL.THROTTLE";

/// The lane of `limits.lua` checks on one server.
const LIMITS_LANE: &str = "limits.lua";

/// What a waiting check asks.
enum Job {
    /// A GCRA decision (key, arguments, quantity) by `gcra.lua` (alone) or `gcra_batch.lua`.
    Gcra(String, Args, u64),
    /// A GCRA decision (key, arguments, quantity) by `CL.THROTTLE` (the cell lane).
    Cell(String, CellArgs, u64),
    /// A call of `limits.lua` (alone) or an item of `limits_batch.lua`.
    Limits(LimitsCall),
}

enum Reply {
    Gcra(Answer),
    Limits(Vec<Decision>),
}

struct Waiter {
    job: Job,
    answer: oneshot::Sender<Result<Reply, RedisError>>,
}

#[derive(Default)]
struct Lane {
    waiting: Vec<Waiter>,
    /// Batches in flight (each with its task).
    in_flight: usize,
    /// Checks in those batches.
    flying: usize,
    /// Checks in the batch that answered last.
    last_size: usize,
    /// Batches in flight whose window has not ended: while one is open, the checks waiting leave
    /// by its end at the latest.
    open_windows: usize,
}

impl Lane {
    /// Whether the waiting checks make a batch worth sending while another is in flight: as many as
    /// in flight, or as the last to answer held. A batch's callers come back together, so batches
    /// settle at half the callers, two in flight (one call per ~25 checks at 50 callers, against
    /// ~16 with whatever waited; BENCHMARKS.md, 8); a lone check after a lone check leaves at once.
    fn full(&self) -> bool {
        self.waiting.len() >= self.flying.max(self.last_size)
    }

    /// Whether a check just queued sends the waiting checks now: no batch in flight with its window
    /// open (none in flight, or those in flight slower than the window), a full batch behind
    /// fewer than [`IN_FLIGHT`], or a batch of [`MAX_BATCH`] however many are in flight: two
    /// batches a round trip would cap a lane (25,600 checks a second at 10 ms).
    fn due(&self) -> bool {
        self.open_windows == 0
            || (self.in_flight < IN_FLIGHT && self.full())
            || self.waiting.len() >= MAX_BATCH
    }

    /// The next batch: what waits, up to [`MAX_BATCH`], counted in flight, its window open.
    fn take(&mut self) -> Vec<Waiter> {
        let take = self.waiting.len().min(MAX_BATCH);
        self.in_flight += 1;
        self.open_windows += 1;
        self.flying += take;
        if take == self.waiting.len() {
            mem::take(&mut self.waiting)
        } else {
            self.waiting.drain(..take).collect()
        }
    }

    /// A batch's window ended before its answer: the checks waiting leave now (a check queues
    /// only while some window is open, so none waits past a window's end).
    fn window_ended(&mut self) -> Option<Vec<Waiter>> {
        self.open_windows = self.open_windows.saturating_sub(1);
        (!self.waiting.is_empty()).then(|| self.take())
    }

    /// A batch of `size` checks answered (or failed; `window_open`: within its window) and its
    /// task ends.
    fn ended(&mut self, size: usize, window_open: bool) {
        if window_open {
            self.open_windows = self.open_windows.saturating_sub(1);
        }
        self.in_flight = self.in_flight.saturating_sub(1);
        self.flying = if self.in_flight == 0 {
            0
        } else {
            self.flying.saturating_sub(size)
        };
    }
}

/// The lanes of one backend.
pub(crate) struct Batcher {
    conn: RedisConnection,
    timeout: Duration,
    /// How long queued checks wait for a batch in flight to answer before they leave anyway.
    window: Duration,
    /// A lane per key (a Cluster) rather than one for the connection.
    per_key: bool,
    lanes: Mutex<HashMap<Box<str>, Lane>>,
}

impl Batcher {
    pub(crate) fn new(conn: RedisConnection, timeout: Duration) -> Self {
        Batcher {
            per_key: conn.is_cluster(),
            conn,
            timeout,
            window: (timeout / 20).min(WINDOW),
            lanes: Mutex::new(HashMap::new()),
        }
    }

    /// One GCRA decision (no penalty box) by `gcra.lua`, alone or in a batch.
    pub(crate) async fn gcra(
        self: &Arc<Self>,
        key: &str,
        args: &Args,
        quantity: u64,
    ) -> Result<Answer, RedisError> {
        let lane_name: &str = if self.per_key { key } else { "" };
        let job = Job::Gcra(key.to_owned(), *args, quantity);
        gcra_answer(self.queue(lane_name, job).await?)
    }

    /// One `CL.THROTTLE` decision on one server, alone or in a pipelined batch.
    pub(crate) async fn cell(
        self: &Arc<Self>,
        key: &str,
        cell: CellArgs,
        quantity: u64,
    ) -> Result<Answer, RedisError> {
        debug_assert!(
            !self.per_key,
            "CL.THROTTLE checks are coalesced on one server only"
        );
        let job = Job::Cell(key.to_owned(), cell, quantity);
        gcra_answer(self.queue(CELL_LANE, job).await?)
    }

    /// One call of `limits.lua`, alone or as an item of a `limits_batch.lua` call.
    pub(crate) async fn limits(
        self: &Arc<Self>,
        call: LimitsCall,
    ) -> Result<Vec<Decision>, RedisError> {
        let lane_name: Box<str> = if self.per_key {
            call.first_key().into()
        } else {
            LIMITS_LANE.into()
        };
        match self.queue(&lane_name, Job::Limits(call)).await? {
            Reply::Limits(decisions) => Ok(decisions),
            Reply::Gcra(_) => Err(mixed_up()),
        }
    }

    /// Queues a check on `lane_name`, sends a batch if due, and waits for its answer (outside a
    /// tokio runtime, where no task can send a batch: sends it alone).
    async fn queue(self: &Arc<Self>, lane_name: &str, job: Job) -> Result<Reply, RedisError> {
        let (answer, receiver) = oneshot::channel();
        let waiter = Waiter { job, answer };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            let mut conn = self.conn.clone();
            let alone = send(&mut conn, std::slice::from_ref(&waiter)).await.pop();
            return alone.unwrap_or_else(|| Err(mixed_up()));
        };
        let leaving = {
            let mut lanes = self.lanes.lock().unwrap_or_else(PoisonError::into_inner);
            let lane = match lanes.get_mut(lane_name) {
                Some(lane) => lane,
                None => lanes.entry(lane_name.into()).or_default(),
            };
            lane.waiting.push(waiter);
            lane.due().then(|| lane.take())
        };
        if let Some(batch) = leaving {
            self.launch(&runtime, lane_name, batch);
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

    /// Sends `batch` (just taken) on a task of its own.
    fn launch(
        self: &Arc<Self>,
        runtime: &tokio::runtime::Handle,
        lane_name: &str,
        batch: Vec<Waiter>,
    ) {
        let batcher = self.clone();
        let lane_name: Box<str> = lane_name.into();
        runtime.spawn(async move { batcher.run(lane_name, batch).await });
    }

    /// `batch`'s answers within the timeout, or its timeout's; if they have not come when its
    /// window ends, the checks waiting on `lane_name` leave then (`window_open` turns false). One
    /// timer: the window's, reset to the timeout's.
    async fn send_timed(
        self: &Arc<Self>,
        conn: &mut RedisConnection,
        lane_name: &str,
        batch: &[Waiter],
        window_open: &mut bool,
    ) -> Vec<Result<Reply, RedisError>> {
        let sent_at = tokio::time::Instant::now();
        let mut sent = pin!(send(conn, batch));
        let mut timer = pin!(tokio::time::sleep_until(sent_at + self.window));
        let answers = std::future::poll_fn(|cx| {
            if let Poll::Ready(answers) = sent.as_mut().poll(cx) {
                return Poll::Ready(Some(answers));
            }
            while timer.as_mut().poll(cx).is_ready() {
                if !*window_open {
                    return Poll::Ready(None);
                }
                *window_open = false;
                self.window_ended(lane_name);
                timer.as_mut().reset(sent_at + self.timeout);
            }
            Poll::Pending
        })
        .await;
        answers.unwrap_or_else(|| batch.iter().map(|_| Err(timed_out())).collect())
    }

    /// A batch on `lane_name` did not answer within its window: the checks waiting leave now.
    fn window_ended(self: &Arc<Self>, lane_name: &str) {
        let mut lanes = self.lanes.lock().unwrap_or_else(PoisonError::into_inner);
        let batch = lanes.get_mut(lane_name).and_then(Lane::window_ended);
        drop(lanes);
        if let Some(batch) = batch {
            self.launch(&tokio::runtime::Handle::current(), lane_name, batch);
        }
    }

    /// Sends `batch`, then the batches that queued on `lane_name` meanwhile, until it is empty.
    async fn run(self: Arc<Self>, lane_name: Box<str>, mut batch: Vec<Waiter>) {
        let mut conn = self.conn.clone();
        // Dropped half-way (its runtime shut down), this task must not stay counted in flight.
        let mut unfinished = Unfinished {
            batcher: Some(self.clone()),
            lane: lane_name.clone(),
            size: batch.len(),
            window_open: true,
        };
        loop {
            // A check gone before its batch left (timed out, its client left) takes nothing.
            let size = batch.len();
            batch.retain(|w| !w.answer.is_closed());
            if !batch.is_empty() {
                let window_open = &mut unfinished.window_open;
                let answers = self
                    .send_timed(&mut conn, &lane_name, &batch, window_open)
                    .await;
                for (Waiter { job, answer: to }, answer) in batch.drain(..).zip(answers) {
                    match (answer, job) {
                        // Its key left its migrating slot as the batch ran (before the item
                        // wrote): alone, on a task (the batch's answers are not held up), it is
                        // redirected or waits like any check on a missing key.
                        (Err(e), Job::Limits(call)) if left_mid_script(&e) => {
                            let (mut conn, timeout) = (conn.clone(), self.timeout);
                            tokio::spawn(async move {
                                let answer = scripts::limits(&mut conn, &call);
                                let answer = tokio::time::timeout(timeout, answer).await;
                                let answer = answer.unwrap_or_else(|_| Err(timed_out()));
                                let _ = to.send(answer.map(Reply::Limits));
                            });
                        }
                        (answer, _) => drop(to.send(answer)),
                    }
                }
            }
            let mut lanes = self.lanes.lock().unwrap_or_else(PoisonError::into_inner);
            let Some(lane) = lanes.get_mut(&*lane_name) else {
                unfinished.batcher = None;
                return;
            };
            lane.last_size = size;
            lane.ended(size, unfinished.window_open);
            // The next batch leaves now if no window is open (none in flight, or slower than the
            // window) or it is full; else when one answers or a window ends.
            if lane.waiting.is_empty() || (lane.open_windows > 0 && !lane.full()) {
                if lane.in_flight == 0 && self.per_key {
                    lanes.remove(&*lane_name);
                }
                unfinished.batcher = None;
                return;
            }
            batch = lane.take();
            (unfinished.size, unfinished.window_open) = (batch.len(), true);
        }
    }
}

/// A lane's task that ends unfinished (dropped, a panic) gives its in-flight count back, and with
/// no other batch in flight drops the waiting checks (their callers fail at once).
struct Unfinished {
    batcher: Option<Arc<Batcher>>,
    lane: Box<str>,
    /// Checks in the task's batch.
    size: usize,
    /// Whether the batch's window is still open.
    window_open: bool,
}

impl Drop for Unfinished {
    fn drop(&mut self) {
        let Some(batcher) = self.batcher.take() else {
            return;
        };
        let mut lanes = batcher.lanes.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(lane) = lanes.get_mut(&*self.lane) {
            lane.ended(self.size, self.window_open);
            if lane.in_flight == 0 {
                lane.waiting.clear();
                if batcher.per_key {
                    lanes.remove(&*self.lane);
                }
            }
        }
    }
}

/// One batch of the cell lane: a `CL.THROTTLE` per check, pipelined; each command's error
/// (`WRONGTYPE`, "unknown command" once the module is gone) is its own check's.
async fn send_cell(
    conn: &mut RedisConnection,
    batch: &[Waiter],
) -> Result<Vec<Result<Reply, RedisError>>, RedisError> {
    let mut pipe = redis::pipe();
    for waiter in batch {
        if let Job::Cell(key, cell, quantity) = &waiter.job {
            pipe.add_command(scripts::throttle_command(key, *cell, *quantity));
        }
    }
    let replies: Vec<Result<[i64; 5], RedisError>> = pipe.ignore_errors().query_async(conn).await?;
    if replies.len() != batch.len() {
        return Err(unexpected(
            "the CL.THROTTLE pipeline returned the wrong number of replies",
        ));
    }
    Ok(replies
        .into_iter()
        .map(|reply| reply.map(|r| Reply::Gcra(scripts::cell_answer(r))))
        .collect())
}

/// One batch, one call per run of one kind: each check's answer, or its call's error.
async fn send(conn: &mut RedisConnection, batch: &[Waiter]) -> Vec<Result<Reply, RedisError>> {
    let mut answers = Vec::with_capacity(batch.len());
    let mut rest = batch;
    while let [first, ..] = rest {
        let run = rest
            .iter()
            // The same script: one call.
            .take_while(|w| mem::discriminant(&w.job) == mem::discriminant(&first.job))
            .count();
        let (now, later) = rest.split_at(run);
        let sent = match first.job {
            Job::Cell(..) => send_cell(conn, now).await,
            Job::Gcra(..) => send_gcra(conn, now).await,
            Job::Limits(_) => send_limits(conn, now).await,
        };
        match sent {
            Ok(replies) => answers.extend(replies),
            Err(e) => answers.extend(now.iter().map(|_| Err(e.clone()))),
        }
        rest = later;
    }
    answers
}

/// A run of `limits.lua` checks: alone on `limits.lua`, several on `limits_batch.lua`.
async fn send_limits(
    conn: &mut RedisConnection,
    batch: &[Waiter],
) -> Result<Vec<Result<Reply, RedisError>>, RedisError> {
    let calls: Vec<&LimitsCall> = batch
        .iter()
        .filter_map(|w| match &w.job {
            Job::Limits(call) => Some(call),
            _ => None,
        })
        .collect();
    if let [one] = calls[..] {
        return scripts::limits(conn, one)
            .await
            .map(|decisions| vec![Ok(Reply::Limits(decisions))]);
    }
    let mut invocation = LIMITS_BATCH.prepare_invoke();
    invocation.arg(calls.len());
    for call in &calls {
        let (keys, args) = (call.keys(), call.args());
        invocation
            .arg(keys.len())
            .arg(args.len())
            .arg(args)
            .key(keys);
    }
    let reply: Vec<redis::Value> = invocation.invoke_async(conn).await?;
    let wrong_length =
        || unexpected("the limits batch script returned a reply of the wrong length");
    let mut answers = Vec::with_capacity(calls.len());
    let mut rest = &reply[..];
    for call in calls {
        let len = call.reply_len();
        if rest.len() < len {
            return Err(wrong_length());
        }
        let (mine, later) = rest.split_at(len);
        rest = later;
        let answer = match &mine[0] {
            // This item failed (its error's text): the error limits.lua alone would have met.
            redis::Value::BulkString(text) => Err(scripts::failed_item(text)),
            _ => mine
                .iter()
                .map(redis::from_redis_value_ref::<i64>)
                .collect::<Result<Vec<i64>, _>>()
                .map_err(RedisError::from)
                .and_then(|ints| scripts::limits_decisions(call, &ints))
                .map(Reply::Limits),
        };
        answers.push(answer);
    }
    if !rest.is_empty() {
        return Err(wrong_length());
    }
    Ok(answers)
}

/// A run of GCRA checks: alone on `gcra.lua`, several on `gcra_batch.lua`.
async fn send_gcra(
    conn: &mut RedisConnection,
    batch: &[Waiter],
) -> Result<Vec<Result<Reply, RedisError>>, RedisError> {
    let items: Vec<(&str, &Args, u64)> = batch
        .iter()
        .filter_map(|w| match &w.job {
            Job::Gcra(key, args, quantity) => Some((key.as_str(), args, *quantity)),
            _ => None,
        })
        .collect();
    if let [(key, args, quantity)] = items[..] {
        return scripts::gcra(conn, key, args, quantity)
            .await
            .map(|answer| vec![Ok(Reply::Gcra(answer))]);
    }
    // Runs of the same key, quota and quantity are one group (see the script's header).
    let mut invocation = GCRA_BATCH.prepare_invoke();
    let mut groups = Vec::new();
    let mut last_quota = None;
    let mut rest = &items[..];
    while let [(key, args, quantity), ..] = rest {
        let same = |a: &Args| (a.interval, a.tolerance, a.limit, a.ceiling);
        let run = rest
            .iter()
            .take_while(|(k, a, q)| k == key && q == quantity && same(a) == same(args))
            .count();
        let quota = (args.interval, args.tolerance, args.ceiling);
        let (count, numbers) = gcra_group::group_args(&mut last_quota, quota, *quantity, run);
        invocation.key(*key).arg(count);
        if let Some(numbers) = numbers {
            invocation.arg(&numbers[..]);
        }
        groups.push((*args, *quantity, run));
        rest = &rest[run..];
    }
    let reply: Vec<i64> = invocation.invoke_async(conn).await?;
    if reply.len() != groups.len() {
        return Err(unexpected(
            "the batch script returned a reply of the wrong length",
        ));
    }
    let mut answers = Vec::with_capacity(items.len());
    let mut replies = Vec::new();
    for ((args, quantity, run), backlog) in groups.into_iter().zip(reply) {
        let Ok(backlog) = u64::try_from(backlog) else {
            // This group's key holds another type: the error gcra.lua alone would have met.
            let wrongtype = RedisError::from((
                ErrorKind::Server(ServerErrorKind::ResponseError),
                "WRONGTYPE",
                "Operation against a key holding the wrong kind of value".to_owned(),
            ));
            answers.extend((0..run).map(|_| Err(wrongtype.clone())));
            continue;
        };
        replies.clear();
        let quota = (args.interval, args.tolerance, args.limit);
        gcra_group::push_replies(&mut replies, backlog, quota, quantity, run);
        answers.extend(replies.iter().map(|&r| {
            Ok(Reply::Gcra(Answer {
                decision: scripts::from_reply(r, Duration::from_nanos),
                whole_seconds: false,
            }))
        }));
    }
    Ok(answers)
}

/// A GCRA check's answer (a GCRA or `CL.THROTTLE` call answers in that kind).
fn gcra_answer(reply: Reply) -> Result<Answer, RedisError> {
    match reply {
        Reply::Gcra(answer) => Ok(answer),
        Reply::Limits(_) => Err(mixed_up()),
    }
}

/// A reply of the wrong kind for its check (a bug: each job's call answers in its own kind).
fn mixed_up() -> RedisError {
    unexpected("a batch answered a check with a reply of another kind")
}

#[cfg(test)]
#[path = "batch_tests.rs"]
mod tests;
