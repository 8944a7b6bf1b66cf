"""Translator batches that mix callers: a language pair's model call that raises fails only the
calls that still fail alone, never the other callers of the batch (deployments/batching.py)."""

import asyncio
import threading

import pytest

from deployments.batching import Chunk
from deployments.model_queue import KNOWN_GOOD_MAX_RECORDS, ModelQueue

from .test_deployments import RecordingBackend, translator  # noqa: F401 - the fixture


class BoomBackend(RecordingBackend):
    """Raises for any model call holding the text "boom" (a poisoned record)."""

    def translate(self, texts, source, target):
        if "boom" in texts:
            self.batches.append(("raised", source, target, list(texts)))
            raise RuntimeError("boom in the model")
        return super().translate(texts, source, target)


POISONED_BATCH = [Chunk("en", "pt", ["ok"]), Chunk("pt", "en", ["boom"]), Chunk("en", "pt", ["fine", "boom"])]


def test_a_failing_pair_fails_only_its_own_poisoned_calls(translator):
    replica, _ = translator
    replica.backend = backend = BoomBackend()
    first, second, third = replica._translate_items(POISONED_BATCH)
    assert first == ["pt:ok"]
    assert isinstance(second, RuntimeError) and isinstance(third, RuntimeError)
    # one call per pair; the failed en->pt group is re-run call by call, the lone pt->en is not re-run
    assert backend.batches == [("raised", "en", "pt", ["ok", "fine", "boom"]), ("en", "pt", ["ok"]),
                               ("raised", "en", "pt", ["fine", "boom"]), ("raised", "pt", "en", ["boom"])]


def test_a_poisoned_call_keeps_the_batch_healthy_and_interrupts_still_propagate(translator):
    replica, _ = translator
    replica.backend = BoomBackend()
    outcomes = []
    queue = ModelQueue("boom-test", on_batch=outcomes.append)
    release = threading.Event()
    try:
        queue.submit(lambda items: [release.wait(10)] * len(items), "busy")  # the next calls join one batch
        futures = [queue.submit(replica._translate_items, chunk, len(chunk.texts), cap=8) for chunk in POISONED_BATCH]
        release.set()
        assert futures[0].result(timeout=10)[0] == ["pt:ok"]
        for future in futures[1:]:
            with pytest.raises(RuntimeError, match="boom in the model"):
                future.result(timeout=10)
        assert outcomes[-1].records == 4 and not outcomes[-1].failed  # not every call failed
    finally:
        queue.shutdown()

    def interrupted(texts, source, target):
        raise KeyboardInterrupt

    replica.backend.translate = interrupted
    with pytest.raises(KeyboardInterrupt):
        replica._translate_items(POISONED_BATCH)


def test_concurrent_callers_of_a_poisoned_batch_get_their_own_results(translator, loop):
    replica, _ = translator
    replica.backend = BoomBackend()

    async def go():
        return await asyncio.gather(*(replica.translate(chunk) for chunk in POISONED_BATCH), return_exceptions=True)

    first, second, third = loop.run_until_complete(go())
    assert first == (["pt:ok"], 4)
    assert isinstance(second, RuntimeError) and isinstance(third, RuntimeError)
    assert replica.health.failures_in_a_row == 0
    replica.check_health()


def test_a_batch_of_bad_calls_is_blamed_on_its_inputs_once_the_known_good_call_passes():
    """ModelQueue keeps the last call that succeeded (of at most KNOWN_GOOD_MAX_RECORDS records) and,
    after a batch whose every call failed, computes it again: the model works, the inputs were bad."""
    computed, outcomes = [], []

    def compute(items):
        computed.append(list(items))
        return [RuntimeError("bad input") if item == "bad" else item.upper() for item in items]

    queue = ModelQueue("blame-test", on_batch=outcomes.append)
    try:
        with pytest.raises(RuntimeError):
            queue.submit(compute, "bad").result(timeout=10)
        assert outcomes[-1].failed and not outcomes[-1].inputs_blamed  # nothing known good yet
        assert queue.submit(compute, "many", records=KNOWN_GOOD_MAX_RECORDS + 1).result(timeout=10)[0] == "MANY"
        with pytest.raises(RuntimeError):
            queue.submit(compute, "bad").result(timeout=10)
        assert not outcomes[-1].inputs_blamed  # too large a call to be re-run as the known-good one
        assert queue.submit(compute, "good").result(timeout=10)[0] == "GOOD"
        with pytest.raises(RuntimeError, match="bad input"):
            queue.submit(compute, "bad").result(timeout=10)
        assert outcomes[-1].failed and outcomes[-1].inputs_blamed
        assert computed[-2:] == [["bad"], ["good"]]
        with pytest.raises(RuntimeError):  # a batch larger than the known-good call: its size may be the cause
            queue.submit(compute, "bad", records=2).result(timeout=10)
        assert outcomes[-1].failed and not outcomes[-1].inputs_blamed and computed[-1] == ["bad"]

        def interrupted(items):  # now everything raises what is not an Exception, the known-good call too
            raise KeyboardInterrupt
        known = queue._known_good
        queue._known_good = (interrupted, "good", 1)
        with pytest.raises(RuntimeError, match="KeyboardInterrupt"):  # delivered so (errors.deliverable)
            queue.submit(interrupted, "x").result(timeout=10)
        assert not outcomes[-1].inputs_blamed
        queue._known_good = known
        assert queue.submit(compute, "good").result(timeout=10)[0] == "GOOD"  # the model thread lives on
        queue.check()
    finally:
        queue.shutdown()


def test_concurrent_bad_calls_run_again_alone_are_blamed_on_their_inputs():
    """Bad one-record calls that arrived together share a batch; the batch ran each call again alone (each
    got its own exception, as values), so each failed at its own size: the known-good call of that size proves
    the model works. Before, the whole batch's size was compared, nothing was blamed on the inputs, and
    three such bursts failed a healthy replica's health check."""
    import threading

    gate, outcomes = threading.Event(), []

    def compute(items):
        if items == ["hold"]:
            gate.wait(10)
        return [RuntimeError("bad input") if item == "bad" else item.upper() for item in items]

    def raising(items):  # a batch that fails as a whole: its size may be the cause
        raise RuntimeError("out of memory")

    queue = ModelQueue("blame-alone-test", on_batch=outcomes.append)
    try:
        assert queue.submit(compute, "good").result(timeout=10)[0] == "GOOD"  # known good: 1 record
        for work in (compute, raising):
            held = queue.submit(compute, "hold")
            bad = [queue.submit(work, "bad", cap=8) for _ in range(3)]
            gate.set()
            held.result(timeout=10)
            for future in bad:
                with pytest.raises(RuntimeError):
                    future.result(timeout=10)
            gate.clear()
            assert outcomes[-1].records == 3 and outcomes[-1].failed
            assert outcomes[-1].inputs_blamed is (work is compute)
    finally:
        queue.shutdown()


def test_a_batch_run_again_call_by_call_is_no_evidence_for_the_adaptive_size():
    """One bad call makes its batch run again call by call: that time is not one batch's, and fed to the
    SLO sizer it shrank every user's batch size toward its minimum."""
    from deployments.batch_config import BatchConfig
    from deployments.model_queue import BatchOutcome
    from deployments.replica import ModelReplica

    outcomes = []
    queue = ModelQueue("rerun-test", on_batch=outcomes.append)
    try:
        mixed = queue.submit(lambda items: [RuntimeError("bad"), "ok"][:len(items)], "x")
        with pytest.raises(RuntimeError):
            mixed.result(timeout=10)
        assert queue.submit(lambda items: ["ok"] * len(items), "y").result(timeout=10)[0] == "ok"
    finally:
        queue.shutdown()
    assert [o.rerun for o in outcomes] == [True, False]

    class Replica(ModelReplica):
        deployment_name = "rerun"

        def _batched_methods(self):
            return []

    Replica.default_batch = BatchConfig(max_batch_size=16, batch_wait_timeout_s=0.01,
                                        target_p99_batch_latency_s=0.1)
    replica = Replica()
    replica._init_replica()
    assert replica._sizer is not None  # target_p99_batch_latency_s: the SLO sizer is on
    seen = []
    replica._sizer.observe = lambda *args: seen.append(args)
    for rerun in (True, False):  # (a rerun for one bad call: that call failed alone)
        replica._record_batch(BatchOutcome(0, 16, 5.0, 5.0, failed=False, rerun=rerun, failed_records=int(rerun)))
    assert seen == [(5.0, 16, False)]
    # A rerun whose calls all succeeded alone failed at its size (an out of memory): over the target, so the size
    # backs off (skipped, it was kept for good and every batch of it failed again).
    replica._record_batch(BatchOutcome(0, 16, 5.0, 5.0, failed=False, rerun=True, failed_records=0))
    assert seen[-1] == (float("inf"), 16, False)
    replica._model_thread.shutdown()


def test_a_batch_whose_joined_call_failed_but_every_call_then_succeeded_alone_is_a_rerun():
    """A batch too large for the model (an out of memory on a GPU) raised, and each call then succeeded alone: the
    outcome said a full batch under target, and the SLO sizer grew past the size that had just failed."""
    from deployments.batching import RanAlone, run_grouped, run_joined

    def oom_past_three(texts):
        if len(texts) > 3:
            raise RuntimeError("CUDA out of memory")
        return [t.upper() for t in texts]

    joined = run_joined([["a", "b"], ["c", "d"]], oom_past_three, lambda r, start, stop: r[start:stop], "t")
    grouped = run_grouped(["k", "k"], [["a", "b"], ["c", "d"]], lambda key, texts: oom_past_three(texts), isolate=True)
    assert isinstance(joined, RanAlone) and isinstance(grouped, RanAlone) and grouped == [["A", "B"], ["C", "D"]]
    assert not isinstance(run_grouped(["k"], [["a"]], lambda key, texts: oom_past_three(texts), isolate=True),
                          RanAlone)

    outcomes = []
    queue = ModelQueue("oom-test", on_batch=outcomes.append)
    try:
        assert queue.submit(lambda items: RanAlone(["ok"] * len(items)), "x").result(timeout=10)[0] == "ok"
    finally:
        queue.shutdown()
    assert [(o.failed, o.rerun) for o in outcomes] == [(False, True)]


def test_a_call_that_failed_alone_in_a_batch_counts_as_a_failure_not_as_computed_records():
    """Batched with good calls, a bad call's records were counted computed and no failure was recorded; alone, the
    same call counted a failure and no records: an alert on model failures went quiet exactly under load."""
    import threading

    from deployments.batching import RanAlone
    from deployments.model_queue import BatchOutcome
    from deployments.replica import ModelReplica

    gate, outcomes = threading.Event(), []
    queue = ModelQueue("partial-test", on_batch=outcomes.append)
    try:
        first = queue.submit(lambda items: gate.wait(10) and ["ok"] * len(items), "first")
        def compute(items):  # what run_joined hands back when the joined call raised: each call's own outcome
            return RanAlone(RuntimeError("bad") if item == "bad" else "ok" for item in items)

        bad = queue.submit(compute, "bad", records=2, cap=8)
        good = queue.submit(compute, "good", records=3, cap=8)
        gate.set()
        first.result(timeout=10)
        with pytest.raises(RuntimeError):
            bad.result(timeout=10)
        assert good.result(timeout=10)[0] == "ok"
    finally:
        queue.shutdown()
    assert [(o.records, o.failed, o.failed_records) for o in outcomes] == [(1, False, 0), (5, False, 2)]

    from deployments.batch_config import BatchConfig

    class Replica(ModelReplica):
        deployment_name = "partial"
        default_batch = BatchConfig(max_batch_size=16, batch_wait_timeout_s=0.01)

        def _batched_methods(self):
            return []

    replica = Replica()
    replica._init_replica()
    try:
        replica._record_batch(BatchOutcome(0, 5, 0.1, 0.1, failed=False, rerun=True, failed_records=2))
        assert replica._stats["computed"] == 3 and replica._stats["computed_interactive"] == 3
    finally:
        replica._model_thread.shutdown()
