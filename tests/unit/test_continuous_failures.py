"""The continuous scheduler when things go wrong (deployments/continuous_batching.py): errors in and
outside a step, a failed call's queued sentences, health on the Translator's continuous path
(deployments/continuous_translation.py); and the cache bound on both engines. Fixtures and helpers:
test_continuous_scheduling.py."""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import TimeoutError as FutureTimeout

import pytest

from deployments.backends.base import BackendError
from deployments.batching import Chunk
from tests.support import until

from .test_continuous_scheduling import Steps, continuous_translator, scheduler_for  # noqa: F401 - fixtures
from .test_transformers_backend import TEXTS

NO_MEMORY = "DefaultCPUAllocator: can't allocate memory"


def _no_memory(*args, **kwargs):
    raise RuntimeError(NO_MEMORY)


def _outcome(future, timeout: float = 10.0):
    """The future's exception (None if it has a result); fails the test if it is still pending."""
    try:
        return future.exception(timeout=timeout)
    except FutureTimeout:
        pytest.fail("a call was never answered: the decoding thread died or forgot it")


def test_a_failing_drop_of_cancelled_rows_fails_the_batch_and_decoding_goes_on(scheduler_for):
    steps = Steps()
    scheduler, backend = scheduler_for(on_step=steps)
    limits, scheduler.limits = scheduler.limits, lambda text, ids: (200, 200)
    doomed = scheduler.submit(["Hello."], "en", "de")
    other = scheduler.submit(["Where is the train station?"], "en", "de")
    steps.wait(lambda o: o.running == 2)
    scheduler.decoder.drop = _no_memory  # dropping the cancelled row fails, then dropping the failed ones
    doomed.cancel()
    error = _outcome(other)
    assert isinstance(error, BackendError) and NO_MEMORY in str(error)
    steps.wait(lambda o: o.failed)
    assert scheduler.decoder.running == 0  # the batch was reset
    del scheduler.decoder.drop
    scheduler.limits = limits
    assert scheduler.submit(["Hello."], "en", "de").result(timeout=30)[0] == backend.translate(["Hello."], "en", "de")


def test_an_error_outside_a_step_fails_every_caller_and_refuses_new_calls(scheduler_for):
    steps = Steps()
    scheduler, _ = scheduler_for(on_step=steps, max_cached_tokens=10**6)
    scheduler.decoder.projection = _no_memory  # raised while admitting, before any step
    with scheduler._cond:  # both wait together: the admission that would take them fails
        taken = scheduler.submit(["Hello."], "en", "de")
        left = scheduler.submit(["Where is the train station?", "a"], "en", "de")
    for future in (taken, left):
        error = _outcome(future)
        assert isinstance(error, BackendError) and "continuous decoding stopped" in str(error)
    scheduler._thread.join(10)
    assert not scheduler._thread.is_alive()
    assert steps.outcomes[-1].failed and steps.outcomes[-1].fatal
    with pytest.raises(BackendError, match="continuous decoding stopped"):
        scheduler.submit(["Hello."], "en", "de")


def test_a_failed_calls_queued_sentences_are_never_decoded(scheduler_for):
    steps = Steps()
    scheduler, _ = scheduler_for(on_step=steps, max_running_sequences=2)
    step, failed, joined_after = scheduler.decoder.step, threading.Event(), []

    def fails_once(**kwargs):
        if not failed.is_set():
            failed.set()
            raise RuntimeError("transient device error")
        return step(**kwargs)
    join = scheduler.decoder.join

    def recording_join(requests):
        if failed.is_set():
            joined_after.extend(r.tag[0] for r in requests)
        return join(requests)
    scheduler.decoder.step, scheduler.decoder.join = fails_once, recording_join
    big = scheduler.submit(TEXTS, "en", "de")  # 2 run (and fail), the rest wait
    assert isinstance(_outcome(big), BackendError)
    assert scheduler.waiting() == {}  # what is left of the failed call is not waiting for anything
    scheduler.submit(["Hello."], "en", "de").result(timeout=60)  # queued after them: they were dealt with first
    assert not [call for call in joined_after if call.future is big]
    steps.wait(lambda o: o.finished)
    assert sum(o.finished for o in steps.outcomes) == 1 and sum(o.dropped for o in steps.outcomes) == 0


def test_the_cached_token_cap_holds_when_sentences_join_a_batch_decoding_for_a_while(scheduler_for):
    """The slot engine's rows share one column: sentences joining a row 80 steps in start at its column."""
    cap = 1400
    scheduler, _ = scheduler_for(max_running_sequences=16, max_cached_tokens=cap)
    scheduler.limits = lambda text, ids: (100, 100) if text == "first" else (40, 40)
    seen, later, step = [], [], scheduler.decoder.step

    def checked_step(**kwargs):
        finished = step(**kwargs)
        seen.append((scheduler.decoder.running, scheduler.decoder.cached_tokens()))
        if len(seen) == 80:  # on the decoding thread: they join at the next step
            later.append(scheduler.submit([chr(97 + i) for i in range(12)], "en", "de"))
        return finished
    scheduler.decoder.step = checked_step
    scheduler.submit(["first"], "en", "de").result(timeout=60)
    later[0].result(timeout=60)
    assert max(running for running, _ in seen) > 2  # some joined the first sentence
    assert all(cached <= cap for running, cached in seen if running > 1), max(cached for _, cached in seen)


# --------------------------------------------------------------------------- the Translator's health


def _translate_fails(replica, loop, texts) -> BackendError:
    async def run():
        with pytest.raises(BackendError) as raised:
            await replica.translate(Chunk("en", "de", texts))
        return raised.value
    return loop.run_until_complete(asyncio.wait_for(run(), 30))


def _until(loop, condition) -> None:
    """Run the replica's loop (its bookkeeping runs there) until `condition()`, for at most 30 s."""
    loop.run_until_complete(until(condition, timeout_s=30.0, interval_s=0.01))


def test_iterations_that_step_no_sentence_do_not_count_as_model_successes(continuous_translator, loop):
    replica = continuous_translator
    scheduler = replica._continuous.scheduler
    step = scheduler.decoder.step
    scheduler.decoder.step = lambda **kwargs: _no_memory() if scheduler.decoder.running else step(**kwargs)
    for _ in range(2):
        _translate_fails(replica, loop, ["Hello."])
    _until(loop, lambda: replica.health.failures_in_a_row == 2)
    with scheduler._cond:  # a caller gives up before its call joins: the next iteration only takes it out
        scheduler.submit(["Hello."], "en", "de").cancel()
    _until(loop, lambda: replica.stats()["cancelled"] == 1)
    assert replica.health.failures_in_a_row == 2


def test_a_stopped_decoding_thread_fails_the_health_check_at_once(continuous_translator, loop):
    replica = continuous_translator
    scheduler = replica._continuous.scheduler
    scheduler.max_cached_tokens, scheduler.decoder.projection = 10**6, _no_memory
    replica.check_health()
    assert "continuous decoding stopped" in str(_translate_fails(replica, loop, ["Hello.", "a"]))
    _until(loop, lambda: replica.health.failures_in_a_row > 1)
    with pytest.raises(RuntimeError, match="model calls failed"):
        replica.check_health()
    enqueued = replica.stats()["enqueued"]
    assert "continuous decoding stopped" in str(_translate_fails(replica, loop, ["Hello."]))  # refused at once
    assert replica.stats()["enqueued"] == enqueued  # a refused call is not counted as enqueued


def test_a_failed_step_sets_the_cached_tokens_gauge_to_what_the_caches_hold_and_no_step_no_joins():
    """A failed step empties the running batch: the gauge must not keep the last step's value. An iteration
    that only let cancelled sentences go ran no step: it observes no joins (it inflated "steps nobody joined")."""
    from types import SimpleNamespace

    from deployments.continuous_batching import StepOutcome
    from deployments.continuous_translation import ContinuousTranslation
    from deployments.health import ReplicaHealth

    class Gauge:
        def __init__(self):
            self.values = []

        def set(self, value, tags=None):
            self.values.append(value)

        def observe(self, value, tags=None):
            self.values.append(value)

    gauge = Gauge()
    instruments = SimpleNamespace(running=Gauge(), step_seconds=Gauge(), joins=Gauge(), cached_tokens=gauge)
    metrics = SimpleNamespace(count_cancelled=lambda n: None, count_computed=lambda n: None, failed=lambda: None)
    replica = SimpleNamespace(_stats={"model_cpu_s": 0.0, "cancelled": 0, "computed": 0, "computed_interactive": 0,
                                      "computed_background": 0}, metrics=metrics, health=ReplicaHealth("Translator"))
    engine = SimpleNamespace(replica=replica, _instruments=instruments, _tags={"model": "Translator"})
    ContinuousTranslation._record(engine, StepOutcome(4, 0, 0, {}, 0.1, 0.1, 4096, 0))
    ContinuousTranslation._record(engine, StepOutcome(0, 0, 0, {}, 0.1, 0.1, 0, 0, True, RuntimeError("boom")))
    assert gauge.values == [4096, 0]
    ContinuousTranslation._record(engine, StepOutcome(0, 0, 0, {}, 0.0, 0.0, 0, dropped=2))  # only let 2 go
    assert instruments.joins.values == [0] and instruments.running.values == [4]


def test_a_decoding_step_that_never_returns_fails_the_health_check(continuous_translator):
    """A step stuck in native code would leave every caller to its deadline: past the bound, the health
    check fails, so Serve replaces the replica."""
    replica = continuous_translator
    scheduler, release = replica._continuous.scheduler, threading.Event()
    step = scheduler.decoder.step

    def stuck(**kwargs):
        release.wait(30)
        return step(**kwargs)
    scheduler.decoder.step = stuck
    call = scheduler.submit(["Hello."], "en", "de")
    try:
        while not scheduler.decoder.running:
            time.sleep(0.01)
        replica.check_health()  # within the bound: a long step is not a hung one
        with pytest.raises(RuntimeError, match="taken for hung"):
            replica._continuous.check(hung_after_s=0.0)
    finally:
        release.set()
    call.result(timeout=30)


def test_an_error_marking_one_finished_sentence_fails_its_call_only(scheduler_for):
    """Bookkeeping of a finished sentence (was it cut short?) raising fails that sentence's call, not the
    decoding thread and every other caller with it."""
    scheduler, backend = scheduler_for()
    is_cut, doomed_ids = backend.is_cut, backend.encode_texts(["Hello."], "en")[0]

    def fails_for_one(input_length, ids, max_new_tokens, min_new_tokens):
        if input_length == len(doomed_ids):
            raise ValueError("bad output")
        return is_cut(input_length, ids, max_new_tokens, min_new_tokens)

    backend.is_cut = fails_for_one
    with scheduler._cond:  # decoded in one batch
        doomed = scheduler.submit(["Hello."], "en", "de")
        other = scheduler.submit(["Where is the train station?"], "en", "de")
    assert isinstance(_outcome(doomed), ValueError)
    assert _outcome(other) is None and scheduler._thread.is_alive()
    del backend.is_cut
    assert other.result()[0] == backend.translate(["Where is the train station?"], "en", "de")


def test_a_base_exception_in_the_decoding_thread_answers_every_caller(scheduler_for):
    """A SystemExit (or KeyboardInterrupt) passes a step's own `except Exception`: it stops the thread like any
    error outside a step, and its callers are answered instead of waiting until their deadlines."""
    scheduler, _ = scheduler_for()

    def exits(**kwargs):
        raise SystemExit(3)

    scheduler.decoder.step = exits
    error = _outcome(scheduler.submit(["Hello."], "en", "de"))
    assert isinstance(error, BackendError) and "SystemExit" in str(error)
    scheduler._thread.join(10)
    with pytest.raises(BackendError, match="continuous decoding stopped"):
        scheduler.submit(["Hello."], "en", "de")


def test_a_join_into_an_empty_batch_that_never_returns_fails_the_health_check(continuous_translator):
    """The first sentences after an idle spell are not `running` until their encoder pass is done; a device
    that stops answering there (the first blocking call after idle) must fail the check too."""
    replica = continuous_translator
    scheduler, release, entered = replica._continuous.scheduler, threading.Event(), threading.Event()
    join = scheduler.decoder.join

    def stuck(requests):
        if requests:
            entered.set()
            release.wait(30)
        return join(requests)
    scheduler.decoder.join = stuck
    replica._continuous.check(hung_after_s=0.0)  # idle: nothing under way
    call = scheduler.submit(["Hello."], "en", "de")
    try:
        assert entered.wait(30) and scheduler.decoder.running == 0
        with pytest.raises(RuntimeError, match="taken for hung"):
            replica._continuous.check(hung_after_s=0.0)
    finally:
        release.set()
    call.result(timeout=30)
