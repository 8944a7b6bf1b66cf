"""Jobs without Ray: the store (states, TTL, bounds) and the runner on fake model clients."""

import asyncio

import pytest

from deployments.job_manager import JobRunner
from serve_app.errors import InvalidRequest, Overloaded, PayloadTooLarge, UnsupportedLanguagePair
from serve_app.jobs import JobFinished, JobNotFound, JobStore, UnsupportedTask
from serve_app.settings import load_settings
from tests.unit.fakes import FakeEmbedder, FakeTranslator


class Clock:
    def __init__(self):
        self.now = 1_000.0

    def __call__(self):
        return self.now


def _store(clock, **limits):
    return JobStore(**{"max_unfinished_jobs": 2, "max_finished_jobs": 10, "result_ttl_s": 60, **limits},
                    clock=clock)


def test_a_job_goes_queued_running_succeeded_and_expires_after_its_ttl():
    clock = Clock()
    store = _store(clock)
    job = store.create("translation", {"p": 1}, records_total=3)
    assert store.get(job.id).view()["status"] == "queued"
    clock.now += 1
    store.start(job)
    assert store.get(job.id).view()["started_at"] is not None
    store.finish(job, "succeeded", result={"result": []})
    view = store.get(job.id).view()
    assert view["status"] == "succeeded" and view["result"] == {"result": []}
    assert job.payload is None  # the request body is not kept once the job finished
    clock.now += 59.9
    assert store.get(job.id).status == "succeeded"
    clock.now += 0.2
    with pytest.raises(JobNotFound):
        store.get(job.id)


def test_unfinished_jobs_are_bounded_and_finished_ones_evicted_oldest_first():
    clock = Clock()
    store = _store(clock, max_finished_jobs=3)
    first, second = store.create("t", None, 1), store.create("t", None, 1)
    with pytest.raises(Overloaded) as raised:
        store.create("t", None, 1)
    assert raised.value.retry_after_s == 2 and raised.value.status_code == 503
    store.finish(first, "succeeded")
    third = store.create("t", None, 1)  # a slot freed
    store.finish(second, "failed", error={"error": "x", "error_type": "internal_error"})
    store.finish(third, "cancelled")
    store.finish(store.create("t", None, 1), "succeeded")
    with pytest.raises(JobNotFound):
        store.get(first.id)  # the oldest finished job made room
    assert store.get(second.id).view()["error"]["error_type"] == "internal_error"
    assert store.counts() == {"queued": 0, "running": 0, "succeeded": 1, "failed": 1, "cancelled": 1}


def test_unknown_ids_are_not_found():
    with pytest.raises(JobNotFound):
        _store(Clock()).get("nope")


def _runner(translator=None, embedder=None, **jobs):
    settings = load_settings({"jobs": {"max_records_per_job": 50, **jobs}})
    translator, embedder = translator or FakeTranslator(), embedder or FakeEmbedder()
    return JobRunner(settings, {"translation": translator, "embeddings": embedder}), translator, embedder


def _translation(n: int, source="en", target="pt"):
    return {"fromLang": source, "toLang": target, "records": [{"id": str(i), "text": f"t{i}"} for i in range(n)]}


async def _finished(runner, job_id):
    task = runner._tasks.get(job_id)
    if task is not None:
        await asyncio.gather(task, return_exceptions=True)
    return runner.get(job_id)


def test_a_translation_job_computes_in_the_background_and_keeps_order():
    async def scenario():
        runner, translator, _ = _runner()
        view = await runner.submit("translation", _translation(20))
        assert view["status"] == "queued" and view["progress"] == {"records_done": 0, "records_total": 20}
        return await _finished(runner, view["job_id"]), translator

    view, translator = asyncio.run(scenario())
    assert view["status"] == "succeeded"
    assert view["result"] == {"result": [{"id": str(i), "text": f"[pt] t{i}"} for i in range(20)]}
    assert view["progress"] == {"records_done": 20, "records_total": 20}
    assert translator.backgrounds and all(translator.backgrounds)


def test_an_embeddings_job_returns_the_openai_body():
    async def scenario():
        runner, _, embedder = _runner()
        view = await runner.submit("embeddings", {"input": ["a", "bb", "ccc"]})
        return await _finished(runner, view["job_id"]), embedder

    view, embedder = asyncio.run(scenario())
    data = view["result"]["data"]
    assert [d["index"] for d in data] == [0, 1, 2] and data[2]["embedding"] == [3.0] * 4
    assert all(embedder.backgrounds)


@pytest.mark.parametrize("task, payload, error", [
    ("translation", {"fromLang": "en", "records": []}, InvalidRequest),
    ("translation", _translation(2, "en", "xx"), UnsupportedLanguagePair),
    ("translation", _translation(51), PayloadTooLarge),
    ("embeddings", {"input": ["x"] * 51}, PayloadTooLarge),
    ("summarise", {}, UnsupportedTask),
])
def test_bad_jobs_are_refused_at_submission(task, payload, error):
    async def scenario():
        runner, translator, _ = _runner()
        with pytest.raises(error) as raised:
            await runner.submit(task, payload)
        assert runner.stats()["queued"] == 0 and not translator.calls
        return raised.value

    refused = asyncio.run(scenario())
    if error is InvalidRequest:
        assert "payload.toLang" in refused.message


def test_cancelling_a_running_job_drops_its_calls_not_yet_sent():
    async def scenario():
        translator = FakeTranslator(delay_s=30)
        runner, _, _ = _runner(translator, max_inflight_calls_per_job=2)
        view = await runner.submit("translation", _translation(48))  # 6 calls of 8 records
        async with asyncio.timeout(5):
            while len(translator.calls) < 2:  # its first two calls reached the model
                await asyncio.sleep(0)
        cancelled = await runner.cancel(view["job_id"])
        with pytest.raises(JobFinished):
            await runner.cancel(view["job_id"])
        return cancelled, translator

    cancelled, translator = asyncio.run(scenario())
    assert cancelled["status"] == "cancelled" and cancelled["result"] is None
    assert len(translator.calls) == 2 and translator.cancelled == 2  # the other 4 calls never went out


def test_jobs_beyond_max_running_jobs_wait_queued():
    async def scenario():
        translator = FakeTranslator(delay_s=30)
        runner, _, _ = _runner(translator, max_running_jobs=1)
        first = await runner.submit("translation", _translation(1))
        second = await runner.submit("translation", _translation(1))
        async with asyncio.timeout(5):
            while runner.get(first["job_id"])["status"] != "running":
                await asyncio.sleep(0)
        states = runner.get(first["job_id"])["status"], runner.get(second["job_id"])["status"]
        await runner.cancel(first["job_id"])
        async with asyncio.timeout(5):
            while runner.get(second["job_id"])["status"] != "running":
                await asyncio.sleep(0)
        await runner.cancel(second["job_id"])
        return states

    assert asyncio.run(scenario()) == ("running", "queued")


def test_a_failing_model_fails_the_job_with_an_error_body():
    async def scenario():
        runner, _, _ = _runner(FakeTranslator(fail=RuntimeError("boom")))
        view = await runner.submit("translation", _translation(3))
        return await _finished(runner, view["job_id"])

    view = asyncio.run(scenario())
    assert view["status"] == "failed" and view["result"] is None
    assert view["error"]["error_type"] == "internal_error"


class RunnerClient:
    """The JobManager deployment's methods, called in-process (what HandleClient does over Ray)."""

    name = "JobManager"

    def __init__(self, runner: JobRunner):
        self.runner = runner

    async def call(self, method: str, *args):
        result = getattr(self.runner, method)(*args)
        return await result if asyncio.iscoroutine(result) else result


@pytest.fixture
def jobs_api():
    from fastapi.testclient import TestClient

    from serve_app.api import app, set_service
    from serve_app.service import Service

    translator = FakeTranslator(delay_s=0.01)
    settings = load_settings({"jobs": {"max_records_per_job": 50, "max_unfinished_jobs": 2}})
    runner = JobRunner(settings, {"translation": translator, "embeddings": FakeEmbedder()})
    set_service(Service(settings, translator=translator, embedder=FakeEmbedder(), jobs=RunnerClient(runner)))
    with TestClient(app, raise_server_exceptions=False) as client:
        yield client, runner, translator
    set_service(None)


def _poll(client, location, until=("succeeded", "failed", "cancelled")):
    for _ in range(2000):  # each GET yields to the loop that computes the job
        view = client.get(location).json()
        if view["status"] in until:
            return view
    raise AssertionError(f"job never reached {until}: {view}")


def test_http_jobs_submit_poll_result_and_conflict(jobs_api):
    client, runner, _ = jobs_api
    resp = client.post("/jobs", json={"task": "translation", "payload": _translation(12)})
    assert resp.status_code == 202, resp.text
    location = resp.headers["Location"]
    assert location == f"/jobs/{resp.json()['job_id']}" and resp.json()["status"] == "queued"
    view = _poll(client, location)
    # the result is exactly what POST /translation answers for the same payload
    direct = client.post("/translation", json={"payload": _translation(12)}).json()
    assert view["status"] == "succeeded" and view["result"] == direct
    conflict = client.delete(location)
    assert conflict.status_code == 409 and conflict.json()["error_type"] == "job_finished"


def test_http_a_job_resent_with_its_x_request_id_is_the_same_job(jobs_api):
    client, runner, _ = jobs_api
    body = {"task": "translation", "payload": _translation(3)}
    first = client.post("/jobs", json=body, headers={"x-request-id": "resend-me"})
    again = client.post("/jobs", json=body, headers={"x-request-id": "resend-me"})
    fresh = client.post("/jobs", json=body)
    assert first.status_code == again.status_code == fresh.status_code == 202
    assert again.json()["job_id"] == first.json()["job_id"] != fresh.json()["job_id"]
    assert again.headers["Location"] == first.headers["Location"]
    for resp in (first, fresh):
        _poll(client, resp.headers["Location"])


def test_http_jobs_errors_have_the_routes_statuses(jobs_api):
    client, runner, translator = jobs_api
    cases = [
        ({"task": "translation"}, 422, "invalid_request"),
        ({"task": "translation", "payload": {"fromLang": "en"}}, 422, "invalid_request"),
        ({"task": "translation", "payload": _translation(1, "en", "xx")}, 400, "unsupported_language_pair"),
        ({"task": "translation", "payload": _translation(51)}, 413, "payload_too_large"),
        ({"task": "sing", "payload": {}}, 400, "unsupported_task"),
    ]
    for body, status, error_type in cases:
        resp = client.post("/jobs", json=body)
        assert (resp.status_code, resp.json()["error_type"]) == (status, error_type), (body, resp.text)
    missing = client.get("/jobs/not-a-job")
    assert missing.status_code == 404 and missing.json()["error_type"] == "job_not_found"
    assert client.delete("/jobs/not-a-job").status_code == 404
    assert not translator.calls


def test_http_jobs_backlog_is_bounded_and_cancel_works(jobs_api):
    client, runner, translator = jobs_api
    translator.delay_s = 30
    ids = [client.post("/jobs", json={"task": "translation", "payload": _translation(40)}).json()["job_id"]
           for _ in range(2)]
    full = client.post("/jobs", json={"task": "translation", "payload": _translation(1)})
    assert full.status_code == 503 and full.json()["error_type"] == "overloaded"
    assert int(full.headers["Retry-After"]) >= 1
    for job_id in ids:
        resp = client.delete(f"/jobs/{job_id}")
        assert resp.status_code == 200 and resp.json()["status"] == "cancelled"
    assert client.post("/jobs", json={"task": "translation", "payload": _translation(1)}).status_code == 202


def test_http_jobs_are_404_when_off():
    from fastapi.testclient import TestClient

    from serve_app.api import app, set_service
    from tests.unit.fakes import install

    install(jobs={"enabled": False})
    with TestClient(app, raise_server_exceptions=False) as client:
        resp = client.post("/jobs", json={"task": "translation", "payload": _translation(1)})
    set_service(None)
    assert resp.status_code == 404 and resp.json()["error_type"] == "not_found"


def test_a_job_past_its_timeout_fails_with_timeout():
    async def scenario():
        runner, translator, _ = _runner(FakeTranslator(delay_s=30), job_timeout_s=0.05)
        view = await runner.submit("translation", _translation(3))
        return await _finished(runner, view["job_id"]), translator

    view, translator = asyncio.run(scenario())
    assert view["status"] == "failed" and view["error"]["error_type"] == "timeout"
    assert translator.cancelled == 1  # its call was cancelled, not left computing


def test_a_submission_resent_with_its_request_id_gets_the_same_job_and_queues_nothing_twice():
    """HAProxy resends a POST /jobs whose Ingress replica died before answering, with the same
    x-request-id; the JobManager may already hold the job the first attempt created."""
    async def scenario():
        runner, _, _ = _runner()
        first = await runner.submit("translation", _translation(5), "req-1")
        again = await runner.submit("translation", _translation(5), "req-1")
        other_payload = await runner.submit("translation", _translation(6), "req-1")
        no_id = [await runner.submit("translation", _translation(5), None) for _ in range(2)]
        await _finished(runner, first["job_id"])
        after_finish = await runner.submit("translation", _translation(5), "req-1")
        for view in (other_payload, *no_id):
            await _finished(runner, view["job_id"])
        return first, again, other_payload, no_id, after_finish, runner

    first, again, other_payload, no_id, after_finish, runner = asyncio.run(scenario())
    assert again["job_id"] == first["job_id"]
    assert after_finish["job_id"] == first["job_id"] and after_finish["status"] == "succeeded"
    # Another payload under the same id, or no id at all: new jobs.
    assert other_payload["job_id"] != first["job_id"]
    assert len({first["job_id"], *(v["job_id"] for v in no_id)}) == 3
    assert sum(runner.store.counts().values()) == 4  # first, other_payload and the two without an id


def test_a_submission_key_is_forgotten_with_its_job():
    clock = Clock()
    store = _store(clock, result_ttl_s=60)
    job = store.create("translation", {"x": 1}, 1, submission_key="k")
    assert store.find("k") is job
    store.finish(job, "succeeded", result={})
    clock.now += 61
    assert store.find("k") is None
    assert store.create("translation", {"x": 1}, 1, submission_key="k").id != job.id
