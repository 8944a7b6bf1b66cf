"""The most token slots a running batch's attention caches can reach, grown one joining sequence at a time.

The bound is the decoders' `projected_tokens`: every row decodes to its max_new_tokens and no row leaves, so the caches
reach rows x (columns from the earliest row's first to the furthest any row can reach + the longest source). The
continuous scheduler checks it for each waiting sequence in turn (continuous_batching.py `_admissible`); computed afresh
for each, admitting n sequences beside r running ones cost O(n x (r + n)) under the scheduler's lock (a GPU replica
runs hundreds), kept here it costs O(r + n)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable


@dataclass
class CacheProjection:
    """`add` a row (the column it started at, its DecodeRequest); `tokens` is the bound over the rows added."""

    join_at: int  # the column a sequence joining now starts at
    rows: int = 0
    first: float = math.inf  # the column the earliest row started at
    end: int = 0  # one past the furthest column a row can reach
    source: int = 0  # the longest source, in tokens

    @classmethod
    def over(cls, rows: Iterable[tuple[int, Any]], join_at: int, joining: Iterable[Any] = ()) -> "CacheProjection":
        """The projection of `rows` ((the column it started at, its DecodeRequest)) and of `joining`, joining now."""
        projection = cls(join_at)
        for start, request in rows:
            projection.add(start, request)
        for request in joining:
            projection.join(request)
        return projection

    def add(self, start: int, request: Any) -> None:
        self.rows += 1
        self.first = min(self.first, start)
        self.end = max(self.end, start + request.max_new_tokens + 1)
        self.source = max(self.source, len(request.input_ids))

    def join(self, request: Any) -> None:
        """`request` joins now."""
        self.add(self.join_at, request)

    def tokens_if_joined(self, request: Any) -> int:
        """`tokens` if `request` joined now, leaving this projection as it is."""
        start = self.join_at
        return (self.rows + 1) * (max(self.end, start + request.max_new_tokens + 1) - min(self.first, start)
                                  + max(self.source, len(request.input_ids)))

    @property
    def tokens(self) -> int:
        return int(self.rows * (self.end - self.first + self.source)) if self.rows else 0


__all__ = ["CacheProjection"]
