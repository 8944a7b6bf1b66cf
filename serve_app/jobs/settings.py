"""The jobs' settings (`args.jobs`, env `SERVE_APP_JOBS_*`): how many, how big, where they live."""

from __future__ import annotations

from typing import Literal, Optional

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import SettingsConfigDict

from deployments.settings import Section


class JobSettings(Section):
    """Asynchronous jobs (`POST /jobs`): how many, how big, how long results are kept."""

    model_config = SettingsConfigDict(env_prefix="SERVE_APP_JOBS_", extra="forbid")

    enabled: bool = Field(
        True,
        description="Serve `/jobs` (a JobManager deployment holds the jobs). Off: `/jobs` answers 404.",
    )
    max_unfinished_jobs: int = Field(
        100, ge=1,
        description="Jobs queued or running at once; one more is 503 + Retry-After. Bounds the backlog "
        "(and the memory of queued payloads): at most this x max_records_per_job records wait.",
    )
    max_running_jobs: int = Field(
        2, ge=1,
        description="Jobs computing at once; the rest wait `queued`, in turn between API keys (the key served least "
        "recently first), then first in first out; one API key's jobs take at most max_share_per_key of these "
        "slots (rounded up, at least one). More lets small jobs "
        "pass a large one; each running job keeps up to max_inflight_calls_per_job calls at the models.",
    )
    max_inflight_calls_per_job: int = Field(
        4, ge=1,
        description="Model calls (of ingress.records_per_call records) one job keeps in flight. Enough to fill "
        "a batch; more only queues job records in the replicas, where interactive calls overtake them anyway.",
    )
    max_records_per_job: int = Field(
        10_000, ge=1,
        description="Most records (translation) or inputs (embeddings, custom models) in one job; more is 413. "
        "The body must still fit ingress.max_body_bytes.",
    )
    job_timeout_s: float = Field(
        3600.0, gt=0,
        description="A job still unfinished this long after it started fails with error_type `timeout`.",
    )
    model_retry_s: float = Field(
        300.0, ge=0,
        description="How long a running job retries a chunk whose model answers 503 (`model_unavailable`, "
        "`overloaded`: a replica or node lost, every replica busy) before the job fails with that error. "
        "Interactive requests get the 503 at once; a job waits for the model to come back.",
    )
    result_ttl_s: float = Field(
        3600.0, gt=0,
        description="How long a finished job (its result or error) can be read; then GET is 404.",
    )
    max_finished_jobs: int = Field(
        1000, ge=1,
        description="Finished jobs kept at once (until their TTL); while the store holds this many plus the "
        "unfinished ones, `POST /jobs` is 503 `job_store_full` + Retry-After. No job is dropped before its TTL.",
    )
    store: Literal["sqlite", "redis"] = Field(
        "sqlite",
        description="Where jobs live (docs/jobs.md): `sqlite`, a file on this machine (`store_path`; survives "
        "restarts of the JobManager and of `make run`), or `redis` (`redis_url`; for clusters, where the "
        "JobManager may restart on another node).",
    )
    store_path: str = Field(
        ".data/jobs.sqlite3",
        description="The SQLite file (`store: sqlite`); a relative path is under the project's root. Its folder "
        "is created. One service per file: a second JobManager on it serves reads but runs no job.",
    )
    redis_url: str = Field(
        "redis://127.0.0.1:6379/0",
        description="Redis to keep jobs in (`store: redis`), e.g. `redis://serve-app-redis:6379/0`; without a "
        "password (refused here): set `redis_password_file` or SERVE_APP_JOBS_REDIS_PASSWORD.",
    )
    redis_password: Optional[SecretStr] = Field(
        None, exclude=True,
        description="Redis password, from the environment only (never `args:`; not passed through Ray).",
    )
    redis_password_file: Optional[str] = Field(
        None,
        description="A file holding the Redis password (a mounted Kubernetes Secret), read at connection.",
    )
    redis_prefix: str = Field(
        "serve-app:jobs:", min_length=1,
        description="Prefix of every Redis key the job store writes (several services may share one Redis).",
    )
    max_job_result_bytes: int = Field(
        32 * 1024 * 1024, ge=1024,
        description="Largest result one job may keep in the store, estimated at submission (an embedding is "
        "dimensions x 4 bytes; a translation about twice its texts); more is 413 `job_too_large`.",
    )
    max_total_result_bytes: int = Field(
        256 * 1024 * 1024, ge=1024,
        description="Result bytes the store holds in all (counted in the store, reserved at submission); a job "
        "that would pass it is 503 `job_store_full` + Retry-After until finished jobs expire.",
    )
    max_share_per_key: float = Field(
        0.5, gt=0.0, le=1.0,
        description="The most of each store bound (max_unfinished_jobs, the jobs kept, max_total_result_bytes) "
        "one API key's jobs may take, so that one tenant cannot fill the store for the others: past it that "
        "key's `POST /jobs` is 503 `job_store_full` + Retry-After. Also the most of max_running_jobs one key's "
        "jobs run at once (at least one; the rest wait `queued`), so another key's job starts without waiting "
        "for them to end. 1.0: no bound per key. Without API keys "
        "every request is one owner, which this does not bound. One job of max_job_result_bytes always fits.",
    )
    chunk_records: int = Field(
        64, ge=1,
        description="Records per stored chunk of a job's result. Each chunk is written as it completes: a "
        "restarted JobManager resumes a job after its last stored chunk, recomputing none of them.",
    )
    max_page_bytes: int = Field(
        4 * 1024 * 1024, ge=4096,
        description="Largest result (as JSON, estimated) that `GET /jobs/<id>` answers in one piece; a larger "
        "one comes in pages of about this size (`?offset=&limit=` on records, with a `page.next` link).",
    )

    @model_validator(mode="after")
    def _a_job_fits_the_store(self) -> "JobsSettings":
        if self.max_job_result_bytes > self.max_total_result_bytes:
            raise ValueError(
                f"jobs.max_job_result_bytes ({self.max_job_result_bytes}) is above jobs.max_total_result_bytes "
                f"({self.max_total_result_bytes}): a job that large would be answered 503 job_store_full forever")
        return self

    @field_validator("redis_url")
    @classmethod
    def _no_password_in_url(cls, value: str) -> str:
        from urllib.parse import parse_qs, urlsplit

        parts = urlsplit(value)
        if parts.password or "password" in parse_qs(parts.query):  # redis-py takes ?password= too
            raise ValueError("jobs.redis_url holds a password: set SERVE_APP_JOBS_REDIS_PASSWORD_FILE (a mounted "
                             "Secret) or SERVE_APP_JOBS_REDIS_PASSWORD instead")
        if parts.scheme not in ("redis", "rediss", "unix"):
            raise ValueError(f"jobs.redis_url {value!r}: the scheme must be redis://, rediss:// or unix://")
        return value
