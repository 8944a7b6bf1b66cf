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


def test_a_script_the_model_does_not_write_is_the_400_of_any_unknown_pair(client):
    """`pt-Latn` is `pt` now (a 400 before, from a review 2026-12-02); Portuguese in Cyrillic is still no pair, and
    is told so as any unknown pair is: 400, `error` naming the codes as sent and the pairs served, `error_type`."""
    assert client.post("/translation", json={"payload": {**BODY["payload"], "toLang": "pt-Latn"}}).status_code == 200
    cyrillic = {"payload": {**BODY["payload"], "fromLang": "en-Latn", "toLang": "pt-Cyrl"}}
    resp = client.post("/translation", json=cyrillic)
    assert resp.status_code == 400 and resp.json()["error_type"] == "unsupported_language_pair"
    assert resp.json()["error"].startswith("Unsupported language pair 'en-Latn' -> 'pt-Cyrl'. Supported pairs: en-pt")


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


def test_a_paged_result_s_next_link_keeps_the_route_prefix_and_the_client_follows_it(tmp_path):
    """`page.next` pointed outside an application under `route_prefix: /b` (a 404 for a client resolving it against
    the host), while Location kept the prefix. The project's client, its base URL under the prefix, follows it."""
    import asyncio

    import httpx

    from serve_app.client import AsyncClient
    from tests.unit.test_jobs_http import _serve

    runner, _ = _serve(tmp_path, max_page_bytes=4096)
    transport = httpx.ASGITransport(app=app, root_path="/b")

    async def page_through() -> tuple[dict, httpx.Response, dict]:
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as c:
            try:
                body = {"task": "embeddings", "payload": {"input": [f"text {i}" for i in range(50)]}}
                location = (await c.post("/b/jobs", json=body)).headers["location"]
                async with asyncio.timeout(60):
                    while (view := (await c.get(location)).json())["status"] != "succeeded":
                        await asyncio.sleep(0.05)
                second = await c.get(view["page"]["next"])
                async with AsyncClient("http://test/b", transport=transport) as client:
                    whole = await client._whole(json.loads(json.dumps(view)))
                return view, second, whole
            finally:
                await runner.stop()

    try:
        view, second, whole = asyncio.run(page_through())
    finally:
        set_service(None)
    assert view["page"]["next"].startswith(f"/b/jobs/{view['job_id']}?offset=")
    assert second.status_code == 200 and second.json()["page"]["offset"] == view["page"]["records"]
    assert [d["index"] for d in whole["result"]["data"]] == list(range(50))
