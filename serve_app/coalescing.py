"""Fewer, fuller calls across the ingress -> model hop: concurrent requests' records share a call.

Every handle call costs Serve CPU on both sides (task submission, the replica's receive and
reply): on 2 cores it was most of Serve's ~15 ms per one-record request
(docs/benchmarks/overhead.md). A `CallCoalescer` keeps at most `max_inflight_calls` calls in
flight to one model method from this process. Below that a call goes out at once, so a lone
request waits for nothing; at it, the records of new calls wait and join one pending call per
key (e.g. per language pair) of up to `max_records`, which goes out as soon as a call returns.
This is group commit: the busier the model, the more records ride in each call.

The callers' view is unchanged: `submit(key, records)` returns the result for exactly these
records, as a direct call with them would. A caller that gives up (deadline, client gone)
before its call went out is dropped from it; a call already sent is cancelled only when every
caller in it has gone. An error that one caller's records may have caused (the model raised on them,
or refused them) is not handed to the others: each caller's records go again in a call of their own, so
a bad input fails only its own request, whoever it shared a call with (also one who left since: its
records were in the call). Those calls of their own take at most `max_inflight_calls` more calls in flight,
are counted like any call, and end with their caller. The service's own errors (503 unavailable or
overloaded, 504 deadline) reach every caller of the call.

An input that crashes the replica's process (a segfault, the OOM killer, a custom model's os._exit) is one
caller's too, but it looks like a replica lost to anything else. With `isolate_replica_deaths` (a model behind
a HandleClient) a call of several callers is not retried by the client when its replica dies (ReplicaLost);
each caller's records go again alone instead, as that call's one retry, and one caller at a time: sent together
they could land on one replica, and the crashing input would take the others' retries down with it. So the
crashing input costs two replicas, as a retried call of its own does, and the other callers are answered. The
price, after a replica lost to anything else: those callers are answered one call after another, not in one, and
those not sent again within `replica_retry_timeout_s` get the 503 of the lost replica. (Within one shared call: the
other calls the dead replica held go again at the same time.)
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import logging
from collections import deque
from typing import Any, AsyncContextManager, Awaitable, Callable, Hashable, Optional, Sequence

from deployments.errors import describe_exception

from .errors import InternalError, ReplicaLost, ServeAppError

logger = logging.getLogger("serve_app")


def shared_task(coro: Awaitable[Any]) -> "asyncio.Task[Any]":
    """A task for a call that several callers share, in an empty context: Serve files a handle call under the
    request in whose context it is made and cancels it when that request's client goes away, which would fail
    every other caller awaiting it."""
    return asyncio.get_running_loop().create_task(coro, context=contextvars.Context())


def _one_caller_s(exc: BaseException) -> bool:
    """An error that one caller's records may have caused: not the service's state, which all share."""
    return isinstance(exc, ServeAppError) and exc.status_code not in (503, 504)


class _Waiter:
    __slots__ = ("records", "future", "start", "stop", "alone")

    def __init__(self, records: Sequence, future: asyncio.Future):
        self.records, self.future = records, future
        self.start = self.stop = 0
        #: its records' call of their own, after the call it shared failed
        self.alone: Optional[asyncio.Task] = None


class _Call:
    """One pending (then in-flight) call: its key and the callers whose records it carries."""

    __slots__ = ("key", "waiters", "records", "task")

    def __init__(self, key: Hashable):
        self.key = key
        self.waiters: list[_Waiter] = []
        self.records = 0
        self.task: Optional[asyncio.Task] = None


class CallCoalescer:
    """Group commit for one model method (see the module docstring).

    `send(key, records)` makes the real call; `slice_result(result, start, stop)` cuts a call's
    result down to the records [start, stop) of it (one caller's share). With `isolate_replica_deaths`,
    `send` also takes HandleClient.call's keywords `retry_on_replica_death` and `after_replica_death`.
    """

    def __init__(self, send: Callable[..., Awaitable[Any]], slice_result: Callable[[Any, int, int], Any], *,
                 max_records: int, max_inflight_calls: int, isolate_replica_deaths: bool = False,
                 replica_retry_timeout_s: float = 8.0, refuse: Optional[Callable[[Hashable, Sequence], None]] = None,
                 died: Optional[Callable[[Hashable, Sequence], Optional[Exception]]] = None,
                 hold: Optional[Callable[[Hashable, Sequence], AsyncContextManager]] = None):
        if max_records < 1 or max_inflight_calls < 1:
            raise ValueError(f"max_records and max_inflight_calls must be >= 1, got {max_records!r} "
                             f"and {max_inflight_calls!r}")
        self._send, self._slice, self._isolate = send, slice_result, isolate_replica_deaths
        #: `refuse(key, records)` raises for a caller's records that must not be sent (a model's crash quarantine);
        #: `died(key, records)` counts a shared call's replica death against one caller's records: the error to give
        #: that caller instead of sending them again, if any
        #: `hold(key, records)`: an async context a caller waits in (a placed model's crash journal, which may refuse)
        self._refuse, self._died, self._hold = refuse, died, hold
        self.max_records, self.max_inflight_calls = max_records, max_inflight_calls
        #: after a replica death, how long a shared call's callers go again one at a time; the rest then get its 503
        self.replica_retry_timeout_s = replica_retry_timeout_s
        self._filling: dict[Hashable, _Call] = {}  # per key, the pending call new records join
        self._pending: deque[_Call] = deque()  # pending calls in the order they were opened
        self.inflight = 0
        #: calls of one caller's records after a shared call failed, in flight at once at most
        self._alone_slots = asyncio.Semaphore(max_inflight_calls)
        #: calls sent and records they carried (tests and the overhead benchmark read them)
        self.calls_sent = 0
        self.records_sent = 0

    @classmethod
    def of_method(cls, call: Callable[..., Awaitable[Any]], method: str, arg_of: Callable[[Hashable, list], Any],
                  slice_result: Callable[[Any, int, int], Any], *, quarantine: Any = None, journal: Any = None,
                  **options: Any) -> "CallCoalescer":
        """Calls `call(method, arg_of(key, records))`. With a model deployment's `quarantine`
        (serve_app/crash_quarantine.py: HandleClient's, which also means isolating replica deaths), each caller's
        records are checked as the call they would make alone before they share one. With a placed model's
        `journal` (serve_app/crash_journal.py), each caller's records are checked and journaled so while it waits."""
        def send(key: Hashable, records: list, **how: bool) -> Awaitable[Any]:
            return call(method, arg_of(key, records), **how)

        def alone(key: Hashable, records: Sequence) -> tuple:  # the args of the call `send` makes of them alone
            return (arg_of(key, list(records)),)

        def refuse(key: Hashable, records: Sequence) -> None:
            if quarantine.active:
                quarantine.check(method, alone(key, records))

        def died(key: Hashable, records: Sequence) -> Optional[Exception]:
            return quarantine.died(method, alone(key, records))

        def hold(key: Hashable, records: Sequence) -> AsyncContextManager:
            return journal.holding(method, alone(key, records))

        isolate = quarantine is not None
        return cls(send, slice_result, isolate_replica_deaths=isolate, refuse=refuse if isolate else None,
                   died=died if isolate else None, hold=hold if journal is not None else None, **options)

    async def submit(self, key: Hashable, records: Sequence) -> Any:
        """The result of a call with `records` (at most `max_records` of them)."""
        if not 0 < len(records) <= self.max_records:
            raise ValueError(f"a call carries 1..{self.max_records} records, got {len(records)}")
        if self._refuse is not None:  # before they share a call: refused alone, not with the others in it
            self._refuse(key, records)
        if self._hold is None:
            return await self._wait(key, records)
        async with self._hold(key, records):
            return await self._wait(key, records)

    async def _wait(self, key: Hashable, records: Sequence) -> Any:
        waiter = _Waiter(records, asyncio.get_running_loop().create_future())
        call = self._filling.get(key)
        if call is None or call.records + len(records) > self.max_records:
            call = self._filling[key] = _Call(key)
            self._pending.append(call)
        call.waiters.append(waiter)
        call.records += len(records)
        self._pump()
        try:
            return await asyncio.shield(waiter.future)
        except asyncio.CancelledError:
            self._leave(call, waiter)
            raise

    def _leave(self, call: _Call, waiter: _Waiter) -> None:
        """A caller gave up: drop its records from a pending call; cancel a sent call nobody awaits."""
        if call.task is None:
            call.waiters.remove(waiter)
            call.records -= len(waiter.records)
        elif not waiter.future.done():
            waiter.future.cancel()
            if waiter.alone is not None:
                waiter.alone.cancel()
            if all(w.future.done() for w in call.waiters):
                call.task.cancel()

    def _pump(self) -> None:
        while self.inflight < self.max_inflight_calls and self._pending:
            call = self._pending.popleft()
            if self._filling.get(call.key) is call:
                del self._filling[call.key]  # later records open a new call
            if not call.waiters:
                continue  # every caller left before it went out
            self.inflight += 1
            # A context of its own: a call shares no caller's. Serve records a handle call under the
            # request in whose context it is made and cancels it with that request, which would fail
            # every other caller in the call when that one client disconnects.
            call.task = shared_task(self._run(call))
            # A callback, not a `finally` in _run: a task cancelled before it started never runs it.
            call.task.add_done_callback(functools.partial(self._call_done, call))

    async def _run(self, call: _Call) -> None:
        # Not the records of callers who left after the call was taken off the queue: nobody awaits them,
        # and one's bad input would fail the rest.
        call.waiters = [waiter for waiter in call.waiters if not waiter.future.done()]
        if not call.waiters:
            return
        records: list = []
        for waiter in call.waiters:
            waiter.start = len(records)
            records.extend(waiter.records)
            waiter.stop = len(records)
        self.calls_sent += 1
        self.records_sent += len(records)
        shared = self._isolate and len(call.waiters) > 1  # the client does not retry it after a replica death
        try:
            result = await (self._send(call.key, records, retry_on_replica_death=False) if shared
                            else self._send(call.key, records))
        except asyncio.CancelledError:
            for waiter in call.waiters:
                if not waiter.future.done():
                    waiter.future.cancel()
            raise
        except Exception as exc:
            live = [waiter for waiter in call.waiters if not waiter.future.done()]
            if shared and isinstance(exc, ReplicaLost):  # any caller's input may have crashed the replica
                for waiter in live if self._died is not None else ():
                    if (crashed := self._died(call.key, waiter.records)) is not None:
                        waiter.future.set_exception(crashed)  # not sent again: refused from now on
                await self._one_at_a_time(call.key, live, exc)
            elif len(call.waiters) > 1 and _one_caller_s(exc):  # others' records rode in it, gone or not
                for waiter in live:
                    waiter.alone = asyncio.ensure_future(self._alone(call.key, waiter))
                await asyncio.gather(*(waiter.alone for waiter in live), return_exceptions=True)
            for waiter in live:
                if not waiter.future.done():
                    waiter.future.set_exception(exc)
        else:
            for waiter in call.waiters:
                if not waiter.future.done():
                    waiter.future.set_result(self._slice(result, waiter.start, waiter.stop))

    async def _one_at_a_time(self, key: Hashable, waiters: list[_Waiter], lost: ReplicaLost) -> None:
        """After a shared call's replica died (`lost`): each caller's records alone, as that call's retry, one
        caller's call in flight at a time (see the module docstring). A caller whose call dies again gets its 503;
        one who left is skipped; an error of the service's (no replica took the call in time) ends the others too,
        as does `replica_retry_timeout_s` spent: the callers not sent by then get `lost` (503 + Retry-After)."""
        logger.warning("a shared call lost its replica; the records of its %d callers still waiting go again "
                       "alone, one caller at a time", len(waiters))
        loop = asyncio.get_running_loop()
        spent_at = loop.time() + self.replica_retry_timeout_s
        for i, waiter in enumerate(waiters):
            if waiter.future.done():
                continue
            failed: Optional[Exception] = lost
            spent = loop.time() >= spent_at
            if not spent:
                waiter.alone = asyncio.ensure_future(
                    self._alone(key, waiter, retry_on_replica_death=False, after_replica_death=True))
                await asyncio.wait((waiter.alone,))
                failed = None if waiter.alone.cancelled() else waiter.alone.result()
            if spent or (isinstance(failed, ServeAppError) and not _one_caller_s(failed)  # the service's error
                         and not isinstance(failed, ReplicaLost)):
                for rest in waiters[i:]:
                    if not rest.future.done():
                        rest.future.set_exception(failed)
                return

    async def _alone(self, key: Hashable, waiter: _Waiter, **how: bool) -> Optional[Exception]:
        """`waiter`'s records in a call of their own (after the call it shared failed); the error it got, if any.
        `how`: HandleClient.call's keywords, after a replica death (_one_at_a_time)."""
        try:
            async with self._alone_slots:
                self.calls_sent += 1
                self.records_sent += len(waiter.records)
                result = await self._send(key, list(waiter.records), **how)
            share = self._slice(result, 0, len(waiter.records))  # (a result it fails on: this caller's error alone)
        except Exception as exc:
            if not waiter.future.done():
                waiter.future.set_exception(exc)
            return exc
        if not waiter.future.done():
            waiter.future.set_result(share)
        return None

    def _call_done(self, call: _Call, task: asyncio.Task) -> None:
        self.inflight -= 1
        failed = None if task.cancelled() else task.exception()  # a bug past _run's handling (a result _slice fails on)
        if failed is not None:
            logger.error("a shared model call failed outside its handling: %s", describe_exception(failed))
        for waiter in call.waiters:  # only if the task ended before it set them: cancelled, or that bug
            if not waiter.future.done():
                if failed is None:
                    waiter.future.cancel()
                else:  # a 500, not a CancelledError: the request would pass for its client gone (499)
                    waiter.future.set_exception(InternalError("The model call failed; the error has been logged."))
        self._pump()
