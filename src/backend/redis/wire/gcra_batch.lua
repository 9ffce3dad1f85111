-- gcra_batch.lua: several GCRA decisions in one call (batch.rs), each exactly as gcra.lua makes it
-- (the prelude's step), answered per group of identical items rather than per item.
--
-- KEYS[g]  group g's state, in gcra.lua's format (redis-cell's TAT string). A group is a run of
--          items with the same key, quota and quantity (one hot key's requests: one group); a key
--          may appear in several groups. Items are decided in order, each on the state the one
--          before it left.
-- ARGV     per group, its number of items; negative (minus the number) when the group's quota
--          follows it: its increment (ns: emission interval x quantity, gcra.lua's ARGV[1] x
--          ARGV[4]; a value past the tolerance stands for any larger one), its tolerance (ns), and
--          its ceiling (ns, gcra.lua's ARGV[8]: a metered limit's tolerance plus its debt cap; the
--          tolerance when not metered). The first group's quota always follows; a later group's
--          only when it differs from the group's before it, so a batch of one quota (a hot key's,
--          or one limit's over many keys) sends three numbers for it and one per group.
-- Returns  one integer per group: the backlog (ns, within the ceiling) its first item was decided
--          on, or -1 when its key holds another type (gcra.lua would fail with WRONGTYPE). The
--          items of a group are decided by the prelude's step one after the other from that
--          backlog, by pure arithmetic on the group's arguments: the client runs that step
--          (gcra_group.rs, the same integer arithmetic) to get each item's five numbers, exactly
--          gcra.lua's {limited, limit, remaining, retry_after, reset_after}. So the script's work
--          and its reply are per group, not per item.
--
-- Numbers are read from ARGV by arithmetic (`x + 0`: one conversion) rather than by tonumber (two:
-- it tests, then converts), as the client sends only integers.
--
-- Within a group: every item is admitted while the backlog plus its increment stays within the
-- tolerance, each adding its increment; the first that is refused leaves the backlog as it is, so
-- every later one is refused on the same backlog. The script needs only how many are admitted to
-- know the state the group leaves.
--
-- All items are decided at one instant (one TIME): as if they had reached Redis in the same
-- microsecond, in the order given. A key's state is read once and written once (when an item
-- wrote it under gcra.lua), after the last of its items: the same value and expiry gcra.lua's last
-- write would leave, for one MGET for the batch and one SET per key instead of a GET and a SET per
-- item.

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
