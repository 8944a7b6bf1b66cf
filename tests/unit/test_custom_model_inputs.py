"""Your own model's inputs and card against hostile or unusual modules: non-finite numbers, validators that
raise what pydantic does not wrap, schemas JSON Schema cannot describe, `describe` output that is not JSON."""

from __future__ import annotations

import datetime
import enum
import inspect
import json
import sys
import types
import uuid

import numpy as np
import pytest
from pydantic import BaseModel, ConfigDict, field_validator

from deployments.custom_model import CustomModel
from deployments.model_module import import_model_module
from serve_app.custom_models import CustomModel as IngressModel
from serve_app.errors import InvalidRequest


class Measured(BaseModel):
    x: float
    extra: dict = {}


class Out(BaseModel):
    y: float


class ConvertsBadly(BaseModel):
    x: float

    @field_validator("x", mode="before")
    @classmethod
    def _first(cls, value):
        return float(value)  # a list raises TypeError, which pydantic passes through


class Arbitrary(BaseModel):
    model_config = ConfigDict(arbitrary_types_allowed=True)
    x: np.ndarray


class Colour(enum.Enum):
    RED = "red"


class Strict(BaseModel):
    model_config = ConfigDict(strict=True)
    when: datetime.date
    key: uuid.UUID
    colour: Colour
    x: float


def _module(monkeypatch, name: str, Input=Measured, describe=None) -> str:
    module = types.ModuleType(name)
    module.Input, module.Output = Input, Out
    module.load = lambda: {}
    module.predict = lambda model, inputs: [Out(y=1.0) for _ in inputs]
    module.describe = describe
    monkeypatch.setitem(sys.modules, name, module)
    return name


def _ingress(monkeypatch, **kwargs) -> IngressModel:
    name = _module(monkeypatch, "byom_inputs", **kwargs)
    return IngressModel("m", client=None, module=import_model_module(name), placement="deployment")


def test_nan_and_infinity_are_refused_where_they_are(monkeypatch):
    """Python's JSON parser reads NaN and Infinity; a float field takes them. They are 422 at the ingress."""
    model = _ingress(monkeypatch)
    body = json.loads('[{"x": 1.5}, {"x": NaN}, {"x": 2, "extra": {"deep": [0, -Infinity]}}]')
    with pytest.raises(InvalidRequest) as caught:
        model.validate(body)
    message = caught.value.message
    assert "inputs.1.x: must be a finite number" in message and "inputs.2.extra.deep.1: must be a finite" in message
    assert "inputs.0" not in message
    assert model.validate([{"x": 1e308}]) == [{"x": 1e308}]  # large is fine
    for text in ("NaN", "-inf", "Infinity", "1e400"):  # strings a lax float field turns into them
        with pytest.raises(InvalidRequest, match="inputs.0.x: must be a finite number"):
            model.validate([{"x": text}])


def test_input_nested_as_deep_as_json_allows_is_a_422_not_a_500(monkeypatch):
    """The parser takes nesting up to Python's recursion limit less the stack in use; the route validates the inputs
    some frames deeper than the body was parsed, where a recursive walk over them ran out of stack (a 500)."""
    model = _ingress(monkeypatch)
    depth = sys.getrecursionlimit() - len(inspect.stack()) - 12
    deep = json.loads('{"x": 1, "extra": ' + "[" * depth + "]" * depth + "}")

    def frames_deeper(n: int) -> list:
        return frames_deeper(n - 1) if n else model.validate([deep, {"x": float("nan")}])
    with pytest.raises(InvalidRequest, match="inputs.1.x: must be a finite number"):
        frames_deeper(20)


def test_a_strict_input_takes_dates_uuids_and_enums_as_json_carries_them(monkeypatch, loop):
    """Validated in Python mode, a strict Input refused every date, UUID and enum value a JSON client can send."""
    model = _ingress(monkeypatch, Input=Strict)
    item = {"when": "2026-11-30", "key": "12345678-1234-5678-1234-567812345678", "colour": "red", "x": 1}
    assert model.validate([item]) == [item]
    for bad, field in (({**item, "when": "30/11/2026"}, "when"), ({**item, "colour": "blue"}, "colour"),
                       ({**item, "x": "1.5"}, "x")):  # strict: no number in a string
        with pytest.raises(InvalidRequest, match=f"inputs.0.{field}"):
            model.validate([bad])
    seen = []
    name = _module(monkeypatch, "byom_strict", Input=Strict)
    sys.modules[name].predict = lambda m, inputs: seen.extend(inputs) or [Out(y=1.0) for _ in inputs]
    replica = CustomModel.func_or_class({"name": "s", "module": name})
    assert loop.run_until_complete(replica.predict([item]))[0] == [{"y": 1.0}]
    assert seen == [Strict(when=datetime.date(2026, 11, 30), key=uuid.UUID(item["key"]), colour=Colour.RED, x=1.0)]


def test_a_validator_s_own_type_error_is_a_422_naming_the_input(monkeypatch):
    model = _ingress(monkeypatch, Input=ConvertsBadly)
    with pytest.raises(InvalidRequest) as caught:
        model.validate([{"x": 1}, {"x": [1]}])
    assert caught.value.status_code == 422
    assert "inputs.1: invalid (the model's Input check raised TypeError)" in caught.value.message


def test_a_schema_json_schema_cannot_describe_does_not_fail_the_card(monkeypatch):
    model = _ingress(monkeypatch, Input=Arbitrary)
    card = model.card({"deployment": "Model.m", "backend": "custom", "batching": {}, "module": "byom_inputs",
                       "details": {}})
    assert card["input_schema"]["description"].startswith("no JSON Schema (")
    assert card["output_schema"]["properties"]["y"]["type"] == "number"


def test_describe_output_is_made_json_and_its_failure_names_only_the_exception(monkeypatch):
    name = _module(monkeypatch, "byom_describe",
                   describe=lambda model: {"classes": np.int64(3), "weights": np.array([0.5, 1.5]),
                                           "labels": {np.int64(0): "setosa", (1, 2): {"x"}}})
    replica = CustomModel.func_or_class({"name": "d", "module": name})
    details = replica.info()["details"]
    assert details["classes"] == 3 and details["weights"] == [0.5, 1.5]
    assert details["labels"] == {"0": "setosa", "[1, 2]": ["x"]}
    json.dumps(details)  # what /v1/models serialises

    def missing(model):
        raise FileNotFoundError(2, "No such file or directory", "/opt/models/acme/metrics.json")
    replica.module = types.SimpleNamespace(**{**vars(replica.module), "describe": missing})
    assert replica.info()["details"]["describe_error"] == "FileNotFoundError"  # not the path


def test_a_token_budget_for_your_own_model_is_a_config_error_in_both_placements():
    """Its batches are counted in inputs; max_batch_tokens was accepted and did nothing."""
    import copy
    from pathlib import Path

    from serve_app.config_check import check_config, load_config

    root = Path(__file__).resolve().parents[2]
    own = load_config(root / "serve_config.yaml")
    next(d for d in own["applications"][0]["deployments"] if d["name"] == "Model.iris")["user_config"][
        "max_batch_tokens"] = 16
    placed = load_config(root / "serve_config.placed.yaml")
    ingress = next(d for d in placed["applications"][0]["deployments"] if d["name"] == "Ingress")
    ingress["user_config"]["Model.iris"]["max_batch_tokens"] = 16
    for config in (own, placed):
        problems = check_config(copy.deepcopy(config))
        assert any("max_batch_tokens=16 has no effect on your own model" in p for p in problems), problems
    embedder = load_config(root / "serve_config.yaml")  # where it does something, it stays allowed
    next(d for d in embedder["applications"][0]["deployments"] if d["name"] == "Embedder")["user_config"][
        "max_batch_tokens"] = 512
    assert check_config(embedder) == []
