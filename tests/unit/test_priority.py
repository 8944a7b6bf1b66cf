"""Interactive work goes ahead of background (job) work on a replica's model thread."""

import asyncio
import functools
import threading
import time
from collections import deque

import pytest

from deployments.batching import Chunk
from deployments.model_queue import ModelQueue, _Entry
from deployments.priority import Priority
from deployments.settings import TranslationSettings
from deployments.translator import Translator
from tests.support import until


def _run(fn):  # a compute function for ModelQueue.submit: each call's item is a callable; one output per call
    return [item() for item in fn]


def _blocked_queue():
    """A model queue busy until the returned event is set."""
    queue, gate, started = ModelQueue("test"), threading.Event(), threading.Event()

    def block():
        started.set()
        gate.wait(10)
        return "blocker"

    first = queue.submit(_run, block)
    assert started.wait(10)
    return queue, gate, first


def test_waiting_interactive_work_runs_before_waiting_background_work():
    queue, gate, first = _blocked_queue()
    order = []

    def record(name):
        order.append(name)

    # one record per call and a cap of one: every call is its own batch, so the order shows
    background = [queue.submit(_run, lambda i=i: record(f"bg{i}"), 1, Priority.BACKGROUND, cap=1) for i in range(3)]
    interactive = [queue.submit(_run, lambda i=i: record(f"int{i}"), 1, Priority.INTERACTIVE, cap=1)
                   for i in range(2)]
    assert queue.waiting() == {Priority.BACKGROUND: 3, Priority.INTERACTIVE: 2}
    gate.set()
    for future in [first, *background, *interactive]:
        future.result(10)
    # interactive first, each priority in arrival order
    assert order == ["int0", "int1", "bg0", "bg1", "bg2"]
    queue.shutdown()


def test_work_cancelled_while_waiting_is_never_run_and_errors_reach_the_caller():
    queue, gate, first = _blocked_queue()
    ran = []
    doomed = queue.submit(_run, lambda: ran.append("doomed"), 1, Priority.BACKGROUND)
    failing = queue.submit(_run, lambda: 1 / 0)
    assert doomed.cancel()
    gate.set()
    with pytest.raises(ZeroDivisionError):
        failing.result(10)
    assert first.result(10)[0] == "blocker"
    assert ran == []
    assert queue.waiting() == {}
    queue.shutdown()


def test_calls_that_waited_while_the_model_was_busy_ride_in_one_batch_up_to_the_cap():
    """What Serve's batcher alone does not do: it forms the next batch from what arrives while the
    previous one computes, so behind a slow model it hands over one-record batches."""
    outcomes = []
    queue = ModelQueue("test", on_batch=outcomes.append)
    gate, started = threading.Event(), threading.Event()
    batches = []

    def compute(items):
        if not started.is_set():
            started.set()
            gate.wait(10)
        batches.append(list(items))
        return [item.upper() for item in items]

    first = queue.submit(compute, "first", 1, cap=4)
    assert started.wait(10)
    waiting = [queue.submit(compute, f"r{i}", 1, cap=4) for i in range(6)]
    other = queue.submit(_run, lambda: "other fn")  # another computation never joins these
    two = queue.submit(compute, "two-records", 2, cap=4)
    gate.set()
    assert [f.result(10)[0] for f in waiting] == [f"R{i}" for i in range(6)]
    assert first.result(10)[:2] == ("FIRST", 1)
    # joined in arrival order while the records fit the cap (4) and the computation is the same;
    # the next batch starts at the first call that does not join (no call is overtaken)
    assert batches == [["first"], ["r0", "r1", "r2", "r3"], ["r4", "r5"], ["two-records"]]
    assert [f.result(10)[1] for f in waiting] == [4, 4, 4, 4, 2, 2]
    assert two.result(10)[1] == 2 and other.result(10)[0] == "other fn"
    assert [o.records for o in outcomes] == [1, 4, 2, 1, 2] and not any(o.failed for o in outcomes)
    assert [o.full for o in outcomes] == [False, True, False, True, False]  # at the cap; not before another fn
    queue.shutdown()


def test_one_output_per_call_or_every_call_of_the_batch_gets_the_error():
    queue, gate, first = _blocked_queue()
    def one_output(items):
        return ["only one"]

    short = [queue.submit(one_output, i, cap=2) for i in range(2)]
    gate.set()
    for future in short:
        with pytest.raises(RuntimeError, match="1 outputs for 2 calls"):
            future.result(10)
    queue.shutdown()


def test_a_model_that_raises_stop_iteration_or_exits_still_answers_its_callers():
    """asyncio refuses StopIteration on a future (the caller waited until its deadline) and a SystemExit set
    there would stop the replica's event loop: both reach the caller as a RuntimeError caused by them."""
    queue = ModelQueue("test")

    def raising(exc):
        def compute(items):
            raise exc
        return compute

    async def call(exc):
        return await asyncio.wrap_future(queue.submit(raising(exc), "item"))

    try:
        for exc in (StopIteration(), SystemExit(3)):
            with pytest.raises(RuntimeError, match=type(exc).__name__) as raised:
                asyncio.run(asyncio.wait_for(call(exc), 5))
            assert raised.value.__cause__ is exc
    finally:
        queue.shutdown()


class GatedBackend:
    """Records the order of model calls; the first one blocks until `gate` is set."""

    name = model_id = "gated"

    def __init__(self):
        self.gate, self.blocking = threading.Event(), threading.Event()
        self.calls: list[list[str]] = []

    def supported_pairs(self):
        from deployments.backends.base import LanguagePair
        return [LanguagePair("en", "pt")]

    def translate(self, texts, source, target):
        if not self.calls:
            self.blocking.set()
            self.gate.wait(10)
        self.calls.append(list(texts))
        return [t.upper() for t in texts]

    def warm_up(self):
        pass

    def describe(self):
        return {}


_until = functools.partial(until, timeout_s=10.0, interval_s=0.001)


@pytest.fixture
def gated_translator(monkeypatch, loop):
    backend = GatedBackend()
    monkeypatch.setattr("deployments.translator.load_translation_backend", lambda settings, threads: backend)
    replica = Translator.func_or_class(TranslationSettings().model_dump())
    replica.reconfigure({"max_batch_size": 4, "batch_wait_timeout_s": 0})
    return replica, backend, loop


def test_an_interactive_request_overtakes_a_job_backlog(gated_translator):
    replica, backend, loop = gated_translator

    async def scenario():
        # A 12-record job (3 batches of 4): its first batch computes, blocked.
        job = asyncio.ensure_future(
            replica.translate(Chunk("en", "pt", [f"job{i}" for i in range(12)]), background=True))
        await _until(backend.blocking.is_set)
        interactive = asyncio.ensure_future(replica.translate(Chunk("en", "pt", ["now"])))
        await _until(lambda: replica._model_thread.waiting().get(Priority.INTERACTIVE, 0) == 1)
        backend.gate.set()
        return await asyncio.gather(job, interactive)

    job, interactive = loop.run_until_complete(scenario())
    assert interactive[0] == ["NOW"] and job[0] == [f"JOB{i}" for i in range(12)]
    # it waited for the job batch already computing, and for nothing else
    assert len(backend.calls) == 4 and backend.calls[1] == ["now"]
    job_batches = backend.calls[:1] + backend.calls[2:]
    assert sorted(t for call in job_batches for t in call) == sorted(f"job{i}" for i in range(12))
    assert replica.stats()["computed_background"] == 12
    assert replica.stats()["computed_interactive"] == 1


def test_job_batches_wait_while_interactive_calls_are_queued(gated_translator):
    replica, backend, loop = gated_translator

    async def scenario():
        first = asyncio.ensure_future(replica.translate(Chunk("en", "pt", ["first"])))
        await _until(backend.blocking.is_set)
        job = asyncio.ensure_future(replica.translate(Chunk("en", "pt", ["job"]), background=True))
        # `second` waits in the model queue behind `first` (one batch computes at a time)
        second = asyncio.ensure_future(replica.translate(Chunk("en", "pt", ["second"])))
        await _until(lambda: replica._model_thread.waiting() == {Priority.INTERACTIVE: 1})
        assert replica.interactive.calls == 2
        assert replica._stats["enqueued"] == 3  # the job entered the replica but is held back
        backend.gate.set()
        return await asyncio.gather(first, job, second)

    loop.run_until_complete(scenario())
    assert backend.calls == [["first"], ["second"], ["job"]]


def test_job_batches_are_capped_by_background_max_batch_size(gated_translator):
    replica, backend, loop = gated_translator
    replica.reconfigure({"max_batch_size": 4, "batch_wait_timeout_s": 0, "background_max_batch_size": 2})
    backend.gate.set()
    backend.calls.append(["(unblocked)"])  # the first call does not block

    async def scenario():
        return await asyncio.gather(
            replica.translate(Chunk("en", "pt", [f"job{i}" for i in range(7)]), background=True),
            replica.translate(Chunk("en", "pt", [f"int{i}" for i in range(7)])))

    job, interactive = loop.run_until_complete(scenario())
    assert job[0] == [f"JOB{i}" for i in range(7)] and interactive[0] == [f"INT{i}" for i in range(7)]
    job_calls = [c for c in backend.calls[1:] if c[0].startswith("job")]
    assert job_calls and max(len(c) for c in job_calls) <= 2
    assert max(len(c) for c in backend.calls[1:] if c[0].startswith("int")) <= 4


def test_calls_arriving_one_by_one_while_a_batch_computes_ride_in_the_next_batch_together(gated_translator):
    """Serve's @serve.batch alone forms a new batch from each lone arrival while the model is busy
    (measured: 32 concurrent HTTP requests behind a 1 s model call computed 1-2 records at a time).
    The model queue joins them: everything that waited rides in the next model call."""
    replica, backend, loop = gated_translator

    async def scenario():
        first = asyncio.ensure_future(replica.translate(Chunk("en", "pt", ["first"])))
        await _until(backend.blocking.is_set)
        later = []
        for i in range(4):  # one by one: each is its own intake batch (batch_wait_timeout_s is 0)
            later.append(asyncio.ensure_future(replica.translate(Chunk("en", "pt", [f"r{i}"]))))
            await _until(lambda: replica._model_thread.waiting().get(Priority.INTERACTIVE, 0) == i + 1)
        backend.gate.set()
        return await first, await asyncio.gather(*later)

    first, later = loop.run_until_complete(scenario())
    assert backend.calls == [["first"], ["r0", "r1", "r2", "r3"]]
    assert first == (["FIRST"], 1) and later == [([f"R{i}"], 4) for i in range(4)]


def test_after_a_batch_the_model_waits_briefly_for_a_fuller_next_one():
    """Closed-loop clients answered by a batch send their next requests a round trip later; a slow
    model that started at once with what waited would run a small batch at nearly a full one's cost."""
    queue = ModelQueue("test", fill_wait_fraction=50.0)  # 15 s: a descheduled test thread is in time; full ends it
    batches, started = [], threading.Event()

    def compute(items):
        batches.append(list(items))
        if items == ["slow"]:
            started.set()
            time.sleep(0.3)  # the model's own time: the fill window is 50 x this
        return items

    slow = queue.submit(compute, "slow", 1, cap=4)
    assert started.wait(10)
    early = queue.submit(compute, "early", 1, cap=4)  # waited while the slow batch computed
    slow.result(10)
    late = [queue.submit(compute, f"late{i}", 1, cap=4) for i in range(3)]  # a round trip later
    for future in [early, *late]:
        future.result(10)
    assert batches == [["slow"], ["early", "late0", "late1", "late2"]]
    queue.shutdown()


def test_the_fill_wait_ends_at_a_full_batch_and_never_delays_a_model_that_was_idle():
    queue = ModelQueue("test", fill_wait_fraction=1.0)
    with queue._ready:
        queue._last_batch_s, queue._last_batch_end, queue._last_priority = 10.0, time.perf_counter(), 0
        queue._waiting[Priority.INTERACTIVE] = deque()
        for _ in range(3):
            queue._waiting[Priority.INTERACTIVE].append(_Entry("x", 1, _run, cap=4))
        assert queue._fill_deadline() is not None  # 3 of 4 records: worth waiting
        queue._waiting[Priority.INTERACTIVE].append(_Entry("x", 1, _run, cap=4))
        assert queue._fill_deadline() is None  # full: start now
        queue._waiting[Priority.INTERACTIVE].pop()
        queue._last_batch_end -= 11.0  # idle for longer than the window
        assert queue._fill_deadline() is None
        queue._waiting.clear()
    queue.shutdown()
