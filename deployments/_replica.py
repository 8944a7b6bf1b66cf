"""What every model deployment shares: thread sizing, the model thread, health, batch knobs."""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass
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


#: What a batch computation returns for one of its calls: the call's output or the exception it gets.
Compute = Callable[[list], list]


class _Entry:
    """One call waiting for the model: its item, records, the computation it joins, and its future."""

    __slots__ = ("item", "records", "compute", "cap", "future")

    def __init__(self, item: Any, records: int, compute: Compute, cap: int):
        self.item, self.records, self.compute, self.cap = item, records, compute, cap
        self.future: Future = Future()


@dataclass(frozen=True)
class BatchOutcome:
    """One computation the model thread ran: what the replica's bookkeeping needs."""

    priority: int
    records: int
    seconds: float
    cpu_seconds: float
    #: every call of the batch failed (the model is broken, not one input)
    failed: bool
    error: Optional[BaseException] = None


class ModelQueue:
    """The replica's model thread and the queue in front of it.

    Callers submit one *call* at a time (an item of records and the function that computes a
    list of items). Each time the thread is free it takes the oldest waiting call of the
    highest priority and joins to it, in arrival order, every other waiting call of that
    priority and function while their records fit the first call's `cap` (its queue's live
    `max_batch_size`), then runs the function once over all of them.

    That join is what makes the batch size follow the load: `@serve.batch` (Ray 2.60) forms its
    next batch from what arrives in `batch_wait_timeout_s` *while the previous batch is still
    computing*, so behind a slow model it hands over a string of one- or two-record batches
    (measured: 32 concurrent requests computed as 1-2 record batches, a 1 s model call each).
    Joined here, everything that arrived while the model was busy rides in the next call.

    A call cancelled before its batch started (its caller gave up) is skipped, never computed.
    `on_batch(outcome)` is called on the model thread after each computation.
    """

    def __init__(self, name: str = "model", on_batch: Optional[Callable[[BatchOutcome], None]] = None,
                 fill_wait_fraction: float = 0.0):
        self._waiting: dict[int, deque[_Entry]] = {}
        self._ready = threading.Condition()
        self._closed = False
        self._on_batch = on_batch
        #: after a batch of T seconds, wait up to fraction x T for a fuller next batch (see `_fill_deadline`)
        self.fill_wait_fraction = fill_wait_fraction
        self._last_batch_s = 0.0
        self._last_batch_end = 0.0
        self._thread = threading.Thread(target=self._work, name=name, daemon=True)
        self._thread.start()

    def submit(self, compute: Compute, item: Any, records: int = 1, priority: int = Priority.INTERACTIVE,
               cap: Optional[int] = None) -> Future:
        """Queue one call; its future resolves to `(output, records of the batch it rode in, the
        batch's start on time.perf_counter)`, or raises the call's exception."""
        entry = _Entry(item, records, compute, records if cap is None else max(int(cap), 1))
        with self._ready:
            if self._closed:
                raise RuntimeError("the model thread is shut down")
            self._waiting.setdefault(int(priority), deque()).append(entry)
            self._ready.notify()
        return entry.future

    def waiting(self) -> dict[int, int]:
        """Calls waiting (not computing), by priority."""
        with self._ready:
            counts = {p: sum(not e.future.cancelled() for e in q) for p, q in self._waiting.items()}
            return {p: n for p, n in counts.items() if n}

    def shutdown(self) -> None:
        with self._ready:
            self._closed = True
            self._ready.notify_all()

    def _next_batch(self) -> tuple[int, list[_Entry], int, bool]:
        """Under the lock, without taking anything: the calls the next batch would join (the oldest
        live call of the highest priority, then, in arrival order, every later call of its computation
        while their records fit its cap), how many queue entries that spans (cancelled ones
        included), and whether the batch is full (at its cap, or the next such call does not fit)."""
        for priority in sorted(self._waiting):
            batch: list[_Entry] = []
            records = spanned = 0
            full = False
            for entry in self._waiting[priority]:
                if entry.future.cancelled():
                    spanned += 1
                    continue
                if batch and entry.compute != batch[0].compute:
                    break
                if batch and records + entry.records > batch[0].cap:
                    full = True
                    break
                batch.append(entry)
                records += entry.records
                spanned += 1
            if batch:
                return priority, batch, spanned, full or records >= batch[0].cap
            self._waiting[priority].clear()  # only cancelled calls were left
        return 0, [], 0, False

    def _fill_deadline(self) -> Optional[float]:
        """Under the lock: when to stop waiting for a fuller batch, or None to start now. It waits only
        right after a batch (up to fill_wait_fraction of its model time, counted from its end) and
        only while the next batch is not full."""
        if not self.fill_wait_fraction or not self._last_batch_s:
            return None
        deadline = self._last_batch_end + self.fill_wait_fraction * self._last_batch_s
        if time.perf_counter() >= deadline:
            return None
        _, batch, _, full = self._next_batch()
        return deadline if batch and not full else None

    def _take(self) -> tuple[int, list[_Entry]]:
        """Under the lock: take the next batch (see `_next_batch`) off the queue and mark it running."""
        while True:
            priority, batch, spanned, _ = self._next_batch()
            for _ in range(spanned):
                self._waiting[priority].popleft()
            # A call cancelled since `_next_batch` looked is dropped here, never computed; if that
            # emptied the batch, look again rather than sleep with calls still waiting.
            running = [e for e in batch if e.future.set_running_or_notify_cancel()]
            if running or not batch:
                return priority, running

    def _work(self) -> None:
        while True:
            with self._ready:
                while True:
                    deadline = None if self._closed else self._fill_deadline()
                    if deadline is not None:
                        self._ready.wait(max(0.0, deadline - time.perf_counter()))
                        continue
                    priority, batch = self._take()
                    if batch or self._closed:
                        break
                    self._ready.wait()
            if not batch:
                return
            self._run(priority, batch)

    def _run(self, priority: int, batch: list[_Entry]) -> None:
        records = sum(e.records for e in batch)
        start, cpu_start = time.perf_counter(), time.thread_time()
        error: Optional[BaseException] = None
        try:
            outputs = list(batch[0].compute([e.item for e in batch]))
            if len(outputs) != len(batch):
                raise RuntimeError(f"batch computation returned {len(outputs)} outputs for {len(batch)} calls")
        except BaseException as exc:  # handed to every caller of the batch
            error, outputs = exc, [exc] * len(batch)
        end = time.perf_counter()
        seconds, cpu_seconds = end - start, time.thread_time() - cpu_start
        with self._ready:
            self._last_batch_s, self._last_batch_end = seconds, end
        failed = all(isinstance(out, BaseException) for out in outputs)
        if failed and error is None:
            error = outputs[0]
        if self._on_batch is not None:
            try:
                self._on_batch(BatchOutcome(priority, records, seconds, cpu_seconds, failed, error))
            except Exception:  # pragma: no cover - bookkeeping must never lose a result
                logger.exception("model batch bookkeeping failed")
        for entry, out in zip(batch, outputs):
            if isinstance(out, BaseException):
                entry.future.set_exception(out)
            else:
                entry.future.set_result((out, records, start))


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


class _Instruments:
    """The serve_app_* Prometheus instruments of one process, created once: a replica hosting
    several models (the Ingress, with models placed in it) records them all through the same
    instruments, told apart by the `model` tag. Serve adds the `deployment`, `replica` and
    `application` tags itself (and refuses them as user tag keys)."""

    _made: Optional["_Instruments"] = None

    def __init__(self) -> None:
        from ray.serve.metrics import Counter, Histogram

        tags = ("model",)
        self.batch_records = Histogram(
            "serve_app_batch_records", description="Records in one model call.",
            boundaries=[1, 2, 4, 8, 16, 32, 64, 128, 256], tag_keys=tags)
        self.model_seconds = Histogram(
            "serve_app_model_seconds", description="Model time of one batch, in seconds.",
            boundaries=[0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10], tag_keys=tags)
        self.queue_wait = Histogram(
            "serve_app_queue_wait_seconds",
            description="Time a call's records waited in the replica's batch queue before their batch "
            "started, in seconds (one observation per call in each batch).",
            boundaries=[0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30], tag_keys=tags)
        self.records = Counter(
            "serve_app_records_total", description="Records processed by the model.", tag_keys=tags)
        self.enqueued = Counter(
            "serve_app_records_enqueued_total", description="Records that entered the batch queue.",
            tag_keys=tags)
        self.cancelled = Counter(
            "serve_app_records_cancelled_total",
            description="Records whose caller cancelled (deadline, client gone) before their batch started: "
            "dropped from the queue, never computed.", tag_keys=tags)
        self.failures = Counter(
            "serve_app_model_failures_total", description="Model calls that raised.", tag_keys=tags)

    @classmethod
    def get(cls) -> "_Instruments":
        if cls._made is None:
            cls._made = cls()
        return cls._made


class _Metrics:
    """One model's Prometheus metrics through ray.serve.metrics (tag `model`: its deployment name,
    e.g. Translator, also when it is placed in the Ingress); silently absent outside Serve."""

    def __init__(self, deployment: str):
        self._on: Optional[_Instruments] = None
        self._tags = {"model": deployment}
        try:
            from ray.serve import context

            if context._get_internal_replica_context() is None:
                return  # not inside a Serve replica (unit tests drive the class directly)
            self._on = _Instruments.get()
        except Exception:  # pragma: no cover - metrics must never stop a replica
            logger.exception("%s: Prometheus metrics unavailable", deployment)

    def observe_batch(self, records: int, seconds: float) -> None:
        if self._on is not None:
            self._on.batch_records.observe(records, tags=self._tags)
            self._on.model_seconds.observe(seconds, tags=self._tags)
            self._on.records.inc(records, tags=self._tags)

    def observe_queue_wait(self, seconds: float) -> None:
        if self._on is not None:
            self._on.queue_wait.observe(seconds, tags=self._tags)

    def count_enqueued(self, records: int) -> None:
        if self._on is not None and records:
            self._on.enqueued.inc(records, tags=self._tags)

    def count_cancelled(self, records: int) -> None:
        if self._on is not None and records:
            self._on.cancelled.inc(records, tags=self._tags)

    def failed(self) -> None:
        if self._on is not None:
            self._on.failures.inc(tags=self._tags)


class _TrackedBatchMethod:
    """Wraps a replica's `@serve.batch` method (the intake: it hands each call to the model queue and
    returns the call's model-queue future) and awaits the call's result: `(output, records of the
    batch it rode in)`. Counts calls cancelled before their batch started (never computed) and
    observes how long each waited.

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
        records = _records_of(item)
        enqueued_at = time.perf_counter()
        replica._stats["enqueued"] += records
        replica._metrics.count_enqueued(records)
        interactive = self._priority == Priority.INTERACTIVE
        if interactive:
            replica._interactive_calls += 1
            replica._interactive_idle.clear()
        queued: Optional[Future] = None
        try:
            queued = await self._method(item)
            output, batch_records, started_at = await asyncio.wrap_future(queued)
            replica._metrics.observe_queue_wait(started_at - enqueued_at)
            return output, batch_records
        except asyncio.CancelledError:
            # Still in Serve's intake, or in the model queue and not started: dropped, never computed.
            if queued is None or queued.cancelled():
                replica._stats["cancelled"] += records
                replica._metrics.count_cancelled(records)
            raise
        finally:
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
        # One thread runs the model so the replica's event loop keeps accepting calls while a
        # batch computes; it joins every call waiting for it into the next batch (up to the live
        # max_batch_size), interactive calls ahead of background (job) calls.
        self._model_thread = ModelQueue(f"{self.deployment_name}-model", on_batch=self._batch_finished)
        self._loop: Optional[asyncio.AbstractEventLoop] = None  # the replica's, seen at the first call
        self._failures_in_a_row = 0
        self._last_error: Optional[str] = None
        self._metrics = _Metrics(self.deployment_name)
        #: in-process tallies of records: entered the queue, computed, cancelled while queued
        self._stats = {"enqueued": 0, "computed": 0, "cancelled": 0,
                       "computed_interactive": 0, "computed_background": 0,
                       # CPU seconds of the model thread inside model calls (bench/overhead.py
                       # subtracts it from the replica's CPU to find Serve's share)
                       "model_cpu_s": 0.0}
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

    def stats(self) -> dict:
        """Records this replica queued, computed and dropped (cancelled while queued), and the
        model thread's CPU seconds in model calls (`model_cpu_s`)."""
        return dict(self._stats)

    def _apply_batch_config(self) -> None:
        self._model_thread.fill_wait_fraction = self.batch_config.batch_fill_wait_fraction
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
        return self._cap_for(Priority.BACKGROUND if _is_background(method) else Priority.INTERACTIVE, size)

    def _cap_for(self, priority: int, size: int) -> int:
        """Most records in one batch of `priority`: `size`, capped by background_max_batch_size
        for job (background) work."""
        cap = self.batch_config.background_max_batch_size
        if cap is not None and priority >= Priority.BACKGROUND:
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

    def _enqueue(self, items: list[Any], compute: Compute, priority: Priority = Priority.INTERACTIVE) -> list[Future]:
        """The body of a `@serve.batch` intake method: hand each call to the model queue, which
        runs `compute` (on the model thread) over the calls it joins into one batch; returns the
        calls' futures (Serve hands each caller its own)."""
        self._loop = asyncio.get_running_loop()
        cap = self._cap_for(priority, self.live_max_batch_size())
        return [self._model_thread.submit(compute, item, _records_of(item), priority, cap) for item in items]

    async def _enqueue_background(self, items: list[Any], compute: Compute) -> list[Future]:
        """`_enqueue` for job work, once no interactive call is queued or computing on this replica:
        an interactive request never waits behind more than the job batch already computing."""
        while self._interactive_calls:
            await self._interactive_idle.wait()
        return self._enqueue(items, compute, Priority.BACKGROUND)

    def _batch_finished(self, outcome: BatchOutcome) -> None:
        """On the model thread, after each batch: the bookkeeping goes to the replica's loop (before
        the callers' results, which are set after this returns)."""
        self._stats["model_cpu_s"] += outcome.cpu_seconds
        loop = self._loop
        if loop is None:
            self._record_batch(outcome)
            return
        try:
            loop.call_soon_threadsafe(self._record_batch, outcome)
        except RuntimeError:  # pragma: no cover - the loop closed: the replica is shutting down
            pass

    def _record_batch(self, outcome: BatchOutcome) -> None:
        if outcome.failed:
            self._failures_in_a_row += 1
            self._last_error = repr(outcome.error)
            self._metrics.failed()
            return
        self._failures_in_a_row = 0
        self._stats["computed"] += outcome.records
        background = outcome.priority >= Priority.BACKGROUND
        self._stats["computed_background" if background else "computed_interactive"] += outcome.records
        self._metrics.observe_batch(outcome.records, outcome.seconds)
        if self._sizer is not None:
            self._sizer.observe(outcome.seconds, outcome.records)

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
