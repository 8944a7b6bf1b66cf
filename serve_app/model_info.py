"""Each model deployment's `info` (backend, model, language pairs, batching), as the Ingress keeps it."""

from __future__ import annotations

import asyncio
import time

from .coalescing import shared_task
from .model_clients import ModelClient

#: how long a model's `info` is reused by the requests that need it (language pairs, dimensions)
MODEL_INFO_TTL_S = 30.0


class ModelInfo:
    """`info` per deployment, reused for MODEL_INFO_TTL_S unless asked for fresh. Callers at the same time
    share one call: /v1/models asks every model fresh, and a flood of it must not fill the models' queues."""

    def __init__(self) -> None:
        self._known: dict[str, tuple[float, dict]] = {}
        self._calls: dict[str, asyncio.Future] = {}  # calls in flight, by deployment

    async def get(self, client: ModelClient, *, fresh: bool = False) -> dict:
        known = self._known.get(client.name)
        if known and not fresh and time.monotonic() - known[0] < MODEL_INFO_TTL_S:
            return known[1]
        call = self._calls.get(client.name)
        if call is None or call.done():
            call = self._calls[client.name] = shared_task(self._fetch(client))  # no caller's (coalescing.py)
        return await asyncio.shield(call)

    def clear(self) -> None:
        """Forget what is known: the next request asks each model again."""
        self._known.clear()

    async def _fetch(self, client: ModelClient) -> dict:
        info = await client.call("info")
        self._known[client.name] = (time.monotonic(), info)
        return info
