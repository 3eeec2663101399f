"""The documentation site: a short README, every old README section on a page, a strict
build, and the pages' Python blocks run as written (issue #52)."""

from __future__ import annotations

import html
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

OLD_README_HEADINGS = tuple((ROOT / "tests" / "old_readme_headings.txt").read_text()
                            .splitlines())
"""The section headings of the 1,872-line README before it became the site (commit 208b710):
each must still head a section of the README or of a page."""


def _pages() -> list[Path]:
    return sorted((ROOT / "docs").rglob("*.md"))


def _headings(text: str) -> set[str]:
    return {line.lstrip("#").strip() for line in text.splitlines()
            if re.match(r"#{1,6} ", line)}


def test_readme_is_short_and_still_starts_with_the_two_commands() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 250
    first = readme.split("```bash\n", 1)[1].split("```", 1)[0].splitlines()
    ci = (ROOT / ".ci" / "run").read_text()
    assert first[0].endswith("treeroll train --config configs/frozenlake_rllm.yaml")
    assert first[1] in ci  # CI runs the second command verbatim


def test_every_old_readme_section_heads_a_section_of_the_readme_or_a_page() -> None:
    found = _headings((ROOT / "README.md").read_text())
    for page in _pages():
        found |= _headings(page.read_text())
    missing = [h for h in OLD_README_HEADINGS if h not in found]
    assert not missing, f"sections of the old README on no page: {missing}"


def test_the_site_builds_with_no_broken_link_or_missing_reference(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir",
                           str(tmp_path / "site")], cwd=ROOT, capture_output=True, text=True,
                          timeout=600, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    home = html.unescape(re.sub(r"<[^>]+>", "", (tmp_path / "site" / "index.html").read_text()))
    readme = (ROOT / "README.md").read_text()
    commands = readme.split("```bash\n", 1)[1].split("```", 1)[0].splitlines()
    assert all(command in home for command in commands)  # included from the README's lines
    tour = (tmp_path / "site" / "getting-started" / "index.html").read_text()
    assert "frozenlake-tiny" in tour and "load_policy" in tour  # the README's quick tour
    api = (tmp_path / "site" / "api" / "index.html").read_text()
    assert "packed_backward" in api and "load_policy" in api  # from the docstrings


def _python_blocks(text: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", text, re.S)


PAGES_WITH_CODE = [p for p in _pages() if _python_blocks(p.read_text())]


@pytest.mark.parametrize("page", PAGES_WITH_CODE, ids=[str(p.relative_to(ROOT))
                                                       for p in PAGES_WITH_CODE])
def test_a_pages_python_blocks_run_as_written_in_order(page: Path, tmp_path: Path) -> None:
    """A page's blocks run in one fresh process, in order (a later block may use an earlier
    one's names), from the repository root; a block that cannot run here says why on its
    first line (``# not run here: ...``) and is left out."""
    blocks = _python_blocks(page.read_text())
    kept = [b for b in blocks if not b.startswith("# not run here:")]
    for block in blocks:
        if block.startswith("# not run"):
            assert len(block.splitlines()[0]) > len("# not run here: "), "say why"
    if not kept:
        pytest.skip(f"every Python block of {page.name} says why it cannot run here")
    script = tmp_path / "blocks.py"
    script.write_text("\n".join(kept))
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True,
                          text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
