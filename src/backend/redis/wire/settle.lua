-- settle.lua, after limits.lua's body (whose accessors it reads states with): settles a request's
-- cost atomically, giving back units it took (by outcome, or metered) or charging a metered extra.
--
-- KEYS[1..N]  each limit's state, as limits.lua, gcra.lua and CL.THROTTLE keep it.
-- ARGV        N, then five per limit: kind (0 GCRA, 1 sliding log, 2 fixed, 3 sliding, 5
--             calendar window); the GCRA's interval (ns), a window's period (µs) or end (a
--             calendar's, as limits.lua takes it); the delta (units: < 0 gives back, > 0 charges);
--             the GCRA's ceiling (ns), a fixed window's shift (µs), a calendar window's lengths, or
--             0; since (µs: an upper bound on the time since admission; a GCRA's, on the time its
--             units may have drained since: see gcra::drain_bound).
-- Returns     N.
--
-- Giving back never exceeds what the request took: GCRA, the TAT moves back by |delta| x interval;
-- fixed window, only in the admitting window, while current; sliding window, from that window (or
-- the one before, across a boundary); sliding log, the oldest units since the earliest admission.
--
-- Charging (GCRA only) admits and refuses nothing: the TAT moves on by delta x interval from
-- max(TAT, now), capped at now + ceiling (the debt cap); a TAT beyond it (another quota's) stays.

local n = tonumber(ARGV[1])

-- Every key touched before any is written: a key gone mid-script (its slot migrating: see
-- redirect.rs) fails the script before it has settled some limits and not others, so that it can
-- be sent again.
if n > 1 then redis.call('EXISTS', unpack(KEYS, 1, n)) end

-- The item's bound on the time since admission (µs), and the earliest time it may have been.
local since_us, admitted_after

local function charge(key, interval, quantity, ceiling)
  local backlog = read_backlog(key)
  local ahead = math.min(backlog + interval * quantity, ceiling)
  if ahead > backlog then store_tat(key, ahead) end
end

local function gcra(key, interval, quantity)
  local backlog = read_backlog(key)
  if backlog <= 0 then return end
  -- The units less the time they may have drained (since_us: the time since admission beyond what
  -- the key stayed busy without them): a later decision on an idle bucket absorbed at most that
  -- much, so the rest never exceeds what was taken (exact with no decision since).
  local back = interval * quantity - since_us * 1000
  if back <= 0 then return end
  local ahead = backlog - back
  if ahead <= 0 then
    redis.call('DEL', key)
    return
  end
  store_tat(key, ahead)
end

local function sliding_log(key, period, quantity)
  -- A period on, the request's own units have left the log: what is there is newer.
  if since_us >= period then return end
  local members = redis.call('ZRANGEBYSCORE', key, int(admitted_after), '+inf', 'LIMIT', 0, quantity)
  -- In chunks, as limits.lua adds them (unpack has a stack limit).
  for i = 1, #members, 256 do
    redis.call('ZREM', key, unpack(members, i, math.min(#members, i + 255)))
  end
end

-- Takes `quantity` units from fixed window `window`'s count, if the key still counts in it.
local function take_from_window(key, window, quantity)
  local w, c = read_fixed(key)
  if w ~= window then return end
  local count = c - quantity
  if count <= 0 then return redis.call('DEL', key) end
  redis.call('SET', key, int(window) .. ':' .. int(count), 'KEEPTTL')
end

local function fixed_window(key, period, quantity, shift)
  local window = floordiv(now_us + shift, period)
  if floordiv(admitted_after + shift, period) == window then take_from_window(key, window, quantity) end
end

-- limits.lua's calendar_at names the window holding a time by its end.
local function calendar_window(key, finish, quantity, lengths)
  local window = calendar_at(now_us, finish, lengths)
  if calendar_at(admitted_after, finish, lengths) == window then take_from_window(key, window, quantity) end
end

local function sliding_window(key, period, quantity)
  local window = floordiv(now_us, period)
  local current, previous = counts_in(window, read_sliding(key))
  if not current then return end
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

-- Giving back, by kind (a concurrency slot is released, not settled).
local give_back = {[0] = gcra, [1] = sliding_log, [2] = fixed_window, [3] = sliding_window,
  [5] = calendar_window}

for i = 1, n do
  local base = 1 + 5 * (i - 1)
  local kind, a = tonumber(ARGV[base + 1]), tonumber(ARGV[base + 2])
  local delta, last = tonumber(ARGV[base + 3]), tonumber(ARGV[base + 4])
  since_us = tonumber(ARGV[base + 5])
  admitted_after = now_us - since_us
  if delta > 0 and kind == 0 then
    charge(KEYS[i], a, delta, last)
  elseif delta < 0 and give_back[kind] then
    give_back[kind](KEYS[i], a, -delta, last)
  end
end
return n
