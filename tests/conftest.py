"""Shared fixtures. `serve_url` starts Serve once per session, as users do: `make run`'s
launcher (`python -m serve_app.run`, which also picks the HTTP proxy: SERVE_APP_PROXY) on the
checked-in config `make run` serves, MAKE_RUN_CONFIG (port changed to a free one;
SERVE_APP_TEST_CONFIG=serve_config.yaml runs them on another).

Set SERVE_APP_TEST_URL to run the integration tests against a service that is
already running instead (e.g. `make run` in another terminal).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.support import MAKE_RUN_CONFIG, free_port, register_session_serve, stop_session_serve

ROOT = Path(__file__).resolve().parents[1]

#: A file that pytest's own exit status is appended to (`.ci/run` sets it): make exits 2 whatever its recipe
#: returned, so without it CI could not tell "no tests ran" (5) from any other failure.
STATUS_FILE_VARIABLE = "SERVE_APP_PYTEST_STATUS_FILE"
_status_file = pytest.StashKey[str]()


def pytest_configure(config):
    # Taken out of the environment: a pytest that a test starts is not the run CI asked about.
    if (path := os.environ.pop(STATUS_FILE_VARIABLE, "")) and not hasattr(config, "workerinput"):
        config.stash[_status_file] = path


def pytest_sessionfinish(session, exitstatus):
    if path := session.config.stash.get(_status_file, ""):
        with open(path, "a", encoding="utf-8") as status:
            status.write(f"{int(exitstatus)}\n")


TEST_MAX_BODY_BYTES = 3_000_000
STARTUP_TIMEOUT_S = float(os.environ.get("SERVE_APP_TEST_STARTUP_TIMEOUT_S", "240"))


def _wait_ready(url: str, proc: subprocess.Popen | None, log: Path) -> float:
    """Block until GET /readyz answers 200; fail fast if the launcher exits."""
    import httpx

    start = time.monotonic()
    with httpx.Client(timeout=5) as client:
        while time.monotonic() - start < STARTUP_TIMEOUT_S:
            if proc is not None and proc.poll() is not None:
                pytest.fail(f"serve-app exited with {proc.returncode}; log:\n{log.read_text()[-4000:]}")
            try:
                if client.get(f"{url}/readyz").status_code == 200:
                    return time.monotonic() - start
            except httpx.HTTPError:
                pass
            # Readiness is an event we can only observe by asking; ask often.
            time.sleep(0.25)
    pytest.fail(f"service not ready after {STARTUP_TIMEOUT_S} s; log:\n{log.read_text()[-4000:]}")


@pytest.fixture(scope="session")
def serve_process(tmp_path_factory):
    """(url, log path) of a `python -m serve_app.run` (what `make run` starts) for this session."""
    existing = os.environ.get("SERVE_APP_TEST_URL")
    if existing:
        yield existing.rstrip("/"), None
        return
    work = tmp_path_factory.mktemp("serve")
    config, log = work / "serve_config.yaml", work / "serve.log"
    port = free_port()
    subprocess.run(
        [sys.executable, "-m", "serve_app.config_check", str(ROOT / os.environ.get("SERVE_APP_TEST_CONFIG", MAKE_RUN_CONFIG)),
         "--port", str(port), "--write", str(config)],
        check=True, cwd=ROOT,
    )
    # One non-default limit, so tests can prove the replica enforces the config's values.
    rendered = yaml.safe_load(config.read_text())
    rendered["applications"][0]["args"]["ingress"]["max_body_bytes"] = TEST_MAX_BODY_BYTES
    config.write_text(yaml.safe_dump(rendered, sort_keys=False))
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0", PYTHONUNBUFFERED="1")
    # Its own job store: not the developer's `make run` one (.data/jobs.sqlite3), whose lease another run may hold.
    env.setdefault("SERVE_APP_JOBS_STORE_PATH", str(work / "jobs.sqlite3"))
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "serve_app.run", "--address", "local", str(config)],  # whatever RAY_ADDRESS says
            cwd=ROOT, env=env, stdout=out,
            stderr=subprocess.STDOUT, start_new_session=True,
        )
    url = f"http://127.0.0.1:{port}"
    # Registered so that chaos tests with runs of their own can stop it first (tests/chaos own_run).
    register_session_serve(proc)
    try:
        took = _wait_ready(url, proc, log)
        print(f"\nserve-app ready in {took:.1f} s at {url}", file=sys.stderr)
        yield url, log
    finally:
        stop_session_serve()


@pytest.fixture(scope="session")
def serve_url(serve_process) -> str:
    return serve_process[0]
