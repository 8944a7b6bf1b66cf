"""The HTTP contract and every error status, driven through FastAPI's TestClient
with fake model clients (no Ray)."""

import base64

import numpy as np
import pytest
from fastapi.testclient import TestClient

from serve_app.api import app, set_service
from serve_app.errors import ModelUnavailable, Overloaded

from .fakes import FakeEmbedder, FakeTranslator, install


@pytest.fixture
def client():
    with TestClient(app, raise_server_exceptions=False) as c:
        yield c
    set_service(None)


def body(records, src="en", tgt="pt"):
    return {"payload": {"fromLang": src, "toLang": tgt, "records": records}}


def assert_error(resp, status, error_type):
    assert resp.status_code == status, resp.text
    data = resp.json()
    assert set(data) >= {"error", "error_type"}
    assert data["error_type"] == error_type
    assert isinstance(data["error"], str) and data["error"]


def test_translation_contract_keeps_order_and_ids(client):
    install(ingress={"records_per_call": 2})
    records = [{"id": f"id-{i}", "text": f"sentence {i}"} for i in range(7)]
    resp = client.post("/translation", json=body(records))
    assert resp.status_code == 200
    assert resp.json() == {"result": [{"id": f"id-{i}", "text": f"[pt] sentence {i}"} for i in range(7)]}
    assert resp.headers["X-Batch-Records"] == "2"


def test_seed_payload_shape(client):
    install()
    resp = client.post("/translation", json=body([{"id": "123", "text": "Life is like a box of chocolates."}]))
    assert resp.json()["result"][0]["id"] == "123"


def test_large_request_is_cut_into_bounded_concurrent_calls(client):
    translator, _ = install(FakeTranslator(delay_s=0.01),
                            ingress={"records_per_call": 3, "max_inflight_calls_per_request": 2})
    resp = client.post("/translation", json=body([{"id": str(i), "text": "x"} for i in range(20)]))
    assert resp.status_code == 200
    assert [len(c.texts) for c in translator.calls] == [3, 3, 3, 3, 3, 3, 2]
    assert translator.max_in_flight == 2


@pytest.mark.parametrize("src, tgt, expected", [("EN", "PT", "pt"), ("en", "pt-BR", "pt"), ("pt_br", "en", "en"),
                                                ("en-Latn", "pt-Latn-BR", "pt"), ("pt_Latn_PT", "en-Latn-US", "en")])
def test_language_codes_are_case_insensitive_and_fall_back_to_the_language(client, src, tgt, expected):
    translator, _ = install()
    resp = client.post("/translation", json=body([{"id": "1", "text": "hi"}], src, tgt))
    assert resp.status_code == 200, resp.text
    assert translator.calls[0].target == expected


def test_unsupported_pair_is_400_listing_supported_pairs(client):
    install()
    resp = client.post("/translation", json=body([{"id": "1", "text": "hi"}], "en", "de"))
    assert_error(resp, 400, "unsupported_language_pair")
    assert "en-pt" in resp.json()["error"] and "pt-en" in resp.json()["error"]


@pytest.mark.parametrize("payload", [
    {},
    {"payload": {}},
    {"payload": {"fromLang": "en", "toLang": "pt"}},
    body([]),
    body([{"id": "1"}]),
    body([{"text": "no id"}]),
    body([{"id": 1, "text": "int id"}]),
    body([{"id": "1", "text": 5}]),
    body([{"id": "1", "text": ""}]),
    body([{"id": "1", "text": " \n\t "}]),
    body([{"id": "1", "text": "x"}], src="e n"),
    {"payload": {"fromLang": "en", "toLang": "pt", "records": "not a list"}},
    [1, 2, 3],
])
def test_schema_errors_are_422_json(client, payload):
    install()
    assert_error(client.post("/translation", json=payload), 422, "invalid_request")


@pytest.mark.parametrize("raw, content_type", [
    (b"not json", "application/json"),
    (b'{"payload": ', "application/json"),
    (b"\xff\xfe\xfa", "application/json"),
    (b'{"payload": {}}', "text/plain"),
])
def test_unparseable_bodies_are_422(client, raw, content_type):
    install()
    resp = client.post("/translation", content=raw, headers={"content-type": content_type})
    assert_error(resp, 422, "invalid_request")


def test_too_many_records_is_413(client):
    install(ingress={"max_records_per_request": 5})
    resp = client.post("/translation", json=body([{"id": str(i), "text": "x"} for i in range(6)]))
    assert_error(resp, 413, "payload_too_large")
    assert "limit is 5" in resp.json()["error"]


def test_text_too_long_is_413_naming_the_record(client):
    install(ingress={"max_text_chars": 10})
    resp = client.post("/translation", json=body([{"id": "a", "text": "short"}, {"id": "b", "text": "x" * 11}]))
    assert_error(resp, 413, "payload_too_large")
    assert "[1]" in resp.json()["error"]


def test_body_over_byte_limit_is_413_before_parsing(client):
    translator, _ = install(ingress={"max_body_bytes": 2048})
    resp = client.post("/translation", content=b"x" * 5000, headers={"content-type": "application/json"})
    assert_error(resp, 413, "payload_too_large")
    assert translator.calls == []


def test_overload_is_503_with_retry_after(client):
    install(FakeTranslator(fail=Overloaded("Translator is at capacity.", retry_after_s=3)))
    resp = client.post("/translation", json=body([{"id": "1", "text": "hi"}]))
    assert_error(resp, 503, "overloaded")
    assert resp.headers["Retry-After"] == "3"


def test_failed_chunk_cancels_its_siblings(client):
    # One chunk fails at once; the others are still waiting and must be cancelled.
    class OneFails(FakeTranslator):
        async def call(self, method, *args):
            if method == "translate" and args[0].texts == ["boom"]:
                raise ModelUnavailable("replica died", retry_after_s=2)
            return await super().call(method, *args)

    translator = OneFails(delay_s=5)
    install(translator, ingress={"records_per_call": 1, "max_inflight_calls_per_request": 4})
    records = [{"id": "0", "text": "ok"}, {"id": "1", "text": "boom"}, {"id": "2", "text": "ok"}]
    resp = client.post("/translation", json=body(records))
    assert_error(resp, 503, "model_unavailable")
    assert translator.cancelled >= 1 and translator.in_flight == 0


def test_deadline_is_504_and_cancels_model_calls(client):
    translator, _ = install(FakeTranslator(delay_s=5), ingress={"model_timeout_s": 0.2})
    resp = client.post("/translation", json=body([{"id": "1", "text": "hi"}]))
    assert_error(resp, 504, "timeout")
    assert translator.cancelled == 1


def test_unexpected_exception_is_500_json_without_internals(client):
    install(FakeTranslator(fail=KeyError("secret-internal-detail")))
    resp = client.post("/translation", json=body([{"id": "1", "text": "hi"}]))
    assert_error(resp, 500, "internal_error")
    assert "secret" not in resp.text


def test_embeddings_openai_shape_and_usage(client):
    _, embedder = install(ingress={"inputs_per_embedding_call": 2})
    resp = client.post("/embeddings", json={"input": ["a", "bb", "ccc"]})
    assert resp.status_code == 200, resp.text
    data = resp.json()
    assert data["object"] == "list" and data["model"] == "all-MiniLM-L6-v2"
    assert [d["index"] for d in data["data"]] == [0, 1, 2]
    assert [d["embedding"][0] for d in data["data"]] == [1.0, 2.0, 3.0]
    assert data["usage"] == {"prompt_tokens": 9, "total_tokens": 9}
    assert embedder.calls == [["a", "bb"], ["ccc"]]


def test_embeddings_single_string_and_base64(client):
    install()
    resp = client.post("/embeddings", json={"input": "abcd", "encoding_format": "base64"})
    vector = np.frombuffer(base64.b64decode(resp.json()["data"][0]["embedding"]), dtype="<f4")
    assert vector.tolist() == [4.0] * 4


@pytest.mark.parametrize("payload, status, error_type", [
    ({"input": []}, 422, "invalid_request"),
    ({"input": ""}, 422, "invalid_request"),
    ({"input": ["ok", "  "]}, 422, "invalid_request"),
    ({"input": [[1, 2, 3]]}, 422, "invalid_request"),
    ({"input": "x", "encoding_format": "int8"}, 422, "invalid_request"),
    ({"input": "x", "model": "text-embedding-3-small"}, 400, "unsupported_model"),
    ({"input": ["x"] * 11}, 413, "payload_too_large"),
    ({"input": "y" * 101}, 413, "payload_too_large"),
    ({"input": "x", "dimensions": 2}, 400, "unsupported_model"),  # vectors are never shortened silently
    ({"input": "x", "dimensions": 0}, 422, "invalid_request"),
])
def test_embeddings_errors(client, payload, status, error_type):
    install(ingress={"max_embedding_inputs": 10, "max_text_chars": 100})
    assert_error(client.post("/embeddings", json=payload), status, error_type)


def test_embeddings_accepts_the_served_dimensions(client):
    _, embedder = install()
    resp = client.post("/v1/embeddings", json={"input": "x", "dimensions": embedder.dims})
    assert resp.status_code == 200 and len(resp.json()["data"][0]["embedding"]) == embedder.dims


def test_embeddings_accepts_served_model_name(client):
    install()
    for name in ("all-MiniLM-L6-v2", "sentence-transformers/all-MiniLM-L6-v2"):
        assert client.post("/embeddings", json={"input": "x", "model": name}).status_code == 200


def test_health_ready_models_and_docs(client):
    install()
    assert client.get("/healthz").json() == {"status": "ok", "models": {}}
    ready = client.get("/readyz")
    assert ready.status_code == 200 and ready.json()["models"] == {"Translator": "ready", "Embedder": "ready"}
    models = client.get("/v1/models").json()["data"]
    assert {m["task"] for m in models} == {"translation", "embeddings"}
    assert models[0]["language_pairs"] == ["en-pt", "pt-en"] and models[1]["dimensions"] == 4
    assert client.get("/openapi.json").status_code == 200
    assert client.get("/docs").status_code == 200


def test_readyz_is_503_while_a_model_loads(client):
    install(embedder=FakeEmbedder(never_ready=True), ingress={"readiness_timeout_s": 0.1})
    resp = client.get("/readyz")
    assert_error(resp, 503, "not_ready")
    assert resp.json()["models"]["Translator"] == "ready"
    assert resp.json()["models"]["Embedder"].startswith("loading")


def test_before_start_up_routes_answer_503_not_500(client):
    set_service(None)
    assert_error(client.post("/translation", json=body([{"id": "1", "text": "hi"}])), 503, "not_ready")
    assert_error(client.get("/readyz"), 503, "not_ready")


def test_unknown_route_and_method_are_json(client):
    install()
    assert_error(client.get("/nope"), 404, "not_found")
    assert_error(client.get("/translation"), 405, "method_not_allowed")


def test_admission_control_sheds_with_503_json_and_admitted_requests_finish(client):
    import threading

    translator, _ = install(FakeTranslator(delay_s=2), ingress={"max_inflight_requests": 2, "retry_after_s": 4})
    results = []

    def send():
        results.append(client.post("/translation", json=body([{"id": "1", "text": "hi"}])))

    threads = [threading.Thread(target=send) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    statuses = sorted(r.status_code for r in results)
    assert statuses == [200, 200, 503, 503, 503, 503], statuses
    for r in results:
        if r.status_code == 503:
            assert_error(r, 503, "overloaded")
            assert r.headers["Retry-After"] == "4"
    # health routes are never shed
    assert client.get("/healthz").status_code == 200


def test_concurrent_model_lists_share_one_info_call_per_model():
    """/v1/models asks every model for a fresh `info`: a flood of it (any key holder's, and it is not admission's
    model work) sent one call per request and model into the models' queues, ahead of other tenants' work."""
    import asyncio

    from serve_app.service import Service
    from serve_app.settings import load_settings

    class GatedEmbedder(FakeEmbedder):
        def __init__(self):
            super().__init__()
            self.info_calls, self.gate = 0, asyncio.Event()

        async def call(self, method, *args, **kwargs):
            if method == "info":
                self.info_calls += 1
                await self.gate.wait()
            return await super().call(method, *args, **kwargs)

    async def scenario():
        embedder = GatedEmbedder()
        service = Service(load_settings({}), translator=FakeTranslator(), embedder=embedder)
        flood = [asyncio.ensure_future(service.models()) for _ in range(20)]
        await asyncio.sleep(0.05)
        assert embedder.info_calls == 1 and not any(f.done() for f in flood)
        embedder.gate.set()
        cards = await asyncio.gather(*flood)
        assert all(c == cards[0] for c in cards) and cards[0][1]["dimensions"] == 4
        await service.models()  # a later list asks again
        assert embedder.info_calls == 2

    asyncio.run(scenario())
