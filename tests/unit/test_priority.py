"""Interactive work goes ahead of background (job) work on a replica's model thread."""

import asyncio
import threading

import pytest

from deployments._replica import Priority, PriorityModelThread
from deployments.batching import Chunk
from deployments.translator import Translator
from serve_app.settings import TranslationSettings


def _blocked_thread():
    """A model thread busy until the returned event is set."""
    thread, gate, started = PriorityModelThread("test"), threading.Event(), threading.Event()

    def block():
        started.set()
        gate.wait(10)
        return "blocker"

    first = thread.submit(block)
    assert started.wait(10)
    return thread, gate, first


def test_waiting_interactive_work_runs_before_waiting_background_work():
    thread, gate, first = _blocked_thread()
    order = []
    background = [thread.submit(lambda i=i: order.append(f"bg{i}"), Priority.BACKGROUND) for i in range(3)]
    interactive = [thread.submit(lambda i=i: order.append(f"int{i}"), Priority.INTERACTIVE) for i in range(2)]
    assert thread.waiting() == {Priority.BACKGROUND: 3, Priority.INTERACTIVE: 2}
    gate.set()
    for future in [first, *background, *interactive]:
        future.result(10)
    # interactive first, each priority in arrival order
    assert order == ["int0", "int1", "bg0", "bg1", "bg2"]
    thread.shutdown()


def test_work_cancelled_while_waiting_is_never_run_and_errors_reach_the_caller():
    thread, gate, first = _blocked_thread()
    ran = []
    doomed = thread.submit(lambda: ran.append("doomed"), Priority.BACKGROUND)
    failing = thread.submit(lambda: 1 / 0)
    assert doomed.cancel()
    gate.set()
    with pytest.raises(ZeroDivisionError):
        failing.result(10)
    assert first.result(10) == "blocker"
    assert ran == []
    assert thread.waiting() == {}
    thread.shutdown()


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


async def _until(condition, timeout_s: float = 10.0) -> None:
    """Yield to the loop until `condition()` holds (state we can only observe by looking)."""
    async with asyncio.timeout(timeout_s):
        while not condition():
            await asyncio.sleep(0.001)


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
        # `second` queues behind `first` in the interactive batch queue (one batch computes at a time)
        second = asyncio.ensure_future(replica.translate(Chunk("en", "pt", ["second"])))
        await _until(lambda: replica._interactive_calls == 2)
        assert replica._model_thread.waiting() == {}  # the job batch is held back, not queued
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
