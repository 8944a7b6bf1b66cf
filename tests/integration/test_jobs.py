"""Asynchronous jobs over HTTP against the running service: submit, poll, result, cancel, errors.

(What survives restarts of the ingress, the JobManager and the run: tests/chaos/test_jobs_restarts.py.)"""

from __future__ import annotations

import uuid

import httpx
import numpy as np
import pytest

from tests.support import wait_for

from .test_custom_model import SETOSA, VIRGINICA


@pytest.fixture(scope="module")
def http(serve_url):
    with httpx.Client(base_url=serve_url, timeout=60) as client:
        yield client


def _records(n: int, tag: str) -> list[dict]:
    # unique texts, so the response cache cannot answer for the model
    return [{"id": f"r{i}", "text": f"The house number {i} is blue ({tag})."} for i in range(n)]


def _translation(n: int, tag: str) -> dict:
    return {"fromLang": "en", "toLang": "pt", "records": _records(n, tag)}


def _submit(http, task: str, payload: dict) -> dict:
    resp = http.post("/jobs", json={"task": task, "payload": payload})
    assert resp.status_code == 202, resp.text
    view = resp.json()
    assert resp.headers["Location"] == f"/jobs/{view['job_id']}"
    assert view["status"] in ("queued", "running")
    return view


def _finished(http, job_id: str, timeout_s: float = 120) -> dict:
    def done():
        view = http.get(f"/jobs/{job_id}").json()
        return view if view["status"] in ("succeeded", "failed", "cancelled") else None

    return wait_for(done, timeout_s, f"job {job_id} to finish", interval_s=0.2)


def test_translation_job_result_equals_the_routes_answer(http):
    payload = _translation(40, uuid.uuid4().hex)
    view = _finished(http, _submit(http, "translation", payload)["job_id"])
    assert view["status"] == "succeeded", view
    assert view["progress"] == {"records_done": 40, "records_total": 40}
    assert view["started_at"] and view["finished_at"] and view["expires_at"]
    direct = http.post("/translation", json={"payload": payload})
    assert direct.status_code == 200
    assert view["result"] == direct.json()
    assert [r["id"] for r in view["result"]["result"]] == [f"r{i}" for i in range(40)]


def test_embeddings_job_returns_the_openai_body(http):
    texts = [f"job embedding {i} {uuid.uuid4().hex}" for i in range(10)]
    view = _finished(http, _submit(http, "embeddings", {"input": texts})["job_id"])
    assert view["status"] == "succeeded", view
    data = view["result"]["data"]
    assert [d["index"] for d in data] == list(range(10))
    direct = http.post("/embeddings", json={"input": texts}).json()["data"]
    for got, want in zip(data, direct):
        assert float(np.dot(got["embedding"], want["embedding"])) > 0.9999


def test_custom_model_job(http):
    view = _finished(http, _submit(http, "iris", {"inputs": [SETOSA, VIRGINICA]})["job_id"])
    assert view["status"] == "succeeded", view
    species = [o["species"] for o in view["result"]["outputs"]]
    assert species == ["setosa", "virginica"]


def test_interactive_requests_are_answered_while_a_large_job_computes(http):
    job = _submit(http, "translation", _translation(1500, uuid.uuid4().hex))
    wait_for(lambda: http.get(f"/jobs/{job['job_id']}").json()["progress"]["records_done"] > 0, 60,
             "the job to start computing")
    for i in range(3):
        resp = http.post("/translation", json={"payload": _translation(1, f"{uuid.uuid4().hex}-{i}")})
        assert resp.status_code == 200, resp.text
    view = http.get(f"/jobs/{job['job_id']}").json()
    # the interactive requests did not wait for the job's 1,500 records
    assert view["status"] == "running", view
    cancelled = http.delete(f"/jobs/{job['job_id']}")
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
    final = http.get(f"/jobs/{job['job_id']}").json()
    assert final["status"] == "cancelled" and final["result"] is None
    # its records not yet computing were never computed
    assert final["progress"]["records_done"] < 1500
    again = http.delete(f"/jobs/{job['job_id']}")  # (a DELETE retried: the cancelled job again, not a 409)
    assert again.status_code == 200 and again.json()["status"] == "cancelled"


@pytest.mark.parametrize("body, status, error_type", [
    ({"task": "translation"}, 422, "invalid_request"),
    ({"task": "translation", "payload": {"fromLang": "en", "toLang": "pt"}}, 422, "invalid_request"),
    ({"task": "translation", "payload": {"fromLang": "en", "toLang": "xx", "records": [{"id": "1", "text": "a"}]}},
     400, "unsupported_language_pair"),
    ({"task": "embeddings", "payload": {"input": ["x"] * 10_001}}, 413, "payload_too_large"),
    ({"task": "iris", "payload": {"inputs": [{"sepal_length_cm": "long"}]}}, 422, "invalid_request"),
    ({"task": "poetry", "payload": {}}, 400, "unsupported_task"),
])
def test_bad_jobs_get_the_routes_errors_at_once(http, body, status, error_type):
    resp = http.post("/jobs", json=body)
    assert resp.status_code == status, resp.text
    assert resp.json()["error_type"] == error_type and resp.json()["error"]


def test_unknown_job_is_404(http):
    for method in ("GET", "DELETE"):
        resp = http.request(method, "/jobs/no-such-job")
        assert resp.status_code == 404 and resp.json()["error_type"] == "job_not_found"


def test_readyz_lists_the_job_manager(http):
    assert http.get("/readyz").json()["models"]["JobManager"] == "ready"


def test_a_submission_sent_again_with_its_x_request_id_is_the_same_job(http):
    """What HAProxy's resend of a POST /jobs (its Ingress replica died before answering) looks like
    to the service, and a client's own retry: the same body and x-request-id; one job, not two."""
    body = {"task": "translation", "payload": _translation(3, f"resent-{uuid.uuid4().hex}")}
    request_id = f"client-{uuid.uuid4().hex}"
    first = http.post("/jobs", json=body, headers={"x-request-id": request_id})
    again = http.post("/jobs", json=body, headers={"x-request-id": request_id})
    assert first.status_code == again.status_code == 202, (first.text, again.text)
    assert again.json()["job_id"] == first.json()["job_id"]
    other = http.post("/jobs", json=body)  # a new request id: a new job
    assert other.status_code == 202 and other.json()["job_id"] != first.json()["job_id"]
    for view in (first.json(), other.json()):
        assert _finished(http, view["job_id"])["status"] == "succeeded"


def test_an_idempotency_key_is_one_job_and_another_body_under_it_is_409(http):
    body = {"task": "translation", "payload": _translation(2, f"idem-{uuid.uuid4().hex}")}
    key = {"Idempotency-Key": uuid.uuid4().hex}
    first = http.post("/jobs", json=body, headers=key)
    again = http.post("/jobs", json=body, headers=key)  # a client's retry: another x-request-id
    assert first.status_code == again.status_code == 202 and again.json()["job_id"] == first.json()["job_id"]
    reused = http.post("/jobs", json={**body, "payload": _translation(3, "other")}, headers=key)
    assert reused.status_code == 409 and reused.json()["error_type"] == "idempotency_key_reused"
    assert _finished(http, first.json()["job_id"])["status"] == "succeeded"


def test_a_large_embeddings_result_comes_in_pages_equal_to_the_route(http):
    """600 vectors of 384 floats are ~4.6 MB of JSON, over jobs.max_page_bytes (4 MiB): pages."""
    texts = [f"paged embedding {i} {uuid.uuid4().hex}" for i in range(600)]
    view = _finished(http, _submit(http, "embeddings", {"input": texts})["job_id"], timeout_s=300)
    assert view["status"] == "succeeded", view
    data, pages = list(view["result"]["data"]), 1
    while view["page"]["next"]:
        resp = http.get(view["page"]["next"])
        assert resp.status_code == 200, resp.text
        view, pages = resp.json(), pages + 1
        data += view["result"]["data"]
    assert pages >= 2 and [d["index"] for d in data] == list(range(600))
    direct = http.post("/embeddings", json={"input": texts[-5:]}).json()["data"]
    for got, want in zip(data[-5:], direct):
        assert float(np.dot(got["embedding"], want["embedding"])) > 0.9999
