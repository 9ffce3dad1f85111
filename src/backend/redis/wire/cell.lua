-- CL.THROTTLE (redis-cell) on a Redis Cluster.
--
-- The command declares no key, so a node runs it wherever it lands: during a migration the source
-- would make a fresh key beside the moved one (a second burst), and after it a node that lost the
-- slot would answer from a stale key. From a script that declares the key it is redirected like any
-- command, and runs only where the key lives.
--
-- KEYS[1]  the GCRA key; ARGV: CL.THROTTLE's max_burst, count, period (s), quantity.
-- Returns CL.THROTTLE's reply; without the module, "unknown command", as alone (Auto falls back).

local reply = redis.pcall('CL.THROTTLE', KEYS[1], ARGV[1], ARGV[2], ARGV[3], ARGV[4])
if type(reply) == 'table' and reply.err then
  if string.find(string.lower(reply.err), 'unknown redis command', 1, true) then
    return redis.error_reply('ERR unknown command \'CL.THROTTLE\', called from a script')
  end
  return redis.error_reply(reply.err)
end
return reply
