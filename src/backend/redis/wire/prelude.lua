-- tower-throttle: every script's prelude (lua.rs): the clock, integer helpers, the GCRA state.
--
-- Time is the server's (TIME), one clock for every client: now_s (seconds since the epoch), now_us
-- (microseconds: exact in a double until 2255), now_ns (nanoseconds within the second).
--
-- The GCRA state is the TAT in nanoseconds since the epoch, a decimal string: redis-cell's format,
-- so CL.THROTTLE and the scripts share keys. It is only handled as its distance from now (the
-- backlog; 1.8e18 ns exceeds 2^53), which the backend keeps below 2^52 ns (about 52 days) by
-- refusing longer tolerances: every sum and product below is an exact integer in a double.

local S = 1000000000

-- floor(a / b) for non-negative integers, corrected for the rounding of the division.
local function floordiv(a, b)
  local q = math.floor(a / b)
  if q * b > a then
    q = q - 1
  elseif (q + 1) * b <= a then
    q = q + 1
  end
  return q
end

-- An integer as Redis arguments and stored values want it: decimal digits, no exponent.
local function int(x) return string.format('%.0f', x) end

local time = redis.call('TIME')
-- Read by arithmetic (one conversion; tonumber makes two): TIME answers digits.
local now_s = time[1] + 0
local now_ns = time[2] + 0
local now_us = now_s * 1000000 + now_ns
now_ns = now_ns * 1000

-- The backlog a stored TAT stands for: max(tat - now, 0) in ns. No key, or a value that is not a
-- TAT (not 10 to 29 characters, or no numbers where the seconds and nanoseconds stand), is no
-- state, overwritten by the next admission. No scan for non-digits: a number that is not a TAT (a
-- sign, a fraction) is a foreign value the next write replaces, whatever it read as.
local function backlog_of(stored)
  if not stored then return 0 end
  local len = #stored
  if len < 10 or len > 29 then return 0 end
  local tat_s = tonumber(string.sub(stored, 1, -10))
  local tat_ns = tonumber(string.sub(stored, -9))
  if not (tat_s and tat_ns) then return 0 end
  local backlog = (tat_s - now_s) * S + (tat_ns - now_ns)
  if backlog < 0 then return 0 end
  return backlog
end

-- Stores the TAT `ahead` ns from now, expiring when it passes (then no key means the same).
local function store_tat(key, ahead)
  local r = now_ns + ahead
  local carry = floordiv(r, S)
  local tat = string.format('%d%09d', now_s + carry, r - carry * S)
  -- The expiry as digits made here: Redis would print a number with '%.17g', several times dearer.
  redis.call('SET', key, tat, 'PX', string.format('%d', math.ceil(ahead / 1000000)))
end

-- One GCRA decision (as src/gcra.rs) for `quantity` units on `backlog`. `ceiling` (default: the
-- tolerance) is how far ahead a state is read as it is: plus a metered limit's debt cap. A key in
-- debt (past the tolerance) is refused, remaining 0, until paid back. A backlog beyond the ceiling
-- is another quota's: it counts, and is stored, as the ceiling, so that it drains from now on.
-- Returns {limited (0|1), limit, remaining, retry_after (ns, -1 = never), reset_after (ns)}, and
-- the backlog to store (nil: nothing; a rejection writes only a rebase).
local function gcra_step(backlog, interval, tolerance, limit, quantity, ceiling)
  ceiling = ceiling or tolerance
  local rebased = backlog > ceiling
  if rebased then backlog = ceiling end
  local increment = interval * quantity
  local new_backlog = backlog + increment
  if new_backlog <= tolerance then
    local write = new_backlog > 0 and new_backlog or nil
    return {0, limit, floordiv(tolerance - new_backlog, interval), -1, new_backlog}, write
  end
  local write = rebased and backlog > 0 and backlog or nil
  -- In debt (backlog past the tolerance): nothing is left.
  local remaining = floordiv(math.max(tolerance - backlog, 0), interval)
  if remaining > limit then remaining = limit end
  local retry_after = increment <= tolerance and new_backlog - tolerance or -1
  return {1, limit, remaining, retry_after, backlog}, write
end

-- tower-throttle: the script.
