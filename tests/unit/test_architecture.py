"""The architecture, checked: one import direction between the HTTP side and the model side, and
no module over 300 lines without the reason written at its top.

    serve_app/   (HTTP, the application: ingress, routes, jobs, client)  ──imports──▶  deployments/
    deployments/ (the models: deployments, batching, backends, their settings and errors)

What both sides need (a model's settings, its errors, the chunks it batches, the model-module
contract) lives in deployments/. A reverse import, at module level or inside a function, fails here.
No Ray, no imports of the code under test: the files are read as text (the torch check imports
in a subprocess of its own).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

#: package -> the first-party packages it must never import
FORBIDDEN = {
    "deployments": {"serve_app", "bench", "locustfiles", "deploy", "tests"},
    "examples": {"serve_app", "bench", "locustfiles", "deploy", "tests"},
    "serve_app": {"bench", "locustfiles", "deploy", "tests"},
}


def imported_modules(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, module) of every absolute import in `tree`, nested ones included, and of every
    `importlib.import_module("...")` / `__import__("...")` with a literal name."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
        elif (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
              and isinstance(node.args[0].value, str)
              and getattr(node.func, "attr", getattr(node.func, "id", None)) in ("import_module", "__import__")):
            found.append((node.lineno, node.args[0].value))
    return found


def reverse_imports(package: str) -> list[str]:
    forbidden = FORBIDDEN[package]
    problems = []
    for path in sorted((ROOT / package).rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for line, module in imported_modules(tree):
            if module.split(".")[0] in forbidden:
                problems.append(f"{path.relative_to(ROOT)}:{line} imports {module}")
    return problems


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_imports_go_one_way(package):
    assert reverse_imports(package) == [], (
        f"{package}/ must not import {sorted(FORBIDDEN[package])}: move what both sides need down into "
        "deployments/ (settings, errors, batching) or up into serve_app/ (HTTP, jobs)")


def test_the_check_sees_nested_and_dynamic_imports():
    tree = ast.parse("def f():\n    from serve_app.errors import X\n    import serve_app.settings\n"
                     "    importlib.import_module('serve_app.jobs')\n")
    assert [m for _, m in imported_modules(tree)] == ["serve_app.errors", "serve_app.settings", "serve_app.jobs"]


# --------------------------------------------------------------------- one obvious home per concept

#: the code a newcomer reads, the tests included
CODE = ("serve_app", "deployments", "deploy", "bench", "locustfiles", "examples", "tests")
MAX_LINES = 300
#: a long module says why at its top, in its docstring
REASON = "Why this module is long:"
def long_modules_without_a_reason() -> list[str]:
    found = []
    for folder in CODE:
        for path in sorted((ROOT / folder).rglob("*.py")):
            name = str(path.relative_to(ROOT))
            text = path.read_text(encoding="utf-8")
            lines = text.count("\n")
            if lines <= MAX_LINES:
                continue
            if REASON not in (ast.get_docstring(ast.parse(text)) or ""):
                found.append(f"{name}: {lines} lines")
    return found


def test_no_module_is_long_without_a_reason_at_its_top():
    assert long_modules_without_a_reason() == [], (
        f"split these by responsibility, or say at the top of the docstring {REASON!r} and why")


@pytest.mark.parametrize("module", ["serve_app.builder", "serve_app.jobs.manager"])
def test_processes_that_run_no_model_do_not_import_torch(module):
    """Serve's app builder and the JobManager import the deployments' classes but never run a model:
    torch (3-4 s and ~100 MiB on 2 cores, on the start-up's critical path) stays out of them."""
    probe = f"import sys, {module}; print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]", f"{module} imports {done.stdout.strip()}"
