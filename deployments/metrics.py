"""A model replica's Prometheus metrics (serve_app_*), through ray.serve.metrics."""

from __future__ import annotations

import logging
from typing import Optional

logger = logging.getLogger("ray.serve")


class _Instruments:
    """The serve_app_* Prometheus instruments of one process, created once: a replica hosting
    several models (the Ingress, with models placed in it) records them all through the same
    instruments, told apart by the `model` tag. Serve adds the `deployment`, `replica` and
    `application` tags itself (and refuses them as user tag keys)."""

    _made: Optional["_Instruments"] = None

    def __init__(self) -> None:
        from ray.serve.metrics import Counter, Histogram

        tags = ("model",)
        self.batch_records = Histogram(
            "serve_app_batch_records", description="Records in one model call.",
            boundaries=[1, 2, 4, 8, 16, 32, 64, 128, 256], tag_keys=tags)
        self.model_seconds = Histogram(
            "serve_app_model_seconds", description="Model time of one batch, in seconds.",
            boundaries=[0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10], tag_keys=tags)
        # Exact sums beside the histograms: Ray's agent exports a histogram's _sum from its bucket midpoints (a
        # batch of 1 counted 0.5), so means and rates are taken from these (the dashboard, the bench harness).
        self.records_batched = Counter(
            "serve_app_records_batched_total", description="Records in model calls (the batch_records histogram's "
            "exact sum).", tag_keys=tags)
        self.model_busy_seconds = Counter(
            "serve_app_model_busy_seconds_total", description="Model time of every batch, in seconds (the "
            "model_seconds histogram's exact sum).", tag_keys=tags)
        self.queue_wait = Histogram(
            "serve_app_queue_wait_seconds",
            description="Time a call's records waited in the replica's batch queue before their batch "
            "started, in seconds (one observation per call in each batch).",
            boundaries=[0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30], tag_keys=tags)
        self.records = Counter(
            "serve_app_records_total", description="Records processed by the model.", tag_keys=tags)
        self.enqueued = Counter(
            "serve_app_records_enqueued_total", description="Records that entered the batch queue.",
            tag_keys=tags)
        self.cancelled = Counter(
            "serve_app_records_cancelled_total",
            description="Records whose caller cancelled (deadline, client gone) before their batch started: "
            "dropped from the queue, never computed.", tag_keys=tags)
        self.failed_records = Counter(
            "serve_app_records_failed_total",
            description="Records whose model call raised (their callers got the error): with records_total and "
            "records_cancelled_total, every enqueued record once.", tag_keys=tags)
        self.translated_again = Counter(
            "serve_app_records_translated_again_total",
            description="Records translated in pieces of whole sentences: a source past the model's input length "
            "(split before the model runs), or an output cut at max_new_tokens (translated again).", tag_keys=tags)
        self.failures = Counter(
            "serve_app_model_failures_total", description="Model calls that raised.", tag_keys=tags)

    @classmethod
    def get(cls) -> "_Instruments":
        if cls._made is None:
            cls._made = cls()
        return cls._made


class ReplicaMetrics:
    """One model's Prometheus metrics through ray.serve.metrics (tag `model`: its deployment name,
    e.g. Translator, also when it is placed in the Ingress); silently absent outside Serve."""

    def __init__(self, deployment: str):
        self._on: Optional[_Instruments] = None
        self._tags = {"model": deployment}
        try:
            from ray.serve import context

            if context._get_internal_replica_context() is None:
                return  # not inside a Serve replica (unit tests drive the class directly)
            self._on = _Instruments.get()
        except Exception:  # pragma: no cover - metrics must never stop a replica
            logger.exception("%s: Prometheus metrics unavailable", deployment)

    @property
    def active(self) -> bool:
        """Inside a Serve replica (outside one, every method does nothing)."""
        return self._on is not None

    def count_computed(self, records: int) -> None:
        if self._on is not None and records:
            self._on.records.inc(records, tags=self._tags)

    def observe_batch(self, records: int, seconds: float, failed_records: int = 0) -> None:
        """A batch of `records` computed, but for `failed_records` of calls that failed on their own (each run again
        alone): those count as a failure, as when their call fails alone, not as computed records."""
        if self._on is not None:
            self._on.batch_records.observe(records, tags=self._tags)
            self._on.model_seconds.observe(seconds, tags=self._tags)
            if records:
                self._on.records_batched.inc(records, tags=self._tags)
            if seconds > 0:  # (Ray's Counter refuses 0)
                self._on.model_busy_seconds.inc(seconds, tags=self._tags)
            if records > failed_records:
                self._on.records.inc(records - failed_records, tags=self._tags)
            if failed_records:
                self._on.failures.inc(tags=self._tags)

    def observe_queue_wait(self, seconds: float) -> None:
        if self._on is not None:
            self._on.queue_wait.observe(seconds, tags=self._tags)

    def count_enqueued(self, records: int) -> None:
        if self._on is not None and records:
            self._on.enqueued.inc(records, tags=self._tags)

    def count_cancelled(self, records: int) -> None:
        if self._on is not None and records:
            self._on.cancelled.inc(records, tags=self._tags)

    def count_failed(self, records: int) -> None:
        if self._on is not None and records:
            self._on.failed_records.inc(records, tags=self._tags)

    def count_translated_again(self, records: int) -> None:
        if self._on is not None and records:
            self._on.translated_again.inc(records, tags=self._tags)

    def failed(self) -> None:
        if self._on is not None:
            self._on.failures.inc(tags=self._tags)
