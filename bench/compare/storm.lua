-- A client storm for bench.compare (wrk -s): closed-loop clients that ignore Retry-After, each
-- sending its next request the moment the last is answered, whatever its status. Besides wrk's own
-- summary it times every answer by status: each request carries an X-Request-Id, and the answer's
-- echo of it (Serve's proxy echoes the client's) finds when it was sent. Answers without the echo
-- are counted by status but not timed. Environment: bodies.lua's and BENCH_LUA_DIR; run with -t1
-- (one Lua state: the tables below are the whole run's).
local ffi = require("ffi")
ffi.cdef [[
  typedef struct { long tv_sec; long tv_nsec; } bench_timespec;
  int clock_gettime(int clock, bench_timespec *ts);
]]
local ts = ffi.new("bench_timespec")
local function now_us()
  ffi.C.clock_gettime(1, ts) -- CLOCK_MONOTONIC
  return tonumber(ts.tv_sec) * 1000000 + tonumber(ts.tv_nsec) / 1000
end

package.path = os.getenv("BENCH_LUA_DIR") .. "/?.lua;" .. package.path
local bodies = require("bodies")
local i = 0
local sent = {} -- request id -> send time (us)
-- Globals: done() reads them back with thread:get, which copies flat tables only (wrk 4.1 mangles
-- nested ones): the latencies of each status are a global list of their own, lat_<status>.
by_status = {} -- status -> count
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"

request = function()
  i = i + bodies.records
  local id = "storm-" .. i
  sent[id] = now_us()
  -- wrk.format's headers replace wrk.headers: the Content-Type goes again
  return wrk.format(nil, bodies.path, { ["Content-Type"] = "application/json", ["X-Request-Id"] = id },
                    bodies.body(i))
end

response = function(status, headers, _)
  by_status[status] = (by_status[status] or 0) + 1
  local id = headers["X-Request-ID"] or headers["x-request-id"] or headers["X-Request-Id"]
  local t0 = id and sent[id]
  if t0 then
    sent[id] = nil
    local name = "lat_" .. status
    local list = _G[name]
    if not list then list = {}; _G[name] = list end
    list[#list + 1] = now_us() - t0
  end
end

done = function(summary, _, _)
  -- done() runs in wrk's main Lua state; the thread's tables are read back through the thread.
  local parts = {}
  local t = threads[1]
  local counts = t:get("by_status")
  for status = 100, 599 do -- not pairs(): wrk's copy of a thread's table confuses next()
    local n = counts[status] or 0
    if n > 0 then -- the latencies go out whole: bench.compare.stats takes the percentiles, as elsewhere
      local list = t:get("lat_" .. status) or {}
      for k = 1, #list do list[k] = string.format("%d", list[k]) end
      parts[#parts + 1] = string.format('"%d":{"count":%d,"lat_us":[%s]}', status, n, table.concat(list, ","))
    end
  end
  local e = summary.errors
  io.write(string.format(
    'BENCH_JSON {"duration_us":%d,"connect":%d,"read":%d,"write":%d,"timeout":%d,"statuses":{%s}}\n',
    summary.duration, e.connect, e.read, e.write, e.timeout, table.concat(parts, ",")))
end

threads = {}
setup = function(thread) threads[#threads + 1] = thread end
