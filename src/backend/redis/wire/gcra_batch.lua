-- gcra_batch.lua: several GCRA decisions in one call (batch.rs), each exactly as gcra.lua makes it
-- (the prelude's step), answered per group of identical items rather than per item.
--
-- KEYS[g]  group g's state (gcra.lua's format). A group is a run of items with the same key, quota
--          and quantity; a key may appear in several groups. Items are decided in order, each on
--          the state the one before it left, all at one instant (one TIME).
-- ARGV     per group, its number of items; negative (minus the number) when the group's quota
--          follows: its increment (ns: interval x quantity; a value past the tolerance stands for
--          any larger one), tolerance (ns) and ceiling (ns, gcra.lua's ARGV[8]; the tolerance when
--          not metered). The first group's quota always follows, a later group's only when it
--          differs from the one before (a batch of one quota sends three numbers for it).
-- Returns  per group, the backlog (ns, within the ceiling) its first item was decided on, or -1
--          when its key holds another type (gcra.lua would fail with WRONGTYPE). The client runs
--          the prelude's step from it once per item (gcra_group.rs, the same integer arithmetic)
--          for gcra.lua's five numbers: the script's work and reply are per group, not per item.
--
-- Within a group every item is admitted while the backlog plus its increment stays within the
-- tolerance; the first refused leaves the backlog as it is, so every later one is refused on it:
-- the count admitted is all the script needs. A key is read once (one MGET for the batch) and
-- written once, after its last item, with the value and expiry gcra.lua's last write would leave.
-- Numbers are read from ARGV by arithmetic (`x + 0`: one conversion, where tonumber makes two).

-- Per key: its backlog as the groups so far left it (false: not a string), and what to write.
local backlogs = {}
local writes = {}
local out = {}

local groups = #KEYS

-- Every key's value in one MGET rather than a GET per key (one command instead of one a group, on
-- a batch of many keys). MGET answers nil (false here) both for a missing key and for one of
-- another type, which GET refuses (WRONGTYPE): when any came back nil, one EXISTS of those tells
-- whether any exists; only then is each asked alone (GET, below), to fail its own items.
local values = redis.call('MGET', unpack(KEYS))
local absent = nil
for g = 1, groups do
  if not values[g] then
    -- Made only when needed: a hot key's batch finds its key (one table less to collect).
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
      -- A key that is not a string (WRONGTYPE) fails its own items, as gcra.lua would fail
      -- alone, not the batch.
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
    -- The step's rebase: a backlog past the ceiling was written under another quota; the first
    -- item stores it as the ceiling, admitted or not.
    local rebased = backlog > ceiling
    if rebased then
      backlog = ceiling
    end
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
    if rebased or (admitted > 0 and backlog > 0) then
      writes[key] = backlog
    end
  end
  backlogs[key] = backlog
end

for key, ahead in pairs(writes) do
  store_tat(key, ahead)
end
return out
