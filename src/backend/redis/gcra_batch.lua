-- gcra_batch.lua: several GCRA decisions in one call (batch.rs), each exactly as gcra.lua makes it
-- (the prelude's step).
--
-- KEYS[g]  group g's state, in gcra.lua's format (redis-cell's TAT string). A group is a run of
--          items with the same key, quota and quantity (one hot key's requests: one group); a key
--          may appear in several groups. Items are decided in order, each on the state the one
--          before it left.
-- ARGV     five per group: emission interval (ns), tolerance (ns), limit, quantity (gcra.lua's),
--          and the number of items in the group; then, optionally, one per group: its ceiling (ns,
--          gcra.lua's ARGV[8]: a metered limit's tolerance plus its debt cap; absent: the
--          tolerance).
-- Returns  five integers per item: {limited, limit, remaining, retry_after, reset_after}, as
--          gcra.lua (no penalty box: policies with one are never batched); limited = -1 for an item
--          whose key holds another type (gcra.lua would fail with WRONGTYPE).
--
-- All items are decided at one instant (one TIME): as if they had reached Redis in the same
-- microsecond, in the order given. A key's state is read once and written once (when an item
-- wrote it under gcra.lua), after the last of its items: the same value and expiry gcra.lua's last
-- write would leave, for one GET and one SET per key instead of per item.

-- Per key: its backlog as the items so far left it (false: not a string), and what to write.
local backlogs = {}
local writes = {}
local out = {}
local n = 0 -- #out

local groups = #KEYS
for g = 1, groups do
  local key = KEYS[g]
  local base = (g - 1) * 5
  local interval = tonumber(ARGV[base + 1])
  local tolerance = tonumber(ARGV[base + 2])
  local ceiling = tonumber(ARGV[5 * groups + g] or ARGV[base + 2])
  local limit = tonumber(ARGV[base + 3])
  local quantity = tonumber(ARGV[base + 4])
  for _ = 1, tonumber(ARGV[base + 5]) do
    local backlog = backlogs[key]
    if backlog == nil then
      -- A key that is not a string (WRONGTYPE) fails its own items, as gcra.lua would fail alone,
      -- not the batch.
      local stored = redis.pcall('GET', key)
      if type(stored) == 'table' and stored.err then
        backlog = false
      else
        backlog = backlog_of(stored)
      end
    end
    local reply = {-1, 0, 0, 0, 0}
    if backlog ~= false then
      local ahead
      reply, ahead = gcra_step(backlog, interval, tolerance, limit, quantity, ceiling)
      -- What gcra.lua leaves: the state it wrote, or the one it found (within the ceiling).
      if ahead then
        writes[key] = ahead
        backlog = ahead
      elseif backlog > ceiling then
        backlog = ceiling
      end
    end
    backlogs[key] = backlog
    for i = 1, 5 do
      out[n + i] = reply[i]
    end
    n = n + 5
  end
end

for key, ahead in pairs(writes) do
  store_tat(key, ahead)
end
return out
