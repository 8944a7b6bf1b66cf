"""Observability of the running service: one JSON access-log line per request (with Serve's
request id, also sent back as `x-request-id`), the app's Prometheus metrics on Ray's
metrics port moving after requests, and `make status` (Serve's view, with no dashboard)."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import httpx
import pytest

from tests.ray_metrics import metrics_url
from tests.support import NO_CACHE, make_status, metric_sum, scrape, wait_for

TRANSLATE = {"payload": {"fromLang": "en", "toLang": "pt", "records": [
    {"id": "a", "text": "Good morning."}, {"id": "b", "text": "See you tomorrow."}]}}


@pytest.fixture(scope="module")
def serve_log(serve_process) -> Path:
    _, log = serve_process
    if log is None:
        pytest.skip("SERVE_APP_TEST_URL: the service's log is not ours to read")
    return log


def _access_lines(log: Path) -> list[dict]:
    lines = []
    for line in log.read_text(errors="replace").splitlines():
        m = re.search(r'(\{"event":"request".*\})\s*$', line)
        if m:
            lines.append(json.loads(m.group(1)))
    return lines


def test_one_json_access_log_line_per_request(serve_url, serve_log):
    with httpx.Client(base_url=serve_url, timeout=60) as http:
        ok = http.post("/translation", json=TRANSLATE)
        bad = http.post("/translation", json={"payload": {}})
    assert ok.status_code == 200 and bad.status_code == 422
    ids = {ok.headers["x-request-id"]: ok, bad.headers["x-request-id"]: bad}
    assert all("," not in rid for rid in ids), "x-request-id must be one id"

    def logged():
        found = {e["request_id"]: e for e in _access_lines(serve_log) if e["request_id"] in ids}
        return found if len(found) == 2 else None

    found = wait_for(logged, 30, "both requests in the access log", interval_s=0.5)
    assert sum(e["request_id"] in ids for e in _access_lines(serve_log)) == 2  # one line each
    line = found[ok.headers["x-request-id"]]
    assert line["route"] == "/translation" and line["status"] == 200 and line["records"] == 2
    assert line["error_type"] is None and line["latency_ms"] > 0 and line["method"] == "POST"
    line = found[bad.headers["x-request-id"]]
    assert line["status"] == 422 and line["error_type"] == "invalid_request"


def _metrics_url(log: Path) -> str:
    """Ray's metrics port of the session's own cluster: the session folder is named after the PID of
    the launcher that started it, which is the session id of every replica it started."""
    m = re.search(r"ServeReplica:serve-app:Ingress pid=(\d+)", log.read_text(errors="replace"))
    assert m, "no Ingress replica in the serve log"
    sid = subprocess.run(["ps", "-o", "sid=", "-p", m.group(1)], capture_output=True, text=True).stdout.strip()
    url = metrics_url(int(sid))
    assert url, f"no metrics port file for session {sid}"
    return url


# A model's own metrics carry `model` = its deployment's name, wherever it runs: in that
# deployment, or placed in the Ingress (then `deployment` is "Ingress").
WATCHED = [
    ("serve_app_requests_total", {"route": "/translation", "status": "200"}),
    ("serve_app_errors_total", {"route": "/translation", "error_type": "invalid_request"}),
    ("serve_app_request_seconds_count", {"route": "/translation"}),
    ("serve_app_records_total", {"model": "Translator"}),
    ("serve_app_records_enqueued_total", {"model": "Translator"}),
    ("serve_app_batch_records_count", {"model": "Translator"}),
    ("serve_app_model_seconds_count", {"model": "Translator"}),
    ("serve_app_queue_wait_seconds_count", {"model": "Translator"}),
    ("serve_app_records_total", {"model": "Embedder"}),
    ("serve_app_records_batched_total", {"model": "Translator"}),  # the exact sums the dashboard divides
    ("serve_app_model_busy_seconds_total", {"model": "Translator"}),
]


def test_metrics_move_after_requests(serve_url, serve_log):
    url = _metrics_url(serve_log)
    before = scrape(url)
    # NO_CACHE: the same records three times, computed three times (not answered from the cache)
    with httpx.Client(base_url=serve_url, timeout=60, headers=NO_CACHE) as http:
        for _ in range(3):
            assert http.post("/translation", json=TRANSLATE).status_code == 200
        assert http.post("/translation", json={"payload": {}}).status_code == 422
        assert http.post("/embeddings", json={"input": ["one", "two"]}).status_code == 200

    def records(snapshot) -> float:
        return metric_sum(snapshot, "serve_app_records_total", model="Translator")

    def moved():
        now = scrape(url)
        every = all(metric_sum(now, n, **l) > metric_sum(before, n, **l) for n, l in WATCHED)
        # Each replica pushes its own metrics: with two Ingress replicas (placed models), one push can
        # come before the other's, so wait for all six records, not only the first move.
        return now if every and records(now) - records(before) >= 6 else None

    # Replicas push metrics to Ray's agent every 10 s by default.
    now = wait_for(moved, 60, "every serve_app metric to move and all 6 records counted", interval_s=1)
    assert records(now) - records(before) >= 6
    assert metric_sum(now, "serve_app_request_seconds_bucket", route="/translation", le="+Inf") >= 3


def test_make_status_prints_serves_view_of_the_running_app(serve_url, serve_log):
    """`make status` (serve_app/status.py) with no dashboard: the launcher's record leads it to its Ray
    instance, and it prints what `serve status` would: the application RUNNING, its deployments healthy."""
    code, err, printed = make_status(int(serve_url.rsplit(":", 1)[1]))
    assert code == 0, err[-3000:]
    app = printed["applications"]["serve-app"]
    assert app["status"] == "RUNNING", printed
    assert {"Ingress", "JobManager"} <= set(app["deployments"]), printed
    for deployment in app["deployments"].values():  # the Ingress autoscales: it may be scaling meanwhile
        assert deployment["status"] in ("HEALTHY", "UPSCALING", "DOWNSCALING"), printed
        assert deployment["replica_states"].get("RUNNING", 0) >= 1, printed
