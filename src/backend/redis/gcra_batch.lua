-- tower-throttle: several GCRA decisions in one call (batch.rs), each exactly as gcra.lua makes it.
--
-- KEYS[g]  group g's state, in gcra.lua's format (redis-cell's TAT string). A group is a run of
--          items with the same key, quota and quantity (one hot key's requests: one group); a key
--          may appear in several groups. Items are decided in order, each on the state the one
--          before it left.
-- ARGV     five per group: emission interval (ns), tolerance (ns), limit, quantity (gcra.lua's),
--          and the number of items in the group.
-- Returns  five integers per item: {limited, limit, remaining, retry_after, reset_after}, as
--          gcra.lua (no penalty box: policies with one are never batched); limited = -1 for an item
--          whose key holds another type (gcra.lua would fail with WRONGTYPE).
--
-- All items are decided at one instant (one TIME): as if they had reached Redis in the same
-- microsecond, in the order given. A key's state is read once and written once (when an item
-- wrote it under gcra.lua), after the last of its items: the same value and expiry gcra.lua's last
-- write would leave, for one GET and one SET per key instead of per item.

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

-- Per key: its backlog (max(tat - now, 0)) as the items so far left it, and whether to write it.
local backlogs = {}
local dirty = {}
local written = {}
local out = {}
local n = 0 -- #out

for g = 1, #KEYS do
  local key = KEYS[g]
  local base = (g - 1) * 5
  local interval = tonumber(ARGV[base + 1])
  local tolerance = tonumber(ARGV[base + 2])
  local limit = tonumber(ARGV[base + 3])
  local quantity = tonumber(ARGV[base + 4])
  local increment = interval * quantity
  for _ = 1, tonumber(ARGV[base + 5]) do
    local backlog = backlogs[key]
    if backlog == nil then
      backlog = 0
      -- A key that is not a string (WRONGTYPE) fails its own items, as gcra.lua would fail alone,
      -- not the batch.
      local stored = redis.pcall('GET', key)
      if type(stored) == 'table' and stored.err then
        backlog = false
      elseif stored then
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
    end

    if backlog == false then
      backlogs[key] = false
      out[n + 1] = -1
      out[n + 2] = 0
      out[n + 3] = 0
      out[n + 4] = 0
      out[n + 5] = 0
      n = n + 5
    else
      local rebased = backlog > tolerance
      if rebased then
        backlog = tolerance
      end
      local new_backlog = backlog + increment
      if new_backlog <= tolerance then
        if new_backlog > 0 then
          backlogs[key] = new_backlog
          dirty[key] = true
        else
          backlogs[key] = backlog
        end
        out[n + 1] = 0
        out[n + 2] = limit
        out[n + 3] = floordiv(tolerance - new_backlog, interval)
        out[n + 4] = -1
        out[n + 5] = new_backlog
        n = n + 5
      else
        backlogs[key] = backlog
        if rebased and backlog > 0 then
          dirty[key] = true
        end
        local remaining = floordiv(tolerance - backlog, interval)
        if remaining > limit then
          remaining = limit
        end
        local retry_after = -1
        if increment <= tolerance then
          retry_after = new_backlog - tolerance
        end
        out[n + 1] = 1
        out[n + 2] = limit
        out[n + 3] = remaining
        out[n + 4] = retry_after
        out[n + 5] = backlog
        n = n + 5
      end
    end
  end
end

for i = 1, #KEYS do
  local key = KEYS[i]
  if dirty[key] and not written[key] then
    written[key] = true
    local ahead = backlogs[key]
    local r = now_ns + ahead
    local carry = floordiv(r, S)
    local tat = string.format('%d%09d', now_s + carry, r - carry * S)
    redis.call('SET', key, tat, 'PX', math.ceil(ahead / 1000000))
  end
end
return out
