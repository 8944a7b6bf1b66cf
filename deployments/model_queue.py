"""A replica's model thread and the queue in front of it: the batches the model computes.

Calls (an item of records and the function that computes a list of items) wait here by
`Priority` (deployments/priority.py); the thread joins what waits into the next batch. No Ray,
no asyncio: the replica (deployments/replica.py) hands calls in and awaits their futures.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Callable, Optional, Union

from .backends.libc import name_native_thread
from .batching import RanAlone
from .errors import ReplicaStopped, deliverable
from .priority import Priority

logger = logging.getLogger("ray.serve")

#: Batches `ModelQueue.alone` looks back on.
RECENT_BATCHES = 8

#: A model call still running after this long is taken for hung (a native deadlock, a device that stopped
#: answering): `ModelQueue.check` fails the replica's health check, so Serve replaces it. Far above any
#: batch this project measured (the slowest, a degenerate input decoded to its cap, took 34 s).
HUNG_BATCH_S = 600.0

#: The largest call (in records) kept as the known-good call that a batch whose every call failed is
#: checked against (`ModelQueue._proves_the_model`): its cost is paid once per such batch.
KNOWN_GOOD_MAX_RECORDS = 4

#: What a batch computation returns for one of its calls: the call's output or the exception it gets.
Compute = Callable[[list], list]


class _Entry:
    """One call waiting for the model: its item, records, the computation it joins, and its future."""

    __slots__ = ("item", "records", "compute", "cap", "future")

    def __init__(self, item: Any, records: int, compute: Compute, cap: Union[int, Callable[[], int]]):
        self.item, self.records, self.compute, self.cap = item, records, compute, cap
        self.future: Future = Future()


@dataclass(frozen=True)
class BatchOutcome:
    """One computation the model thread ran: what the replica's bookkeeping needs."""

    priority: int
    records: int
    seconds: float
    cpu_seconds: float
    #: every call of the batch failed
    failed: bool
    error: Optional[BaseException] = None
    #: every call failed, but the last call that had succeeded, as large as this batch and computed again
    #: right after, succeeded again: the inputs were bad, not the model
    inputs_blamed: bool = False
    #: the batch was full: at its cap, or the next waiting call did not fit (`ModelQueue._next_batch`)
    full: bool = False
    #: some call failed on its own: the batch ran again call by call, so `seconds` is not one batch's time
    rerun: bool = False
    #: of `records`, those of calls that failed on their own (the rest were computed)
    failed_records: int = 0


class ModelQueue:
    """The replica's model thread and the queue in front of it.

    Callers submit *calls*, one or several at once (an item of records and the function that computes a list of
    items). Each time the thread is free it takes the oldest waiting call of the highest priority and joins to it,
    in arrival order, every other waiting call of that priority and function while their records fit the first
    call's `cap` (its queue's live `max_batch_size`), then runs the function once over all of them.

    That join is what makes the batch size follow the load: `@serve.batch` (Ray 2.60) forms its next batch from what
    arrives in `batch_wait_timeout_s` *while the previous batch is still computing*, so behind a slow model it hands
    over a string of one- or two-record batches (measured: 32 concurrent requests computed as 1-2 record batches, a
    1 s model call each). Joined here, everything that arrived while the model was busy rides in the next call.

    A call cancelled before its batch started (its caller gave up) is skipped, never computed. `on_batch(outcome)`
    is called on the model thread after each computation.
    """

    def __init__(self, name: str = "model", on_batch: Optional[Callable[[BatchOutcome], None]] = None,
                 fill_wait_fraction: float = 0.0):
        self._waiting: dict[int, deque[_Entry]] = {}
        self._ready = threading.Condition()
        self._closed = False
        self._on_batch = on_batch
        #: after a batch of T seconds, wait up to fraction x T for a fuller next batch (see `_fill_deadline`)
        self.fill_wait_fraction = fill_wait_fraction
        self._last_batch_s, self._last_batch_end, self._last_priority = 0.0, 0.0, None
        self._running = False  # a batch is computing
        self._batch_started: Optional[float] = None  # when the computing batch started (time.monotonic)
        #: calls in each of the last batches: all 1 means nothing has come in together lately
        self._recent_calls: deque[int] = deque(maxlen=RECENT_BATCHES)
        #: (computation, item, records) of the last call of at most KNOWN_GOOD_MAX_RECORDS records that succeeded
        self._known_good: Optional[tuple[Compute, Any, int]] = None
        self._thread = threading.Thread(target=self._work, name=name, daemon=True)
        self._thread.start()

    def submit(self, compute: Compute, item: Any, records: int = 1, priority: int = Priority.INTERACTIVE,
               cap: Union[int, Callable[[], int], None] = None) -> Future:
        """Queue one call; its future resolves to `(output, records of its batch, the batch's start on perf_counter)`
        or raises its exception. `cap`: the most records of a batch it starts (a function: read as the batch starts)."""
        return self.submit_all(compute, [(item, records)], priority, cap)[0]

    def submit_all(self, compute: Compute, calls: list[tuple[Any, int]], priority: int = Priority.INTERACTIVE,
                   cap: Union[int, Callable[[], int], None] = None) -> list[Future]:
        """Queue `(item, records)` calls at once, as `submit` each: the thread sees all of them or none, so
        calls handed over together (a `@serve.batch` batch) are not split by the thread waking between two."""
        fixed = cap if cap is None or callable(cap) else max(int(cap), 1)
        entries = [_Entry(item, records, compute, records if fixed is None else fixed) for item, records in calls]
        with self._ready:
            if self._closed:
                raise ReplicaStopped("the model thread is shut down")
            self._waiting.setdefault(int(priority), deque()).extend(entries)
            self._ready.notify()
        return [entry.future for entry in entries]

    def waiting(self) -> dict[int, int]:
        """Calls waiting (not computing), by priority."""
        with self._ready:
            counts = {p: sum(not e.future.cancelled() for e in q) for p, q in self._waiting.items()}
            return {p: n for p, n in counts.items() if n}

    def alone(self) -> bool:
        """Nothing computing, nothing waiting, and each of the last `RECENT_BATCHES` batches was one call:
        a call now has no company coming, so waiting for a batch to fill would only add latency."""
        with self._ready:  # a Condition over an RLock: `waiting()` takes it again
            return not self._running and all(n == 1 for n in self._recent_calls) and not self.waiting()

    def check(self, hung_after_s: float = HUNG_BATCH_S) -> None:
        """Raise if the model thread can compute nothing more: it has stopped, or its batch has been
        computing for over `hung_after_s` (every call behind it would wait until its deadline)."""
        started = self._batch_started
        running_s = 0.0 if started is None else time.monotonic() - started
        if running_s > hung_after_s:
            raise RuntimeError(f"{self._thread.name}: a model call has been running for "
                               f"{running_s:.0f} s (over {hung_after_s:g} s): taken for hung")
        if not self._thread.is_alive() and not self._closed:
            raise RuntimeError(f"{self._thread.name}: the model thread has stopped")

    def shutdown(self) -> None:
        """The thread computes the calls already waiting, then ends; later ones are refused (ReplicaStopped)."""
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
            records = spanned = cap = 0
            full = False
            for entry in self._waiting[priority]:
                if entry.future.cancelled():
                    spanned += 1
                    continue
                if batch and entry.compute != batch[0].compute:
                    break
                if batch and records + entry.records > cap:
                    full = True
                    break
                if not batch:  # the cap as it is now (the live size may have backed off since the call was queued)
                    cap = max(int(entry.cap()), 1) if callable(entry.cap) else entry.cap
                batch.append(entry)
                records += entry.records
                spanned += 1
            if batch:
                return priority, batch, spanned, full or records >= cap
            self._waiting[priority].clear()  # only cancelled calls were left
        return 0, [], 0, False

    def _fill_deadline(self) -> Optional[float]:
        """Under the lock: when to stop waiting for a fuller batch, or None to start now. It waits only
        right after a batch of the same priority (up to fill_wait_fraction of its model time, counted from its
        end: a long job batch does not hold back the interactive call that waited through it) and only while
        the next batch is not full."""
        if not self.fill_wait_fraction or not self._last_batch_s:
            return None
        deadline = self._last_batch_end + self.fill_wait_fraction * self._last_batch_s
        if time.perf_counter() >= deadline:
            return None
        priority, batch, _, full = self._next_batch()
        return deadline if batch and not full and priority == self._last_priority else None

    def _take(self) -> tuple[int, list[_Entry], bool]:
        """Under the lock: take the next batch (see `_next_batch`) off the queue and mark it running."""
        while True:
            priority, batch, spanned, full = self._next_batch()
            for _ in range(spanned):
                self._waiting[priority].popleft()
            # A call cancelled since `_next_batch` looked is dropped here, never computed; if that
            # emptied the batch, look again rather than sleep with calls still waiting.
            running = [e for e in batch if e.future.set_running_or_notify_cancel()]
            if running or not batch:
                return priority, running, full

    def _work(self) -> None:
        name_native_thread(self._thread.name)
        while True:
            with self._ready:
                while True:
                    deadline = None if self._closed else self._fill_deadline()
                    if deadline is not None:
                        self._ready.wait(max(0.0, deadline - time.perf_counter()))
                        continue
                    priority, batch, full = self._take()
                    if batch or self._closed:
                        break
                    self._ready.wait()
                self._running = bool(batch)
            if not batch:
                return
            try:
                self._run(priority, batch, full)
            finally:
                self._finished(batch)

    def _finished(self, batch: list[_Entry]) -> None:
        """The thread is free again: once per batch, before its callers are answered (one just answered sees it)."""
        with self._ready:
            if self._running:
                self._running = False
                self._recent_calls.append(len(batch))

    def _run(self, priority: int, batch: list[_Entry], full: bool = False) -> None:
        records = sum(e.records for e in batch)
        start, cpu_start = time.perf_counter(), time.thread_time()
        error: Optional[BaseException] = None
        ran_alone, self._batch_started = False, time.monotonic()
        try:
            raw = batch[0].compute([e.item for e in batch])
            ran_alone, outputs = isinstance(raw, RanAlone), list(raw)
            if len(outputs) != len(batch):
                raise RuntimeError(f"batch computation returned {len(outputs)} outputs for {len(batch)} calls")
        except BaseException as exc:  # handed to every caller of the batch
            error, outputs = exc, [exc] * len(batch)
        finally:
            self._batch_started = None
        end = time.perf_counter()
        seconds, cpu_seconds = end - start, time.thread_time() - cpu_start
        with self._ready:
            self._last_batch_s, self._last_batch_end, self._last_priority = seconds, end, priority
        failed = all(isinstance(out, BaseException) for out in outputs)
        # Each call's own exception (values, not one raised): the batch ran again call by call (run_joined,
        # run_grouped), so each failed at its own size, and the proof needs a call that large, not the batch.
        rerun = error is None and (ran_alone or any(isinstance(out, BaseException) for out in outputs))
        alone = failed and rerun and len(batch) > 1
        if failed and error is None:
            error = outputs[0]
        blamed = failed and self._proves_the_model(max(e.records for e in batch) if alone else records)
        if not failed:
            self._remember_good(batch, outputs)
        if self._on_batch is not None:
            try:
                failed_records = sum(e.records for e, o in zip(batch, outputs) if isinstance(o, BaseException))
                self._on_batch(BatchOutcome(priority, records, seconds, cpu_seconds, failed, error, blamed, full,
                                            rerun, failed_records))
            except Exception:  # pragma: no cover - bookkeeping must never lose a result
                logger.exception("model batch bookkeeping failed")
        self._finished(batch)
        for entry, out in zip(batch, outputs):
            if isinstance(out, BaseException):
                entry.future.set_exception(deliverable(out))
            else:
                entry.future.set_result((out, records, start))

    def _remember_good(self, batch: list[_Entry], outputs: list) -> None:
        for entry, out in zip(batch, outputs):
            if entry.records <= KNOWN_GOOD_MAX_RECORDS and not isinstance(out, BaseException):
                self._known_good = (entry.compute, entry.item, entry.records)

    def _proves_the_model(self, records: int) -> bool:
        """After a batch of `records` whose every call failed: if the known-good call is as large, compute it
        again (on this thread, before the failed callers are answered). True if it succeeds: the model
        computes a batch that size, so the inputs were bad. A larger batch proves nothing about its size
        (memory), and its failure stands."""
        if self._known_good is None or self._known_good[2] < records:
            return False
        compute, item, _ = self._known_good
        self._batch_started = time.monotonic()
        try:
            outputs = list(compute([item]))
            return len(outputs) == 1 and not isinstance(outputs[0], BaseException)
        except BaseException:  # noqa: BLE001 - as in `_run`: the batch's failure stands, the thread goes on
            return False
        finally:
            self._batch_started = None

