"""Session fixtures for the unit tests: tiny offline models and backends on them."""

from __future__ import annotations

from pathlib import Path

import asyncio

import pytest

from tests.fixtures.tiny_models import build_tiny_m2m100, build_tiny_marian, build_tiny_nllb

#: Kept small so generation on the random models stays fast.
TEST_MAX_NEW_TOKENS = 12


@pytest.fixture(scope="session")
def tiny_marian_dir(tmp_path_factory) -> Path:
    return build_tiny_marian(tmp_path_factory.mktemp("marian"), pair=("en", "de"))


@pytest.fixture(scope="session")
def tiny_m2m100_dir(tmp_path_factory) -> Path:
    return build_tiny_m2m100(tmp_path_factory.mktemp("m2m100"), languages=("en", "pt", "de", "fr"))


@pytest.fixture(scope="session")
def tiny_nllb_dir(tmp_path_factory) -> Path:
    return build_tiny_nllb(tmp_path_factory.mktemp("nllb"), languages=("en", "pt", "de", "fr"))


def _backend(path: Path, **kwargs):
    from deployments.backends.transformers_backend import TransformersBackend

    kwargs.setdefault("max_new_tokens", TEST_MAX_NEW_TOKENS)
    return TransformersBackend(str(path), device="cpu", local_files_only=True, **kwargs)


@pytest.fixture(scope="session")
def make_backend():
    """Factory: ``make_backend(path, **kwargs)`` -> TransformersBackend on CPU, offline."""
    return _backend


@pytest.fixture(scope="session")
def marian_backend(tiny_marian_dir):
    return _backend(tiny_marian_dir)


@pytest.fixture(scope="session")
def m2m100_backend(tiny_m2m100_dir):
    return _backend(tiny_m2m100_dir)


@pytest.fixture(scope="session")
def nllb_backend(tiny_nllb_dir):
    return _backend(tiny_nllb_dir)


@pytest.fixture(scope="session")
def loop():
    """One event loop for every test that drives a deployment class directly.

    @serve.batch keeps one queue per decorated method (per class, not per instance),
    bound to the event loop of its first call: a second loop would find the queue's
    consumer on a closed loop and hang. So all such tests share this loop.
    """
    loop = asyncio.new_event_loop()
    yield loop
    # Serve's batch queues wait on this loop for good: cancelled and run out before it closes, or one collected later
    # (a failed batch's traceback keeps it in a reference cycle) tries to cancel its wait on the closed loop.
    pending = asyncio.all_tasks(loop)
    for task in pending:
        task.cancel()
    if pending:  # (gather of nothing is a future of another loop)
        loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
    loop.close()


@pytest.fixture(autouse=True)
def _no_replica_context(monkeypatch):
    """Ray 2.60's batch queue reads the replica context only to warn when max_batch_size
    exceeds max_ongoing_requests; outside Serve there is none."""
    from ray.serve import batching
    monkeypatch.setattr(batching._BatchQueue, "_warn_if_max_batch_size_exceeds_max_ongoing_requests",
                        lambda self: None)


@pytest.fixture
def app_client():
    """A TestClient on the FastAPI app (errors answered, not raised); the installed service is removed after."""
    from fastapi.testclient import TestClient

    from serve_app.api import app, set_service

    with TestClient(app, raise_server_exceptions=False) as c:
        yield c
    set_service(None)
