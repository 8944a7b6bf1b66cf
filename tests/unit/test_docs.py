"""The README and the docs tell a newcomer the truth: the README stays short and names the two
commands; the settings table in docs/configuration.md is the settings' own; the worked example in
docs/your-own-model.md is a complete model module; every relative link points at a file."""

import re
import sys
from pathlib import Path

import pytest

from serve_app.settings_doc import settings_table

ROOT = Path(__file__).resolve().parents[2]


def test_the_configuration_doc_s_settings_table_matches_the_settings_classes():
    doc = (ROOT / "docs" / "configuration.md").read_text()
    match = re.search(r"<!-- settings-table:.*?-->\n(.*?)\n<!-- /settings-table -->", doc, re.S)
    assert match, "docs/configuration.md lost its settings table markers"
    assert match.group(1).strip() == settings_table().strip(), (
        "docs/configuration.md settings table is stale: regenerate it with `python -m serve_app.settings`")


def test_readme_names_the_two_commands_and_ci_runs_the_test_one():
    readme = (ROOT / "README.md").read_text()
    assert "make run" in readme and "make test" in readme
    assert "make test" in (ROOT / ".ci" / "run").read_text()


def test_readme_is_read_in_five_minutes():
    assert (ROOT / "README.md").read_text().count("\n") <= 150


def test_the_integration_tests_serve_what_make_run_serves():
    from tests.support import MAKE_RUN_CONFIG

    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    assert re.search(r"^CONFIG \?= (\S+)", makefile, flags=re.M)[1] == MAKE_RUN_CONFIG


def test_the_worked_example_of_your_own_model_is_a_complete_model_module(tmp_path, monkeypatch):
    from deployments.model_module import import_model_module

    doc = (ROOT / "docs" / "your-own-model.md").read_text()
    section = doc.split("## The worked example", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    assert code.count("\n") <= 50, "the worked example no longer fits one screen"
    (tmp_path / "docs_worked_example.py").write_text(code)
    monkeypatch.syspath_prepend(str(tmp_path))
    module = import_model_module("docs_worked_example")  # the same checks as a config's `models:`
    module.check_options({"seed": 0})
    model = module.load(seed=0)
    setosa = {"sepal_length_cm": 5.1, "sepal_width_cm": 3.5, "petal_length_cm": 1.4, "petal_width_cm": 0.2}
    virginica = {"sepal_length_cm": 6.7, "sepal_width_cm": 3.0, "petal_length_cm": 5.2, "petal_width_cm": 2.3}
    outputs = module.predict(model, [module.Input(**setosa), module.Input(**virginica)])
    assert [o.species for o in outputs] == ["setosa", "virginica"]
    assert module.describe(model)["held_out_accuracy"] > 0.9
    sys.modules.pop("docs_worked_example", None)


@pytest.mark.parametrize("page", ["README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md"))])
def test_relative_links_point_at_files(page):
    path = ROOT / page
    missing = []
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", path.read_text(encoding="utf-8")):
        if "://" in target or target.startswith("mailto:"):
            continue
        if not (path.parent / target).exists():
            missing.append(target)
    assert missing == [], f"{page} links to missing files"
