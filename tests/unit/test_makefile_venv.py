"""The Makefile: a venv whose creation failed half way is not taken as done by the next make; `make run`'s port; torch
follows TORCH_SPEC after the install."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_a_half_made_venv_is_removed_so_the_next_make_makes_it_again(tmp_path):
    """python3-venv missing: `python3 -m venv` writes bin/python, then fails at ensurepip. Make kept the file and the
    next `make run` said `.venv/bin/python` was up to date, failing on a missing pip until .venv was deleted."""
    fake = tmp_path / "python-without-ensurepip"
    fake.write_text('#!/bin/sh\n# $1 = -m, $2 = venv, $3 = the folder\nmkdir -p "$3/bin" && touch "$3/bin/python"\n'
                    'echo "ensurepip is not available" >&2\nexit 1\n')
    fake.chmod(0o755)
    venv = tmp_path / "venv"
    args = ["make", "-s", "-f", str(ROOT / "Makefile"), f"VENV={venv}", f"{venv}/bin/python"]
    first = subprocess.run([*args, f"PYTHON={fake}"], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert first.returncode != 0 and not venv.exists(), first.stderr
    again = subprocess.run([*args, "-n", f"PYTHON={fake}"], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert "-m venv" in again.stdout, again.stdout + again.stderr  # not "up to date": it is made again


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_make_run_s_port_comes_from_its_command_line_not_the_shell_s_port():
    """A shell that exports PORT (web tooling does) moved `make run` off 9527, and the README's curl failed."""
    import os

    root = ROOT
    env = {**os.environ, "PORT": "3000"}
    exported = subprocess.run(["make", "-n", "run"], capture_output=True, text=True, timeout=60, cwd=root, env=env)
    given = subprocess.run(["make", "-n", "run", "PORT=8000"], capture_output=True, text=True, timeout=60, cwd=root,
                           env=env)
    assert "3000" not in exported.stdout and "8000" in given.stdout, (exported.stdout, given.stdout)


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_an_older_python_is_refused_before_a_venv_is_made_of_it(tmp_path):
    """Ubuntu 22.04's python3 is 3.10: its venv was kept after the install failed, and `make run PYTHON=python3.11`
    went on using it."""
    fake = tmp_path / "python3.10"
    fake.write_text('#!/bin/sh\nif [ "$1" = -c ]; then exit 1; fi\nmkdir -p "$3/bin" && touch "$3/bin/python"\n')
    fake.chmod(0o755)
    venv = tmp_path / "venv"
    made = subprocess.run(["make", "-s", "-f", str(ROOT / "Makefile"), f"VENV={venv}", f"{venv}/bin/python",
                           f"PYTHON={fake}"], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert made.returncode != 0 and not venv.exists() and "needs Python 3.11" in made.stderr, made.stderr


def _installed_venv(tmp_path: Path, recorded: str | None) -> Path:
    """A venv as `make install` left it (newer than pyproject.toml and the lock), torch recorded as `recorded`
    (None: by a Makefile from before torch was recorded)."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").touch()
    (venv / ".installed").touch()
    if recorded is not None:
        (venv / ".torch").write_text(recorded + "\n")
    return venv


def _planned_install(venv: Path, *args: str) -> str:
    made = subprocess.run(["make", "-n", "-f", str(ROOT / "Makefile"), f"VENV={venv}", "install", *args],
                          capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert made.returncode == 0, made.stderr
    return made.stdout


CPU_CHOICE = "torch==2.13.0 https://download.pytorch.org/whl/cpu"


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_a_torch_spec_set_after_the_install_installs_that_torch_and_nothing_else(tmp_path):
    """TORCH_SPEC was read only by the first install: a user who set it afterwards (a CUDA build on a GPU machine)
    got nothing, as .venv/.installed was up to date."""
    venv = _installed_venv(tmp_path, CPU_CHOICE)
    planned = _planned_install(venv, "TORCH_SPEC=torch==2.13.0+cu130")
    assert "pip uninstall -q -y torch" in planned, planned  # (or pip keeps the installed 2.13.0+cpu)
    assert f'install-torch {venv}/bin/python "torch==2.13.0+cu130"' in planned, planned
    assert "-e \".[" not in planned and "embedding_onnx" not in planned  # torch alone, not the rest
    # The same index turned off: another choice too (PyPI's build of the same version).
    assert "install-torch" in _planned_install(venv, "TORCH_SPEC=torch==2.13.0", "TORCH_CPU_INDEX=")


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_the_torch_already_chosen_is_not_installed_again(tmp_path):
    venv = _installed_venv(tmp_path, CPU_CHOICE)
    assert "install-torch" not in _planned_install(venv, "TORCH_SPEC=torch==2.13.0")
    assert "install-torch" not in _planned_install(venv)  # (the Makefile's defaults)


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_a_make_that_does_not_set_torch_spec_keeps_the_torch_chosen_before(tmp_path):
    """From a review: after `make run TORCH_SPEC=torch==2.13.0+cu130`, the next plain `make test` took the defaults
    for a new choice, removed the CUDA build and installed the CPU one (and back at the next TORCH_SPEC)."""
    venv = _installed_venv(tmp_path, "torch==2.13.0+cu130 https://download.pytorch.org/whl/cpu")
    assert "install-torch" not in _planned_install(venv)
    assert "install-torch" in _planned_install(venv, "TORCH_SPEC=torch==2.13.0")  # named: that one


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_a_venv_from_before_torch_was_recorded_gets_the_spec_installed_once_without_removing_torch(tmp_path):
    planned = _planned_install(_installed_venv(tmp_path, None), "TORCH_SPEC=torch==2.12.0")
    assert 'install-torch' in planned and "uninstall" not in planned and "-e \".[" not in planned, planned


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_a_first_install_puts_torch_in_before_the_project(tmp_path):
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").touch()
    planned = _planned_install(venv)
    assert "uninstall" not in planned
    assert 0 <= planned.index("scripts/install-torch") < planned.index("-e \".[examples,onnx]\""), planned
