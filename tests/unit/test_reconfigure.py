"""A `serve deploy`'s new batch knobs reach a replica whose calls are running (deployments/replica.py).

Serve calls a sync `reconfigure` on a worker thread, while the adaptive sizer sets the live batch size on the
replica's loop after each batch: applied on the worker thread, the two could interleave and leave Serve's queue at
another size than the live one. The knobs are applied on the loop instead."""

from __future__ import annotations

import asyncio
import threading

import pytest

from deployments.batching import Chunk
from deployments.settings import TranslationSettings
from deployments.translator import Translator
from tests.unit.test_length_batching import WordBackend

ADAPTIVE = {"max_batch_size": 8, "batch_wait_timeout_s": 0.0, "target_p99_batch_latency_s": 1e-9,
            "adaptive_backoff_factor": 0.5, "adaptive_min_batch_size": 2}


@pytest.fixture
def running_loop():
    """An event loop running on a thread of its own, as a replica's does under Serve."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="replica-loop", daemon=True)
    thread.start()
    yield loop, thread
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)
    loop.close()


def _queue_size(method) -> int:
    return method.set_max_batch_size.__self__.max_batch_size  # Serve's _LazyBatchQueueWrapper


def test_a_serve_deploy_applies_the_knobs_on_the_replicas_loop(monkeypatch, running_loop):
    loop, loop_thread = running_loop
    monkeypatch.setattr("deployments.translator.load_translation_backend", lambda settings, threads: WordBackend())
    replica = Translator.func_or_class(TranslationSettings().model_dump())
    replica.reconfigure(ADAPTIVE)  # before any call: applied at once, on the caller's thread
    chunk = Chunk("en", "pt", [f"t{i}" for i in range(8)])
    asyncio.run_coroutine_threadsafe(replica.translate(chunk), loop).result(30)
    assert replica.live_max_batch_size() == 4  # one batch over the target: halved, on the loop
    applied_on, apply = [], replica._apply_batch_config

    def recorded(batch_config=None):
        applied_on.append(threading.current_thread())
        return apply(batch_config)
    monkeypatch.setattr(replica, "_apply_batch_config", recorded)
    replica.reconfigure({**ADAPTIVE, "max_batch_size": 16})  # from this thread, as Serve's worker thread calls it
    assert applied_on == [loop_thread]
    assert replica.batch_config.max_batch_size == 16
    assert replica.live_max_batch_size() == 4 == _queue_size(replica._translate_batch)  # the learned size kept

    async def from_the_loop():  # Serve with sync methods on the loop (RAY_SERVE_RUN_SYNC_IN_THREADPOOL=0)
        replica.reconfigure({**ADAPTIVE, "max_batch_size": 3})
    asyncio.run_coroutine_threadsafe(from_the_loop(), loop).result(10)  # no hop to itself: no deadlock
    assert applied_on == [loop_thread, loop_thread] and replica.live_max_batch_size() == 3
    with pytest.raises(ValueError, match="max_batch_size"):  # a bad config is refused in the caller
        replica.reconfigure({"max_batch_size": 0, "batch_wait_timeout_s": 0.0})


def test_a_serve_deploy_while_the_first_call_waits_in_serve_s_queue_applies_on_the_loop(monkeypatch, running_loop):
    """The loop was learned when the first calls reached the model queue: a deploy while they still waited in
    `@serve.batch`'s queue was applied on Serve's worker thread, interleaving with their first batch's bookkeeping."""
    loop, loop_thread = running_loop
    monkeypatch.setattr("deployments.translator.load_translation_backend", lambda settings, threads: WordBackend())
    replica = Translator.func_or_class(TranslationSettings().model_dump())
    replica.reconfigure({"max_batch_size": 8, "batch_wait_timeout_s": 2.0, "skip_batch_wait_when_alone": False})
    applied_on, apply = [], replica._apply_batch_config

    def recorded(batch_config=None):
        applied_on.append(threading.current_thread())
        return apply(batch_config)
    monkeypatch.setattr(replica, "_apply_batch_config", recorded)
    first = asyncio.run_coroutine_threadsafe(replica.translate(Chunk("en", "pt", ["t"])), loop)
    asyncio.run_coroutine_threadsafe(asyncio.sleep(0.1), loop).result(10)  # the call waits for company in Serve's
    assert not first.done()
    replica.reconfigure({"max_batch_size": 8, "batch_wait_timeout_s": 0.0, "skip_batch_wait_when_alone": False})
    assert applied_on == [loop_thread]
    assert first.result(30)[0] == ["pt:t"]


def test_a_deploy_the_busy_loop_did_not_apply_in_time_is_never_applied(monkeypatch, running_loop):
    """`reconfigure` gave up after 60 s and Serve reported the deploy failed, but the knobs stayed queued on the loop:
    once it freed up they were applied after all, a config nobody deployed any more. Now they never are."""
    loop, _ = running_loop
    monkeypatch.setattr("deployments.translator.load_translation_backend", lambda settings, threads: WordBackend())
    monkeypatch.setattr("deployments.replica.RECONFIGURE_TIMEOUT_S", 0.2)
    replica = Translator.func_or_class(TranslationSettings().model_dump())
    replica.reconfigure({"max_batch_size": 8, "batch_wait_timeout_s": 0.0})
    asyncio.run_coroutine_threadsafe(replica.translate(Chunk("en", "pt", ["t"])), loop).result(30)  # the loop known
    busy, release = threading.Event(), threading.Event()
    loop.call_soon_threadsafe(lambda: (busy.set(), release.wait(30)))  # a stuck callback holds the loop
    assert busy.wait(10)
    with pytest.raises(TimeoutError, match="not applied"):
        replica.reconfigure({"max_batch_size": 16, "batch_wait_timeout_s": 0.0})
    release.set()
    asyncio.run_coroutine_threadsafe(asyncio.sleep(0), loop).result(10)  # the loop has run what it had queued
    assert replica.batch_config.max_batch_size == 8 and _queue_size(replica._translate_batch) == 8
    replica.reconfigure({"max_batch_size": 16, "batch_wait_timeout_s": 0.0})  # a free loop applies the next one
    assert replica.batch_config.max_batch_size == 16
