"""SWE tasks: bug-fix tasks generated here by AST mutation (SWE-smith style), and a loader for
SWE-bench-format JSONL instances checked out by the user.

A generated task is one of the small projects shipped in ``treeroll/data/swe_projects/`` with
one mutation applied (a swapped operator, an off-by-one constant, a negated condition, a wrong
variable, a dropped statement, a flipped boolean, swapped arguments). A mutation is kept when
at least one test then fails and every other test still runs (no collection error); the
failing tests become ``FAIL_TO_PASS``, the rest ``PASS_TO_PASS``, and the problem statement is
written from the failing tests' output. Generation is deterministic in its seed.

Validating mutants costs one pytest run each, so the validated tasks are shipped as a small
index (``treeroll/data/swe_tasks/index.json``) and rebuilt on demand. Re-check them with::

    python -m treeroll.envs.swe --validate-all        # every shipped task
    python -m treeroll.envs.swe --validate 5          # five random ones
    python -m treeroll.envs.swe --generate 240 --seed 0 --out index.json
"""

from __future__ import annotations

import argparse
import ast
import copy
import hashlib
import json
import os
import random
import re
import secrets
import shlex
import shutil
import stat
import sys
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from treeroll.envs.swe.sandbox import Sandbox, Workspace

__all__ = [
    "DEFAULT_TEST_COMMAND",
    "SUBMIT_SENTINEL",
    "Edit",
    "Mutation",
    "SWETask",
    "ScoringError",
    "TaskSet",
    "builtin_tasks",
    "channel_statuses",
    "evaluate",
    "generate_tasks",
    "is_test_file",
    "mutation_sites",
    "parse_pytest_report",
    "project_names",
    "reset_test_files",
    "run_scored",
    "validate_task",
]


SUBMIT_SENTINEL = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
"""mini-swe-agent's submit marker: a command whose output starts with it ends the task."""
DEFAULT_TEST_COMMAND = ("python -P -m pytest -o pythonpath=. -rA -q --tb=short "
                        "-p no:cacheprovider {tests}")
"""How tests run (``{tests}``: the shell-quoted test ids, empty for the whole suite).
``-P`` keeps the working tree off ``sys.path`` while pytest itself loads (a ``pytest.py``
in the tree cannot replace it); ``-o pythonpath=.`` then puts the tree first for the tests,
as ``python -m pytest`` would."""

_PROJECTS_DIR = "swe_projects"
_INDEX = ("swe_tasks", "index.json")


def _data_dir() -> Path:
    return Path(str(resources.files("treeroll"))) / "data"


def project_names() -> list[str]:
    """Names of the shipped projects."""
    return sorted(p.name for p in (_data_dir() / _PROJECTS_DIR).iterdir() if p.is_dir())


def _copy_project(project: str, dest: Path) -> None:
    source = _data_dir() / _PROJECTS_DIR / project
    if not source.is_dir():
        raise KeyError(f"unknown project {project!r}; shipped: {project_names()}")
    shutil.copytree(source, dest, dirs_exist_ok=True,
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc", ".pytest_cache"))


# --------------------------------------------------------------------------------------------
# Mutations
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Mutation:
    """Replace the source span ``[line:col, line:end_col)`` (1-based line, 0-based columns,
    one line) of ``file`` holding ``original`` by ``replacement``."""

    file: str
    line: int
    col: int
    end_col: int
    original: str
    replacement: str
    kind: str

    def apply(self, source: str) -> str:
        """The mutated source (``ValueError`` if the span does not hold ``original``)."""
        return self._swap(source, self.original, self.replacement)

    def revert(self, source: str) -> str:
        """Undo :meth:`apply`."""
        return self._swap(source, self.replacement, self.original)

    def _swap(self, source: str, old: str, new: str) -> str:
        lines = source.splitlines(keepends=True)
        text = lines[self.line - 1]
        if text[self.col:self.col + len(old)] != old:
            raise ValueError(f"{self.file}:{self.line} does not hold {old!r}")
        lines[self.line - 1] = text[:self.col] + new + text[self.col + len(old):]
        return "".join(lines)


_BINOP_SWAPS: dict[type, type] = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.FloorDiv,
                                  ast.Div: ast.Mult, ast.FloorDiv: ast.Div, ast.Mod: ast.FloorDiv,
                                  ast.Pow: ast.Mult}
_CMP_SWAPS: dict[type, type] = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE,
                                ast.GtE: ast.Gt, ast.Eq: ast.NotEq, ast.NotEq: ast.Eq,
                                ast.In: ast.NotIn, ast.NotIn: ast.In, ast.Is: ast.IsNot,
                                ast.IsNot: ast.Is}


def _local_names(function: ast.AST) -> list[str]:
    names: set[str] = set()
    for node in ast.walk(function):
        if isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
    return sorted(names - {"self", "cls", "_"})


def mutation_sites(source: str, file: str) -> list[Mutation]:
    """Every single-line mutation of ``source``, in a deterministic order."""
    tree = ast.parse(source)
    lines = source.splitlines()
    out: list[Mutation] = []

    def add(node: ast.AST, replacement_node: ast.AST | None, kind: str,
            replacement: str | None = None) -> None:
        line = getattr(node, "lineno", None)
        if line is None or node.end_lineno != line:  # type: ignore[attr-defined]
            return
        col, end = node.col_offset, node.end_col_offset  # type: ignore[attr-defined]
        original = lines[line - 1].encode()[col:end].decode()  # AST offsets are in bytes
        char_col = len(lines[line - 1].encode()[:col].decode())
        text = replacement if replacement is not None else ast.unparse(replacement_node or node)
        if text != original:
            out.append(Mutation(file, line, char_col, char_col + len(original), original, text,
                                kind))

    functions = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)]
    owner: dict[int, list[str]] = {}
    for function in functions:
        names = _local_names(function)
        for node in ast.walk(function):
            owner[id(node)] = names
    docstrings = {id(n.body[0]) for n in ast.walk(tree)
                  if isinstance(n, (ast.FunctionDef, ast.ClassDef, ast.Module)) and n.body
                  and isinstance(n.body[0], ast.Expr)
                  and isinstance(n.body[0].value, ast.Constant)}
    for node in ast.walk(tree):
        if isinstance(node, ast.BinOp) and type(node.op) in _BINOP_SWAPS:
            mutated: Any = copy.deepcopy(node)
            mutated.op = _BINOP_SWAPS[type(node.op)]()
            add(node, mutated, "swap_operator")
        elif isinstance(node, ast.Compare):
            for i, op in enumerate(node.ops):
                if type(op) in _CMP_SWAPS:
                    mutated = copy.deepcopy(node)
                    mutated.ops[i] = _CMP_SWAPS[type(op)]()
                    add(node, mutated, "swap_operator")
        elif isinstance(node, ast.BoolOp):
            mutated = copy.deepcopy(node)
            mutated.op = ast.Or() if isinstance(node.op, ast.And) else ast.And()
            add(node, mutated, "swap_operator")
        elif isinstance(node, ast.AugAssign) and type(node.op) in (ast.Add, ast.Sub):
            mutated = copy.deepcopy(node)
            mutated.op = ast.Sub() if isinstance(node.op, ast.Add) else ast.Add()
            add(node, mutated, "swap_operator")
        elif isinstance(node, ast.Constant) and isinstance(node.value, bool):
            add(node, None, "flip_boolean", repr(not node.value))
        elif isinstance(node, ast.Constant) and type(node.value) is int:
            add(node, None, "off_by_one", repr(node.value + 1))
            if node.value > 0:
                add(node, None, "off_by_one", repr(node.value - 1))
        elif isinstance(node, (ast.If, ast.While, ast.IfExp)):
            test = node.test
            add(test, None, "negate_condition", f"not ({ast.unparse(test)})")
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and id(node) in owner:
            others = [n for n in owner[id(node)] if n != node.id]
            if node.id in owner[id(node)] and others:
                choice = others[(node.lineno + node.col_offset) % len(others)]
                add(node, None, "wrong_variable", choice)
        elif isinstance(node, ast.Call) and len(node.args) >= 2 \
                and not any(isinstance(a, ast.Starred) for a in node.args[:2]):
            mutated = copy.deepcopy(node)
            mutated.args[0], mutated.args[1] = mutated.args[1], mutated.args[0]
            add(node, mutated, "swap_arguments")
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.Expr, ast.Return)) \
                and id(node) not in docstrings and id(node) in owner:
            add(node, None, "drop_statement", "pass")
    out.sort(key=lambda m: (m.file, m.line, m.col, m.kind, m.replacement))
    valid = []
    for mutation in out:
        try:
            ast.parse(mutation.apply(source))
        except (SyntaxError, ValueError):
            continue
        valid.append(mutation)
    return valid


# --------------------------------------------------------------------------------------------
# Tasks
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Edit:
    """Replace the unique occurrence of ``old`` in ``file`` by ``new``."""

    file: str
    old: str
    new: str


@dataclass(frozen=True)
class SWETask:
    """A working tree, a problem statement, and the tests that decide the reward.

    ``build(directory)`` writes the task's starting tree. Before evaluation every test file
    and the paths in ``test_paths`` are reset to the starting tree (an agent cannot pass by
    editing, adding or deleting tests) and ``eval_patch`` (SWE-bench's test patch) is
    applied. The reference fix is ``fix_edits`` (generated tasks) or ``reference_patch`` (a
    unified diff, SWE-bench's gold patch).
    """

    task_id: str
    problem_statement: str
    fail_to_pass: tuple[str, ...]
    pass_to_pass: tuple[str, ...]
    build: Callable[[Path], None] = field(repr=False, compare=False)
    buggy_files: tuple[str, ...] = ()
    test_paths: tuple[str, ...] = ()
    eval_patch: str = ""
    reference_patch: str = ""
    fix_edits: tuple[Edit, ...] = ()
    test_command: str = DEFAULT_TEST_COMMAND
    meta: Mapping[str, Any] = field(default_factory=dict, compare=False)

    @property
    def public_id(self) -> str:
        """The id observations show: a hash of ``task_id``, which for generated tasks names
        the mutation (``numkit-0000-drop_statement``), a hint no SWE-bench instance gives."""
        return hashlib.sha256(self.task_id.encode()).hexdigest()[:12]


class TaskSet(Sequence[SWETask]):
    """An ordered collection of tasks; ``reset(seed)`` uses ``tasks.for_seed(seed)``."""

    def __init__(self, tasks: Sequence[SWETask]) -> None:
        if not tasks:
            raise ValueError("a task set needs at least one task")
        self._tasks = list(tasks)
        self._by_id = {t.task_id: t for t in self._tasks}
        if len(self._by_id) != len(self._tasks):
            raise ValueError("task ids must be unique")
        self._by_id.update({t.public_id: t for t in self._tasks})

    def __len__(self) -> int:
        return len(self._tasks)

    def __getitem__(self, index: Any) -> Any:
        return self._tasks[index]

    def __iter__(self) -> Iterator[SWETask]:
        return iter(self._tasks)

    def for_seed(self, seed: int) -> SWETask:
        """The task a seed selects (``seed mod len``)."""
        return self._tasks[seed % len(self._tasks)]

    def by_id(self, task_id: str) -> SWETask:
        """Look a task up by its id or its public id (:attr:`SWETask.public_id`)."""
        try:
            return self._by_id[task_id]
        except KeyError:
            raise KeyError(f"no task {task_id!r} in this task set") from None


def _mutation_task(entry: Mapping[str, Any]) -> SWETask:
    mutation = Mutation(**entry["mutation"])
    project = entry["project"]

    def build(dest: Path) -> None:
        _copy_project(project, dest)
        target = dest / mutation.file
        target.write_text(mutation.apply(target.read_text()))

    source = (_data_dir() / _PROJECTS_DIR / project / mutation.file).read_text()
    lines = source.splitlines(keepends=True)
    mutated_lines = mutation.apply(source).splitlines(keepends=True)
    start = mutation.line - 1
    end = start + 1
    mutated_text = mutation.apply(source)
    while mutated_text.count("".join(mutated_lines[start:end])) > 1 and start > 0:
        start -= 1
    edit = Edit(mutation.file, "".join(mutated_lines[start:end]), "".join(lines[start:end]))
    return SWETask(
        task_id=entry["task_id"], problem_statement=entry["problem_statement"],
        fail_to_pass=tuple(entry["fail_to_pass"]), pass_to_pass=tuple(entry["pass_to_pass"]),
        build=build, buggy_files=(mutation.file,), test_paths=("tests",), fix_edits=(edit,),
        meta={"project": project, "kind": mutation.kind, "mutation": asdict(mutation)})


def builtin_tasks(index: str | Path | None = None) -> TaskSet:
    """The validated generated tasks shipped with treeroll (or those of another index)."""
    path = Path(index) if index is not None else _data_dir().joinpath(*_INDEX)
    entries = json.loads(path.read_text())["tasks"]
    return TaskSet([_mutation_task(e) for e in entries])


# --------------------------------------------------------------------------------------------
# Running tests
# --------------------------------------------------------------------------------------------

_REPORT = re.compile(r"^(PASSED|FAILED|ERROR|XFAIL|XPASS|SKIPPED) (\S+)")


_SUMMARY = re.compile(r"^=+ short test summary info =+$")


def parse_pytest_report(output: str) -> dict[str, str]:
    """Test id -> ``PASSED`` / ``FAILED`` / ``ERROR`` / ... from ``pytest -rA`` output.

    Only the last "short test summary info" section is read when there is one: report-like
    lines that the code under test printed earlier (captured output shown with a failure)
    are not pytest's verdict."""
    lines = output.splitlines()
    starts = [i for i, line in enumerate(lines) if _SUMMARY.match(line.strip())]
    statuses: dict[str, str] = {}
    for line in lines[starts[-1] + 1:] if starts else lines:
        match = _REPORT.match(line)
        if match:
            statuses.setdefault(match.group(2), match.group(1))
    return statuses


def _test_args(tests: Sequence[str]) -> str:
    files = sorted({t.split("::")[0] for t in tests})
    # pytest selects node ids directly; long lists select whole files then filter by report
    return " ".join(shlex.quote(t) for t in (tests if len(tests) <= 50 else files))


_TEST_FILE = re.compile(r"(^|/)(tests?|testing)(/|$)|(^|/)test_[^/]*\.py$|_tests?\.py$"
                        r"|(^|/)tests?\.py$|(^|/)conftest\.py$"
                        r"|(^|/)(\.?pytest\.(ini|toml)|setup\.cfg|tox\.ini|pyproject\.toml)$")
"""What counts as a test file when scoring: anything under a ``test``, ``tests`` or
``testing`` directory, ``test_*.py``, ``*_test.py``, ``*_tests.py``, ``test.py`` and
``tests.py`` (Django's), every ``conftest.py``, and the files pytest reads its settings from
(``pytest.ini``, ``.pytest.ini``, ``pytest.toml``, ``.pytest.toml``, ``setup.cfg``,
``tox.ini``, ``pyproject.toml``: an added ``addopts`` could load a plug-in that passes every
test)."""


def is_test_file(rel: str) -> bool:
    """True when the repository path ``rel`` is a test file (see ``_TEST_FILE``)."""
    return bool(_TEST_FILE.search(rel.replace("\\", "/")))


def _pristine_files(workspace: Workspace) -> list[str]:
    out: list[str] = []
    for dirpath, dirnames, filenames in os.walk(workspace.base):
        dirnames[:] = [d for d in dirnames if d != ".git"]
        rel_dir = os.path.relpath(dirpath, workspace.base)
        out.extend(os.path.normpath(os.path.join(rel_dir, name)) for name in filenames)
    return out


def _touched(workspace: Workspace) -> set[str]:
    """Paths of every entry this branch created, edited or replaced: regular files, links and
    anything else (a link named ``conftest.py`` is as much a test file as a file is)."""
    out = set(workspace.changed_files())
    for dirpath, dirnames, filenames in os.walk(workspace.upper):
        dirnames[:] = [d for d in dirnames if d != ".git"]
        rel_dir = os.path.relpath(dirpath, workspace.upper)
        for name in dirnames + filenames:
            full = os.path.join(dirpath, name)
            if stat.S_ISREG(os.lstat(full).st_mode) or stat.S_ISDIR(os.lstat(full).st_mode):
                continue  # regular files: changed_files compared them; directories: walked
            rel = os.path.normpath(os.path.join(rel_dir, name))
            original = workspace.base / rel
            if workspace.sandbox.mode == "copy" and original.is_symlink() and \
                    os.path.islink(full) and os.readlink(original) == os.readlink(full):
                continue  # copy mode copies the pristine links too
            out.add(rel)
    return out


def reset_test_files(workspace: Workspace, task: SWETask) -> list[str]:
    """Put every test file of ``workspace`` back as it is at the task's start (SWE-bench's
    ``git checkout base_commit -- <tests>``, extended from the files ``test_patch`` names to
    every test file and to the files the test ids name): edited ones are restored, created
    ones (files or links) deleted, deleted ones brought back, and ``task.test_paths``
    restored whole. Returns the paths reset."""
    named = {t.split("::")[0] for t in (*task.fail_to_pass, *task.pass_to_pass)}
    touched = {rel for rel in _touched(workspace) if is_test_file(rel) or rel in named}
    missing = {rel for rel in _pristine_files(workspace)
               if (is_test_file(rel) or rel in named) and workspace.read_bytes(rel) is None}
    targets = sorted(touched | missing | set(task.test_paths))
    for rel in targets:
        workspace.restore(rel)
    for rel in sorted(missing):  # still hidden: an ancestor was deleted and made again
        if workspace.read_bytes(rel) is None:
            parts = Path(rel).parts
            ancestor = next((str(Path(*parts[:i])) for i in range(1, len(parts))
                             if is_test_file(str(Path(*parts[:i])) + "/")), None)
            if ancestor is not None:
                workspace.restore(ancestor)
                targets.append(ancestor)
    return targets


def evaluate(sandbox: Sandbox, workspace: Workspace, task: SWETask,
             tests: Sequence[str] | None = None, *, timeout_s: float = 120.0) -> dict[str, bool]:
    """Run ``tests`` (default: FAIL_TO_PASS + PASS_TO_PASS) the way SWE-bench scores them, in
    a fresh copy of ``workspace``: every test file reset to the task's start
    (:func:`reset_test_files`), then the test patch applied (if it does not apply, every test
    counts as failed), then the task's test command; return test id -> passed."""
    selected = list(tests) if tests is not None else [*task.fail_to_pass, *task.pass_to_pass]
    fresh = workspace.fork()
    try:
        reset_test_files(fresh, task)
        if task.eval_patch:
            applied = sandbox.run(fresh, "git apply -", stdin=task.eval_patch)
            if applied.returncode != 0:
                return dict.fromkeys(selected, False)
        statuses = run_scored(sandbox, fresh, task.test_command.format(
            tests=_test_args(selected)), timeout_s=timeout_s)
    finally:
        fresh.remove()
    return {t: statuses.get(t) == "PASSED" for t in selected}


class ScoringError(RuntimeError):
    """The tests could not run (no pytest, a command that never reached pytest): an error
    in the episode's record, never a reward of 0."""


def run_scored(sandbox: Sandbox, workspace: Workspace, command: str, *,
               timeout_s: float) -> dict[str, str]:
    """Run a pytest ``command`` in ``workspace`` with the scoring plugin
    (:mod:`treeroll.envs.swe.scoring_channel`) and return test id -> ``PASSED`` /
    ``FAILED`` / ``ERROR`` / ``SKIPPED`` from its channel: a file outside the sandbox,
    written through a descriptor the command inherits, each line carrying a token read from a
    second descriptor. What the tests print is never read; lines without the token, and lines
    after the session's end, are ignored; a test passes only if every record of it passed.
    Raises :class:`ScoringError` when the session never ended (pytest missing, the command
    failed before it, the wall timeout)."""
    token = secrets.token_hex(16)
    results_dir = sandbox.root / "results"
    results_dir.mkdir(mode=0o700, exist_ok=True)
    handle, path = tempfile.mkstemp(dir=results_dir)
    read_end, write_end = os.pipe()
    os.write(write_end, token.encode())
    os.close(write_end)
    try:
        result = sandbox.run(workspace, command, timeout_s=timeout_s,
                             pass_fds=(handle, read_end),
                             extra_env={"TREEROLL_SCORING_FDS": f"{handle},{read_end}",
                                        "PYTHONPATH": sandbox.scoring_path,
                                        "PYTEST_ADDOPTS": f"-p {sandbox.scoring_module}"})
    finally:
        os.close(handle)
        os.close(read_end)
    try:
        text = Path(path).read_text(errors="replace")
    finally:
        os.unlink(path)
    statuses, done = channel_statuses(text, token)
    if not done:
        why = ("timed out" if result.timed_out else result.error or
               f"exit code {result.returncode}")
        raise ScoringError(f"the tests could not run ({why}): "
                           f"{result.output.strip()[-300:] or 'no output'}")
    return statuses


def channel_statuses(text: str, token: str) -> tuple[dict[str, str], bool]:
    """Test id -> status from the scoring plugin's lines (see :func:`run_scored`), and
    whether its session-end line came."""
    phases: dict[str, list[tuple[str, str]]] = {}
    broken: list[str] = []
    for line in text.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if not isinstance(record, dict) or record.get("token") != token:
            continue
        if record.get("done"):
            break
        nodeid, when, outcome = (str(record.get(k)) for k in ("nodeid", "when", "outcome"))
        if when == "collect":
            broken.append(nodeid)
        phases.setdefault(nodeid, []).append((when, outcome))
    else:
        return _combine(phases, broken), False
    return _combine(phases, broken), True


def _combine(phases: dict[str, list[tuple[str, str]]], broken: list[str]) -> dict[str, str]:
    statuses = {}
    for nodeid, records in phases.items():
        if any(nodeid.startswith(b + "::") or nodeid == b for b in broken):
            statuses[nodeid] = "ERROR"
        elif any(outcome == "failed" for _, outcome in records):
            statuses[nodeid] = "FAILED" if ("call", "failed") in records else "ERROR"
        elif ("call", "passed") in records:
            statuses[nodeid] = "PASSED"
        else:
            statuses[nodeid] = "SKIPPED"
    return statuses


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
    readme = (_data_dir() / _PROJECTS_DIR / project / "README.md").read_text().strip()
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
        _copy_project(project, dest)
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
            root = _data_dir() / _PROJECTS_DIR / project
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


def validate_task(task: SWETask, sandbox: Sandbox) -> tuple[bool, str]:
    """Check that ``task`` fails before and passes after its reference fix.

    Returns ``(ok, reason)``: before the fix every FAIL_TO_PASS test fails and every
    PASS_TO_PASS test passes; after it, all of them pass.
    """
    base = sandbox.base(f"task:{task.task_id}", task.build)
    workspace = sandbox.workspace(base)
    try:
        before = evaluate(sandbox, workspace, task)
        if any(before[t] for t in task.fail_to_pass):
            return False, "a FAIL_TO_PASS test passes before the fix"
        if not all(before[t] for t in task.pass_to_pass):
            return False, "a PASS_TO_PASS test fails before the fix"
        apply_reference_fix(sandbox, workspace, task)
        after = evaluate(sandbox, workspace, task)
        failed = [t for t, ok in after.items() if not ok]
        if failed:
            return False, f"tests still fail after the reference fix: {failed[:5]}"
        return True, "ok"
    finally:
        workspace.remove()


def apply_reference_fix(sandbox: Sandbox, workspace: Workspace, task: SWETask) -> None:
    """Apply the task's reference fix to ``workspace`` (through the sandbox)."""
    if task.reference_patch:
        sandbox.run(workspace, "git apply -", stdin=task.reference_patch)
    for edit in task.fix_edits:
        script = ("import json, sys, pathlib\n"
                  "e = json.loads(sys.stdin.read())\n"
                  "p = pathlib.Path(e['file'])\n"
                  "p.write_text(p.read_text().replace(e['old'], e['new'], 1))\n")
        sandbox.run(workspace, f"python -c {shlex.quote(script)}",
                    stdin=json.dumps(asdict(edit)))


# --------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    """``--generate N`` writes a validated index; ``--validate-all`` / ``--validate K``
    re-checks shipped tasks (each must fail before and pass after its reference fix)."""
    parser = argparse.ArgumentParser(prog="python -m treeroll.envs.swe",
                                     description=main.__doc__)
    parser.add_argument("--generate", type=int, default=0, help="tasks to generate")
    parser.add_argument("--seed", type=int, default=0, help="generation / sampling seed")
    parser.add_argument("--out", type=Path, default=None, help="index file to write")
    parser.add_argument("--validate-all", action="store_true", help="re-check every task")
    parser.add_argument("--validate", type=int, default=0, help="re-check K random tasks")
    parser.add_argument("--index", type=Path, default=None, help="index to validate")
    args = parser.parse_args(argv)
    if args.generate:
        entries = generate_tasks(args.generate, seed=args.seed,
                                 log=lambda m: print(m, file=sys.stderr))
        out = args.out or _data_dir().joinpath(*_INDEX)
        out.parent.mkdir(parents=True, exist_ok=True)
        rows = ",\n".join(json.dumps(e, separators=(",", ":")) for e in entries)
        out.write_text(f'{{"format": "treeroll.swe_tasks/1", "seed": {args.seed}, "tasks": [\n'
                       f"{rows}\n]}}\n")
        print(json.dumps({"generated": len(entries), "out": str(out)}))
    if args.validate_all or args.validate:
        tasks = list(builtin_tasks(args.index))
        if not args.validate_all:
            tasks = random.Random(args.seed).sample(tasks, min(args.validate, len(tasks)))
        sandbox = Sandbox()
        bad = []
        try:
            for task in tasks:
                ok, reason = validate_task(task, sandbox)
                if not ok:
                    bad.append((task.task_id, reason))
                    print(f"FAIL {task.task_id}: {reason}", file=sys.stderr)
        finally:
            sandbox.close()
        print(json.dumps({"validated": len(tasks) - len(bad), "failed": len(bad)}))
        return 1 if bad else 0
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
