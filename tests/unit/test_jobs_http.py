"""The jobs routes over HTTP (FastAPI's TestClient), the JobManager's runner in-process on a real
SQLite store: statuses, Location, Idempotency-Key, owners, paging."""

import asyncio

import pytest
from fastapi.testclient import TestClient

from serve_app.api import app, set_service
from serve_app.jobs.runner import JobRunner
from serve_app.jobs.store.sqlite import SqliteJobStore
from serve_app.service import Service
from serve_app.settings import load_settings
from tests.unit.fakes import FakeEmbedder, FakeTranslator, install

KEY_A = "a3f9c27d81e64b5f9c0d2e7a6b4f18c3"
KEY_B = "7e1d9b3c5a2f48e6b0c4d8a1f7e39b52"


class RunnerClient:
    """The JobManager deployment's methods, called in-process (what HandleClient does over Ray)."""

    name = "JobManager"

    def __init__(self, runner: JobRunner):
        self.runner = runner
        self.started = False

    async def call(self, method: str, *args):
        if not self.started:
            self.started = True
            await self.runner.start()
        result = getattr(self.runner, method)(*args)
        return await result if asyncio.iscoroutine(result) else result


def _serve(tmp_path, ingress=None, dims=4, **jobs):
    translator = FakeTranslator(delay_s=0.01)
    settings = load_settings({"ingress": ingress or {},
                              "jobs": {"max_records_per_job": 50, "max_unfinished_jobs": 2, "chunk_records": 8, **jobs}})
    store = SqliteJobStore(tmp_path / "jobs.sqlite3")
    runner = JobRunner(settings, {"translation": translator, "embeddings": FakeEmbedder(dims)}, store=store)
    set_service(Service(settings, translator=translator, embedder=FakeEmbedder(), jobs=RunnerClient(runner)))
    return runner, translator


@pytest.fixture
def jobs_api(tmp_path):
    runner, translator = _serve(tmp_path)
    with TestClient(app, raise_server_exceptions=False) as client:
        yield client, runner, translator
        client.portal.call(runner.stop)
    set_service(None)


def _translation(n: int, source="en", target="pt"):
    return {"fromLang": source, "toLang": target, "records": [{"id": str(i), "text": f"t{i}"} for i in range(n)]}


def _poll(client, location, headers=None, until=("succeeded", "failed", "cancelled")):
    for _ in range(2000):  # each GET yields to the loop that computes the job
        view = client.get(location, headers=headers).json()
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
    # the result is exactly what POST /translation answers for the same payload, in the same shape
    direct = client.post("/translation", json={"payload": _translation(12)}).json()
    assert view["status"] == "succeeded" and view["result"] == direct and "page" not in view
    conflict = client.delete(location)
    assert conflict.status_code == 409 and conflict.json()["error_type"] == "job_finished"


def test_http_idempotency_key_and_x_request_id(jobs_api):
    client, runner, _ = jobs_api
    body = {"task": "translation", "payload": _translation(3)}
    first = client.post("/jobs", json=body, headers={"Idempotency-Key": "order-42"})
    again = client.post("/jobs", json=body, headers={"Idempotency-Key": "order-42", "x-request-id": "other"})
    reused = client.post("/jobs", json={**body, "payload": _translation(4)}, headers={"Idempotency-Key": "order-42"})
    resent = [client.post("/jobs", json=body, headers={"x-request-id": "resend-me"}) for _ in range(2)]
    assert first.status_code == again.status_code == 202 and again.json()["job_id"] == first.json()["job_id"]
    assert again.headers["Location"] == first.headers["Location"]
    assert reused.status_code == 409 and reused.json()["error_type"] == "idempotency_key_reused"
    assert resent[0].json()["job_id"] == resent[1].json()["job_id"] != first.json()["job_id"]
    for resp in (first, resent[0]):
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
    assert client.get("/jobs/x?offset=-1").status_code == 422
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


def test_http_a_too_large_job_is_413_and_a_full_store_503(tmp_path):
    runner, _ = _serve(tmp_path, dims=384, max_job_result_bytes=60_000, max_total_result_bytes=100_000)
    with TestClient(app, raise_server_exceptions=False) as client:
        too_large = client.post("/jobs", json={"task": "embeddings", "payload": {"input": ["x"] * 40}})
        first = client.post("/jobs", json={"task": "embeddings", "payload": {"input": ["x"] * 39}})
        full = client.post("/jobs", json={"task": "embeddings", "payload": {"input": ["y"] * 39}})
        client.portal.call(runner.stop)
    set_service(None)
    assert too_large.status_code == 413 and too_large.json()["error_type"] == "job_too_large"
    assert first.status_code == 202
    assert full.status_code == 503 and full.json()["error_type"] == "job_store_full" and full.headers["Retry-After"]


def test_http_jobs_belong_to_the_api_key_that_submitted_them(tmp_path, monkeypatch):
    monkeypatch.setenv("SERVE_APP_INGRESS_API_KEYS", f"{KEY_A},{KEY_B}")
    runner, _ = _serve(tmp_path)
    a, b = {"Authorization": f"Bearer {KEY_A}"}, {"X-API-Key": KEY_B}
    with TestClient(app, raise_server_exceptions=False) as client:
        body = {"task": "translation", "payload": _translation(2)}
        resp = client.post("/jobs", json=body, headers={**a, "Idempotency-Key": "same-key"})
        location = resp.headers["Location"]
        b_same_key = client.post("/jobs", json=body, headers={**b, "Idempotency-Key": "same-key"})
        seen_by_b = client.get(location, headers=b)
        cancelled_by_b = client.delete(location, headers=b)
        view = _poll(client, location, headers=a)
        client.portal.call(runner.stop)
    set_service(None)
    assert resp.status_code == 202 and b_same_key.status_code == 202
    assert b_same_key.json()["job_id"] != resp.json()["job_id"]  # keys are per owner
    assert seen_by_b.status_code == cancelled_by_b.status_code == 404
    assert seen_by_b.json()["error_type"] == "job_not_found"
    assert view["status"] == "succeeded"


def test_http_a_large_result_is_paged_with_next_links(tmp_path):
    runner, _ = _serve(tmp_path, max_page_bytes=4096)
    with TestClient(app, raise_server_exceptions=False) as client:
        texts = [f"text {i}" for i in range(50)]
        location = client.post("/jobs", json={"task": "embeddings", "payload": {"input": texts}}).headers["Location"]
        view = _poll(client, location)
        data = list(view["result"]["data"])
        while view["page"]["next"]:
            view = client.get(view["page"]["next"]).json()
            data += view["result"]["data"]
        client.portal.call(runner.stop)
    set_service(None)
    assert [d["index"] for d in data] == list(range(50)) and data[10]["embedding"] == [7.0] * 4


def test_http_jobs_are_404_when_off():
    install(jobs={"enabled": False})
    with TestClient(app, raise_server_exceptions=False) as client:
        resp = client.post("/jobs", json={"task": "translation", "payload": _translation(1)})
    set_service(None)
    assert resp.status_code == 404 and resp.json()["error_type"] == "not_found"
