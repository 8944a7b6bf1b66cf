"""The job store in Redis (the maintained `redis` client, redis.asyncio), for clusters: the JobManager
may restart on another node and find every job. What survives a restart of Redis itself is what
Redis persists (AOF `appendfsync everysec` loses at most a second of writes; the tests run it with
`always`). Every change that must be atomic (create with its limits and key, a chunk with its byte
count, finish, purge, adopt) is one Lua script (serve_app/jobs/store/redis_scripts.py). Keys (prefix
`jobs.redis_prefix`): `job:<id>` hash, `payload:<id>`, `chunks:<id>` hash (`d<i>` data, `m<i>`
[records, meta]), `unfinished` and `expiry` sorted sets, `keys` hash (owner + key -> id), `stats` hash
(`jobs`, `bytes`), and each cluster's lease: `lease` for the unnamed cluster, `lease:<cluster>`.
"""

from __future__ import annotations

import json
import secrets
import time
from pathlib import Path
from typing import Callable, Optional

from ..job import STATES, UNBOUNDED, JobRecord, StoreLimits
from . import Chunk, JobStore, Lease
from .redis_scripts import ADOPT, CREATE, FINISH, PURGE, PUT_CHUNK, RELEASE, RENEW, START

_INTS = ("records_total", "records_done", "chunk_records", "reserved_bytes", "used_bytes")
_FLOATS = ("created_at", "started_at", "finished_at", "expires_at")

def _encode(record: JobRecord) -> list[str]:
    flat: list[str] = []
    for name, value in record.to_dict().items():
        if name == "error":
            value = json.dumps(value) if value else ""
        flat += [name, "" if value is None else repr(value) if isinstance(value, float) else str(value)]
    return flat


def _decode(raw: dict) -> Optional[JobRecord]:
    if not raw:
        return None
    data = {k.decode(): v.decode() for k, v in raw.items()}
    out: dict = dict(data)
    for name in _INTS:
        out[name] = int(data[name])
    for name in _FLOATS:
        out[name] = float(data[name]) if data.get(name) else None
    out["error"] = json.loads(data["error"]) if data.get("error") else None
    out["key"] = data.get("key") or None
    return JobRecord.from_dict(out)


class RedisLease(Lease):
    """`SET lease <token> NX PX ttl`, renewed by its holder every couple of seconds; a killed holder's
    lease lapses after `ttl_ms`, then the next JobManager takes it."""

    def __init__(self, store: "RedisJobStore", ttl_ms: int = 10_000):
        self._store = store
        self.key = store.lease_key(store.cluster)
        self.ttl_ms = ttl_ms
        self.token = secrets.token_hex(16)
        self.held = False

    async def acquire(self) -> bool:
        if self.held:
            return await self.renew()
        self.held = bool(await self._store.redis.set(self.key, self.token, nx=True, px=self.ttl_ms))
        return self.held

    async def renew(self) -> bool:
        self.held = bool(await self._store.redis.eval(RENEW, 1, self.key, self.token, self.ttl_ms))
        return self.held

    async def release(self) -> None:
        if self.held:
            self.held = False
            await self._store.redis.eval(RELEASE, 1, self.key, self.token)


class RedisJobStore(JobStore):
    def __init__(self, url: str, *, password: Optional[str] = None, prefix: str = "serve-app:jobs:",
                 clock: Callable[[], float] = time.time, cluster: str = ""):
        import redis.asyncio as aioredis

        self.prefix, self.cluster = prefix, cluster
        self._clock = clock
        self.redis = aioredis.Redis.from_url(url, password=password, socket_timeout=10, socket_connect_timeout=5,
                                             health_check_interval=15)
        self._lease = RedisLease(self)

    @classmethod
    def from_settings(cls, jobs, cluster: str = "") -> "RedisJobStore":
        password = jobs.redis_password.get_secret_value() if jobs.redis_password is not None else None
        if jobs.redis_password_file:
            password = Path(jobs.redis_password_file).read_text().strip()
        return cls(jobs.redis_url, password=password or None, prefix=jobs.redis_prefix, cluster=cluster)

    def key(self, *parts: str) -> str:
        return self.prefix + ":".join(parts)

    def lease_key(self, cluster: str) -> str:
        return self.key("lease", cluster) if cluster else self.key("lease")

    def _live(self, record: Optional[JobRecord]) -> Optional[JobRecord]:
        if record is None or (record.expires_at is not None and record.expires_at <= self._clock()):
            return None
        return record

    async def create(self, record: JobRecord, payload: bytes, limits: StoreLimits) -> JobRecord:
        await self.purge(self._clock())  # expired jobs make room, and free their keys
        keyfield = f"{record.owner}\n{record.key}" if record.key else ""
        outcome, value = await self.redis.eval(
            CREATE, 6, self.key("job", record.id), self.key("payload", record.id), self.key("unfinished"),
            self.key("keys"), self.key("stats"), self.key("expiry"),
            record.id, keyfield, self._clock(), limits.max_unfinished_jobs, limits.max_jobs,
            limits.max_total_result_bytes, record.reserved_bytes, payload, json.dumps(_encode(record)), self.prefix,
            repr(record.created_at), record.owner, limits.max_unfinished_per_owner, limits.max_jobs_per_owner,
            limits.max_bytes_per_owner)
        outcome, value = outcome.decode(), value.decode()
        if outcome == "refused":
            raise limits.refusal(value)
        if outcome == "exists":
            existing = await self.get(value)
            if existing is not None:
                return existing
            return await self.create(record, payload, limits)  # expired meanwhile
        return record

    async def find(self, owner: str, key: str) -> Optional[JobRecord]:
        job_id = await self.redis.hget(self.key("keys"), f"{owner}\n{key}")
        return await self.get(job_id.decode()) if job_id else None

    async def get(self, job_id: str) -> Optional[JobRecord]:
        return self._live(_decode(await self.redis.hgetall(self.key("job", job_id))))

    async def payload(self, job_id: str) -> Optional[bytes]:
        return await self.redis.get(self.key("payload", job_id))

    async def start(self, job_id: str, now: float) -> None:
        await self.redis.eval(START, 1, self.key("job", job_id), repr(now))

    async def put_chunk(self, job_id: str, index: int, records: int, meta: dict, data: bytes,
                        limits: StoreLimits) -> bool:
        owner_bound = "" if limits.max_bytes_per_owner >= UNBOUNDED else limits.max_bytes_per_owner
        stored = int(await self.redis.eval(
            PUT_CHUNK, 5, self.key("chunks", job_id), self.key("job", job_id), self.key("stats"),
            self.key("unfinished"), self.key("expiry"), index, data, json.dumps([records, meta]), records,
            limits.max_job_result_bytes, limits.max_total_result_bytes, owner_bound, self.prefix))
        if stored > 1:
            raise limits.outgrown({2: "job", 3: "bytes", 4: "owner_bytes"}[stored])
        return bool(stored)

    async def chunk_metas(self, job_id: str) -> dict[int, tuple[int, dict]]:
        fields = [f for f in await self.redis.hkeys(self.key("chunks", job_id)) if f.startswith(b"m")]
        if not fields:
            return {}
        values = await self.redis.hmget(self.key("chunks", job_id), fields)
        return {int(f[1:]): tuple(json.loads(v)) for f, v in zip(fields, values) if v is not None}

    async def chunks(self, job_id: str, indexes: list[int]) -> dict[int, Chunk]:
        if not indexes:
            return {}
        names = [n for i in indexes for n in (f"m{i}", f"d{i}")]
        values = await self.redis.hmget(self.key("chunks", job_id), names)
        out: dict[int, Chunk] = {}
        for i, meta, data in zip(indexes, values[::2], values[1::2]):
            if meta is not None and data is not None:
                records, info = json.loads(meta)
                out[i] = (records, info, bytes(data))
        return out

    async def finish(self, job_id: str, status: str, now: float, expires_at: float,
                     error: Optional[dict] = None) -> bool:
        return bool(await self.redis.eval(
            FINISH, 6, self.key("job", job_id), self.key("payload", job_id), self.key("unfinished"),
            self.key("expiry"), self.key("chunks", job_id), self.key("stats"),
            status, repr(now), repr(expires_at), json.dumps(error) if error else "", job_id))

    async def _records(self, ids: list[bytes]) -> list[JobRecord]:
        async with self.redis.pipeline(transaction=False) as pipe:
            for job_id in ids:
                pipe.hgetall(self.key("job", job_id.decode()))
            raws = await pipe.execute()
        return [r for r in map(_decode, raws) if r is not None]

    async def unfinished(self) -> list[JobRecord]:
        return await self._records(await self.redis.zrange(self.key("unfinished"), 0, -1))

    async def lease_free(self, cluster: str) -> bool:
        return not await self.redis.exists(self.lease_key(cluster))

    async def adopt(self, cluster: str) -> int:
        return int(await self.redis.eval(ADOPT, 2, self.lease_key(cluster), self.key("unfinished"),
                                          cluster, self.cluster, self.prefix))

    async def purge(self, now: float) -> int:
        gone = 0
        while True:
            n = await self.redis.eval(PURGE, 3, self.key("expiry"), self.key("keys"), self.key("stats"),
                                      repr(now), self.prefix)
            gone += n
            if n < 500:
                return gone

    async def counts(self) -> dict[str, int]:
        ids = [*await self.redis.zrange(self.key("unfinished"), 0, -1),
               *await self.redis.zrangebyscore(self.key("expiry"), self._clock(), "+inf")]
        counts = {state: 0 for state in STATES}
        for record in await self._records(ids):
            counts[record.status] += 1
        counts["result_bytes"] = int(await self.redis.hget(self.key("stats"), "bytes") or 0)
        return counts

    def lease(self) -> Lease:
        return self._lease

    async def close(self) -> None:
        try:
            await self._lease.release()
        finally:
            await self.redis.aclose()
