"""The continuous scheduler (deployments/continuous_batching.py) and the Translator's continuous path
(deployments/continuous_translation.py), on the tiny fixture models, without Ray."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import CancelledError, ThreadPoolExecutor

import pytest

from deployments.backends.base import BackendError
from deployments.backends.segments import CutText
from deployments.backends.slot_decoder import SlotDecoder
from deployments.batching import Chunk
from deployments.continuous_batching import ContinuousScheduler
from deployments.priority import Priority
from deployments.settings import TranslationSettings
from deployments.translator import Translator

from .conftest import TEST_MAX_NEW_TOKENS
from .test_transformers_backend import TEXTS


class Steps:
    """Records every StepOutcome; `wait(pred)` blocks until one satisfies pred."""

    def __init__(self):
        self.outcomes = []
        self._cond = threading.Condition()

    def __call__(self, outcome):
        with self._cond:
            self.outcomes.append(outcome)
            self._cond.notify_all()

    def wait(self, pred, timeout=30.0):
        with self._cond:
            assert self._cond.wait_for(lambda: any(pred(o) for o in self.outcomes), timeout), self.outcomes[-5:]


@pytest.fixture(params=["tensors", "slots"])
def scheduler_for(request, make_backend, tiny_marian_dir):
    """Schedulers over either engine: the CPU's, and the GPU's slots (run eagerly, without graphs)."""
    made = []

    def make(**kwargs):
        backend = make_backend(tiny_marian_dir)
        if request.param == "slots":
            backend.continuous_decoder = lambda slots=None, cuda_graphs=True: SlotDecoder(
                backend.model, backend._pad, slots=slots, graphs=False)
        kwargs.setdefault("max_running_sequences", 8)
        kwargs.setdefault("max_cached_tokens", None)
        scheduler = ContinuousScheduler(backend, max_new_tokens=TEST_MAX_NEW_TOKENS, **kwargs)
        made.append(scheduler)
        return scheduler, backend

    yield make
    for scheduler in made:
        scheduler.shutdown()


def test_both_engines_mark_the_outputs_the_model_cut_as_static_generate_does(scheduler_for):
    scheduler, backend = scheduler_for()
    translations, _ = scheduler.submit(TEXTS, "en", "de").result(timeout=60)
    static = backend.translate(TEXTS, "en", "de")
    marks = [isinstance(t, CutText) for t in static]
    assert any(marks) and not all(marks), marks  # the tiny model ends some sentences, not others
    assert [isinstance(t, CutText) for t in translations] == marks and translations == static


def test_concurrent_calls_get_what_static_generate_gives(scheduler_for):
    steps = Steps()
    scheduler, backend = scheduler_for(on_step=steps, max_running_sequences=5)
    calls = [TEXTS[i:i + n] for i, n in ((0, 1), (1, 3), (3, 2), (2, 5), (0, 7), (4, 1))]
    with ThreadPoolExecutor(4) as pool:
        futures = list(pool.map(lambda texts: scheduler.submit(texts, "en", "de"), calls))
    results = [f.result(timeout=60) for f in futures]
    for texts, (translations, batch) in zip(calls, results):
        assert translations == [backend.translate([t], "en", "de")[0] for t in texts]
        assert 1 <= batch <= 5
    steps.wait(lambda _: sum(o.finished for o in steps.outcomes) == sum(map(len, calls)))  # the last step's
    assert max(o.running for o in steps.outcomes) <= 5  # outcome is reported after its callers' answers


def test_cached_token_cap_holds_and_a_lone_sequence_always_runs(scheduler_for):
    scheduler, backend = scheduler_for(max_cached_tokens=60)
    seen = []
    step = scheduler.decoder.step

    def checked_step(**kwargs):
        seen.append((scheduler.decoder.running, scheduler.decoder.projected_tokens()))
        return step(**kwargs)
    scheduler.decoder.step = checked_step
    long_text = " ".join(TEXTS)  # alone over the cap: runs alone
    futures = [scheduler.submit([text], "en", "de") for text in TEXTS + [long_text]]
    for future in futures:
        future.result(timeout=60)
    assert all(projected <= 60 for running, projected in seen if running > 1)
    assert any(running == 1 and projected > 60 for running, projected in seen)


def test_a_sequence_the_cache_cap_holds_back_is_not_starved_by_others_joining(scheduler_for):
    """A job sentence that fits the cache cap only alone waited for an empty batch that a stream of interactive
    sentences never left, and the small job sentence behind it waited with it (3,751 steps in a review). After
    max_new_tokens steps refused, nothing else joins until it has: both finish while the stream goes on."""
    stream, holder = threading.Event(), []

    def on_step(outcome):  # a new interactive sentence every 3 steps, for as long as the test runs
        stream.set()
        if len(holder) == 2 and outcome.running:
            holder[1] += 1
            if holder[1] % 3 == 0:
                holder[0].submit(["a"], "en", "de", Priority.INTERACTIVE)
    scheduler, _ = scheduler_for(max_cached_tokens=150, on_step=on_step)
    scheduler.limits = lambda text, ids: (20, 20)
    holder.extend([scheduler, 0])
    scheduler.submit(["a"], "en", "de", Priority.INTERACTIVE)
    assert stream.wait(30)
    long_job = scheduler.submit([" ".join(["hello world"] * 30)], "en", "de", Priority.BACKGROUND)
    small_job = scheduler.submit(["a"], "en", "de", Priority.BACKGROUND)
    for future in (long_job, small_job):
        future.result(timeout=60)
    assert scheduler.decoder.running or scheduler.waiting()  # the stream was still going


def test_a_cancelled_sequence_s_place_is_taken_at_the_join_that_drops_it(scheduler_for):
    """The sequences of a cancelled call still counted as running when the next joiners were chosen, so its place
    stayed empty for one more step (with join_interval_steps N, until the next rebuild: up to 2N)."""
    paused, go = threading.Event(), threading.Event()
    steps = Steps()

    def on_step(outcome):
        steps(outcome)
        if not go.is_set():  # the thread waits here, between two iterations, while the test acts
            paused.set()
            assert go.wait(30)
    scheduler, _ = scheduler_for(max_running_sequences=1, on_step=on_step)
    scheduler.limits = lambda text, ids: (40, 40)
    doomed = scheduler.submit(["Hello."], "en", "de")
    assert paused.wait(30)
    doomed.cancel()
    taking_its_place = scheduler.submit(["Where is the train station?"], "en", "de")
    go.set()
    taking_its_place.result(timeout=60)
    dropping = next(o for o in steps.outcomes if o.dropped)
    assert dropping.joined == 1, steps.outcomes[:3]


def test_interactive_calls_join_before_waiting_job_records(scheduler_for):
    scheduler, backend = scheduler_for(max_running_sequences=1)
    gate, joining, joined = threading.Event(), threading.Event(), []
    join = scheduler.decoder.join

    def gated_join(requests):
        joined.extend(r.tag[0].priority for r in requests)
        joining.set()
        gate.wait(30)
        return join(requests)
    scheduler.decoder.join = gated_join
    first = scheduler.submit(["Hello."], "en", "de", Priority.BACKGROUND)
    assert joining.wait(30)  # the first job record is in the batch; the rest queue behind it
    jobs = scheduler.submit(TEXTS[:3], "en", "de", Priority.BACKGROUND)
    interactive = scheduler.submit(["Where is the train station?"], "en", "de", Priority.INTERACTIVE)
    gate.set()
    for future in (first, jobs, interactive):
        future.result(timeout=60)
    assert joined == [Priority.BACKGROUND, Priority.INTERACTIVE] + [Priority.BACKGROUND] * 3


def test_a_cancelled_call_leaves_the_batch_at_the_next_step(scheduler_for):
    steps = Steps()
    scheduler, backend = scheduler_for(on_step=steps)
    scheduler.limits = lambda text, ids: (200, 200)  # decodes 200 steps unless cancelled
    doomed = scheduler.submit(["Hello.", "Where is the train station?"], "en", "de")
    steps.wait(lambda o: o.running == 2)
    assert doomed.cancel()
    steps.wait(lambda o: o.dropped == 2)
    dropped_at = next(i for i, o in enumerate(steps.outcomes) if o.dropped)
    assert steps.outcomes[dropped_at].running == 0 and scheduler.decoder.running == 0
    assert sum(o.running > 0 for o in steps.outcomes) < 100  # far from its 200 steps
    with pytest.raises(CancelledError):
        doomed.result()
    scheduler.limits = lambda text, ids: (5, 5)
    assert len(scheduler.submit(["Hello."], "en", "de").result(timeout=30)[0]) == 1


def test_a_failing_step_fails_its_calls_and_the_next_ones_run(scheduler_for):
    steps = Steps()
    scheduler, backend = scheduler_for(on_step=steps)
    step = scheduler.decoder.step

    def broken(**kwargs):
        raise RuntimeError("device lost")
    scheduler.decoder.step = broken
    with pytest.raises(BackendError, match="device lost"):
        scheduler.submit(TEXTS[:2], "en", "de").result(timeout=30)
    steps.wait(lambda o: o.failed)  # reported after the callers got the error
    assert scheduler.decoder.running == 0
    scheduler.decoder.step = step
    assert scheduler.submit(["Hello."], "en", "de").result(timeout=30)[0] == backend.translate(["Hello."], "en", "de")


def test_unsupported_pair_and_bad_caps_are_refused(scheduler_for):
    scheduler, _ = scheduler_for()
    with pytest.raises(ValueError, match="does not translate en->pt"):
        scheduler.submit(["Hello."], "en", "pt")
    assert scheduler.submit([], "en", "de").result(timeout=1) == ([], 0)
    with pytest.raises(ValueError, match="max_running_sequences must be >= 1, got 0"):
        scheduler_for(max_running_sequences=0)


# --------------------------------------------------------------------------- the Translator


@pytest.fixture
def continuous_translator(tiny_marian_dir):
    settings = TranslationSettings(backend="transformers", model=str(tiny_marian_dir), device="cpu",
                                   local_files_only=True, max_new_tokens=TEST_MAX_NEW_TOKENS,
                                   scheduling="continuous", max_running_sequences=4)
    replica = Translator.func_or_class(settings.model_dump())
    yield replica
    replica._continuous.shutdown()


def test_translator_continuous_path(continuous_translator, marian_backend, loop):
    replica = continuous_translator
    chunks = [Chunk("en", "de", TEXTS[i:i + 2]) for i in range(0, len(TEXTS), 2)]

    async def run():
        return await asyncio.gather(*(replica.translate(c) for c in chunks),
                                    replica.translate(Chunk("en", "de", TEXTS[:1]), background=True))
    results = loop.run_until_complete(run())
    for chunk, (texts, batch) in zip(chunks, results):
        assert texts == marian_backend.translate(chunk.texts, "en", "de")
        assert 1 <= batch <= 4
    # no wait: a step's bookkeeping reaches the loop before its callers' answers (as the model queue's does)
    stats = replica.stats()
    assert stats["enqueued"] == stats["computed"] == len(TEXTS) + 1
    assert stats["computed_background"] == 1 and stats["model_cpu_s"] > 0
    info = replica.info()
    assert info["details"]["scheduling"] == "continuous"
    assert info["details"]["continuous"]["max_running_sequences"] == 4
    assert info["details"]["continuous"]["row_attention"] is True  # a CPU replica (row_attention.py)


def test_translator_cancelled_call_is_dropped(continuous_translator, loop):
    replica = continuous_translator
    replica._continuous.scheduler.limits = lambda text, ids: (400, 400)

    async def run():
        task = asyncio.ensure_future(replica.translate(Chunk("en", "de", ["Hello.", "a"])))
        while replica._continuous.scheduler.decoder.running < 2:
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        while replica.stats()["cancelled"] < 2:
            await asyncio.sleep(0.01)
    loop.run_until_complete(asyncio.wait_for(run(), 60))
    assert replica._continuous.scheduler.decoder.running == 0 and replica.stats()["computed"] == 0


def test_background_max_batch_size_caps_job_sequences_in_the_batch(continuous_translator, loop):
    replica = continuous_translator
    replica.reconfigure({"max_batch_size": 32, "batch_wait_timeout_s": 0.01, "background_max_batch_size": 1})
    scheduler = replica._continuous.scheduler
    assert scheduler.max_background_sequences == 1
    seen = []
    step = scheduler.decoder.step

    def counting_step(**kwargs):
        seen.append(sum(r.request.tag[0].priority == Priority.BACKGROUND for r in scheduler.decoder.rows))
        return step(**kwargs)
    scheduler.decoder.step = counting_step

    async def run():
        return await asyncio.gather(replica.translate(Chunk("en", "de", TEXTS[:4]), background=True),
                                    replica.translate(Chunk("en", "de", TEXTS[4:]), background=False))
    loop.run_until_complete(run())
    assert max(seen) == 1


def test_decode_metrics_are_valid_instruments():
    """Ray refuses bad histogram boundaries only when the instruments are made (in the replica)."""
    from deployments.continuous_translation import _DecodeInstruments

    made = _DecodeInstruments()
    assert made.joins.boundaries[0] == 0.5  # a step nobody joined falls in its own bucket


def test_outputs_longer_than_the_models_positions_are_refused(scheduler_for, make_backend, tiny_marian_dir):
    """Marian's decoder has 512 positions: one sentence past them would fail every running one."""
    scheduler, _ = scheduler_for()
    scheduler.limits = lambda text, ids: (600, None)
    with pytest.raises(ValueError, match="max_new_tokens=600 exceeds the 511 output tokens"):
        scheduler.submit(["Hello."], "en", "de")
    with pytest.raises(ValueError, match="max_new_tokens=512 exceeds the 511"):
        ContinuousScheduler(make_backend(tiny_marian_dir), max_running_sequences=4, max_cached_tokens=None,
                            max_new_tokens=512)
