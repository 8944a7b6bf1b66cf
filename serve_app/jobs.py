"""Asynchronous jobs: their records, states and expiry (pure logic, no Ray).

A job is one translation, embeddings or custom-model request that the client does
not wait on: `POST /jobs` answers 202 with its id, `GET /jobs/{id}` tells its state
and, once it succeeded, its result; `DELETE /jobs/{id}` cancels it. The `JobStore`
here holds the jobs of one `JobManager` replica (deployments/job_manager.py), which
every ingress replica calls, so any ingress sees every job and an ingress restart
loses none.

States: queued -> running -> succeeded | failed | cancelled (queued -> cancelled too).
Finished jobs are kept `result_ttl_s`, then forgotten (404 like an unknown id).
"""

from __future__ import annotations

import secrets
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Callable, Literal, Optional

from .errors import Overloaded, ServeAppError
from .settings import AppSettings

JobState = Literal["queued", "running", "succeeded", "failed", "cancelled"]
FINISHED: frozenset[str] = frozenset({"succeeded", "failed", "cancelled"})


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


def _iso(ts: Optional[float]) -> Optional[str]:
    return None if ts is None else datetime.fromtimestamp(ts, timezone.utc).isoformat(timespec="milliseconds")


@dataclass
class Job:
    id: str
    task: str
    records_total: int
    created_at: float
    status: JobState = "queued"
    records_done: int = 0
    started_at: Optional[float] = None
    finished_at: Optional[float] = None
    expires_at: Optional[float] = None
    result: Any = None
    error: Optional[dict[str, str]] = None
    #: what the job computes: the validated request body (dropped once the job finished)
    payload: Any = field(default=None, repr=False)
    #: the submission's key (JobStore.create): a resent identical submission finds this job
    submission_key: Optional[str] = field(default=None, repr=False)

    @property
    def finished(self) -> bool:
        return self.status in FINISHED

    def view(self) -> dict[str, Any]:
        """The job as `GET /jobs/{id}` shows it (the result only once it succeeded)."""
        return {
            "job_id": self.id,
            "task": self.task,
            "status": self.status,
            "created_at": _iso(self.created_at),
            "started_at": _iso(self.started_at),
            "finished_at": _iso(self.finished_at),
            "expires_at": _iso(self.expires_at),
            "progress": {"records_done": self.records_done, "records_total": self.records_total},
            "result": self.result if self.status == "succeeded" else None,
            "error": self.error,
        }


class JobStore:
    """Jobs by id: bounded in unfinished jobs (more is 503 + Retry-After), finished ones
    forgotten after `result_ttl_s` (and the oldest first beyond `max_finished_jobs`)."""

    def __init__(self, *, max_unfinished_jobs: int, max_finished_jobs: int, result_ttl_s: float,
                 retry_after_s: int = 2, clock: Callable[[], float] = time.time):
        self.max_unfinished_jobs = max_unfinished_jobs
        self.max_finished_jobs = max_finished_jobs
        self.result_ttl_s = result_ttl_s
        self.retry_after_s = retry_after_s
        self._clock = clock
        self._unfinished: dict[str, Job] = {}
        #: finished jobs, oldest finish first (so expiry pops from the front)
        self._finished: "OrderedDict[str, Job]" = OrderedDict()
        #: submission key -> id of the job it created, for the jobs still held
        self._by_key: dict[str, str] = {}

    def find(self, submission_key: str) -> Optional[Job]:
        """The held job a submission with this key created, or None."""
        self.expire()
        job_id = self._by_key.get(submission_key)
        return None if job_id is None else (self._unfinished.get(job_id) or self._finished.get(job_id))

    def _forget(self, job: Job) -> None:
        if job.submission_key is not None:
            self._by_key.pop(job.submission_key, None)

    def create(self, task: str, payload: Any, records_total: int, submission_key: Optional[str] = None) -> Job:
        self.expire()
        if len(self._unfinished) >= self.max_unfinished_jobs:
            raise Overloaded(
                f"{len(self._unfinished)} jobs are queued or running, the most this service holds "
                f"(jobs.max_unfinished_jobs); retry after {self.retry_after_s} s.",
                retry_after_s=self.retry_after_s,
            )
        job = Job(id=secrets.token_urlsafe(12), task=task, records_total=records_total,
                  created_at=self._clock(), payload=payload, submission_key=submission_key)
        self._unfinished[job.id] = job
        if submission_key is not None:
            self._by_key[submission_key] = job.id
        return job

    def get(self, job_id: str) -> Job:
        self.expire()
        job = self._unfinished.get(job_id) or self._finished.get(job_id)
        if job is None:
            raise JobNotFound(f"No job {job_id!r}: it never existed or its result expired.")
        return job

    def start(self, job: Job) -> None:
        job.status, job.started_at = "running", self._clock()

    def finish(self, job: Job, status: JobState, *, result: Any = None,
               error: Optional[dict[str, str]] = None) -> None:
        if status not in FINISHED:
            raise ValueError(f"not a finished state: {status!r}")
        if job.finished:
            return
        now = self._clock()
        job.status, job.finished_at, job.expires_at = status, now, now + self.result_ttl_s
        job.result, job.error, job.payload = result, error, None
        self._unfinished.pop(job.id, None)
        self._finished[job.id] = job
        while len(self._finished) > self.max_finished_jobs:
            self._forget(self._finished.popitem(last=False)[1])

    def expire(self) -> int:
        """Forget finished jobs past their expiry; returns how many."""
        now, gone = self._clock(), 0
        while self._finished:
            job = next(iter(self._finished.values()))
            if job.expires_at is not None and job.expires_at > now:
                break
            self._forget(self._finished.popitem(last=False)[1])
            gone += 1
        return gone

    def counts(self) -> dict[str, int]:
        counts = {state: 0 for state in ("queued", "running", "succeeded", "failed", "cancelled")}
        for job in (*self._unfinished.values(), *self._finished.values()):
            counts[job.status] += 1
        return counts
