-- tower-throttle: a slice of a GCRA key's budget (leased budgets for hot keys, budget.rs).
--
-- KEYS[1]  the key's state, as gcra.lua and CL.THROTTLE store it (the TAT in ns since the epoch).
-- ARGV     emission interval (ns), tolerance (ns), limit, want, least.
-- Grants g units, as many as fit and at most `want`, exactly as g requests of one unit at this
-- instant would be admitted one after the other (the TAT moves by g intervals), if at least `least`
-- fit; otherwise grants nothing and writes nothing, as gcra.lua rejects `least` units.
-- Returns  {granted, limit, remaining, retry_after (ns, -1 = never), reset_after (ns)}: remaining
--          and reset_after after the grant, or gcra.lua's rejection of `least` units.

local interval = tonumber(ARGV[1])
local tolerance = tonumber(ARGV[2])
local limit = tonumber(ARGV[3])
local want = tonumber(ARGV[4])
local least = tonumber(ARGV[5])

local S = 1000000000

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

local backlog = 0
local stored = redis.call('GET', KEYS[1])
-- Read as gcra.lua and gcra_batch.lua read it (a foreign value is whatever `tonumber` makes of it,
-- rebased below if beyond the tolerance), so that the three scripts agree on any stored value.
if stored and #stored > 9 and #stored < 30 then
  local tat_s = tonumber(string.sub(stored, 1, -10))
  local tat_ns = tonumber(string.sub(stored, -9))
  if tat_s and tat_ns then
    backlog = (tat_s - now_s) * S + (tat_ns - now_ns)
    if backlog < 0 then
      backlog = 0
    end
  end
end
local rebased = backlog > tolerance
if rebased then
  backlog = tolerance
end

local function store(ahead)
  local r = now_ns + ahead
  local carry = floordiv(r, S)
  local tat = string.format('%d%09d', now_s + carry, r - carry * S)
  redis.call('SET', KEYS[1], tat, 'PX', math.ceil(ahead / 1000000))
end

-- The units that fit now: each adds one interval to the backlog, which may reach the tolerance.
local room = floordiv(tolerance - backlog, interval)
if room >= least and least > 0 then
  local granted = want
  if granted > room then
    granted = room
  end
  local new_backlog = backlog + interval * granted
  store(new_backlog)
  return {granted, limit, room - granted, -1, new_backlog}
end

if rebased and backlog > 0 then
  store(backlog)
end
local remaining = room
if remaining > limit then
  remaining = limit
end
local retry_after = -1
local increment = interval * least
if increment <= tolerance then
  retry_after = backlog + increment - tolerance
end
return {0, limit, remaining, retry_after, backlog}
