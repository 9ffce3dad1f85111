//! Peek and reset on Redis: an operator's look at one key, and forgetting it.
//! A peek runs `limits.lua` itself twice (quantity 0: how things stand; 1: whether one more would
//! pass, and when) in one read-only script whose `redis.call` lets reads through and skips writes:
//! the very arithmetic that decides, on the server's clock, consuming and writing nothing (not even
//! a rebase). Every algorithm and stack, in every mode (`CL.THROTTLE` keeps the same TAT).
//!
//! A reset deletes the keys (and penalty keys) in one `DEL`, and is heard everywhere (resets.rs).

use std::sync::{Arc, LazyLock};
use std::time::Duration;

use redis::Script;

use super::check::failed;
use crate::backend::key_state::{KeyState, PeekFuture, ResetFuture};
use crate::backend::redis::health::breaker::guarded;
use crate::backend::redis::resets;
use crate::backend::redis::state::RedisState;
use crate::backend::redis::wire::args::{redis_key, state_key};
use crate::backend::redis::wire::limits_call::LimitsCall;
use crate::error::BackendError;
use crate::key::Key;
use crate::limit::Limit;

/// The peek: `limits.lua` as the body of a function, under a `redis` whose writes are no-ops.
static PEEK: LazyLock<Script> = LazyLock::new(|| Script::new(&peek_source()));

/// The peek's `redis`: reads pass, writes are skipped, others fail (a test then says so).
const PRELUDE: &str = r#"
-- tower-throttle: peek (generated: limits.lua below, run twice, read-only).
-- KEYS   the N limits' state keys, then the first limit's ban key if it has one.
-- ARGV   limits.lua's own, without its optional quantities; the peek sets the quantity, and no
--        penalty (nothing is struck).
-- Returns {ban PTTL (ms; < 0: none), then per limit limits.lua's five values for a quantity of 0,
--          then per limit the five for a quantity of 1}.
local real_redis = redis
local READS = {TIME = true, GET = true, ZCOUNT = true, ZRANGE = true, ZRANGEBYSCORE = true,
  PTTL = true}
local WRITES = {SET = true, ZADD = true, ZREMRANGEBYSCORE = true, PEXPIRE = true, DEL = true,
  INCR = true}
local redis = setmetatable({
  call = function(command, ...)
    local name = string.upper(command)
    if READS[name] then
      return real_redis.call(command, ...)
    end
    if WRITES[name] then
      return false
    end
    error('peek: limits.lua calls ' .. name .. ', which the peek does not know')
  end,
}, {__index = real_redis})
local function decide_all(KEYS, ARGV)
"#;

const EPILOGUE: &str = r#"
end
local n = tonumber(ARGV[1])
local out = {-2}
if #KEYS > n then
  out[1] = real_redis.call('PTTL', KEYS[n + 1])
end
for _, q in ipairs({'0', '1'}) do
  local argv = {unpack(ARGV)}
  argv[2], argv[4] = q, '0'
  local r = decide_all({unpack(KEYS, 1, n)}, argv)
  for i = 2, #r do
    out[#out + 1] = r[i]
  end
end
return out
"#;

fn peek_source() -> String {
    format!(
        "{PRELUDE}{}{EPILOGUE}",
        crate::backend::redis::wire::lua::LIMITS_BODY.trim_end()
    )
}

impl RedisState {
    /// [`Backend::peek`](crate::Backend::peek): one read-only call of the peek script on `call`'s
    /// keys (one slot): each limit's state for a quantity of 0 and of 1, and the ban of its penalty
    /// box if it has one.
    pub(crate) fn peek(
        self: &Arc<Self>,
        limits: &[Limit],
        call: impl FnOnce() -> Result<LimitsCall, String>,
    ) -> PeekFuture {
        if limits.is_empty() {
            return failed("peek needs at least one limit");
        }
        let call = match call() {
            Ok(call) => call,
            Err(why) => return failed(why),
        };
        let ban_key = call.penalty.as_ref().map(|(_, base)| format!("{base}:ban"));
        let slot_key = call.first_key().to_owned();
        let n = call.specs.len();
        let mut conn = self.conn.clone();
        let call = async move {
            let mut invocation = PEEK.prepare_invoke();
            for spec in &call.specs {
                invocation.key(&spec.key);
            }
            if let Some(ban_key) = &ban_key {
                invocation.key(ban_key);
            }
            // A metered key's debt is shown as debt (the ceilings): remaining 0, until paid back.
            invocation.arg(&call.args()[..]);
            invocation.invoke_async::<Vec<i64>>(&mut conn).await
        };
        let answer = guarded(&self.breaker, &slot_key, self.timeout, call);
        Box::pin(async move {
            let reply = answer.await?;
            if reply.len() != 1 + 10 * n {
                return Err(BackendError::new(
                    "the peek script returned a reply of the wrong length",
                ));
            }
            let ban = u64::try_from(reply[0])
                .ok()
                .filter(|ms| *ms > 0)
                .map(Duration::from_millis);
            let (now, next) = reply[1..].split_at(5 * n);
            Ok(now
                .chunks_exact(5)
                .zip(next.chunks_exact(5))
                .map(|(now, next)| key_state(now, next, ban))
                .collect())
        })
    }

    /// [`Backend::reset`](crate::Backend::reset) of charges with keys of their own: one `DEL` of
    /// the keys [`check_keyed`](Self::check_keyed) decides (one slot), and this process's deny
    /// cache.
    pub(crate) fn reset_keyed(self: &Arc<Self>, limits: &[Limit], keys: &[Key]) -> ResetFuture {
        let call = match self.keyed_call(limits, keys, 0, 0) {
            Ok(call) if !limits.is_empty() => call,
            Ok(_) => return failed("reset needs at least one limit"),
            Err(why) => return failed(why),
        };
        let state_keys: Vec<String> = call.specs.into_iter().map(|s| s.key).collect();
        self.delete(state_keys, Vec::new())
    }

    /// [`Backend::reset`](crate::Backend::reset): one `DEL`, and this process's deny cache.
    pub(crate) fn reset(self: &Arc<Self>, limits: &[Limit], key: &Key) -> ResetFuture {
        let Some(first) = limits.first() else {
            return failed("reset needs at least one limit");
        };
        let state_keys: Vec<String> = limits
            .iter()
            .map(|l| state_key(&self.prefix, l, key))
            .collect();
        let base = redis_key(&self.prefix, first.penalty_box(), key);
        self.delete(
            state_keys,
            vec![format!("{base}:strikes"), format!("{base}:ban")],
        )
    }

    /// Deletes `state_keys` and `others` (all of one slot) in one `DEL`, then forgets what this
    /// process cached under `state_keys` and tells the other processes.
    fn delete(self: &Arc<Self>, state_keys: Vec<String>, others: Vec<String>) -> ResetFuture {
        let mut command = redis::cmd("DEL");
        command.arg(&state_keys).arg(&others);
        let slot_key = state_keys.first().cloned().unwrap_or_default();
        let mut conn = self.conn.clone();
        let call = async move { command.query_async::<i64>(&mut conn).await };
        let deleted = guarded(&self.breaker, &slot_key, self.timeout, call);
        let state = self.clone();
        Box::pin(async move {
            deleted.await?;
            // After Redis forgot the key: a rejection cached meanwhile would outlive the reset.
            resets::forget_keys(&state, state_keys.iter().map(String::as_str));
            // Tells the others (one that misses it drops all it cached when it subscribes again).
            let mut conn = state.conn.clone();
            let tell = resets::publish_cmd(&conn, &state.prefix, state_keys.join("\n"));
            // A refusal (NOPERM) comes as a value, which `query_async` makes an error.
            let publish = tell.query_async::<()>(&mut conn);
            // Reset here and in Redis, but another process may still refuse from its cache until
            // the retry time: said, so that the operator can reset again.
            let why = match tokio::time::timeout(state.timeout, publish).await {
                Ok(Ok(())) => return Ok(()),
                Ok(Err(e)) => e.to_string(),
                Err(_) => format!("no answer within {:?}", state.timeout),
            };
            tracing::warn!(
                error = why,
                "a reset could not be published to the other processes"
            );
            Err(BackendError::new(format!(
                "the key was reset, but the other processes were not told ({why}): they may \
                 refuse it from their caches until its retry time; reset again"
            )))
        })
    }
}

/// A limit's state from the script's two decisions (gcra.lua's five numbers) and the ban's rest.
fn key_state(now: &[i64], next: &[i64], ban: Option<Duration>) -> KeyState {
    let nanos = |v: i64| Duration::from_nanos(v.max(0) as u64);
    let reset_after = nanos(now[4]);
    let retry_after = (next[0] == 1).then(|| {
        u64::try_from(next[3])
            .map(Duration::from_nanos)
            .unwrap_or(reset_after)
    });
    let state = KeyState::new(now[1].max(0) as u64, now[2].max(0) as u64, reset_after)
        .with_retry_after(retry_after);
    match ban {
        Some(rest) => state.with_ban(rest),
        None => state,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_peek_knows_every_command_limits_lua_calls() {
        let script = crate::backend::redis::wire::lua::LIMITS_BODY;
        let commands: Vec<&str> = script
            .split("redis.call('")
            .skip(1)
            .map(|rest| &rest[..rest.find('\'').unwrap()])
            .collect();
        assert!(commands.contains(&"SET") && commands.contains(&"ZCOUNT"));
        for command in commands {
            assert!(
                PRELUDE.contains(&format!("{command} = true")),
                "limits.lua calls {command}: add it to the peek's READS or WRITES"
            );
        }
        // The peek wraps the script whole: its top-level `return` returns from the wrapper.
        assert!(peek_source().contains(script.trim_end()));
    }
}
