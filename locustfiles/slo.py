"""The SLO gate of a load test: figures from Locust's stats, and the verdict that sets the exit code.

Pure Python, no Locust import (tests/load/test_locust_checks.py imports it alone); base.py wires
it to Locust's `quitting` event.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping, Optional

#: suffix of the stats rows of requests answered 503 (shed load; base.py records them apart)
SHED_SUFFIX = " [shed]"

#: the SLO flags' built-in defaults. Locust itself lets `[tool.locust]` in the working directory's
#: pyproject.toml (slo-p95-ms = ...), then the flag's environment variable (LOCUST_SLO_P95_MS),
#: then the command line override them (base.py declares the flags).
SLO_DEFAULTS: dict[str, float] = {
    "slo-max-error-ratio": 0.01,
    "slo-p95-ms": 5000.0,
    "slo-max-shed-ratio": 0.05,
}


@dataclass(frozen=True)
class SloFigures:
    requests: int  # every request, shed included
    errors: int  # failures of requests that were not shed
    shed: int
    p95_ms: Optional[float]  # over requests that were not shed (None: there were none)

    @property
    def error_ratio(self) -> float:
        """Errors over the requests the service did not shed."""
        accepted = self.requests - self.shed
        return self.errors / accepted if accepted else 0.0

    @property
    def shed_ratio(self) -> float:
        return self.shed / self.requests if self.requests else 0.0


def percentile(response_times: Mapping[float, int], fraction: float) -> Optional[float]:
    """Like Locust's: the smallest recorded time with at least `fraction` of requests at or under it."""
    total = sum(response_times.values())
    if not total:
        return None
    rank = total * fraction
    seen = 0
    for value in sorted(response_times):
        seen += response_times[value]
        if seen >= rank:
            return float(value)
    return float(max(response_times))


def slo_figures(entries: Iterable[tuple[str, int, int, Mapping[float, int]]]) -> SloFigures:
    """From Locust stats entries as (name, requests, failures, response_times histogram)."""
    requests = errors = shed = 0
    merged: dict[float, int] = {}
    for name, n_requests, n_failures, times in entries:
        requests += n_requests
        if name.endswith(SHED_SUFFIX):
            shed += n_requests
            continue
        errors += n_failures
        for value, count in times.items():
            merged[value] = merged.get(value, 0) + count
    return SloFigures(requests, errors, shed, percentile(merged, 0.95))


def slo_verdict(fig: SloFigures, max_error_ratio: float, p95_ms: float, max_shed_ratio: float
                ) -> tuple[bool, str]:
    """(passed, one-line verdict). No requests at all fails."""
    problems = []
    if fig.requests == 0:
        problems.append("no requests were made")
    if fig.error_ratio > max_error_ratio:
        problems.append("error ratio")
    if fig.shed_ratio > max_shed_ratio:
        problems.append("shed ratio")
    if fig.p95_ms is not None and fig.p95_ms > p95_ms:
        problems.append("p95")
    ok = not problems
    p95 = "n/a" if fig.p95_ms is None else f"{fig.p95_ms:.0f} ms"
    line = (
        f"SLO {'PASS' if ok else 'FAIL'}: requests={fig.requests} "
        f"errors={fig.errors} ({fig.error_ratio:.2%}, max {max_error_ratio:.2%}) "
        f"shed={fig.shed} ({fig.shed_ratio:.2%}, max {max_shed_ratio:.2%}) "
        f"p95={p95} (max {p95_ms:.0f} ms)"
    )
    if problems:
        line += " -- breached: " + ", ".join(problems)
    return ok, line
