"""One API key's share of the job store (jobs.max_share_per_key), against both real stores: at submission,
and as a running job's result outgrows its estimate."""

from __future__ import annotations

import asyncio

import pytest

from serve_app.jobs.job import JobStoreFull
from tests.unit.test_jobs_store import LIMITS, _job, open_store, redis_server  # noqa: F401 - the fixtures


def test_one_owner_takes_at_most_its_share_and_others_still_submit(open_store):
    """jobs.max_share_per_key: one API key filling the store would leave every other key 503 for an hour."""
    from dataclasses import replace

    shared = replace(LIMITS, max_unfinished_jobs=10, max_jobs=10, max_unfinished_per_owner=2, max_jobs_per_owner=3,
                     max_bytes_per_owner=250)

    async def scenario():
        store = open_store()
        for n in (1, 2):
            await store.create(_job(n, owner="a"), b"{}", shared)
        with pytest.raises(JobStoreFull, match="2 queued or running jobs, its share") as refused:
            await store.create(_job(3, owner="a"), b"{}", shared)
        assert refused.value.retry_after_s == 2
        await store.create(_job(4, owner="b"), b"{}", shared)  # another key is not held back
        await store.put_chunk("job1", 0, 4, {}, b"x" * 100, shared)
        await store.finish("job1", "succeeded", 1_010.0, 1_070.0)
        with pytest.raises(JobStoreFull, match="250 result bytes"):  # 100 kept + 100 running + 100 > 250
            await store.create(_job(5, owner="a"), b"{}", shared)
        await store.create(_job(6, owner="a", reserved=50), b"{}", shared)
        await store.finish("job6", "failed", 1_010.0, 1_070.0, {"error": "x", "error_type": "internal_error"})
        with pytest.raises(JobStoreFull, match="3 jobs kept"):  # finished ones count until they expire
            await store.create(_job(7, owner="a", reserved=10), b"{}", shared)
        open_store.clock.now = 1_070.0  # a's finished jobs expire: its share is free again
        await store.create(_job(8, owner="a"), b"{}", shared)
        for n in (9, 10, 11):  # without API keys every request is one owner: no share of its own
            await store.create(_job(n, owner="anonymous"), b"{}", shared.for_owner("anonymous"))

    asyncio.run(scenario())


def test_a_result_outgrowing_its_estimate_stays_within_its_owner_s_share(open_store):
    """The share was checked only at submission: jobs estimated small whose results grew (a custom model's
    long outputs) let one key hold the whole store, and every other key got 503 for result_ttl_s."""
    from dataclasses import replace

    shared = replace(LIMITS, max_unfinished_jobs=10, max_jobs=10, max_job_result_bytes=400, max_bytes_per_owner=500)

    async def scenario():
        store = open_store()
        for n in (1, 2, 3):
            await store.create(_job(n, owner="a", reserved=10), b"{}", shared)
        await store.create(_job(4, owner="b", reserved=10), b"{}", shared)
        assert await store.put_chunk("job1", 0, 4, {}, b"x" * 400, shared)  # a: 400 + 10 + 10
        assert await store.put_chunk("job4", 0, 4, {}, b"x" * 400, shared)  # b's bytes are b's
        with pytest.raises(JobStoreFull, match="this API key's share of the job store \\(500 result bytes"):
            await store.put_chunk("job2", 0, 4, {}, b"x" * 100, shared)  # a: 400 + 100 + 10 > 500
        assert await store.put_chunk("job2", 0, 4, {}, b"x" * 80, shared)  # 400 + 80 + 10: at 490
        assert await store.put_chunk("job3", 0, 4, {}, b"x" * 10, shared)  # within its reservation: no check
        anonymous = shared.for_owner("anonymous")  # without keys, one owner: not bounded apart
        await store.create(_job(5, owner="anonymous", reserved=10), b"{}", anonymous)
        assert await store.put_chunk("job5", 0, 4, {}, b"x" * 400, anonymous)
        return [(await store.get(f"job{n}")).used_bytes for n in (1, 2, 3, 4, 5)]

    assert asyncio.run(scenario()) == [400, 80, 10, 400, 400]
