"""Your own models (`models:`) as the ingress sees them: their inputs checked, their /v1/models card.

The model-module contract itself (Input, Output, load, predict, describe) is the model side's:
deployments/model_module.py; the replica that runs one is deployments/custom_model.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from deployments.model_module import ModelModule, import_model_module

from .errors import InvalidRequest, describe_validation_errors
from .model_clients import ModelClient
from .settings import AppSettings


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
            try:
                self.module.Input.model_validate(raw)
                items.append(raw)
            except ValidationError as exc:
                errors += [{**e, "loc": ("inputs", i, *e["loc"])} for e in exc.errors()]
        if errors:
            raise InvalidRequest(describe_validation_errors(errors))
        return items

    def card(self, info: dict) -> dict[str, Any]:
        """The model's /v1/models entry."""
        return {"id": self.name, "task": "prediction", "deployment": info["deployment"], "placement": self.placement,
                "backend": info["backend"], "batching": info["batching"],
                "details": {"module": info["module"], **info["details"]},
                "input_schema": self.module.Input.model_json_schema(),
                "output_schema": self.module.Output.model_json_schema()}


def custom_models(settings: AppSettings, clients: dict[str, ModelClient]) -> dict[str, CustomModel]:
    missing = [spec.name for spec in settings.models if spec.name not in clients]
    if missing:
        raise ValueError(f"no deployment client for the custom models {missing!r}")
    return {spec.name: CustomModel(spec.name, clients[spec.name], import_model_module(spec.module), spec.placement)
            for spec in settings.models}
