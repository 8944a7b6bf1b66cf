"""The running service over HTTP: `serve run serve_config.yaml`, started once per session."""

from __future__ import annotations

import asyncio

import httpx
import numpy as np
import pytest

from tests.fixtures.sentences import SENTENCES
from tests.support import NO_CACHE

SEED = {"payload": {"fromLang": "en", "toLang": "pt",
                    "records": [{"id": "123", "text": "Life is like a box of chocolates."}]}}



@pytest.fixture(scope="module")
def http(serve_url):
    with httpx.Client(base_url=serve_url, timeout=60) as client:
        yield client


def translate_body(texts, src="en", tgt="pt"):
    return {"payload": {"fromLang": src, "toLang": tgt,
                        "records": [{"id": f"r{i}", "text": t} for i, t in enumerate(texts)]}}


def assert_error(resp, status, error_type):
    assert resp.status_code == status, resp.text
    assert resp.headers["content-type"].startswith("application/json")
    assert resp.json()["error_type"] == error_type and resp.json()["error"]


def test_seed_payload_is_translated_to_portuguese(http):
    resp = http.post("/translation", json=SEED)
    assert resp.status_code == 200
    assert resp.json() == {"result": [{"id": "123", "text": "A vida é como uma caixa de chocolates."}]}


def test_many_records_keep_order_and_ids_both_directions(http):
    resp = http.post("/translation", json=translate_body(SENTENCES))
    result = resp.json()["result"]
    assert [r["id"] for r in result] == [f"r{i}" for i in range(len(SENTENCES))]
    assert all(r["text"].strip() for r in result)
    back = http.post("/translation", json=translate_body([r["text"] for r in result[:2]], "pt", "en")).json()
    assert back["result"][0]["text"] == "Life is like a box of chocolates."


def test_health_readiness_models_docs(http):
    assert http.get("/healthz").json()["status"] == "ok"
    ready = http.get("/readyz")
    assert ready.status_code == 200 and set(ready.json()["models"].values()) == {"ready"}
    cards = {c["task"]: c for c in http.get("/v1/models").json()["data"]}
    assert cards["translation"]["language_pairs"] == ["en-pt", "pt-en"]
    assert cards["translation"]["batching"]["max_batch_size"] >= 1
    assert cards["embeddings"]["dimensions"] == 384
    assert "/translation" in http.get("/openapi.json").json()["paths"]
    assert http.get("/docs").status_code == 200


@pytest.mark.parametrize("payload, status, error_type", [
    (translate_body(["hi"], "en", "de"), 400, "unsupported_language_pair"),
    (translate_body([]), 422, "invalid_request"),
    (translate_body([" "]), 422, "invalid_request"),
    ({"payload": {"fromLang": "en", "records": [{"id": "1", "text": "x"}]}}, 422, "invalid_request"),
    ({"payload": {"fromLang": "en", "toLang": "pt", "records": [{"id": 1, "text": "x"}]}}, 422, "invalid_request"),
    (translate_body(["x"] * 1025), 413, "payload_too_large"),
    (translate_body(["x" * 5001]), 413, "payload_too_large"),
])
def test_error_statuses_over_http(http, payload, status, error_type):
    assert_error(http.post("/translation", json=payload), status, error_type)


def test_non_json_and_oversized_bodies(http):
    assert_error(http.post("/translation", content=b"{oops", headers={"content-type": "application/json"}),
                 422, "invalid_request")
    assert_error(http.post("/translation", content=b"a" * (5 * 1024 * 1024),
                           headers={"content-type": "application/json"}), 413, "payload_too_large")
    assert_error(http.get("/no-such-route"), 404, "not_found")


def test_the_configured_limits_are_the_ones_enforced(http, serve_process):
    from tests.conftest import TEST_MAX_BODY_BYTES

    if serve_process[1] is None:
        pytest.skip("running against an external service with its own config")
    # Between the configured limit (3 MB) and the default (4 MiB): only the config's value rejects it.
    body = b'{"input": "' + b"a" * 3_500_000 + b'"}'
    resp = http.post("/embeddings", content=body, headers={"content-type": "application/json"})
    assert_error(resp, 413, "payload_too_large")
    assert str(TEST_MAX_BODY_BYTES) in resp.json()["error"]


def test_embeddings_shape_norm_and_meaning(http):
    resp = http.post("/embeddings", json={"input": ["A man is eating food.", "A man is eating a meal.",
                                                    "The stock market fell sharply."]})
    assert resp.status_code == 200
    body = resp.json()
    vectors = np.array([d["embedding"] for d in body["data"]])
    assert vectors.shape == (3, 384)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-4)
    assert vectors[0] @ vectors[1] > 0.7 > vectors[0] @ vectors[2]
    assert body["usage"]["prompt_tokens"] > 3 and body["object"] == "list"
    assert_error(http.post("/embeddings", json={"input": []}), 422, "invalid_request")
    assert_error(http.post("/embeddings", json={"input": "x", "model": "nope"}), 400, "unsupported_model")


async def _concurrently(serve_url, requests):
    """Computed by the models, not answered from the response cache."""
    async with httpx.AsyncClient(base_url=serve_url, timeout=120, headers=NO_CACHE) as client:
        return await asyncio.gather(*(client.post(path, json=body) for path, body in requests))


def test_32_concurrent_translations_are_batched_and_equal_solo(serve_url, http):
    texts = [SENTENCES[i % len(SENTENCES)] + ("" if i < len(SENTENCES) else f" ({i})") for i in range(32)]
    solo = {}
    for text in texts[:8]:
        r = http.post("/translation", json=translate_body([text]), headers=NO_CACHE)
        assert r.headers["X-Batch-Records"] == "1"  # alone: nothing to batch with
        solo[text] = r.json()["result"][0]["text"]
    responses = asyncio.run(_concurrently(serve_url, [("/translation", translate_body([t])) for t in texts]))
    assert [r.status_code for r in responses] == [200] * 32
    batch_sizes = [int(r.headers["X-Batch-Records"]) for r in responses]
    # Proof of cross-request batching: a 1-record request rode in a model call with others.
    assert max(batch_sizes) > 1, batch_sizes
    for text, r in zip(texts[:8], responses[:8]):
        assert r.json()["result"][0]["text"] == solo[text]


def test_32_concurrent_embeddings_are_batched_and_equal_solo(serve_url, http):
    texts = [f"{SENTENCES[i % len(SENTENCES)]} #{i}" for i in range(32)]
    solo = np.array(http.post("/embeddings", json={"input": texts[0]}, headers=NO_CACHE).json()["data"][0]["embedding"])
    responses = asyncio.run(_concurrently(serve_url, [("/embeddings", {"input": t}) for t in texts]))
    assert [r.status_code for r in responses] == [200] * 32
    assert max(int(r.headers["X-Batch-Records"]) for r in responses) > 1
    batched = np.array(responses[0].json()["data"][0]["embedding"])
    assert float(solo @ batched) >= 0.9999


def test_large_request_does_not_block_small_ones(serve_url):
    big = translate_body([f"{SENTENCES[i % len(SENTENCES)]} {i}" for i in range(200)])
    small = translate_body(["Good morning."])

    async def go():
        async with httpx.AsyncClient(base_url=serve_url, timeout=120, headers=NO_CACHE) as client:
            big_task = asyncio.create_task(client.post("/translation", json=big))
            await asyncio.sleep(0)  # let the big request go first
            small_resp = await client.post("/translation", json=small)
            small_done = big_task.done()
            return small_resp, await big_task, small_done

    small_resp, big_resp, big_finished_first = asyncio.run(go())
    assert small_resp.status_code == 200 and big_resp.status_code == 200
    assert len(big_resp.json()["result"]) == 200
    assert not big_finished_first, "the small request waited for the whole 200-record request"
