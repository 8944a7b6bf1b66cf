"""Several Ray clusters on one job store, as during a RayService's blue/green upgrade: each cluster's
JobManager runs the jobs submitted to its own cluster (its own lease), and once a cluster is gone the
others adopt its unfinished jobs. Against the real stores (SQLite, Debian's redis-server) and two job
runners on one SQLite file."""

from __future__ import annotations

import asyncio
import sqlite3
from dataclasses import replace

from serve_app.jobs import adoption
from serve_app.jobs.runner import JobRunner
from serve_app.jobs.store.sqlite import SCHEMA, SqliteJobStore
from serve_app.settings import load_settings
from tests.unit.fakes import FakeEmbedder
from tests.unit.test_jobs_recovery import GatedTranslator, _finished, fast_maintenance  # noqa: F401 - fixture
from tests.unit.test_jobs_store import LIMITS, _job, open_store, redis_server  # noqa: F401 - fixtures


def _clusters(records) -> dict[str, str]:
    return {r.id: r.cluster for r in records}


def test_each_cluster_has_its_own_lease_and_a_gone_cluster_s_jobs_are_adopted(open_store):
    async def scenario():
        blue, green = open_store("blue"), open_store("green")
        await blue.create(replace(_job(1), cluster="blue"), b"{}", LIMITS)
        await green.create(replace(_job(2), cluster="green"), b"{}", LIMITS)
        await green.create(replace(_job(3), cluster="blue"), b"{}", LIMITS)
        await green.finish("job3", "succeeded", 1_001.0, 2_000.0)
        assert await blue.lease().acquire() and await green.lease().acquire()  # one lease per cluster
        assert not await open_store("blue").lease().acquire()  # a second JobManager of blue waits
        assert await green.adopt("blue") == 0  # blue's JobManager lives: its job stays its own
        assert _clusters(await green.unfinished()) == {"job1": "blue", "job2": "green"}
        await blue.lease().release()  # blue is torn down
        assert await green.adopt("blue") == 1  # the unfinished job only
        assert _clusters(await blue.unfinished()) == {"job1": "green", "job2": "green"}
        assert (await green.get("job3")).cluster == "blue"
        assert await green.adopt("blue") == 0

    asyncio.run(scenario())


def test_jobs_of_the_unnamed_cluster_are_adopted_by_a_named_one(open_store):
    """The first upgrade to a named cluster (KubeRay sets RAY_CLUSTER_NAME) from a store without names."""
    async def scenario():
        old, new = open_store(), open_store("green")
        await old.create(_job(1), b"{}", LIMITS)
        assert await old.lease().acquire() and await new.adopt("") == 0
        await old.lease().release()
        assert await new.adopt("") == 1 and _clusters(await new.unfinished()) == {"job1": "green"}

    asyncio.run(scenario())


def test_a_sqlite_store_from_before_clusters_is_read_with_its_jobs_unnamed(tmp_path):
    path = tmp_path / "jobs.sqlite3"
    db = sqlite3.connect(path)
    db.executescript(SCHEMA.replace(", cluster TEXT NOT NULL DEFAULT ''", ""))
    db.execute("INSERT INTO jobs (id, owner, task, status, records_total, chunk_records, created_at, body_hash, "
               "reserved_bytes) VALUES ('old', 'a', 'translation', 'queued', 3, 8, 1.0, 'h', 10)")
    db.commit()
    db.close()

    async def scenario():
        store = SqliteJobStore(path, cluster="green")
        try:
            assert _clusters(await store.unfinished()) == {"old": ""}
            assert await store.adopt("") == 1 and _clusters(await store.unfinished()) == {"old": "green"}
        finally:
            await store.close()

    asyncio.run(scenario())


def _payload(tag: str, n: int = 3) -> dict:
    return {"fromLang": "en", "toLang": "pt", "records": [{"id": str(i), "text": f"{tag}{i}"} for i in range(n)]}


def _texts(translator) -> set[str]:
    return {text for chunk in translator.calls for text in chunk.texts}


def test_each_cluster_s_job_manager_runs_its_own_jobs_then_adopts_those_of_the_cluster_gone(
        tmp_path, fast_maintenance, monkeypatch):  # noqa: F811 - the fixture
    monkeypatch.setattr(adoption, "ADOPT_AFTER_S", 0.0)
    settings = load_settings({"jobs": {"max_records_per_job": 50, "chunk_records": 8}})

    def runner(cluster: str, translator) -> JobRunner:
        store = SqliteJobStore(tmp_path / "jobs.sqlite3", cluster=cluster)
        return JobRunner(settings, {"translation": translator, "embeddings": FakeEmbedder()}, store=store)

    async def scenario():
        old_model, new_model = GatedTranslator(), GatedTranslator()
        new_model.gate.set()
        blue, green = runner("blue", old_model), runner("green", new_model)
        await blue.start()
        await green.start()
        running = [blue, green]
        try:
            old_job = (await blue.submit("translation", _payload("blue")))["job_id"]
            new_job = (await green.submit("translation", _payload("green")))["job_id"]
            assert (await _finished(green, new_job))["status"] == "succeeded"
            assert _texts(new_model) == {"green0", "green1", "green2"} and old_model.calls == []
            assert (await green.get(old_job))["status"] in ("queued", "running")
            await running.pop(0).stop()  # the old cluster is torn down mid-job
            view = await _finished(green, old_job)
            assert view["status"] == "succeeded", view
            assert [r["text"] for r in view["result"]["result"]] == ["[pt] blue0", "[pt] blue1", "[pt] blue2"]
            assert _texts(new_model) == {"green0", "green1", "green2", "blue0", "blue1", "blue2"}
        finally:
            for job_runner in running:
                await job_runner.stop()

    asyncio.run(scenario())


def test_adopting_skips_a_job_whose_record_is_gone_from_redis(redis_server):  # noqa: F811 - the fixture
    """An id left in `unfinished` without its record (evicted, deleted by hand): adopting must not write a stub
    record, which every later read of the unfinished jobs would fail to decode."""
    from serve_app.jobs.store.redis_store import RedisJobStore

    async def scenario():
        old, new = (RedisJobStore(redis_server.url, prefix="test:gone-record:", cluster=c) for c in ("", "green"))
        try:
            await old.create(_job(1), b"{}", LIMITS)
            await old.create(_job(2), b"{}", LIMITS)
            await old.redis.delete(old.key("job", "job1"))
            assert await new.adopt("") == 1
            assert _clusters(await new.unfinished()) == {"job2": "green"}
            assert not await old.redis.exists(old.key("job", "job1"))
        finally:
            await old.close()
            await new.close()

    asyncio.run(scenario())


def test_a_cluster_s_jobs_are_adopted_only_once_its_lease_stayed_free_past_the_grace(tmp_path):
    """A JobManager replica of the new cluster lost and restarted (its lease lapses for a moment) must not hand
    its jobs to the old cluster, to run on older code."""
    now = [0.0]

    async def scenario():
        blue, green = (SqliteJobStore(tmp_path / "jobs.sqlite3", cluster=c) for c in ("blue", "green"))
        watch = adoption.Adoption(blue, lambda: now[0])
        try:
            await green.create(replace(_job(1), cluster="green"), b"{}", LIMITS)
            assert await green.lease().acquire() and await watch.adopt_gone(["green"]) == 0
            await green.lease().release()  # green's JobManager lost...
            assert await watch.adopt_gone(["green"]) == 0
            now[0] = adoption.ADOPT_AFTER_S - 1
            assert await watch.adopt_gone(["green"]) == 0
            assert await green.lease().acquire()  # ...and back within the grace: its jobs stay its own
            now[0] = 2 * adoption.ADOPT_AFTER_S
            assert await watch.adopt_gone(["green"]) == 0
            await green.lease().release()  # green gone for good
            assert await watch.adopt_gone(["green"]) == 0
            now[0] += adoption.ADOPT_AFTER_S
            assert await watch.adopt_gone(["green"]) == 1
            assert _clusters(await blue.unfinished()) == {"job1": "blue"}
            # A restart seen once, after which green's jobs all finished (nothing of green's to watch), then,
            # an hour on, another restart: the grace counts from this one, not from the first
            assert await green.lease().acquire()
            await green.create(replace(_job(2), cluster="green"), b"{}", LIMITS)
            await green.lease().release()
            assert await watch.adopt_gone(["green"]) == 0  # free: seen now
            assert await watch.adopt_gone([]) == 0  # green's job finished: not watched
            now[0] += 3600
            assert await watch.adopt_gone(["green"]) == 0  # green restarting again: the grace starts again
            now[0] += adoption.ADOPT_AFTER_S
            assert await watch.adopt_gone(["green"]) == 1
        finally:
            await blue.close()
            await green.close()

    asyncio.run(scenario())
