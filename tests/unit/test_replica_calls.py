"""A model replica's calls (deployments/replica.py, intake.py, model_queue.py): one alone skips `batch_wait_timeout_s`
(`skip_batch_wait_when_alone`) while calls that arrive together, or while others were batching lately, still go
through `@serve.batch`; one whose caller left is never computed; every record is counted once; a batch failing at
its size backs the adaptive size off."""

import asyncio

import pytest

from deployments.batching import Chunk
from deployments.model_queue import RECENT_BATCHES, ModelQueue

from .test_deployments import translator  # noqa: F401 - the fixture
from .test_priority import _blocked_queue, _run, gated_translator  # noqa: F401 - the fixture


def test_the_model_queue_is_alone_only_when_idle_empty_and_lately_without_company():
    idle = ModelQueue("idle")
    assert idle.alone()
    idle.shutdown()
    queue, gate, first = _blocked_queue()
    try:
        assert not queue.alone()  # computing
        waiting = queue.submit(_run, lambda: "w1", cap=8)
        assert not queue.alone()
        queue.submit(_run, lambda: "w2", cap=8)  # joins "w1": the next batch is 2 calls
        gate.set()
        assert first.result(10)[0] == "blocker" and waiting.result(10)[1] == 2
        for i in range(RECENT_BATCHES):
            assert not queue.alone()  # a 2-call batch is among the last ones
            queue.submit(_run, lambda: i).result(10)
        assert queue.alone()
    finally:
        queue.shutdown()


class _ServeBatchSpy:
    """Stands for a replica's `@serve.batch` method: counts the calls that went through it."""

    def __init__(self, method):
        self.method, self.calls = method, 0
        self.__wrapped__ = method.__wrapped__

    def __getattr__(self, name):
        return getattr(self.method, name)

    async def __call__(self, item):
        self.calls += 1
        return await self.method(item)


def _spy(replica) -> _ServeBatchSpy:
    tracked = replica._translate_batch
    tracked._method = _ServeBatchSpy(tracked._method)
    return tracked._method


def test_a_lone_call_goes_to_the_model_without_the_batch_wait(translator, loop):  # noqa: F811
    replica, backend = translator
    replica.reconfigure({"max_batch_size": 8, "batch_wait_timeout_s": 10.0})
    spy = _spy(replica)
    texts, size = loop.run_until_complete(asyncio.wait_for(replica.translate(Chunk("en", "pt", ["a"])), 9))
    assert (texts, size, spy.calls) == (["pt:a"], 1, 0)
    assert backend.batches == [("en", "pt", ["a"])]


def test_calls_that_arrive_together_still_batch(translator, loop):  # noqa: F811
    replica, backend = translator
    spy = _spy(replica)

    async def go():
        return await asyncio.gather(*(replica.translate(Chunk("en", "pt", [t])) for t in "abc"))

    results = loop.run_until_complete(go())
    assert spy.calls == 3 and {size for _, size in results} == {3}
    assert backend.batches == [("en", "pt", ["a", "b", "c"])]
    # the batch of 3 calls is recent company: the next lone call waits for more, as before
    loop.run_until_complete(replica.translate(Chunk("en", "pt", ["d"])))
    assert spy.calls == 4


def test_turned_off_every_call_goes_through_the_batch_queue(translator, loop):  # noqa: F811
    replica, backend = translator
    replica.reconfigure({"max_batch_size": 8, "batch_wait_timeout_s": 0.01, "skip_batch_wait_when_alone": False})
    spy = _spy(replica)
    loop.run_until_complete(replica.translate(Chunk("en", "pt", ["a"])))
    assert spy.calls == 1 and backend.batches == [("en", "pt", ["a"])]


def test_a_call_cancelled_before_the_model_queue_is_never_computed(gated_translator, monkeypatch):
    """A job's call held at the interactive gate (or in Serve's batch wait) whose caller left went on to the model
    queue once the gate opened, and an idle model thread took it before the intake's end cancelled it there (10 of
    10 with a 20 ms pause after the hand-over): computed for nobody. Its ticket says it was abandoned."""
    import time

    replica, backend, loop = gated_translator
    backend.gate.set()
    hand_over = replica._model_thread.submit_all

    def slow_hand_over(*args, **kwargs):  # the model thread gets time to take what it was handed
        futures = hand_over(*args, **kwargs)
        time.sleep(0.02)
        return futures
    monkeypatch.setattr(replica._model_thread, "submit_all", slow_hand_over)

    async def scenario():
        replica.interactive.enter()  # an interactive call in flight: job calls wait at the gate
        job = asyncio.ensure_future(replica.translate(Chunk("en", "pt", ["job"]), background=True))
        await asyncio.sleep(0.05)
        job.cancel()
        replica.interactive.leave()
        await asyncio.sleep(0.2)
        return job.cancelled()

    assert loop.run_until_complete(scenario())
    stats = replica.stats()
    assert backend.calls == [] and stats["computed"] == 0 and stats["cancelled"] == 1, stats


def test_every_enqueued_record_is_counted_computed_cancelled_or_failed(translator, loop):  # noqa: F811
    """The records of calls the model failed were counted enqueued and nothing else: the replica's own tallies (and
    serve_app_records_*_total) no longer added up whenever a model failed."""
    replica, backend = translator
    backend.fail = True

    async def calls():
        return await asyncio.gather(*(replica.translate(Chunk("en", "pt", [f"a{i}", f"b{i}"])) for i in range(3)),
                                    return_exceptions=True)
    assert all(isinstance(outcome, Exception) for outcome in loop.run_until_complete(calls()))
    backend.fail = False
    assert loop.run_until_complete(replica.translate(Chunk("en", "pt", ["c"])))[0] == ["pt:c"]
    stats = replica.stats()
    assert stats["enqueued"] == 7 and stats["failed"] == 6 and stats["computed"] == 1, stats


def test_a_batch_that_fails_at_its_size_backs_the_live_size_off(monkeypatch, loop):
    """A model that runs out of memory past 4 texts, one client sending 8-record requests: the batch failing at the
    live size never reached the sizer, so every request failed at 8 until the health check gave the replica up."""
    from deployments.batching import Chunk
    from deployments.translator import Translator
    from deployments.settings import TranslationSettings
    from tests.unit.test_length_batching import WordBackend

    class SmallMemory(WordBackend):
        def translate(self, texts, source, target):
            if len(texts) > 4:
                raise RuntimeError("CUDA out of memory")
            return super().translate(texts, source, target)

    monkeypatch.setattr("deployments.translator.load_translation_backend", lambda settings, threads: SmallMemory())
    replica = Translator.func_or_class(TranslationSettings().model_dump())
    replica.reconfigure({"max_batch_size": 8, "batch_wait_timeout_s": 0.0, "target_p99_batch_latency_s": 10.0,
                         "adaptive_backoff_factor": 0.5})

    def translate():
        return loop.run_until_complete(replica.translate(Chunk("en", "pt", [f"t{i}" for i in range(8)])))[0]
    with pytest.raises(Exception, match="out of memory"):
        translate()
    assert replica.live_max_batch_size() == 4
    assert translate() == [f"pt:t{i}" for i in range(8)]  # in pieces of 4


@pytest.mark.parametrize("alone", [True, False], ids=["straight-to-the-model-queue", "through-serve-batch"])
def test_records_whose_intake_raised_are_counted_failed(translator, loop, alone):  # noqa: F811
    """A model thread shut down refuses calls in the intake (ModelQueue.submit_all raises): their records were counted
    enqueued and in no outcome."""
    replica, _ = translator
    replica.reconfigure({"max_batch_size": 8, "batch_wait_timeout_s": 0.05, "skip_batch_wait_when_alone": alone})
    assert loop.run_until_complete(replica.translate(Chunk("en", "pt", ["a"])))[0] == ["pt:a"]
    replica._model_thread.shutdown()
    with pytest.raises(RuntimeError, match="the model thread is shut down"):
        loop.run_until_complete(replica.translate(Chunk("en", "pt", ["b", "c"])))
    stats = replica.stats()
    assert (stats["enqueued"], stats["computed"], stats["cancelled"], stats["failed"]) == (3, 1, 0, 2), stats


def test_a_refused_piece_that_is_not_cut_again_is_counted_failed(translator, loop):  # noqa: F811
    """Serve refused a piece for a size that has grown back since (it is raised, not cut again): never computed."""
    replica, _ = translator

    async def refusing(item, counted=False):
        raise RuntimeError("Size of item is greater than max_batch_size. Please increase the max_batch_size")

    with pytest.raises(RuntimeError, match="Size of item"):
        loop.run_until_complete(replica._submit_pieces(refusing, ["a", "b", "c"], list))
    assert replica.stats()["failed"] == 3
