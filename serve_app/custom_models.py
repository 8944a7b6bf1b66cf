"""Your own models (`models:`) as the ingress sees them: their inputs checked, their /v1/models card.

The model-module contract itself (Input, Output, load, predict, describe) is the model side's:
deployments/model_module.py; the replica that runs one is deployments/custom_model.py.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from deployments.model_module import ModelModule, import_model_module, non_finite

from .errors import InvalidRequest, describe_validation_errors
from .model_clients import ModelClient
from .settings import AppSettings

logger = logging.getLogger("serve_app")


@dataclass(frozen=True)
class CustomModel:
    """A custom model as the ingress sees it: the client of its deployment (or of the model placed
    in this Ingress) and its module, imported for the `Input` / `Output` schemas only (`load` runs
    where the model runs)."""

    name: str
    client: ModelClient
    module: ModelModule
    #: `deployment` or `ingress` (its `models[].placement`), shown on its /v1/models card
    placement: str

    def validate(self, inputs: list[Any]) -> list[dict]:
        """Each input checked against the module's `Input` (422 quoting every bad field). The inputs
        go to the replica as the client sent them: it builds each `Input` once, so validators that
        convert a value run once and aliased fields keep their names."""
        items, errors = [], []
        for i, raw in enumerate(inputs):
            # JSON has no NaN or Infinity, but Python's parser takes them and a float field accepts them: a
            # model that raises on them failed its batch, and a few such requests its health check
            if bad := _non_finite_errors(i, raw):
                errors += bad
                continue
            try:
                validated = self.module.parse_input(raw)
                # ... nor as strings ("NaN", "-inf", "1e400"), which a lax float field turns into them
                if bad := _non_finite_errors(i, validated.model_dump()):
                    errors += bad
                    continue
                items.append(raw)
            except ValidationError as exc:
                errors += [{**e, "loc": ("inputs", i, *e["loc"])} for e in exc.errors()]
            except Exception as exc:  # noqa: BLE001 - a validator's own TypeError etc.: the input's fault
                logger.info("%s: Input validation raised %s on input %d", self.name, type(exc).__name__, i)
                errors.append({"loc": ("inputs", i), "msg": f"invalid (the model's Input check raised "
                                                           f"{type(exc).__name__})"})
        if errors:
            raise InvalidRequest(describe_validation_errors(errors))
        return items

    def card(self, info: dict) -> dict[str, Any]:
        """The model's /v1/models entry."""
        return {"id": self.name, "task": "prediction", "deployment": info["deployment"], "placement": self.placement,
                "backend": info["backend"], "batching": info["batching"],
                "details": {"module": info["module"], **info["details"]},
                "input_schema": _json_schema(self.module.Input),
                "output_schema": _json_schema(self.module.Output, output=True)}


def _json_schema(model: Any, output: bool = False) -> dict[str, Any]:
    """A schema class's JSON Schema, or why there is none (a field JSON Schema cannot describe, such as an
    arbitrary type): one model's schema must not fail /v1/models for every model."""
    try:
        # an Output as its answers carry it (aliases, excluded fields: serialization), an Input as it is sent
        return model.model_json_schema(mode="serialization" if output else "validation")
    except Exception as exc:  # noqa: BLE001 - pydantic's PydanticInvalidForJsonSchema and the like
        return {"description": f"no JSON Schema ({type(exc).__name__})"}


def _non_finite_errors(index: int, value: Any) -> list[dict]:
    """The 422 errors for input `index`'s NaN and infinite floats, if any."""
    return [{"loc": ("inputs", index, *loc), "msg": "must be a finite number (not NaN or Infinity)"}
            for loc in non_finite(value)]


def custom_models(settings: AppSettings, clients: dict[str, ModelClient]) -> dict[str, CustomModel]:
    missing = [spec.name for spec in settings.models if spec.name not in clients]
    if missing:
        raise ValueError(f"no deployment client for the custom models {missing!r}")
    return {spec.name: CustomModel(spec.name, clients[spec.name], import_model_module(spec.module), spec.placement)
            for spec in settings.models}
