"""Fair slots for running jobs: one API key's queued jobs do not run ahead of every other key's."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections import Counter
from typing import AsyncIterator


class FairSlots:
    """At most `limit` holders at once (jobs.max_running_jobs). A freed slot goes to the waiter whose owner holds
    the fewest slots, then whose owner was served least recently (round robin), then to the one waiting longest:
    with one key's 50 jobs queued, another key's job runs at the next free slot, not after the 50. With one owner
    (no API keys) it is first in, first out."""

    def __init__(self, limit: int):
        self.limit = limit
        self.held: Counter = Counter()
        self._waiting: list[tuple[int, str, asyncio.Future]] = []
        self._order = itertools.count()
        self._served: dict[str, int] = {}  # owner -> when it was last granted a slot (in `_order`'s count)

    @contextlib.asynccontextmanager
    async def slot(self, owner: str) -> AsyncIterator[None]:
        if self._waiting or sum(self.held.values()) >= self.limit:
            waiter = (next(self._order), owner, asyncio.get_running_loop().create_future())
            self._waiting.append(waiter)
            try:
                await waiter[2]
            except asyncio.CancelledError:
                if waiter in self._waiting:
                    self._waiting.remove(waiter)
                elif not waiter[2].cancelled():  # granted as it was cancelled: the slot goes to the next
                    self._release(owner)
                raise
        else:
            self._grant(owner)
        try:
            yield
        finally:
            self._release(owner)

    def _release(self, owner: str) -> None:
        self.held[owner] -= 1
        if not self.held[owner]:
            del self.held[owner]
        self._waiting = [w for w in self._waiting if not w[2].done()]  # (cancelled, not yet woken)
        while self._waiting and sum(self.held.values()) < self.limit:
            waiter = min(self._waiting, key=lambda w: (self.held[w[1]], self._served.get(w[1], -1), w[0]))
            self._waiting.remove(waiter)
            self._grant(waiter[1])
            waiter[2].set_result(None)

    def _grant(self, owner: str) -> None:
        self.held[owner] += 1
        self._served[owner] = next(self._order)
