"""The CustomModel deployment: serves a user's model module (an entry of `models:`).

One Serve deployment per registered model, named `Model.<name>` (see
`serve_app.custom_models.deployment_name`), so each has its own `deployments:` entry:
replicas, autoscaling, `user_config` batch knobs, `ray_actor_options`.

Each replica calls the module's `load(**options)` once, then `@serve.batch` joins the
inputs of calls from many requests into one `predict(model, inputs)` on the model thread.
If a joined batch raises, each call of it is re-run alone, so one request whose inputs
break the model fails (500) without failing the requests that shared its batch.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from pydantic import BaseModel
from ray import serve

from serve_app.custom_models import deployment_name, import_model_module
from serve_app.settings import CustomModelSpec

from ._config import CUSTOM_MODEL_BATCH, model_deployment_options
from ._replica import ModelReplica, Priority
from .batching import count_records, split

logger = logging.getLogger("ray.serve")

#: what one call's batched result is: its outputs (JSON-ready dicts) and the batch's size in inputs
CallResult = tuple[list[dict], int]


class ModelContractError(RuntimeError):
    """The user's `predict` broke its contract (wrong number or shape of outputs)."""


@serve.deployment(**model_deployment_options("CustomModel", CUSTOM_MODEL_BATCH))
class CustomModel(ModelReplica):
    default_batch = CUSTOM_MODEL_BATCH

    def __init__(self, spec: dict):
        self.spec = CustomModelSpec.model_validate(spec)
        self.deployment_name = deployment_name(self.spec.name)
        self.module = import_model_module(self.spec.module)
        started = time.perf_counter()
        self.model = self.module.load(**self.spec.options)
        self.load_seconds = time.perf_counter() - started
        self._init_replica()
        logger.info("%s ready: module=%s loaded in %.3f s", self.deployment_name, self.spec.module,
                    self.load_seconds)

    def _batched_methods(self):
        return [self._predict_batch, self._predict_background_batch]

    async def predict(self, inputs: list[dict], background: bool = False) -> CallResult:
        """Predict one call's inputs (dicts of the module's `Input`); returns the outputs in
        order and the size (in inputs) of the largest batch they rode in.

        `background=True` (job work) queues them behind interactive requests."""
        items = [self.module.Input.model_validate(item) for item in inputs]
        batched = self._predict_background_batch if background else self._predict_batch
        pieces = split(items, self._size_for(batched, self.batch_config.max_batch_size))
        results = await asyncio.gather(*(batched(piece) for piece in pieces))
        for result in results:
            if isinstance(result, BaseException):
                raise result
        return [out for outputs, _ in results for out in outputs], max(size for _, size in results)

    # Two batch queues with the same knobs (reconfigure sets both): interactive requests and
    # job work batch separately, and the model thread runs interactive batches first.
    @serve.batch(
        max_batch_size=CUSTOM_MODEL_BATCH.max_batch_size,
        batch_wait_timeout_s=CUSTOM_MODEL_BATCH.batch_wait_timeout_s,
        batch_size_fn=count_records,
    )
    async def _predict_batch(self, items: list[list[BaseModel]]) -> list[Any]:
        return await self._predict_calls(items, Priority.INTERACTIVE)

    @serve.batch(
        max_batch_size=CUSTOM_MODEL_BATCH.max_batch_size,
        batch_wait_timeout_s=CUSTOM_MODEL_BATCH.batch_wait_timeout_s,
        batch_size_fn=count_records,
    )
    async def _predict_background_batch(self, items: list[list[BaseModel]]) -> list[Any]:
        return await self._predict_calls(items, Priority.BACKGROUND)

    async def _predict_calls(self, items: list[list[BaseModel]], priority: Priority) -> list[Any]:
        """One `predict` over every call's inputs; each call gets its slice (or, when the joined
        batch failed and the call failed again alone, its exception)."""
        self._batch_started(items)
        records = count_records(items)
        flat = [x for item in items for x in item]
        try:
            outputs = await self._run_model(lambda: self._predict(flat), records, priority)
        except Exception as exc:
            if len(items) == 1:
                raise
            return await self._predict_each_alone(items, exc, priority)
        results, offset = [], 0
        for item in items:
            results.append((outputs[offset:offset + len(item)], records))
            offset += len(item)
        return results

    async def _predict_each_alone(self, items: list[list[BaseModel]], error: Exception,
                                  priority: Priority) -> list[Any]:
        logger.warning("%s: a batch of %d calls raised %r; running each call alone", self.deployment_name,
                       len(items), error)
        failures_so_far = self._failures_in_a_row  # the joined batch already counted once
        results: list[Any] = []
        for item in items:
            try:
                outputs = await self._run_model(lambda item=item: self._predict(item), len(item), priority)
                results.append((outputs, len(item)))
            except Exception as exc:
                results.append(exc)
        # One failed batch counts once towards check_health; any call that worked shows the model works.
        worked = any(not isinstance(r, BaseException) for r in results)
        self._failures_in_a_row = 0 if worked else failures_so_far
        return results

    def _predict(self, inputs: list[BaseModel]) -> list[dict]:
        """Runs on the model thread: the user's predict, its outputs checked and made JSON-ready."""
        outputs = self.module.predict(self.model, inputs)
        try:
            outputs = list(outputs)
        except TypeError:
            raise ModelContractError(
                f"{self.spec.module}.predict returned {type(outputs).__name__}, not a list of Output") from None
        if len(outputs) != len(inputs):
            raise ModelContractError(
                f"{self.spec.module}.predict returned {len(outputs)} outputs for {len(inputs)} inputs")
        output_class = self.module.Output
        return [(out if isinstance(out, output_class) else output_class.model_validate(out)).model_dump(mode="json")
                for out in outputs]

    def ready(self) -> dict:
        return {"deployment": self.deployment_name, "ready_at": self.ready_at}

    def info(self) -> dict:
        details: dict[str, Any] = {"load_seconds": round(self.load_seconds, 4)}
        if self.module.describe is not None:
            try:
                details.update(self.module.describe(self.model))
            except Exception as exc:  # a broken describe must not break /v1/models
                logger.warning("%s: %s.describe raised %r", self.deployment_name, self.spec.module, exc)
                details["describe_error"] = repr(exc)
        return {
            "deployment": self.deployment_name,
            "backend": "custom",
            "model": self.spec.name,
            "module": self.spec.module,
            "batching": self.batching_info(),
            "details": details,
        }
