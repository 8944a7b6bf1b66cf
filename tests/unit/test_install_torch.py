"""scripts/install-torch: on a Linux machine without an NVIDIA GPU, torch comes from PyTorch's CPU
index when that answers (not PyPI's CUDA build, several GB); otherwise from pip's own index."""

from __future__ import annotations

import os
import platform
import shutil
import socket
import subprocess
import sys
import threading
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "install-torch"

pytestmark = pytest.mark.skipif(
    platform.system() != "Linux" or shutil.which("nvidia-smi") is not None
    or any(Path(p).exists() for p in ("/proc/driver/nvidia", "/dev/nvidia0")),
    reason="the CPU index is chosen on Linux machines without an NVIDIA GPU")


def planned(index: str, spec: str = "torch==2.13.0") -> str:
    """The pip command the script would run for `index`."""
    done = subprocess.run([str(SCRIPT), sys.executable, spec, index], capture_output=True, text=True,
                          env={**os.environ, "SERVE_APP_INSTALL_DRY_RUN": "1"}, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


@pytest.fixture
def cpu_index(tmp_path):
    """A package index on loopback that lists torch."""
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "index.html").write_text("<a href='torch-2.13.0+cpu-cp311-none-linux_x86_64.whl'>t</a>")
    server = ThreadingHTTPServer(("127.0.0.1", 0), partial(SimpleHTTPRequestHandler, directory=str(tmp_path)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    server.server_close()


def test_the_cpu_index_is_used_when_it_answers(cpu_index):
    assert planned(cpu_index) == f"{sys.executable} -m pip install -q torch==2.13.0 --index-url {cpu_index}"
    # a named build (a CUDA one, for a GPU machine set up from here): pip's index, as asked
    assert planned(cpu_index, "torch==2.13.0+cu130") == f"{sys.executable} -m pip install -q torch==2.13.0+cu130"


def test_pips_own_index_when_the_cpu_index_is_unreachable_or_off():
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}/"
    for index in (closed, ""):
        assert planned(index) == f"{sys.executable} -m pip install -q torch==2.13.0"
