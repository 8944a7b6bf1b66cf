"""The JobManager's Prometheus gauges, read from `JobRunner.stats()` every EXPORT_INTERVAL_S: the jobs kept in the
store by status (the backlog is `queued`; `failed` jobs stay until their result expires), the bytes their results
hold, and whether this replica holds its cluster's lease (0 on every JobManager: nobody computes the jobs)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Awaitable, Callable, Optional

from .job import STATES

logger = logging.getLogger("ray.serve")

#: how often the gauges are read from the store (Ray exports every 10 s; Prometheus scrapes every 10-15 s)
EXPORT_INTERVAL_S = 10.0


class JobGauges:
    """`gauge(name, description, tag_keys)` makes one gauge (ray.serve.metrics.Gauge inside Serve)."""

    def __init__(self, gauge: Optional[Callable[..., Any]] = None):
        if gauge is None:
            from ray.serve.metrics import Gauge

            def gauge(name, description, tag_keys=()):
                return Gauge(name, description=description, tag_keys=tuple(tag_keys) or None)
        self.jobs = gauge("serve_app_jobs", "Jobs kept in the job store, by status (a store shared by clusters: "
                                            "all of theirs).", ("status",))
        self.result_bytes = gauge("serve_app_jobs_result_bytes", "Bytes the jobs' results hold in the job store.")
        self.lease_held = gauge("serve_app_jobs_lease_held", "1 while this JobManager holds its cluster's lease "
                                                             "and computes its jobs.")

    def update(self, stats: dict[str, int]) -> None:
        for status in STATES:
            self.jobs.set(stats.get(status, 0), tags={"status": status})
        self.result_bytes.set(stats.get("result_bytes", 0))
        self.lease_held.set(stats.get("holding_lease", 0))


async def export_forever(stats: Callable[[], Awaitable[dict[str, int]]], gauges: JobGauges,
                         interval_s: float = EXPORT_INTERVAL_S) -> None:
    """Read `stats()` into the gauges, then every `interval_s`; a store that fails is retried at the next tick."""
    while True:
        try:
            gauges.update(await stats())
        except Exception as exc:  # noqa: BLE001 - the store down: the maintenance loop logs it too
            logger.debug("job gauges not updated (%s)", type(exc).__name__)
        await asyncio.sleep(interval_s)
