"""Bring your own model: what a model module must define, checked at configuration time.

A model module (see `examples/iris_classifier.py`) is a plain Python module with

- ``class Input(pydantic.BaseModel)``: one item of a request;
- ``class Output(pydantic.BaseModel)``: the answer for one item;
- ``def load(**options)``: builds the model, once per replica at start-up (``options`` come
  from the Serve config);
- ``def predict(model, inputs: list[Input]) -> list[Output]``: one batch, the outputs in the
  inputs' order;
- optionally ``def describe(model) -> dict``: shown in ``/v1/models`` (accuracy, classes, ...).

The ingress imports the module for its schemas only (it never calls ``load``), so keep heavy
imports (scikit-learn, torch) inside ``load``/``predict``. No Ray here: the settings, the
ingress (serve_app/) and the unit tests use it; docs/your-own-model.md is the user's guide.
"""

from __future__ import annotations

import importlib
import inspect
import json
import math
import re
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Callable, Iterator, Optional

from pydantic import BaseModel

#: a model's name: its URL segment (`/models/<name>/predict`) and its deployment's suffix
MODEL_NAME_PATTERN = r"^[a-z0-9][a-z0-9_-]{0,62}$"

#: Serve deployment of the custom model `<name>`; the dot cannot occur in a model name, so
#: these names never collide with Ingress, Translator or Embedder
DEPLOYMENT_PREFIX = "Model."

_DOTTED = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")


def deployment_name(model_name: str) -> str:
    """The Serve deployment (and `deployments:` entry of the Serve config) of a custom model."""
    return f"{DEPLOYMENT_PREFIX}{model_name}"


@dataclass(frozen=True)
class ModelModule:
    """A checked model module: its path and the pieces the deployment and the ingress use."""

    path: str
    module: ModuleType
    Input: type[BaseModel]
    Output: type[BaseModel]
    load: Callable[..., Any]
    predict: Callable[[Any, list], Any]
    describe: Optional[Callable[[Any], dict]]

    def check_options(self, options: dict[str, Any]) -> None:
        """Raise (quoting the options) unless `load(**options)` fits load's signature."""
        signature = inspect.signature(self.load)
        try:
            signature.bind(**options)
        except TypeError as exc:
            raise ValueError(
                f"options {options!r} do not fit {self.path}.load{signature}: {exc}"
            ) from None

    def parse_input(self, item: Any) -> BaseModel:
        """One input as the client sent it (parsed JSON), validated in pydantic's JSON mode: a strict `Input`
        then takes dates, UUIDs and enum values as the strings JSON carries them in (Python mode refused them)."""
        return self.Input.model_validate_json(json.dumps(item, allow_nan=False))


def _is_model_class(value: Any) -> bool:
    return inspect.isclass(value) and issubclass(value, BaseModel)


def _takes_two_positional(fn: Callable) -> bool:
    try:
        inspect.signature(fn).bind(object(), [])
    except (TypeError, ValueError):
        return False
    return True


def import_model_module(path: str) -> ModelModule:
    """Import `path` and check it is a model module; raise ValueError quoting `path` otherwise."""
    if not isinstance(path, str) or not _DOTTED.fullmatch(path):
        raise ValueError(f"module {path!r} is not a dotted import path (e.g. 'examples.iris_classifier')")
    try:
        module = importlib.import_module(path)
    except ModuleNotFoundError as exc:
        raise ValueError(f"module {path!r} cannot be imported: {exc}") from None
    except Exception as exc:  # the module itself raised while importing
        raise ValueError(f"module {path!r} failed to import: {type(exc).__name__}: {exc}") from None
    problems = []
    for name in ("Input", "Output"):
        if not _is_model_class(getattr(module, name, None)):
            problems.append(f"{name} must be a pydantic BaseModel subclass (found {getattr(module, name, None)!r})")
    for name in ("load", "predict"):
        if not callable(getattr(module, name, None)):
            problems.append(f"{name} must be a function (found {getattr(module, name, None)!r})")
    predict = getattr(module, "predict", None)
    if callable(predict) and not _takes_two_positional(predict):
        problems.append(f"predict must take (model, inputs); its signature is {inspect.signature(predict)}")
    describe = getattr(module, "describe", None)
    if describe is not None and not callable(describe):
        problems.append(f"describe, when present, must be a function (found {describe!r})")
    if problems:
        raise ValueError(f"module {path!r} is not a model module: " + "; ".join(problems))
    return ModelModule(path=path, module=module, Input=module.Input, Output=module.Output, load=module.load,
                       predict=module.predict, describe=describe)


def non_finite(value: Any) -> Iterator[tuple]:
    """Where in a parsed JSON value a float is NaN or infinite, in document order. A walk, not a recursion: input
    nested as deep as the JSON parser allows was a RecursionError here (a 500), before the Input's own 422."""
    stack: list[tuple[Any, tuple]] = [(value, ())]
    while stack:
        value, loc = stack.pop()
        if isinstance(value, float) and not math.isfinite(value):
            yield loc
        elif isinstance(value, (dict, list)):
            items = value.items() if isinstance(value, dict) else enumerate(value)
            stack.extend(reversed([(item, (*loc, key)) for key, item in items]))
