"""What your own model's outputs become in an answer (deployments/custom_model.py): named as /v1/models's
output_schema names them, and only numbers JSON has. From a read-only review (2026-12-01)."""

from __future__ import annotations

import math

import pytest
from pydantic import BaseModel, Field

from deployments.custom_model import CustomModel
from serve_app.custom_models import _json_schema

from .test_custom_model import _no_replica_context, register  # noqa: F401 - the fixture


class In(BaseModel):
    x: float


class Out(BaseModel):
    class_: str = Field(alias="class")  # `class` is a Python keyword: the usual way to answer it
    confidence: float
    internal: int = Field(0, exclude=True)


def _load() -> dict:
    return {}


def _predict(model: dict, inputs: list[In]) -> list[Out]:
    return [Out(**{"class": "setosa"}, confidence=math.sqrt(i.x) if i.x >= 0 else math.nan) for i in inputs]


@pytest.fixture
def aliased(monkeypatch):
    name = register(monkeypatch, "byom_aliased", Input=In, Output=Out, load=_load, predict=_predict)
    replica = CustomModel.func_or_class({"name": "aliased", "module": name})
    replica.reconfigure({"max_batch_size": 8, "batch_wait_timeout_s": 0.0})
    return replica


def test_outputs_carry_the_aliases_the_output_schema_names(aliased, loop):
    """The answer said "class_" where /v1/models's output_schema requires "class": generated clients broke."""
    outputs, _ = loop.run_until_complete(aliased.predict([{"x": 4.0}]))
    assert outputs == [{"class": "setosa", "confidence": 2.0}]
    schema = _json_schema(Out, output=True)
    assert set(schema["properties"]) == {"class", "confidence"} == set(outputs[0])  # not the excluded field
    assert set(_json_schema(In)["properties"]) == {"x"}


def test_a_nan_in_an_output_fails_its_own_call_with_the_contract_named(aliased, loop):
    """A NaN reached the answer as null (against the schema's number) and made a job's result pages a 500."""
    import asyncio

    async def both():
        return await asyncio.gather(aliased.predict([{"x": -1.0}]), aliased.predict([{"x": 9.0}]),
                                    return_exceptions=True)
    bad, good = loop.run_until_complete(both())
    assert "NaN or infinite number in output 0 at confidence" in str(bad)
    assert good[0] == [{"class": "setosa", "confidence": 3.0}]  # the call beside it, re-run alone, is answered
