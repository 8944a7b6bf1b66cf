"""The response cache's Prometheus metrics (serve_app/cache.py reports to them as its CacheObserver)."""

from __future__ import annotations

import logging
from typing import Optional

logger = logging.getLogger("serve_app")


class CacheMetrics:
    """The cache's Prometheus metrics, through `ray.serve.metrics` (Serve adds the deployment
    and replica tags, so each ingress replica's cache is its own series). Build it only inside
    a Serve replica: `CacheMetrics.in_serve()` returns None elsewhere (unit tests)."""

    def __init__(self) -> None:
        from ray.serve.metrics import Counter as RayCounter, Gauge

        self._hits = RayCounter("serve_app_cache_hits_total", tag_keys=("task",),
                                description="Texts (records or embedding inputs) answered from the response cache.")
        self._misses = RayCounter("serve_app_cache_misses_total", tag_keys=("task",),
                                  description="Texts looked up in the response cache and not found (computed).")
        self._evictions = RayCounter(
            "serve_app_cache_evictions_total", tag_keys=("reason",),
            description="Entries removed from the response cache: capacity (entry or byte bound), "
            "expired (past ttl_s), too_large (one entry over max_bytes, never stored).")
        self._entries = Gauge("serve_app_cache_entries", description="Entries in this ingress replica's cache.")
        self._bytes = Gauge("serve_app_cache_bytes",
                            description="Estimated bytes held by this ingress replica's cache.")

    @classmethod
    def in_serve(cls) -> Optional["CacheMetrics"]:
        try:
            import ray
            from ray.serve import context

            if ray.is_initialized() and context._get_internal_replica_context() is not None:
                return cls()
        except Exception:  # pragma: no cover - metrics must never stop the ingress
            logger.exception("cache metrics unavailable")
        return None

    def looked_up(self, task: str, hits: int, misses: int) -> None:
        if hits:
            self._hits.inc(hits, tags={"task": task})
        if misses:
            self._misses.inc(misses, tags={"task": task})

    def evicted(self, reason: str, count: int) -> None:
        self._evictions.inc(count, tags={"reason": reason})

    def size(self, entries: int, size_bytes: int) -> None:
        self._entries.set(entries)
        self._bytes.set(size_bytes)
