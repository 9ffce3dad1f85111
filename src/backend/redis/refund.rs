//! Refunds (counting by outcome): `refund.lua` gives back, in one atomic call, the units a request
//! took under each limit of its policy, on a spawned task so that no response waits for it.

use std::sync::{Arc, LazyLock};
use std::time::Duration;

use redis::Script;

use super::args::Spec;
use super::state::RedisState;
use crate::key::Key;
use crate::limit::Limit;

/// See the script's header. Built once per process.
static REFUND: LazyLock<Script> = LazyLock::new(|| Script::new(super::lua::REFUND));

/// The script's kinds that hold units to give back (a concurrency slot is released, not refunded).
const REFUNDABLE_KINDS: [u8; 4] = [0, 1, 2, 3];

/// Gives back `quantity` units of `limits` for `key` (see
/// [`Backend::refund`](crate::backend::Backend::refund)), on the current tokio runtime, bounded by
/// the backend's timeout. A refund that fails or times out is lost, which only means the request
/// counted after all: it is logged at debug level and never retried (a late refund could land after
/// the units have drained and give back more than the request took).
pub(super) fn refund(
    state: &Arc<RedisState>,
    limits: &[Limit],
    key: &Key,
    quantity: u64,
    since: Duration,
) {
    if quantity == 0 {
        return;
    }
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    let specs: Vec<Spec> = limits
        .iter()
        .filter_map(|limit| Spec::of(limit, state.state_key(limit, key)).ok())
        .filter(|spec| REFUNDABLE_KINDS.contains(&spec.kind))
        .collect();
    if specs.is_empty() {
        return;
    }
    // The key is less limited now: a rejection this process cached must not outlive the refund.
    if let Some(deny) = &state.deny {
        for spec in &specs {
            deny.forget(&spec.key);
        }
    }
    let mut invocation = REFUND.prepare_invoke();
    for spec in &specs {
        invocation.key(&spec.key);
    }
    // Plus the timeout: the admission was at most `since` before the sending, and a call answered
    // in time ran within the timeout of it. (One that times out may still run later, on a stalled
    // server; its window arithmetic then errs by that delay.) Rounded up: an earlier admission time
    // only ever gives back less.
    let since_us = (since + state.timeout).as_nanos().div_ceil(1000) as u64;
    invocation.arg(specs.len()).arg(quantity).arg(since_us);
    for spec in &specs {
        invocation.arg(spec.kind).arg(spec.a);
    }
    let mut conn = state.conn.clone();
    let timeout = state.timeout;
    runtime.spawn(async move {
        let call = async move {
            invocation
                .invoke_async::<i64>(&mut conn.redirecting())
                .await
        };
        match tokio::time::timeout(timeout, call).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => tracing::debug!(error = %e, "a refund failed; the request counted"),
            Err(_) => tracing::debug!("a refund timed out; the request counted"),
        }
    });
}
