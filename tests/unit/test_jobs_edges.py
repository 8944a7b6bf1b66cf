"""Edges of the jobs found by a read-only review (2026-11-30): the SQLite store is its user's alone, a cancel
that loses the race to the job's own end is 409, a page read as its job expires is 404, and limits that no
job could ever fit are refused when the settings load, not met with a 503 forever."""

from __future__ import annotations

import asyncio
import stat

import pytest

from serve_app.jobs.job import JobFinished, JobNotFound
from serve_app.jobs.store.sqlite import SqliteJobStore
from serve_app.settings import load_settings

from .fakes import FakeTranslator
from .test_jobs import _finished, _runner, _translation


def _mode(path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_the_sqlite_store_and_the_folder_it_creates_are_the_user_s_alone(tmp_path):
    async def scenario():
        runner, _, _ = await _runner(tmp_path / "data")
        view = await runner.submit("translation", _translation(3))
        await _finished(runner, view["job_id"])
        await runner.stop()

    (tmp_path / "data").mkdir()
    asyncio.run(scenario())
    files = [p for p in (tmp_path / "data").iterdir() if p.name.startswith("jobs.sqlite3")]
    assert {p.name for p in files} >= {"jobs.sqlite3", "jobs.sqlite3.lock"}
    assert {p.name: _mode(p) for p in files} == {p.name: 0o600 for p in files}
    store = SqliteJobStore(tmp_path / "fresh" / "jobs.sqlite3")
    assert _mode(store.path.parent) == 0o700


def test_an_existing_store_file_others_could_read_is_made_the_user_s_alone(tmp_path):
    path = tmp_path / "jobs.sqlite3"
    path.write_bytes(b"")
    path.chmod(0o644)

    async def scenario():
        store = SqliteJobStore(path)
        await store.counts()
        await store.close()

    asyncio.run(scenario())
    assert _mode(path) == 0o600


def test_a_cancel_that_loses_the_race_to_the_job_s_end_is_409(tmp_path):
    async def scenario():
        runner, _, _ = await _runner(tmp_path, start=False)
        view = await runner.submit("translation", _translation(3))
        finish = runner.store.finish

        async def ended_first(job_id, status, now, expires_at, error=None):
            await finish(job_id, "succeeded", now, expires_at)  # the job's last chunk landed in between
            return await finish(job_id, status, now, expires_at, error)

        runner.store.finish = ended_first
        try:
            with pytest.raises(JobFinished, match="succeeded"):
                await runner.cancel(view["job_id"])
        finally:
            await runner.stop()

    asyncio.run(scenario())


def test_a_page_read_as_its_job_expires_is_404_not_500(tmp_path):
    async def scenario():
        runner, _, _ = await _runner(tmp_path)
        view = await runner.submit("translation", _translation(20))
        await _finished(runner, view["job_id"])

        async def purged(job_id, indexes):  # the purge deleted the chunks after the record was read
            return {}

        runner.store.chunks = purged
        try:
            with pytest.raises(JobNotFound):
                await runner.get(view["job_id"])
        finally:
            await runner.stop()

    asyncio.run(scenario())


def test_a_job_limit_above_the_store_s_total_is_refused_quoting_both():
    with pytest.raises(ValueError, match="16777216.*33554432|33554432.*16777216"):
        load_settings({"jobs": {"max_total_result_bytes": 16 * 1024 * 1024}})
    assert load_settings({"jobs": {"max_total_result_bytes": 32 * 1024 * 1024}}).jobs.max_total_result_bytes


def test_a_job_whose_result_outgrows_its_bound_fails_job_too_large_at_once(tmp_path):
    """The estimate at submission was short (outputs far longer than the texts): the store refuses the chunk
    that passes jobs.max_job_result_bytes and the job fails, instead of retrying that refusal as an outage."""
    class Verbose(FakeTranslator):
        async def call(self, method, *args, **kwargs):
            result = await super().call(method, *args, **kwargs)
            return ([text + "!" * 200 for text in result[0]], result[1]) if method == "translate" else result

    async def scenario():
        runner, _, _ = await _runner(tmp_path, Verbose(), max_job_result_bytes=1024)
        view = await runner.submit("translation", _translation(10))
        async with asyncio.timeout(20):
            done = await _finished(runner, view["job_id"])
        await runner.stop()
        return done

    done = asyncio.run(scenario())
    assert done["status"] == "failed" and done["error"]["error_type"] == "job_too_large", done
    assert "1024" in done["error"]["error"]


def test_a_job_whose_payload_is_gone_fails_once_instead_of_being_relaunched_forever(tmp_path):
    """Redis past its maxmemory (or a hand) dropped the payload of a queued job: the job fails with
    job_payload_lost at its first run, and no model call is made for it."""
    async def scenario():
        runner, translator, _ = await _runner(tmp_path, start=False)
        view = await runner.submit("translation", _translation(3))
        await runner.store._run(lambda db: db.execute("UPDATE jobs SET payload = NULL WHERE id = ?",
                                                      (view["job_id"],)))
        await runner.start()
        try:
            async with asyncio.timeout(10):
                done = await _finished(runner, view["job_id"])
        finally:
            await runner.stop()
        return done, translator

    done, translator = asyncio.run(scenario())
    assert done["status"] == "failed" and done["error"]["error_type"] == "job_payload_lost", done
    assert translator.calls == []


@pytest.mark.parametrize("url", ["redis://:s3cret@redis:6379/0", "redis://redis:6379/0?password=s3cret",
                                 "rediss://user@redis:6379?db=0&password=s3cret"])
def test_a_redis_url_holding_a_password_is_refused(url):
    """redis-py takes the password from the URL's user info and from a `password` query argument alike; either
    would be logged by the JobManager and passed to every replica with the settings."""
    with pytest.raises(ValueError, match="holds a password"):
        load_settings({"jobs": {"redis_url": url}})
    assert load_settings({"jobs": {"redis_url": "redis://redis:6379/0?db=1"}}).jobs.redis_url


def test_an_embeddings_job_asking_for_dimensions_the_model_does_not_give_is_refused_at_submit(tmp_path):
    """As POST /v1/embeddings answers 400 at once; the job was accepted, held a slot, then failed."""
    from serve_app.errors import UnsupportedModel

    from .fakes import FakeEmbedder

    async def scenario():
        embedder = FakeEmbedder()
        runner, _, _ = await _runner(tmp_path, embedder=embedder, start=False)
        try:
            with pytest.raises(UnsupportedModel, match=f"gives {embedder.dims} dimensions, not 512"):
                await runner.submit("embeddings", {"input": ["a"], "dimensions": 512})
            assert (await runner.store.counts())["queued"] == 0
            accepted = await runner.submit("embeddings", {"input": ["a"], "dimensions": embedder.dims})
            assert accepted["status"] == "queued"
        finally:
            await runner.stop()

    asyncio.run(scenario())


def test_each_key_s_share_of_the_store_is_computed_from_the_bounds_and_fits_one_whole_job():
    from serve_app.jobs.job import StoreLimits

    limits = StoreLimits.of(load_settings({}))
    assert (limits.max_unfinished_per_owner, limits.max_jobs_per_owner) == (50, 550)
    assert limits.max_bytes_per_owner == 128 * 1024 * 1024
    small = StoreLimits.of(load_settings({"jobs": {"max_share_per_key": 0.01}}))
    assert small.max_unfinished_per_owner == 1 and small.max_bytes_per_owner == small.max_job_result_bytes
    assert limits.for_owner("anonymous").max_unfinished_per_owner > limits.max_unfinished_jobs
    assert limits.for_owner("k-3f2a") is limits


def test_one_api_key_cannot_queue_the_store_full_for_the_others(tmp_path):
    from serve_app.jobs.job import JobStoreFull

    async def scenario():
        runner, _, _ = await _runner(tmp_path, start=False, max_unfinished_jobs=10, max_share_per_key=0.3)
        try:
            for _ in range(3):
                await runner.submit("translation", _translation(2), owner="k-a")
            with pytest.raises(JobStoreFull, match="This API key's jobs hold 3 queued or running jobs"):
                await runner.submit("translation", _translation(2), owner="k-a")
            await runner.submit("translation", _translation(2), owner="k-b")
            for _ in range(5):  # without keys: one owner, bounded by the store alone
                await runner.submit("translation", _translation(2))
        finally:
            await runner.stop()

    asyncio.run(scenario())
