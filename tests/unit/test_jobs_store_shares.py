"""One API key's share of the job store (jobs.max_share_per_key), against both real stores: at submission,
and as a running job's result outgrows its estimate; the share's rounding; two SQLite store edges."""

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


def test_a_key_s_share_is_not_rounded_up_by_float_noise():
    """0.07 x 100 is 7.000000000000001 in floats: the store gave one key 8 jobs where the running slots
    (FairSlots) gave it 7, and the docs say 7."""
    from serve_app.jobs.fair import FairSlots
    from serve_app.jobs.job import StoreLimits, share_of
    from serve_app.settings import load_settings

    assert [share_of(100, s) for s in (0.07, 0.14, 0.28, 0.55, 0.5, 0.071)] == [7, 14, 28, 55, 50, 8]
    assert share_of(3, 0.01) == 1  # at least one
    limits = StoreLimits.of(load_settings({"jobs": {"max_share_per_key": 0.07, "max_unfinished_jobs": 100,
                                                    "max_running_jobs": 100}}))
    assert limits.max_unfinished_per_owner == FairSlots(100, 0.07).per_owner == 7


def test_sqlite_a_resubmission_as_its_key_expires_is_answered(tmp_path):
    """create() read the clock twice: a job holding the key that expired between the reads was neither returned
    nor purged, and the INSERT hit the (owner, key) index: 503 job_store_unavailable. With one reading, the job is
    live at it (and answered) or expired (purged, and a new job made)."""
    from serve_app.jobs.store.sqlite import SqliteJobStore

    class Stepping:  # a clock that moves on at every read
        now = 1_000.0

        def __call__(self):
            self.now += 0.001
            return self.now

    clock = Stepping()

    async def scenario():
        store = SqliteJobStore(tmp_path / "jobs.sqlite3", clock=clock)
        try:
            await store.create(_job(1, key="k"), b"{}", LIMITS)
            await store.finish("job1", "succeeded", clock.now, clock.now + 0.0015)  # between create()'s two reads
            live = (await store.create(_job(2, key="k"), b"{}", LIMITS)).id
            await store.finish("job1", "succeeded", clock.now, clock.now + 0.0005)  # before its (one) reading
            return live, (await store.create(_job(3, key="k"), b"{}", LIMITS)).id
        finally:
            await store.close()
    assert asyncio.run(scenario()) == ("job1", "job3")


def test_sqlite_a_failed_commit_leaves_no_transaction_open(tmp_path):
    """A COMMIT that failed (busy, I/O) left its transaction open: every later call failed with "cannot start a
    transaction within a transaction" (503 on every /jobs call) until the JobManager restarted."""
    import sqlite3

    from serve_app.jobs.store.sqlite import SqliteJobStore

    async def scenario():
        store = SqliteJobStore(tmp_path / "jobs.sqlite3")
        try:
            await store.counts()  # connected
            db = store._db
            db.execute("PRAGMA foreign_keys=ON")  # a deferred constraint: the statement passes, its COMMIT fails
            db.execute("CREATE TEMP TABLE parent(id INTEGER PRIMARY KEY)")
            db.execute("CREATE TEMP TABLE child(pid INTEGER REFERENCES parent(id) DEFERRABLE INITIALLY DEFERRED)")
            with pytest.raises(sqlite3.IntegrityError):
                await store._run(lambda db: db.execute("INSERT INTO child VALUES (42)"))
            await store.create(_job(1), b"{}", LIMITS)  # the store goes on
            return (await store.get("job1")).id
        finally:
            await store.close()
    assert asyncio.run(scenario()) == "job1"
