-- wrk -s bench/wrk/translation.lua: one-record /translation requests over a pool of sentences.
local pool = {
  "Life is like a box of chocolates.", "How are you today?", "Good morning.",
  "Where is the train station?", "I would like a cup of coffee, please.",
  "The weather is nice today, so we are going to the beach.",
  "The children were playing happily in the garden while their parents prepared dinner.",
  "She has been reading the same book for three weeks because she enjoys every page.",
  "Please make sure that all the windows are closed before you leave the office tonight.",
  "He forgot his umbrella at the restaurant.", "Thank you very much.",
  "The new software update fixes several bugs and improves battery life on older phones.",
}
local records = tonumber(os.getenv("RECORDS") or "1")
local i = 0
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
-- compute every text: the pool is small and the response cache would answer its repeats
wrk.headers["Cache-Control"] = os.getenv("CACHE_CONTROL") or "no-cache"
request = function()
  i = i + 1
  local parts = {}
  for k = 1, records do
    parts[k] = string.format('{"id":"%d","text":"%s"}', k, pool[((i + k) % #pool) + 1])
  end
  return wrk.format(nil, "/translation", nil,
    '{"payload":{"fromLang":"en","toLang":"pt","records":[' .. table.concat(parts, ",") .. ']}}')
end
local non200 = 0
response = function(status, headers, body)
  if status ~= 200 then non200 = non200 + 1 end
end
