"""Every figure the README quotes is a stored result of the current code.

The README quotes a benchmark's JSON line after a marker ``<!-- result: NAME -->``; the
stored file ``docs/results/NAME.json`` (written by ``python bench/reproduce.py``) holds the
full line, the command and the commit it ran on. A quoted value that differs from the stored
one, a figure measured on uncommitted code, or a change since the figure's commit to a file it
depends on (the code its run imported, configs, dependencies, shipped data: ``depends_on``) is
a failure that names the figure and how to remake it.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
from staleness import changed_since, pyproject_changed_for_a_run

ROOT = Path(__file__).resolve().parent.parent
MARKER = re.compile(r"<!-- result: (?P<name>[a-z0-9_]+) -->\s*\n\s*`(?P<json>\{.*?\})`", re.S)


def quoted_figures(text: str) -> list[tuple[str, dict]]:
    """``(name, quoted JSON)`` for every marked figure of a README text."""
    return [(m["name"], json.loads(m["json"])) for m in MARKER.finditer(text)]


def test_the_marker_parser_reads_a_quoted_figure() -> None:
    text = 'x\n<!-- result: demo -->\n`{"a": 1, "b": [0.5, 2]}`\n'
    assert quoted_figures(text) == [("demo", {"a": 1, "b": [0.5, 2]})]


def test_pyproject_staleness_ignores_a_new_extra_pin_but_not_a_changed_one() -> None:
    then = ('[project]\ndependencies = ["torch==2.13.0"]\n'
            '[project.optional-dependencies]\ntest = ["pytest==9.2.0", "ray==2.60.0"]\n')
    added = then.replace('"ray==2.60.0"]', '"ray==2.60.0", "trl==1.16.0"]')
    assert not pyproject_changed_for_a_run(then, added)
    assert not pyproject_changed_for_a_run(then, added + "[tool.ruff]\nline-length = 99\n")
    assert pyproject_changed_for_a_run(then, then.replace("ray==2.60.0", "ray==2.61.0"))
    assert pyproject_changed_for_a_run(then, then.replace("torch==2.13.0", "torch==2.14.0"))
    assert pyproject_changed_for_a_run(then, then.replace(', "ray==2.60.0"', ""))


README_FIGURES = quoted_figures((ROOT / "README.md").read_text())


def test_the_readme_quotes_its_main_figures() -> None:
    names = {name for name, _ in README_FIGURES}
    assert {"base_policy_quick", "base_policy", "learning_quick", "default_training",
            "sft_base"} <= names


@pytest.mark.parametrize(("name", "quoted"), README_FIGURES, ids=[n for n, _ in README_FIGURES])
def test_a_quoted_figure_is_its_stored_result_of_the_current_code(name, quoted) -> None:
    path = ROOT / "docs" / "results" / f"{name}.json"
    remake = f"remake it with `python bench/reproduce.py --only {name}`"
    assert path.is_file(), f"the README quotes {name}, but {path} does not exist; {remake}"
    stored = json.loads(path.read_text())
    differing = {key: (value, stored["result"].get(key)) for key, value in quoted.items()
                 if stored["result"].get(key) != value}
    assert not differing, f"README's {name} differs from {path} (README, stored): {differing}"
    assert not stored["dirty"], f"{name} was measured on uncommitted code; {remake}"
    files = changed_since(stored["commit"], stored["depends_on"])
    assert not files, (f"{name} is stale: measured on {stored['commit'][:10]}, and since then "
                       f"{', '.join(files[:5])}{' ...' if len(files) > 5 else ''} changed; "
                       f"{remake}")
