"""The Ray Serve-alone contender (bench/peers/ray_serve_peer.py): its request handling without Ray."""

import asyncio
import json

import pytest

from bench.compare import report
from bench.compare.contenders import CONTENDERS


def _request(method: str, body: bytes = b""):
    from starlette.requests import Request

    async def receive():
        return {"type": "http.request", "body": body, "more_body": False}

    return Request({"type": "http", "method": method, "path": "/embeddings", "headers": [], "query_string": b""},
                   receive)


def _model(calls: list):
    """The deployment's class with a stand-in model (one 'vector' per text, its length), built without a replica."""
    from bench.peers.ray_serve_peer import deployment

    cls = deployment("embeddings", 2).func_or_class
    model = cls.__new__(cls)
    model.run = lambda texts: calls.append(list(texts)) or [[float(len(t))] for t in texts]
    return model


def test_concurrent_requests_share_one_model_call_and_each_gets_its_own_vectors_in_order():
    calls: list = []
    model = _model(calls)

    async def both():
        return await asyncio.gather(model(_request("POST", b'{"input": ["a", "abc"]}')),
                                    model(_request("POST", b'{"input": "ab"}')))

    answers = [json.loads(r.body) for r in asyncio.run(both())]
    assert calls == [["a", "abc", "ab"]]
    assert [[d["embedding"] for d in a["data"]] for a in answers] == [[[1.0], [3.0]], [[2.0]]]


def test_a_bad_body_gets_422_without_a_model_call_and_a_get_is_the_readiness_answer():
    calls: list = []
    model = _model(calls)
    refused = asyncio.run(model(_request("POST", b'{"inputs": "typo"}')))
    ready = asyncio.run(model(_request("GET")))
    assert (refused.status_code, ready.status_code, calls) == (422, 200, [])


def test_both_layouts_are_embeddings_only_onnx_contenders_and_not_serve_app(tmp_path, monkeypatch):
    from bench.peers.ray_serve_peer import REPLICAS_ENV, _replicas

    by_name = {c.name: c for c in CONTENDERS}
    for name, replicas in (("ray_serve", "2"), ("ray_serve_one", "1")):
        contender = by_name[name]
        assert name not in report.PROJECT
        assert contender.env("embeddings") == {"BENCH_EMBEDDINGS_ENGINE": "onnx", REPLICAS_ENV: replicas}
        assert "serves only embeddings" in contender.unavailable_for("translation-embedded")
        assert contender.argv("embeddings", 9701, tmp_path)[-5:] == [
            "bench.peers.ray_serve_peer", "--workload", "embeddings", "--port", "9701"]
    monkeypatch.setenv(REPLICAS_ENV, "0")
    with pytest.raises(SystemExit, match="'0'"):
        _replicas()
