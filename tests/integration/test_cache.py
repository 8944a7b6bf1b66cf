"""The response cache in the running service: a repeated request is answered from the ingress's
cache (`X-Cache: hit`, no model batch) with the body the model computed, for translation and
embeddings (float and base64), and the cache's hit and miss counters move on Ray's metrics port.

Texts carry a per-test uuid: the session's Serve (and its cache) is shared with other tests.
"""

from __future__ import annotations

import base64
import uuid

import httpx
import numpy as np
import pytest

from tests.integration.test_observability import _metrics_url
from tests.support import NO_CACHE, metric_sum, scrape, wait_for


@pytest.fixture(scope="module")
def http(serve_url):
    with httpx.Client(base_url=serve_url, timeout=60) as client:
        yield client


def fresh(text: str) -> str:
    """`text`, unique to this test run (nobody has cached it)."""
    return f"{text} ({uuid.uuid4().hex[:8]})"


def translation(texts, src="en", tgt="pt") -> dict:
    return {"payload": {"fromLang": src, "toLang": tgt,
                        "records": [{"id": f"r{i}", "text": t} for i, t in enumerate(texts)]}}


def test_a_repeated_translation_is_a_hit_equal_to_the_computed_answer(http):
    texts = [fresh("Good morning."), fresh("The children were playing in the garden.")]
    computed = http.post("/translation", json=translation(texts))
    assert computed.status_code == 200
    assert computed.headers["X-Cache"] == "miss" and int(computed.headers["X-Batch-Records"]) >= 1
    cached = http.post("/translation", json=translation(texts))
    assert cached.headers["X-Cache"] == "hit" and cached.headers["X-Batch-Records"] == "0"
    assert cached.json() == computed.json()
    # ...and equal to the answer computed again now (Cache-Control: no-cache skips the cache).
    recomputed = http.post("/translation", json=translation(texts), headers=NO_CACHE)
    assert recomputed.headers["X-Cache"] == "miss" and int(recomputed.headers["X-Batch-Records"]) >= 1
    assert recomputed.json() == cached.json()


def test_a_partial_hit_computes_only_the_new_records_in_order(http):
    old, new = fresh("See you tomorrow."), fresh("Where is the train station?")
    alone = http.post("/translation", json=translation([new]), headers={"Cache-Control": "no-store"}).json()
    http.post("/translation", json=translation([old]))
    mixed = http.post("/translation", json=translation([new, old, new]))
    assert mixed.headers["X-Cache"] == "partial"
    result = mixed.json()["result"]
    assert [r["id"] for r in result] == ["r0", "r1", "r2"]
    assert result[0]["text"] == result[2]["text"] == alone["result"][0]["text"]
    # the pair is part of the key: the same text the other way round is computed
    assert http.post("/translation", json=translation([old], "pt", "en")).headers["X-Cache"] == "miss"


def _vectors(body: dict) -> np.ndarray:
    rows = [np.frombuffer(base64.b64decode(d["embedding"]), dtype="<f4") if isinstance(d["embedding"], str)
            else np.array(d["embedding"], dtype=np.float32) for d in body["data"]]
    return np.stack(rows)


def test_a_repeated_embedding_request_is_a_hit_equal_to_the_computed_one_float_and_base64(http):
    texts = [fresh("A man is eating food."), fresh("The stock market fell sharply.")]
    computed = http.post("/embeddings", json={"input": texts})
    assert computed.headers["X-Cache"] == "miss"
    cached = http.post("/embeddings", json={"input": texts})
    assert cached.headers["X-Cache"] == "hit" and cached.headers["X-Batch-Records"] == "0"
    assert cached.json() == computed.json()  # vectors, indices, model and token usage
    as_b64 = http.post("/embeddings", json={"input": texts, "encoding_format": "base64"})
    assert as_b64.headers["X-Cache"] == "hit"
    np.testing.assert_array_equal(_vectors(as_b64.json()), _vectors(computed.json()))
    assert as_b64.json()["usage"] == computed.json()["usage"]
    recomputed = http.post("/embeddings", json={"input": texts, "encoding_format": "base64"}, headers=NO_CACHE)
    assert recomputed.headers["X-Cache"] == "miss"
    # a batch may pad differently: equal to float32 rounding, not necessarily bit for bit
    np.testing.assert_allclose(_vectors(recomputed.json()), _vectors(computed.json()), atol=1e-5)


def test_cache_hit_and_miss_counters_move_in_the_scraped_metrics(http, serve_process):
    _, log = serve_process
    if log is None:
        pytest.skip("SERVE_APP_TEST_URL: the service's metrics port is not ours to find")
    url = _metrics_url(log)
    before = scrape(url)
    texts = [fresh("Thank you very much."), fresh("Please close the door.")]
    for _ in range(3):  # 2 misses, then 4 hits
        assert http.post("/translation", json=translation(texts)).status_code == 200
    for _ in range(2):  # 1 miss, then 1 hit
        assert http.post("/embeddings", json={"input": texts[0]}).status_code == 200

    def grew(now, name, task):
        return metric_sum(now, name, task=task) - metric_sum(before, name, task=task)

    def moved():
        now = scrape(url)
        done = (grew(now, "serve_app_cache_hits_total", "translation") >= 4
                and grew(now, "serve_app_cache_misses_total", "translation") >= 2
                and grew(now, "serve_app_cache_hits_total", "embeddings") >= 1
                and grew(now, "serve_app_cache_misses_total", "embeddings") >= 1)
        return now if done else None

    # Replicas push metrics to Ray's agent every 10 s by default.
    now = wait_for(moved, 60, "the cache's hit and miss counters to move", interval_s=1)
    assert metric_sum(now, "serve_app_cache_entries") >= 3
    assert metric_sum(now, "serve_app_cache_bytes") > 0
