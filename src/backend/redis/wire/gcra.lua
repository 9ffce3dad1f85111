-- gcra.lua: the GCRA of CL.THROTTLE (redis-cell 0.2.2), as src/gcra.rs computes it, after the
-- prelude (the clock, the state's format, the step).
--
-- KEYS[1]  the TAT, in redis-cell's format: CL.THROTTLE and this script share keys.
-- ARGV     emission interval (ns), tolerance (ns, = interval x (max_burst + 1)), limit, quantity.
-- ARGV[5]  optional: a metered limit's ceiling (ns; see the prelude's step). Without it, the
--          tolerance.
-- Returns  CL.THROTTLE's five values in nanoseconds (retry_after -1 = never).
--
-- A rejected request writes nothing (but a rebase, see the prelude's step). A limit with a penalty
-- box runs on limits.lua, which strikes and bans in the same call.

local interval = tonumber(ARGV[1])
local tolerance = tonumber(ARGV[2])
local limit = tonumber(ARGV[3])
local quantity = tonumber(ARGV[4])
local ceiling = tonumber(ARGV[5] or ARGV[2])

local reply, ahead = gcra_step(backlog_of(redis.call('GET', KEYS[1])), interval, tolerance, limit,
  quantity, ceiling)
if ahead then store_tat(KEYS[1], ahead) end
return reply
