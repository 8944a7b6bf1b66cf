"""The Translator replica's continuous-scheduling path (`translation.scheduling: continuous`).

Instead of `@serve.batch` + the model queue + `generate`, each call's texts go to a
`ContinuousScheduler` (deployments/continuous_batching.py), whose decoding thread owns the
running batch. This module keeps the replica's bookkeeping the same as on the static path:
its stats (records enqueued, computed, cancelled; model CPU seconds), its health (model
failures in a row), job records behind interactive requests, and Prometheus metrics, plus
three of its own (running batch size, joins per step, step time).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from typing import Any, Optional

from .batching import Chunk
from .continuous_batching import ContinuousScheduler, StepOutcome
from .health import FAILURES_BEFORE_UNHEALTHY
from .model_queue import HUNG_BATCH_S
from .priority import Priority

logger = logging.getLogger("ray.serve")


class _DecodeInstruments:
    """The continuous decoder's Prometheus instruments (one set per process, tag `model`)."""

    def __init__(self) -> None:
        from ray.serve.metrics import Gauge, Histogram

        tags = ("model",)
        self.running = Histogram(
            "serve_app_decode_running_sequences",
            description="Sentences in one continuous decoding step (the running batch).",
            boundaries=[1, 2, 4, 8, 16, 32, 64, 128, 256], tag_keys=tags)
        self.joins = Histogram(
            "serve_app_decode_joins",
            description="Sentences that joined the running batch before one continuous decoding step.",
            boundaries=[0.5, 1, 2, 4, 8, 16, 32, 64], tag_keys=tags)  # le=0.5: steps nobody joined
        self.step_seconds = Histogram(
            "serve_app_decode_step_seconds",
            description="Time of one continuous decoding step (with the encoder pass of the sentences joining "
            "before it), in seconds.",
            boundaries=[0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5], tag_keys=tags)
        self.cached_tokens = Gauge(
            "serve_app_decode_cached_tokens",
            description="Token slots held by the running batch's attention caches (padding included).",
            tag_keys=tags)


@functools.lru_cache(maxsize=None)
def _decode_instruments() -> _DecodeInstruments:
    """Created once per process: Serve refuses a second instrument of the same name."""
    return _DecodeInstruments()


class ContinuousTranslation:
    """Owns the scheduler of one Translator replica (`replica`: the ModelReplica, after
    `_init_replica`, with its `backend`)."""

    def __init__(self, replica: Any, settings: Any):
        self.replica = replica
        self.settings = settings
        self._instruments: Optional[_DecodeInstruments] = None
        self._tags = {"model": replica.deployment_name}
        if replica.metrics.active:  # inside a Serve replica
            try:
                self._instruments = _decode_instruments()
            except Exception:  # pragma: no cover - metrics must never stop a replica
                logger.exception("continuous decoding metrics unavailable")
        self.scheduler = ContinuousScheduler(
            replica.backend, max_running_sequences=settings.max_running_sequences,
            max_cached_tokens=settings.max_cached_tokens, max_new_tokens=settings.max_new_tokens,
            min_new_tokens=settings.min_new_tokens, join_interval_steps=settings.join_interval_steps,
            cuda_graphs=settings.cuda_graphs, on_step=self._step_done,
            name=f"{replica.deployment_name}-decode")
        self.apply(replica.batch_config)

    def apply(self, batch_config: Any) -> None:
        """The replica's live batch knobs that apply here: background_max_batch_size caps the job
        sequences in the running batch."""
        self.scheduler.max_background_sequences = batch_config.background_max_batch_size

    async def translate(self, chunk: Chunk, background: bool = False) -> tuple[list[str], int]:
        """Translate one chunk; returns the texts and the largest running batch they were decoded in.
        Cancelling the awaiting task (deadline, client gone) takes its sentences out of the batch
        at the next step."""
        replica, records = self.replica, len(chunk.texts)
        replica._loop = asyncio.get_running_loop()
        priority = Priority.BACKGROUND if background else Priority.INTERACTIVE
        future = self.scheduler.submit(chunk.texts, chunk.source, chunk.target, priority)
        # Counted once taken (submit refuses a call it cannot take: a stopped thread, an unsupported pair), so
        # that enqueued = computed + cancelled + failed; before the step's bookkeeping, which runs on this loop.
        replica._stats["enqueued"] += records
        replica.metrics.count_enqueued(records)
        try:
            return await asyncio.wrap_future(future)
        except asyncio.CancelledError:
            future.cancel()
            raise

    def info(self) -> dict:
        return {"max_running_sequences": self.settings.max_running_sequences,
                "max_cached_tokens": self.settings.max_cached_tokens,
                "join_interval_steps": self.settings.join_interval_steps,
                "engine": type(self.scheduler.decoder).__name__,
                # greedy choices screened in bfloat16, exact (deployments/backends/screened_head.py)
                "output_screen": "bfloat16" if self.scheduler.decoder.screen is not None else None,
                # attention row by row where padding dominates (deployments/backends/row_attention.py)
                "row_attention": self.scheduler.decoder.row_attention,
                "running": self.scheduler.decoder.running,
                "waiting": sum(self.scheduler.waiting().values())}

    def check(self, hung_after_s: float = HUNG_BATCH_S) -> None:
        """Raise while one decoding iteration (the joining sentences' encoder pass, a step, the answers) has gone
        on for over `hung_after_s`: one that never returns would leave every caller to its deadline. The first
        sentences joining an empty batch are not `running` yet, so the iteration's own clock is read."""
        began = self.scheduler.iteration_began
        running_s = 0.0 if began is None else time.monotonic() - began
        if running_s > hung_after_s:
            raise RuntimeError(f"continuous decoding: one iteration has been running for {running_s:.0f} s "
                               f"(over {hung_after_s:g} s): taken for hung")

    def shutdown(self, wait_s: float = 10.0) -> None:
        self.scheduler.shutdown(wait_s)

    # ------------------------------------------------------------------ bookkeeping

    def _step_done(self, outcome: StepOutcome) -> None:
        """On the decoding thread: the bookkeeping goes to the replica's loop."""
        loop = self.replica._loop
        if loop is None:
            return self._record(outcome)
        with contextlib.suppress(RuntimeError):  # the loop closed: the replica is shutting down
            loop.call_soon_threadsafe(self._record, outcome)

    def _record(self, outcome: StepOutcome) -> None:
        replica = self.replica
        stats = replica._stats
        stats["model_cpu_s"] += outcome.cpu_seconds
        stats["cancelled"] += outcome.dropped
        replica.metrics.count_cancelled(outcome.dropped)
        if outcome.failed_records:  # (a failed step's, or those of calls the decoding thread had when it stopped)
            replica._count_failed(outcome.failed_records)
        on = self._instruments
        if on is not None:  # a failed step emptied the caches too (the outcome says 0)
            on.cached_tokens.set(outcome.cached_tokens, tags=self._tags)
        if outcome.failed:
            replica.health.failed(outcome.error)
            if outcome.fatal:  # the decoding thread stopped: unhealthy now, so that Serve replaces the replica
                replica.health.failures_in_a_row = max(replica.health.failures_in_a_row, FAILURES_BEFORE_UNHEALTHY)
            replica.metrics.failed()
            return
        if outcome.running:  # an iteration that only let cancelled sequences go proves nothing about the model
            replica.health.succeeded()
        stats["computed"] += outcome.finished
        for priority, records in outcome.finished_by_priority.items():
            background = priority >= Priority.BACKGROUND
            stats["computed_background" if background else "computed_interactive"] += records
        if on is not None:
            if outcome.running:  # (an iteration that only let cancelled sequences go ran no step)
                on.running.observe(outcome.running, tags=self._tags)
                on.step_seconds.observe(outcome.seconds, tags=self._tags)
                on.joins.observe(outcome.joined, tags=self._tags)
        replica.metrics.count_computed(outcome.finished)


__all__ = ["ContinuousTranslation"]
