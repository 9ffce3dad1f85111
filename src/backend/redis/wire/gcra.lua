-- gcra.lua: the GCRA of CL.THROTTLE (redis-cell 0.2.2), as src/gcra.rs computes it, after the
-- prelude (the clock, the state's format, the step).
--
-- KEYS[1]  the TAT, in redis-cell's format: CL.THROTTLE and this script share keys.
-- ARGV     emission interval (ns), tolerance (ns, = interval x (max_burst + 1)), limit, quantity.
-- With a penalty box, also KEYS[2] (strikes, expiring `within` after the first), KEYS[3] (the
--          ban), and ARGV after, within (ms), ban (ms): `after` rejections within `within` of the
--          first ban the key for `ban`; a banned key is answered without its TAT.
-- ARGV[8]  optional, after the penalty's three (0 0 0 without one): a metered limit's ceiling (ns;
--          see the prelude's step). Without it, the tolerance.
-- Returns  CL.THROTTLE's five values in nanoseconds (retry_after -1 = never), then banned (1 when a
--          ban answered: retry_after and reset_after are then its rest).
--
-- A rejected request writes nothing (but a rebase, see the prelude's step, and a penalty's strike).

local interval = tonumber(ARGV[1])
local tolerance = tonumber(ARGV[2])
local limit = tonumber(ARGV[3])
local quantity = tonumber(ARGV[4])
local penalty_after = tonumber(ARGV[5] or '0')
local ceiling = tonumber(ARGV[8] or ARGV[2])

if penalty_after > 0 then
  local rest = banned_ns(KEYS[3])
  if rest then return {1, limit, 0, rest, rest, 1} end
end

local reply, ahead = gcra_step(backlog_of(redis.call('GET', KEYS[1])), interval, tolerance, limit,
  quantity, ceiling)
if ahead then store_tat(KEYS[1], ahead) end
reply[6] = 0
if reply[1] == 0 or penalty_after == 0 then return reply end

local ban = strike(KEYS[2], KEYS[3], penalty_after, tonumber(ARGV[6]), tonumber(ARGV[7]))
if not ban then return reply end
local banned = banned_reply(reply, ban)
banned[6] = 1
return banned
