-- renew.lua: extends the concurrency leases of a request in flight, after the prelude.
--
-- KEYS[1]  the concurrency ZSET (members `token:i`, scored by each lease's end, µs)
-- ARGV     token, quantity, lease (µs)
-- Returns  how many leases were extended: only those not ended (another request may have counted
--          an ended one as free, and bringing it back could admit one too many).
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
if renewed > 0 and redis.call('PTTL', KEYS[1]) < want then redis.call('PEXPIRE', KEYS[1], want) end
return renewed
