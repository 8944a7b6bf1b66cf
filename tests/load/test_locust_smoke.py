"""CI smoke for the load tests: Locust, headless, a few users of the mixed
scenario for ~20 s against a running service, with the SLO gate on (exit code
0 only when error ratio, shed ratio and p95 are within the limits: `--slo-*`
defaults from env vars / `[tool.locust]` in pyproject.toml / built in).

Target: $SERVE_APP_TEST_URL when set, else the session's `serve_url` fixture
(tests/conftest.py starts Serve once per session). The fixture is requested
lazily, so pointing SERVE_APP_TEST_URL at a running service starts no Ray.
Locust runs in a subprocess: importing it would gevent-patch this process.
"""

from __future__ import annotations

import csv
import importlib.util
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LOCUSTFILES = REPO / "locustfiles"
RUN_SECONDS = int(os.environ.get("SERVE_APP_LOAD_SMOKE_SECONDS", "20"))

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(importlib.util.find_spec("locust") is None,
                       reason="locust is not installed (pip install -e '.[test]')"),
]


@pytest.fixture
def load_target(request) -> str:
    url = os.environ.get("SERVE_APP_TEST_URL")
    if not url:
        url = request.getfixturevalue("serve_url")
    return str(url).rstrip("/")


def test_mixed_scenario_meets_the_slo(load_target, tmp_path):
    prefix = tmp_path / "smoke"
    env = {k: v for k, v in os.environ.items() if k not in ("LOCUST_SLO_OFF", "LOCUST_SHAPE")}
    cmd = [
        sys.executable, "-m", "locust", "-f", str(LOCUSTFILES / "mixed.py"),
        "--headless", "--host", load_target, "--shape", "none",
        "-u", "3", "-r", "3", "-t", f"{RUN_SECONDS}s", "--pacing", "0.5", "--stop-timeout", "10",
        "--csv", str(prefix), "--only-summary", "--loglevel", "WARNING",
    ]
    started = time.monotonic()
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=RUN_SECONDS + 60)
    wall = time.monotonic() - started
    output = proc.stdout + proc.stderr
    verdicts = [line for line in output.splitlines() if line.startswith("SLO ")]
    assert verdicts, f"no SLO verdict printed (rc={proc.returncode}):\n{output[-4000:]}"
    assert proc.returncode == 0, f"locust exit code {proc.returncode} after {wall:.0f} s: {verdicts[-1]}\n{output[-4000:]}"
    assert verdicts[-1].startswith("SLO PASS"), verdicts[-1]

    with open(f"{prefix}_stats.csv", newline="") as f:
        rows = {r["Name"]: r for r in csv.DictReader(f)}
    for name in ("/translation 1rec", "/embeddings 1in"):
        assert name in rows and int(rows[name]["Request Count"]) > 0, f"no {name} requests: {sorted(rows)}"
