-- renew.lua: extends the concurrency leases of a request still in flight, after the prelude
-- (prelude.lua: the clock).
--
-- KEYS[1]  the concurrency ZSET (members `token:i`, scored by when each lease ends, in µs)
-- ARGV     token, quantity, lease (µs)
-- Returns  how many leases were extended.
--
-- Only leases that have not ended are extended: an ended lease may already have been counted as free
-- by another request, so bringing it back could admit one request too many. Its request then runs on
-- without a slot, as it would have without renewal.
local lease = tonumber(ARGV[3])
local ends = int(now_us + lease)
local renewed = 0
for i = 0, tonumber(ARGV[2]) - 1 do
  local member = ARGV[1] .. ':' .. i
  local score = redis.call('ZSCORE', KEYS[1], member)
  if score and tonumber(score) > now_us then
    redis.call('ZADD', KEYS[1], 'XX', ends, member)
    renewed = renewed + 1
  end
end
local want = math.ceil(lease / 1000)
if renewed > 0 and redis.call('PTTL', KEYS[1]) < want then
  redis.call('PEXPIRE', KEYS[1], want)
end
return renewed
