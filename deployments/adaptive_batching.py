"""SLO-adaptive batch size: an AIMD controller over a replica's live `max_batch_size`.

As in Clipper (Crankshaw et al., NSDI 2017, "adaptive batching"): after each batch
the controller looks at the p99 model time of the recent batches; while it is under
the target it adds `increase_records` to the batch size (additive increase), and
when it goes over it multiplies the size by `backoff_factor` (multiplicative
decrease), always within [min_size, max_size]. Longer sentences or a slower
machine make batches slower, so the size shrinks until a batch fits the target
again; shorter ones let it grow back.

What it measures is the model time of a batch, not the queueing before it: under
overload, smaller batches would only lower throughput and lengthen the queue (that
is admission control's and the autoscaler's job).

Pure logic, no Ray, no clock: the replica calls `observe()` with each batch's model
time and applies the size through `apply` (the `@serve.batch` setters).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

from .batch_config import BatchConfig


def p99(samples: Sequence[float]) -> float:
    """Nearest-rank 99th percentile (with fewer than 100 samples: the maximum)."""
    if not samples:
        raise ValueError("p99 of no samples")
    ordered = sorted(samples)
    return ordered[max(0, math.ceil(0.99 * len(ordered)) - 1)]


@dataclass(frozen=True)
class AIMDSettings:
    target_p99_s: float
    min_size: int
    max_size: int
    increase_records: int
    backoff_factor: float
    window_batches: int

    def __post_init__(self) -> None:
        if not 1 <= self.min_size <= self.max_size:
            raise ValueError(f"need 1 <= min_size <= max_size, got min_size={self.min_size!r}, "
                             f"max_size={self.max_size!r}")
        if not 0.0 < self.backoff_factor < 1.0:
            raise ValueError(f"backoff_factor must be in (0, 1), got {self.backoff_factor!r}")
        if self.target_p99_s <= 0 or self.increase_records < 1 or self.window_batches < 1:
            raise ValueError(f"invalid AIMD settings: {self!r}")

    @classmethod
    def from_batch_config(cls, config: BatchConfig) -> Optional["AIMDSettings"]:
        """The controller's settings from a deployment's user_config; None when it is off."""
        if config.target_p99_batch_latency_s is None:
            return None
        return cls(
            target_p99_s=config.target_p99_batch_latency_s,
            min_size=config.adaptive_min_batch_size,
            max_size=config.max_batch_size,
            increase_records=config.adaptive_increase_records,
            backoff_factor=config.adaptive_backoff_factor,
            window_batches=config.adaptive_window_batches,
        )


class AIMDBatchSizer:
    """Keeps the live batch size; `apply(size)` is called each time it changes (and once at start).

    It starts at `max_size` (the non-adaptive behaviour) unless `initial` says otherwise, so it
    only changes anything once the target is missed.
    """

    def __init__(self, settings: AIMDSettings, apply: Callable[[int], None], initial: Optional[int] = None):
        self._apply = apply
        self.settings = settings
        self._window: deque[float] = deque(maxlen=settings.window_batches)
        self.size = self._clamp(settings.max_size if initial is None else initial)
        self.increases = 0
        self.decreases = 0
        self._apply(self.size)

    def _clamp(self, size: float) -> int:
        return int(min(self.settings.max_size, max(self.settings.min_size, size)))

    def reconfigure(self, settings: AIMDSettings) -> None:
        """New settings (a `serve deploy`): keep the learned size, clamped to the new bounds."""
        self.settings = settings
        self._window = deque(self._window, maxlen=settings.window_batches)
        self.size = self._clamp(self.size)
        self._apply(self.size)  # also after the replica re-applied the configured max_batch_size

    def window_p99_s(self) -> Optional[float]:
        return p99(self._window) if self._window else None

    def observe(self, latency_s: float, records: int, full: bool = False) -> int:
        """One batch of `records` took `latency_s` of model time; returns the (new) live size. `full`: the batch
        was as full as it could be (the next call did not fit), though smaller than the size."""
        if records < 1 or records > self.size:  # larger: formed under a size since backed off from (calls queued
            return self.size                     # with the old cap), it says nothing of the live size
        self._window.append(float(latency_s))
        if p99(self._window) > self.settings.target_p99_s:
            smaller = self._clamp(math.floor(self.size * self.settings.backoff_factor))
            # Fresh evidence at the new size decides the next step: one slow stretch backs off once
            # per batch that is still slow, not once per stale sample in the window.
            self._window.clear()
            if smaller < self.size:
                self.decreases += 1
                self._set(smaller)
        elif full or records >= self.size:  # a part-filled batch under target says nothing of a larger size
            larger = self._clamp(self.size + self.settings.increase_records)
            if larger > self.size:
                self.increases += 1
                self._set(larger)
        return self.size

    def _set(self, size: int) -> None:
        if size != self.size:
            self.size = size
            self._apply(size)

    def snapshot(self) -> dict:
        """The live state, for /v1/models and the logs."""
        window = self.window_p99_s()
        return {
            "live_max_batch_size": self.size,
            "window_p99_batch_latency_s": None if window is None else round(window, 6),
            "window_batches": len(self._window),
            "increases": self.increases,
            "decreases": self.decreases,
        }
