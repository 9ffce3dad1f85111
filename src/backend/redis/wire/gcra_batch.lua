-- gcra_batch.lua: GCRA decisions in one call (batch.rs), each as gcra.lua makes it, per group.
--
-- KEYS[g]  group g's state (gcra.lua's format). A group is a run of items with the same key, quota
--          and quantity (a key may be in several). Items are decided in order, each on the state
--          the one before left, all at one TIME.
-- ARGV     per group, its item count; negative when the group's quota follows (only when it
--          differs from the group before's): its increment (ns: interval x quantity; any value
--          past the tolerance stands for larger ones), tolerance (ns) and ceiling (ns, gcra.lua's
--          ARGV[5]).
-- Returns  per group, the backlog (ns, within the ceiling) its first item was decided on, or -1
--          when its key holds another type (WRONGTYPE); gcra_group.rs runs the step from it per
--          item: the script's work and reply are per group.
--
-- In a group, items pass while backlog + increment stays within the tolerance; the first refused
-- leaves the backlog as it is, so all later ones are refused: the count admitted is all it takes.
-- A key is read once (one MGET) and written once, after its last item, as gcra.lua's last write
-- would. ARGV is read by arithmetic (`x + 0`: one conversion, where tonumber makes two).

-- Per key: its backlog as the groups so far left it (false: not a string), and what to write.
local backlogs = {}
local writes = {}
local out = {}

local groups = #KEYS

-- Every key in one MGET, which answers nil for a missing key and one of another type alike: then
-- one EXISTS tells whether any exists, and only then is each asked alone (GET), to fail its items.
local values = redis.call('MGET', unpack(KEYS))
local absent = nil
for g = 1, groups do
  if not values[g] then
    absent = absent or {}
    absent[#absent + 1] = KEYS[g]
  end
end
local unsure = absent ~= nil and redis.call('EXISTS', unpack(absent)) > 0
local arg = 1
local increment, tolerance, ceiling
for g = 1, groups do
  local key = KEYS[g]
  local count = ARGV[arg] + 0
  arg = arg + 1
  if count < 0 then
    count = -count
    increment = ARGV[arg] + 0
    tolerance = ARGV[arg + 1] + 0
    ceiling = ARGV[arg + 2] + 0
    arg = arg + 3
  end
  local backlog = backlogs[key]
  if backlog == nil then
    local stored = values[g]
    if not stored and unsure then
      -- Not a string (WRONGTYPE): fails its own items, as alone, not the batch.
      stored = redis.pcall('GET', key)
    end
    if type(stored) == 'table' and stored.err then
      backlog = false
    else
      backlog = backlog_of(stored)
    end
  end
  if backlog == false then
    out[g] = -1
  else
    -- The step's rebase (another quota's backlog): the first item stores it, admitted or not.
    local rebased = backlog > ceiling
    if rebased then backlog = ceiling end
    out[g] = backlog
    -- Items admitted: the j-th (from 1) passes when backlog + j * increment <= tolerance.
    local admitted = 0
    if increment <= tolerance and backlog + increment <= tolerance then
      if increment == 0 then
        admitted = count
      else
        admitted = math.min(count, floordiv(tolerance - backlog, increment))
      end
      backlog = backlog + admitted * increment
    end
    -- An admitted item writes its backlog when it is not 0; a rebased first item writes.
    if rebased or (admitted > 0 and backlog > 0) then writes[key] = backlog end
  end
  backlogs[key] = backlog
end

for key, ahead in pairs(writes) do store_tat(key, ahead) end
return out
