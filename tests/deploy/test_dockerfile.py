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
    assert re.search(r"^FROM rayproject/ray:\$\{RAY_VERSION\}-\$\{PYTHON_TAG\}\$\{VARIANT\}\$\{BASE_DIGEST\}\s*$",
                     text, flags=re.M)
    assert args["VARIANT"] == "", "the default build is the CPU image; -gpu is a build arg"
    # The digest pin: empty by default (no digest can be known before you pull), @sha256:... when set.
    assert args["BASE_DIGEST"] == "" and "--build-arg BASE_DIGEST=@" in text


def test_torch_pin_matches_the_makefile():
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    make_spec = re.search(r"^TORCH_SPEC \?= (\S+)", makefile, flags=re.M)[1]
    assert _args()["TORCH_SPEC"].strip('"') == make_spec


def _steps() -> list[str]:
    """The Dockerfile's instructions, continuation lines joined, comments left out."""
    text = (ROOT / "Dockerfile").read_text(encoding="utf-8").replace("\\\n", " ")
    return [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def test_dependencies_are_a_layer_of_their_own_from_the_lock():
    steps = _steps()
    index = {s: i for i, s in enumerate(steps)}
    copy_deps = next(i for s, i in index.items() if s.startswith("COPY") and "requirements.lock" in s)
    install_deps = next(i for s, i in index.items() if "pip install" in s and "-c requirements.lock" in s)
    first_code = min(i for s, i in index.items() if s.startswith("COPY") and "serve_app" in s)
    install_code = next(i for s, i in index.items() if "pip install" in s and "--no-deps ." in s)
    assert copy_deps < install_deps < first_code < install_code
    assert "pyproject.toml" in steps[copy_deps] and "serve_app" not in steps[copy_deps]
    for extra in ("ctranslate2", "examples"):  # what the Serve configs need, as `make install` gives it
        assert f"['{extra}']" in steps[install_deps]


def test_image_runs_as_the_non_root_user_without_sudo():
    steps = _steps()
    users = [s.split()[1] for s in steps if s.startswith("USER ")]
    assert users[-1] == "1000:100", users  # ray:users, numeric for runAsNonRoot
    root_at = steps.index("USER root")
    sudo_removal = steps[root_at + 1]
    assert "gpasswd -d ray sudo" in sudo_removal and "/etc/sudoers" in sudo_removal
    assert "sudo -n true" in sudo_removal and "exit 1" in sudo_removal  # the build fails if sudo still works
    assert steps[root_at + 2] == "USER 1000:100"


def test_image_gets_the_code_and_not_the_rest():
    text = (ROOT / "Dockerfile").read_text(encoding="utf-8")
    assert "pip install --no-cache-dir --no-deps ." in text
    ignored = (ROOT / ".dockerignore").read_text(encoding="utf-8").split()
    for path in (".venv", ".venv-checkov", ".git", "tests"):
        assert path in ignored
    for needed in ("serve_app", "deployments", "examples", "pyproject.toml"):
        assert needed not in ignored and f"COPY --chown=ray:users {needed}" in text
