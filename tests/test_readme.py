"""The README's Python example runs as written, and its quick tour names real options."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def test_the_python_example_runs_as_written() -> None:
    blocks = re.findall(r"```python\n(.*?)```", README, re.S)
    assert blocks, "the README has no Python example"
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(blocks[0], "README.md", "exec"), {})  # the README is ours
    lines = out.getvalue().splitlines()
    assert len(lines) == 3  # one line per task's tree
    assert all("'generated'" in line for line in lines)


def test_the_quick_tour_options_exist() -> None:
    from treeroll.cli.commands import main

    tour = README[README.index("## Quick tour"):README.index("From Python")]
    for command in ("train", "eval", "rollout", "show", "sft"):
        assert f"treeroll {command}" in tour
    help_text = io.StringIO()
    with contextlib.redirect_stdout(help_text), contextlib.suppress(SystemExit):
        main(["train", "--help"])
    for option in re.findall(r"treeroll train [^\n#]*", tour):
        for flag in re.findall(r"--[a-z][a-z.-]+", option):
            if flag != "--config":
                assert flag in help_text.getvalue(), f"the quick tour's {flag} is not an option"
