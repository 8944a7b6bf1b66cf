"""Edges of the HTTP contract a client meets (from a review that probed each one): what FastAPI answered on its own
was a misleading message, a 500, a missing header or a refusal the docs did not promise."""

import json

import pytest
from fastapi.testclient import TestClient

from serve_app.api import app, set_service
from serve_app.errors import InvalidRequest

from .fakes import install

BODY = {"payload": {"fromLang": "en", "toLang": "pt", "records": [{"id": "1", "text": "hi"}]}}


@pytest.fixture
def client():
    install()
    with TestClient(app, raise_server_exceptions=False) as c:
        yield c
    set_service(None)


def test_json_sent_without_its_content_type_is_told_so(client):
    """`requests.post(url, data=json.dumps(body))` sends no Content-Type; FastAPI then reads no JSON, and its 422 said
    the body was not an object."""
    for headers in ({}, {"content-type": "text/plain"}):
        resp = client.post("/translation", content=json.dumps(BODY), headers=headers)
        assert resp.status_code == 422 and resp.json()["error_type"] == "invalid_request"
        assert "Content-Type: application/json" in resp.json()["error"], resp.json()
    ok = client.post("/translation", content=json.dumps(BODY), headers={"content-type": "application/json; charset=utf-8"})
    assert ok.status_code == 200


def test_malformed_json_says_what_is_wrong_and_where(client):
    resp = client.post("/translation", content='{"payload": ', headers={"content-type": "application/json"})
    assert resp.status_code == 422
    assert resp.json()["error"] == "Invalid request: the body is not valid JSON (Expecting value at character 12)"


def test_a_lone_surrogate_in_an_error_message_is_escaped_not_a_500():
    """A validation error quotes field names; a custom model's Input keyed by a client-chosen string put a lone
    surrogate in the message, which UTF-8 JSON cannot carry: the response raised and the client got a 500."""
    resp = InvalidRequest("Invalid request: inputs.0.\udc00: must be a finite number").to_response()
    assert json.loads(resp.body)["error"] == "Invalid request: inputs.0.\\udc00: must be a finite number"


def test_405_names_the_allowed_methods_and_probes_answer_head(client):
    resp = client.get("/translation")
    assert resp.status_code == 405 and resp.headers["allow"] == "POST" and resp.json()["error_type"] == \
        "method_not_allowed"
    for path in ("/healthz", "/readyz"):
        assert client.head(path).status_code == 200, path


def test_a_deadline_past_the_server_s_cap_is_capped_not_refused(client):
    resp = client.post("/translation", json=BODY, headers={"X-Request-Timeout-Ms": str(2 * 3_600_000)})
    assert resp.status_code == 200, resp.text
    assert client.post("/translation", json=BODY, headers={"X-Request-Timeout-Ms": str(10 ** 40)}).status_code == 422


@pytest.mark.parametrize("tokens", [[9906, 1917], [[9906, 1917]], 42])
def test_openai_token_arrays_are_refused_in_words(client, tokens):
    resp = client.post("/v1/embeddings", json={"input": tokens})
    assert resp.status_code == 422 and "token arrays are not supported" in resp.json()["error"], resp.json()


def test_a_job_s_location_keeps_the_application_s_route_prefix(tmp_path):
    """Serve gives an application under `route_prefix: /b` the scope's root_path /b; Location pointed outside it."""
    import asyncio

    import httpx

    from tests.unit.test_jobs_http import _serve

    runner, _ = _serve(tmp_path)

    async def submit() -> httpx.Response:
        transport = httpx.ASGITransport(app=app, root_path="/b")
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as c:
            try:
                return await c.post("/b/jobs", json={"task": "embeddings", "payload": {"input": "x"}})
            finally:
                await runner.stop()

    try:
        resp = asyncio.run(submit())
    finally:
        set_service(None)
    assert resp.status_code == 202, resp.text
    assert resp.headers["location"] == f"/b/jobs/{resp.json()['job_id']}"
