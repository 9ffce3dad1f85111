-- limits_batch.lua: several limits.lua calls in one (batch.rs), after limits.lua's body (its
-- `limits` function): each item is decided by that function exactly as limits.lua alone decides
-- it, in the order given, each on the state the items before it left.
--
-- KEYS    every item's keys, one item after the other (as limits.lua takes them).
-- ARGV    the number of items, then per item: its number of keys, its number of arguments, and its
--         arguments (as limits.lua takes them).
-- Returns per item limits.lua's reply ({banned, then five per limit}); an item whose call failed
--         (a key that holds another type: WRONGTYPE) has its error's text in place of `banned`,
--         then zeros, so that it fails alone and the others are answered.
--
-- All items are decided at one instant (the prelude's one TIME): as if they had reached Redis in
-- the same microsecond, in the order given. Nothing is shared between items but Redis's keys:
-- every read and write an item makes is the one limits.lua would make alone.

local items = tonumber(ARGV[1])
local out = {}
local at_key, at_arg = 0, 1
for _ = 1, items do
  local nkeys = tonumber(ARGV[at_arg + 1])
  local nargs = tonumber(ARGV[at_arg + 2])
  local item_keys, item_argv = {}, {}
  for i = 1, nkeys do
    item_keys[i] = KEYS[at_key + i]
  end
  for i = 1, nargs do
    item_argv[i] = ARGV[at_arg + 2 + i]
  end
  at_key = at_key + nkeys
  at_arg = at_arg + 2 + nargs
  local ok, reply = pcall(limits, item_keys, item_argv)
  if ok then
    for i = 1, #reply do
      out[#out + 1] = reply[i]
    end
  else
    -- A Redis error is a table with an `err` field; a Lua one, a string.
    if type(reply) == 'table' then
      reply = reply.err
    end
    out[#out + 1] = tostring(reply)
    for _ = 1, 5 * tonumber(item_argv[1]) do
      out[#out + 1] = 0
    end
  end
end
return out
