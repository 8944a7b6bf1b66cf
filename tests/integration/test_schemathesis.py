"""Property-based API testing with Schemathesis over the running service's /openapi.json:
zero 5xx and zero responses that break the schema (status codes, content types, bodies,
headers), for generated valid (positive) and invalid (negative) requests.

One 5xx is the right answer: a case that sets its own deadline (`X-Request-Timeout-Ms`, e.g. 1 ms)
shorter than the model takes gets the documented `504` with `error_type: timeout`. Whether it
does depends on what earlier tests left in the response cache, so such a case is checked for
exactly that answer instead of "no 5xx"; any other 5xx still fails.

Bounded for CI: MAX_EXAMPLES cases per operation and mode (5 operations x 2 modes). Drives
Hypothesis directly with each operation's strategy: Schemathesis 4.32's own pytest plugin
does not load under pytest 9.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path

import pytest

schemathesis = pytest.importorskip("schemathesis")
from hypothesis import HealthCheck, Phase, given, settings  # noqa: E402
from hypothesis.errors import Unsatisfiable  # noqa: E402
from schemathesis import GenerationMode  # noqa: E402
from schemathesis.checks import (  # noqa: E402
    content_type_conformance, not_a_server_error, response_headers_conformance, response_schema_conformance,
    status_code_conformance,
)

MAX_EXAMPLES = 25
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance,
          response_headers_conformance]
TIMEOUT_HEADER = "X-Request-Timeout-Ms"
REPORT = Path(__file__).resolve().parents[2] / "reports" / "schemathesis.json"


@pytest.fixture(scope="module")
def api_schema(serve_url):
    return schemathesis.openapi.from_url(f"{serve_url}/openapi.json")


def _operations(schema):
    return [result.ok() for result in schema.get_all_operations()]


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE], ids=["positive", "negative"])
def test_api_conforms_to_its_openapi_schema(api_schema, serve_url, mode):
    calls: Counter = Counter()
    statuses: Counter = Counter()
    started = time.monotonic()
    operations = _operations(api_schema)
    assert {op.label for op in operations} >= {"POST /translation", "POST /embeddings", "GET /readyz"}
    for operation in operations:
        try:
            strategy = operation.as_strategy(generation_mode=mode)
        except Exception as exc:  # an operation with nothing to make invalid (no parameters)
            if mode is GenerationMode.NEGATIVE:
                continue
            raise exc

        @given(case=strategy)
        @settings(max_examples=MAX_EXAMPLES, deadline=None, derandomize=True, database=None,
                  phases=[Phase.explicit, Phase.generate],
                  suppress_health_check=list(HealthCheck))
        def check(case):
            own_deadline = any(name.lower() == TIMEOUT_HEADER.lower() for name in (case.headers or {}))
            checks = [c for c in CHECKS if not (own_deadline and c is not_a_server_error)]
            response = case.call_and_validate(base_url=serve_url, checks=checks, timeout=60)
            calls[operation.label] += 1
            if own_deadline and response.status_code == 504:
                assert response.json()["error_type"] == "timeout", (operation.label, response.text[:300])
                statuses["504 (the case's own deadline)"] += 1
                return
            statuses[response.status_code] += 1
            assert response.status_code < 500, (operation.label, response.status_code, response.text[:300])

        try:
            check()
        except Unsatisfiable:
            # Nothing to make invalid (a GET without parameters): only positive cases exist.
            assert mode is GenerationMode.NEGATIVE, operation.label
    took = time.monotonic() - started
    report = json.loads(REPORT.read_text()) if REPORT.exists() else {}
    report[mode.value] = {"calls": sum(calls.values()), "by_operation": dict(calls),
                          "by_status": {str(k): v for k, v in sorted(statuses.items(), key=str)},
                          "failures": 0, "seconds": round(took, 1)}
    REPORT.parent.mkdir(parents=True, exist_ok=True)
    REPORT.write_text(json.dumps(report, indent=2))
    assert sum(calls.values()) > 0
    assert not any(isinstance(code, int) and code >= 500 for code in statuses)
