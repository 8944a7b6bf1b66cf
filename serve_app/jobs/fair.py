"""Fair slots for running jobs: one API key's queued jobs do not run ahead of every other key's."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections import Counter
from typing import AsyncIterator

from .job import ANONYMOUS, share_of


class FairSlots:
    """At most `limit` holders at once (jobs.max_running_jobs), and at most `share` of them (jobs.max_share_per_key,
    at least one) for one API key. A freed slot goes to the waiter whose owner holds the fewest slots, then whose
    owner was served least recently (round robin), then to the one waiting longest: with one key's 50 jobs queued,
    another key's job runs at the next free slot, not after the 50. A job holds its slot until it ends (an hour,
    at jobs.job_timeout_s), so without the share one key's two jobs held both default slots and another key's job
    waited for them; with it, a slot stays free for the next key. A job that was already running (resumed after a
    restart or adopted) is not held back by its key's share: its time limit has been counting since it started.
    With one owner (no API keys) it is first in, first out, over every slot."""

    def __init__(self, limit: int, share: float = 1.0):
        self.limit = limit
        self.per_owner = share_of(limit, share)  # (rounded as the store's shares: job.StoreLimits)
        self.held: Counter = Counter()
        self._waiting: list[tuple[int, str, asyncio.Future, bool]] = []  # (order, owner, granted, within the share)
        self._order = itertools.count()
        self._served: dict[str, int] = {}  # owner -> when it was last granted a slot (in `_order`'s count)

    @contextlib.asynccontextmanager
    async def slot(self, owner: str, capped: bool = True) -> AsyncIterator[None]:
        waiter = (next(self._order), owner, asyncio.get_running_loop().create_future(), capped)
        self._waiting.append(waiter)
        self._dispatch()
        if not waiter[2].done():
            try:
                await waiter[2]
            except asyncio.CancelledError:
                if waiter in self._waiting:
                    self._waiting.remove(waiter)
                elif not waiter[2].cancelled():  # granted as it was cancelled: the slot goes to the next
                    self._release(owner)
                raise
        try:
            yield
        finally:
            self._release(owner)

    def _may_hold_more(self, waiter: tuple) -> bool:
        _, owner, _, capped = waiter  # (keys off: one owner, not bounded apart)
        return not capped or owner == ANONYMOUS or self.held[owner] < self.per_owner

    def _release(self, owner: str) -> None:
        self.held[owner] -= 1
        if not self.held[owner]:
            del self.held[owner]
        self._dispatch()

    def _dispatch(self) -> None:
        """Grant free slots to the waiters that may hold one more, in the order of the class docstring."""
        self._waiting = [w for w in self._waiting if not w[2].done()]  # (cancelled, not yet woken)
        while sum(self.held.values()) < self.limit:
            eligible = [w for w in self._waiting if self._may_hold_more(w)]
            if not eligible:
                return
            waiter = min(eligible, key=lambda w: (self.held[w[1]], self._served.get(w[1], -1), w[0]))
            self._waiting.remove(waiter)
            self.held[waiter[1]] += 1
            self._served[waiter[1]] = next(self._order)
            waiter[2].set_result(None)
