"""Helpers of the fresh-interpreter plug-in tests: a plug-in installed as a package would
install it (a ``.dist-info`` folder declaring its entry point), and Python run with it."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

PLUGINS = Path(__file__).resolve().parent


def install(site: Path, name: str, entry_points: str) -> Path:
    """A minimal installed distribution ``name`` in ``site`` declaring ``entry_points`` (the
    text of its ``entry_points.txt``, what pip would write). Returns ``site``."""
    info = site / f"{name}-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(entry_points)
    return site


def run_python(site: Path, code: str) -> subprocess.CompletedProcess[str]:
    """``code`` in a fresh interpreter that finds ``site`` and the plug-in files here."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(PLUGINS)])}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env,
                          capture_output=True, text=True, timeout=600)


def help_and_refusal(site: Path, option: str, argv: list[str]) -> tuple[str, str]:
    """What a user of the installed plug-in sees: ``treeroll train --help``'s text, and the
    error of ``treeroll train argv`` (a run that sets one of its settings badly). Both must
    name ``option`` (given as the command line spells it, ``--env.tiny-lake.side``); the
    refused run must exit non-zero. Returns the two texts for the caller's own checks."""
    helped = run_python(site, "from treeroll.cli import main\nmain(['train', '--help'])\n")
    said = helped.stdout + helped.stderr
    assert option in said or option.replace("-", "_").replace("__", "--") in said, said
    refused = run_python(site, f"from treeroll.cli import main\n"
                               f"raise SystemExit(main(['train', *{argv!r}]))\n")
    assert refused.returncode != 0, refused.stdout
    assert option in refused.stderr, refused.stderr
    return said, refused.stderr
