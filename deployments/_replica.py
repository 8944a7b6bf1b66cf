"""What every model deployment shares: thread sizing, the model thread, health, batch knobs."""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import math
import threading
import time
from concurrent.futures import Future
from enum import IntEnum
from typing import Any, Callable, Optional

from ._config import BatchConfig, parse_batch_config
from .adaptive_batching import AIMDBatchSizer, AIMDSettings
from .batching import split

logger = logging.getLogger("ray.serve")

#: model calls that must fail in a row before check_health reports the replica broken
FAILURES_BEFORE_UNHEALTHY = 3


class Priority(IntEnum):
    """Order of model work waiting for the model thread: lower runs first."""

    #: HTTP requests a client waits on (/translation, /embeddings, /models/.../predict)
    INTERACTIVE = 0
    #: records of asynchronous jobs (POST /jobs): computed when no interactive batch waits
    BACKGROUND = 1


class PriorityModelThread:
    """One thread that runs model calls one at a time, highest priority first.

    A replica's batch queues (one interactive, one background) each hand it at most
    one batch at a time; when both wait, the interactive batch goes first, so an
    interactive request waits for at most the background batch already computing.
    Within a priority, calls run in the order they came. A call cancelled before it
    started (its caller gave up) is skipped, never computed.
    """

    def __init__(self, name: str = "model"):
        self._heap: list[tuple[int, int, Future, Callable[[], Any]]] = []
        self._order = itertools.count()
        self._ready = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._work, name=name, daemon=True)
        self._thread.start()

    def submit(self, fn: Callable[[], Any], priority: int = Priority.INTERACTIVE) -> Future:
        future: Future = Future()
        with self._ready:
            if self._closed:
                raise RuntimeError("the model thread is shut down")
            heapq.heappush(self._heap, (int(priority), next(self._order), future, fn))
            self._ready.notify()
        return future

    def waiting(self) -> dict[int, int]:
        """Calls waiting (not computing), by priority."""
        with self._ready:
            counts: dict[int, int] = {}
            for priority, _, future, _ in self._heap:
                if not future.cancelled():
                    counts[priority] = counts.get(priority, 0) + 1
            return counts

    def shutdown(self) -> None:
        with self._ready:
            self._closed = True
            self._ready.notify_all()

    def _work(self) -> None:
        while True:
            with self._ready:
                while not self._heap and not self._closed:
                    self._ready.wait()
                if not self._heap:
                    return
                _, _, future, fn = heapq.heappop(self._heap)
            if not future.set_running_or_notify_cancel():
                continue  # cancelled while waiting: never computed
            try:
                result = fn()
            except BaseException as exc:  # handed to the awaiting caller
                future.set_exception(exc)
            else:
                future.set_result(result)


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

    def __init__(self, replica: "ModelReplica", method: Any, priority: Priority = Priority.INTERACTIVE):
        self._replica = replica
        self._method = method
        self._priority = priority

    def __getattr__(self, name: str) -> Any:
        return getattr(self._method, name)

    async def __call__(self, item: Any) -> Any:
        replica = self._replica
        ticket = _Ticket(_records_of(item))
        replica._tickets[id(item)] = ticket
        replica._stats["enqueued"] += ticket.records
        replica._metrics.count_enqueued(ticket.records)
        interactive = self._priority == Priority.INTERACTIVE
        if interactive:
            replica._interactive_calls += 1
            replica._interactive_idle.clear()
        try:
            return await self._method(item)
        except asyncio.CancelledError:
            if not ticket.started:
                replica._stats["cancelled"] += ticket.records
                replica._metrics.count_cancelled(ticket.records)
            raise
        finally:
            replica._tickets.pop(id(item), None)
            if interactive:
                replica._interactive_calls -= 1
                if replica._interactive_calls == 0:
                    replica._interactive_idle.set()


def _is_background(method: Any) -> bool:
    """Whether a `@serve.batch` method carries job work: by convention, `_background` in its name."""
    return "_background" in method.__name__


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
        # calls (and forming the next batch) while a batch computes; interactive
        # batches go ahead of background (job) batches waiting for it.
        self._model_thread = PriorityModelThread(f"{self.deployment_name}-model")
        self._failures_in_a_row = 0
        self._last_error: Optional[str] = None
        self._metrics = _Metrics(self.deployment_name)
        #: in-process tallies of records: entered the queue, computed, cancelled while queued
        self._stats = {"enqueued": 0, "computed": 0, "cancelled": 0,
                       "computed_interactive": 0, "computed_background": 0,
                       # CPU seconds of the model thread inside model calls (bench/overhead.py
                       # subtracts it from the replica's CPU to find Serve's share)
                       "model_cpu_s": 0.0}
        self._tickets: dict[int, _Ticket] = {}
        # Interactive calls queued or computing; background batches wait until there are none.
        self._interactive_calls = 0
        self._interactive_idle = asyncio.Event()
        self._interactive_idle.set()
        background = {m.__name__ for m in self._background_batched_methods()}
        for method in self._batched_methods():
            priority = Priority.BACKGROUND if method.__name__ in background else Priority.INTERACTIVE
            setattr(self, method.__name__, _TrackedBatchMethod(self, method, priority))
        self.batch_config = self.default_batch
        self._sizer: Optional[AIMDBatchSizer] = None  # SLO-adaptive batch size, when configured
        self._apply_batch_config()
        self.ready_at = time.time()

    def _batched_methods(self) -> list[Any]:
        """Every `@serve.batch` method (reconfigure sets their batch knobs)."""
        raise NotImplementedError

    def _background_batched_methods(self) -> list[Any]:
        """The `@serve.batch` methods that carry job (background) work: their batches start only
        when no interactive call is queued or computing on this replica. By convention, the
        batched methods whose name contains `_background`."""
        return [m for m in self._batched_methods() if _is_background(m)]

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
        """Records this replica queued, computed and dropped (cancelled while queued), and the
        model thread's CPU seconds in model calls (`model_cpu_s`)."""
        return dict(self._stats)

    def _apply_batch_config(self) -> None:
        for method in self._batched_methods():
            method.set_max_batch_size(self._size_for(method, self.batch_config.max_batch_size))
            method.set_batch_wait_timeout_s(self.batch_config.batch_wait_timeout_s)
        aimd = AIMDSettings.from_batch_config(self.batch_config)
        if aimd is None:
            self._sizer = None
        elif self._sizer is None:
            self._sizer = AIMDBatchSizer(aimd, self._set_live_max_batch_size)
        else:
            self._sizer.reconfigure(aimd)

    def _set_live_max_batch_size(self, size: int) -> None:
        for method in self._batched_methods():
            method.set_max_batch_size(self._size_for(method, size))

    def _size_for(self, method: Any, size: int) -> int:
        """The batch size of `method`'s queue: `size`, capped by background_max_batch_size for
        the job (background) queue."""
        cap = self.batch_config.background_max_batch_size
        if cap is not None and _is_background(method):
            return min(size, cap)
        return size

    def live_max_batch_size(self) -> int:
        """The batch size in force: the adaptive controller's, else the configured max_batch_size."""
        return self._sizer.size if self._sizer is not None else self.batch_config.max_batch_size

    async def _submit_pieces(self, batched: Any, records: list, make_item: Callable[[list], Any]) -> list:
        """Cut `records` into pieces of the live batch size, submit each (`make_item(piece)`) to the
        `@serve.batch` method `batched` at once, and return the results in order (one per piece).

        Serve refuses a queued item larger than max_batch_size: if the adaptive size shrank under a
        piece while it waited, the piece is cut again to the new size and resubmitted.
        """
        async def submit(piece: list) -> list:
            try:
                return [await batched(make_item(piece))]
            except RuntimeError:
                size = self._size_for(batched, self.live_max_batch_size())
                if len(piece) <= size:
                    raise
                parts = await asyncio.gather(*(submit(part) for part in split(piece, size)))
                return [result for part in parts for result in part]

        size = self._size_for(batched, self.live_max_batch_size())
        pieces = await asyncio.gather(*(submit(piece) for piece in split(records, size)))
        return [result for piece in pieces for result in piece]

    def reconfigure(self, user_config: dict) -> None:
        """Serve calls this with the deployment's user_config at start and on every `serve deploy`."""
        self.batch_config = parse_batch_config(user_config, self.deployment_name)
        self._apply_batch_config()
        logger.info("%s batch config: %s", self.deployment_name, self.batch_config.model_dump())

    async def _run_model(self, fn: Callable[[], Any], records: int,
                         priority: int = Priority.INTERACTIVE) -> Any:
        """Run `fn` (one batch of `records`) on the model thread at `priority`; the model
        time observed is the computation alone, not the wait for the thread.

        A background batch first waits until no interactive call is queued or computing:
        interactive requests never wait behind more than the one job batch already computing."""
        if priority >= Priority.BACKGROUND:
            while self._interactive_calls:
                await self._interactive_idle.wait()
        def timed() -> tuple[Any, float]:
            start, cpu_start = time.perf_counter(), time.thread_time()
            try:
                return fn(), time.perf_counter() - start
            finally:
                self._stats["model_cpu_s"] += time.thread_time() - cpu_start

        try:
            result, seconds = await asyncio.wrap_future(self._model_thread.submit(timed, priority))
        except Exception as exc:
            self._failures_in_a_row += 1
            self._last_error = repr(exc)
            self._metrics.failed()
            raise
        self._failures_in_a_row = 0
        self._stats["computed"] += records
        self._stats["computed_background" if priority >= Priority.BACKGROUND else "computed_interactive"] += records
        self._metrics.observe_batch(records, seconds)
        if self._sizer is not None:
            self._sizer.observe(seconds, records)
        return result

    def check_health(self) -> None:
        """Serve calls this every health_check_period_s; raising marks the replica unhealthy."""
        if self._failures_in_a_row >= FAILURES_BEFORE_UNHEALTHY:
            raise RuntimeError(
                f"{self.deployment_name}: last {self._failures_in_a_row} model calls failed; "
                f"last error: {self._last_error}"
            )

    def batching_info(self) -> dict:
        info = self.batch_config.user_config()
        if self._sizer is not None:
            info["adaptive"] = self._sizer.snapshot()
        return info
