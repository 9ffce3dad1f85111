//! [`Records`] on Redis (overrides and timed bans): one hash per table, `prefix:records:<table>`,
//! shared by every process and kept across restarts. A write is told on the resets channel
//! (`!records` and the table's name); each backend listening tells its layer, which reads the table
//! again, and a subscription made again tells it that any table may have changed (resets.rs).

use std::collections::HashMap;
use std::sync::Arc;

use super::health::breaker::guarded;
use super::resets::{self, RECORDS};
use super::state::RedisState;
use crate::backend::records::{OnRecordsChange, Records, RecordsFuture};

/// HDEL of each field (ARGV odd) whose value is still the one that follows it (ARGV even).
const REMOVE_UNCHANGED: &str = "local n = 0
for i = 1, #ARGV, 2 do
  if redis.call('HGET', KEYS[1], ARGV[i]) == ARGV[i + 1] then
    n = n + redis.call('HDEL', KEYS[1], ARGV[i])
  end
end
return n";

pub(super) struct RedisRecords(pub(super) Arc<RedisState>);

impl Records for RedisRecords {
    fn write(&self, table: &str, field: &str, value: Option<&str>) -> RecordsFuture<()> {
        let state = &self.0;
        let key = format!("{}:records:{table}", state.prefix);
        let mut write = redis::cmd(if value.is_some() { "HSET" } else { "HDEL" });
        write.arg(&key).arg(field).arg(value);
        let tell = resets::publish_cmd(&state.conn, &state.prefix, format!("{RECORDS}{table}"));
        let mut conn = state.conn.clone();
        let call = async move {
            write.query_async::<i64>(&mut conn).await?;
            tell.query_async::<i64>(&mut conn).await.map(drop)
        };
        guarded(&state.breaker, &key, state.timeout, call)
    }

    fn read(&self, table: &str) -> RecordsFuture<Vec<(String, String)>> {
        let state = &self.0;
        let key = format!("{}:records:{table}", state.prefix);
        let (mut conn, mut read) = (state.conn.clone(), redis::cmd("HGETALL"));
        read.arg(&key);
        let call = async move {
            let all: HashMap<String, String> = read.query_async(&mut conn).await?;
            Ok(all.into_iter().collect())
        };
        guarded(&state.breaker, &key, state.timeout, call)
    }

    fn remove_unchanged(&self, table: &str, fields: Vec<(String, String)>) -> RecordsFuture<()> {
        let state = &self.0;
        let key = format!("{}:records:{table}", state.prefix);
        let mut conn = state.conn.clone();
        // A few hundred fields a script, so that a long list does not hold the server up.
        let removes: Vec<redis::Cmd> = fields
            .chunks(256)
            .map(|chunk| {
                let mut remove = redis::cmd("EVAL");
                remove.arg(REMOVE_UNCHANGED).arg(1).arg(&key);
                for (field, value) in chunk {
                    remove.arg(field).arg(value);
                }
                remove
            })
            .collect();
        let call = async move {
            for remove in removes {
                remove.query_async::<i64>(&mut conn).await?;
            }
            Ok(())
        };
        guarded(&state.breaker, &key, state.timeout, call)
    }

    fn on_change(&self, on_change: OnRecordsChange) {
        let mut heard = self
            .0
            .records_heard
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        heard.push(on_change);
    }

    fn forget_cached(&self, limits: &[&str]) {
        resets::forget_limits(&self.0, limits.iter().copied());
    }
}
