"""What every model deployment shares: thread sizing, the intake into the model queue, batch knobs.

A model deployment (Translator, Embedder, CustomModel) subclasses `ModelReplica`. Its pieces, each in its own module:
the intake through `@serve.batch` (intake.py), the model thread and its queue (model_queue.py), interactive calls
before job work (priority.py), health (health.py), metrics (metrics.py), its `user_config`'s batch knobs
(batch_config.py), the SLO-adaptive size (adaptive_batching.py).
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
from concurrent.futures import Future
from typing import Any, Callable, Optional

from .adaptive_batching import AIMDBatchSizer, AIMDSettings
from .batch_config import BatchConfig, parse_batch_config
from .batching import gather_or_cancel, split
from .health import ReplicaHealth
from .intake import Ticket, TrackedBatchMethod, abandoned, own_queue, records_of, refused
from .metrics import ReplicaMetrics
from .model_queue import BatchOutcome, Compute, ModelQueue
from .priority import InteractiveGate, Priority, cap_for, priority_of

logger = logging.getLogger("ray.serve")


def _running_loop() -> Optional[asyncio.AbstractEventLoop]:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


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


#: how long `reconfigure` (on Serve's worker thread) waits for a busy loop to apply a deploy's knobs
RECONFIGURE_TIMEOUT_S = 60.0


class _PendingApply:
    """A deploy's knobs to apply on the replica's loop, or never: once its waiter has given up (and Serve reported the
    deploy failed), a loop that frees up later must not apply them after all."""

    def __init__(self, apply: Callable[[], None]):
        self._apply, self._lock, self._state = apply, threading.Lock(), "pending"
        self._done = threading.Event()

    async def run(self) -> None:
        with self._lock:
            if self._state != "pending":
                return
            try:
                self._apply()
                self._state = "applied"
            except BaseException as exc:  # noqa: BLE001 - the waiter raises it
                self._state = exc
            finally:
                self._done.set()

    def wait(self, timeout_s: float) -> None:
        """Until applied (raising what applying raised), or TimeoutError, after which it is never applied."""
        self._done.wait(timeout_s)
        with self._lock:
            if self._state == "pending":
                self._state = "abandoned"
                raise TimeoutError(f"the replica's event loop did not apply the new batch config within "
                                   f"{timeout_s:g} s (it is busy): not applied")
            if isinstance(self._state, BaseException):
                raise self._state


class ModelReplica:
    """Base of the model deployments. Subclasses set `deployment_name` and `_batched_methods`."""

    deployment_name = "model"
    default_batch: BatchConfig

    def _init_replica(self) -> None:
        # One thread runs the model so the replica's event loop keeps accepting calls while a
        # batch computes; it joins every call waiting for it into the next batch (up to the live
        # max_batch_size), interactive calls ahead of background (job) calls.
        self._model_thread = ModelQueue(f"{self.deployment_name}-model", on_batch=self._batch_finished)
        self._loop: Optional[asyncio.AbstractEventLoop] = None  # the replica's, set by the intake at the first call
        self.health = ReplicaHealth(self.deployment_name)
        self.metrics = ReplicaMetrics(self.deployment_name)
        #: in-process tallies of records: entered the queue, computed, cancelled while queued, failed in the model
        self._stats = {"enqueued": 0, "computed": 0, "cancelled": 0, "failed": 0,
                       "computed_interactive": 0, "computed_background": 0,
                       # CPU seconds of the model thread inside model calls (the overhead probe,
                       # docs/benchmarks/overhead.md, subtracted it from the replica's CPU)
                       "model_cpu_s": 0.0}
        #: the intake's calls in flight, by their item's id (deployments/intake.py Ticket)
        self._tickets: dict[int, Ticket] = {}
        # Interactive calls queued or computing; background batches wait until there are none.
        self.interactive = InteractiveGate()
        for method in self._batched_methods():
            setattr(self, method.__name__, TrackedBatchMethod(self, own_queue(method, self), priority_of(method)))
        self.batch_config = self.default_batch
        self._sizer: Optional[AIMDBatchSizer] = None  # SLO-adaptive batch size, when configured
        self._apply_batch_config()
        self.ready_at = time.time()

    def _batched_methods(self) -> list[Any]:
        """Every `@serve.batch` method (reconfigure sets their batch knobs)."""
        raise NotImplementedError

    def stats(self) -> dict:
        """Records this replica queued, computed and dropped (cancelled while queued), and the
        model thread's CPU seconds in model calls (`model_cpu_s`)."""
        return dict(self._stats)

    def _apply_batch_config(self, batch_config: Optional[BatchConfig] = None) -> None:
        self.batch_config = batch_config or self.batch_config
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
        return cap_for(priority_of(method), size, self.batch_config.background_max_batch_size)

    def live_max_batch_size(self) -> int:
        """The batch size in force: the adaptive controller's, else the configured max_batch_size."""
        sizer = self._sizer  # (once: reconfigure, on a worker thread, may replace it)
        return sizer.size if sizer is not None else self.batch_config.max_batch_size

    async def _submit_pieces(self, batched: Any, records: list, make_item: Callable[[list], Any]) -> list:
        """Cut `records` into pieces of the live batch size, submit each (`make_item(piece)`) to the
        `@serve.batch` method `batched` at once, and return the results in order (one per piece).

        Serve refuses a queued item larger than max_batch_size: if the adaptive size shrank under a
        piece while it waited, the piece is cut again to the new size and resubmitted.
        """
        async def submit(piece: list, counted: bool = False) -> list:
            try:
                return [await batched(make_item(piece), counted=counted)]
            except RuntimeError as exc:
                # Serve's refusal only: a model's own RuntimeError (torch's out of memory, a broken contract)
                # is its caller's answer, not a reason to compute the piece again in parts
                if not refused(exc):
                    raise
                size = self._size_for(batched, self.live_max_batch_size())
                if len(piece) <= size:  # refused at a size since grown back: not cut again, and never computed
                    self._count_failed(len(piece))
                    raise
                parts = await gather_or_cancel(*(submit(part, counted=True) for part in split(piece, size)))
                return [result for part in parts for result in part]

        size = self._size_for(batched, self.live_max_batch_size())
        pieces = await gather_or_cancel(*(submit(piece) for piece in split(records, size)))
        return [result for piece in pieces for result in piece]

    def reconfigure(self, user_config: dict) -> None:
        """Serve calls this with the deployment's user_config at start and on every `serve deploy`, on a worker
        thread. Once calls have come, the new knobs are applied on the replica's loop, where the adaptive sizer
        sets the live size after each batch: applied on the worker thread, a size set between the two could leave
        Serve's queue at another size than the live one."""
        batch_config = parse_batch_config(user_config, self.deployment_name)
        loop = self._loop
        if loop is None or not loop.is_running() or _running_loop() is loop:
            self._apply_batch_config(batch_config)
        else:  # waits at most as long as Serve's own reconfigure timeout would let it
            pending = _PendingApply(lambda: self._apply_batch_config(batch_config))
            asyncio.run_coroutine_threadsafe(pending.run(), loop)
            pending.wait(RECONFIGURE_TIMEOUT_S)
        logger.info("%s batch config: %s", self.deployment_name, batch_config.model_dump())

    def _enqueue(self, items: list[Any], compute: Compute, priority: Priority = Priority.INTERACTIVE) -> list[Future]:
        """The body of a `@serve.batch` intake method: hand each call to the model queue, which
        runs `compute` (on the model thread) over the calls it joins into one batch; returns the
        calls' futures (Serve hands each caller its own)."""
        cap = lambda: cap_for(priority, self.live_max_batch_size(), self.batch_config.background_max_batch_size)  # noqa
        tickets = [self._tickets.get(id(item)) for item in items]  # (intake.py: a call whose caller left is not sent)
        gone = [ticket is not None and ticket.abandoned for ticket in tickets]
        sent = iter(self._model_thread.submit_all(
            compute, [(item, records_of(item)) for item, left in zip(items, gone) if not left], priority, cap))
        futures = [abandoned() if left else next(sent) for left in gone]
        for ticket, future in zip(tickets, futures):
            if ticket is not None:
                ticket.future = future
        return futures

    async def _enqueue_background(self, items: list[Any], compute: Compute) -> list[Future]:
        """`_enqueue` for job work, once no interactive call is queued or computing on this replica:
        an interactive request never waits behind more than the job batch already computing."""
        await self.interactive.wait_idle()
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
        self._count_failed(outcome.records if outcome.failed else outcome.failed_records)  # (callers got the error)
        if outcome.failed:
            self.metrics.failed()
            if not outcome.inputs_blamed:  # (blamed: the model computed as large a known-good call right after)
                self.health.failed(outcome.error)
                # maybe its size (out of memory): the adaptive size backs off, or a request cut to that size
                # fails again and again, until the health check gives the replica up (and its successor)
                if (sizer := self._sizer) is not None and outcome.priority < Priority.BACKGROUND:
                    sizer.observe(math.inf, outcome.records, outcome.full)
            return
        self.health.succeeded()
        background, done = outcome.priority >= Priority.BACKGROUND, outcome.records - outcome.failed_records
        self._stats["computed"] += done  # (not the records of calls that failed alone)
        self._stats["computed_background" if background else "computed_interactive"] += done
        self.metrics.observe_batch(outcome.records, outcome.seconds, outcome.failed_records)
        # no evidence for the interactive size: job batches (capped apart), a rerun whose calls failed alone (bad
        # inputs); a rerun whose calls all then succeeded failed at its size (out of memory): over the target
        if (sizer := self._sizer) is not None and not background and not (outcome.rerun and outcome.failed_records):
            sizer.observe(math.inf if outcome.rerun else outcome.seconds, outcome.records, outcome.full)

    def _count_failed(self, records: int) -> None:
        """Records that will never be computed, their callers answered with an error."""
        self._stats["failed"] += records
        self.metrics.count_failed(records)

    def check_health(self) -> None:
        """Serve calls this every health_check_period_s; raising marks the replica unhealthy."""
        self.health.check()
        self._model_thread.check()  # a model thread stopped or stuck in one call computes nothing more

    def __del__(self) -> None:
        """Serve calls this at the end of a graceful shutdown (see ReplicaHealth.shut_down)."""
        self._shut_down()

    def _shut_down(self) -> None:
        """The replica's teardown (Serve's graceful shutdown is over): its health check fails from now on and what
        computes for it stops, without blocking the event loop it runs on. (Its parts are None where the constructor
        failed before making them.) The model queue computes the calls it holds; later ones are refused."""
        health = getattr(self, "health", None)
        if health is not None:
            health.shut_down()
        queue = getattr(self, "_model_thread", None)
        if queue is not None:
            queue.shutdown()

    def batching_info(self) -> dict:
        info = self.batch_config.user_config()
        if self._sizer is not None:
            info["adaptive"] = self._sizer.snapshot()
        return info
