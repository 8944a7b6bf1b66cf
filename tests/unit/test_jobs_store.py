"""The job stores against their real servers: SQLite (a file in a temporary folder) and Debian's
redis-server (started here on a free port, killed afterwards). Same tests for both."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import pytest

from serve_app.errors import Overloaded
from serve_app.jobs.job import JobRecord, JobStoreFull, JobTooLarge, StoreLimits
from serve_app.jobs.store.redis_store import RedisJobStore
from serve_app.jobs.store import sqlite as sqlite_store
from serve_app.jobs.store.sqlite import SqliteJobStore
from tests.redis_server import RedisServer


class Clock:
    def __init__(self):
        self.now = 1_000.0

    def __call__(self):
        return self.now


LIMITS = StoreLimits(max_unfinished_jobs=3, max_jobs=5, max_total_result_bytes=10_000, retry_after_s=2)


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory):
    server = RedisServer(tmp_path_factory.mktemp("redis")).start()
    try:
        yield server
    finally:
        server.kill()


@pytest.fixture(params=["sqlite", "redis"])
def open_store(request, tmp_path):
    """A function opening the store (again: a restart) on the same file / Redis, used from a cluster."""
    clock = Clock()
    opened = []
    prefix = f"test:{request.node.name}:"

    def open_(cluster=""):
        if request.param == "sqlite":
            store = SqliteJobStore(tmp_path / "data" / "jobs.sqlite3", clock=clock, cluster=cluster)
        else:
            store = RedisJobStore(request.getfixturevalue("redis_server").url, prefix=prefix, clock=clock,
                                  cluster=cluster)
        opened.append(store)
        return store

    open_.clock = clock
    open_.kind = request.param
    yield open_
    for store in opened:
        try:
            asyncio.run(store.close())
        except Exception:
            pass


def _job(n: int, *, owner="a", key=None, reserved=100, records=10, created=1_000.0) -> JobRecord:
    return JobRecord(id=f"job{n}", owner=owner, task="translation", records_total=records, chunk_records=4,
                     created_at=created + n, key=key, body_hash=f"h{n}", reserved_bytes=reserved)


def test_a_job_its_chunks_and_its_expiry_survive_reopening_the_store(open_store):
    async def first():
        store = open_store()
        await store.create(_job(1, key="k1"), b'{"p":1}', LIMITS)
        await store.start("job1", 1_001.0)
        await store.put_chunk("job1", 0, 4, {"m": 0}, b"abcd", LIMITS)
        await store.put_chunk("job1", 0, 4, {"m": 0}, b"abcd", LIMITS)  # stored twice: counted once
        await store.put_chunk("job1", 2, 2, {"m": 2}, b"ef", LIMITS)
        await store.create(_job(2), b"{}", LIMITS)
        await store.finish("job2", "cancelled", 1_002.0, 1_062.0)
        await store.close()

    async def second():
        store = open_store()
        job = await store.get("job1")
        assert (job.status, job.records_done, job.used_bytes, job.started_at) == ("running", 6, 6, 1_001.0)
        assert await store.payload("job1") == b'{"p":1}'
        assert await store.chunk_metas("job1") == {0: (4, {"m": 0}), 2: (2, {"m": 2})}
        assert (await store.chunks("job1", [0, 1, 2])) == {0: (4, {"m": 0}, b"abcd"), 2: (2, {"m": 2}, b"ef")}
        assert [j.id for j in await store.unfinished()] == ["job1"]
        assert (await store.find("a", "k1")).id == "job1" and await store.find("b", "k1") is None
        cancelled = await store.get("job2")
        assert cancelled.status == "cancelled" and await store.payload("job2") is None
        assert not await store.finish("job2", "succeeded", 1_003.0, 1_100.0)  # cancelled stays cancelled
        open_store.clock.now = 1_062.0  # job2 expired: absent at once, deleted by purge
        assert await store.get("job2") is None
        assert await store.purge(open_store.clock.now) == 1
        await store.close()

    asyncio.run(first())
    asyncio.run(second())


def test_limits_are_checked_with_each_create(open_store):
    async def scenario():
        store = open_store()
        for n in range(3):
            await store.create(_job(n), b"{}", LIMITS)
        with pytest.raises(Overloaded) as unfinished:
            await store.create(_job(9), b"{}", LIMITS)
        assert unfinished.value.error_type == "overloaded" and unfinished.value.retry_after_s == 2
        for n in range(3):  # each with a result as large as its reservation
            await store.put_chunk(f"job{n}", 0, 4, {}, b"x" * 100, LIMITS)
            await store.finish(f"job{n}", "succeeded", 1_010.0, 1_070.0)
        with pytest.raises(JobStoreFull):  # 300 reserved + 9,800 > 10,000
            await store.create(_job(3, reserved=9_800), b"{}", LIMITS)
        await store.create(_job(4, reserved=9_700), b"{}", LIMITS)
        await store.finish("job4", "failed", 1_010.0, 1_070.0, {"error": "x", "error_type": "internal_error"})
        assert (await store.counts())["result_bytes"] == 300  # a failed job's bytes are freed
        await store.create(_job(5), b"{}", LIMITS)
        with pytest.raises(JobStoreFull) as jobs:  # 6 jobs held, 5 allowed
            await store.create(_job(6), b"{}", LIMITS)
        assert jobs.value.status_code == 503
        open_store.clock.now = 1_070.0  # the finished ones expire: room again
        await store.create(_job(7), b"{}", LIMITS)
        counts = await store.counts()
        assert counts["queued"] == 2 and counts["succeeded"] == 0 and counts["result_bytes"] == 200

    asyncio.run(scenario())


def test_a_chunk_larger_than_its_reservation_counts_its_real_size(open_store):
    async def scenario():
        store = open_store()
        await store.create(_job(1, reserved=10), b"{}", LIMITS)
        await store.put_chunk("job1", 0, 4, {}, b"x" * 50, LIMITS)
        assert (await store.get("job1")).reserved_bytes == 50
        assert (await store.counts())["result_bytes"] == 50

    asyncio.run(scenario())


def test_a_chunk_past_the_job_s_bound_or_the_store_s_is_refused_and_nothing_counted(open_store):
    """A result larger than its submission's estimate (a custom model's long outputs) may grow up to
    jobs.max_job_result_bytes, and the store's results up to jobs.max_total_result_bytes; past either, the
    chunk is refused, so the store never holds more than its bound (Redis has a memory limit on Kubernetes)."""
    limits = StoreLimits(max_unfinished_jobs=3, max_jobs=5, max_total_result_bytes=100, retry_after_s=2,
                         max_job_result_bytes=80)

    async def scenario():
        store = open_store()
        await store.create(_job(1, reserved=10), b"{}", limits)
        assert await store.put_chunk("job1", 0, 4, {}, b"x" * 40, limits)  # past its estimate, within its bound
        with pytest.raises(JobTooLarge, match="80 bytes"):
            await store.put_chunk("job1", 1, 4, {}, b"x" * 41, limits)
        assert await store.put_chunk("job1", 0, 4, {}, b"x" * 40, limits)  # stored already: still accepted
        await store.create(_job(2, reserved=50), b"{}", limits)  # the store's results: 40 + 50
        with pytest.raises(JobStoreFull, match="100 bytes"):
            await store.put_chunk("job2", 0, 4, {}, b"x" * 61, limits)  # would grow it by 11, to 101
        assert await store.put_chunk("job2", 0, 4, {}, b"x" * 60, limits)  # to 100 exactly
        job1, job2 = await store.get("job1"), await store.get("job2")
        return (job1.used_bytes, job2.used_bytes, list(await store.chunk_metas("job1")),
                (await store.counts())["result_bytes"])

    assert asyncio.run(scenario()) == (40, 60, [0], 100)


def test_a_chunk_is_refused_once_its_job_finished(open_store):
    """A chunk written after the job was cancelled (or finished otherwise) is not kept nor counted."""
    async def scenario():
        store = open_store()
        await store.create(_job(1, reserved=10), b"{}", LIMITS)
        assert await store.put_chunk("job1", 0, 4, {}, b"abcd", LIMITS)
        assert await store.put_chunk("job1", 0, 4, {}, b"abcd", LIMITS)  # stored already: accepted, counted once
        await store.finish("job1", "cancelled", 1_001.0, 1_061.0)
        assert not await store.put_chunk("job1", 1, 4, {}, b"x" * 50, LIMITS)
        cancelled = await store.get("job1")
        assert await store.chunk_metas("job1") == {}
        assert cancelled.reserved_bytes == cancelled.used_bytes == 0
        await store.create(_job(2, reserved=10), b"{}", LIMITS)
        assert await store.put_chunk("job2", 0, 4, {}, b"abcd", LIMITS)
        await store.finish("job2", "succeeded", 1_001.0, 1_061.0)
        assert not await store.put_chunk("job2", 1, 4, {}, b"x" * 50, LIMITS)
        assert not await store.put_chunk("nojob", 0, 4, {}, b"abcd", LIMITS)
        succeeded = await store.get("job2")
        assert list(await store.chunk_metas("job2")) == [0] and succeeded.used_bytes == 4
        # job2's results are whole: its reservation (10) came down to what they hold; nothing of the refused
        assert succeeded.reserved_bytes == 4 and (await store.counts())["result_bytes"] == 4

    asyncio.run(scenario())


def test_a_key_is_one_job_per_owner_until_the_job_expires(open_store):
    async def scenario():
        store = open_store()
        first = await store.create(_job(1, key="k"), b"{}", LIMITS)
        again = await store.create(_job(2, key="k"), b"{}", LIMITS)
        other_owner = await store.create(_job(3, key="k", owner="b"), b"{}", LIMITS)
        assert again.id == first.id == "job1" and other_owner.id == "job3"
        await store.finish("job1", "succeeded", 1_001.0, 1_050.0)
        open_store.clock.now = 1_050.0
        assert await store.find("a", "k") is None
        assert (await store.create(_job(4, key="k"), b"{}", LIMITS)).id == "job4"

    asyncio.run(scenario())


def test_only_one_holder_of_the_lease(open_store):
    async def scenario():
        first, second = open_store(), open_store()
        assert await first.lease().acquire()
        assert not await second.lease().acquire()
        assert await first.lease().renew()
        await first.lease().release()
        assert await second.lease().acquire()

    asyncio.run(scenario())


def test_redis_jobs_survive_a_redis_server_restart(tmp_path):
    """SIGKILL redis-server (AOF, appendfsync always) and start it again on the same folder."""
    server = RedisServer(tmp_path / "redis", password="test-password-0123456789abcdef").start()
    try:
        async def write():
            store = RedisJobStore(server.url, password=server.password)
            await store.create(_job(1, key="k"), b'{"p":1}', LIMITS)
            await store.put_chunk("job1", 0, 4, {"i": 0}, b"\x00\x01\x02", LIMITS)
            await store.create(_job(2), b"{}", LIMITS)
            await store.finish("job2", "succeeded", 1_002.0, 9e9)
            await store.close()

        async def read():
            store = RedisJobStore(server.url, password=server.password)
            try:
                job = await store.get("job1")
                assert job is not None and job.status == "queued" and job.records_done == 4
                assert await store.chunks("job1", [0]) == {0: (4, {"i": 0}, b"\x00\x01\x02")}
                assert (await store.get("job2")).status == "succeeded"
                assert (await store.find("a", "k")).id == "job1"
                assert (await store.counts())["result_bytes"] == 100  # job2 succeeded holding nothing
            finally:
                await store.close()

        asyncio.run(write())
        server.kill(signal.SIGKILL)
        server.start()
        asyncio.run(read())
    finally:
        server.kill()


def test_a_relative_store_path_is_under_the_project_root_or_else_the_current_directory(tmp_path, monkeypatch):
    root = Path(__file__).resolve().parents[2]  # the checkout, where `make run` creates .data/
    assert SqliteJobStore.resolve(".data/jobs.sqlite3") == root / ".data" / "jobs.sqlite3"
    assert SqliteJobStore.resolve(str(tmp_path / "j.sqlite3")) == tmp_path / "j.sqlite3"
    # installed as a package (`pip install .`, the image): no checkout around the module
    monkeypatch.setattr(sqlite_store, "ROOT", tmp_path / "site-packages")
    monkeypatch.chdir(tmp_path)
    assert SqliteJobStore.resolve(".data/jobs.sqlite3") == tmp_path / ".data" / "jobs.sqlite3"
