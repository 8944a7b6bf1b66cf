"""What every model deployment shares: thread sizing, the model thread, health, batch knobs."""

from __future__ import annotations

import asyncio
import logging
import math
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Optional

from ._config import BatchConfig, parse_batch_config

logger = logging.getLogger("ray.serve")

#: model calls that must fail in a row before check_health reports the replica broken
FAILURES_BEFORE_UNHEALTHY = 3


def cpu_share(default: float = 1.0) -> float:
    """CPUs Ray reserved for this replica (its `num_cpus`), or `default` outside Ray."""
    try:
        import ray

        if ray.is_initialized():
            return float(ray.get_runtime_context().get_assigned_resources().get("CPU", default))
    except Exception:  # pragma: no cover - outside a Ray worker
        pass
    return default


def threads_for_share(share: float, override: Optional[int] = None) -> int:
    """Threads for the model: the override, else the CPU share rounded up (at least 1)."""
    if override:
        return int(override)
    return max(1, math.ceil(share - 1e-9))


class _Metrics:
    """Prometheus metrics through ray.serve.metrics; silently absent outside Serve.

    Serve adds the `deployment`, `replica` and `application` tags itself (and refuses
    them as user tag keys), so these metrics declare no tags of their own.
    """

    def __init__(self, deployment: str):
        self.batch_records = self.model_seconds = self.records = self.failures = None
        self.queue_wait = self.enqueued = self.cancelled = None
        try:
            from ray.serve import context

            if context._get_internal_replica_context() is None:
                return  # not inside a Serve replica (unit tests drive the class directly)
            from ray.serve.metrics import Counter, Histogram

            self.batch_records = Histogram(
                "serve_app_batch_records", description="Records in one model call.",
                boundaries=[1, 2, 4, 8, 16, 32, 64, 128, 256])
            self.model_seconds = Histogram(
                "serve_app_model_seconds", description="Model time of one batch, in seconds.",
                boundaries=[0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10])
            self.queue_wait = Histogram(
                "serve_app_queue_wait_seconds",
                description="Time a call's records waited in the replica's batch queue before their batch "
                "started, in seconds (one observation per call in each batch).",
                boundaries=[0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30])
            self.records = Counter(
                "serve_app_records_total", description="Records processed by the model.")
            self.enqueued = Counter(
                "serve_app_records_enqueued_total", description="Records that entered the batch queue.")
            self.cancelled = Counter(
                "serve_app_records_cancelled_total",
                description="Records whose caller cancelled (deadline, client gone) before their batch started: "
                "dropped from the queue, never computed.")
            self.failures = Counter(
                "serve_app_model_failures_total", description="Model calls that raised.")
        except Exception:  # pragma: no cover - metrics must never stop a replica
            logger.exception("%s: Prometheus metrics unavailable", deployment)

    def observe_batch(self, records: int, seconds: float) -> None:
        if self.batch_records is not None:
            self.batch_records.observe(records)
            self.model_seconds.observe(seconds)
            self.records.inc(records)

    def observe_queue_wait(self, seconds: float) -> None:
        if self.queue_wait is not None:
            self.queue_wait.observe(seconds)

    def count_enqueued(self, records: int) -> None:
        if self.enqueued is not None and records:
            self.enqueued.inc(records)

    def count_cancelled(self, records: int) -> None:
        if self.cancelled is not None and records:
            self.cancelled.inc(records)

    def failed(self) -> None:
        if self.failures is not None:
            self.failures.inc()


class _Ticket:
    """One call waiting in a batch queue: when it entered, how many records, whether its batch started."""

    __slots__ = ("enqueued_at", "records", "started")

    def __init__(self, records: int):
        self.enqueued_at = time.perf_counter()
        self.records = records
        self.started = False


class _TrackedBatchMethod:
    """Wraps a replica's `@serve.batch` method to stamp each call's enqueue time and to count
    calls cancelled before their batch started (Serve drops those from the batch: never computed).

    Attribute access (set_max_batch_size, ...) goes to the wrapped method.
    """

    def __init__(self, replica: "ModelReplica", method: Any):
        self._replica = replica
        self._method = method

    def __getattr__(self, name: str) -> Any:
        return getattr(self._method, name)

    async def __call__(self, item: Any) -> Any:
        replica = self._replica
        ticket = _Ticket(_records_of(item))
        replica._tickets[id(item)] = ticket
        replica._stats["enqueued"] += ticket.records
        replica._metrics.count_enqueued(ticket.records)
        try:
            return await self._method(item)
        except asyncio.CancelledError:
            if not ticket.started:
                replica._stats["cancelled"] += ticket.records
                replica._metrics.count_cancelled(ticket.records)
            raise
        finally:
            replica._tickets.pop(id(item), None)


def _records_of(item: Any) -> int:
    texts = getattr(item, "texts", item)
    try:
        return len(texts)
    except TypeError:  # pragma: no cover
        return 1


class ModelReplica:
    """Base of the model deployments. Subclasses set `deployment_name` and `_batched_methods`."""

    deployment_name = "model"
    default_batch: BatchConfig

    def _init_replica(self) -> None:
        # One thread runs the model so the replica's event loop keeps accepting
        # calls (and forming the next batch) while a batch computes.
        self._model_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="model")
        self._failures_in_a_row = 0
        self._last_error: Optional[str] = None
        self._metrics = _Metrics(self.deployment_name)
        #: in-process tallies of records: entered the queue, computed, cancelled while queued
        self._stats = {"enqueued": 0, "computed": 0, "cancelled": 0}
        self._tickets: dict[int, _Ticket] = {}
        for method in self._batched_methods():
            setattr(self, method.__name__, _TrackedBatchMethod(self, method))
        self.batch_config = self.default_batch
        self._apply_batch_config()
        self.ready_at = time.time()

    def _batched_methods(self) -> list[Any]:
        raise NotImplementedError

    def _batch_started(self, items: list[Any]) -> None:
        """Call first thing in a `@serve.batch` method: marks its calls as started (no longer
        cancellable from the queue) and observes how long each waited in the queue."""
        now = time.perf_counter()
        for item in items:
            ticket = self._tickets.get(id(item))
            if ticket is not None and not ticket.started:
                ticket.started = True
                self._metrics.observe_queue_wait(now - ticket.enqueued_at)

    def stats(self) -> dict:
        """Records this replica queued, computed and dropped (cancelled while queued)."""
        return dict(self._stats)

    def _apply_batch_config(self) -> None:
        for method in self._batched_methods():
            method.set_max_batch_size(self.batch_config.max_batch_size)
            method.set_batch_wait_timeout_s(self.batch_config.batch_wait_timeout_s)

    def reconfigure(self, user_config: dict) -> None:
        """Serve calls this with the deployment's user_config at start and on every `serve deploy`."""
        self.batch_config = parse_batch_config(user_config, self.deployment_name)
        self._apply_batch_config()
        logger.info("%s batch config: %s", self.deployment_name, self.batch_config.model_dump())

    async def _run_model(self, fn: Callable[[], Any], records: int) -> Any:
        start = time.perf_counter()
        try:
            result = await asyncio.get_running_loop().run_in_executor(self._model_thread, fn)
        except Exception as exc:
            self._failures_in_a_row += 1
            self._last_error = repr(exc)
            self._metrics.failed()
            raise
        self._failures_in_a_row = 0
        self._stats["computed"] += records
        self._metrics.observe_batch(records, time.perf_counter() - start)
        return result

    def check_health(self) -> None:
        """Serve calls this every health_check_period_s; raising marks the replica unhealthy."""
        if self._failures_in_a_row >= FAILURES_BEFORE_UNHEALTHY:
            raise RuntimeError(
                f"{self.deployment_name}: last {self._failures_in_a_row} model calls failed; "
                f"last error: {self._last_error}"
            )

    def batching_info(self) -> dict:
        return self.batch_config.model_dump()
