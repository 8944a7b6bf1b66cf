"""Joining every N steps (`join_interval_steps`) in the continuous scheduler (deployments/continuous_batching.py),
on the tiny fixture models, without Ray. The scheduler's other tests: test_continuous_scheduling.py."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from deployments.continuous_batching import ContinuousScheduler

from .test_continuous_scheduling import Steps, scheduler_for  # noqa: F401 - a fixture
from .test_transformers_backend import TEXTS


def test_join_interval_steps_joins_every_n_steps_and_changes_no_output(scheduler_for):
    steps = Steps()
    scheduler, backend = scheduler_for(on_step=steps, max_running_sequences=6, join_interval_steps=4)
    calls = [TEXTS[i:i + n] for i, n in ((0, 1), (1, 3), (3, 2), (2, 5), (0, 7), (4, 1), (1, 2))]
    with ThreadPoolExecutor(4) as pool:
        futures = list(pool.map(lambda texts: scheduler.submit(texts, "en", "de"), calls))
    assert [f.result(timeout=60)[0] for f in futures] == [[backend.translate([t], "en", "de")[0] for t in texts]
                                                          for texts in calls]
    # into a running batch, fewer than half a batch (3) join only every 4th step
    joins = {i: o for i, o in enumerate(steps.outcomes) if o.joined}
    few = [i for i, o in joins.items() if o.running > o.joined and 2 * o.joined < 6]
    assert few and all(i - max(j for j in joins if j < i) >= 4 for i in few)


def test_the_cached_token_cap_holds_when_joining_every_n_steps(make_backend, tiny_marian_dir):
    """Joining every 8 steps, a finished row stays in the batch until the next rebuild while the self columns
    grow: a sentence admitted at exactly the cap pushed the caches 6 slots past it (60, 62, 64 of 58)."""
    steps = Steps()
    scheduler = ContinuousScheduler(make_backend(tiny_marian_dir), max_running_sequences=8, max_cached_tokens=58,
                                    max_new_tokens=40, join_interval_steps=8, on_step=steps)
    scheduler.limits = lambda text, ids: (20, 20)
    seen, step = [], scheduler.decoder.step

    def checked_step(**kwargs):
        finished = step(**kwargs)
        if len(scheduler.decoder._rows) > 1:
            seen.append(scheduler.decoder.cached_tokens())
        return finished
    scheduler.decoder.step = checked_step
    try:
        first = scheduler.submit(["Hello there."], "en", "de")
        steps.wait(lambda _: len(steps.outcomes) >= 5)  # the first is well into its 20 tokens
        second = scheduler.submit(["Hello there."], "en", "de")
        assert first.result(timeout=60)[0] == second.result(timeout=60)[0]
    finally:
        scheduler.shutdown()
    assert all(cached <= 58 for cached in seen), seen


def test_sequences_a_cap_holds_back_do_not_rebuild_the_batch_at_every_step(scheduler_for):
    """Joining every 8 steps, a waiting sentence that the cached-token cap keeps out is no reason to rebuild the
    batch (a compaction and a cache reshuffle) before the 8th step: it had counted towards "half a batch can
    join", so the batch was rebuilt at every step while nothing joined."""
    steps = Steps()
    scheduler, _ = scheduler_for(on_step=steps, max_running_sequences=2, max_cached_tokens=30,
                                       join_interval_steps=8)
    scheduler.limits = lambda text, ids: (20, 20)  # a lone sentence holds ~26 slots: a second never fits beside it
    rebuilds, compact = [], scheduler.decoder.compact

    def counted_compact():
        rebuilds.append(scheduler.decoder.running)
        return compact()
    scheduler.decoder.compact = counted_compact
    first = scheduler.submit(["Hello there."], "en", "de")
    steps.wait(lambda o: o.running == 1)
    second = scheduler.submit(["Hello there."], "en", "de")
    assert first.result(timeout=60)[0] == second.result(timeout=60)[0]
    alone = [o for o in steps.outcomes if o.running == 1]
    assert len(alone) >= 38  # two sentences of 20 tokens, one after the other
    assert len(rebuilds) <= 2 * (len(alone) // 8 + 2), (len(rebuilds), len(alone))
