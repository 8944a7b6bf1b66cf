"""Dockerfile and .dockerignore: pins that must follow pyproject.toml."""

from __future__ import annotations

import re

from .helpers import ROOT, python_tag, ray_pin


def _args() -> dict[str, str]:
    text = (ROOT / "Dockerfile").read_text(encoding="utf-8")
    return dict(re.findall(r"^ARG (\w+)=(\S*)", text, flags=re.M))


def test_base_image_pins_follow_pyproject():
    args = _args()
    assert args["RAY_VERSION"] == ray_pin()
    assert args["PYTHON_TAG"] == python_tag()
    text = (ROOT / "Dockerfile").read_text(encoding="utf-8")
    assert re.search(r"^FROM rayproject/ray:\$\{RAY_VERSION\}-\$\{PYTHON_TAG\}\$\{VARIANT\}\s*$", text, flags=re.M)
    assert args["VARIANT"] == "", "the default build is the CPU image; -gpu is a build arg"


def test_torch_pin_matches_the_makefile():
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    make_spec = re.search(r"^TORCH_SPEC \?= (\S+)", makefile, flags=re.M)[1]
    assert _args()["TORCH_SPEC"].strip('"') == make_spec


def test_image_gets_the_code_and_not_the_rest():
    text = (ROOT / "Dockerfile").read_text(encoding="utf-8")
    assert 'pip install --no-cache-dir ".[ctranslate2]"' in text
    ignored = (ROOT / ".dockerignore").read_text(encoding="utf-8").split()
    for path in (".venv", ".git", "tests"):
        assert path in ignored
    for needed in ("serve_app", "deployments", "examples", "pyproject.toml"):
        assert needed not in ignored and f"COPY --chown=ray:users {needed}" in text
