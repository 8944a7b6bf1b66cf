"""The Makefile: a venv whose creation failed half way is not taken as done by the next make; `make run`'s port."""

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
