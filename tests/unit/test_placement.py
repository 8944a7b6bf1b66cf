"""Models placed in the Ingress (`placement: ingress`): what the Ingress replica builds (its
PlacedModels and Service), without Ray, serving HTTP in-process (httpx over ASGI) with the real
model deployment classes. Everything runs on the unit tests' shared `loop`: @serve.batch binds
a method's queue to the first loop that calls it (tests/unit/conftest.py)."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from deployments.errors import ReplicaStopped
from serve_app.api import app, set_service
from serve_app.builder import build_app
from serve_app.config_check import check_config
from serve_app.errors import InternalError, ServeAppError, ShuttingDown
from serve_app.ingress import build_service
from serve_app.model_clients import LocalClient, ViaIngressClient
from serve_app.placement import PlacedModels
from serve_app.settings import AppSettings
from tests.support import SETOSA, VIRGINICA

from .test_deployments import RecordingBackend


@pytest.fixture
def recording_backend(monkeypatch):
    backend = RecordingBackend()
    monkeypatch.setattr("deployments.translator.load_translation_backend", lambda settings, threads: backend)
    monkeypatch.setattr(RecordingBackend, "warm_up", lambda self: None, raising=False)
    return backend


class Client:
    """Synchronous HTTP calls to the FastAPI app, run on `loop`."""

    def __init__(self, loop):
        self.loop = loop
        self.http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test")

    def post(self, path, **kwargs):
        return self.loop.run_until_complete(self.http.post(path, **kwargs))

    def get(self, path, **kwargs):
        return self.loop.run_until_complete(self.http.get(path, **kwargs))


@pytest.fixture
def placed_ingress(recording_backend, loop):
    settings = AppSettings.model_validate({
        "translation": {"placement": "ingress"}, "embeddings": {"placement": "ingress"},
        "cache": {"enabled": False}})
    ingress = PlacedModels(settings)
    set_service(build_service(settings, ingress, None, None))
    ingress.reconfigure({"Translator": {"max_batch_size": 4, "batch_wait_timeout_s": 0.05}})
    client = Client(loop)
    yield ingress, client, recording_backend
    loop.run_until_complete(client.http.aclose())
    set_service(None)


def test_both_models_serve_http_from_inside_the_ingress(placed_ingress):
    ingress, client, backend = placed_ingress
    assert ingress.names() == ["Embedder", "Translator"]
    records = [{"id": f"r{i}", "text": f"sentence {i}"} for i in range(6)]
    resp = client.post("/translation", json={"payload": {"fromLang": "en", "toLang": "pt", "records": records}})
    assert resp.status_code == 200, resp.text
    assert resp.json() == {"result": [{"id": f"r{i}", "text": f"pt:sentence {i}"} for i in range(6)]}
    # The Ingress's user_config reached the placed Translator: batches of at most 4 records.
    assert max(len(texts) for _, _, texts in backend.batches) <= 4
    resp = client.post("/embeddings", json={"input": ["The food was delicious.", "Hello"]})
    assert resp.status_code == 200, resp.text
    vectors = [d["embedding"] for d in resp.json()["data"]]
    assert len(vectors) == 2 and len(vectors[0]) == 384
    ready = client.get("/readyz")
    assert ready.status_code == 200, ready.text
    cards = {c["deployment"]: c for c in client.get("/v1/models").json()["data"]}
    assert cards["Translator"]["placement"] == cards["Embedder"]["placement"] == "ingress"
    assert cards["Translator"]["batching"]["max_batch_size"] == 4  # the Ingress's user_config


def test_concurrent_requests_share_model_batches_in_process(placed_ingress, loop):
    ingress, _, backend = placed_ingress
    translator = ingress.clients["Translator"]

    async def many():
        from deployments.batching import Chunk
        return await asyncio.gather(*(translator.call("translate", Chunk("en", "pt", [f"t{i}"])) for i in range(8)))

    results = loop.run_until_complete(many())
    assert [out for out, _ in results] == [[f"pt:t{i}"] for i in range(8)]
    # 8 one-record calls ran as far fewer model calls (max_batch_size 4)
    assert len(backend.batches) <= 3


def test_the_ingress_user_config_only_takes_models_placed_in_it(placed_ingress):
    ingress, _, _ = placed_ingress
    with pytest.raises(ValueError, match="'Model.iris'"):
        ingress.reconfigure({"Model.iris": {"max_batch_size": 8, "batch_wait_timeout_s": 0.01}})
    with pytest.raises(ValueError, match="max_batch_size=0"):
        ingress.reconfigure({"Translator": {"max_batch_size": 0, "batch_wait_timeout_s": 0.01}})
    # all or nothing: a bad Embedder config leaves the Translator's as it was (it was applied, then the deploy failed)
    with pytest.raises(ValueError, match="max_batch_size=0"):
        ingress.reconfigure({"Translator": {"max_batch_size": 7, "batch_wait_timeout_s": 0.01},
                             "Embedder": {"max_batch_size": 0, "batch_wait_timeout_s": 0.01}})
    assert ingress.clients["Translator"].replica.batch_config.max_batch_size == 4


def test_a_placed_model_that_keeps_failing_fails_the_ingress_health_check(placed_ingress, loop):
    ingress, client, backend = placed_ingress
    backend.fail = True
    for i in range(3):
        resp = client.post("/translation", json={"payload": {"fromLang": "en", "toLang": "pt",
                                                             "records": [{"id": "1", "text": f"x{i}"}]}})
        assert resp.status_code == 500 and resp.json()["error_type"] == "internal_error"
    with pytest.raises(RuntimeError, match="model calls failed"):
        ingress.check_health()
    assert loop.run_until_complete(ingress.clients["Translator"].deployment_status())[0] == "UNHEALTHY"


def test_job_work_reaches_a_placed_model_through_the_ingress(placed_ingress, loop):
    ingress, _, backend = placed_ingress

    class IngressByHandle:  # what a HandleClient over the Ingress deployment does, minus Ray
        async def call(self, method, *args, **kwargs):
            assert method == "call_placed"  # Ingress.call_placed -> PlacedModels.call
            return await ingress.call(*args, **kwargs)

    from deployments.batching import Chunk
    via = ViaIngressClient("Translator", IngressByHandle())
    out, _ = loop.run_until_complete(via.call("translate", Chunk("en", "pt", ["job text"]), background=True))
    assert out == ["pt:job text"]
    with pytest.raises(ValueError, match="no model 'Embedder2'"):
        loop.run_until_complete(ingress.call("Embedder2", "embed", ["x"]))


def test_local_client_passes_our_errors_and_maps_the_rest():
    class Replica:
        def ours(self):
            raise ServeAppError("nope")

        async def boom(self):
            raise KeyError("bug")

    client = LocalClient("Translator", Replica())
    with pytest.raises(ServeAppError, match="nope"):
        asyncio.run(client.call("ours"))
    with pytest.raises(InternalError, match="Translator failed"):
        asyncio.run(client.call("boom"))


def test_a_model_stopping_with_its_ingress_replica_is_503_shutting_down():
    class Replica:
        async def translate(self):
            raise ReplicaStopped("decoding is shut down")

    client = LocalClient("Translator", Replica(), retry_after_s=3)
    with pytest.raises(ShuttingDown, match="Translator stopped with this replica") as info:
        asyncio.run(client.call("translate"))
    assert info.value.status_code == 503 and info.value.retry_after_s == 3


def test_the_ingress_teardown_stops_its_placed_models(placed_ingress):
    """Serve runs the Ingress's destructor at the end of its graceful shutdown: the models placed in it stop too (a
    continuous Translator's decoding loop would go on, and its callers wait, for nothing)."""
    import inspect
    from types import SimpleNamespace

    from deployments.health import ReplicaHealth
    from serve_app.ingress import Ingress

    ingress, client, _ = placed_ingress
    # the class's own destructor, which Serve's ASGI wrapper (an async __del__) calls
    destructor = next(vars(c)["__del__"] for c in Ingress.func_or_class.__mro__
                      if "__del__" in vars(c) and not inspect.iscoroutinefunction(vars(c)["__del__"]))
    destructor(SimpleNamespace(health=ReplicaHealth("Ingress"), placed=ingress))
    with pytest.raises(RuntimeError, match="finished its graceful shutdown"):
        ingress.check_health()
    resp = client.post("/translation", json={"payload": {"fromLang": "en", "toLang": "pt",
                                                         "records": [{"id": "1", "text": "late"}]}})
    assert resp.status_code == 503 and resp.json()["error_type"] == "shutting_down", resp.text


@pytest.fixture
def bound(monkeypatch) -> list[str]:
    """The builder's deployments replaced by fakes that record what was bound (binding the real
    classes would pickle their test-loop-bound batch queues); each `bind` returns (name, args)."""
    names: list[str] = []

    class FakeDeployment:
        def __init__(self, name):
            self.name = name

        def bind(self, *args):
            names.append(self.name)
            return (self.name, args)

        def options(self, **kwargs):
            return FakeDeployment(kwargs["name"])

    for name in ("Translator", "Embedder", "JobManager", "CustomModel", "Ingress"):
        monkeypatch.setattr(f"serve_app.builder.{name}", FakeDeployment(name))
    return names


def test_the_builder_binds_no_deployment_for_a_placed_model(bound):
    _, args = build_app({"embeddings": {"placement": "ingress"}})
    assert args[0][0] == "Translator" and args[1] is None  # the Ingress gets no Embedder handle
    assert "Embedder" not in bound


def _config(args: dict, deployments: list[dict]) -> dict:
    return {"applications": [{"name": "a", "import_path": "serve_app.builder:build_app", "route_prefix": "/",
                              "args": args, "deployments": deployments}]}


def test_config_check_refuses_a_deployment_entry_for_a_placed_model():
    problems = check_config(_config({"translation": {"placement": "ingress"}},
                                    [{"name": "Translator", "num_replicas": 2}]))
    assert any("args.translation.placement is 'ingress'" in p and "Translator" in p for p in problems), problems


def test_config_check_validates_the_batch_configs_in_the_ingress_user_config():
    args = {"embeddings": {"placement": "ingress"}}
    good = [{"name": "Ingress", "user_config": {"Embedder": {"max_batch_size": 64, "batch_wait_timeout_s": 0.01}}}]
    assert check_config(_config(args, good)) == []
    bad = [{"name": "Ingress", "user_config": {"Embedder": {"max_batch_size": 0, "batch_wait_timeout_s": 0.01},
                                                "Translator": {"max_batch_size": 8, "batch_wait_timeout_s": 0.01}}}]
    problems = check_config(_config(args, bad))
    assert any("max_batch_size=0" in p for p in problems), problems
    assert any("'Translator' is not a model placed in the Ingress" in p for p in problems), problems


# --- your own model (`models:`) placed in the Ingress ---------------------------------------------

IRIS_PLACED = {"name": "iris", "module": "examples.iris_classifier", "options": {"seed": 0}, "placement": "ingress"}


@pytest.fixture
def placed_iris(recording_backend, loop):
    # Everything in the Ingress (the Translator on the recording backend), so /v1/models can ask each.
    settings = AppSettings.model_validate({
        "translation": {"placement": "ingress"}, "embeddings": {"placement": "ingress"},
        "models": [IRIS_PLACED], "cache": {"enabled": False}})
    ingress = PlacedModels(settings)
    # No handle for a placed custom model: the builder passes None, as it does for Translator/Embedder.
    set_service(build_service(settings, ingress, None, None, models={"iris": None}))
    client = Client(loop)
    yield ingress, client
    loop.run_until_complete(client.http.aclose())
    set_service(None)


def test_a_placed_custom_model_serves_its_route_from_inside_the_ingress(placed_iris):
    ingress, client = placed_iris
    assert ingress.names() == ["Embedder", "Model.iris", "Translator"]
    ingress.reconfigure({"Model.iris": {"max_batch_size": 2, "batch_wait_timeout_s": 0.01}})
    resp = client.post("/models/iris/predict", json={"inputs": [SETOSA, VIRGINICA, SETOSA]})
    assert resp.status_code == 200, resp.text
    assert [o["species"] for o in resp.json()["outputs"]] == ["setosa", "virginica", "setosa"]
    assert int(resp.headers["X-Batch-Records"]) <= 2  # the Ingress's user_config reached it
    cards = {c["id"]: c for c in client.get("/v1/models").json()["data"]}
    assert cards["iris"]["placement"] == "ingress" and cards["iris"]["deployment"] == "Model.iris"
    assert cards["iris"]["batching"]["max_batch_size"] == 2


def test_job_work_reaches_a_placed_custom_model_through_the_ingress(placed_iris, loop):
    ingress, _ = placed_iris

    class IngressByHandle:
        async def call(self, method, *args, **kwargs):
            assert method == "call_placed"
            return await ingress.call(*args, **kwargs)

    via = ViaIngressClient("Model.iris", IngressByHandle())
    outputs, _ = loop.run_until_complete(via.call("predict", [SETOSA], background=True))
    assert outputs[0]["species"] == "setosa"


def test_the_builder_binds_no_deployment_for_a_placed_custom_model(bound):
    other = {"name": "other", "module": "examples.iris_classifier"}
    _, args = build_app({"models": [IRIS_PLACED, other]})
    models = args[3]
    assert models["iris"] is None and models["other"][0] == "Model.other"
    assert "Model.iris" not in bound and "Model.other" in bound
    jobs = args[4]
    assert jobs[0] == "JobManager" and jobs[1][3]["iris"] is None  # job work goes through the Ingress


def test_config_check_on_a_placed_custom_model():
    args = {"models": [IRIS_PLACED]}
    problems = check_config(_config(args, [{"name": "Model.iris", "num_replicas": 2}]))
    assert any("args.models[iris].placement is 'ingress'" in p and "Model.iris" in p for p in problems), problems
    good = [{"name": "Ingress", "user_config": {"Model.iris": {"max_batch_size": 16, "batch_wait_timeout_s": 0.01}}}]
    assert check_config(_config(args, good)) == []
    bad = [{"name": "Ingress", "user_config": {"Model.iris": {"max_batch_size": 0, "batch_wait_timeout_s": 0.01}}}]
    assert any("Model.iris" in p and "max_batch_size=0" in p for p in check_config(_config(args, bad)))
