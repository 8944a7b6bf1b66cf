-- wrk -s bench/wrk/embeddings.lua: one-text /embeddings requests over a pool of sentences.
local pool = {
  "Life is like a box of chocolates.", "How are you today?", "Good morning.",
  "Where is the train station?", "I would like a cup of coffee, please.",
  "The weather is nice today, so we are going to the beach.",
  "The children were playing happily in the garden while their parents prepared dinner.",
  "She has been reading the same book for three weeks because she enjoys every page.",
}
local i = 0
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
-- compute every text: the pool is small and the response cache would answer its repeats
wrk.headers["Cache-Control"] = os.getenv("CACHE_CONTROL") or "no-cache"
request = function()
  i = i + 1
  return wrk.format(nil, "/embeddings", nil, '{"input":"' .. pool[(i % #pool) + 1] .. '"}')
end
