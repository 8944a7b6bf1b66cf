-- Closed-loop requests for bench.compare (wrk -s). Environment:
--   BENCH_TEXTS   file of JSON-quoted texts, one per line (the pool every contender gets)
--   BENCH_PATH    route, e.g. /embeddings;  BENCH_RECORDS  texts per request
--   BENCH_BODY    "embeddings" | "translation" (serve-app's contract) | "texts" (BentoML's {"texts": [...]})
local texts = {}
for line in io.lines(os.getenv("BENCH_TEXTS")) do texts[#texts + 1] = line end
local path = os.getenv("BENCH_PATH")
local records = tonumber(os.getenv("BENCH_RECORDS") or "1")
local kind = os.getenv("BENCH_BODY")
local i = 0
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"

local function body()
  local picked = {}
  for k = 1, records do picked[k] = texts[((i + k) % #texts) + 1] end
  if kind == "texts" then
    return '{"texts":[' .. table.concat(picked, ",") .. ']}'
  elseif kind == "embeddings" then
    if records == 1 then return '{"input":' .. picked[1] .. '}' end
    return '{"input":[' .. table.concat(picked, ",") .. ']}'
  end
  local parts = {}
  for k = 1, records do parts[k] = '{"id":"' .. k .. '","text":' .. picked[k] .. '}' end
  return '{"payload":{"fromLang":"en","toLang":"pt","records":[' .. table.concat(parts, ",") .. ']}}'
end

request = function()
  i = i + records
  return wrk.format(nil, path, nil, body())
end

done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'BENCH_JSON {"requests":%d,"duration_us":%d,"connect":%d,"read":%d,"write":%d,"status":%d,"timeout":%d,' ..
    '"p50_us":%d,"p95_us":%d,"p99_us":%d,"max_us":%d}\n',
    summary.requests, summary.duration, e.connect, e.read, e.write, e.status, e.timeout,
    latency:percentile(50), latency:percentile(95), latency:percentile(99), latency.max))
end
