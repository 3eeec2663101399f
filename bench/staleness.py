"""When a stored figure is stale: a file its run depended on changed since its commit.

Shared by ``bench/readme_results.py`` (which writes a stale label under every stale figure),
``tests/test_results.py`` (which fails when a stale figure is quoted without its label, or a
current one with a label) and ``bench/reproduce.py`` (which remakes the stale ones).
``pyproject.toml`` and its lock ``constraints.txt`` are compared by what a run could have
seen of them (:func:`pyproject_changed_for_a_run`), every other file by its content.

A stale figure is not an error: code changes freely, and the README says next to the figure
which commit measured it, what changed since and how to remake it (:func:`stale_label`).
"""

from __future__ import annotations

import re
import subprocess
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


LOCK = "constraints.txt"
"""The exact versions inside pyproject.toml's ranges that the README's commands, CI and the
figures install (``pip install -c constraints.txt``); absent before the ranges came in."""


def _name(requirement: str) -> str:
    return re.split(r"[=<>!~\[; ]", requirement.strip(), maxsplit=1)[0].lower()


def lock_pins(lock: str) -> dict[str, str]:
    """``constraints.txt``'s pins by package name (comments and blank lines skipped)."""
    lines = (line.split("#", 1)[0].strip() for line in lock.splitlines())
    return {_name(line): line.replace(" ", "") for line in lines if line}


def pinned_runtime(pyproject: str, lock: str = "") -> dict:
    """What of ``pyproject.toml`` (with the lock ``lock``) a figure's run depends on: the build
    system, the Python range, the package data, and each runtime dependency and optional
    extra's package as it is installed: the lock's exact pin where it has one, else the
    requirement as declared. So moving a pin from pyproject.toml into the lock, with the same
    version, changes nothing a run saw."""
    data = tomllib.loads(pyproject)
    project = data.get("project", {})
    pins = lock_pins(lock)

    def installed(requirements: list[str]) -> dict[str, str]:
        return {_name(r): pins.get(_name(r), r.replace(" ", "")) for r in requirements}

    extras = {name: installed(requirements)
              for name, requirements in project.get("optional-dependencies", {}).items()}
    return {"build": data.get("build-system"), "python": project.get("requires-python"),
            "dependencies": installed(project.get("dependencies", [])), "extras": extras,
            "data": data.get("tool", {}).get("setuptools", {}).get("package-data")}


def pyproject_changed_for_a_run(then: str, now: str, then_lock: str = "",
                                now_lock: str = "") -> bool:
    """True when ``now``'s pyproject.toml and lock change what a run measured with ``then``'s
    used: the runtime pins, or a pin an extra already had (changed or removed). A package newly
    added to an optional extra (an adapter's trainer, say) changes nothing a figure's
    command imported, so it does not stale it."""
    old, new = pinned_runtime(then, then_lock), pinned_runtime(now, now_lock)
    if any(old[key] != new[key] for key in ("build", "python", "dependencies", "data")):
        return True
    return any(new["extras"].get(extra, {}).get(name) != pin
               for extra, pins in old["extras"].items() for name, pin in pins.items())


def git(*args: str, root: Path = ROOT) -> str:
    """Output of a git command in the repository (or the worktree ``root``), stripped; a
    ValueError naming the command when git fails."""
    done = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True)
    if done.returncode != 0:
        raise ValueError(f"`git {' '.join(args)}` failed in {root}: {done.stderr.strip()}")
    return done.stdout.strip()


def changed_since(commit: str, depends_on: list[str], to: str | None = None,
                  root: Path = ROOT) -> list[str]:
    """Files among ``depends_on`` that differ between ``commit`` and ``to`` (a commit; None:
    the working tree) in a way the run could have seen (``pyproject.toml`` through
    :func:`pyproject_changed_for_a_run`)."""
    try:
        files = git("diff", "--name-only", commit, *([to] if to else []), "--", *depends_on,
                    root=root).split()
    except ValueError as error:
        raise ValueError(f"commit {commit} is not in this repository's history ({error})") \
            from None
    if "pyproject.toml" in depends_on and LOCK not in depends_on:  # the lock installs it
        files += git("diff", "--name-only", commit, *([to] if to else []), "--", LOCK,
                     root=root).split()
    packaging = [f for f in ("pyproject.toml", LOCK) if f in files]
    if packaging:
        def read(name: str, at: str | None) -> str:
            if at is None:
                path = root / name
                return path.read_text() if path.exists() else ""
            try:
                return git("show", f"{at}:{name}", root=root)
            except ValueError:  # not in that commit (the lock came later)
                return ""

        if not pyproject_changed_for_a_run(read("pyproject.toml", commit),
                                           read("pyproject.toml", to), read(LOCK, commit),
                                           read(LOCK, to)):
            files = [f for f in files if f not in packaging]
    return files


STALE_MARKER = re.compile(r"<!-- stale: (?P<name>[a-z0-9_]+) (?P<commit>[0-9a-f]{10}) -->")
"""The machine-readable end of a stale label: the figure's name and the commit it ran on."""
SHOWN_FILES = 3
"""How many of the changed files a stale label names."""


def remake_command(name: str) -> str:
    """The command that remakes one stored figure."""
    return f"python bench/reproduce.py --only {name}"


def stale_label(name: str, record: dict, files: list[str]) -> str:
    """The one line written under a stale figure: the commit that measured it, the first
    changed files, the command that remakes it, and a marker ``tests/test_results.py`` reads."""
    shown = ", ".join(f"`{f}`" for f in files[:SHOWN_FILES])
    more = f" and {len(files) - SHOWN_FILES} more" if len(files) > SHOWN_FILES else ""
    minutes = f" (~{record['seconds'] / 60:.0f} min)" if record.get("seconds") else ""
    commit = record["commit"][:10]
    return (f"**Stale:** measured on commit {commit}; changed since: {shown}{more}; remake: "
            f"`{remake_command(name)}`{minutes}. <!-- stale: {name} {commit} -->")
