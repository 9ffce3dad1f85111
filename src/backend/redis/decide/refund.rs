//! Settling after the response, on a spawned task: one atomic `settle.lua` call gives back a
//! request's units under each limit (counting by outcome), or charges or gives back a metered
//! request's real cost ([`settle`]).

use std::sync::Arc;
use std::time::Duration;

use crate::backend::redis::state::RedisState;
use crate::backend::redis::wire::args::{state_key, Args, Spec};
use crate::backend::redis::wire::scripts::SETTLE;
use crate::decision::Decision;
use crate::gcra::{self, GcraParams};
use crate::key::Key;
use crate::limit::Limit;

/// Settles `deltas[i]` units under `limits[i]` for `key`: negative gives back (a refund), positive
/// charges a metered GCRA limit (into debt, up to its cap), 0 leaves the limit alone. One
/// `settle.lua` call on a spawned task, under the timeout, never retried (a late refund could give
/// back more than was taken, a late charge fall after its debt): one that fails is lost. `since`:
/// an upper bound on the time since the admission, and each limit's decision then (if known).
pub(crate) fn settle(
    state: &Arc<RedisState>,
    limits: &[Limit],
    key: &Key,
    deltas: &[i64],
    (since, admitted): (Duration, &[Decision]),
) {
    if deltas.len() != limits.len() {
        tracing::debug!(
            limits = limits.len(),
            deltas = deltas.len(),
            "a settle with a delta count that is not the limit count was dropped"
        );
        return;
    }
    let delta = |i: usize| deltas[i];
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    // Plus the timeout (a call ran within it of the sending); in ns, rounded up to µs below:
    // earlier gives back less.
    let since = u64::try_from((since + state.timeout).as_nanos()).unwrap_or(u64::MAX);
    // A lone limit `CL.THROTTLE` can hold may have been decided by it (check.rs picks the path so;
    // with a penalty too, asked without it where the policy does not enforce it).
    let cell = |limit: &Limit| {
        let held = Args::new(limit, true).is_some_and(|args| args.cell.is_some());
        limits.len() == 1 && held && state.detector.may_use_cell()
    };
    let items: Vec<(Spec, i64, u64)> = limits
        .iter()
        .enumerate()
        .filter(|(i, _)| delta(*i) != 0)
        .filter_map(|(i, limit)| {
            let spec = Spec::on(limit, key, state_key(&state.prefix, limit, key)).ok()?;
            // A concurrency slot is released, not refunded. Only a metered limit may be charged
            // (with a debt cap of 0, up to its burst): another reads a TAT past its tolerance as
            // another quota's.
            let usable = !spec.is_concurrency() && (delta(i) < 0 || limit.is_metered());
            // A GCRA's give-back allows only for the time its units may have drained.
            let since = match (limit.gcra(), delta(i) < 0) {
                (Some(params), true) => {
                    // A leased budget's slice tells each request it admits the slice's time.
                    let told = admitted.get(i).filter(|_| limit.budget().is_none());
                    let busy = told.map(|d| busy_for(d, params, cell(limit)));
                    gcra::drain_bound(since, busy, delta(i).unsigned_abs(), params)
                }
                _ => since,
            };
            usable.then(|| (spec, delta(i), since.div_ceil(1000)))
        })
        .collect();
    if items.is_empty() {
        return;
    }
    // A cached rejection no longer tells the truth (less limited, or a later retry time): the next
    // check asks Redis (another process's cache only refuses more).
    if let Some(deny) = &state.deny {
        for (spec, ..) in &items {
            deny.forget(&spec.key);
        }
    }
    let mut invocation = SETTLE.prepare_invoke();
    for (spec, ..) in &items {
        invocation.key(&spec.key);
    }
    invocation.arg(items.len());
    for (spec, delta, since_us) in &items {
        invocation
            .arg(spec.kind)
            .arg(spec.a)
            .arg(*delta)
            .arg(spec.settle_last())
            .arg(*since_us);
    }
    let mut conn = state.conn.clone();
    let timeout = state.timeout;
    // Forgotten again once Redis has applied it: a check decided between the first forget and
    // the settle is refused, and would be cached until its retry time (a fixed window's end).
    let cached = state.deny.is_some().then(|| {
        let keys: Vec<String> = items.into_iter().map(|(spec, ..)| spec.key).collect();
        (state.clone(), keys)
    });
    runtime.spawn(async move {
        let call = async move { invocation.invoke_async::<i64>(&mut conn).await };
        match tokio::time::timeout(timeout, call).await {
            Ok(Ok(_)) => {
                if let Some((state, keys)) = &cached
                    && let Some(deny) = &state.deny
                {
                    keys.iter().for_each(|key| deny.forget(key));
                }
            }
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "a settle failed; the request counted as reserved")
            }
            Err(_) => tracing::debug!("a settle timed out; the request counted as reserved"),
        }
    });
}

/// How long the key was surely busy after `decision` (a lower bound on its `reset_after`): as the
/// Lua scripts tell it, to the nanosecond; `CL.THROTTLE` (if it may have decided: `cell`) tells
/// whole seconds plus one, and a `remaining` that puts it within two emission intervals (truncated,
/// of intervals it rounds to microseconds): `tolerance - (remaining + 2) x interval`.
fn busy_for(decision: &Decision, params: &GcraParams, cell: bool) -> Duration {
    if !cell {
        return decision.reset_after;
    }
    let told = decision.reset_after.saturating_sub(Duration::from_secs(1));
    let intervals = decision.remaining.saturating_add(2);
    let room = params.emission_interval().saturating_mul(intervals);
    told.max(Duration::from_nanos(
        params.tolerance().saturating_sub(room),
    ))
}
