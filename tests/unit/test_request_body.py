"""A request body that stalls, a client gone mid-body, the browser routes of jobs, and one deadline for
/v1/embeddings: found by a read-only review of the request path (2026-11-30).

Admission takes a request's slot before its body is read (serve_app/api.py: the cheap refusal first), so
a body that never finishes held the slot without a bound: 64 such connections shed every other request.
Now the body has `ingress.body_timeout_s` to arrive, then 408 `body_timeout`, and the slot is free again.
The app is called as Serve's HTTP server calls it (raw ASGI), since a test client always sends whole bodies.
"""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from serve_app import api
from serve_app.admission import DRAIN
from serve_app.api import app

from .fakes import FakeEmbedder, install
from .test_api import assert_error, client  # noqa: F401 - the fixture

BODY = json.dumps({"payload": {"fromLang": "en", "toLang": "pt", "records": [{"id": "1", "text": "hi"}]}}).encode()


def _scope(path: str = "/translation", length: int = len(BODY)) -> dict:
    return {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
            "path": path, "raw_path": path.encode(), "root_path": "", "query_string": b"",
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(length).encode())],
            "client": ("127.0.0.1", 50000), "server": ("127.0.0.1", 9527)}


async def _call(scope: dict, messages: list[dict], then: str) -> tuple[list[dict], float]:
    """The app's answer when the client sends `messages`, then stalls ("stall") or goes away ("leave")."""
    queue = list(messages)
    sent: list[dict] = []

    async def receive():
        if queue:
            return queue.pop(0)
        if then == "stall":
            await asyncio.Event().wait()  # never set: the rest of the body never comes
        return {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)

    start = time.monotonic()
    await asyncio.wait_for(app(scope, receive, send), 10)
    return sent, time.monotonic() - start


def test_a_body_that_stalls_is_408_within_body_timeout_s_and_frees_its_slot():
    install(ingress={"body_timeout_s": 0.3})
    before = DRAIN.in_flight
    half = {"type": "http.request", "body": BODY[:10], "more_body": True}
    sent, took = asyncio.run(_call(_scope(), [half], "stall"))
    start = next(m for m in sent if m["type"] == "http.response.start")
    body = json.loads(b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body"))
    assert start["status"] == 408 and body["error_type"] == "body_timeout" and "0.3 s" in body["error"]
    assert 0.3 <= took < 5
    assert DRAIN.in_flight == before  # the admission slot is free again


def test_a_whole_body_is_not_timed_out():
    install(ingress={"body_timeout_s": 0.3})
    chunks = [{"type": "http.request", "body": BODY[:10], "more_body": True},
              {"type": "http.request", "body": BODY[10:], "more_body": False}]
    sent, _ = asyncio.run(_call(_scope(), chunks, "leave"))
    assert next(m for m in sent if m["type"] == "http.response.start")["status"] == 200


def test_a_client_gone_mid_body_is_counted_499_not_500():
    install()
    before, errors = dict(api.recorder.requests), dict(api.recorder.errors)
    half = {"type": "http.request", "body": BODY[:10], "more_body": True}
    sent, _ = asyncio.run(_call(_scope(), [half], "leave"))
    assert sent == []  # nobody to answer
    counted = {status: api.recorder.requests.get(("/translation", status), 0) - before.get(("/translation", status), 0)
               for status in (499, 500)}
    assert counted == {499: 1, 500: 0}
    key = ("/translation", "client_disconnected")
    assert api.recorder.errors[key] == errors.get(key, 0) + 1


def test_browsers_may_cancel_jobs_and_send_idempotency_keys(client):  # noqa: F811
    install(ingress={"cors_origins": "https://app.example"})
    pre = client.options("/jobs/abc", headers={"Origin": "https://app.example",
                                               "Access-Control-Request-Method": "DELETE",
                                               "Access-Control-Request-Headers": "idempotency-key,content-type"})
    assert pre.status_code == 200, pre.text
    assert "DELETE" in pre.headers["access-control-allow-methods"]
    assert "idempotency-key" in pre.headers["access-control-allow-headers"].lower()
    resp = client.post("/jobs", json={"task": "translation", "payload": json.loads(BODY)["payload"]},
                       headers={"Origin": "https://app.example"})
    assert "location" in resp.headers.get("access-control-expose-headers", "").lower()


def test_embeddings_with_dimensions_answer_within_one_deadline(client):  # noqa: F811
    class SlowInfo(FakeEmbedder):  # the model-info lookup and the embedding each take 0.3 s
        async def call(self, method, *args, **kwargs):
            await asyncio.sleep(0.3)
            return await super().call(method, *args, **kwargs)

    install(embedder=SlowInfo())
    resp = client.post("/v1/embeddings", json={"input": "x", "model": "all-MiniLM-L6-v2", "dimensions": 4},
                       headers={"X-Request-Timeout-Ms": "450"})
    assert_error(resp, 504, "timeout")


@pytest.mark.parametrize("ingress, status", [({"api_keys": "k" * 32}, 401), ({}, 405)])
def test_a_body_sent_to_an_open_path_is_never_waited_for(monkeypatch, ingress, status):
    """GET /healthz needs no key; a POST there with a body that stalls was read for body_timeout_s (30 s) before
    the 405, holding one of the replica's slots and up to max_body_bytes: keyless callers could fill them all.
    It is answered at once: 401 where keys are on (only GET and HEAD are open), else 405."""
    monkeypatch.delenv("SERVE_APP_INGRESS_API_KEYS", raising=False)
    install(ingress={"body_timeout_s": 5.0, **ingress})
    half = {"type": "http.request", "body": b"{", "more_body": True}
    for path in ("/healthz", "/readyz", "/openapi.json"):
        sent, took = asyncio.run(_call(_scope(path, 4_000_000), [half], "stall"))
        assert next(m for m in sent if m["type"] == "http.response.start")["status"] == status, path
        assert took < 2, path
