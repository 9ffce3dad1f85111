//! The calls that decide — `gcra.lua`, `limits.lua` and `CL.THROTTLE` — sent on a connection, and
//! their replies read back into decisions.

use std::sync::LazyLock;
use std::time::Duration;

use redis::{RedisError, Script};

use super::args::{Args, CellArgs};
use super::limits_call::LimitsCall;
use super::lua;
use crate::backend::redis::conn::connection::RedisConnection;
use crate::backend::redis::conn::redirect::unexpected;
use crate::decision::Decision;

// Each script, built once per process: see its header (lua.rs says which file that is).
pub(crate) static GCRA: LazyLock<Script> = LazyLock::new(|| Script::new(lua::GCRA));
static LIMITS: LazyLock<Script> = LazyLock::new(|| Script::new(lua::LIMITS));
static CELL: LazyLock<Script> = LazyLock::new(|| Script::new(lua::CELL));
pub(crate) static GCRA_BATCH: LazyLock<Script> = LazyLock::new(|| Script::new(lua::GCRA_BATCH));
pub(crate) static LIMITS_BATCH: LazyLock<Script> = LazyLock::new(|| Script::new(lua::LIMITS_BATCH));
pub(crate) static BUDGET: LazyLock<Script> = LazyLock::new(|| Script::new(lua::BUDGET));
pub(crate) static SETTLE: LazyLock<Script> = LazyLock::new(|| Script::new(lua::SETTLE));
pub(crate) static RENEW: LazyLock<Script> = LazyLock::new(|| Script::new(lua::RENEW));

/// A decision, and whether `CL.THROTTLE` made it (its durations then whole seconds, rounded up).
pub(crate) struct Answer {
    pub(crate) decision: Decision,
    pub(crate) whole_seconds: bool,
}

/// One GCRA decision (a limit without a penalty box: see `RedisState::check`) by `gcra.lua`.
pub(crate) async fn gcra(
    conn: &mut RedisConnection,
    key: &str,
    args: &Args,
    quantity: u64,
) -> Result<Answer, RedisError> {
    let mut invocation = GCRA.key(key);
    invocation.arg(&[args.interval, args.tolerance, args.limit, quantity][..]);
    if args.metered() {
        // A metered limit's debt is read as debt, not as another quota's state.
        invocation.arg(args.ceiling);
    }
    let reply: [i64; 5] = invocation.invoke_async(conn).await?;
    Ok(Answer {
        decision: from_reply(reply, Duration::from_nanos),
        whole_seconds: false,
    })
}

/// One GCRA decision by `CL.THROTTLE`: through `cell.lua` on a Cluster, and on one server when
/// `through_script` (Redis may be full: see `RedisState::cell_through_script`).
pub(crate) async fn throttle(
    conn: &mut RedisConnection,
    key: &str,
    cell: CellArgs,
    quantity: u64,
    through_script: bool,
) -> Result<Answer, RedisError> {
    let reply: [i64; 5] = if conn.is_cluster() || through_script {
        // The script declares the key, so a node redirects it (see cell.lua); and, a writer,
        // Redis refuses it whole when full, where the bare command writes past `maxmemory`.
        CELL.key(key)
            .arg(&[cell.max_burst, cell.count, cell.period_secs, quantity][..])
            .invoke_async(conn)
            .await?
    } else {
        throttle_command(key, cell, quantity)
            .query_async(conn)
            .await?
    };
    Ok(cell_answer(reply))
}

/// `CL.THROTTLE key max_burst count period quantity`, for one server.
pub(crate) fn throttle_command(key: &str, cell: CellArgs, quantity: u64) -> redis::Cmd {
    let mut cmd = redis::cmd("CL.THROTTLE");
    cmd.arg(key)
        .arg(&[cell.max_burst, cell.count, cell.period_secs, quantity][..]);
    cmd
}

/// The answer of a `CL.THROTTLE` reply.
pub(crate) fn cell_answer(reply: [i64; 5]) -> Answer {
    Answer {
        // Whole seconds, truncated: report the next whole second, which is never early.
        decision: from_reply(reply, |secs| Duration::from_secs(secs.saturating_add(1))),
        whole_seconds: true,
    }
}

/// One decision per spec of `call`, together, by `limits.lua`.
pub(crate) async fn limits(
    conn: &mut RedisConnection,
    call: &LimitsCall,
) -> Result<Vec<Decision>, RedisError> {
    let mut invocation = LIMITS.prepare_invoke();
    invocation.key(call.keys()).arg(call.args());
    let reply: Vec<i64> = invocation.invoke_async(conn).await?;
    limits_decisions(call, &reply)
}

/// A batch item's failure, from the error's text in its reply (limits_batch.lua): the error
/// `limits.lua` alone would have met.
pub(crate) fn failed_item(text: &[u8]) -> RedisError {
    let text = String::from_utf8_lossy(text).into_owned();
    let kind = redis::ErrorKind::Server(redis::ServerErrorKind::ResponseError);
    RedisError::from((kind, "the limits script failed", text))
}

/// The decisions of `call` in `limits.lua`'s reply to it (alone, or its part of a batch's).
pub(crate) fn limits_decisions(
    call: &LimitsCall,
    reply: &[i64],
) -> Result<Vec<Decision>, RedisError> {
    if reply.len() != call.reply_len() {
        return Err(unexpected(
            "the limits script returned a reply of the wrong length",
        ));
    }
    let banned = reply[0] == 1;
    Ok(reply[1..]
        .chunks_exact(5)
        .zip(&call.specs)
        .map(|(r, spec)| {
            let mut decision = from_reply([r[0], r[1], r[2], r[3], r[4]], Duration::from_nanos);
            decision.banned = banned;
            if decision.allowed && spec.is_concurrency() {
                decision = decision.with_lease(call.token);
            }
            decision
        })
        .collect())
}

/// `[limited, limit, remaining, retry_after, reset_after]`, durations converted by `unit`.
pub(crate) fn from_reply(reply: [i64; 5], unit: impl Fn(u64) -> Duration) -> Decision {
    let [limited, limit, remaining, retry_after, reset_after] = reply;
    let limit = limit.max(0) as u64;
    // Never more than the limit (CL.THROTTLE's count of whole microseconds could say so).
    let remaining = (remaining.max(0) as u64).min(limit);
    let reset_after = unit(reset_after.max(0) as u64);
    if limited == 0 {
        Decision::allowed(limit, remaining, reset_after)
    } else {
        let retry_after = u64::try_from(retry_after).ok().map(unit);
        Decision::limited(limit, remaining, retry_after, reset_after)
    }
}
