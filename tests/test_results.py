"""Every figure the results page (docs/results.md) quotes is a stored result, and says so
when it is stale.

The results page quotes a benchmark's JSON line after a marker ``<!-- result: NAME -->``; the
stored file ``docs/results/NAME.json`` (written by ``python bench/reproduce.py``) holds the
full line, the command and the commit it ran on. A quoted value that differs from the stored
one, or a figure measured on uncommitted code, is a failure. A figure whose dependencies (the
code its run imported, configs, dependencies, shipped data: ``depends_on``) changed since its
commit is *stale*: that is not a failure as long as the page labels it so, with the
commit it ran on (``<!-- stale: NAME COMMIT -->``, written by ``bench/readme_results.py``);
a stale figure without its label, or a label on a current figure, is.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
from staleness import STALE_MARKER, changed_since, pyproject_changed_for_a_run

ROOT = Path(__file__).resolve().parent.parent
MARKER = re.compile(r"<!-- result: (?P<name>[a-z0-9_]+) -->\s*\n\s*`(?P<json>\{.*?\})`", re.S)


def quoted_figures(text: str) -> list[tuple[str, dict]]:
    """``(name, quoted JSON)`` for every marked figure of a README text."""
    return [(m["name"], json.loads(m["json"])) for m in MARKER.finditer(text)]


def stale_labels(text: str) -> dict[str, str]:
    """``{name: commit}`` of every stale label that stands under its own figure: after the
    figure's marker and before the next figure's or the next heading."""
    labels = {}
    figures = list(MARKER.finditer(text))
    for here, after in zip(figures, [*figures[1:], None], strict=True):
        end = after.start() if after else len(text)
        heading = re.search(r"^#", text[here.end():end], re.M)
        block = text[here.end():here.end() + heading.start() if heading else end]
        for label in STALE_MARKER.finditer(block):
            if label["name"] == here["name"]:
                labels[label["name"]] = label["commit"]
    return labels


def test_a_stale_label_counts_only_under_its_own_figure() -> None:
    text = ("<!-- result: a -->\n`{}`\n\n<!-- stale: b 0123456789 -->\n"
            "<!-- result: b -->\n`{}`\n\n## next\n<!-- stale: b 9876543210 -->\n")
    assert stale_labels(text) == {}
    assert stale_labels(text.replace("stale: b 0123", "stale: a 0123")) == {"a": "0123456789"}


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


def test_moving_a_pin_into_the_lock_with_the_same_version_stales_nothing() -> None:
    then = ('[project]\ndependencies = ["torch==2.13.0", "numpy>=2.0,<3"]\n'
            '[project.optional-dependencies]\ntest = ["ray==2.60.0"]\n')
    ranged = then.replace("torch==2.13.0", "torch>=2.13,<2.15").replace("ray==2.60.0",
                                                                      "ray>=2.50")
    lock = "# the lock\ntorch==2.13.0\nray==2.60.0\n"
    assert not pyproject_changed_for_a_run(then, ranged, "", lock)
    assert pyproject_changed_for_a_run(then, ranged, "", lock.replace("2.13.0", "2.14.0"))
    assert pyproject_changed_for_a_run(then, ranged, "", lock.replace("ray==2.60.0", ""))
    assert pyproject_changed_for_a_run(then, ranged, "", "")  # a range alone is not the pin


README_TEXT = (ROOT / "docs" / "results.md").read_text()  # the site's results page
README_FIGURES = quoted_figures(README_TEXT)
README_STALE = stale_labels(README_TEXT)


def test_the_readme_quotes_its_main_figures() -> None:
    names = {name for name, _ in README_FIGURES}
    assert {"base_policy_quick", "base_policy", "learning_quick", "default_training",
            "sft_base"} <= names


@pytest.mark.parametrize(("name", "quoted"), README_FIGURES, ids=[n for n, _ in README_FIGURES])
def test_a_quoted_figure_is_its_stored_result_and_labelled_when_stale(name, quoted) -> None:
    path = ROOT / "docs" / "results" / f"{name}.json"
    remake = f"remake it with `python bench/reproduce.py --only {name}`"
    assert path.is_file(), f"the results page quotes {name}, but {path} does not exist; {remake}"
    stored = json.loads(path.read_text())
    differing = {key: (value, stored["result"].get(key)) for key, value in quoted.items()
                 if stored["result"].get(key) != value}
    assert not differing, (f"the results page's {name} differs from {path} (page, stored): "
                           f"{differing}")
    assert not stored["dirty"], f"{name} was measured on uncommitted code; {remake}"
    files = changed_since(stored["commit"], stored["depends_on"])
    label = README_STALE.get(name)
    assert label is None or files, (f"the results page labels {name} stale, but nothing it "
                                    f"depends on changed since {stored['commit'][:10]}; run "
                                    "`python bench/readme_results.py`")
    assert label is not None or not files, (
        f"{name} is stale (measured on {stored['commit'][:10]}; since then "
        f"{', '.join(files[:5])}{' ...' if len(files) > 5 else ''} changed) and the results page "
        f"does not say so under it: run `python bench/readme_results.py` to label it, or {remake}")
    assert label is None or label == stored["commit"][:10], (
        f"{name}'s stale label names commit {label}, its stored file {stored['commit'][:10]}; "
        "run `python bench/readme_results.py`")


def test_the_readme_headline_table_is_the_generated_one() -> None:
    """The README's headline table is written by ``bench/readme_results.py`` from the stored
    figures (values and current/stale states); a hand edit, or a figure stored without
    regenerating, fails here."""
    done = subprocess.run([sys.executable, "bench/readme_results.py", "--check"], cwd=ROOT,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
