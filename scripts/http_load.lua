-- wrk script for scripts/http_load.sh: counts responses by status (and by user when the environment
-- sets HTTP_LOAD_USERS: wrk thread i sends `x-user-id: user-<i>`), completed requests and failures
-- (statuses other than 200 and 429) by second since the start, and prints them with wrk's latency
-- percentiles at the end. wrk runs one Lua state per thread; `done` reads every thread's tables.
local ffi = require("ffi")
ffi.cdef([[
typedef struct { long tv_sec; long tv_nsec; } http_load_timespec;
int clock_gettime(int clock_id, http_load_timespec *tp);
]])
local ts = ffi.new("http_load_timespec")
local function now() -- CLOCK_MONOTONIC, seconds
  ffi.C.clock_gettime(1, ts)
  return tonumber(ts.tv_sec) + tonumber(ts.tv_nsec) * 1e-9
end

local users = tonumber(os.getenv("HTTP_LOAD_USERS") or "0")
local threads = {}
local load_started = now() -- in the main state, which runs setup; each thread gets it as `started`

function setup(thread)
  thread:set("user", #threads)
  thread:set("started", load_started)
  table.insert(threads, thread)
end

function init(args)
  statuses, by_second, failed_by_second = {}, {}, {}
  if users > 0 then
    req = wrk.format(nil, nil, { ["x-user-id"] = "user-" .. user })
  else
    req = wrk.format()
  end
end

function request()
  return req
end

function response(status, headers, body)
  local s = math.floor(now() - started)
  statuses[status] = (statuses[status] or 0) + 1
  by_second[s] = (by_second[s] or 0) + 1
  if status ~= 200 and status ~= 429 then
    failed_by_second[s] = (failed_by_second[s] or 0) + 1
  end
end

local function format_counts(counts)
  local keys, parts = {}, {}
  for k in pairs(counts) do table.insert(keys, k) end
  table.sort(keys)
  for _, k in ipairs(keys) do table.insert(parts, k .. ": " .. counts[k]) end
  return "{" .. table.concat(parts, ", ") .. "}"
end

function done(summary, latency, requests)
  local total, per_second, failed = {}, {}, {}
  local last = math.floor(summary.duration / 1e6 - 1e-9) -- whole seconds of the run, at least
  for _, thread in ipairs(threads) do
    local st = thread:get("statuses")
    for k, v in pairs(st) do total[k] = (total[k] or 0) + v end
    for k, v in pairs(thread:get("by_second")) do
      per_second[k] = (per_second[k] or 0) + v
      last = math.max(last, k)
    end
    for k, v in pairs(thread:get("failed_by_second")) do failed[k] = (failed[k] or 0) + v end
    if users > 0 then
      io.write(string.format("  user-%d: %s\n", thread:get("user"), format_counts(st)))
    end
  end
  local e = summary.errors
  io.write(string.format("statuses: %s, socket errors: connect %d read %d write %d timeout %d\n",
    format_counts(total), e.connect, e.read, e.write, e.timeout))
  io.write(string.format("latency: p50 %.1f ms, p99 %.1f ms, p99.9 %.1f ms, max %.1f ms\n",
    latency:percentile(50) / 1e3, latency:percentile(99) / 1e3, latency:percentile(99.9) / 1e3,
    latency.max / 1e3))
  local a, b = {}, {}
  for s = 0, last do
    table.insert(a, per_second[s] or 0)
    table.insert(b, failed[s] or 0)
  end
  io.write("requests by second: [" .. table.concat(a, ", ") .. "]\n")
  io.write("failures by second: [" .. table.concat(b, ", ") .. "]\n")
end
