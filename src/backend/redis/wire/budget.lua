-- budget.lua: a slice of a hot GCRA key's budget (budget.rs), after the prelude.
--
-- KEYS[1]  the key's TAT, as gcra.lua and CL.THROTTLE store it.
-- ARGV     emission interval (ns), tolerance (ns), limit, want, least.
-- Grants as many units as fit, at most `want`, exactly as that many one-unit requests would be
-- admitted now, if at least `least` fit; otherwise nothing, as gcra.lua rejects `least` units.
-- Returns  {granted, limit, remaining, retry_after (ns, -1 = never), reset_after (ns)}: after the
--          grant, or gcra.lua's rejection of `least` units.

local interval = tonumber(ARGV[1])
local tolerance = tonumber(ARGV[2])
local limit = tonumber(ARGV[3])
local want = tonumber(ARGV[4])
local least = tonumber(ARGV[5])

-- Read and stepped as gcra.lua does, so the scripts agree on any value: `least` units fit exactly
-- when gcra.lua would admit them; otherwise its rejection, and its rebase.
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
if ahead then store_tat(KEYS[1], ahead) end
reply[1] = 0
return reply
