"""The README tells a newcomer the truth: its settings table is the settings' own."""

import re
from pathlib import Path

from serve_app.settings import settings_table

ROOT = Path(__file__).resolve().parents[2]


def test_readme_settings_table_matches_the_settings_classes():
    readme = (ROOT / "README.md").read_text()
    match = re.search(r"<!-- settings-table:.*?-->\n(.*?)\n<!-- /settings-table -->", readme, re.S)
    assert match, "README.md lost its settings table markers"
    assert match.group(1).strip() == settings_table().strip(), (
        "README settings table is stale: regenerate it with `python -m serve_app.settings`")


def test_readme_names_the_two_commands_and_ci_runs_the_test_one():
    readme = (ROOT / "README.md").read_text()
    assert "make run" in readme and "make test" in readme
    assert "make test" in (ROOT / ".ci" / "run").read_text()


def test_the_integration_tests_serve_what_make_run_serves():
    from tests.support import MAKE_RUN_CONFIG

    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    assert re.search(r"^CONFIG \?= (\S+)", makefile, flags=re.M)[1] == MAKE_RUN_CONFIG
