-- tower-throttle: the GCRA of CL.THROTTLE (redis-cell 0.2.2), as src/gcra.rs computes it.
--
-- KEYS[1]  the key's state: its theoretical arrival time (TAT) in nanoseconds since the Unix epoch, as a
--          decimal string. This is the format redis-cell writes, so CL.THROTTLE and this script can share
--          keys (a server that gains or loses the module keeps its limits).
-- ARGV     emission interval (ns), tolerance (ns, = interval x (max_burst + 1)), limit, quantity.
-- With a penalty box, also KEYS[2] (the key's rejections since its first, expiring `within` after
--          it), KEYS[3] (the ban), and ARGV after, within (ms), ban (ms): a key rejected `after` times
--          within `within` of its first rejection is banned for `ban`; a banned key is answered
--          without looking at its TAT.
-- Returns  {limited (0|1), limit, remaining, retry_after (ns, -1 = never), reset_after (ns), banned}:
--          CL.THROTTLE's five values, in nanoseconds instead of whole seconds, and 1 when a ban
--          answered (retry_after and reset_after are then the rest of the ban).
--
-- Time comes from the server (TIME, microseconds), so every client shares one clock. All arithmetic is
-- on integers held in doubles: the TAT is never handled as one number (1.8e18 ns exceeds 2^53), only as
-- its distance from now, which the backend keeps below 2^52 ns (about 52 days) by refusing longer
-- tolerances when the layer is built. A rejected request writes nothing (but see "rebased", and a
-- penalty's strike).

local interval = tonumber(ARGV[1])
local tolerance = tonumber(ARGV[2])
local limit = tonumber(ARGV[3])
local quantity = tonumber(ARGV[4])
local penalty_after = tonumber(ARGV[5] or '0')

local S = 1000000000

-- floor(a / b) for non-negative integers, corrected for the rounding of the division.
local function floordiv(a, b)
  local q = math.floor(a / b)
  if q * b > a then
    q = q - 1
  elseif (q + 1) * b <= a then
    q = q + 1
  end
  return q
end

local time = redis.call('TIME')
local now_s = tonumber(time[1])
local now_ns = tonumber(time[2]) * 1000

if penalty_after > 0 then
  local banned_ms = redis.call('PTTL', KEYS[3])
  if banned_ms > 0 then
    return {1, limit, 0, banned_ms * 1000000, banned_ms * 1000000, 1}
  end
end

-- backlog = max(tat - now, 0). A value that is not a TAT (foreign or corrupt) counts as no state; the
-- next admitted request overwrites it.
local backlog = 0
-- No scan for non-digits: tonumber refuses what is not a number, and the length check what cannot be
-- a TAT; a number that is not a TAT (a sign, a fraction) is a foreign value, which the next write
-- replaces whatever it read as.
local stored = redis.call('GET', KEYS[1])
if stored then
  local len = #stored
  if len > 9 and len < 30 then
    local tat_s = tonumber(string.sub(stored, 1, -10))
    local tat_ns = tonumber(string.sub(stored, -9))
    if tat_s and tat_ns then
      backlog = (tat_s - now_s) * S + (tat_ns - now_ns)
      if backlog < 0 then
        backlog = 0
      end
    end
  end
end
-- A TAT further ahead than the tolerance was written under another quota (the route's quota changed):
-- it counts as a full bucket under this one, stored as such below so that it drains from now on.
-- Under an unchanged quota it never happens.
local rebased = backlog > tolerance
if rebased then
  backlog = tolerance
end

local function store(ahead)
  local r = now_ns + ahead
  local carry = floordiv(r, S)
  local tat = string.format('%d%09d', now_s + carry, r - carry * S)
  -- Expire when the TAT passes: from then on a missing key means the same as this one.
  redis.call('SET', KEYS[1], tat, 'PX', math.ceil(ahead / 1000000))
end

local increment = interval * quantity
local new_backlog = backlog + increment

if new_backlog <= tolerance then
  if new_backlog > 0 then
    store(new_backlog)
  end
  return {0, limit, floordiv(tolerance - new_backlog, interval), -1, new_backlog, 0}
end

if rebased and backlog > 0 then
  store(backlog)
end
local remaining = floordiv(tolerance - backlog, interval)
if remaining > limit then
  remaining = limit
end
local retry_after = -1
if increment <= tolerance then
  retry_after = new_backlog - tolerance
end

if penalty_after > 0 then
  -- A rejection is a strike, counted in a window that opens with the first (Rack::Attack's
  -- Allow2Ban): one small counter per key, whatever `after` is.
  local within_ms = tonumber(ARGV[6])
  local ban_ms = tonumber(ARGV[7])
  local strikes = redis.call('INCR', KEYS[2])
  if strikes == 1 then
    redis.call('PEXPIRE', KEYS[2], within_ms)
  end
  if strikes >= penalty_after then
    redis.call('DEL', KEYS[2])
    redis.call('SET', KEYS[3], 1, 'PX', ban_ms)
    -- The ban, or the limit's own retry time if that is later.
    local wait = ban_ms * 1000000
    if retry_after > wait then
      wait = retry_after
    end
    return {1, limit, 0, wait, math.max(backlog, wait), 1}
  end
end
return {1, limit, remaining, retry_after, backlog, 0}
