"""The deployment classes, run as plain Python objects (`Deployment.func_or_class`):
@serve.batch works in plain asyncio, so record-level batching, reconfigure and
health are tested here without starting Ray."""

import asyncio
import threading
import time

import pytest

from deployments.batching import Chunk
from deployments.embedder import Embedder
from deployments.health import FAILURES_BEFORE_UNHEALTHY
from deployments.replica import threads_for_share
from deployments.settings import EmbeddingSettings, TranslationSettings
from deployments.translator import Translator

TranslatorClass = Translator.func_or_class
EmbedderClass = Embedder.func_or_class


class RecordingBackend:
    name = "recording"
    model_id = "recording"

    def __init__(self):
        self.batches = []
        self.fail = False

    def supported_pairs(self):
        from deployments.backends.base import LanguagePair
        return [LanguagePair("en", "pt"), LanguagePair("pt", "en")]

    def translate(self, texts, source, target):
        if self.fail:
            raise RuntimeError("model broke")
        self.batches.append((source, target, list(texts)))
        return [f"{target}:{t}" for t in texts]

    def describe(self):
        return {}


@pytest.fixture
def translator(monkeypatch):
    backend = RecordingBackend()
    monkeypatch.setattr("deployments.translator.load_translation_backend", lambda settings, threads: backend)
    monkeypatch.setattr(RecordingBackend, "warm_up", lambda self: None, raising=False)
    replica = TranslatorClass(TranslationSettings().model_dump())
    replica.reconfigure({"max_batch_size": 8, "batch_wait_timeout_s": 0.05})
    return replica, backend


def test_threads_follow_the_cpu_share():
    assert threads_for_share(0.5) == 1
    assert threads_for_share(1.0) == 1
    assert threads_for_share(2.0) == 2
    assert threads_for_share(0.5, override=3) == 3


def test_concurrent_calls_share_one_model_call_per_pair(translator, loop):
    replica, backend = translator

    async def go():
        return await asyncio.gather(
            replica.translate(Chunk("en", "pt", ["a", "b"])),
            replica.translate(Chunk("pt", "en", ["c"])),
            replica.translate(Chunk("en", "pt", ["d"])),
        )

    results = loop.run_until_complete(go())
    assert [texts for texts, _ in results] == [["pt:a", "pt:b"], ["en:c"], ["pt:d"]]
    # all 4 records rode in one batch, split into one model call per pair
    assert {size for _, size in results} == {4}
    assert sorted(backend.batches) == [("en", "pt", ["a", "b", "d"]), ("pt", "en", ["c"])]


def test_batches_never_exceed_max_batch_size_in_records(translator, loop):
    replica, backend = translator

    async def go():
        calls = [replica.translate(Chunk("en", "pt", [f"{i}-{j}" for j in range(3)])) for i in range(10)]
        calls.append(replica.translate(Chunk("en", "pt", [f"big-{j}" for j in range(20)])))  # > max_batch_size
        return await asyncio.gather(*calls)

    results = loop.run_until_complete(go())
    assert results[-1][0] == [f"pt:big-{j}" for j in range(20)]
    assert all(len(texts) <= 8 for _, _, texts in backend.batches)
    assert sum(len(texts) for _, _, texts in backend.batches) == 50


def test_reconfigure_changes_batch_size_without_restart(translator, loop):
    replica, backend = translator
    replica.reconfigure({"max_batch_size": 2, "batch_wait_timeout_s": 0.05})

    async def go():
        return await asyncio.gather(*(replica.translate(Chunk("en", "pt", [str(i)])) for i in range(6)))

    loop.run_until_complete(go())
    assert max(len(t) for _, _, t in backend.batches) == 2
    assert replica.info()["batching"] == {"max_batch_size": 2, "batch_wait_timeout_s": 0.05}


@pytest.mark.parametrize("bad, quoted", [
    ({"max_batch_size": 0, "batch_wait_timeout_s": 0.01}, "max_batch_size=0"),
    ({"max_batch_size": 4}, "batch_wait_timeout_s"),
    ({"max_batch_size": 4, "batch_wait_timeout_s": 0.01, "max_batch": 3}, "max_batch"),
])
def test_bad_user_config_is_rejected_quoting_the_value(translator, bad, quoted):
    replica, _ = translator
    with pytest.raises(ValueError, match=quoted):
        replica.reconfigure(bad)


def test_check_health_fails_after_repeated_model_failures(translator, loop):
    replica, backend = translator
    replica.check_health()
    backend.fail = True
    for _ in range(FAILURES_BEFORE_UNHEALTHY):
        with pytest.raises(RuntimeError):
            loop.run_until_complete(replica.translate(Chunk("en", "pt", ["x"])))
    with pytest.raises(RuntimeError, match="model broke"):
        replica.check_health()
    backend.fail = False
    loop.run_until_complete(replica.translate(Chunk("en", "pt", ["x"])))
    replica.check_health()


def test_a_replica_past_its_graceful_shutdown_fails_its_health_check(translator):
    """Serve runs the destructor at the end of a graceful shutdown; a controller that restarted before
    killing the replica adopts it as RUNNING while it refuses every request: the health check says so."""
    replica, _ = translator
    replica.check_health()
    replica.__del__()
    with pytest.raises(RuntimeError, match="finished its graceful shutdown"):
        replica.check_health()


def test_embedder_batches_requests_and_slices_results_back(loop):
    replica = EmbedderClass(EmbeddingSettings(num_threads=1).model_dump())
    replica.reconfigure({"max_batch_size": 16, "batch_wait_timeout_s": 0.05})
    texts = [["first text"], ["second", "third one here"], ["fourth"]]

    async def go():
        return await asyncio.gather(*(replica.embed(t) for t in texts))

    results = loop.run_until_complete(go())
    assert [v.shape for v, _, _ in results] == [(1, 384), (2, 384), (1, 384)]
    assert {b for _, _, b in results} == {4}
    solo, _, _ = loop.run_until_complete(replica.embed(["third one here"]))
    assert float(solo[0] @ results[1][0][1]) >= 0.9999
    assert replica.info()["dimensions"] == 384


def test_an_embedding_batch_that_raises_is_run_again_call_by_call():
    """One call's bad input fails that call only, not every call the model queue joined to it."""
    replica = EmbedderClass(EmbeddingSettings(num_threads=1).model_dump())
    embed = replica.model.embed

    def poisoned(texts, **kwargs):
        if "poison" in texts:
            raise RuntimeError("bad input")
        return embed(texts, **kwargs)

    replica.model.embed = poisoned
    first, bad, other = replica._embed_items([["a"], ["poison"], ["b", "c"]])
    assert first[0].shape == (1, 384) and isinstance(bad, RuntimeError) and other[0].shape == (2, 384)
    assert first[1] == embed(["a"])[1]
    with pytest.raises(RuntimeError, match="bad input"):  # a lone call's error is raised, as before
        replica._embed_items([["poison"]])


def test_the_embedder_cuts_a_batch_into_passes_of_max_batch_tokens(loop):
    replica = EmbedderClass(EmbeddingSettings(num_threads=1).model_dump())
    passes, model_pass = [], replica.model._vectors
    replica.model._vectors = lambda inputs: (passes.append(inputs["input_ids"].shape), model_pass(inputs))[1]
    texts = [["short"], ["a much longer text, with many more tokens than the others have"], ["tiny one"]]

    async def gather():
        return await asyncio.gather(*(replica.embed(t) for t in texts))

    def embed_all():
        passes.clear()
        return loop.run_until_complete(gather())

    replica.reconfigure({"max_batch_size": 16, "batch_wait_timeout_s": 0.05, "max_batch_tokens": 24})
    cut = embed_all()
    assert len(passes) == 2 and all(rows == 1 or rows * width <= 24 for rows, width in passes)
    replica.reconfigure({"max_batch_size": 16, "batch_wait_timeout_s": 0.05})
    whole = embed_all()
    assert len(passes) == 1  # one batch, one pass padded to its longest text
    for (a, tokens_a, _), (b, tokens_b, _) in zip(cut, whole):
        assert float(a[0] @ b[0]) >= 0.9999 and tokens_a == tokens_b


class _CountingMetrics:
    def __init__(self):
        self.cancelled = 0

    def count_enqueued(self, records):
        pass

    def count_cancelled(self, records):
        self.cancelled += records

    def observe_queue_wait(self, seconds):
        pass


def _tracked(intake):
    from types import SimpleNamespace

    from deployments.priority import InteractiveGate
    from deployments.intake import TrackedBatchMethod

    replica = SimpleNamespace(_stats={"enqueued": 0, "cancelled": 0}, metrics=_CountingMetrics(),
                              interactive=InteractiveGate(), _tickets={},
                              batch_config=SimpleNamespace(skip_batch_wait_when_alone=False))
    return TrackedBatchMethod(replica, intake), replica


@pytest.mark.parametrize("batched_before_cancel", [False, True])
def test_a_call_cancelled_in_the_intake_is_dropped_from_the_model_queue_and_counted_once(batched_before_cancel):
    """The race behind a chaos flake: Serve's batch handed the call to the model queue, and the caller
    was cancelled before it resumed. The model-queue entry must be dropped (not computed) and the
    records counted dropped once; before, they were counted dropped and then computed as well."""
    from concurrent.futures import Future

    from deployments.intake import abandoned

    sent = []

    async def scenario():
        handed_over, model_entry = asyncio.Event(), Future()

        async def intake(item):  # Serve's batch, then ModelReplica._enqueue: a call whose caller left is not sent
            await handed_over.wait()
            ticket = replica._tickets[id(item)]
            if ticket.abandoned:
                return abandoned()
            sent.append(item)
            ticket.future = model_entry
            return model_entry

        method, replica = _tracked(intake)
        call = asyncio.ensure_future(method(["a", "b", "c"]))
        await asyncio.sleep(0)  # the call waits in the intake
        if batched_before_cancel:
            handed_over.set()  # the batch ran; the caller has not resumed yet
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        handed_over.set()
        for _ in range(5):
            await asyncio.sleep(0)
        return model_entry, replica

    model_entry, replica = asyncio.run(scenario())
    # Handed over before the cancel: the model thread skips the cancelled entry (set_running_or_notify_cancel is
    # False). Cancelled before: it is never sent.
    assert model_entry.cancelled() if batched_before_cancel else sent == []
    assert replica._stats["cancelled"] == replica.metrics.cancelled == 3
    assert replica.interactive.calls == 0 and replica._tickets == {}


def test_check_health_fails_while_the_model_is_stuck_in_one_call(translator, loop):
    """A model call that never returns (a native deadlock) would leave every request to its deadline
    while the replica looked healthy: past the bound the health check fails, so Serve replaces it."""
    from deployments import model_queue

    replica, _ = translator
    release = threading.Event()
    stuck = replica._model_thread.submit(lambda items: release.wait(30) and items, "x")
    while replica._model_thread._batch_started is None:
        time.sleep(0.01)
    replica.check_health()  # within the bound: a long batch is not a hung one
    with pytest.raises(RuntimeError, match="taken for hung"):
        replica._model_thread.check(hung_after_s=0.0)
    release.set()
    assert stuck.result(timeout=10)[0] == "x"
    replica._model_thread.check(hung_after_s=0.0)  # nothing computing: healthy again
    assert model_queue.HUNG_BATCH_S >= 300


def test_check_health_fails_once_the_model_thread_has_stopped(translator):
    replica, _ = translator
    queue = replica._model_thread
    queue._thread = threading.Thread(target=lambda: None)
    queue._thread.start()
    queue._thread.join()
    with pytest.raises(RuntimeError, match="model thread has stopped"):
        replica.check_health()
