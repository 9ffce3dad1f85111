-- refund.lua: gives back units a request took (counting by outcome), atomically, for one client,
-- after the prelude (prelude.lua).
--
-- KEYS[1..N]  each limit's state, as limits.lua, gcra.lua and CL.THROTTLE keep it (the GCRA's TAT is
--             redis-cell's format, so a refund works on either path).
-- ARGV        N, quantity, since (µs: an upper bound on the time since the request was admitted),
--             then two per limit: kind (0 GCRA, 1 sliding log, 2 fixed window, 3 sliding window) and
--             GCRA: the emission interval (ns); windows: the period (µs).
-- Returns     N.
--
-- Never gives back more than the request took: the state becomes at most what it would be had the
-- request not come. GCRA: the TAT moves back by quantity x interval (the caller only asks while the
-- request's units still count, so nothing has drained them). Fixed window: only from the window that
-- admitted the request, while it is the current one. Sliding window: from the window that admitted it
-- (or, when the admission may lie across a boundary, the one before, which weighs less). Sliding log:
-- the oldest units logged at or after the earliest time the request may have been admitted.

local n = tonumber(ARGV[1])
local quantity = tonumber(ARGV[2])
local since_us = tonumber(ARGV[3])

local admitted_after = now_us - since_us

local function gcra(key, interval)
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

local function sliding_log(key)
  local members = redis.call('ZRANGEBYSCORE', key, int(admitted_after), '+inf', 'LIMIT', 0, quantity)
  if #members > 0 then
    redis.call('ZREM', key, unpack(members))
  end
end

local function fixed_window(key, period)
  local window = floordiv(now_us, period)
  if floordiv(admitted_after, period) ~= window then
    return
  end
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

local function sliding_window(key, period)
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
  local kind = tonumber(ARGV[2 + 2 * i])
  local a = tonumber(ARGV[3 + 2 * i])
  if kind == 0 then
    gcra(KEYS[i], a)
  elseif kind == 1 then
    sliding_log(KEYS[i])
  elseif kind == 2 then
    fixed_window(KEYS[i], a)
  elseif kind == 3 then
    sliding_window(KEYS[i], a)
  end
end
return n
