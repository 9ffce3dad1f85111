-- limits.lua: N limits of any algorithm (src/window.rs, src/gcra.rs) for one client, atomically.
--
-- KEYS[1..N]  each limit's state (one hash tag: one Cluster slot): GCRA, the TAT; sliding log, a
--             ZSET of admitted units scored by time (µs); fixed window "window:count"; sliding
--             window "window:current:previous"; concurrency, a ZSET of units scored by lease end.
-- KEYS[N+1], KEYS[N+2]  with a penalty box (the first limit's): strikes (expiring `within` after
--             the first) and the ban; a banned key is answered without its limits' states.
-- ARGV        N, quantity, token (members token:0 .. token:q-1), penalty after (0 = none), within
--             (ms), ban (ms), then four per limit: kind (0 GCRA, 1 sliding log, 2 fixed window, 3
--             sliding window, 4 concurrency, 5 calendar window), limit, then GCRA: interval,
--             tolerance (ns); fixed window: period, shift (µs: the key's own phase); other windows:
--             period (µs), 0; concurrency: lease (µs), 0; calendar window: see calendar_at. Then
--             optionally N ceilings (a metered GCRA limit's, ns; 0: the tolerance), then optionally
--             N quantities (absent: `quantity`).
-- Returns     {banned, then per limit: limited, limit, remaining, retry_after (ns, -1 = never),
--             reset_after (ns)}.
--
-- The body defines `limits(keys, argv)` (lua.rs appends the line that runs it). Phase 1 reads and
-- decides; phase 2 writes only if every limit admitted, so a rejection consumes nothing (a lone
-- GCRA's rebase still happens, as in gcra.lua: it records no request). Windows are cut by exact
-- integer division of TIME's microseconds at window.rs's boundaries; the build-time bounds keep
-- every sum and product below 2^53.

-- One call's keys and arguments, set by `limits` for each decision (once per batch item).
local keys, argv, n, quantity, token, penalty_after

-- The string states go through these six: alone, GET and SET in each state's format;
-- limits_batch.lua puts its cache in their place.
-- A GCRA's TAT, as its backlog (the prelude's backlog_of and store_tat).
local read_backlog = function(key) return backlog_of(redis.call('GET', key)) end
local write_backlog = store_tat
-- A fixed window's "window:count": the window and the count (nothing: no key, or another format).
local read_fixed = function(key)
  local stored = redis.call('GET', key)
  if stored then
    local w, c = string.match(stored, '^(%d+):(%d+)$')
    if w then return tonumber(w), tonumber(c) end
  end
end
local write_fixed = function(key, window, count, ms)
  redis.call('SET', key, int(window) .. ':' .. int(count), 'PX', ms)
end
-- A sliding window's "window:current:previous".
local read_sliding = function(key)
  local stored = redis.call('GET', key)
  if stored then
    local w, c, p = string.match(stored, '^(%d+):(%d+):(%d+)$')
    if w then return tonumber(w), tonumber(c), tonumber(p) end
  end
end
local write_sliding = function(key, window, current, previous, ms)
  redis.call('SET', key, int(window) .. ':' .. int(current) .. ':' .. int(previous), 'PX', ms)
end

-- The arguments' numbers: tonumber alone; limits_batch.lua remembers each distinct argument's.
local arg_number = tonumber

-- Expiries are whole milliseconds: round up, so that a key never expires before its state is stale.
local function ceil_ms(us) return math.max(math.ceil(us / 1000), 1) end

-- Adds members token:0 .. token:(q-1) with this score, in chunks (unpack has a stack limit).
local function add_members(key, score, q)
  local s = int(score)
  local i = 0
  while i < q do
    local args = {}
    local stop = math.min(q, i + 256)
    while i < stop do
      args[#args + 1] = s
      args[#args + 1] = token .. ':' .. i
      i = i + 1
    end
    redis.call('ZADD', key, unpack(args))
  end
end

-- GCRA: gcra.lua's step. Another quota's state is rebased: alone at once, as gcra.lua does; in a
-- stack only if the stack admits, as memory does (a rejected stack writes nothing), and after
-- every key has been read (redirect.rs: a script that fails must fail before it writes).
local function gcra(key, limit, interval, tolerance, q, ceiling)
  local backlog = read_backlog(key)
  local rebased = backlog > ceiling
  if rebased then
    backlog = ceiling
    if n == 1 then write_backlog(key, backlog) end
  end
  local reply, ahead = gcra_step(backlog, interval, tolerance, limit, q, ceiling)
  if reply[1] == 0 and (q > 0 or rebased) and ahead then
    return reply, function()
      write_backlog(key, ahead)
    end
  end
  return reply
end

-- Sliding log: a unit admitted at t counts while now < t + period.
local function sliding_log(key, limit, period, q)
  local gone = now_us - period
  local used = redis.call('ZCOUNT', key, '(' .. int(gone), '+inf')
  local function reset()
    local newest = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
    if #newest == 2 then
      local t = tonumber(newest[2])
      if t > gone then return (t + period - now_us) * 1000 end
    end
    return 0
  end
  if q <= limit - used then
    local write = nil
    local reset_after = period * 1000
    if q > 0 then
      write = function()
        -- Added before the old leave: emptied first, the key would be gone for a moment, and a
        -- migrating slot's node refuses a script a key it no longer has (redirect.rs).
        add_members(key, now_us, q)
        redis.call('ZREMRANGEBYSCORE', key, '-inf', int(gone))
        -- The newest member leaves the window last: then the key is empty anyway.
        redis.call('PEXPIRE', key, ceil_ms(period))
      end
    else
      reset_after = reset()
    end
    return {0, limit, limit - used - q, -1, reset_after}, write
  end
  local retry = -1
  if q <= limit then
    -- The oldest used + q - limit units must leave: the last of them decides.
    local at = redis.call('ZRANGEBYSCORE', key, '(' .. int(gone), '+inf', 'WITHSCORES', 'LIMIT',
      used + q - limit - 1, 1)
    retry = (tonumber(at[2]) + period - now_us) * 1000
  end
  return {1, limit, math.max(limit - used, 0), retry, reset()}
end

-- A fixed window's count: `window` names the window holding now, which ends `to_boundary` µs on;
-- `next` names the window after it (a window's end is `unit` µs later for each step of its name).
local function window_count(key, limit, q, window, to_boundary, next, unit)
  local used = 0
  local w, c = read_fixed(key)
  -- The next window (the server's clock stepped back across a boundary: a failover to a replica
  -- behind, an NTP step) is the one the key counts in, as memory decides, until that window
  -- ends: its count must not expire with the server's window. Only the next: a window further
  -- on was numbered under another period (a quota changed), and counts for nothing.
  if w and w == next then
    to_boundary = to_boundary + (w - window) * unit
    window = w
  end
  if w == window then
    -- A count above the limit was written under another quota: it means "full" under this one.
    used = math.min(c, limit)
  end
  if q <= limit - used then
    local total = used + q
    local write = nil
    if q > 0 then
      write = function()
        -- The window number is stored too, so an expiry rounded up past the boundary is harmless.
        write_fixed(key, window, total, ceil_ms(to_boundary))
      end
    end
    local reset_after = total > 0 and to_boundary * 1000 or 0
    return {0, limit, limit - total, -1, reset_after}, write
  end
  local retry = q <= limit and to_boundary * 1000 or -1
  local reset_after = used > 0 and to_boundary * 1000 or 0
  return {1, limit, limit - used, retry, reset_after}
end

-- `shift` (µs): how far this key's clock runs ahead, so that its windows start at its own phase.
local function fixed_window(key, limit, period, q, shift)
  local at = now_us + shift
  local window = floordiv(at, period)
  return window_count(key, limit, q, window, period - (at - window * period), window + 1, period)
end

-- A calendar window (src/calendar.rs): the client computed, on its clock, the end `finish` (Unix
-- seconds) of the window holding it and the lengths of that window and the next (`lengths`, as
-- before x 2^22 + after); the server's clock, a little behind or ahead, is in the window ending
-- at `finish - before`, `finish` or `finish + after` (or, a whole window ahead, in one as long as
-- the last after that). Returns that window's end (its name) and the µs left to it. Bounds'
-- window_at in calendar.rs is the same; settle.lua uses this one.
local function calendar_at(at, finish, lengths)
  local before = floordiv(lengths, 4194304)
  local after = lengths - before * 4194304
  local last = finish + after + after
  local all = {finish - before, finish, finish + after, last}
  for i, ends in ipairs(all) do
    -- The third value: the end of the window after (nil past the last known).
    if at < ends * 1000000 then return ends, ends * 1000000 - at, all[i + 1] end
  end
  return last, 1
end

-- A calendar window is named by its end (Unix seconds).
local function calendar_window(key, limit, finish, q, lengths)
  local window, to_boundary, next = calendar_at(now_us, finish, lengths)
  return window_count(key, limit, q, window, to_boundary, next, 1000000)
end

-- A sliding window's counts in `window` and the one before, as a key holds them (`w`, `c`, `p`,
-- as read_sliding reads them; nil: none). settle.lua reads them too.
local function counts_in(window, w, c, p)
  if w == window then return c, p end
  if w and w + 1 == window then return 0, c end
end

local function sliding_window(key, limit, period, q)
  local window = floordiv(now_us, period)
  local left = period - (now_us - window * period)
  local w, c, p = read_sliding(key)
  -- Its count is stale once the next window is over (it becomes nobody's previous).
  local stale_in = left + period
  -- The next window (as window_count's): decided at its start, where its previous count weighs
  -- most, and stale once the window after it is over.
  if w and w == window + 1 then
    stale_in = (w + 2) * period - now_us
    window, left = w, period
  end
  local current, previous = counts_in(window, w, c, p)
  current, previous = math.min(current or 0, limit), math.min(previous or 0, limit)
  -- The estimate times the period, exactly (see the header for the bounds).
  local weighted = previous * left + current * period
  local capacity = limit * period
  local reset_after = 0
  if current > 0 then
    reset_after = (left + period) * 1000
  elseif previous > 0 then
    reset_after = left * 1000
  end
  if q <= limit and weighted + q * period <= capacity then
    local now_current = current + q
    local write = nil
    if q > 0 then
      write = function()
        write_sliding(key, window, now_current, previous, ceil_ms(stale_in))
      end
    end
    if now_current > 0 then reset_after = (left + period) * 1000 end
    return {0, limit, floordiv(capacity - weighted - q * period, period), -1, reset_after}, write
  end
  local remaining = capacity > weighted and floordiv(capacity - weighted, period) or 0
  -- floor(room × 1000 / by) in nanoseconds without forming room × 1000 (which may pass 2^53).
  local function fits_ns(room, by)
    local whole = floordiv(room, by)
    return whole * 1000 + floordiv((room - whole * by) * 1000, by), whole
  end
  local retry = -1
  if q <= limit then
    if current + q <= limit then
      -- Later in this window, as the previous window is weighted out (previous > 0 here, and the
      -- fit is shorter than what is left of the window, or the request would have passed).
      local fits = fits_ns((limit - current - q) * period, previous)
      retry = left * 1000 - fits
    else
      -- Not before the next window, where this window's count (> 0 here) is weighted out.
      local fits, whole = fits_ns((limit - q) * period, current)
      if whole >= period then fits = period * 1000 end
      retry = left * 1000 + (period * 1000 - fits)
    end
  end
  return {1, limit, remaining, retry, reset_after}
end

local function concurrency(key, limit, lease, q)
  -- Leases that ended (their process died without releasing them) no longer count.
  local in_flight = redis.call('ZCOUNT', key, '(' .. int(now_us), '+inf')
  if q <= limit - in_flight then
    local write = nil
    if q > 0 then
      write = function()
        -- Added first, as the sliding log's (its new leases end after now).
        add_members(key, now_us + lease, q)
        redis.call('ZREMRANGEBYSCORE', key, '-inf', int(now_us))
        -- The key outlives its longest lease, whatever leases earlier calls asked for.
        local want = ceil_ms(lease)
        if redis.call('PTTL', key) < want then redis.call('PEXPIRE', key, want) end
      end
    end
    return {0, limit, limit - in_flight - q, -1, 0}, write
  end
  -- window.rs's CONCURRENCY_RETRY: when a slot frees up is unknown.
  local retry = q <= limit and S or -1
  return {1, limit, math.max(limit - in_flight, 0), retry, math.max(retry, 0)}
end

local deciders = {[0] = gcra, sliding_log, fixed_window, sliding_window, concurrency,
  calendar_window}

local function decide(i, q)
  local base = 6 + 4 * (i - 1)
  local kind = arg_number(argv[base + 1])
  local limit = arg_number(argv[base + 2])
  local a = arg_number(argv[base + 3])
  local b = arg_number(argv[base + 4])
  if kind == 0 then
    local ceiling = math.max(arg_number(argv[6 + 4 * n + i] or '0'), b)
    return gcra(keys[i], limit, a, b, q, ceiling)
  end
  return deciders[kind](keys[i], limit, a, q, b)
end

local function limit_of(i) return arg_number(argv[6 + 4 * (i - 1) + 2]) end

local function limits(call_keys, call_argv)
  keys, argv = call_keys, call_argv
  n = arg_number(argv[1])
  quantity = arg_number(argv[2])
  token = argv[3]
  penalty_after = arg_number(argv[4])
  if penalty_after > 0 then
    local banned_ms = redis.call('PTTL', keys[n + 2])
    if banned_ms > 0 then
      local out = {1}
      for i = 1, n do
        local rest = banned_ms * 1000000
        for _, v in ipairs({1, limit_of(i), 0, rest, rest}) do out[#out + 1] = v end
      end
      return out
    end
  end

  local results = {}
  local writes = {}
  local admitted = true
  for i = 1, n do
    local result, write = decide(i, arg_number(argv[6 + 5 * n + i] or quantity))
    results[i] = result
    writes[i] = write
    if result[1] == 1 then admitted = false end
  end

  local banned = 0
  if admitted then
    for i = 1, n do if writes[i] then writes[i]() end end
  else
    -- The limits that would have admitted report their state as it stands: nothing was recorded.
    for i = 1, n do if results[i][1] == 0 then results[i] = decide(i, 0) end end
    -- A rejection is a strike, counted in a window that opens with the first (Rack::Attack's
    -- Allow2Ban): one small counter per key, whatever `after` is.
    if penalty_after > 0 then
      local within_ms = tonumber(argv[5])
      local ban_ms = tonumber(argv[6])
      local strikes = redis.call('INCR', keys[n + 1])
      if strikes == 1 then redis.call('PEXPIRE', keys[n + 1], within_ms) end
      if strikes >= penalty_after then
        redis.call('DEL', keys[n + 1])
        redis.call('SET', keys[n + 2], 1, 'PX', ban_ms)
        banned = 1
        for i = 1, n do
          local r = results[i]
          -- The ban, or the limit's own retry time if that is later.
          local wait = ban_ms * 1000000
          if r[1] == 1 and r[4] > wait then wait = r[4] end
          results[i] = {1, r[2], 0, wait, math.max(r[5], wait)}
        end
      end
    end
  end

  local out = {banned}
  for i = 1, n do
    for j = 1, 5 do out[#out + 1] = results[i][j] end
  end
  return out
end
