"""A model replica's intake: its `@serve.batch` methods, each with a queue of the replica's own, wrapped so that
every call is counted (enqueued, computed, dropped), timed in the queue and, alone on the replica, sent straight
to the model queue. deployments/replica.py wires them in."""

from __future__ import annotations

import asyncio
import time
import types
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, Optional

from .priority import Priority

if TYPE_CHECKING:
    from .replica import ModelReplica

SERVE_REFUSED_ITEM = "Size of item is greater than max_batch_size"  # Serve 2.60's refusal (ray/serve/batching.py)


def refused(exc: BaseException) -> bool:
    """Serve's refusal of a queued item larger than its queue's max_batch_size: nothing of it was computed."""
    return isinstance(exc, RuntimeError) and str(exc).startswith(SERVE_REFUSED_ITEM)


class Ticket:
    """One call through the intake, as `ModelReplica._enqueue` finds it (`replica._tickets`, by the item's id): its
    caller gone (`abandoned`: never handed to the model queue), and its model-queue future once it was."""

    __slots__ = ("abandoned", "future")

    def __init__(self) -> None:
        self.abandoned, self.future = False, None


def abandoned() -> Future:
    """The model-queue future of a call that was never sent there (`ModelReplica._enqueue`): cancelled."""
    future: Future = Future()
    future.cancel()
    return future


class TrackedBatchMethod:
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

    async def __call__(self, item: Any, counted: bool = False) -> Any:
        """`counted`: the records were counted enqueued already (a piece cut again after the intake
        refused it for a live batch size that shrank: `ModelReplica._submit_pieces`)."""
        replica = self._replica
        replica._loop = asyncio.get_running_loop()  # from the first call on, reconfigure applies on this loop
        records = records_of(item)
        enqueued_at = time.perf_counter()
        if not counted:
            self._count_enqueued(records)
        interactive = self._priority == Priority.INTERACTIVE
        if interactive:
            replica.interactive.enter()
        # Shielded, and ticketed: a call cancelled in Serve's intake is never handed to the model queue after that
        # (`_enqueue` sees its ticket abandoned), and one already handed over is taken out of it at once if no batch
        # took it yet: a record is counted either computed or dropped, and a dropped one is never computed. (A
        # callback on the intake's end came a loop turn after the hand-over: an idle model thread had taken it.)
        tickets, ticket = replica._tickets, Ticket()
        tickets[id(item)] = ticket
        intake = asyncio.ensure_future(self._intake(item))
        intake.add_done_callback(lambda _: tickets.pop(id(item)) if tickets.get(id(item)) is ticket else None)
        try:
            queued = await asyncio.shield(intake)
            output, batch_records, started_at = await asyncio.wrap_future(queued)
            replica.metrics.observe_queue_wait(started_at - enqueued_at)
            return output, batch_records
        except asyncio.CancelledError:
            ticket.abandoned = True
            if ticket.future is None or ticket.future.cancel():  # never handed over, or not started: never computed
                self._count_dropped(records)
            raise
        except Exception as exc:
            # The intake raised before the model queue had the call (its thread shut down, Serve's batch queue failed):
            # never computed, so failed. A piece Serve refused is its caller's to count: it may be cut and sent again
            # (ModelReplica._submit_pieces). Once the model queue has it, the batch's bookkeeping counts it.
            if ticket.future is None and not refused(exc):
                replica._count_failed(records)
            raise
        finally:
            if interactive:
                replica.interactive.leave()

    async def _intake(self, item: Any) -> Future:
        """Through `@serve.batch`, or, for an interactive call alone on the replica, straight to the
        model queue as a batch of one (`skip_batch_wait_when_alone`). One loop turn first: calls that
        arrived together are all counted by then, and batch as before."""
        replica = self._replica
        if self._priority == Priority.INTERACTIVE and replica.batch_config.skip_batch_wait_when_alone:
            await asyncio.sleep(0)
            if replica.interactive.calls == 1 and replica._model_thread.alone():
                return (await self._method.__wrapped__(replica, [item]))[0]
        return await self._method(item)

    def _count_enqueued(self, records: int) -> None:
        self._replica._stats["enqueued"] += records
        self._replica.metrics.count_enqueued(records)

    def _count_dropped(self, records: int) -> None:
        self._replica._stats["cancelled"] += records
        self._replica.metrics.count_cancelled(records)


def own_queue(method: Any, replica: Any) -> Any:
    """`method` (a `@serve.batch` method of the replica's class) with a batch queue of this object's own.
    Serve keeps one queue per decorated function, shared by every object of the class, and runs a batch
    with its first call's object: two of your own models placed in one Ingress computed each other's
    calls, and reconfiguring one resized the other's queue."""
    from ray import serve

    settings = method.set_max_batch_size.__self__  # Serve's _LazyBatchQueueWrapper: the decorator's knobs
    own = serve.batch(max_batch_size=settings.max_batch_size, batch_wait_timeout_s=settings.batch_wait_timeout_s,
                      max_concurrent_batches=settings.max_concurrent_batches,
                      batch_size_fn=settings.batch_size_fn)(method.__wrapped__)
    return types.MethodType(own, replica)


def records_of(item: Any) -> int:
    texts = getattr(item, "texts", item)
    try:
        return len(texts)
    except TypeError:  # pragma: no cover
        return 1
