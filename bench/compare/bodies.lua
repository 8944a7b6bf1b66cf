-- Request bodies for bench.compare's wrk scripts (closed.lua, storm.lua), from the environment:
--   BENCH_TEXTS   file of JSON-quoted texts, one per line (the pool every contender gets)
--   BENCH_PATH    route, e.g. /embeddings;  BENCH_RECORDS  texts per request
--   BENCH_BODY    "embeddings" | "translation" (serve-app's contract) | "texts" (BentoML's {"texts": [...]})
-- A script loads it with: package.path = os.getenv("BENCH_LUA_DIR") .. "/?.lua;" .. package.path
local M = {}
local texts = {}
for line in io.lines(os.getenv("BENCH_TEXTS")) do texts[#texts + 1] = line end
local kind = os.getenv("BENCH_BODY")
M.path = os.getenv("BENCH_PATH")
M.records = tonumber(os.getenv("BENCH_RECORDS") or "1")

-- The body of the request whose first text is the pool's (i + 1)-th.
function M.body(i)
  local records = M.records
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

return M
