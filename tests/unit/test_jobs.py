"""Jobs without Ray: the runner on fake model clients and a real SQLite store (a temporary file):
states, order, limits, cancellation, restarts (resume without recomputing), idempotency, owners.

Why this module is long: one short test per behaviour of the jobs runner, which is one concept; split, its fakes and fixtures would be shared across files.
"""

import asyncio
import base64

import numpy as np
import pytest

from serve_app.errors import InvalidRequest, ModelUnavailable, Overloaded, PayloadTooLarge, UnsupportedLanguagePair
from serve_app.jobs.job import IdempotencyKeyReused, JobFinished, JobNotFound, JobTooLarge, UnsupportedTask
from serve_app.jobs.runner import JobRunner
from serve_app.jobs.store.sqlite import SqliteJobStore
from serve_app.settings import load_settings
from tests.support import until as _until
from tests.unit.fakes import FakeEmbedder, FakeTranslator


class Clock:
    def __init__(self):
        self.now = 1_000_000.0

    def __call__(self):
        return self.now


async def _runner(tmp_path, translator=None, embedder=None, clock=None, start=True, **jobs):
    settings = load_settings({"jobs": {"max_records_per_job": 50, "chunk_records": 8, **jobs}})
    translator, embedder = translator or FakeTranslator(), embedder or FakeEmbedder()
    clock = clock or Clock()
    store = SqliteJobStore(tmp_path / "jobs.sqlite3", clock=clock)
    runner = JobRunner(settings, {"translation": translator, "embeddings": embedder}, store=store, clock=clock)
    if start:
        await runner.start()
    return runner, translator, embedder


def _translation(n: int, source="en", target="pt"):
    return {"fromLang": source, "toLang": target, "records": [{"id": str(i), "text": f"t{i}"} for i in range(n)]}


async def _finished(runner, job_id, owner="anonymous"):
    task = runner._tasks.get(job_id)
    if task is not None:
        await asyncio.gather(task, return_exceptions=True)
    return await runner.get(job_id, owner)


def test_a_translation_job_computes_in_chunks_in_the_background_and_keeps_order(tmp_path):
    async def scenario():
        runner, translator, _ = await _runner(tmp_path)
        view = await runner.submit("translation", _translation(20))
        assert view["status"] == "queued" and view["progress"] == {"records_done": 0, "records_total": 20}
        done = await _finished(runner, view["job_id"])
        await runner.stop()
        return done, translator

    view, translator = asyncio.run(scenario())
    assert view["status"] == "succeeded" and "page" not in view
    assert view["result"] == {"result": [{"id": str(i), "text": f"[pt] t{i}"} for i in range(20)]}
    assert view["progress"] == {"records_done": 20, "records_total": 20}
    assert view["started_at"] and view["finished_at"] and view["expires_at"]
    assert [len(c.texts) for c in translator.calls] == [8, 8, 4] and all(translator.backgrounds)


def test_an_embeddings_job_is_stored_as_float32_and_answers_the_openai_body(tmp_path):
    async def scenario():
        runner, _, embedder = await _runner(tmp_path)
        floats = await runner.submit("embeddings", {"input": ["a", "bb", "ccc"]})
        b64 = await runner.submit("embeddings", {"input": ["a", "bb"], "encoding_format": "base64"})
        views = [await _finished(runner, v["job_id"]) for v in (floats, b64)]
        chunks = await runner.store.chunks(floats["job_id"], [0])
        await runner.stop()
        return views, chunks, embedder

    (floats, b64), chunks, embedder = asyncio.run(scenario())
    data = floats["result"]["data"]
    assert [d["index"] for d in data] == [0, 1, 2] and data[2]["embedding"] == [3.0] * 4
    assert floats["result"]["model"] == "all-MiniLM-L6-v2" and floats["result"]["usage"]["prompt_tokens"] == 9
    records, meta, stored = chunks[0]
    assert records == 3 and len(stored) == 3 * 4 * 4  # 3 vectors x 4 float32, not JSON
    vector = np.frombuffer(base64.b64decode(b64["result"]["data"][1]["embedding"]), dtype="<f4")
    assert vector.tolist() == [2.0] * 4 and all(embedder.backgrounds)


@pytest.mark.parametrize("task, payload, error", [
    ("translation", {"fromLang": "en", "records": []}, InvalidRequest),
    ("translation", _translation(2, "en", "xx"), UnsupportedLanguagePair),
    ("translation", _translation(51), PayloadTooLarge),
    ("embeddings", {"input": ["x"] * 51}, PayloadTooLarge),
    ("summarise", {}, UnsupportedTask),
])
def test_bad_jobs_are_refused_at_submission(tmp_path, task, payload, error):
    async def scenario():
        runner, translator, _ = await _runner(tmp_path)
        with pytest.raises(error) as raised:
            await runner.submit(task, payload)
        assert (await runner.stats())["queued"] == 0 and not translator.calls
        await runner.stop()
        return raised.value

    refused = asyncio.run(scenario())
    if error is InvalidRequest:
        assert "payload.toLang" in refused.message


@pytest.mark.parametrize("dims, most", [(1024, 14), (384, 39)])
def test_an_embeddings_job_is_estimated_at_the_served_dimensions(tmp_path, dims, most):
    """A 1,024-dimension embedder's result is 2.7 x MiniLM's: estimated at 384 it passed the 413 check."""
    async def scenario():
        runner, _, _ = await _runner(tmp_path, embedder=FakeEmbedder(dims=dims), max_job_result_bytes=60_000)
        with pytest.raises(JobTooLarge):
            await runner.submit("embeddings", {"input": ["x"] * (most + 1)})
        view = await runner.submit("embeddings", {"input": ["x"] * most})
        done = await _finished(runner, view["job_id"])
        await runner.stop()
        return done

    assert asyncio.run(scenario())["status"] == "succeeded"


def test_an_embedder_that_cannot_say_its_dimensions_is_estimated_at_minilm_s(tmp_path):
    class Silent(FakeEmbedder):
        async def call(self, method, *args, **kwargs):
            if method == "info":
                raise ModelUnavailable("not ready")
            return await super().call(method, *args, **kwargs)

    async def scenario():
        runner, _, _ = await _runner(tmp_path, embedder=Silent(dims=384), max_job_result_bytes=60_000)
        with pytest.raises(JobTooLarge, match="61440 bytes"):
            await runner.submit("embeddings", {"input": ["x"] * 40})
        await runner.stop()

    asyncio.run(scenario())


def test_a_job_whose_result_would_be_too_large_is_413_and_a_full_store_503(tmp_path):
    async def scenario():
        # 40 embeddings x 384 dimensions x 4 bytes estimated = 61,440 bytes
        runner, _, _ = await _runner(tmp_path, embedder=FakeEmbedder(dims=384), max_job_result_bytes=60_000,
                                     max_total_result_bytes=100_000)
        with pytest.raises(JobTooLarge) as too_large:
            await runner.submit("embeddings", {"input": ["x"] * 40})
        first = await runner.submit("embeddings", {"input": ["x"] * 39})
        with pytest.raises(Overloaded) as full:
            await runner.submit("embeddings", {"input": ["y"] * 39})
        await _finished(runner, first["job_id"])
        counts = await runner.stats()
        await runner.stop()
        return too_large.value, full.value, counts

    too_large, full, counts = asyncio.run(scenario())
    assert too_large.status_code == 413 and too_large.error_type == "job_too_large"
    assert full.status_code == 503 and full.error_type == "job_store_full" and full.retry_after_s >= 1
    # counted in the store: the estimate (39 x 1,536), kept as the real bytes (39 x 16) are fewer
    assert counts["result_bytes"] == 39 * 1536


def test_cancelling_a_running_job_drops_its_calls_not_yet_sent_and_stays_cancelled(tmp_path):
    async def scenario():
        translator = FakeTranslator(delay_s=30)
        runner, _, _ = await _runner(tmp_path, translator, max_inflight_calls_per_job=2, chunk_records=48)
        view = await runner.submit("translation", _translation(48))  # 6 calls of 8 records

        async def two_calls():
            return len(translator.calls) >= 2
        await _until(two_calls)
        cancelled = await runner.cancel(view["job_id"])
        # again (a DELETE retried after the JobManager died between its write and its answer): the same job
        assert (await runner.cancel(view["job_id"]))["status"] == "cancelled"
        await runner.stop()
        again, _, _ = await _runner(tmp_path)  # restarted: not resumed
        after = await again.get(view["job_id"])
        await again.stop()
        return cancelled, after, translator

    cancelled, after, translator = asyncio.run(scenario())
    assert cancelled["status"] == "cancelled" and cancelled["result"] is None
    assert len(translator.calls) == 2 and translator.cancelled == 2  # the other 4 calls never went out
    assert after["status"] == "cancelled"


def test_jobs_beyond_max_running_jobs_wait_queued(tmp_path):
    async def scenario():
        runner, _, _ = await _runner(tmp_path, FakeTranslator(delay_s=30), max_running_jobs=1)
        first = await runner.submit("translation", _translation(1))
        second = await runner.submit("translation", _translation(1))

        async def running(job_id):
            return (await runner.get(job_id))["status"] == "running"
        await _until(lambda: running(first["job_id"]))
        states = (await runner.get(first["job_id"]))["status"], (await runner.get(second["job_id"]))["status"]
        await runner.cancel(first["job_id"])
        await _until(lambda: running(second["job_id"]))
        await runner.cancel(second["job_id"])
        await runner.stop()
        return states

    assert asyncio.run(scenario()) == ("running", "queued")


def test_a_failing_model_fails_the_job_and_a_late_one_times_out(tmp_path):
    async def scenario():
        runner, _, _ = await _runner(tmp_path, FakeTranslator(fail=RuntimeError("boom")))
        failed = await _finished(runner, (await runner.submit("translation", _translation(3)))["job_id"])
        await runner.stop()
        slow = FakeTranslator(delay_s=30)
        runner, _, _ = await _runner(tmp_path, slow, job_timeout_s=0.05)
        late = await _finished(runner, (await runner.submit("translation", _translation(3)))["job_id"])
        await runner.stop()
        return failed, late, slow

    failed, late, slow = asyncio.run(scenario())
    assert failed["status"] == "failed" and failed["result"] is None
    assert failed["error"]["error_type"] == "internal_error"
    assert late["status"] == "failed" and late["error"]["error_type"] == "timeout"
    assert slow.cancelled == 1  # its call was cancelled, not left computing


class Unavailable503Twice(FakeTranslator):
    """A model whose node was lost: its first two compute calls answer 503 model_unavailable."""

    def __init__(self):
        super().__init__()
        self.failures_left = 2

    async def call(self, method, *args, background=False):
        if method not in ("info", "ready") and self.failures_left:
            self.failures_left -= 1
            raise ModelUnavailable("Translator has no healthy replica yet; retry after 2 s.", retry_after_s=2)
        return await super().call(method, *args, background=background)


def test_a_job_waits_out_a_model_answering_503_and_fails_with_it_past_model_retry_s(tmp_path):
    """A replica or node lost mid-job: the chunk is retried until the model answers again (the job
    succeeds, complete and in order); past jobs.model_retry_s the job fails with the 503's error."""
    async def scenario():
        runner, model, _ = await _runner(tmp_path, Unavailable503Twice(), model_retry_s=60)
        waited = await _finished(runner, (await runner.submit("translation", _translation(20)))["job_id"])
        await runner.stop()
        runner, _, _ = await _runner(tmp_path, Unavailable503Twice(), model_retry_s=0)
        gave_up = await _finished(runner, (await runner.submit("translation", _translation(3)))["job_id"])
        await runner.stop()
        return waited, model, gave_up

    waited, model, gave_up = asyncio.run(scenario())
    assert waited["status"] == "succeeded", waited["error"]
    assert [r["id"] for r in waited["result"]["result"]] == [str(i) for i in range(20)]
    assert model.failures_left == 0
    assert gave_up["status"] == "failed"
    assert gave_up["error"]["error_type"] == "model_unavailable"


def test_a_restarted_runner_resumes_after_the_stored_chunks_and_the_result_is_complete(tmp_path):
    """The JobManager killed mid-job: a new runner on the same store computes only the missing
    chunks; the result is complete and in order; finished jobs and their expiry are kept."""
    async def scenario():
        clock = Clock()
        gate = asyncio.Event()

        class Stalling(FakeTranslator):  # computes `calls_before_hanging` calls, then hangs (the kill)
            calls_before_hanging = 1

            async def call(self, method, *args, **kwargs):
                if method == "translate" and len(self.calls) >= self.calls_before_hanging:
                    await gate.wait()
                return await super().call(method, *args, **kwargs)

        stalling = Stalling()
        first, _, _ = await _runner(tmp_path, stalling, clock=clock, max_inflight_calls_per_job=1)
        done = await first.submit("translation", _translation(2))
        await _finished(first, done["job_id"])
        stalling.calls_before_hanging = 1 + 3  # three chunks of 8 records
        job = await first.submit("translation", _translation(50))

        async def three_chunks():
            return (await first.get(job["job_id"]))["progress"]["records_done"] == 24
        await _until(three_chunks)
        await first.stop()  # the kill: nothing is written on the way out

        clock.now += 10
        translator = FakeTranslator()
        second, _, _ = await _runner(tmp_path, translator, clock=clock)
        view = await _finished(second, job["job_id"])
        kept = await second.get(done["job_id"])
        clock.now += 3_600
        with pytest.raises(JobNotFound):  # its TTL ran out, across the restart too
            await second.get(done["job_id"])
        stats = await second.stats()
        await second.stop()
        return view, kept, translator, stats

    view, kept, translator, stats = asyncio.run(scenario())
    assert view["status"] == "succeeded"
    assert view["result"]["result"] == [{"id": str(i), "text": f"[pt] t{i}"} for i in range(50)]
    assert sorted(t for c in translator.calls for t in c.texts) == sorted(f"t{i}" for i in range(24, 50))
    assert stats["chunks_resumed"] == 3 and stats["chunks_computed"] == 4
    assert kept["status"] == "succeeded" and kept["result"]["result"][1]["text"] == "[pt] t1"


def test_a_second_runner_on_the_same_store_reads_but_runs_nothing_until_the_first_stops(tmp_path):
    async def scenario():
        first, _, _ = await _runner(tmp_path, FakeTranslator(delay_s=30))
        translator = FakeTranslator()
        second, _, _ = await _runner(tmp_path, translator)
        assert first.holding and not second.holding
        job = await second.submit("translation", _translation(3))  # stored, queued; the holder runs jobs
        assert (await first.get(job["job_id"]))["status"] == "queued" and not translator.calls
        await first.stop()
        await second._take_over()  # what its maintenance loop does every 2 s
        view = await _finished(second, job["job_id"])
        await second.stop()
        return view

    assert asyncio.run(scenario())["status"] == "succeeded"


def test_idempotency_key_and_request_id_are_one_submission_per_owner(tmp_path):
    async def scenario():
        runner, _, _ = await _runner(tmp_path)
        body = _translation(5)
        first = await runner.submit("translation", body, "req-1", idempotency_key="key-1")
        again = await runner.submit("translation", body, "req-2", idempotency_key="key-1")
        with pytest.raises(IdempotencyKeyReused) as reused:
            await runner.submit("translation", _translation(6), "req-3", idempotency_key="key-1")
        other_owner = await runner.submit("translation", body, "req-1", owner="k2", idempotency_key="key-1")
        # without a key, the x-request-id (HAProxy's resend): the same id and body are the same job
        by_rid = await runner.submit("translation", body, "req-9")
        resent = await runner.submit("translation", body, "req-9")
        other_payload = await runner.submit("translation", _translation(6), "req-9")
        no_id = [await runner.submit("translation", body) for _ in range(2)]
        await _finished(runner, first["job_id"])
        after_finish = await runner.submit("translation", body, idempotency_key="key-1")
        ids = [first, other_owner, by_rid, other_payload, *no_id]
        for view in ids:
            await _finished(runner, view["job_id"], "k2" if view is other_owner else "anonymous")
        counts = await runner.stats()
        await runner.stop()
        return first, again, reused.value, other_owner, by_rid, resent, other_payload, after_finish, counts

    first, again, reused, other_owner, by_rid, resent, other_payload, after_finish, counts = asyncio.run(scenario())
    assert again["job_id"] == first["job_id"] == after_finish["job_id"] and after_finish["status"] == "succeeded"
    assert reused.status_code == 409 and reused.error_type == "idempotency_key_reused"
    assert first["job_id"] not in reused.message  # (with auth_disabled every caller is one owner: a key is a guess)
    assert other_owner["job_id"] != first["job_id"]
    assert resent["job_id"] == by_rid["job_id"] != other_payload["job_id"]
    assert counts["succeeded"] == 6  # first, other owner, by_rid, other_payload and the two without an id


def test_a_job_is_visible_only_to_its_owner(tmp_path):
    async def scenario():
        runner, _, _ = await _runner(tmp_path, FakeTranslator(delay_s=30))
        job = await runner.submit("translation", _translation(3), owner="key-a")
        for call in (runner.get, runner.cancel):
            with pytest.raises(JobNotFound):
                await call(job["job_id"], "key-b")
        with pytest.raises(JobNotFound):
            await runner.get(job["job_id"])  # anonymous is another owner too
        cancelled = await runner.cancel(job["job_id"], "key-a")
        await runner.stop()
        return cancelled

    assert asyncio.run(scenario())["status"] == "cancelled"


def test_a_large_result_comes_in_pages(tmp_path):
    async def scenario():
        # 4-dimension vectors: ~120 bytes of JSON per record; pages of 4096 bytes: 34 records
        runner, _, _ = await _runner(tmp_path, max_page_bytes=4096)
        job = await runner.submit("embeddings", {"input": [f"text {i}" for i in range(50)]})
        first = await _finished(runner, job["job_id"])
        pages, view = [first], first
        while view["page"]["next"]:
            offset, limit = (int(p.split("=")[1]) for p in view["page"]["next"].split("?")[1].split("&"))
            view = await runner.get(job["job_id"], offset=offset, limit=limit)
            pages.append(view)
        small = await runner.get(job["job_id"], offset=48, limit=10)
        await runner.stop()
        return pages, small

    pages, small = asyncio.run(scenario())
    assert len(pages) == 2 and pages[0]["page"]["records"] == 34 and pages[1]["page"]["next"] is None
    indexes = [d["index"] for p in pages for d in p["result"]["data"]]
    assert indexes == list(range(50))
    assert pages[1]["result"]["usage"] == pages[0]["result"]["usage"]  # the whole job's usage
    assert [d["index"] for d in small["result"]["data"]] == [48, 49] and small["page"]["next"] is None
