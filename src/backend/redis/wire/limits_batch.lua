-- limits_batch.lua: several limits.lua calls in one (batch.rs), after limits.lua's body: each item
-- decided by `limits` exactly as alone, in order, on the state the items before left, at one TIME.
--
-- KEYS    every item's keys, one item after the other.
-- ARGV    the number of items, then per item: its number of keys, of arguments, and its arguments.
-- Returns per item limits.lua's reply; a failed item (WRONGTYPE) has its error's text in place of
--         `banned`, then zeros, so that it fails alone.
--
-- The string states (limits.lua's six accessors) go through a cache: a key is read once and written
-- once, as limits.lua's last write would (a hot key's batch: one GET, one SET). A cached key is
-- written out before an item uses it otherwise, and an item naming one key twice runs on Redis
-- directly, so Redis and the cache never disagree. Sorted sets and penalty keys go per item.

-- Per key: {kind = 0 (a = backlog), 2 (a = window, b = count) or 3 (a = window, b = current,
-- c = previous)} as the accessors read it (a = nil: no state), `ms` once written (its expiry).
local cache = {}

local direct = {
  [0] = {read_backlog, write_backlog},
  [2] = {read_fixed, write_fixed},
  [3] = {read_sliding, write_sliding},
}

-- Writes a key's state as the last item that wrote it left it, and forgets the key.
local function flush(key)
  local entry = cache[key]
  if not entry then return end
  cache[key] = nil
  if entry.ms then
    local kind, write = entry.kind, direct[entry.kind][2]
    if kind == 0 then
      write(key, entry.a)
    elseif kind == 2 then
      write(key, entry.a, entry.b, entry.ms)
    else
      write(key, entry.a, entry.b, entry.c, entry.ms)
    end
  end
end

-- The entry of `key` read as `kind`: cached, or read (a failed read fails the item, caching nothing).
local function entry_of(key, kind)
  local entry = cache[key]
  if entry and entry.kind ~= kind then
    flush(key)
    entry = nil
  end
  if not entry then
    local a, b, c = direct[kind][1](key)
    entry = {kind = kind, a = a, b = b, c = c}
    cache[key] = entry
  end
  return entry
end

-- A write follows the item's read of the same key, so its entry is there, of its kind.
local function written(key, kind, a, b, c, ms)
  local entry = entry_of(key, kind)
  entry.a, entry.b, entry.c, entry.ms = a, b, c, ms
end

-- The six accessors, through the cache and directly, in the order `use` sets them.
local cached = {
  function(key) return entry_of(key, 0).a end,
  function(key, ahead) written(key, 0, ahead, nil, nil, true) end,
  function(key) local entry = entry_of(key, 2) return entry.a, entry.b end,
  function(key, window, count, ms) written(key, 2, window, count, nil, ms) end,
  function(key) local entry = entry_of(key, 3) return entry.a, entry.b, entry.c end,
  function(key, window, current, previous, ms) written(key, 3, window, current, previous, ms) end,
}
local uncached = {direct[0][1], direct[0][2], direct[2][1], direct[2][2], direct[3][1], direct[3][2]}

-- Each distinct argument's number, parsed once a batch.
local numbers = {}
arg_number = function(text)
  local number = numbers[text]
  if number == nil then
    -- tonumber's own error for a missing argument, as alone.
    number = tonumber(text)
    if number ~= nil then numbers[text] = number end
  end
  return number
end

local function use(through_cache)
  read_backlog, write_backlog, read_fixed, write_fixed, read_sliding, write_sliding =
    unpack(through_cache and cached or uncached)
end

-- The kinds the cache keeps (as sent): GCRA, fixed, sliding and calendar (a fixed window's state).
local CACHED_KINDS = {['0'] = true, ['2'] = true, ['3'] = true, ['5'] = true}

-- Whether the item goes through the cache (its keys are distinct); first writes out every key it
-- uses otherwise (all, when it runs directly). Nothing is allocated: this runs for every item.
local function prepare(item_keys, item_argv)
  local count = #item_keys
  local distinct = true
  for i = 2, count do
    local key = item_keys[i]
    for j = 1, i - 1 do if item_keys[j] == key then distinct = false end end
  end
  -- Arguments limits.lua refuses fail the item there; here they only mean "not cached".
  local n = tonumber(item_argv[1]) or 0
  for i = 1, count do
    local kind = i <= n and item_argv[6 + 4 * (i - 1) + 1] or nil
    if not distinct or not CACHED_KINDS[kind or ''] then flush(item_keys[i]) end
  end
  return distinct
end

use(true)
local items = tonumber(ARGV[1])
local out = {}
local at_key, at_arg = 0, 1
for _ = 1, items do
  local nkeys = tonumber(ARGV[at_arg + 1])
  local nargs = tonumber(ARGV[at_arg + 2])
  -- Made at their size at once (a table grown one element at a time is rebuilt as it grows).
  local item_keys = {unpack(KEYS, at_key + 1, at_key + nkeys)}
  local item_argv = {unpack(ARGV, at_arg + 3, at_arg + 2 + nargs)}
  at_key = at_key + nkeys
  at_arg = at_arg + 2 + nargs
  local cached = prepare(item_keys, item_argv)
  if not cached then use(false) end
  local ok, reply = pcall(limits, item_keys, item_argv)
  if not cached then use(true) end
  if ok then
    for i = 1, #reply do out[#out + 1] = reply[i] end
  else
    -- A Redis error is a table with an `err` field; a Lua one, a string.
    if type(reply) == 'table' then reply = reply.err end
    out[#out + 1] = tostring(reply)
    for _ = 1, 5 * tonumber(item_argv[1]) do out[#out + 1] = 0 end
  end
end
for key in pairs(cache) do flush(key) end
return out
