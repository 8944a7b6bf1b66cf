"""Pure arithmetic of the comparison: percentiles, saturation, the 50% rate, ratios.

No I/O and no third-party imports, so tests/unit/test_bench_harness.py checks it fast.
A *cell* is one measurement: a dict with at least `contender`, `workload`, `records`,
`mode` ("closed" or "open"), `concurrency` (closed) and `records_per_s`, `requests_per_s`.
"""

from __future__ import annotations

import math
from typing import Iterable, Optional, Sequence


def percentile(values: Sequence[float], q: float) -> Optional[float]:
    """The q-th percentile (0..100) with linear interpolation (numpy's default); None when empty."""
    if not 0 <= q <= 100:
        raise ValueError(f"percentile q must be in [0, 100], got {q!r}")
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100.0
    low, high = math.floor(rank), math.ceil(rank)
    if low == high:
        return float(ordered[low])
    return float(ordered[low] + (ordered[high] - ordered[low]) * (rank - low))


def latency_summary(latencies_s: Sequence[float]) -> dict:
    """p50/p95/p99/max in milliseconds (None when there were no answers)."""
    def ms(q: float) -> Optional[float]:
        value = percentile(latencies_s, q)
        return None if value is None else round(value * 1000.0, 2)

    return {"p50_ms": ms(50), "p95_ms": ms(95), "p99_ms": ms(99), "max_ms": ms(100)}


def closed_cells(cells: Iterable[dict], contender: str, workload: str, records: int) -> list[dict]:
    return [c for c in cells if c.get("mode") == "closed" and c["contender"] == contender
            and c["workload"] == workload and c["records"] == records]


def saturation(cells: Iterable[dict], contender: str, workload: str, records: int) -> Optional[dict]:
    """The closed-loop cell with the highest records/s (ties: the lower concurrency); None if none ran."""
    candidates = [c for c in closed_cells(cells, contender, workload, records) if c.get("records_per_s")]
    if not candidates:
        return None
    return max(candidates, key=lambda c: (c["records_per_s"], -c["concurrency"]))


def half_load_rate(saturated: Optional[dict], fraction: float = 0.5) -> Optional[float]:
    """Open-loop arrival rate (requests/s) at `fraction` of the saturation cell's request rate."""
    if not 0 < fraction <= 1:
        raise ValueError(f"load fraction must be in (0, 1], got {fraction!r}")
    if not saturated or not saturated.get("requests_per_s"):
        return None
    return saturated["requests_per_s"] * fraction


def ratio(numerator: Optional[float], denominator: Optional[float]) -> Optional[float]:
    """numerator / denominator rounded to 3 places (for display: judge a target on `quotient`); None when either
    is missing or the divisor is 0."""
    exact = quotient(numerator, denominator)
    return None if exact is None else round(exact, 3)


def quotient(numerator: Optional[float], denominator: Optional[float]) -> Optional[float]:
    """numerator / denominator, unrounded; None when either is missing or the divisor is 0."""
    if numerator is None or not denominator:
        return None
    return numerator / denominator


def best_batch(batches: dict[int, dict]) -> Optional[int]:
    """The batch size with the highest records/s in an offline sweep ({size: {"records_per_s": ...}})."""
    if not batches:
        return None
    return max(batches, key=lambda size: (batches[size]["records_per_s"], -size))


def cell_at(cells: Iterable[dict], contender: str, workload: str, records: int,
            concurrency: int) -> Optional[dict]:
    for c in closed_cells(cells, contender, workload, records):
        if c["concurrency"] == concurrency:
            return c
    return None


def open_cell(cells: Iterable[dict], contender: str, workload: str, records: int) -> Optional[dict]:
    for c in cells:
        if (c.get("mode") == "open" and c["contender"] == contender and c["workload"] == workload
                and c["records"] == records):
            return c
    return None
