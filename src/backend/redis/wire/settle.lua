-- settle.lua: settles what a request cost, atomically, for one client, after the prelude: gives
-- back units it took (counting by outcome, or a metered request that cost less than it reserved),
-- or charges a metered request's extra cost.
--
-- KEYS[1..N]  each limit's state, as limits.lua, gcra.lua and CL.THROTTLE keep it.
-- ARGV        N, since (µs: an upper bound on the time since admission), then four per limit:
--             kind (0 GCRA, 1 sliding log, 2 fixed window, 3 sliding window, 5 calendar window);
--             the GCRA's interval (ns), a window's period (µs), or a calendar window's end (Unix
--             seconds); the delta (units: negative gives back, positive charges, 0 leaves it); the
--             GCRA's ceiling (ns), a fixed window's shift (µs), a calendar window's lengths (as
--             limits.lua takes them), or 0.
-- Returns     N.
--
-- Giving back never gives back more than the request took: GCRA, the TAT moves back by |delta| x
-- interval (asked only while the units still count); fixed window, only from the window that
-- admitted it, while current; sliding window, from that window (or, across a boundary, the one
-- before, which weighs less); sliding log, the oldest units logged since the earliest admission.
--
-- Charging (GCRA only; a positive delta for a window is ignored) admits and refuses nothing: the TAT
-- moves on by delta x interval from max(TAT, now), capped at now + ceiling, so the key may owe up to
-- the debt cap; a TAT already beyond the cap (another quota's) is left as it is.

local n = tonumber(ARGV[1])
local since_us = tonumber(ARGV[2])

local admitted_after = now_us - since_us

local function charge(key, interval, quantity, ceiling)
  local backlog = backlog_of(redis.call('GET', key))
  local ahead = math.min(backlog + interval * quantity, ceiling)
  if ahead > backlog then
    store_tat(key, ahead)
  end
end

local function gcra(key, interval, quantity)
  local backlog = backlog_of(redis.call('GET', key))
  if backlog <= 0 then
    return
  end
  -- The request's units, less the time since its admission: any later decision that found the
  -- bucket idle without it absorbed at most that much of them, so giving back the rest never gives
  -- back more than the request took (for a refund with no decision since, it is exact).
  local back = interval * quantity - since_us * 1000
  if back <= 0 then
    return
  end
  local ahead = backlog - back
  if ahead <= 0 then
    redis.call('DEL', key)
    return
  end
  store_tat(key, ahead)
end

local function sliding_log(key, quantity)
  local members = redis.call('ZRANGEBYSCORE', key, int(admitted_after), '+inf', 'LIMIT', 0, quantity)
  if #members > 0 then
    redis.call('ZREM', key, unpack(members))
  end
end

-- Takes `quantity` units from fixed window `window`'s count, if the key still counts in it.
local function take_from_window(key, window, quantity)
  local stored = redis.call('GET', key)
  if not stored then
    return
  end
  local w, c = string.match(stored, '^(%d+):(%d+)$')
  if not w or tonumber(w) ~= window then
    return
  end
  local count = tonumber(c) - quantity
  if count <= 0 then
    redis.call('DEL', key)
  else
    redis.call('SET', key, int(window) .. ':' .. int(count), 'KEEPTTL')
  end
end

local function fixed_window(key, period, quantity, shift)
  local window = floordiv(now_us + shift, period)
  if floordiv(admitted_after + shift, period) == window then
    take_from_window(key, window, quantity)
  end
end

-- limits.lua's calendar_at (the window holding `at`, by its end), the name alone.
local function calendar_at(at, finish, lengths)
  local before = floordiv(lengths, 4194304)
  local after = lengths - before * 4194304
  local last = finish + after + after
  for _, ends in ipairs({finish - before, finish, finish + after, last}) do
    if at < ends * 1000000 then
      return ends
    end
  end
  return last
end

local function calendar_window(key, finish, quantity, lengths)
  local window = calendar_at(now_us, finish, lengths)
  if calendar_at(admitted_after, finish, lengths) == window then
    take_from_window(key, window, quantity)
  end
end

local function sliding_window(key, period, quantity)
  local stored = redis.call('GET', key)
  if not stored then
    return
  end
  local w, c, p = string.match(stored, '^(%d+):(%d+):(%d+)$')
  if not w then
    return
  end
  local window = floordiv(now_us, period)
  local current, previous
  if tonumber(w) == window then
    current, previous = tonumber(c), tonumber(p)
  elseif tonumber(w) + 1 == window then
    current, previous = 0, tonumber(c)
  else
    return
  end
  local back = window - floordiv(admitted_after, period)
  if back == 0 then
    current = math.max(current - quantity, 0)
  elseif back == 1 then
    previous = math.max(previous - quantity, 0)
  else
    return
  end
  if current == 0 and previous == 0 then
    redis.call('DEL', key)
  else
    redis.call('SET', key, int(window) .. ':' .. int(current) .. ':' .. int(previous), 'KEEPTTL')
  end
end

for i = 1, n do
  local base = 2 + 4 * (i - 1)
  local kind = tonumber(ARGV[base + 1])
  local a = tonumber(ARGV[base + 2])
  local delta = tonumber(ARGV[base + 3])
  if delta > 0 then
    if kind == 0 then
      charge(KEYS[i], a, delta, tonumber(ARGV[base + 4]))
    end
  elseif delta < 0 then
    local quantity = -delta
    if kind == 0 then
      gcra(KEYS[i], a, quantity)
    elseif kind == 1 then
      sliding_log(KEYS[i], quantity)
    elseif kind == 2 then
      fixed_window(KEYS[i], a, quantity, tonumber(ARGV[base + 4]))
    elseif kind == 3 then
      sliding_window(KEYS[i], a, quantity)
    elseif kind == 5 then
      calendar_window(KEYS[i], a, quantity, tonumber(ARGV[base + 4]))
    end
  end
end
return n
