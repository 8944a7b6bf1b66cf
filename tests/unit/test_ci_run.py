""".ci/run fails, saying why, when pytest ran no tests (its exit 5), though make exits 2 whatever pytest returned.

Each test runs the real .ci/run in a folder of its own with a Makefile whose `test` target runs this
project's pytest (its tests/conftest.py records pytest's status) on a test selection; the other two steps
do nothing."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
#: a cheap test file, and one cheap test of it
PYTEST_FILE = "tests/deploy/test_dockerfile.py"
ONE_TEST = "test_torch_pin_matches_the_makefile"


def _ci_run(tmp_path: Path, test_recipe: str) -> subprocess.CompletedProcess:
    if shutil.which("make") is None:
        pytest.skip("no make")
    (tmp_path / ".ci").mkdir()
    shutil.copy2(ROOT / ".ci" / "run", tmp_path / ".ci" / "run")
    (tmp_path / "Makefile").write_text(f"test:\n\t{test_recipe}\nchaos-smoke cluster-smoke:\n\t@echo ran $@\n")
    return subprocess.run([str(tmp_path / ".ci" / "run")], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300, env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})


def _pytest(selection: str) -> str:
    return f"cd {ROOT} && {sys.executable} -m pytest -p no:cacheprovider -q {PYTEST_FILE} -k {selection}"


def test_pytest_running_no_tests_fails_the_step_and_says_so(tmp_path):
    done = _ci_run(tmp_path, _pytest("no_test_has_this_name"))
    assert done.returncode != 0
    assert "make test: pytest ran no tests: failing" in done.stderr, done.stdout + done.stderr
    assert "ran chaos-smoke" not in done.stdout  # the first failure ends the run


def test_no_tests_is_a_failure_even_where_the_recipe_hides_pytest_s_status(tmp_path):
    done = _ci_run(tmp_path, _pytest("no_test_has_this_name") + " || true")
    assert done.returncode != 0, done.stdout + done.stderr
    assert "make test: pytest ran no tests: failing" in done.stderr


def test_a_step_whose_tests_ran_and_passed_goes_on(tmp_path):
    done = _ci_run(tmp_path, _pytest(ONE_TEST))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "ran chaos-smoke" in done.stdout and "ran cluster-smoke" in done.stdout
    assert "ran no tests" not in done.stderr


def test_a_failing_step_is_not_called_one_that_ran_no_tests(tmp_path):
    done = _ci_run(tmp_path, "exit 5")  # (not pytest: make still exits 2)
    assert done.returncode != 0 and "ran no tests" not in done.stderr
    assert "make test finished with exit code 2" in done.stdout
