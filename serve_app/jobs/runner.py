"""The jobs' engine without Ray: validates submissions, keeps them in the job store, computes them in chunks (each
stored as it completes) and reads them back, whole or a page at a time (jobs/reads.py). The JobManager deployment
(jobs/manager.py) wraps one `JobRunner`; unit tests drive it with fake model clients and a real SQLite store.

Only the holder of its cluster's lease computes that cluster's jobs: on start (and whenever it takes the lease over) it
resumes every queued or running job after its last stored chunk, so a restart recomputes at most the chunks in flight.
It adopts a gone cluster's jobs in a shared store (after a blue/green upgrade) the same way; each maintenance tick runs
any unfinished job it has no task for (its submit cancelled after its create, or its store failed)."""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import time
from typing import Any, Callable, Optional

from pydantic import BaseModel

from ..calls import check_dimensions
from ..errors import RequestTimeout, ServeAppError
from ..model_clients import BackgroundClient, ModelClient
from ..service import Service
from ..settings import AppSettings
from .job import (
    ANONYMOUS, IdempotencyKeyReused, JobFinished, JobNotFound, JobRecord, JobTooLarge, StoreLimits, UnsupportedTask,
    body_hash, job_settings, store_call, submission_key)
from .reads import PAGE_READS_AT_ONCE, job_view
from .results import DEFAULT_EMBEDDING_DIM, encode_chunk_of, estimate_bytes, parse_submission, piece, records_of
from . import retry
from .adoption import Adoption
from .fair import FairSlots
from .store import JobStore, open_store

logger = logging.getLogger("ray.serve")

#: how often the runner renews (or takes) its lease, runs unfinished jobs without a task, purges
MAINTENANCE_INTERVAL_S = 2.0
#: how long a submission waits for the embedder's dimensions (its result's size estimate)
EMBEDDER_INFO_TIMEOUT_S = 2.0


class JobRunner:
    def __init__(self, settings: AppSettings, clients: dict[str, ModelClient], store: Optional[JobStore] = None,
                 clock: Callable[[], float] = time.time, cluster: str = ""):  # the store opened here is `cluster`'s
        self.settings = settings
        self.store = store if store is not None else open_store(settings, cluster)
        self.limits = StoreLimits.of(settings)
        self._clock = clock
        self._tasks: dict[str, asyncio.Task] = {}
        self._running = FairSlots(settings.jobs.max_running_jobs, settings.jobs.max_share_per_key)
        self._page_reads = FairSlots(PAGE_READS_AT_ONCE, settings.jobs.max_share_per_key)
        self._adoption = Adoption(self.store, time.monotonic)
        self._job_settings = job_settings(settings)
        models = {name: c for name, c in clients.items() if name not in ("translation", "embeddings")}
        #: validates submissions (and answers model info) with the job limits
        self._validator = Service(self._job_settings, translator=clients["translation"],
                                  embedder=clients["embeddings"], models=models)
        bg = {name: BackgroundClient(c) for name, c in clients.items()}
        #: computes job chunks: every model call in the background
        self._service = Service(self._job_settings, translator=bg["translation"], embedder=bg["embeddings"],
                                models={n: c for n, c in bg.items() if n in models})
        self.holding, self._maintenance = False, None  # (the latter: the maintenance task, once started)
        self.chunks_computed = self.chunks_resumed = 0  #: this process's chunks: computed; found stored at a (re)start

    # -- life cycle --------------------------------------------------------------------------
    async def start(self) -> None:
        """Take the lease if free (then resume the unfinished jobs) and keep it renewed."""
        try:
            await self._take_over()
        except Exception as exc:  # the store is down: the maintenance loop keeps trying
            logger.warning("job store not reachable at start (%s); retrying", type(exc).__name__)
        self._maintenance = asyncio.create_task(self._maintain(), name="job-store-maintenance")

    async def stop(self) -> None:
        """Stop computing (jobs stay queued or running in the store: the next runner resumes them)."""
        tasks = [*self._tasks.values(), *([self._maintenance] if self._maintenance else [])]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self.holding = False
        await self.store.close()

    async def _take_over(self) -> None:
        """Take the lease if free; while holding it, adopt the jobs of clusters gone and run this cluster's unfinished
        jobs that have no task here (at most jobs.max_unfinished_jobs records); `holding` once that read succeeded."""
        if not self.holding and not await self.store.lease().acquire():
            return
        records, mine = await self.store.unfinished(), self.store.cluster
        if await self._adoption.adopt_gone(r.cluster for r in records if r.cluster != mine):
            records = await self.store.unfinished()
        resumed = sum(self._launch(r) for r in records if r.cluster == mine)
        if resumed or not self.holding:
            logger.info("job store lease held: %d queued or running jobs resumed", resumed)
        self.holding = True

    async def _maintain(self) -> None:
        while True:
            await asyncio.sleep(MAINTENANCE_INTERVAL_S)
            try:
                if self.holding and not await self.store.lease().renew():
                    logger.error("job store lease lost: another JobManager runs the jobs now")
                    self.holding = False
                    for task in list(self._tasks.values()):
                        task.cancel()
                await self._take_over()
                await self.store.purge(self._clock())
            except Exception as exc:
                logger.warning("job store maintenance failed (%s); retrying", type(exc).__name__)

    # -- submit ------------------------------------------------------------------------------
    async def submit(self, task: str, payload: Any, request_id: Optional[str] = None, owner: str = ANONYMOUS,
                     idempotency_key: Optional[str] = None) -> dict:
        """Validate the job now (the client hears 4xx at once), store it and queue it; its view.

        Sent again with the same `Idempotency-Key` (or, without one, the same `x-request-id`: what
        HAProxy resends) and the same task and payload, it is the same submission: the job it
        created is answered and nothing is queued twice. The same key with another body is 409."""
        digest = body_hash(task, payload)
        key = submission_key(idempotency_key, request_id, digest)
        if key is not None and (existing := await store_call(self.store.find(owner, key))) is not None:
            return self._same(existing, digest).view()
        body = await self._validate(task, payload)  # (before the embedder's info: bad input costs no call)
        dimensions = await self._embedding_dim() if task == "embeddings" else None
        check_dimensions(self.settings.embeddings.model_name, getattr(body, "dimensions", None), dimensions)
        estimate = estimate_bytes(task, body, dimensions or DEFAULT_EMBEDDING_DIM)
        if estimate > self.settings.jobs.max_job_result_bytes:
            raise JobTooLarge(f"The job's result would take about {estimate} bytes; one job may keep at most "
                              f"{self.settings.jobs.max_job_result_bytes} (jobs.max_job_result_bytes): split it.")
        record = JobRecord(id=secrets.token_urlsafe(12), owner=owner, task=task, records_total=records_of(task, body),
                           chunk_records=self.settings.jobs.chunk_records, created_at=self._clock(), key=key,
                           body_hash=digest, reserved_bytes=estimate, cluster=self.store.cluster)
        data = json.dumps(payload, separators=(",", ":")).encode()
        stored = await store_call(self.store.create(record, data, self.limits.for_owner(owner)))
        if stored.id != record.id:  # the same key won a race with this submission
            return self._same(stored, digest).view()
        if self.holding:
            self._launch(stored)
        logger.info("job %s queued: %s, %d records", record.id, task, record.records_total)
        return stored.view()

    @staticmethod
    def _same(existing: JobRecord, digest: str) -> JobRecord:
        if existing.body_hash != digest:
            raise IdempotencyKeyReused(  # without the job's id: a caller that did not submit it must not learn it
                "This Idempotency-Key was used for another job with a different task or payload; send a new key "
                "for a new job.")
        logger.info("job %s: submitted again with its key; not queued twice", existing.id)
        return existing

    async def _embedding_dim(self) -> Optional[int]:
        """The served embedder's dimensions (its info, which the Service caches); None while it cannot say."""
        try:
            async with asyncio.timeout(EMBEDDER_INFO_TIMEOUT_S):
                return int((await self._validator.model_info(self._validator.embedder))["dimensions"])
        except Exception as exc:  # noqa: BLE001 - an estimate never refuses a job
            logger.warning("embedder dimensions unknown (%s)", type(exc).__name__)
            return None

    async def _validate(self, task: str, payload: Any) -> BaseModel:
        service = self._validator
        if task not in ("translation", "embeddings", *service.custom_models):
            tasks = ", ".join(repr(t) for t in ("translation", "embeddings", *sorted(service.custom_models)))
            raise UnsupportedTask(f"Unknown task {task!r}; tasks: {tasks}.")
        body = parse_submission(task, payload)
        if task == "translation":
            await service.validate_translation(body)
        elif task == "embeddings":
            service.validate_embeddings(body)
        else:
            service.validate_predict(task, body.inputs)
        return body

    # -- compute -----------------------------------------------------------------------------
    def _launch(self, record: JobRecord) -> bool:  # (a task for a job without one here)
        if record.id in self._tasks:
            return False
        self._tasks[record.id] = asyncio.create_task(self._run(record.id, record.owner, record.status != "running"),
                                                     name=f"job-{record.id}")
        return True

    async def _run(self, job_id: str, owner: str, capped: bool = True) -> None:
        """Compute a job's missing chunks, in a running slot fair between owners (jobs/fair.py), and record how it
        ended. A cancelled task (DELETE, lease lost, shutdown) records nothing: `cancel` wrote the state first, or
        the next runner resumes the job; nor does a store failing past retry.STORE_RETRY_S: the sweep resumes it."""
        try:
            async with self._running.slot(owner, capped):  # (a resumed running job: not held back by its key's share)
                record = await retry.store_write(lambda: self.store.get(job_id))
                if record is None or record.finished:
                    return
                if (outcome := await self._outcome(record)) is not None:
                    await self._finish(record, *outcome)
        except retry.StoreUnreachable as exc:
            logger.error("job %s: the job store still fails (%s); left to resume", job_id, exc)
        finally:
            self._tasks.pop(job_id, None)

    async def _outcome(self, record: JobRecord) -> Optional[tuple[str, Optional[dict]]]:
        """Compute the job: ("succeeded", None) or ("failed", error); None when it finished meanwhile
        (cancelled). Only the job's own errors fail it; the store's are raised (StoreUnreachable)."""
        try:
            if (data := await retry.store_write(lambda: self.store.payload(record.id))) is None:
                return await self._payload_lost(record.id)
            body = parse_submission(record.task, json.loads(data))
            now = self._clock()
            await retry.store_write(lambda: self.store.start(record.id, now))
            remaining = (record.started_at or now) + self.settings.jobs.job_timeout_s - now
            try:
                async with asyncio.timeout(max(remaining, 0.0)):
                    done = await self._compute(record, body)
            except TimeoutError:
                raise RequestTimeout(f"The job did not finish within jobs.job_timeout_s "
                                     f"({self.settings.jobs.job_timeout_s:g} s).") from None
            return ("succeeded", None) if done else None
        except retry.StoreUnreachable:  # (CancelledError is no Exception: it passes too)
            raise
        except ServeAppError as exc:
            return "failed", {"error": exc.message, "error_type": exc.error_type}
        except Exception as exc:  # never leave a job running forever
            logger.exception("job %s failed", record.id)
            return "failed", {"error": f"The job failed: {type(exc).__name__}.", "error_type": "internal_error"}

    async def _payload_lost(self, job_id: str) -> Optional[tuple[str, dict]]:
        """None when the job finished meanwhile (its payload is dropped then); else its payload was lost
        (evicted by Redis past maxmemory, deleted by hand) and the job fails, not relaunched every tick."""
        record = await retry.store_write(lambda: self.store.get(job_id))
        if record is None or record.finished:
            return None
        logger.error("job %s: its payload is gone from the job store; the job fails", job_id)
        return "failed", {"error": "The job's payload is gone from the job store (evicted or deleted); "
                                   "submit the job again.", "error_type": "job_payload_lost"}

    async def _compute(self, record: JobRecord, body: BaseModel) -> bool:
        """Compute and store the missing chunks; False once the store refuses one (cancelled meanwhile)."""
        stored = await retry.store_write(lambda: self.store.chunk_metas(record.id))
        todo = [i for i in range(record.chunks_total) if i not in stored]
        if stored:
            self.chunks_resumed += len(stored)
            logger.info("job %s resumed: %d of %d chunks already stored, not recomputed",
                        record.id, len(stored), record.chunks_total)
        for index in todo:
            start = index * record.chunk_records
            stop = min(start + record.chunk_records, record.records_total)
            part = piece(record.task, body, start, stop)
            response = await retry.model_call(lambda: self._call(record.task, part), self.settings.jobs, (start, stop))
            meta, data = encode_chunk_of(record.task, body, response)
            put = (record.id, index, stop - start, meta, data, self.limits.for_owner(record.owner))
            if not await retry.store_write(lambda: self.store.put_chunk(*put)):
                logger.info("job %s finished meanwhile: chunk %d not kept, nothing more computed", record.id, index)
                return False
            self.chunks_computed += 1
        return True

    async def _call(self, task: str, part: BaseModel) -> BaseModel:
        if task == "translation":
            return (await self._service.translate(part, read_cache=False, write_cache=False))[0]
        if task == "embeddings":
            return (await self._service.embed(part, read_cache=False, write_cache=False))[0]
        return (await self._service.predict(task, part.inputs))[0]

    async def _finish(self, record: JobRecord, status: str, error: Optional[dict] = None) -> None:
        now = self._clock()
        await retry.store_write(lambda: self.store.finish(record.id, status, now,
                                                          now + self.settings.jobs.result_ttl_s, error))
        logger.info("job %s %s", record.id, status)

    # -- read, cancel --------------------------------------------------------------------------
    async def _owned(self, job_id: str, owner: str) -> JobRecord:
        record = await store_call(self.store.get(job_id))
        if record is None or record.owner != owner:  # another key's job is as absent as none
            raise JobNotFound(f"No job {job_id!r}: it never existed or its result expired.")
        return record

    async def get(self, job_id: str, owner: str = ANONYMOUS, offset: Optional[int] = None,
                  limit: Optional[int] = None) -> dict:
        """The job's view; once succeeded with its result: whole when small, else a `page` of records."""
        record = await self._owned(job_id, owner)
        return await job_view(self.store, record, self.settings.jobs.max_page_bytes, offset, limit, self._page_reads)

    async def cancel(self, job_id: str, owner: str = ANONYMOUS) -> dict:
        """Cancel a queued or running job (its waiting calls are never computed); a cancelled one is answered again."""
        record, now = await self._owned(job_id, owner), self._clock()
        if record.finished or not await store_call(
                self.store.finish(job_id, "cancelled", now, now + self.settings.jobs.result_ttl_s)):
            record = record if record.finished else await self._owned(job_id, owner)  # it ended in between
            if record.status == "cancelled":  # a DELETE retried after the JobManager died between write and answer
                return record.view()
            raise JobFinished(f"Job {job_id!r} already {record.status}; there is nothing to cancel.")
        task = self._tasks.get(job_id)
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        logger.info("job %s cancelled", job_id)
        return (await self._owned(job_id, owner)).view()

    async def stats(self) -> dict[str, int]:
        counts = await store_call(self.store.counts())
        return {**counts, "chunks_computed": self.chunks_computed, "chunks_resumed": self.chunks_resumed,
                "holding_lease": int(self.holding)}
