"""When a stored figure is stale: a file its run depended on changed since its commit.

Shared by ``tests/test_results.py`` (a stale figure fails CI) and ``bench/readme_results.py``
(a stale figure is named instead of quoted). ``pyproject.toml`` is compared by what a run
could have seen of it (:func:`pyproject_changed_for_a_run`), every other file by its content.
"""

from __future__ import annotations

import re
import subprocess
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def pinned_runtime(pyproject: str) -> dict:
    """What of ``pyproject.toml`` a figure's run depends on: the build system, the Python
    range, the runtime dependencies and the package data, and every optional extra's pins
    by package name (the test tools' and the lint settings are not read by any run)."""
    data = tomllib.loads(pyproject)
    project = data.get("project", {})
    extras = {name: {re.split(r"[=<>!~\[; ]", pin, maxsplit=1)[0].lower(): pin
                     for pin in pins}
              for name, pins in project.get("optional-dependencies", {}).items()}
    return {"build": data.get("build-system"), "python": project.get("requires-python"),
            "dependencies": project.get("dependencies"), "extras": extras,
            "data": data.get("tool", {}).get("setuptools", {}).get("package-data")}


def pyproject_changed_for_a_run(then: str, now: str) -> bool:
    """True when ``now``'s pyproject.toml changes what a run measured with ``then``'s used:
    the runtime pins, or a pin an extra already had (changed or removed). A package newly
    added to an optional extra (an adapter's trainer, say) changes nothing a figure's
    command imported, so it does not stale it."""
    old, new = pinned_runtime(then), pinned_runtime(now)
    if any(old[key] != new[key] for key in ("build", "python", "dependencies", "data")):
        return True
    return any(new["extras"].get(extra, {}).get(name) != pin
               for extra, pins in old["extras"].items() for name, pin in pins.items())


def changed_since(commit: str, depends_on: list[str]) -> list[str]:
    """Files among ``depends_on`` that changed since ``commit`` in a way the run could have
    seen (``pyproject.toml`` through :func:`pyproject_changed_for_a_run`)."""
    changed = subprocess.run(["git", "diff", "--name-only", commit, "--", *depends_on],
                             cwd=ROOT, capture_output=True, text=True)
    if changed.returncode != 0:
        raise ValueError(f"commit {commit} is not in this repository's history "
                         f"({changed.stderr.strip()})")
    files = changed.stdout.split()
    if "pyproject.toml" in files:
        then = subprocess.run(["git", "show", f"{commit}:pyproject.toml"], cwd=ROOT,
                              capture_output=True, text=True, check=True).stdout
        if not pyproject_changed_for_a_run(then, (ROOT / "pyproject.toml").read_text()):
            files.remove("pyproject.toml")
    return files
