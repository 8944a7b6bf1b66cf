"""The CustomModel deployment: serves a user's model module (an entry of `models:`).

One Serve deployment per registered model, named `Model.<name>` (see
`deployments.model_module.deployment_name`), so each has its own `deployments:` entry:
replicas, autoscaling, `user_config` batch knobs, `ray_actor_options`.

Each replica calls the module's `load(**options)` once, then `@serve.batch` joins the
inputs of calls from many requests into one `predict(model, inputs)` on the model thread.
If a joined batch raises, each call of it is re-run alone, so one request whose inputs
break the model fails (500) without failing the requests that shared its batch.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import Future
from typing import Any

from pydantic import BaseModel
from ray import serve

from .batch_config import CUSTOM_MODEL_BATCH, model_deployment_options
from .batching import count_records, run_joined
from .errors import ModelContractError
from .model_module import deployment_name, import_model_module, non_finite
from .replica import ModelReplica
from .settings import CustomModelSpec

logger = logging.getLogger("ray.serve")

#: what one call's batched result is: its outputs (JSON-ready dicts) and the batch's size in inputs
CallResult = tuple[list[dict], int]


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
        items = [self.module.parse_input(item) for item in inputs]
        batched = self._predict_background_batch if background else self._predict_batch
        results = await self._submit_pieces(batched, items, list)  # pieces of the live batch size
        return [out for outputs, _ in results for out in outputs], max(size for _, size in results)

    # Two intake queues with the same knobs (reconfigure sets both): interactive requests and job
    # work. The model queue joins what waits into the next batch and runs interactive batches first.
    @serve.batch(
        max_batch_size=CUSTOM_MODEL_BATCH.max_batch_size,
        batch_wait_timeout_s=CUSTOM_MODEL_BATCH.batch_wait_timeout_s,
        batch_size_fn=count_records,
    )
    async def _predict_batch(self, items: list[list[BaseModel]]) -> list[Future]:
        return self._enqueue(items, self._predict_items)

    @serve.batch(
        max_batch_size=CUSTOM_MODEL_BATCH.max_batch_size,
        batch_wait_timeout_s=CUSTOM_MODEL_BATCH.batch_wait_timeout_s,
        batch_size_fn=count_records,
    )
    async def _predict_background_batch(self, items: list[list[BaseModel]]) -> list[Future]:
        return await self._enqueue_background(items, self._predict_items)

    def _predict_items(self, items: list[list[BaseModel]]) -> list[Any]:
        """On the model thread: one `predict` over every call's inputs; each call gets its slice.
        If the joined batch raises, each call is re-run alone and gets its outputs or its own
        exception (deployments/batching.run_joined; the batch counts as failed for check_health only if
        every call failed)."""
        return run_joined(items, self._predict, lambda outputs, start, stop: outputs[start:stop], self.deployment_name)

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
        # by alias, as /v1/models's output_schema names the fields (`class_` with alias "class" answers "class")
        dumped = [(out if isinstance(out, output_class) else output_class.model_validate(out)).model_dump(
            mode="json", by_alias=True) for out in outputs]
        for index, output in enumerate(dumped):  # JSON has none: the answer would carry null, a job's page fail
            if (where := next(non_finite(output), None)) is not None:
                raise ModelContractError(f"{self.spec.module}.predict returned a NaN or infinite number in output "
                                         f"{index} at {'.'.join(map(str, where))}")
        return dumped

    def ready(self) -> dict:
        return {"deployment": self.deployment_name, "ready_at": self.ready_at}

    def info(self) -> dict:
        details: dict[str, Any] = {"load_seconds": round(self.load_seconds, 4)}
        if self.module.describe is not None:
            try:  # JSON-safe here: a NumPy value in it failed the whole /v1/models response
                details.update(_plain(self.module.describe(self.model)))
            except Exception as exc:  # a broken describe must not break /v1/models
                logger.warning("%s: %s.describe raised %r", self.deployment_name, self.spec.module, exc)
                details["describe_error"] = type(exc).__name__  # its message (paths, data) stays in the log
        return {
            "deployment": self.deployment_name,
            "backend": "custom",
            "model": self.spec.name,
            "module": self.spec.module,
            "batching": self.batching_info(),
            "details": details,
        }


def _plain(value: Any) -> Any:
    """`value` as JSON data: NumPy scalars and arrays as numbers and lists (`tolist`), mapping keys as strings,
    anything else JSON has no type for as its str."""
    if isinstance(value, dict):
        return {_key(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_plain(v) for v in value]
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    tolist = getattr(value, "tolist", None)
    return _plain(tolist()) if callable(tolist) else str(value)


def _key(key: Any) -> str:
    plain = _plain(key)  # a NumPy scalar as its number, then as text: JSON's keys are strings
    return plain if isinstance(plain, str) else str(plain)
