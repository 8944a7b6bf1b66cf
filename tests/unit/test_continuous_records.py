"""Every record the Translator's continuous path takes (deployments/continuous_translation.py) ends in exactly one of
its tallies, computed, cancelled or failed, when decoding fails: a failed step, a cancelled call beside it, a
decoding thread that stops. On the fake decoder (fake_decoder.py)."""

from __future__ import annotations

import asyncio
import threading

import pytest

from deployments.backends.base import BackendError
from deployments.batching import Chunk
from tests.support import until

from . import fake_decoder


@pytest.fixture
def translator(monkeypatch):
    replica = fake_decoder.continuous_translator(monkeypatch)
    yield replica
    replica._continuous.shutdown()


def _tallies(replica) -> tuple[int, int, int, int]:
    stats = replica.stats()
    return stats["enqueued"], stats["computed"], stats["cancelled"], stats["failed"]


def _start_together(replica, loop, *chunks) -> list[asyncio.Task]:
    """Tasks translating `chunks`, all queued before the decoding thread takes any (so they join one step)."""
    scheduler = replica._continuous.scheduler
    records = sum(len(chunk.texts) for chunk in chunks)
    with scheduler._cond:  # (re-entrant: the loop runs on this thread)
        tasks = [loop.create_task(replica.translate(chunk)) for chunk in chunks]
        loop.run_until_complete(until(lambda: sum(scheduler.waiting().values()) == records, interval_s=0))
    return tasks


def _settled(loop, task, timeout_s: float = 30.0):
    """What `task` returned or raised."""
    return loop.run_until_complete(asyncio.wait_for(asyncio.gather(task, return_exceptions=True), timeout_s))[0]


def test_a_failed_steps_records_are_counted_failed_and_those_it_had_finished_computed(translator, loop):
    decoder = translator._continuous.scheduler.decoder
    decoder.hold()
    (task,) = _start_together(translator, loop, Chunk("en", "de", ["a", "abcd", "abcdef"]))
    assert decoder.entered.wait(30)
    decoder.release()  # step 1 finishes "a"; its call waits on the others
    decoder.hold()
    assert decoder.entered.wait(30)  # step 2
    decoder.fail_next = RuntimeError("device error")
    decoder.release()
    assert isinstance(_settled(loop, task), BackendError)
    # no wait: a failure's bookkeeping reaches the loop before its callers' answers
    assert _tallies(translator) == (3, 1, 0, 2)


def test_a_call_cancelled_during_a_step_that_fails_counts_cancelled_not_failed(translator, loop):
    decoder = translator._continuous.scheduler.decoder
    decoder.hold()
    left, failed = _start_together(translator, loop, Chunk("en", "de", ["abc", "abcd"]), Chunk("en", "de", ["abcde"]))
    assert decoder.entered.wait(30)
    left.cancel()
    assert isinstance(_settled(loop, left), asyncio.CancelledError)
    decoder.fail_next = RuntimeError("device error")
    decoder.release()
    assert isinstance(_settled(loop, failed), BackendError)
    assert _tallies(translator) == (3, 0, 2, 1)


def test_cancelled_rows_a_failed_drop_leaves_behind_are_counted_once(translator, loop):
    scheduler = translator._continuous.scheduler
    decoder = scheduler.decoder
    decoder.hold()
    left, failed = _start_together(translator, loop, Chunk("en", "de", ["abc", "abcd"]), Chunk("en", "de", ["abcde"]))
    assert decoder.entered.wait(30)
    left.cancel()  # its rows leave at the next iteration, whose drop fails
    assert isinstance(_settled(loop, left), asyncio.CancelledError)

    def no_memory(tags):
        raise RuntimeError("DefaultCPUAllocator: can't allocate memory")
    decoder.drop = no_memory
    decoder.release()
    assert isinstance(_settled(loop, failed), BackendError)
    assert _tallies(translator) == (3, 0, 2, 1)
    del decoder.drop


def test_the_records_of_a_decoding_thread_that_stopped_are_counted_failed(translator, loop):
    scheduler = translator._continuous.scheduler

    def broken(**kwargs):
        raise RuntimeError("broken outside a step")
    scheduler.max_cached_tokens, scheduler.decoder.projection = 10**6, broken
    (task,) = _start_together(translator, loop, Chunk("en", "de", ["abc", "ab"]))
    error = _settled(loop, task)
    assert isinstance(error, BackendError) and "continuous decoding stopped" in str(error)
    assert _tallies(translator) == (2, 0, 0, 2)


def test_a_failed_step_whose_rows_cannot_be_dropped_nor_reset_still_answers_its_callers(translator, loop,
                                                                                       monkeypatch):
    """From a review: after a device error that every later device call repeats (CUDA's are sticky), dropping the
    failed rows and resetting the caches raise too. The callers, claimed first, were never answered: the thread died
    trying to claim them again, and they waited for their deadline. The thread then stops (the replica is broken),
    logged: no exception escapes it."""
    escaped = []
    monkeypatch.setattr(threading, "excepthook", escaped.append)
    decoder = translator._continuous.scheduler.decoder
    decoder.hold()
    (task,) = _start_together(translator, loop, Chunk("en", "de", ["abc", "abcd"]))
    assert decoder.entered.wait(30)

    def sticky(*args):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")
    decoder.drop = decoder._reset = sticky
    decoder.fail_next = RuntimeError("CUDA error: an illegal memory access was encountered")
    decoder.release()
    error = _settled(loop, task, timeout_s=10)
    assert isinstance(error, BackendError) and "generation failed" in str(error)
    scheduler = translator._continuous.scheduler
    scheduler._thread.join(30)
    assert not scheduler._thread.is_alive() and scheduler._broken is not None
    assert escaped == []
    del decoder.drop, decoder._reset
