"""Adopting the jobs of a cluster gone from a shared job store (blue/green upgrades: docs/jobs.md)."""

from __future__ import annotations

import logging
from typing import Callable, Iterable

from .store import JobStore

logger = logging.getLogger("ray.serve")

#: How long another cluster's lease must stay free before its jobs are adopted. Longer than Serve takes to
#: restart a JobManager replica (its lease lapses 10 s after a crash), so that a replica lost in the new cluster
#: does not hand its jobs to the old one for a moment, to run on older code.
ADOPT_AFTER_S = 30.0


class Adoption:
    """Watches the leases of the other clusters whose jobs are in the store (on the maintenance ticks)."""

    def __init__(self, store: JobStore, clock: Callable[[], float]):
        self.store = store
        self._clock = clock
        self._free_since: dict[str, float] = {}

    async def adopt_gone(self, clusters: Iterable[str]) -> int:
        """Adopt the unfinished jobs of each of `clusters` whose lease has been free for ADOPT_AFTER_S; how many."""
        adopted, clusters = 0, set(clusters)
        # A cluster with no unfinished job left is not watched, so its lease's free time must not be kept: a
        # restart seen free once, whose jobs then finished, would count from then at its next restart, hours on.
        for gone in set(self._free_since) - clusters:
            del self._free_since[gone]
        for other in sorted(clusters):
            if not await self.store.lease_free(other):
                self._free_since.pop(other, None)
                continue
            since = self._free_since.setdefault(other, self._clock())
            if self._clock() - since >= ADOPT_AFTER_S and (count := await self.store.adopt(other)):
                logger.warning("%d unfinished jobs of cluster %r adopted: its lease has been free for %.0f s",
                               count, other, self._clock() - since)
                adopted += count
                del self._free_since[other]  # its jobs are taken: a later one of its is watched afresh
        return adopted
