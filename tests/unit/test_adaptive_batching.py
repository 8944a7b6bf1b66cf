"""The AIMD batch-size controller, driven with synthetic batch latencies: no Ray, no clock."""

import asyncio

import pytest

from deployments.adaptive_batching import AIMDBatchSizer, AIMDSettings, p99
from deployments.batch_config import parse_batch_config


def settings(**overrides):
    values = dict(target_p99_s=0.1, min_size=2, max_size=32, increase_records=1, backoff_factor=0.5,
                  window_batches=5)
    values.update(overrides)
    return AIMDSettings(**values)


def sizer(initial=None, **overrides):
    applied = []
    return AIMDBatchSizer(settings(**overrides), applied.append, initial=initial), applied


def test_p99_is_nearest_rank_and_the_max_of_few_samples():
    assert p99([0.3, 0.1, 0.2]) == 0.3
    assert p99([i / 100 for i in range(1, 201)]) == 1.98
    with pytest.raises(ValueError):
        p99([])


def test_starts_at_max_size_and_applies_it():
    controller, applied = sizer()
    assert controller.size == 32 and applied == [32]


def test_additive_increase_while_under_target_up_to_max():
    controller, applied = sizer(initial=4, increase_records=3)
    for _ in range(20):
        controller.observe(0.05, records=controller.size)
    assert applied[:4] == [4, 7, 10, 13]
    assert controller.size == 32 and applied[-1] == 32
    assert applied.count(32) == 1  # no re-apply once at the cap


def test_multiplicative_decrease_when_over_target_down_to_min():
    controller, applied = sizer()
    sizes = [controller.observe(0.5, records=controller.size) for _ in range(6)]
    assert sizes == [16, 8, 4, 2, 2, 2]
    assert controller.decreases == 4 and applied == [32, 16, 8, 4, 2]


def test_one_slow_batch_backs_off_once_then_fresh_fast_batches_grow_again():
    controller, _ = sizer(initial=20)
    controller.observe(0.04, 20)
    controller.observe(0.3, 21)  # over target: 21 * 0.5
    assert controller.size == 10
    # the slow sample left the window with the decrease: the next fast batch grows
    assert controller.observe(0.04, 10) == 11
    assert controller.window_p99_s() == pytest.approx(0.04)


def test_window_p99_keeps_the_size_down_while_slow_batches_remain_in_it():
    controller, _ = sizer(initial=10, window_batches=3, backoff_factor=0.9)
    controller.observe(0.05, 10)  # 11
    controller.observe(0.05, 11)  # 12
    controller.observe(0.15, 12)  # over: 12 * 0.9 -> 10, window cleared
    assert controller.size == 10
    assert controller.observe(0.099, 10) == 11  # at/under target grows


def test_converges_to_the_largest_size_that_meets_the_target():
    # a model whose batch time is 10 ms + 5 ms per record: the target 0.1 s allows 18 records
    controller, _ = sizer(initial=2, backoff_factor=0.9, window_batches=10)
    sizes = [controller.observe(0.01 + 0.005 * controller.size, controller.size) for _ in range(300)]
    # the AIMD sawtooth: 19 (over target) is tried, backed off to floor(19 * 0.9) = 17, regrown
    assert set(sizes[-100:]) == {17, 18, 19}


def test_longer_inputs_shrink_the_size_and_shorter_ones_let_it_grow_back():
    controller, _ = sizer(initial=2, window_batches=10)
    per_record_s = 0.002
    for _ in range(100):
        controller.observe(per_record_s * controller.size, controller.size)
    assert controller.size == 32  # short inputs: even the cap is fast enough
    per_record_s = 0.02  # sentences 10x longer: 5 records fit 0.1 s
    for _ in range(100):
        controller.observe(per_record_s * controller.size, controller.size)
    assert 2 <= controller.size <= 5
    per_record_s = 0.002
    for _ in range(100):
        controller.observe(per_record_s * controller.size, controller.size)
    assert controller.size == 32


def test_only_a_full_batch_under_target_grows_the_size_and_any_slow_one_shrinks_it():
    """A part-filled batch (light load, a call alone) says nothing of whether a larger size meets the target."""
    controller, _ = sizer(initial=8)
    assert [controller.observe(0.01, records=3) for _ in range(20)] == [8] * 20
    assert controller.observe(0.01, records=8) == 9
    # calls of 8 records fill at most 8 of 9: a batch the next call did not fit is full (else it would never grow)
    assert controller.observe(0.01, records=8, full=True) == 10
    assert controller.observe(0.5, records=2) == 5  # slow even part-filled: over target at this size


def test_empty_batches_are_ignored():
    controller, _ = sizer(initial=5)
    assert controller.observe(9.0, records=0) == 5
    assert controller.window_p99_s() is None


def test_reconfigure_keeps_the_learned_size_within_the_new_bounds():
    controller, applied = sizer(initial=20)
    controller.reconfigure(settings(max_size=12))
    assert controller.size == 12 and applied[-1] == 12
    controller.reconfigure(settings(max_size=64))
    assert controller.size == 12 and applied[-1] == 12  # re-applied after the replica set its max


def test_snapshot_reports_the_live_state():
    controller, _ = sizer(initial=8)
    controller.observe(0.5, 8)
    assert controller.snapshot() == {"live_max_batch_size": 4, "window_p99_batch_latency_s": None,
                                     "window_batches": 0, "increases": 0, "decreases": 1}


def test_settings_from_user_config_and_off_when_no_target():
    base = {"max_batch_size": 16, "batch_wait_timeout_s": 0.01}
    assert AIMDSettings.from_batch_config(parse_batch_config(base, "T")) is None
    config = parse_batch_config({**base, "target_p99_batch_latency_s": 0.25, "adaptive_min_batch_size": 4,
                                 "adaptive_increase_records": 2, "adaptive_backoff_factor": 0.9,
                                 "adaptive_window_batches": 50}, "T")
    assert AIMDSettings.from_batch_config(config) == AIMDSettings(0.25, 4, 16, 2, 0.9, 50)


@pytest.mark.parametrize("bad, quoted", [
    ({"adaptive_min_batch_size": 32}, "adaptive_min_batch_size=32 exceeds max_batch_size=16"),
    ({"adaptive_backoff_factor": 1.0}, "adaptive_backoff_factor=1.0"),
    ({"target_p99_batch_latency_s": 0}, "target_p99_batch_latency_s=0"),
    ({"max_batch_tokens": 0}, "max_batch_tokens=0"),
    ({"adaptive_window_batches": 0}, "adaptive_window_batches=0"),
])
def test_bad_adaptive_config_is_rejected_quoting_the_value(bad, quoted):
    with pytest.raises(ValueError, match=quoted):
        parse_batch_config({"max_batch_size": 16, "batch_wait_timeout_s": 0.01, **bad}, "Translator")


@pytest.mark.parametrize("bad", [dict(min_size=0), dict(min_size=40), dict(backoff_factor=1.2),
                                 dict(target_p99_s=0), dict(window_batches=0)])
def test_bad_settings_are_rejected(bad):
    with pytest.raises(ValueError):
        settings(**bad)


# --- in the Translator replica: the controller moves the batch queue's max_batch_size --------

def test_replica_shrinks_its_live_batch_size_when_batches_miss_the_target(monkeypatch, loop):
    from deployments.batching import Chunk
    from deployments.translator import Translator
    from deployments.settings import TranslationSettings
    from tests.unit.test_length_batching import WordBackend

    backend = WordBackend()
    monkeypatch.setattr("deployments.translator.load_translation_backend", lambda settings, threads: backend)
    replica = Translator.func_or_class(TranslationSettings().model_dump())
    # any real batch takes longer than 1 ns: every batch is over target
    replica.reconfigure({"max_batch_size": 8, "batch_wait_timeout_s": 0.05, "target_p99_batch_latency_s": 1e-9,
                         "adaptive_backoff_factor": 0.5, "adaptive_min_batch_size": 2})
    assert replica.live_max_batch_size() == 8

    def translate(tag):
        texts, _ = loop.run_until_complete(replica.translate(Chunk("en", "pt", [f"{tag}{i}" for i in range(8)])))
        assert texts == [f"pt:{tag}{i}" for i in range(8)]

    translate("x")  # one batch of 8, over target: the live size halves to 4
    assert replica.live_max_batch_size() == 4
    # job (background) batches are capped apart (background_max_batch_size): they do not move the live size
    loop.run_until_complete(replica.translate(Chunk("en", "pt", ["z0", "z1"]), background=True))
    assert replica.live_max_batch_size() == 4
    translate("y")  # cut into calls of 4 (two batches over target: 4 -> 2 -> 2, the minimum)
    assert [len(call) for call in backend.calls] == [8, 2, 4, 4]
    assert replica.live_max_batch_size() == 2
    info = replica.info()["batching"]
    assert info["adaptive"]["live_max_batch_size"] == 2 and info["adaptive"]["decreases"] == 2
    # a serve deploy without the target turns the controller off: back to max_batch_size
    replica.reconfigure({"max_batch_size": 8, "batch_wait_timeout_s": 0.05})
    assert replica.live_max_batch_size() == 8 and "adaptive" not in replica.info()["batching"]


def test_a_queued_piece_the_live_size_shrank_under_is_cut_again(monkeypatch, loop):
    """Serve refuses an item larger than max_batch_size when it starts a batch; _submit_pieces
    cuts such a piece again to the live size instead of failing the call."""
    from deployments.translator import Translator
    from deployments.settings import TranslationSettings
    from tests.unit.test_length_batching import WordBackend

    monkeypatch.setattr("deployments.translator.load_translation_backend", lambda settings, threads: WordBackend())
    replica = Translator.func_or_class(TranslationSettings().model_dump())
    replica.reconfigure({"max_batch_size": 8, "batch_wait_timeout_s": 0.0, "target_p99_batch_latency_s": 1.0})
    submitted = []

    async def batched(item, counted=False):
        submitted.append(list(item))
        if len(item) > 3:
            replica._sizer.size = 3  # the controller shrank the live size while this piece waited
            raise RuntimeError("Size of item is greater than max_batch_size.")
        return [t.upper() for t in item]

    results = loop.run_until_complete(replica._submit_pieces(batched, list("abcdefgh"), list))
    assert [t for piece in results for t in piece] == list("ABCDEFGH")
    assert submitted == [list("abcdefgh"), list("abc"), list("def"), list("gh")]

    async def broken(item, counted=False):
        raise RuntimeError("model broke")

    with pytest.raises(RuntimeError, match="model broke"):  # other errors are not retried
        loop.run_until_complete(replica._submit_pieces(broken, list("ab"), list))


def test_a_piece_cut_again_after_a_shrink_counts_its_records_enqueued_once(monkeypatch, loop):
    """Through Serve's real batch queue: a piece refused for the live size that just shrank is cut and
    sent again; its records count once, so enqueued = computed + cancelled still holds."""
    from deployments.batching import Chunk
    from deployments.settings import TranslationSettings
    from deployments.translator import Translator
    from tests.unit.test_length_batching import WordBackend

    monkeypatch.setattr("deployments.translator.load_translation_backend", lambda settings, threads: WordBackend())
    replica = Translator.func_or_class(TranslationSettings().model_dump())
    replica.reconfigure({"max_batch_size": 8, "batch_wait_timeout_s": 0.2, "target_p99_batch_latency_s": 100.0,
                         "skip_batch_wait_when_alone": False})

    async def scenario():
        first = asyncio.ensure_future(replica.translate(Chunk("en", "pt", ["a1", "a2"])))
        await asyncio.sleep(0.02)
        second = asyncio.ensure_future(replica.translate(Chunk("en", "pt", [f"b{i}" for i in range(8)])))
        await asyncio.sleep(0)  # cut at the live size 8, on its way into Serve's queue
        replica._sizer.size = 4  # the controller shrinks the live size meanwhile
        replica._set_live_max_batch_size(4)
        return await first, await second

    (first, _), (second, _) = loop.run_until_complete(scenario())
    assert len(first) == 2 and len(second) == 8
    stats = replica.stats()
    assert stats["enqueued"] == stats["computed"] + stats["cancelled"] == 10, stats


def test_a_batch_formed_before_a_back_off_does_not_back_off_again():
    """Calls queued under the old size still form batches of it after a back-off: each was slow, and each halved
    the size again (8 -> 4 -> 2 -> 1 in a review's run, where 4 records met the target)."""
    s, _ = sizer(initial=8, min_size=1, backoff_factor=0.5)
    assert s.observe(0.2, 8) == 4
    assert s.observe(0.2, 8) == 4 and s.observe(0.2, 6) == 4 and s.decreases == 1
    assert s.observe(0.2, 4) == 2  # a batch at the live size still counts


def test_calls_queued_before_a_back_off_form_batches_of_the_live_size():
    """A call carried the batch cap of when it was queued: after the SLO sizer halved the size, the calls waiting
    through the slow batch still formed batches of the old size, each one slow again."""
    import threading

    from deployments.model_queue import ModelQueue

    queue, computing, gate, batches, cap = ModelQueue("live-cap"), threading.Event(), threading.Event(), [], [8]

    def compute(items):
        batches.append(len(items))
        computing.set()
        gate.wait(10)
        return items

    try:
        futures = [queue.submit(compute, "first", 1, cap=lambda: cap[0])]
        assert computing.wait(10)
        futures += [queue.submit(compute, i, 1, cap=lambda: cap[0]) for i in range(8)]  # queued at size 8
        cap[0] = 4  # the size backed off while the first batch computed
        gate.set()
        for future in futures:
            future.result(10)
    finally:
        queue.shutdown()
    assert batches == [1, 4, 4]
