"""The job store's Lua scripts (serve_app/jobs/store/redis_store.py): every change that must be atomic is
one script, so two JobManagers or a crash between calls never leave the counts wrong."""

#: What one owner holds, read off its jobs rather than kept in counters that could drift: (its unfinished jobs, its
#: unfinished and kept jobs, their reserved bytes). CREATE and PUT_CHUNK both start with it, so their two atomic
#: checks of an owner's share cannot drift apart.
_OWNER_HOLDS = """
local function owner_holds(unfinished_key, expiry_key, prefix, owner)
  local unfinished, jobs, held = 0, 0, 0
  for n, ids in ipairs({redis.call('ZRANGE', unfinished_key, 0, -1), redis.call('ZRANGE', expiry_key, 0, -1)}) do
    for _, id in ipairs(ids) do
      local f = redis.call('HMGET', prefix .. 'job:' .. id, 'owner', 'reserved_bytes')
      if f[1] == owner then
        if n == 1 then unfinished = unfinished + 1 end
        jobs = jobs + 1
        held = held + tonumber(f[2] or '0')
      end
    end
  end
  return unfinished, jobs, held
end
"""

#: KEYS: job, payload, unfinished, keys, stats, expiry. ARGV: id, key field, now, the store's three bounds, reserved
#: bytes, payload, the record, the prefix, created_at, owner, the owner's three bounds.
CREATE = _OWNER_HOLDS + """
if ARGV[2] ~= '' then
  local existing = redis.call('HGET', KEYS[4], ARGV[2])
  if existing then
    local expires = redis.call('HGET', ARGV[10] .. 'job:' .. existing, 'expires_at')
    if expires and (expires == '' or tonumber(expires) > tonumber(ARGV[3])) then return {'exists', existing} end
  end
end
if redis.call('ZCARD', KEYS[3]) >= tonumber(ARGV[4]) then return {'refused', 'unfinished'} end
if tonumber(redis.call('HGET', KEYS[5], 'jobs') or '0') >= tonumber(ARGV[5]) then return {'refused', 'jobs'} end
local bytes = tonumber(redis.call('HGET', KEYS[5], 'bytes') or '0')
if bytes + tonumber(ARGV[7]) > tonumber(ARGV[6]) then return {'refused', 'bytes'} end
local unfinished, jobs, held = owner_holds(KEYS[3], KEYS[6], ARGV[10], ARGV[12])
held = held + tonumber(ARGV[7])
if unfinished >= tonumber(ARGV[13]) then return {'refused', 'owner_unfinished'} end
if jobs >= tonumber(ARGV[14]) then return {'refused', 'owner_jobs'} end
if held > tonumber(ARGV[15]) then return {'refused', 'owner_bytes'} end
redis.call('HSET', KEYS[1], unpack(cjson.decode(ARGV[9])))
redis.call('SET', KEYS[2], ARGV[8])
redis.call('ZADD', KEYS[3], ARGV[11], ARGV[1])
if ARGV[2] ~= '' then redis.call('HSET', KEYS[4], ARGV[2], ARGV[1]) end
redis.call('HINCRBY', KEYS[5], 'jobs', 1)
redis.call('HINCRBY', KEYS[5], 'bytes', ARGV[7])
return {'created', ARGV[1]}
"""

START = """
local s = redis.call('HGET', KEYS[1], 'status')
if s ~= 'queued' and s ~= 'running' then return 0 end
redis.call('HSET', KEYS[1], 'status', 'running')
if redis.call('HGET', KEYS[1], 'started_at') == '' then redis.call('HSET', KEYS[1], 'started_at', ARGV[1]) end
return 1
"""

#: KEYS: chunks, job, stats, unfinished, expiry. ARGV: index, data, meta, records, the job's bound, the store's, the
#: owner's ('' for none), the prefix. The owner's bytes are read only when the job outgrows its reservation.
PUT_CHUNK = _OWNER_HOLDS + """
local s = redis.call('HGET', KEYS[2], 'status')
if s ~= 'queued' and s ~= 'running' then return 0 end
if redis.call('HEXISTS', KEYS[1], 'd' .. ARGV[1]) == 1 then return 1 end
local used = tonumber(redis.call('HGET', KEYS[2], 'used_bytes')) + string.len(ARGV[2])
local reserved = tonumber(redis.call('HGET', KEYS[2], 'reserved_bytes'))
if used > tonumber(ARGV[5]) then return 2 end
if used > reserved and tonumber(redis.call('HGET', KEYS[3], 'bytes') or '0') + used - reserved > tonumber(ARGV[6]) then
  return 3
end
if used > reserved and ARGV[7] ~= '' then
  local _, _, held = owner_holds(KEYS[4], KEYS[5], ARGV[8], redis.call('HGET', KEYS[2], 'owner'))
  if held + used - reserved > tonumber(ARGV[7]) then return 4 end
end
redis.call('HSET', KEYS[1], 'd' .. ARGV[1], ARGV[2], 'm' .. ARGV[1], ARGV[3])
redis.call('HINCRBY', KEYS[2], 'records_done', ARGV[4])
redis.call('HSET', KEYS[2], 'used_bytes', used)
if used > reserved then
  redis.call('HSET', KEYS[2], 'reserved_bytes', used)
  redis.call('HINCRBY', KEYS[3], 'bytes', used - reserved)
end
return 1
"""

FINISH = """
local s = redis.call('HGET', KEYS[1], 'status')
if s ~= 'queued' and s ~= 'running' then return 0 end
redis.call('HSET', KEYS[1], 'status', ARGV[1], 'finished_at', ARGV[2], 'expires_at', ARGV[3], 'error', ARGV[4])
redis.call('DEL', KEYS[2])
redis.call('ZREM', KEYS[3], ARGV[5])
redis.call('ZADD', KEYS[4], ARGV[3], ARGV[5])
if ARGV[1] ~= 'succeeded' then
  redis.call('DEL', KEYS[5])
  redis.call('HINCRBY', KEYS[6], 'bytes', 0 - tonumber(redis.call('HGET', KEYS[1], 'reserved_bytes')))
  redis.call('HSET', KEYS[1], 'reserved_bytes', 0, 'used_bytes', 0)
else
  local reserved = tonumber(redis.call('HGET', KEYS[1], 'reserved_bytes') or '0')
  local used = tonumber(redis.call('HGET', KEYS[1], 'used_bytes') or '0')
  if reserved > used then
    redis.call('HINCRBY', KEYS[6], 'bytes', used - reserved)
    redis.call('HSET', KEYS[1], 'reserved_bytes', used)
  end
end
return 1
"""

PURGE = """
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, 500)
for _, id in ipairs(ids) do
  local job = ARGV[2] .. 'job:' .. id
  local f = redis.call('HMGET', job, 'reserved_bytes', 'owner', 'key')
  if f[1] then
    redis.call('HINCRBY', KEYS[3], 'bytes', 0 - tonumber(f[1]))
    redis.call('HINCRBY', KEYS[3], 'jobs', -1)
  end
  if f[3] and f[3] ~= '' then
    local field = f[2] .. '\\n' .. f[3]
    if redis.call('HGET', KEYS[2], field) == id then redis.call('HDEL', KEYS[2], field) end
  end
  redis.call('DEL', job, ARGV[2] .. 'chunks:' .. id, ARGV[2] .. 'payload:' .. id)
  redis.call('ZREM', KEYS[1], id)
end
return #ids
"""

RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0
"""

RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""

#: KEYS: the other cluster's lease, `unfinished`; ARGV: the other cluster, this one, the prefix
ADOPT = """
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
local n = 0
for _, id in ipairs(redis.call('ZRANGE', KEYS[2], 0, -1)) do
  local job = ARGV[3] .. 'job:' .. id
  if redis.call('EXISTS', job) == 1 and (redis.call('HGET', job, 'cluster') or '') == ARGV[1] then
    redis.call('HSET', job, 'cluster', ARGV[2])
    n = n + 1
  end
end
return n
"""
