-- Closed-loop requests for bench.compare (wrk -s). Environment: bodies.lua's, and BENCH_LUA_DIR.
package.path = os.getenv("BENCH_LUA_DIR") .. "/?.lua;" .. package.path
local bodies = require("bodies")
local i = 0
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"

request = function()
  i = i + bodies.records
  return wrk.format(nil, bodies.path, nil, bodies.body(i))
end

done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'BENCH_JSON {"requests":%d,"duration_us":%d,"connect":%d,"read":%d,"write":%d,"status":%d,"timeout":%d,' ..
    '"p50_us":%d,"p95_us":%d,"p99_us":%d,"max_us":%d,"mean_us":%.1f}\n',
    summary.requests, summary.duration, e.connect, e.read, e.write, e.status, e.timeout,
    latency:percentile(50), latency:percentile(95), latency:percentile(99), latency.max, latency.mean))
end
