-- wrk script for scripts/http_load.sh: counts responses by status (and by user when the environment
-- sets HTTP_LOAD_USERS: wrk thread i sends `x-user-id: user-<i % users>`), completed requests and
-- failures (statuses other than 200 and 429) by second since the start, and prints them with wrk's
-- latency percentiles at the end. With HTTP_LOAD_CSV (and one connection per thread, so that a
-- response answers the thread's last request), also one line per response in that file: unix time
-- sent, user, latency ms, status (for scripts/cluster_p99.py). wrk runs one Lua state per thread;
-- `done` reads every thread's tables.
local ffi = require("ffi")
ffi.cdef([[
typedef struct { long tv_sec; long tv_nsec; } http_load_timespec;
int clock_gettime(int clock_id, http_load_timespec *tp);
]])
local ts = ffi.new("http_load_timespec")
local function clock(id) -- seconds
  ffi.C.clock_gettime(id, ts)
  return tonumber(ts.tv_sec) + tonumber(ts.tv_nsec) * 1e-9
end
local function now() return clock(1) end -- CLOCK_MONOTONIC

local users = tonumber(os.getenv("HTTP_LOAD_USERS") or "0")
local csv = os.getenv("HTTP_LOAD_CSV") or ""
local threads = {}
local load_started = now() -- in the main state, which runs setup; each thread gets it as `started`

function setup(thread)
  thread:set("user", #threads)
  thread:set("started", load_started)
  table.insert(threads, thread)
end

function init(args)
  statuses, by_second, failed_by_second, rows = {}, {}, {}, {}
  if users > 0 then
    user_id = "user-" .. (user % users)
    req = wrk.format(nil, nil, { ["x-user-id"] = user_id })
  else
    req = wrk.format()
  end
end

function request()
  if csv ~= "" then
    sent_wall, sent = clock(0), now() -- CLOCK_REALTIME for the file, monotonic for the latency
  end
  return req
end

function response(status, headers, body)
  local t = now()
  local s = math.floor(t - started)
  if csv ~= "" then
    rows[#rows + 1] = string.format("%.6f,%s,%.3f,%d\n", sent_wall, user_id or "", (t - sent) * 1e3, status)
  end
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
  local total, per_second, failed, user_totals = {}, {}, {}, {}
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
      local u = thread:get("user_id")
      user_totals[u] = user_totals[u] or {}
      for k, v in pairs(st) do user_totals[u][k] = (user_totals[u][k] or 0) + v end
    end
  end
  local names = {}
  for u in pairs(user_totals) do table.insert(names, u) end
  table.sort(names, function(a, b) return tonumber(a:sub(6)) < tonumber(b:sub(6)) end)
  for _, u in ipairs(names) do io.write(string.format("  %s: %s\n", u, format_counts(user_totals[u]))) end
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
  if csv ~= "" then
    local f = assert(io.open(csv, "w"))
    for _, thread in ipairs(threads) do
      for _, row in ipairs(thread:get("rows")) do f:write(row) end
    end
    f:close()
  end
end
