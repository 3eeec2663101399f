"""Generating bug-fix tasks from the projects shipped in ``treeroll/data/swe_projects/``: each
candidate mutation (:mod:`treeroll.envs.swe.mutations`) is applied and the project's suite
run in a sandbox; a mutant is kept when at least one test then fails and every other test
still runs, and its problem statement is written from the failing tests' output
(:func:`generate_tasks`, deterministic in its seed). :mod:`treeroll.envs.swe.tasks` turns the
kept entries into tasks.
"""

from __future__ import annotations

import json
import random
import re
import shutil
from collections.abc import Callable, Sequence
from dataclasses import asdict
from importlib import resources
from pathlib import Path
from typing import Any

from treeroll.envs.swe.mutations import Mutation, mutation_sites
from treeroll.envs.swe.pytest_report import DEFAULT_TEST_COMMAND, parse_pytest_report
from treeroll.envs.swe.sandbox import Sandbox

__all__ = ["PROJECTS_DIR", "copy_project", "data_dir", "generate_tasks", "project_names"]

PROJECTS_DIR = "swe_projects"
"""The shipped projects' folder inside treeroll's package data (:func:`data_dir`)."""


def data_dir() -> Path:
    """treeroll's package data folder (the shipped projects and the task index)."""
    return Path(str(resources.files("treeroll"))) / "data"


def project_names() -> list[str]:
    """Names of the shipped projects."""
    return sorted(p.name for p in (data_dir() / PROJECTS_DIR).iterdir() if p.is_dir())


def copy_project(project: str, dest: Path) -> None:
    """Copy the shipped ``project`` into ``dest`` (caches and bytecode left out)."""
    source = data_dir() / PROJECTS_DIR / project
    if not source.is_dir():
        raise KeyError(f"unknown project {project!r}; shipped: {project_names()}")
    shutil.copytree(source, dest, dirs_exist_ok=True,
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc", ".pytest_cache"))


def _failure_excerpt(output: str, test: str, max_lines: int = 30) -> str:
    name = test.split("::")[-1]
    lines = output.splitlines()
    start = next((i for i, line in enumerate(lines)
                  if line.startswith("_") and f" {name} " in line), None)
    if start is None:
        return ""
    block: list[str] = []
    for line in lines[start + 1:]:
        if (line.startswith("_____") or line.startswith("=====")) and block:
            break
        block.append(line)
    return "\n".join(block[:max_lines]).strip()


def _problem_statement(project: str, failing: Sequence[str], output: str) -> str:
    readme = (data_dir() / PROJECTS_DIR / project / "README.md").read_text().strip()
    summary = readme.splitlines()[-1] if readme else project
    listed = "\n".join(f"- {t}" for t in failing[:10])
    more = f"\n- ... and {len(failing) - 10} more" if len(failing) > 10 else ""
    # object addresses differ between runs; generation must be deterministic
    excerpt = re.sub(r" at 0x[0-9a-fA-F]+", " at 0x...", _failure_excerpt(output, failing[0]))
    return (f"Bug report for `{project}` ({summary})\n\n"
            f"After a recent change, {len(failing)} test(s) of the suite fail:\n{listed}{more}\n\n"
            f"Output of `pytest {failing[0]}`:\n```\n{excerpt}\n```\n\n"
            "Fix the library code so that these tests pass again without breaking the others. "
            "Do not modify the tests.")


def _run_suite(sandbox: Sandbox, project: str, mutation: Mutation | None) -> dict[str, Any]:
    def build(dest: Path) -> None:
        copy_project(project, dest)
        if mutation is not None:
            target = dest / mutation.file
            target.write_text(mutation.apply(target.read_text()))

    key = f"validate:{project}:{json.dumps(asdict(mutation)) if mutation else 'clean'}"
    base = sandbox.base(key, build, git=False)
    workspace = sandbox.workspace(base)
    try:
        result = sandbox.run(workspace, DEFAULT_TEST_COMMAND.format(tests=""), timeout_s=10)
    finally:
        workspace.remove()
        shutil.rmtree(base, ignore_errors=True)
    return {"statuses": parse_pytest_report(result.output), "output": result.output,
            "timed_out": result.timed_out}


def _interleave_kinds(candidates: list[tuple[str, Mutation]], rng: random.Random,
                      ) -> list[tuple[str, Mutation]]:
    """Shuffle within each mutation kind, then take one of each kind in turn, so that common
    kinds (wrong variable) do not crowd out rare ones (negated condition)."""
    by_kind: dict[str, list[tuple[str, Mutation]]] = {}
    for candidate in candidates:
        by_kind.setdefault(candidate[1].kind, []).append(candidate)
    queues = [by_kind[kind] for kind in sorted(by_kind)]
    for queue in queues:
        rng.shuffle(queue)
    out: list[tuple[str, Mutation]] = []
    while any(queues):
        for queue in queues:
            if queue:
                out.append(queue.pop())
    return out


def generate_tasks(count: int, *, seed: int = 0, projects: Sequence[str] | None = None,
                   sandbox: Sandbox | None = None, log: Callable[[str], None] | None = None,
                   ) -> list[dict[str, Any]]:
    """Validate mutants in a seeded order (kinds interleaved) until ``count`` are kept; return
    index entries.

    A mutant is kept when at least one test fails, no test errors, and the suite reports
    exactly the tests of the clean project (the rest still run).
    """
    own = sandbox is None
    box = sandbox or Sandbox()
    try:
        baselines = {}
        candidates: list[tuple[str, Mutation]] = []
        for project in projects or project_names():
            clean = _run_suite(box, project, None)["statuses"]
            if not clean or any(s != "PASSED" for s in clean.values()):
                raise RuntimeError(f"project {project} does not pass its own suite: {clean}")
            baselines[project] = clean
            root = data_dir() / PROJECTS_DIR / project
            for path in sorted(root.rglob("*.py")):
                rel = path.relative_to(root).as_posix()
                if rel.startswith("tests/") or path.name == "__init__.py":
                    continue
                candidates.extend((project, m) for m in mutation_sites(path.read_text(), rel))
        candidates = _interleave_kinds(candidates, random.Random(seed))
        kept: list[dict[str, Any]] = []
        for tried, (project, mutation) in enumerate(candidates, 1):
            if len(kept) >= count:
                break
            run = _run_suite(box, project, mutation)
            statuses = run["statuses"]
            if run["timed_out"] or set(statuses) != set(baselines[project]):
                continue
            failing = sorted(t for t, s in statuses.items() if s == "FAILED")
            if not failing or any(s not in ("PASSED", "FAILED") for s in statuses.values()):
                continue
            passing = sorted(t for t, s in statuses.items() if s == "PASSED")
            kept.append({
                "task_id": f"{project}-{len(kept):04d}-{mutation.kind}",
                "project": project, "mutation": asdict(mutation), "fail_to_pass": failing,
                "pass_to_pass": passing,
                "problem_statement": _problem_statement(project, failing, run["output"])})
            if log is not None:
                log(f"[{tried}/{len(candidates)}] kept {len(kept)}: {kept[-1]['task_id']}")
        return kept
    finally:
        if own:
            box.close()
