"""Asynchronous jobs: their records, states, errors and views (pure logic, no Ray, no store).

A job is one translation, embeddings or custom-model request that the client does not wait
on: `POST /jobs` answers 202 with its id, `GET /jobs/{id}` tells its state and, once it
succeeded, its result; `DELETE /jobs/{id}` cancels it. Jobs live in a job store
(serve_app/jobs/store: SQLite on one machine, Redis on a cluster), written by the one
`JobManager` replica (serve_app/jobs/manager.py) that every ingress replica calls, so a
restart of an ingress, of the JobManager, of `make run` or of Redis loses none.

States: queued -> running -> succeeded | failed | cancelled (queued -> cancelled too).
Finished jobs are kept `result_ttl_s`, then forgotten (404 like an unknown id).
A job belongs to the API key that submitted it (`owner`: the key's id, `ANONYMOUS` when keys
are off): any other key gets 404 for it, as for an id that never existed.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
from dataclasses import asdict, dataclass, fields, replace
from datetime import datetime, timezone
from typing import Any, Awaitable, Literal, Optional, TypeVar

from ..errors import Overloaded, ServeAppError
from ..settings import AppSettings

logger = logging.getLogger("ray.serve")
T = TypeVar("T")

JobState = Literal["queued", "running", "succeeded", "failed", "cancelled"]
STATES: tuple[str, ...] = ("queued", "running", "succeeded", "failed", "cancelled")
FINISHED: frozenset[str] = frozenset({"succeeded", "failed", "cancelled"})

#: the owner of every job while no API keys are configured
ANONYMOUS = "anonymous"


class JobNotFound(ServeAppError):
    status_code = 404
    error_type = "job_not_found"


class UnsupportedTask(ServeAppError):
    status_code = 400
    error_type = "unsupported_task"


class JobFinished(ServeAppError):
    """DELETE of a job that already finished: nothing left to cancel."""

    status_code = 409
    error_type = "job_finished"


class JobTooLarge(ServeAppError):
    """One job whose result would not fit `jobs.max_job_result_bytes`."""

    status_code = 413
    error_type = "job_too_large"


class IdempotencyKeyReused(ServeAppError):
    """An `Idempotency-Key` already used for another body (another task or payload)."""

    status_code = 409
    error_type = "idempotency_key_reused"


class JobStoreFull(Overloaded):
    """The store holds `jobs.max_total_result_bytes` of results (or `max_finished_jobs` jobs):
    503 + Retry-After until finished jobs expire."""

    error_type = "job_store_full"


class JobStoreUnavailable(Overloaded):
    """The store (Redis) cannot be reached: 503 + Retry-After, nothing is lost."""

    error_type = "job_store_unavailable"


async def store_call(call: Awaitable[T]) -> T:
    """A client's store call (submit, read, cancel), its failures answered as 503 JobStoreUnavailable."""
    try:
        return await call
    except ServeAppError:
        raise
    except Exception as exc:
        logger.warning("job store call failed: %s", type(exc).__name__)
        raise JobStoreUnavailable("The job store is not reachable; retry shortly.", retry_after_s=2) from None


def job_settings(settings: AppSettings) -> AppSettings:
    """The settings a job runs under: the ingress limits replaced by the job limits (records per
    job, calls in flight per job, the job timeout); everything else as for HTTP requests."""
    jobs = settings.jobs
    limits = settings.ingress.model_copy(update={
        "max_records_per_request": jobs.max_records_per_job,
        "max_embedding_inputs": jobs.max_records_per_job,
        "max_predict_inputs": jobs.max_records_per_job,
        "max_inflight_calls_per_request": jobs.max_inflight_calls_per_job,
        "model_timeout_s": jobs.job_timeout_s,
    })
    return settings.model_copy(update={"ingress": limits})


def body_hash(task: str, payload: Any) -> str:
    """What makes two submissions the same one: the exact task and payload, canonical JSON."""
    body = json.dumps([task, payload], sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(body.encode()).hexdigest()


def submission_key(idempotency_key: Optional[str], request_id: Optional[str], digest: str) -> Optional[str]:
    """The key a submission is remembered by, with its job (one mechanism, two sources):

    - `Idempotency-Key` (the client's): `idem:<key>`; the same key with another body is 409;
    - else the `x-request-id` (HAProxy resends a POST whose Ingress died with the same id):
      `rid:<id>:<body hash>`, so an id reused for another body is simply another job."""
    if idempotency_key:
        return f"idem:{idempotency_key}"
    if request_id:
        return f"rid:{request_id}:{digest}"
    return None


def _iso(ts: Optional[float]) -> Optional[str]:
    return None if ts is None else datetime.fromtimestamp(ts, timezone.utc).isoformat(timespec="milliseconds")


@dataclass
class JobRecord:
    """A job's state as the store holds it (the payload and the per-chunk results apart)."""

    id: str
    owner: str
    task: str
    records_total: int
    #: records per stored chunk: chunk i holds records [i * chunk_records, (i + 1) * chunk_records)
    chunk_records: int
    created_at: float
    status: str = "queued"
    records_done: int = 0
    started_at: Optional[float] = None
    finished_at: Optional[float] = None
    expires_at: Optional[float] = None
    #: {"error", "error_type"} once failed
    error: Optional[dict[str, str]] = None
    #: `submission_key()` of the submission that created it (None: none was given)
    key: Optional[str] = None
    body_hash: str = ""
    #: result bytes counted against the store's total: the estimate at submission, or the bytes
    #: actually stored when more
    reserved_bytes: int = 0
    #: result bytes stored so far
    used_bytes: int = 0
    #: the Ray cluster whose JobManager runs it (the one it was submitted to, until that cluster is gone:
    #: `JobStore.adopt`); "" when the cluster has no name (RAY_CLUSTER_NAME, which KubeRay sets)
    cluster: str = ""

    @property
    def finished(self) -> bool:
        return self.status in FINISHED

    @property
    def chunks_total(self) -> int:
        return -(-self.records_total // self.chunk_records)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "JobRecord":
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})

    def view(self, result: Any = None, page: Optional[dict] = None) -> dict[str, Any]:
        """The job as `GET /jobs/{id}` shows it (the result only once it succeeded)."""
        view = {
            "job_id": self.id,
            "task": self.task,
            "status": self.status,
            "created_at": _iso(self.created_at),
            "started_at": _iso(self.started_at),
            "finished_at": _iso(self.finished_at),
            "expires_at": _iso(self.expires_at),
            "progress": {"records_done": self.records_done, "records_total": self.records_total},
            "result": result if self.status == "succeeded" else None,
            "error": self.error,
        }
        if page is not None and self.status == "succeeded":
            view["page"] = page
        return view


#: a bound that never binds
UNBOUNDED = 1 << 62


def share_of(bound: int, share: float) -> int:
    """One API key's part of `bound` (jobs.max_share_per_key): rounded up, at least 1, after taking off the float
    noise of the product (0.07 x 100 is 7.000000000000001, which rounded up to 8)."""
    return max(1, math.ceil(bound * share - 1e-9))


@dataclass(frozen=True)
class StoreLimits:
    """What a store admits (checked atomically with each create)."""

    max_unfinished_jobs: int
    max_jobs: int
    max_total_result_bytes: int
    retry_after_s: int
    max_job_result_bytes: int = UNBOUNDED
    #: one owner's share of each bound (jobs.max_share_per_key)
    max_unfinished_per_owner: int = UNBOUNDED
    max_jobs_per_owner: int = UNBOUNDED
    max_bytes_per_owner: int = UNBOUNDED

    @classmethod
    def of(cls, settings: AppSettings) -> "StoreLimits":
        jobs, share = settings.jobs, settings.jobs.max_share_per_key
        max_jobs = jobs.max_unfinished_jobs + jobs.max_finished_jobs
        return cls(max_unfinished_jobs=jobs.max_unfinished_jobs, max_jobs=max_jobs,
                   max_total_result_bytes=jobs.max_total_result_bytes,
                   retry_after_s=settings.ingress.retry_after_s, max_job_result_bytes=jobs.max_job_result_bytes,
                   max_unfinished_per_owner=share_of(jobs.max_unfinished_jobs, share),
                   max_jobs_per_owner=share_of(max_jobs, share),
                   max_bytes_per_owner=max(jobs.max_job_result_bytes, share_of(jobs.max_total_result_bytes, share)))

    def for_owner(self, owner: str) -> "StoreLimits":
        """The limits of `owner`'s submission: without API keys (ANONYMOUS) there is one owner, not bounded apart."""
        if owner != ANONYMOUS:
            return self
        return replace(self, max_unfinished_per_owner=UNBOUNDED, max_jobs_per_owner=UNBOUNDED,
                       max_bytes_per_owner=UNBOUNDED)

    def outgrown(self, reason: str) -> ServeAppError:
        """The error a running job fails with when a chunk of its result would pass a bound (`reason`
        as the stores return it: "job", "bytes" or "owner_bytes"); the submission's estimate was short."""
        if reason == "job":
            return JobTooLarge(f"The job's result passed jobs.max_job_result_bytes ({self.max_job_result_bytes} "
                               "bytes), more than estimated at submission: split it into smaller jobs.")
        if reason == "owner_bytes":
            return JobStoreFull(f"The job's result outgrew its estimate past this API key's share of the job store "
                                f"({self.max_bytes_per_owner} result bytes, jobs.max_share_per_key).",
                                retry_after_s=self.retry_after_s)
        return JobStoreFull(f"The job's result outgrew its estimate and the job store had no room for the rest "
                            f"(jobs.max_total_result_bytes, {self.max_total_result_bytes} bytes).",
                            retry_after_s=self.retry_after_s)

    def refusal(self, reason: str) -> Overloaded:
        """The 503 for a create the store refused (`reason` as the stores return it)."""
        retry = self.retry_after_s
        if reason.startswith("owner_"):
            bound = {"owner_unfinished": f"{self.max_unfinished_per_owner} queued or running jobs",
                     "owner_jobs": f"{self.max_jobs_per_owner} jobs kept",
                     "owner_bytes": f"{self.max_bytes_per_owner} result bytes"}[reason]
            return JobStoreFull(
                f"This API key's jobs hold {bound}, its share of the job store (jobs.max_share_per_key); finished "
                f"jobs free theirs as they expire; retry after {retry} s.", retry_after_s=retry)
        if reason == "unfinished":
            return Overloaded(
                f"{self.max_unfinished_jobs} jobs are queued or running, the most this service holds "
                f"(jobs.max_unfinished_jobs); retry after {retry} s.", retry_after_s=retry)
        if reason == "jobs":
            return JobStoreFull(
                f"The job store holds {self.max_jobs} jobs (jobs.max_unfinished_jobs + jobs.max_finished_jobs); "
                f"finished ones are forgotten as their results expire; retry after {retry} s.", retry_after_s=retry)
        return JobStoreFull(
            f"The job store's results would pass jobs.max_total_result_bytes ({self.max_total_result_bytes} "
            f"bytes); finished jobs free theirs as they expire; retry after {retry} s.", retry_after_s=retry)
