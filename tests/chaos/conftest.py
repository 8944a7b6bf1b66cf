"""Chaos tests: each provokes a failure in a real `serve run` and measures the outcome.

`make chaos` runs them (`pytest tests/chaos`). They own their Serve runs (not the session
`serve_url` of tests/integration) because they kill replicas and stop whole runs. Each
measured figure is printed and collected in reports/chaos/figures.json (docs/reliability.md
quotes them).
"""

from __future__ import annotations

import json
import os
import signal

import pytest

from tests.support import save_figures, stop_session_serve

from .harness import ROOT, ServeRun

FIGURES = ROOT / "reports" / "chaos" / "figures.json"


def pytest_configure(config):
    config.addinivalue_line("markers", "chaos: kills replicas and Serve runs of its own (make chaos)")


def pytest_collection_modifyitems(items):
    for item in items:
        if "tests/chaos/" in str(item.fspath):
            item.add_marker(pytest.mark.chaos)
    # Tests on the shared run first; tests with runs of their own after it is stopped, so that
    # only one of our Ray clusters competes for the 2 cores at a time.
    items.sort(key=lambda item: "tests/chaos/" in str(item.fspath) and "own_run" in item.fixturenames)


_SHARED: dict = {}


@pytest.fixture(scope="session")
def figures():
    """`figures[name] = value`: a measured outcome, printed and saved for the docs."""
    collected: dict = {}
    yield collected
    save_figures(FIGURES, collected, "chaos")


@pytest.fixture(scope="session")
def chaos_run(tmp_path_factory):
    """The shared run the kill / deadline / disconnect / metrics tests hurt in turn; each test
    leaves it healthy (it waits for replacements) for the next."""
    # SERVE_APP_CHAOS_DEPLOYMENTS='{"Translator": {"health_check_period_s": 2}}' measures a
    # candidate config change without editing serve_config.yaml.
    overrides = json.loads(os.environ.get("SERVE_APP_CHAOS_DEPLOYMENTS", "{}"))
    run = ServeRun(tmp_path_factory.mktemp("chaos-serve"), deployments=overrides)
    _SHARED["run"] = run
    try:
        took = run.start()
        print(f"\nchaos serve run ready in {took:.1f} s at {run.url}")
        yield run
    finally:
        run.stop(signal.SIGTERM)


@pytest.fixture
def own_run():
    """For a test that starts its own `serve run`: stops the shared one first, and the integration
    tests' session run when the same pytest command ran them (one cluster at a time; such tests are
    sorted after every test that uses either)."""
    shared = _SHARED.pop("run", None)
    if shared is not None:
        shared.stop(signal.SIGTERM)
    stop_session_serve()
