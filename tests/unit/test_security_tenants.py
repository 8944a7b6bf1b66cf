"""Tenants do not see each other: the response cache is partitioned per API key, and admission
control keeps a fair share of the in-flight slots for every key."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from serve_app import auth
from serve_app.admission import fair_share
from serve_app.api import app, set_service
from serve_app.cache import ResponseCache, tenant_key
from serve_app.service import Service
from serve_app.settings import load_settings

from .fakes import FakeEmbedder, FakeTranslator

KEY_A = "a3f1c9e07b2d4f6a8c0e1b3d5f7a9c2e"
KEY_B = "5d8e2a7c4f1b9e3a6c0d8f2b4e7a1c9d5b3f"
KEY_C = "9b7d5f3a1c8e6b4d2f0a9c7e5b3d1f8a6c4e"


def body(text: str) -> dict:
    return {"payload": {"fromLang": "en", "toLang": "pt", "records": [{"id": "1", "text": text}]}}


def serve(translator=None, embedder=None, cache=True, **ingress) -> tuple[FakeTranslator, FakeEmbedder]:
    translator, embedder = translator or FakeTranslator(), embedder or FakeEmbedder()
    settings = load_settings({"ingress": ingress})
    cache_obj = ResponseCache.from_settings(settings.cache) if cache else None
    set_service(Service(settings, translator=translator, embedder=embedder, cache=cache_obj))
    return translator, embedder



# --- the response cache ---------------------------------------------------------------------------

def test_one_key_neither_reads_nor_detects_another_keys_cached_texts(app_client):
    translator, embedder = serve(api_keys=f"{KEY_A},{KEY_B}")
    secret = "the merger closes on friday"
    a = {"X-API-Key": KEY_A}
    b = {"Authorization": f"Bearer {KEY_B}"}
    assert app_client.post("/translation", json=body(secret), headers=a).headers["X-Cache"] == "miss"
    assert app_client.post("/translation", json=body(secret), headers=a).headers["X-Cache"] == "hit"
    assert len(translator.calls) == 1
    # B sends the same text: not a hit (B cannot tell that A sent it); computed for B.
    first_b = app_client.post("/translation", json=body(secret), headers=b)
    assert first_b.status_code == 200 and first_b.headers["X-Cache"] == "miss"
    assert len(translator.calls) == 2
    assert app_client.post("/translation", json=body(secret), headers=b).headers["X-Cache"] == "hit"
    # Embeddings too.
    emb = {"input": [secret], "model": "all-MiniLM-L6-v2"}
    assert app_client.post("/embeddings", json=emb, headers=a).headers["X-Cache"] == "miss"
    assert app_client.post("/embeddings", json=emb, headers=b).headers["X-Cache"] == "miss"
    assert app_client.post("/embeddings", json=emb, headers=a).headers["X-Cache"] == "hit"
    assert len(embedder.calls) == 2


def test_cache_entries_carry_the_key_id_not_the_key(app_client):
    serve(api_keys=f"{KEY_A},{KEY_B}")
    app_client.post("/translation", json=body("hello"), headers={"X-API-Key": KEY_A})
    from serve_app import api

    keys = list(api._service.cache._entries)
    assert keys and all(k[0] == auth.key_id(KEY_A) for k in keys)
    assert KEY_A not in repr(keys)


def test_with_keys_off_the_cache_is_one_space(app_client):
    translator, _ = serve()
    app_client.post("/translation", json=body("hello"))
    assert app_client.post("/translation", json=body("hello")).headers["X-Cache"] == "hit"
    assert len(translator.calls) == 1


def test_a_key_flooding_the_cache_evicts_only_its_own_entries_past_its_share():
    """One LRU for all keys: a key sending endless distinct texts evicted every other key's entries. Past its share
    (the bounds divided by the keys holding entries) a key now evicts its own least recently used."""
    cache = ResponseCache(max_entries=10, max_bytes=10**9, ttl_s=60)
    for i in range(4):
        cache.put(("b", i), f"b{i}", "B")
    for i in range(1000):
        cache.put(("a", i), f"a{i}", "A")
    assert [cache.get(("b", i)) for i in range(4)] == ["b0", "b1", "b2", "b3"]
    assert len(cache) == 10 and sum(("a", i) in cache for i in range(994, 1000)) == 6
    assert cache.evictions["capacity"] == 994 and cache.stats()["tenants"] == 2
    for i in range(10):  # under its share (5 of 10), B evicts the least recently used of all: A's
        cache.put(("b", 10 + i), f"b{10 + i}", "B")
    assert sum(key[0] == "b" for key in cache._entries) == 5  # then its own: both at their share
    cache.put(("c", 0), "c0", "C")  # a third key: the shares shrink, A and B give way to it
    cache.put(("c", 1), "c1", "C")
    assert cache.get(("c", 0)) == "c0" and cache.get(("c", 1)) == "c1" and len(cache) == 10


def test_a_key_reading_its_texts_while_another_floods_keeps_them():
    """Interleaved: B reads its 30 texts (storing the missing ones) while A stores a new text at every step. When an
    under-share store evicted the least recently used of all, that was B's own (A's were always recent): B's hit
    rate was 0 with A at 66-95 of 100 entries. The victim is now the entry of whoever is over its share: A's."""
    cache = ResponseCache(max_entries=100, max_bytes=10**9, ttl_s=60)
    hits = reads = 0
    for step in range(3000):
        cache.put(("a", step), "x", "A")
        if step % 5 == 0:
            text = ("b", step // 5 % 30)
            reads += step >= 1000
            if cache.get(text) is not None:
                hits += step >= 1000
            else:
                cache.put(text, "y", "B")
    assert hits == reads > 0  # once B has stored its 30, each is read back
    assert sum(key[0] == "a" for key in cache._entries) == 70  # A holds the rest, cycling through it


def test_the_byte_bound_is_shared_the_same_way():
    cache = ResponseCache(max_entries=10**6, max_bytes=20_000, ttl_s=60)
    cache.put("small", "x", "B")
    for i in range(200):
        cache.put(f"a{i}", "a" * 1000, "A")
        assert cache.bytes <= 20_000
    assert cache.get("small") == "x"


def test_keys_flooding_over_http_keep_another_key_s_entries(app_client):
    """Through the service: the cache keeps B's text while A sends 50 distinct ones into a 10-entry cache."""
    translator, _ = serve(api_keys=f"{KEY_A},{KEY_B}")
    from serve_app import api

    api._service.cache = ResponseCache(max_entries=10, max_bytes=10**9, ttl_s=60)
    b = {"X-API-Key": KEY_B}
    assert app_client.post("/translation", json=body("kept"), headers=b).headers["X-Cache"] == "miss"
    for i in range(50):
        app_client.post("/translation", json=body(f"flood {i}"), headers={"X-API-Key": KEY_A})
    assert app_client.post("/translation", json=body("kept"), headers=b).headers["X-Cache"] == "hit"


@pytest.mark.parametrize("keys, shown", [(None, True), (KEY_A, True), (f"{KEY_A},{KEY_B}", False)])
def test_batch_sizes_are_shown_only_to_a_single_tenant(app_client, keys, shown):
    """X-Batch-Records counts the other requests' records in the same model call: with several keys it told one key
    how much the others were sending. It is left out then; with keys off or one key it stays."""
    serve(**({"api_keys": keys} if keys else {}))
    headers = {"X-API-Key": KEY_A} if keys else {}
    for path, payload in (("/translation", body("hello")),
                          ("/embeddings", {"input": ["hello"], "model": "all-MiniLM-L6-v2"})):
        response = app_client.post(path, json=payload, headers=headers)
        assert response.status_code == 200 and ("X-Batch-Records" in response.headers) is shown, response.headers


def test_tenant_key_keeps_the_text_last():
    assert tenant_key(None, ("t", "m", "hello")) == ("t", "m", "hello")
    assert tenant_key("abc", ("t", "m", "hello")) == ("abc", "t", "m", "hello")
    assert tenant_key("abc", "x") == ("abc", "x")


# --- fair share of the in-flight slots ------------------------------------------------------------------

@pytest.mark.parametrize("limit, active, configured, share", [
    (64, 1, 1, 64),    # one key: nobody to share with
    (64, 1, 2, 32),    # alone of two: half, the other half stays free for the second key
    (64, 2, 2, 32),
    (64, 1, 5, 32),
    (64, 2, 5, 21),
    (64, 4, 5, 12),
    (64, 9, 5, 12),    # never more parts than keys
    (2, 3, 10, 1),     # at least one slot
])
def test_fair_share(limit, active, configured, share):
    assert fair_share(limit, active, configured) == share


class GatedTranslator(FakeTranslator):
    """Holds every translation until `gate` opens: requests stay in flight."""

    def __init__(self):
        super().__init__()
        self.gate = asyncio.Event()
        self.waiting = 0

    async def call(self, method, *args, **kwargs):
        if method == "translate":
            self.waiting += 1
            await self.gate.wait()
        return await super().call(method, *args, **kwargs)


def test_a_flooding_key_is_shed_while_another_keys_requests_get_through():
    translator = GatedTranslator()
    serve(translator, cache=False, api_keys=f"{KEY_A},{KEY_B},{KEY_C}", max_inflight_requests=8)

    async def scenario():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
            def send(key, n):
                return asyncio.create_task(http.post("/translation", json=body(f"text {n}"), headers={"X-API-Key": key}))

            # A floods: 20 requests while its first ones hang.
            flood = [send(KEY_A, n) for n in range(20)]
            async with asyncio.timeout(10):  # A's share alone of 3 keys: 8 // 2 = 4 admitted, 16 shed
                while translator.waiting < 4 or sum(t.done() for t in flood) < 16:
                    await asyncio.sleep(0.01)
            shed_a = [t for t in flood if t.done()]
            assert translator.waiting == 4
            # B and C come while A still floods: each is admitted at once.
            others = [send(KEY_B, 100), send(KEY_C, 101)]
            async with asyncio.timeout(10):
                while translator.waiting < 6:
                    await asyncio.sleep(0.01)
            late_a = await send(KEY_A, 200)  # A is over its share (8 // 3 = 2): shed
            translator.gate.set()
            done = await asyncio.gather(*flood, *others)
            return [t.result() for t in shed_a], late_a, done[-2:], done[:20]

    from serve_app.api import recorder

    before = dict(recorder.shed)
    shed_a, late_a, others, flood = asyncio.run(scenario())
    set_service(None)
    # told apart in serve_app_shed_total{reason}: one key flooding, not the service full (both are `overloaded`)
    assert recorder.shed["fair_share"] - before.get("fair_share", 0) == 17
    assert recorder.shed["capacity"] == before.get("capacity", 0)
    assert len(shed_a) == 16 and all(r.status_code == 503 for r in shed_a)
    assert all(r.json()["error_type"] == "overloaded" and r.headers["Retry-After"] == "2" for r in shed_a)
    assert late_a.status_code == 503 and "share" in late_a.json()["error"]
    assert [r.status_code for r in others] == [200, 200]
    assert sum(r.status_code == 200 for r in flood) == 4  # admitted requests all finished


def test_without_keys_the_limit_is_not_shared_out():
    translator = GatedTranslator()
    serve(translator, cache=False, max_inflight_requests=4)

    async def scenario():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
            tasks = [asyncio.create_task(http.post("/translation", json=body(f"t{n}"))) for n in range(6)]
            async with asyncio.timeout(10):
                while translator.waiting < 4 or sum(t.done() for t in tasks) < 2:
                    await asyncio.sleep(0.01)
            translator.gate.set()
            return await asyncio.gather(*tasks)

    codes = sorted(r.status_code for r in asyncio.run(scenario()))
    set_service(None)
    assert codes == [200] * 4 + [503] * 2


def test_keyed_requests_wait_in_the_waiting_room_each_key_within_its_share():
    """Keyed requests were never queued: past the slots they were 503 at once, while HAProxy, counting the waiting
    room in each replica's maxconn, sent 4x what the replica took (64 + 192) and the refusals cost Python time. They
    now wait as keyless ones do, each key within its share of the room: a flooding key cannot fill it."""
    translator = GatedTranslator()
    serve(translator, cache=False, api_keys=f"{KEY_A},{KEY_B}", max_inflight_requests=2, max_waiting_requests=4,
          max_wait_s=10)

    async def scenario():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
            def send(key, n):
                return asyncio.create_task(http.post("/translation", json=body(f"t{n}"), headers={"X-API-Key": key}))
            admitted = [send(KEY_A, 0)]  # A's share of the slots alone of 2 keys: 1
            async with asyncio.timeout(10):
                while translator.waiting < 1:
                    await asyncio.sleep(0.01)
            admitted.append(send(KEY_B, 1))
            async with asyncio.timeout(10):
                while translator.waiting < 2:
                    await asyncio.sleep(0.01)
            # full: A waits within its share of the room (4 // 2 = 2), its third is shed; B's waits too
            waiting_a = [send(KEY_A, 10 + n) for n in range(3)]
            async with asyncio.timeout(10):
                while sum(t.done() for t in waiting_a) < 1:
                    await asyncio.sleep(0.01)
            waiting_b = send(KEY_B, 20)
            async with asyncio.timeout(10):
                while len(DRAIN.waiting) < 3:
                    await asyncio.sleep(0.01)
            translator.gate.set()
            return await asyncio.gather(*admitted, *waiting_a, waiting_b)

    from serve_app.admission import DRAIN

    results = asyncio.run(scenario())
    set_service(None)
    codes = [r.status_code for r in results]
    assert codes.count(503) == 1 and codes.count(200) == 5, codes  # both keys' waiters answered
    assert "share" in next(r for r in results if r.status_code == 503).json()["error"]
    assert DRAIN.in_flight == 0 and not DRAIN.waiting
