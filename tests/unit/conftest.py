"""Session fixtures for the unit tests: tiny offline models and backends on them."""

from __future__ import annotations

from pathlib import Path

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
