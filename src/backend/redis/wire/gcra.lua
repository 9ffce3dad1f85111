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
  local banned_ms = redis.call('PTTL', KEYS[3])
  if banned_ms > 0 then return {1, limit, 0, banned_ms * 1000000, banned_ms * 1000000, 1} end
end

local reply, ahead = gcra_step(backlog_of(redis.call('GET', KEYS[1])), interval, tolerance, limit,
  quantity, ceiling)
if ahead then store_tat(KEYS[1], ahead) end
reply[6] = 0
if reply[1] == 0 or penalty_after == 0 then return reply end

-- A rejection is a strike, counted in a window that opens with the first (Rack::Attack's
-- Allow2Ban): one small counter per key, whatever `after` is.
local within_ms = tonumber(ARGV[6])
local ban_ms = tonumber(ARGV[7])
local strikes = redis.call('INCR', KEYS[2])
if strikes == 1 then redis.call('PEXPIRE', KEYS[2], within_ms) end
if strikes >= penalty_after then
  redis.call('DEL', KEYS[2])
  redis.call('SET', KEYS[3], 1, 'PX', ban_ms)
  -- The ban, or the limit's own retry time if that is later.
  local wait = math.max(ban_ms * 1000000, reply[4])
  return {1, limit, 0, wait, math.max(reply[5], wait), 1}
end
return reply
