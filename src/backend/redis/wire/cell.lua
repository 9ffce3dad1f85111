-- CL.THROTTLE (redis-cell) on a Redis Cluster.
--
-- The module's command declares no key, so a Cluster node runs it wherever it lands: during a slot
-- migration the source node would create a fresh key beside the one already moved (a second full
-- burst), and after it a node that no longer owns the slot would keep answering from a stale key.
-- Called from a script that declares its key, it is redirected (ASK, MOVED, TRYAGAIN) like any
-- command, and runs only where the key lives.
--
-- KEYS[1]  the GCRA key
-- ARGV     max_burst, count, period (s), quantity: CL.THROTTLE's arguments
--
-- Returns CL.THROTTLE's reply. Without the module: the error "unknown command", as CL.THROTTLE sent
-- alone would answer, so that Auto mode falls back to the Lua script.

local reply = redis.pcall('CL.THROTTLE', KEYS[1], ARGV[1], ARGV[2], ARGV[3], ARGV[4])
if type(reply) == 'table' and reply.err then
  if string.find(string.lower(reply.err), 'unknown redis command', 1, true) then
    return redis.error_reply('ERR unknown command \'CL.THROTTLE\', called from a script')
  end
  return redis.error_reply(reply.err)
end
return reply
