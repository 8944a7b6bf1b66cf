"""One line about the machine and the software versions, for the results."""

from __future__ import annotations

import os
import platform
import subprocess
from importlib import metadata

from bench.compare.contenders import BENTOML_VENV

PACKAGES = ("torch", "transformers", "ray", "fastapi", "uvicorn", "flask", "service-streamer", "mlpool")


def _version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "absent"


def _cpu_model() -> str:
    try:
        for line in open("/proc/cpuinfo", encoding="utf-8"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def source_revision() -> str:
    """The commit measured, and whether the working tree had uncommitted changes."""
    root = BENTOML_VENV.parents[1]
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True)
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                           capture_output=True, text=True)
    state = " + uncommitted changes" if dirty.stdout.strip() else ""
    return (head.stdout.strip() or "unknown") + state


def describe_machine() -> str:
    mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    versions = {name: _version(name) for name in PACKAGES}
    bento = BENTOML_VENV / "bin" / "python"
    if bento.exists():
        done = subprocess.run([str(bento), "-c", "import bentoml; print(bentoml.__version__)"],
                              capture_output=True, text=True)
        versions["bentoml"] = done.stdout.strip() or "broken"
    listed = ", ".join(f"{k} {v}" for k, v in versions.items())
    return (f"{os.cpu_count()} x {_cpu_model()}, {mem_gib:.0f} GiB, {platform.system()} {platform.release()}, "
            f"Python {platform.python_version()}; {listed}")
