"""Where jobs live: one interface, two real stores chosen by `jobs.store`.

- `sqlite` (serve_app/jobs/store/sqlite.py): a file under the project's `.data/` (WAL mode), the
  default of one machine; survives restarts of the JobManager replica and of `make run`.
- `redis` (serve_app/jobs/store/redis_store.py): for clusters, where the JobManager may restart on
  another node; survives a Redis restart with Redis's own persistence (AOF/RDB).

A store holds each job's record (serve_app.jobs.job.JobRecord), its submission (payload, dropped once
the job finished), its result in chunks written as they complete (a restarted JobManager computes
only the missing ones), the idempotency keys (per owner, forgotten with their job) and the result
bytes of all jobs (bounded: `StoreLimits`, in all and per owner, checked atomically with each create). Expired jobs read
as absent at once and are deleted by `purge`.

Several Ray clusters may share one store: during a blue/green upgrade (a RayService's `NewCluster`
strategy) the old cluster keeps serving until the new one is ready, both on the same Redis. Each job
is stamped with the cluster it was submitted to (`JobRecord.cluster`), and each cluster's jobs have
their own `Lease`: only its holder, that cluster's JobManager, runs them, so two JobManagers never
compute the same job and a job never runs on code older than the cluster that took it. Once a
cluster is gone (its lease released or lapsed, and free for a while: serve_app/jobs/adoption.py), a
JobManager of another cluster `adopt`s its unfinished jobs and resumes them after their last stored chunk.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Optional

from ..job import JobRecord, StoreLimits
from ...settings import AppSettings

#: a stored chunk: (records, meta, data)
Chunk = tuple[int, dict, bytes]


class Lease(ABC):
    """The right to run one cluster's jobs, held by one JobManager at a time."""

    @abstractmethod
    async def acquire(self) -> bool:
        """Take it if free; True when this process holds it (now or already)."""

    @abstractmethod
    async def renew(self) -> bool:
        """Keep holding it; False when it was lost (another JobManager runs the jobs now)."""

    @abstractmethod
    async def release(self) -> None: ...


class JobStore(ABC):
    #: the cluster this store's user runs in: the one it stamps on `adopt`ed jobs, whose `lease` it takes
    cluster: str = ""

    @abstractmethod
    async def create(self, record: JobRecord, payload: bytes, limits: StoreLimits) -> JobRecord:
        """Store a new job, or return the live job already holding `record.key` for its owner
        (nothing stored then). Raises the `limits.refusal` when the store, or the owner's share of it, is full."""

    @abstractmethod
    async def find(self, owner: str, key: str) -> Optional[JobRecord]:
        """The live job of `owner` created with submission key `key`."""

    @abstractmethod
    async def get(self, job_id: str) -> Optional[JobRecord]:
        """The job, or None when it never existed or expired."""

    @abstractmethod
    async def payload(self, job_id: str) -> Optional[bytes]: ...

    @abstractmethod
    async def start(self, job_id: str, now: float) -> None:
        """Mark it running (its first start time is kept across resumes)."""

    @abstractmethod
    async def put_chunk(self, job_id: str, index: int, records: int, meta: dict, data: bytes,
                        limits: StoreLimits) -> bool:
        """Store one chunk of the result (a chunk stored already is left as it is), atomically with the
        check that the job is still queued or running; False (nothing stored or counted) once it is not.
        A new chunk that would take the job past `limits.max_job_result_bytes`, or the store's results past
        `limits.max_total_result_bytes`, is not stored: `limits.outgrown(...)` is raised."""

    @abstractmethod
    async def chunk_metas(self, job_id: str) -> dict[int, tuple[int, dict]]:
        """index -> (records, meta) of every stored chunk (no data)."""

    @abstractmethod
    async def chunks(self, job_id: str, indexes: list[int]) -> dict[int, Chunk]: ...

    @abstractmethod
    async def finish(self, job_id: str, status: str, now: float, expires_at: float,
                     error: Optional[dict] = None) -> bool:
        """Finish an unfinished job (drops its payload; a succeeded job keeps its chunks until it
        expires, others drop them); False when it had finished already."""

    @abstractmethod
    async def unfinished(self) -> list[JobRecord]:
        """Queued and running jobs of every cluster, oldest first."""

    @abstractmethod
    async def lease_free(self, cluster: str) -> bool:
        """No JobManager holds `cluster`'s lease now."""

    @abstractmethod
    async def adopt(self, cluster: str) -> int:
        """Stamp `self.cluster` on the unfinished jobs of `cluster`, atomically with the check that no
        JobManager holds `cluster`'s lease (nothing is stamped while one does); how many."""

    @abstractmethod
    async def purge(self, now: float) -> int:
        """Delete jobs expired by `now` with their chunks and keys; how many."""

    @abstractmethod
    async def counts(self) -> dict[str, int]:
        """Jobs per state, and `result_bytes`: the bytes counted against the total."""

    @abstractmethod
    def lease(self) -> Lease:
        """The lease of `self.cluster`'s jobs."""

    @abstractmethod
    async def close(self) -> None: ...


def open_store(settings: AppSettings, cluster: str = "") -> JobStore:
    """The store `jobs.store` names, used from the Ray cluster named `cluster`."""
    jobs = settings.jobs
    if jobs.store == "redis":
        from .redis_store import RedisJobStore

        return RedisJobStore.from_settings(jobs, cluster)
    from .sqlite import SqliteJobStore

    return SqliteJobStore(SqliteJobStore.resolve(jobs.store_path), cluster=cluster)
