-- budget.lua: a slice of a GCRA key's budget (sliced budgets for hot keys, budget.rs), after the
-- prelude (prelude.lua).
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

-- Read as gcra.lua and gcra_batch.lua read it (the prelude's), so that the three scripts agree on
-- any stored value. `least` (at least 1) units fit exactly when gcra.lua would admit them; then
-- every unit that fits (each adds one interval to the backlog, which may reach the tolerance) is
-- granted, up to `want`. Otherwise the reply is gcra.lua's rejection, and the write its rebase.
local found = backlog_of(redis.call('GET', KEYS[1]))
local reply, ahead = gcra_step(found, interval, tolerance, limit, least)
if reply[1] == 0 then
  local backlog = math.min(found, tolerance)
  local room = floordiv(tolerance - backlog, interval)
  local granted = math.min(want, room)
  local new_backlog = backlog + interval * granted
  store_tat(KEYS[1], new_backlog)
  return {granted, limit, room - granted, -1, new_backlog}
end
if ahead then
  store_tat(KEYS[1], ahead)
end
reply[1] = 0
return reply
