"""Interactive requests before job work, on every model replica.

Two priorities (`Priority`): what a client waits on, and job records (`POST /jobs`). The model
queue (deployments/model_queue.py) runs interactive batches first; a replica's job intake
(`@serve.batch` methods with `_background` in their name) waits at the `InteractiveGate` until no
interactive call is queued or computing, so an interactive request waits behind at most the one
job batch already computing, whose size `background_max_batch_size` caps (`cap_for`).
"""

from __future__ import annotations

import asyncio
from enum import IntEnum
from typing import Any, Optional


class Priority(IntEnum):
    """Order of model work waiting for the model thread: lower runs first."""

    #: HTTP requests a client waits on (/translation, /embeddings, /models/.../predict)
    INTERACTIVE = 0
    #: records of asynchronous jobs (POST /jobs): computed when no interactive batch waits
    BACKGROUND = 1


def is_background(method: Any) -> bool:
    """Whether a `@serve.batch` method carries job work: by convention, `_background` in its name."""
    return "_background" in method.__name__


def priority_of(method: Any) -> Priority:
    return Priority.BACKGROUND if is_background(method) else Priority.INTERACTIVE


def cap_for(priority: int, size: int, background_max_batch_size: Optional[int]) -> int:
    """Most records in one batch of `priority`: `size`, capped by background_max_batch_size for
    job (background) work."""
    if background_max_batch_size is not None and priority >= Priority.BACKGROUND:
        return min(size, background_max_batch_size)
    return size


class InteractiveGate:
    """Counts the interactive calls queued or computing on a replica; job work waits for none."""

    def __init__(self) -> None:
        self.calls = 0
        self._idle = asyncio.Event()
        self._idle.set()

    def enter(self) -> None:
        self.calls += 1
        self._idle.clear()

    def leave(self) -> None:
        self.calls -= 1
        if self.calls == 0:
            self._idle.set()

    async def wait_idle(self) -> None:
        while self.calls:
            await self._idle.wait()
