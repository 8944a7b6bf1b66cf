"""The continuous scheduler's admission against the cache cap: the bound (deployments/backends/cache_projection.py)
grown one joiner at a time, built once per admission, and the rows of done calls not counted."""

from __future__ import annotations

import random
from collections import deque
from types import SimpleNamespace

import pytest

from deployments.backends.cache_projection import CacheProjection
from deployments.backends.continuous_decoder import DecodeRequest
from deployments.continuous_steps import Call

from .test_continuous_scheduling import scheduler_for  # noqa: F401 - the fixture


def _bound(rows: list[tuple[int, SimpleNamespace]]) -> int:
    """The decoders' formula, computed afresh: rows x (furthest reach from the earliest start + longest source)."""
    if not rows:
        return 0
    first = min(start for start, _ in rows)
    return len(rows) * (max(start - first + r.max_new_tokens + 1 for start, r in rows)
                        + max(len(r.input_ids) for _, r in rows))


@pytest.mark.parametrize("seed", range(20))
def test_the_projection_grown_one_joiner_at_a_time_equals_the_bound_computed_afresh(seed):
    rng = random.Random(seed)
    request = lambda: SimpleNamespace(max_new_tokens=rng.randint(1, 300),  # noqa: E731
                                      input_ids=[0] * rng.randint(1, 200))
    join_at = rng.randint(0, 500)
    running = [(rng.randint(max(0, join_at - 300), join_at), request()) for _ in range(rng.randint(0, 40))]
    projection, rows = CacheProjection.over(running, join_at), list(running)
    assert projection.tokens == _bound(rows)
    for _ in range(rng.randint(1, 40)):
        joiner = request()
        assert projection.tokens_if_joined(joiner) == _bound(rows + [(join_at, joiner)])
        assert projection.tokens == _bound(rows)  # asking does not add it
        projection.join(joiner)
        rows.append((join_at, joiner))
        assert projection.tokens == _bound(rows)


def _waiting(scheduler, backend, text: str, max_new: int) -> DecodeRequest:
    """A one-sentence call queued as submit queues it (the caller holds the scheduler's lock)."""
    call = Call(1, 0)
    (ids,) = backend.encode_texts([text], "en")
    request = DecodeRequest(list(ids), max_new, max_new, None, tag=(call, 0))
    scheduler._waiting.setdefault(0, deque()).append(request)
    return request


def test_admission_builds_the_bound_once_and_done_calls_rows_hold_no_cache(scheduler_for):  # noqa: F811
    """Each waiting sequence's fit was computed over the running rows and every joiner before it: O(n^2) under the
    lock, with hundreds of slots on a GPU. And a cancelled call's row, which leaves before the join, still counted
    against max_cached_tokens: a sentence that fits alone waited an iteration more."""
    scheduler, backend = scheduler_for(max_cached_tokens=400, max_running_sequences=64)
    built = []
    projection = scheduler.decoder.projection
    scheduler.decoder.projection = lambda **kwargs: built.append(1) or projection(**kwargs)
    with scheduler._cond:  # the decoding thread waits for a notify it does not get
        gone = Call(1, 0)
        (ids,) = backend.encode_texts(["a b c d e f g h"], "en")
        scheduler.decoder.join([DecodeRequest((list(ids) * 20)[:150], 20, 20, None, tag=(gone, 0))])
        try:
            gone.future.cancel()
            long = _waiting(scheduler, backend, "a b c d e f g h", 60)  # beside the 150-token source: 2 x 211 > 400
            assert scheduler._admissible() == [long]  # alone once the cancelled row is not counted
            assert len(built) == 1
            short = [_waiting(scheduler, backend, "a", 5) for _ in range(40)]
            admitted = scheduler._admissible()
            assert len(built) == 2  # once per admission, however many sequences it weighs
            assert admitted[0] is long and 1 < len(admitted) < 41
            live = lambda request: request.tag[0] is not gone  # noqa: E731
            assert projection(keep=live, joining=admitted).tokens <= 400
            assert projection(keep=live, joining=admitted + [short[len(admitted) - 1]]).tokens > 400
        finally:
            scheduler.decoder.drop({(gone, 0)})
            scheduler._waiting.clear()
