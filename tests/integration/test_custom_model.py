"""Bring your own model over HTTP: the iris example registered in serve_config.yaml
(`args.models`, deployment `Model.iris`), served by the running Serve instance."""

from __future__ import annotations

import asyncio
import statistics
import sys
import time

import httpx
import pytest

from tests.support import SETOSA, VERSICOLOR, VIRGINICA


#: concurrent one-flower requests: enough that some must share a model batch
CONCURRENT_REQUESTS = 64
#: one-flower requests sent one after another (each rides a batch of its own)
SEQUENTIAL_REQUESTS = 20


@pytest.fixture(scope="module")
def http(serve_url):
    with httpx.Client(base_url=serve_url, timeout=60) as client:
        yield client


def assert_error(resp, status, error_type):
    assert resp.status_code == status, resp.text
    assert resp.headers["content-type"].startswith("application/json")
    assert resp.json()["error_type"] == error_type and resp.json()["error"]


def test_iris_predicts_each_flower_in_order(http):
    resp = http.post("/models/iris/predict", json={"inputs": [SETOSA, VERSICOLOR, VIRGINICA, SETOSA]})
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["model"] == "iris"
    assert [o["species"] for o in body["outputs"]] == ["setosa", "versicolor", "virginica", "setosa"]
    for out in body["outputs"]:
        assert out["confidence"] == max(out["probabilities"].values())
        assert sum(out["probabilities"].values()) == pytest.approx(1)
        assert out["within_training_range"] is True
    assert int(resp.headers["X-Batch-Records"]) >= 4


def test_a_large_request_is_cut_into_calls_and_keeps_order(http):
    flowers = [SETOSA, VERSICOLOR, VIRGINICA] * 100  # 300 inputs: 10 calls of 32
    resp = http.post("/models/iris/predict", json={"inputs": flowers})
    assert resp.status_code == 200, resp.text
    assert [o["species"] for o in resp.json()["outputs"]] == ["setosa", "versicolor", "virginica"] * 100


def test_one_request_at_a_time_rides_alone(http):
    latencies_ms = []
    for _ in range(SEQUENTIAL_REQUESTS):
        started = time.perf_counter()
        resp = http.post("/models/iris/predict", json={"inputs": [VERSICOLOR]})
        latencies_ms.append(1000 * (time.perf_counter() - started))
        assert resp.status_code == 200 and resp.headers["X-Batch-Records"] == "1"
    latencies_ms.sort()
    print(f"\n{SEQUENTIAL_REQUESTS} sequential one-flower requests: latency p50 "
          f"{latencies_ms[len(latencies_ms) // 2]:.1f} ms, max {latencies_ms[-1]:.1f} ms", file=sys.stderr)


def test_concurrent_requests_are_batched_together(serve_url):
    async def one(client: httpx.AsyncClient, flower: dict) -> tuple[int, float, str]:
        started = time.perf_counter()
        resp = await client.post("/models/iris/predict", json={"inputs": [flower]})
        assert resp.status_code == 200, resp.text
        return int(resp.headers["X-Batch-Records"]), time.perf_counter() - started, resp.json()["outputs"][0]["species"]

    async def burst():
        limits = httpx.Limits(max_connections=CONCURRENT_REQUESTS)
        async with httpx.AsyncClient(base_url=serve_url, timeout=60, limits=limits) as client:
            flowers = [(SETOSA, VIRGINICA)[i % 2] for i in range(CONCURRENT_REQUESTS)]
            return await asyncio.gather(*(one(client, f) for f in flowers))

    results = asyncio.run(burst())
    batches = [b for b, _, _ in results]
    assert [s for _, _, s in results] == [("setosa", "virginica")[i % 2] for i in range(CONCURRENT_REQUESTS)]
    latencies_ms = sorted(1000 * s for _, s, _ in results)
    print(f"\n{CONCURRENT_REQUESTS} concurrent one-flower requests: model batches of {min(batches)}-{max(batches)} "
          f"(mean {statistics.mean(batches):.1f}); latency p50 {latencies_ms[len(latencies_ms) // 2]:.0f} ms, "
          f"max {latencies_ms[-1]:.0f} ms", file=sys.stderr)
    assert max(batches) > 1, f"no two requests shared a batch: {batches}"


def test_bad_inputs_are_422_quoting_the_field(http):
    resp = http.post("/models/iris/predict", json={"inputs": [SETOSA, {**SETOSA, "petal_width_cm": "wide"}]})
    assert_error(resp, 422, "invalid_request")
    assert "inputs.1.petal_width_cm" in resp.json()["error"]
    assert_error(http.post("/models/iris/predict", json={"inputs": [{**SETOSA, "colour": "blue"}]}),
                 422, "invalid_request")
    assert_error(http.post("/models/iris/predict", json={"inputs": []}), 422, "invalid_request")


def test_unknown_model_is_404(http):
    resp = http.post("/models/tulip/predict", json={"inputs": [SETOSA]})
    assert_error(resp, 404, "model_not_found")
    assert "'tulip'" in resp.json()["error"] and "'iris'" in resp.json()["error"]


def test_too_many_inputs_is_413(http):
    limit = 1024  # ingress.max_predict_inputs (default; serve_config.yaml does not change it)
    resp = http.post("/models/iris/predict", json={"inputs": [SETOSA] * (limit + 1)})
    assert_error(resp, 413, "payload_too_large")
    assert f"the limit is {limit}" in resp.json()["error"]


def test_models_and_readiness_include_the_custom_model(http):
    cards = {c["id"]: c for c in http.get("/v1/models").json()["data"]}
    iris = cards["iris"]
    assert (iris["task"], iris["deployment"], iris["backend"]) == ("prediction", "Model.iris", "custom")
    assert iris["batching"] == {**iris["batching"], "max_batch_size": 128, "batch_wait_timeout_s": 0.005}
    assert iris["details"]["module"] == "examples.iris_classifier"
    assert iris["details"]["held_out_accuracy"] >= 0.9 and iris["details"]["seed"] == 0
    assert "sepal_length_cm" in iris["input_schema"]["properties"]
    ready = http.get("/readyz")
    assert ready.status_code == 200 and ready.json()["models"]["Model.iris"] == "ready"
    assert "/models/{name}/predict" in http.get("/openapi.json").json()["paths"]


def test_the_python_client_calls_custom_models(serve_url):
    from serve_app.client import Client, ServeAppHTTPError

    with Client(serve_url) as client:
        outputs = client.predict("iris", [VIRGINICA, SETOSA])
        assert [o["species"] for o in outputs] == ["virginica", "setosa"]
        with pytest.raises(ServeAppHTTPError) as caught:
            client.predict("tulip", [SETOSA])
        assert (caught.value.status_code, caught.value.error_type) == (404, "model_not_found")
