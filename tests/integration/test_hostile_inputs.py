"""Hostile and odd inputs over HTTP, table-driven: each gets its documented status and the JSON
error body, and nothing reaches a model that it cannot handle (control characters and lone
surrogates are cleaned before the model; the service keeps answering afterwards)."""

from __future__ import annotations

import json

import httpx
import pytest

JSON = {"content-type": "application/json"}


def tr(records, src="en", tgt="pt", **extra) -> bytes:
    body = {"payload": {"fromLang": src, "toLang": tgt, "records": records}, **extra}
    return json.dumps(body).encode()


def rec(text, rid="1"):
    return {"id": rid, "text": text}


# (name, path, raw body, headers, expected status, expected error_type or None for 200)
CASES = [
    ("non-JSON body", "/translation", b"this is not json", JSON, 422, "invalid_request"),
    ("truncated JSON", "/translation", b'{"payload": {"fromLang": "en"', JSON, 422, "invalid_request"),
    ("wrong content type", "/translation", tr([rec("Hello.")]), {"content-type": "text/plain"}, 422, "invalid_request"),
    ("form content type", "/translation", b"a=1&b=2", {"content-type": "application/x-www-form-urlencoded"}, 422,
     "invalid_request"),
    ("deeply nested JSON", "/translation", b"[" * 100_000 + b"]" * 100_000, JSON, 422, "invalid_request"),
    ("deeply nested object in a field", "/translation",
     b'{"payload": {"fromLang": "en", "toLang": "pt", "records": [{"id": "1", "text": "hi", "meta": '
     + b'{"a":' * 5000 + b"1" + b"}" * 5000 + b"}]}}", JSON, 422, "invalid_request"),
    ("10 MB body", "/translation", b'{"payload": "' + b"x" * (10 * 1024 * 1024) + b'"}', JSON, 413,
     "payload_too_large"),
    ("100,000 records", "/translation", tr([rec("x", str(i)) for i in range(100_000)]), JSON, 413,
     "payload_too_large"),
    ("1 MB text", "/translation", tr([rec("word " * 200_000)]), JSON, 413, "payload_too_large"),
    ("1 MB embedding input", "/embeddings", json.dumps({"input": "word " * 200_000}).encode(), JSON, 413,
     "payload_too_large"),
    ("empty text", "/translation", tr([rec("")]), JSON, 422, "invalid_request"),
    ("whitespace-only text", "/translation", tr([rec(" \t\n\u3000 ")]), JSON, 422, "invalid_request"),
    ("control characters only", "/translation", tr([rec("\u0000\u0001\u001b")]), JSON, 422, "invalid_request"),
    ("blank embedding input", "/embeddings", b'{"input": ["ok", "   "]}', JSON, 422, "invalid_request"),
    ("invalid UTF-8", "/translation", b'{"payload": {"fromLang": "en", "toLang": "pt", "records": '
     b'[{"id": "1", "text": "caf\xc3\x28 \xff\xfe"}]}}', JSON, 422, "invalid_request"),
    ("NUL and control characters in text", "/translation", tr([rec("Hello\u0000 world\u0007\u001b[31m!")]), JSON,
     200, None),
    ("lone surrogate in text", "/translation", b'{"payload": {"fromLang": "en", "toLang": "pt", "records": '
     b'[{"id": "1", "text": "bad \\ud800 surrogate"}]}}', JSON, 200, None),
    ("lone surrogate in id", "/translation", b'{"payload": {"fromLang": "en", "toLang": "pt", "records": '
     b'[{"id": "\\udc00", "text": "hello"}]}}', JSON, 422, "invalid_request"),
    ("NUL in embedding input", "/embeddings", json.dumps({"input": ["a\u0000b", "\ud83d\ude00 emoji"]}).encode(),
     JSON, 200, None),
    ("mixed scripts", "/translation", tr([rec("Hello мир 世界 مرحبا שלום")]), JSON, 200, None),
    ("emoji", "/translation", tr([rec("I love 🍕 and 🎉! 👨‍👩‍👧")]), JSON, 200, None),
    ("duplicate ids", "/translation", tr([rec("One.", "same"), rec("Two.", "same")]), JSON, 200, None),
    ("integer id", "/translation", tr([{"id": 7, "text": "hi"}]), JSON, 422, "invalid_request"),
    ("null id", "/translation", tr([{"id": None, "text": "hi"}]), JSON, 422, "invalid_request"),
    ("list id", "/translation", tr([{"id": ["1"], "text": "hi"}]), JSON, 422, "invalid_request"),
    ("non-string text", "/translation", tr([{"id": "1", "text": {"$ne": 1}}]), JSON, 422, "invalid_request"),
    ("unknown fields are ignored", "/translation",
     tr([{"id": "1", "text": "Good morning.", "extra": [1, 2]}], client_meta={"trace": "x"}), JSON, 200, None),
    ("language codes in the wrong case", "/translation", tr([rec("Good morning.")], "EN", "Pt"), JSON, 200, None),
    ("regional code falls back", "/translation", tr([rec("Good morning.")], "en_US", "pt-BR"), JSON, 200, None),
    ("language code injection", "/translation", tr([rec("hi")], "en'; DROP TABLE", "pt"), JSON, 422,
     "invalid_request"),
    ("unsupported pair", "/translation", tr([rec("hi")], "en", "de"), JSON, 400, "unsupported_language_pair"),
    ("pickle bytes are just a bad body", "/translation", b"\x80\x04\x95\x1f\x00\x00\x00\x00\x00\x00\x00",
     {"content-type": "application/octet-stream"}, 422, "invalid_request"),
    ("records is an object", "/translation", b'{"payload": {"fromLang": "en", "toLang": "pt", "records": {"id": "1"}}}',
     JSON, 422, "invalid_request"),
    ("JSON null body", "/translation", b"null", JSON, 422, "invalid_request"),
    ("bad deadline header", "/translation", tr([rec("hi")]), {**JSON, "X-Request-Timeout-Ms": "soon"}, 422,
     "invalid_request"),
    ("negative deadline header", "/translation", tr([rec("hi")]), {**JSON, "X-Request-Timeout-Ms": "-5"}, 422,
     "invalid_request"),
]


@pytest.fixture(scope="module")
def http(serve_url):
    with httpx.Client(base_url=serve_url, timeout=120) as client:
        yield client


@pytest.mark.parametrize("name, path, raw, headers, status, error_type", CASES, ids=[c[0] for c in CASES])
def test_hostile_input(http, name, path, raw, headers, status, error_type):
    resp = http.post(path, content=raw, headers=headers)
    assert resp.status_code == status, (name, resp.status_code, resp.text[:300])
    assert resp.headers["content-type"].startswith("application/json"), resp.headers
    body = resp.json()
    if error_type is None:
        if path == "/translation":
            sent = json.loads(raw.decode("utf-8", "surrogatepass"))["payload"]["records"]
            assert [r["id"] for r in body["result"]] == [r["id"] for r in sent]
            assert all(isinstance(r["text"], str) for r in body["result"])
        else:
            assert len(body["data"]) == len(json.loads(raw)["input"])
    else:
        assert body["error_type"] == error_type and body["error"], body
        assert "Traceback" not in body["error"]


def test_service_still_healthy_after_the_hostile_table(http):
    resp = http.post("/translation", json={"payload": {"fromLang": "en", "toLang": "pt",
                                                       "records": [{"id": "1", "text": "Good morning."}]}})
    assert resp.status_code == 200 and resp.json()["result"][0]["text"]
    assert http.get("/readyz").status_code == 200
