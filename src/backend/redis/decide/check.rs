//! The way of one check: the deny cache, the breaker and timeout, the path the mode picks, and what
//! the answer leaves behind (a cached rejection, a held lease).

use std::sync::Arc;
use std::time::Instant;

use redis::RedisError;

use std::sync::atomic::Ordering;

use super::deny::Rejection;
use super::lease::Unanswered;
use crate::backend::redis::conn::connection::is_unknown_command;
use crate::backend::redis::health::breaker::{guarded, guarded_on, Guarded};
use crate::backend::redis::speedup::budget::{Fetching, Local};
use crate::backend::redis::state::RedisState;
use crate::backend::redis::wire::args::{
    keyed_state_key, redis_key, stack_error, state_key, Args, Spec,
};
use crate::backend::redis::wire::limits_call::LimitsCall;
use crate::backend::redis::wire::mode::RedisMode;
use crate::backend::redis::wire::scripts::{self, Answer};
use crate::budget::Budget;
use crate::decision::Decision;
use crate::error::BackendError;
use crate::key::Key;
use crate::limit::{Algorithm, Limit};
use crate::penalty::Penalty;

/// The future of one limit's decision.
pub(crate) type DecisionFuture = Guarded<Decision>;

/// The future of a stack's decisions: one per limit, in order.
pub(crate) type StackFuture = Guarded<Vec<Decision>>;

/// A call refused before it reaches Redis: `why`, at once.
pub(crate) fn failed<T: Send + 'static>(why: impl Into<String>) -> Guarded<T> {
    Box::pin(std::future::ready(Err(BackendError::new(why))))
}

impl RedisState {
    /// One limit: the GCRA on `gcra.lua` or `CL.THROTTLE`, any other algorithm on the limits
    /// script.
    pub(crate) fn check(
        self: &Arc<Self>,
        limit: &Limit,
        key: &Key,
        quantity: u64,
    ) -> DecisionFuture {
        // A penalty box's strikes and ban are struck by the limits script, in the same call.
        let args = match Args::new(limit, self.detector.may_use_cell()) {
            Some(args) if limit.penalty().is_none() => args,
            _ => return self.check_window(limit, key, quantity),
        };
        // A key known to be limited stays limited, whether Redis answers or not.
        let redis_key = redis_key(&self.prefix, limit.name(), key);
        // One reading of the clock: the deny cache's now, and when the call was sent.
        let sent = Instant::now();
        // Before the budget: a denied hot key costs no slice bookkeeping and asks for no slice.
        let deny = self.deny.as_ref();
        let cached = deny.map(|d| d.get(&redis_key, quantity, args.interval, args.tolerance, sent));
        let generation = match cached {
            Some(Ok(denied)) => return Box::pin(std::future::ready(Ok(denied))),
            Some(Err(generation)) => generation,
            None => 0,
        };
        // A leased budget: admitted from this process's slice, or a slice to fetch (budget.rs).
        let fetch = match limit.budget() {
            Some(budget) => match self.budgets.local(&redis_key, budget, args.limit, quantity) {
                Local::Admit(decision) => return Box::pin(std::future::ready(Ok(decision))),
                Local::AdmitAndRefill(decision, want, fetching) => {
                    self.refill(&redis_key, &args, *budget, want, fetching);
                    return Box::pin(std::future::ready(Ok(decision)));
                }
                Local::Fetch(want, fetching) => Some((*budget, want, fetching)),
                Local::PerRequest => None,
            },
            None => None,
        };
        let state = self.clone();
        // The call owns its key; the breaker (a Cluster node's, by the slot) is picked first.
        let node = self.breaker.node_for(&redis_key);
        guarded_on(&self.breaker, node, self.timeout, async move {
            let Answer {
                decision,
                whole_seconds,
            } = match fetch {
                Some((budget, want, fetching)) => {
                    let mut conn = state.conn.clone();
                    let fetched = state
                        .budgets
                        .fetch(&mut conn, &fetching, &args, &budget, quantity, want);
                    // Boxed, as `decide`'s unbatched calls: rare, and would swell every future.
                    let answer = Box::pin(fetched).await?;
                    state.granted(&redis_key, answer.decision.allowed);
                    answer
                }
                None => state.decide(&redis_key, &args, quantity).await?,
            };
            if let Some(cache) = &state.deny
                && !decision.allowed
            {
                // Timed from the sending: Redis decided later, so it is held no later than meant.
                let rejection = Rejection {
                    decision,
                    interval: args.interval,
                    tolerance: args.tolerance,
                    whole_seconds,
                    until_retry: false,
                };
                cache.insert(&redis_key, quantity, rejection, sent, generation);
            }
            Ok(decision)
        })
    }

    /// A stack of limits on one key decided together, with `each[i]` units under `limits[i]` if
    /// given (a metered stack): one call.
    pub(crate) fn check_stack(
        self: &Arc<Self>,
        limits: &[Limit],
        key: &Key,
        quantity: u64,
        each: Option<&[u64]>,
    ) -> StackFuture {
        if let Err(why) = stack_error(limits) {
            return failed(why);
        }
        if let Some(each) = each
            && each.len() != limits.len()
        {
            let (n, limits) = (each.len(), limits.len());
            return failed(format!("{n} quantities for a stack of {limits} limits"));
        }
        let token = self.leases.next_token();
        self.send_limits(self.limits_call(limits, key, quantity, each.map(<[u64]>::to_vec), token))
    }

    /// One limit of another algorithm than the GCRA, or one with a penalty box, on the limits
    /// script. The deny cache holds only rejections that last until their retry time whatever
    /// others do: a fixed window's, a sliding log's for one unit (its oldest leaves first), a ban.
    /// The others may free up before: Redis decides.
    fn check_window(self: &Arc<Self>, limit: &Limit, key: &Key, quantity: u64) -> DecisionFuture {
        // Period and count stand for the GCRA's interval and tolerance: a changed quota misses.
        let fingerprint = match (limit.algorithm(), limit.window(), limit.gcra()) {
            (Algorithm::FixedWindow, Some(w), _) => Some((w.period(), w.limit())),
            (Algorithm::SlidingLog, Some(w), _) if quantity == 1 => Some((w.period(), w.limit())),
            // A GCRA limit comes here with a penalty box: only its bans are held (below).
            (Algorithm::Gcra, _, Some(p)) => Some((p.emission_interval(), p.tolerance())),
            _ => None,
        };
        let state_key = state_key(&self.prefix, limit, key);
        let sent = Instant::now();
        // Only a decision the deny cache may keep needs its generation.
        let deny = fingerprint.zip(self.deny.as_ref());
        let cached =
            deny.map(|((period, count), d)| d.get(&state_key, quantity, period, count, sent));
        let generation = match cached {
            Some(Ok(denied)) => return Box::pin(std::future::ready(Ok(denied))),
            Some(Err(generation)) => generation,
            None => 0,
        };
        let penalty = limit.penalty().is_some();
        let state = self.clone();
        let token = self.leases.next_token();
        let call = self.limits_call(std::slice::from_ref(limit), key, quantity, None, token);
        let decided = self.send_limits(call);
        let lease = limit.lease().zip(limit.concurrency());
        // A concurrency check never answered may still have taken slots: this gives them back.
        let mut unanswered = lease.map(|(lease, count)| Unanswered {
            leases: self.leases.clone(),
            key: state_key.clone(),
            token,
            quantity: quantity.min(count),
            lease,
        });
        Box::pin(async move {
            let decisions = decided.await;
            let known = !matches!(&decisions, Err(e) if !e.unsent());
            if let (true, Some(unanswered)) = (known, &mut unanswered) {
                // The answer arrived: what the check took is known, nothing to give back.
                unanswered.quantity = 0;
            }
            let decision = decisions?
                .pop()
                .ok_or_else(|| BackendError::new("Redis returned no decision"))?;
            // Renewed from when it was sent until released (a check dropped before starts nothing).
            if let (true, Some((lease, count)), Some(token)) =
                (decision.allowed, lease, decision.lease)
            {
                let held = (state_key, token, quantity.min(count));
                state.leases.hold(held, lease, sent);
                return Ok(decision);
            }
            // Under a penalty box only a ban: every other rejection must reach Redis to strike.
            if let (Some((period, count)), Some(deny)) = (fingerprint, state.deny.as_ref())
                && !decision.allowed
                && (!penalty || decision.banned)
            {
                let rejection = Rejection {
                    decision,
                    interval: period,
                    tolerance: count,
                    whole_seconds: false,
                    until_retry: true,
                };
                deny.insert(&state_key, quantity, rejection, sent, generation);
            }
            Ok(decision)
        })
    }

    /// Limits with a key each ([`Charges::keyed`](crate::backend::Charges::keyed)): `limits[i]`
    /// on `keys[i]`'s state, in one atomic call of the limits script (alone, or coalesced), on the
    /// one Cluster slot of the stack's hash tag ([`keyed_state_key`] says why).
    pub(crate) fn check_keyed(
        self: &Arc<Self>,
        limits: &[Limit],
        keys: &[Key],
        quantity: u64,
    ) -> StackFuture {
        if let Err(why) = stack_error(limits) {
            return failed(why);
        }
        self.send_limits(self.keyed_call(limits, keys, quantity, self.leases.next_token()))
    }

    /// The limits script's call for `limits[i]` on `keys[i]` (no penalty box: a policy whose
    /// quotas have keys of their own has none).
    pub(crate) fn keyed_call(
        &self,
        limits: &[Limit],
        keys: &[Key],
        quantity: u64,
        token: u64,
    ) -> Result<LimitsCall, String> {
        if keys.len() != limits.len() {
            return Err(format!("{} keys for {} limits", keys.len(), limits.len()));
        }
        let tag = limits.first().map_or("", |l| l.name());
        let on = |(l, key)| (l, key, keyed_state_key(&self.prefix, tag, l, key));
        call_of(limits.iter().zip(keys).map(on), None, quantity, None, token)
    }

    /// Sends `call` to the limits script, coalesced with the checks waiting at once (batch.rs)
    /// unless coalescing is off; or fails at once with why there is no call.
    fn send_limits(self: &Arc<Self>, call: Result<LimitsCall, String>) -> StackFuture {
        let call = match call {
            Ok(call) => call,
            Err(why) => return failed(why),
        };
        // The keys share the client's hash tag: any picks a Cluster node's breaker.
        let slot_key = call.first_key().to_owned();
        let mut conn = self.conn.clone();
        let batches = self.batches.clone();
        let decide = async move {
            match batches {
                Some(batches) => batches.limits(call).await,
                None => scripts::limits(&mut conn, &call).await,
            }
        };
        guarded(&self.breaker, &slot_key, self.timeout, decide)
    }

    /// The limits script's call (`quantity` units each, or `each[i]`, named by `token`), or why it
    /// cannot. The first limit's penalty takes the GCRA path's keys (a ban holds for any
    /// algorithm).
    pub(crate) fn limits_call(
        &self,
        limits: &[Limit],
        key: &Key,
        quantity: u64,
        each: Option<Vec<u64>>,
        token: u64,
    ) -> Result<LimitsCall, String> {
        let penalty = limits.first().and_then(|first| {
            first
                .penalty()
                .map(|p| (*p, redis_key(&self.prefix, first.penalty_box(), key)))
        });
        let on = |l| (l, key, state_key(&self.prefix, l, key));
        call_of(limits.iter().map(on), penalty, quantity, each, token)
    }

    /// One GCRA decision on the path the mode picks.
    async fn decide(&self, key: &str, args: &Args, quantity: u64) -> Result<Answer, RedisError> {
        let mut conn = self.conn.clone();
        let use_cell = (self.detector)
            .use_cell(&conn, &self.breaker, self.timeout)
            .await?;
        let conn = &mut conn;
        // To Lua: peeks and quantities beyond the limit (redis-cell 0.2.2 writes a key without
        // expiry for the first, and overflows into a TAT that crashes the server for the second),
        // quotas with no whole-second form.
        match args.cell {
            Some(cell) if use_cell && quantity > 0 && quantity <= args.limit => {
                // Coalesced on one server, unless Redis may be full (state.rs says why).
                let through_script = self.cell_through_script.load(Ordering::Relaxed);
                let answer = match &self.batches {
                    Some(batches) if !conn.is_cluster() && !through_script => {
                        batches.cell(key, cell, quantity).await
                    }
                    _ => {
                        Box::pin(scripts::throttle(conn, key, cell, quantity, through_script)).await
                    }
                };
                match answer {
                    Err(e) if self.detector.mode() == RedisMode::Auto && is_unknown_command(&e) => {
                        // The module went away: Lua from now on, this request too.
                        self.detector.cell_gone(&self.breaker);
                        Box::pin(scripts::gcra(conn, key, args, quantity)).await
                    }
                    other => other,
                }
            }
            _ => match &self.batches {
                Some(batches) => batches.gcra(key, args, quantity).await,
                None => Box::pin(scripts::gcra(conn, key, args, quantity)).await,
            },
        }
    }
    /// A slice of `key` was fetched (`allowed`: units granted): a refusal cached while it was on
    /// its way (a request decided per request meanwhile, refused as the grant took the room) would
    /// otherwise refuse the units this process holds, until they expire unused.
    fn granted(&self, key: &str, allowed: bool) {
        if let (true, Some(deny)) = (allowed, &self.deny) {
            deny.forget(key);
        }
    }

    /// Refills `key`'s slice ahead with `want` more units, on a spawned task under the timeout and
    /// breaker (none without a runtime); one that fails or is refused leaves the slice as it is.
    pub(crate) fn refill(
        self: &Arc<Self>,
        key: &str,
        args: &Args,
        budget: Budget,
        want: u64,
        fetching: Fetching,
    ) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let state = self.clone();
        let slot_key = key;
        let key = key.to_owned();
        let args = *args;
        let call = async move {
            let mut conn = state.conn.clone();
            let fetched = state
                .budgets
                .fetch(&mut conn, &fetching, &args, &budget, 0, want)
                .await;
            drop(fetching);
            fetched.map(|answer| state.granted(&key, answer.decision.allowed))
        };
        let guarded = guarded(&self.breaker, slot_key, self.timeout, call);
        runtime.spawn(async move {
            if let Err(e) = guarded.await {
                tracing::debug!(error = %e, "a budget refill failed");
            }
        });
    }
}

/// The limits script's call on `(limit, clock key, state key)` triples (see [`LimitsCall`]).
fn call_of<'a>(
    on: impl Iterator<Item = (&'a Limit, &'a Key, String)>,
    penalty: Option<(Penalty, String)>,
    quantity: u64,
    each: Option<Vec<u64>>,
    token: u64,
) -> Result<LimitsCall, String> {
    let specs = on
        .map(|(l, key, state_key)| Spec::on(l, key, state_key))
        .collect::<Result<_, _>>()?;
    Ok(LimitsCall {
        specs,
        penalty,
        quantity,
        each,
        token,
    })
}
