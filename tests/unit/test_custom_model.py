"""Bring your own model, without Ray: the module checks at configuration time, the
CustomModel deployment class driven directly with its batch queue, the HTTP route over
fake clients, and the worked example (examples/iris_classifier.py) itself.

Why this module is long: the bring-your-own-model contract end to end (config checks, deployment class, HTTP route, the worked example) over shared fixtures.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import sys
import types
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from pydantic import BaseModel, ValidationError

from deployments.custom_model import CustomModel
from deployments.errors import ModelContractError
from deployments.health import FAILURES_BEFORE_UNHEALTHY
from deployments.model_module import deployment_name, import_model_module
from deployments.settings import CustomModelSpec
from examples import iris_classifier as iris
from serve_app.api import app, set_service
from serve_app.config_check import check_config, load_config
from serve_app.custom_models import CustomModel as IngressModel
from serve_app.service import Service
from serve_app.settings import load_settings
from tests.support import SETOSA, VIRGINICA

from .fakes import FakeEmbedder, FakeTranslator

ROOT = Path(__file__).resolve().parents[2]
CustomModelClass = CustomModel.func_or_class
IRIS = {"name": "iris", "module": "examples.iris_classifier"}


# --- a model module made on the fly --------------------------------------------------------

class EchoInput(BaseModel):
    x: int


class EchoOutput(BaseModel):
    y: int


def echo_load(scale: int = 1, fail_on_negative: bool = True) -> dict:
    return {"scale": scale, "fail_on_negative": fail_on_negative, "batches": [], "wrong_count": False,
            "as_dicts": False}


def echo_predict(model: dict, inputs: list[EchoInput]) -> list:
    model["batches"].append([i.x for i in inputs])
    if model["fail_on_negative"] and any(i.x < 0 for i in inputs):
        raise ValueError("negative input")
    if model["wrong_count"]:
        return []
    if model["as_dicts"]:
        return [{"y": i.x * model["scale"]} for i in inputs]
    return [EchoOutput(y=i.x * model["scale"]) for i in inputs]


def echo_describe(model: dict) -> dict:
    return {"scale": model["scale"]}


def register(monkeypatch, name: str, **attrs) -> str:
    """Install a module `name` with `attrs` (importable until the test ends); returns its name."""
    module = types.ModuleType(name)
    for key, value in attrs.items():
        setattr(module, key, value)
    monkeypatch.setitem(sys.modules, name, module)
    return name


@pytest.fixture
def echo_module(monkeypatch) -> str:
    return register(monkeypatch, "byom_echo", Input=EchoInput, Output=EchoOutput, load=echo_load,
                    predict=echo_predict, describe=echo_describe)


# --- configuration-time checks -----------------------------------------------------------

def test_the_example_is_a_valid_model_module():
    module = import_model_module("examples.iris_classifier")
    assert module.Input is iris.Input and module.Output is iris.Output and module.describe is iris.describe
    spec = CustomModelSpec.model_validate({**IRIS, "options": {"seed": 3, "held_out_fraction": 0.2}})
    assert spec.options == {"seed": 3, "held_out_fraction": 0.2}


@pytest.mark.parametrize("entry, quoted", [
    ({**IRIS, "module": "examples.no_such_model"}, "'examples.no_such_model' cannot be imported"),
    ({**IRIS, "module": "examples/iris_classifier.py"}, "'examples/iris_classifier.py' is not a dotted"),
    ({**IRIS, "options": {"seeed": 1}}, "options {'seeed': 1} do not fit examples.iris_classifier.load"),
    ({**IRIS, "name": "Iris Species"}, "should match pattern"),
    ({**IRIS, "name": "translation"}, "'translation' is a built-in task's"),  # jobs could never reach it
    ({**IRIS, "name": "embeddings"}, "'embeddings' is a built-in task's"),
    ({**IRIS, "modul": "x"}, "modul"),
    ({"name": "iris"}, "module"),
])
def test_bad_model_entries_fail_at_configuration_time_quoted(entry, quoted):
    with pytest.raises(ValidationError) as caught:
        load_settings({"models": [entry]})
    assert quoted in str(caught.value)


@pytest.mark.parametrize("attrs, problem", [
    ({"Input": dict}, "Input must be a pydantic BaseModel subclass"),
    ({"Output": None}, "Output must be a pydantic BaseModel subclass"),
    ({"load": "not a function"}, "load must be a function"),
    ({"predict": None}, "predict must be a function"),
    ({"predict": lambda inputs: inputs}, "predict must take (model, inputs)"),
    ({"describe": 42}, "describe, when present, must be a function"),
])
def test_a_module_missing_a_piece_is_named_with_the_piece(monkeypatch, attrs, problem):
    pieces = {"Input": EchoInput, "Output": EchoOutput, "load": echo_load, "predict": echo_predict, **attrs}
    name = register(monkeypatch, "byom_broken", **{k: v for k, v in pieces.items() if v is not None})
    with pytest.raises(ValidationError) as caught:
        load_settings({"models": [{"name": "broken", "module": name}]})
    assert "'byom_broken' is not a model module" in str(caught.value) and problem in str(caught.value)


def test_a_module_that_raises_on_import_is_reported(monkeypatch, tmp_path):
    (tmp_path / "byom_raises.py").write_text("raise RuntimeError('needs a GPU driver')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ValidationError, match="'byom_raises' failed to import: RuntimeError: needs a GPU driver"):
        load_settings({"models": [{"name": "x", "module": "byom_raises"}]})


def test_model_names_are_unique():
    with pytest.raises(ValidationError, match="repeated: 'iris'"):
        load_settings({"models": [IRIS, IRIS]})


def test_config_checker_knows_custom_model_deployments():
    config = load_config(ROOT / "serve_config.yaml")
    assert check_config(config) == []
    names = [d["name"] for d in config["applications"][0]["deployments"]]
    assert deployment_name("iris") == "Model.iris" and "Model.iris" in names

    typo = copy.deepcopy(config)
    next(d for d in typo["applications"][0]["deployments"] if d["name"] == "Model.iris")["name"] = "Model.irs"
    assert any("no deployment named 'Model.irs'" in p and "Model.iris" in p for p in check_config(typo))

    bad_batch = copy.deepcopy(config)
    next(d for d in bad_batch["applications"][0]["deployments"]
         if d["name"] == "Model.iris")["user_config"]["max_batch_size"] = 0
    assert any("Model.iris" in p and "max_batch_size=0" in p for p in check_config(bad_batch))

    unregistered = copy.deepcopy(config)
    unregistered["applications"][0]["args"]["models"] = []
    assert any("no deployment named 'Model.iris'" in p for p in check_config(unregistered))


# --- the deployment class, its batch queue and its failure handling ------------------------

@pytest.fixture(autouse=True)
def _no_replica_context(monkeypatch):
    # Ray 2.60's batch queue reads the replica context only to warn when
    # max_batch_size exceeds max_ongoing_requests; outside Serve there is none.
    from ray.serve import batching
    monkeypatch.setattr(batching._BatchQueue, "_warn_if_max_batch_size_exceeds_max_ongoing_requests",
                        lambda self: None)


@pytest.fixture
def echo(echo_module):
    replica = CustomModelClass({"name": "echo", "module": echo_module, "options": {"scale": 10}})
    replica.reconfigure({"max_batch_size": 16, "batch_wait_timeout_s": 0.05})
    return replica


def test_concurrent_calls_share_one_predict(echo, loop):
    calls = [[{"x": 1}, {"x": 2}], [{"x": 3}], [{"x": 4}, {"x": 5}, {"x": 6}]]

    async def go():
        return await asyncio.gather(*(echo.predict(c) for c in calls))

    results = loop.run_until_complete(go())
    assert [outputs for outputs, _ in results] == [[{"y": 10}, {"y": 20}], [{"y": 30}],
                                                   [{"y": 40}, {"y": 50}, {"y": 60}]]
    assert echo.model["batches"] == [[1, 2, 3, 4, 5, 6]], "one model call for the three requests"
    assert {size for _, size in results} == {6}
    assert echo.stats()["computed"] == 6 and echo.deployment_name == "Model.echo"


def test_two_models_in_one_process_keep_their_own_batches_and_knobs(echo_module, loop):
    """Two of your own models placed in one Ingress are two objects of one class in one process: Serve's
    batch queue was per decorated function, so one's calls ran on the other's model (its first caller's)."""
    tens = CustomModelClass({"name": "tens", "module": echo_module, "options": {"scale": 10}})
    thousands = CustomModelClass({"name": "thousands", "module": echo_module, "options": {"scale": 1000}})
    for model in (tens, thousands):
        model.reconfigure({"max_batch_size": 16, "batch_wait_timeout_s": 0.05})
    thousands.reconfigure({"max_batch_size": 2, "batch_wait_timeout_s": 0.05})

    async def go():
        return await asyncio.gather(tens.predict([{"x": 1}]), thousands.predict([{"x": 1}]),
                                    tens.predict([{"x": 2}]), thousands.predict([{"x": 2}]))

    results = loop.run_until_complete(go())
    assert [outputs for outputs, _ in results] == [[{"y": 10}], [{"y": 1000}], [{"y": 20}], [{"y": 2000}]]
    assert tens.model["batches"] == [[1, 2]] and thousands.model["batches"] == [[1, 2]]
    assert tens._predict_batch._get_max_batch_size() == 16 and thousands._predict_batch._get_max_batch_size() == 2


def test_max_batch_size_is_counted_in_inputs_and_reconfigurable(echo, loop):
    echo.reconfigure({"max_batch_size": 2, "batch_wait_timeout_s": 0.05})
    outputs, size = loop.run_until_complete(echo.predict([{"x": i} for i in range(5)]))
    assert [o["y"] for o in outputs] == [0, 10, 20, 30, 40]
    assert sorted(len(b) for b in echo.model["batches"]) == [1, 2, 2] and size == 2
    assert echo.info()["batching"]["max_batch_size"] == 2


def test_a_call_is_cut_to_the_live_batch_size_when_the_adaptive_size_shrinks(echo, loop):
    echo.reconfigure({"max_batch_size": 16, "batch_wait_timeout_s": 0.01, "target_p99_batch_latency_s": 0.5})
    echo._sizer.observe(5.0, 16)  # one slow batch: the live size backs off below 16
    assert echo.live_max_batch_size() < 14

    async def go():
        return await asyncio.gather(echo.predict([{"x": i} for i in range(14)]), echo.predict([{"x": 1}]))

    (many, _), (one, _) = loop.run_until_complete(go())
    assert [o["y"] for o in many] == [i * 10 for i in range(14)] and one == [{"y": 10}]
    assert max(len(b) for b in echo.model["batches"]) <= echo.live_max_batch_size()


def test_a_model_s_own_runtime_error_is_not_computed_again_in_parts(echo, loop):
    """Only Serve's refusal of an item larger than the shrunk size is cut and resent: a model's RuntimeError
    (torch's out of memory, say) after the size shrank was computed again in parts, each failure counted."""
    echo.reconfigure({"max_batch_size": 16, "batch_wait_timeout_s": 0.01})
    sent = []

    async def fails(item, counted=False):
        sent.append(len(item))
        echo.batch_config = echo.batch_config.model_copy(update={"max_batch_size": 4})  # shrank meanwhile
        raise RuntimeError("CUDA out of memory")

    with pytest.raises(RuntimeError, match="out of memory"):
        loop.run_until_complete(echo._submit_pieces(fails, [{"x": i} for i in range(16)], list))
    assert sent == [16]


def test_inputs_are_validated_once_where_the_model_runs(monkeypatch, loop):
    """The ingress checks each input and sends it as the client wrote it: a converting validator runs once,
    and aliased fields arrive under their aliases."""
    from pydantic import Field, field_validator

    class Centimetres(BaseModel):
        length_mm: float = Field(alias="length-cm")

        @field_validator("length_mm")
        @classmethod
        def _to_mm(cls, value: float) -> float:
            return value * 10

    name = register(monkeypatch, "byom_cm", Input=Centimetres, Output=EchoOutput, load=echo_load,
                    predict=lambda model, inputs: [EchoOutput(y=int(i.length_mm)) for i in inputs])
    ingress = IngressModel("cm", client=None, module=import_model_module(name), placement="deployment")
    sent = ingress.validate([{"length-cm": 5}])
    replica = CustomModelClass({"name": "cm", "module": name})
    replica.reconfigure({"max_batch_size": 4, "batch_wait_timeout_s": 0.01})
    outputs, _ = loop.run_until_complete(replica.predict(sent))
    assert outputs == [{"y": 50}]  # 5 cm = 50 mm, converted once (500 when the ingress sent its dump)


def test_a_call_that_breaks_the_model_fails_alone(echo, loop):
    async def go():
        return await asyncio.gather(echo.predict([{"x": 1}, {"x": 2}]), echo.predict([{"x": -1}]),
                                    echo.predict([{"x": 3}]), return_exceptions=True)

    first, poisoned, third = loop.run_until_complete(go())
    assert first[0] == [{"y": 10}, {"y": 20}] and third[0] == [{"y": 30}]
    assert isinstance(poisoned, ValueError) and "negative input" in str(poisoned)
    # the joined batch, then each call alone
    assert echo.model["batches"] == [[1, 2, -1, 3], [1, 2], [-1], [3]]
    echo.check_health()  # the model works for other inputs: the replica stays healthy


def test_a_model_failing_every_call_turns_the_replica_unhealthy(echo, loop):
    for _ in range(FAILURES_BEFORE_UNHEALTHY):
        with pytest.raises(ValueError):
            loop.run_until_complete(echo.predict([{"x": -1}]))
    with pytest.raises(RuntimeError, match="Model.echo: last 3 model calls failed"):
        echo.check_health()


def test_bad_inputs_in_a_row_do_not_fail_a_working_model(echo, loop):
    loop.run_until_complete(echo.predict([{"x": 2}]))  # a call that succeeded: the known-good one
    for _ in range(2 * FAILURES_BEFORE_UNHEALTHY):
        with pytest.raises(ValueError, match="negative input"):
            loop.run_until_complete(echo.predict([{"x": -1}]))
    echo.check_health()  # after each failed call the known-good one was computed again, and passed
    assert echo.model["batches"] == [[2]] + [[-1], [2]] * (2 * FAILURES_BEFORE_UNHEALTHY)

    echo.model["wrong_count"] = True  # now the model is broken: the known-good call fails too
    for _ in range(FAILURES_BEFORE_UNHEALTHY):
        with pytest.raises(ModelContractError):
            loop.run_until_complete(echo.predict([{"x": 1}]))
    with pytest.raises(RuntimeError, match="Model.echo: last 3 model calls failed"):
        echo.check_health()


def test_outputs_are_checked_against_the_contract(echo, loop):
    echo.model["as_dicts"] = True  # dicts are accepted and validated against Output
    assert loop.run_until_complete(echo.predict([{"x": 4}]))[0] == [{"y": 40}]
    echo.model["wrong_count"] = True
    with pytest.raises(ModelContractError, match="returned 0 outputs for 2 inputs"):
        loop.run_until_complete(echo.predict([{"x": 1}, {"x": 2}]))


def test_inputs_are_validated_in_the_replica_too(echo, loop):
    with pytest.raises(ValidationError):
        loop.run_until_complete(echo.predict([{"x": "not a number"}]))
    assert echo.model["batches"] == []


def test_background_work_is_batched_on_its_own_queue(echo, loop):
    async def go():
        return await asyncio.gather(echo.predict([{"x": 1}], background=True),
                                    echo.predict([{"x": 2}], background=True), echo.predict([{"x": 3}]))

    results = loop.run_until_complete(go())
    assert [r[0] for r in results] == [[{"y": 10}], [{"y": 20}], [{"y": 30}]]
    assert sorted(map(sorted, echo.model["batches"])) == [[1, 2], [3]]
    assert echo.stats()["computed_background"] == 2 and echo.stats()["computed_interactive"] == 1


def test_ready_and_info(echo):
    assert echo.ready()["deployment"] == "Model.echo"
    info = echo.info()
    assert (info["deployment"], info["model"], info["module"], info["backend"]) == (
        "Model.echo", "echo", "byom_echo", "custom")
    assert info["details"]["scale"] == 10 and info["details"]["load_seconds"] >= 0

    def broken(model):
        raise KeyError("oops")

    echo.module = dataclasses.replace(echo.module, describe=broken)
    assert "KeyError" in echo.info()["details"]["describe_error"]


# --- the route, over fake clients ----------------------------------------------------------

class InProcessModel:
    """A custom model deployment's stand-in: its module, loaded here, called per call."""

    def __init__(self, module: str, **options):
        self.module = import_model_module(module)
        self.model = self.module.load(**options)
        self.name = "Model.test"
        self.calls: list[list[dict]] = []

    async def call(self, method: str, *args):
        if method == "ready":
            return {"deployment": self.name}
        if method == "info":
            return {"deployment": self.name, "backend": "custom", "model": "test", "module": self.module.path,
                    "batching": {"max_batch_size": 8}, "details": self.module.describe(self.model)}
        (items,) = args
        self.calls.append(items)
        outputs = self.module.predict(self.model, [self.module.Input.model_validate(i) for i in items])
        return [o.model_dump(mode="json") for o in outputs], len(items)


@pytest.fixture
def http():
    model = InProcessModel("examples.iris_classifier")
    settings = load_settings({"models": [IRIS], "ingress": {"inputs_per_predict_call": 2, "max_predict_inputs": 5}})
    set_service(Service(settings, translator=FakeTranslator(), embedder=FakeEmbedder(), models={"iris": model}))
    with TestClient(app, raise_server_exceptions=False) as client:
        yield client, model
    set_service(None)


def test_predict_route_keeps_order_across_calls(http):
    client, model = http
    flowers = [SETOSA, VIRGINICA, SETOSA, VIRGINICA, SETOSA]
    resp = client.post("/models/iris/predict", json={"inputs": flowers})
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["model"] == "iris"
    assert [o["species"] for o in body["outputs"]] == ["setosa", "virginica", "setosa", "virginica", "setosa"]
    assert [len(c) for c in model.calls] == [2, 2, 1], "cut into calls of inputs_per_predict_call"
    assert resp.headers["X-Batch-Records"] == "2"


@pytest.mark.parametrize("payload, status, error_type, says", [
    ({"inputs": [SETOSA] * 6}, 413, "payload_too_large", "6 inputs in one request; the limit is 5"),
    ({"inputs": [{**SETOSA, "petal_width_cm": -1}]}, 422, "invalid_request",
     "inputs.0.petal_width_cm: Input should be greater than 0"),
    ({"inputs": [SETOSA, {**SETOSA, "sepal_lenght_cm": 5}]}, 422, "invalid_request",
     "inputs.1.sepal_lenght_cm: Extra inputs are not permitted"),
    ({"inputs": []}, 422, "invalid_request", "inputs"),
    ({"inputs": ["not an object"]}, 422, "invalid_request", "inputs.0"),
])
def test_predict_route_errors(http, payload, status, error_type, says):
    client, model = http
    resp = client.post("/models/iris/predict", json=payload)
    assert resp.status_code == status, resp.text
    assert resp.json()["error_type"] == error_type and says in resp.json()["error"]
    assert model.calls == [], "nothing reaches the model"


def test_unknown_model_is_404_naming_the_served_ones(http):
    client, _ = http
    resp = client.post("/models/irís/predict", json={"inputs": [SETOSA]})
    assert resp.status_code == 404
    assert resp.json() == {"error": "No model named 'irís' is served here; models: 'iris'.",
                           "error_type": "model_not_found"}


def test_models_and_readiness_list_custom_models(http):
    client, _ = http
    cards = {c["id"]: c for c in client.get("/v1/models").json()["data"]}
    card = cards["iris"]
    assert card["task"] == "prediction" and card["details"]["module"] == "examples.iris_classifier"
    assert set(card["input_schema"]["properties"]) == set(iris.FEATURES)
    assert "species" in card["output_schema"]["properties"]
    assert card["details"]["held_out_accuracy"] >= 0.9
    ready = client.get("/readyz")
    assert ready.status_code == 200 and ready.json()["models"]["Model.test"] == "ready"


def test_a_spec_without_a_deployment_client_is_a_wiring_error():
    with pytest.raises(ValueError, match="no deployment client for the custom models \\['iris'\\]"):
        Service(load_settings({"models": [IRIS]}), translator=FakeTranslator(), embedder=FakeEmbedder())


# --- the worked example ---------------------------------------------------------------------

def test_iris_example_is_accurate_and_deterministic():
    first, second = iris.load(seed=0), iris.load(seed=0)
    assert first.held_out_accuracy >= 0.9, first.held_out_accuracy
    assert first.held_out_accuracy == second.held_out_accuracy
    assert (first.train_size, first.held_out_size) == (112, 38)
    flowers = [iris.Input(**SETOSA), iris.Input(**VIRGINICA)]
    a, b = iris.predict(first, flowers), iris.predict(second, flowers)
    assert a == b
    assert [o.species for o in a] == ["setosa", "virginica"]
    for out in a:
        assert abs(sum(out.probabilities.values()) - 1) < 1e-9
        assert out.confidence == max(out.probabilities.values()) and out.within_training_range


def test_iris_example_flags_measurements_it_never_saw():
    model = iris.load()
    (giant,) = iris.predict(model, [iris.Input(**{**SETOSA, "sepal_length_cm": 40})])
    assert giant.within_training_range is False


def test_iris_example_answers_alone_as_in_a_batch():
    model = iris.load()
    flowers = [iris.Input(**SETOSA), iris.Input(**VIRGINICA)] * 10
    together = iris.predict(model, flowers)
    alone = [iris.predict(model, [flower])[0] for flower in flowers]
    assert [o.species for o in together] == [o.species for o in alone]
    for t, a in zip(together, alone):
        assert t.probabilities == pytest.approx(a.probabilities, abs=1e-12)


@pytest.mark.parametrize("options, says", [
    ({"held_out_fraction": 1.5}, "held_out_fraction must be between 0 and 1"),
    ({"regularization": 0}, "regularization must be positive"),
])
def test_iris_example_rejects_bad_options(options, says):
    with pytest.raises(ValueError, match=says):
        iris.load(**options)


# --- serve_app.client -----------------------------------------------------------------------

def test_the_python_client_predicts_and_retries_503():
    import json

    import httpx

    from serve_app.client import AsyncClient, Client, RetryPolicy, ServeAppHTTPError

    calls = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request)
        if len(calls) == 1:
            return httpx.Response(503, headers={"Retry-After": "0"},
                                  json={"error": "at capacity", "error_type": "overloaded"})
        inputs = json.loads(request.content)["inputs"]
        return httpx.Response(200, json={"model": "iris", "outputs": [{"n": i["n"]} for i in inputs][:2]})

    no_wait = RetryPolicy(max_retries=2, default_wait_s=0.0, max_retry_wait_s=0.0)
    with Client(transport=httpx.MockTransport(handler), retry=no_wait) as client:
        assert client.predict("iris", [{"n": 1}, {"n": 2}], deadline_ms=500) == [{"n": 1}, {"n": 2}]
        with pytest.raises(ServeAppHTTPError, match="2 outputs for 3 inputs"):
            client.predict("iris", [{"n": 1}, {"n": 2}, {"n": 3}])
    assert [c.url.path for c in calls] == ["/models/iris/predict"] * 3
    assert 400 < int(calls[1].headers["X-Request-Timeout-Ms"]) <= 500  # the retry asks for what is left of 500 ms

    async def go():
        async with AsyncClient(transport=httpx.MockTransport(handler), retry=no_wait) as client:
            return await client.predict("iris", [{"n": 7}])

    assert asyncio.run(go()) == [{"n": 7}]
