"""SWE-bench-format instances over the user's own git checkouts, validated when loaded.

One JSON object per line with SWE-bench's fields (``instance_id``, ``repo``, ``base_commit``,
``patch``, ``test_patch``, ``problem_statement``, ``FAIL_TO_PASS``, ``PASS_TO_PASS``; the test
lists may be JSON strings as on the Hugging Face hub) and two optional ones treeroll honours:
``repo_path`` (this instance's checkout; relative paths are read from the JSONL file's folder)
and ``test_command`` (this instance's test command, ``{tests}`` standing for the selected test
ids; appended when absent). Other fields (``version``, ``hints_text``, ...) are ignored.

Checked at load, before any work starts: each line is UTF-8 and parses, every required field
is there with the right type, the checkout is found and is a git repository, ``base_commit``
is a full commit hash that exists in it (a branch name could point at the fixed commit),
every test id is a pytest node id inside the repository (treeroll scores with pytest: Django-
and sympy-style ids are refused), the patches name only paths inside the repository, the test
command formats and sets none of the variables the scorer sets (``PYTHONPATH``,
``PYTEST_PLUGINS``, ...: they would put the tree back in the scorer's path). Every problem
found is reported, each with the file, line, instance and field. Not checked at load:
whether the patches apply (the test patch is applied at scoring, where one that does not
apply fails every test; ``validate_task`` applies the gold patch).
The starting tree is ``git archive``'s: files marked ``export-ignore`` and submodules are not
in it.
"""

from __future__ import annotations

import json
import re
import subprocess
import tarfile
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from treeroll.envs.swe.scoring import SCORING_VARIABLES
from treeroll.envs.swe.tasks import DEFAULT_TEST_COMMAND, SWETask, TaskSet

__all__ = ["SWEInstanceError", "load_swebench_jsonl"]

_REQUIRED = ("instance_id", "repo", "base_commit", "problem_statement", "FAIL_TO_PASS")
_TEXT_FIELDS = ("instance_id", "repo", "base_commit", "problem_statement", "patch",
                "test_patch", "repo_path", "test_command")
_NODE_ID = re.compile(r"^[^\s:/][^:\n]*\.py(::[^\n]+)?$")
_COMMIT = re.compile(r"^([0-9a-f]{40}|[0-9a-f]{64})$")


class SWEInstanceError(ValueError):
    """A SWE-bench JSONL file with problems; ``problems`` lists each as
    ``file:line: instance 'id': field 'name': what is wrong``."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        shown = "\n  ".join(problems[:20])
        more = f"\n  ... and {len(problems) - 20} more" if len(problems) > 20 else ""
        super().__init__(f"{len(problems)} problem(s) in SWE-bench instances:\n  {shown}{more}")


def _patch_files(patch: str) -> tuple[str, ...]:
    return tuple(dict.fromkeys(re.findall(r"^diff --git a/(\S+) b/", patch, flags=re.M)))


def _test_list(value: Any) -> list[str]:
    """A test list as SWE-bench stores it: a list, or a JSON string of one (empty = none)."""
    if isinstance(value, str):
        value = json.loads(value) if value.strip() else []
    if not isinstance(value, list) or not all(isinstance(t, str) for t in value):
        raise ValueError(f"must be a list of test ids (or a JSON string of one), got "
                         f"{type(value).__name__}")
    return value


def _candidates(repo: str, repos: str | Path | Mapping[str, str | Path] | None) -> list[Path]:
    if repos is None:
        return []
    if isinstance(repos, Mapping):
        return [Path(repos[repo])] if repo in repos else []
    root = Path(repos)
    owner, _, name = repo.partition("/")
    return [root / repo.replace("/", "__"), root / name, root / owner / name, root]


def _find_checkout(row: Mapping[str, Any], here: Path,
                   repos: str | Path | Mapping[str, str | Path] | None) -> Path:
    if row.get("repo_path"):
        path = Path(row["repo_path"]).expanduser()
        path = path if path.is_absolute() else here / path
        if not (path / ".git").exists():
            raise LookupError(("repo_path", f"{path} is not a git checkout"))
        return path
    tried = _candidates(row["repo"], repos)
    for path in tried:
        if (path / ".git").exists():
            return path
    where = ", ".join(str(p) for p in tried) or "nowhere (no repos given)"
    raise LookupError(("repo", f"no git checkout of {row['repo']!r}: looked in {where}; give "
                               "repos (a folder or a mapping) or the instance's repo_path"))


def _inside(path: str) -> bool:
    """True for a relative path that stays inside the repository."""
    parts = Path(path).parts
    return bool(parts) and not Path(path).is_absolute() and ".." not in parts


def _commit_exists(checkout: Path, commit: str) -> bool:
    done = subprocess.run(["git", "-C", str(checkout), "cat-file", "-e", f"{commit}^{{commit}}"],
                          capture_output=True)
    return done.returncode == 0


def _check_row(row: Any, here: Path, repos: Any,
               test_command: str) -> tuple[list[tuple[str, str]], dict[str, Any]]:
    """Problems of one instance as ``(field, what)``, and what a task needs when none."""
    if not isinstance(row, dict):
        return [("-", f"a line must hold a JSON object, got {type(row).__name__}")], {}
    problems = [(name, "is missing") for name in _REQUIRED if name not in row]
    problems += [(name, f"must be a string, got {type(row[name]).__name__}")
                 for name in _TEXT_FIELDS if name in row and not isinstance(row[name], str)]
    if problems:
        return problems, {}
    lists: dict[str, list[str]] = {}
    for name in ("FAIL_TO_PASS", "PASS_TO_PASS"):
        try:
            lists[name] = _test_list(row.get(name, []))
        except (ValueError, json.JSONDecodeError) as err:
            problems.append((name, str(err)))
            continue
        bad = [t for t in lists[name] if not _NODE_ID.match(t) or not _inside(t.split("::")[0])]
        if bad:
            problems.append((name, f"{bad[0]!r} is not a pytest node id inside the repository "
                                   "('path/to/test_file.py::test_name'); treeroll scores with "
                                   "pytest"))
    for name in ("patch", "test_patch"):
        outside = [f for f in _patch_files(row.get(name, "")) if not _inside(f)]
        if outside:
            problems.append((name, f"names {outside[0]!r}, a path outside the repository"))
    if "FAIL_TO_PASS" in lists and not lists["FAIL_TO_PASS"]:
        problems.append(("FAIL_TO_PASS", "is empty: an instance needs a failing test to fix"))
    command = row.get("test_command") or test_command
    if "{tests}" not in command:
        command = command + " {tests}"
    try:
        command.format(tests="t")
    except (KeyError, IndexError, ValueError) as err:
        problems.append(("test_command", f"{command!r} does not format with {{tests}} "
                                         f"only ({err!r}); double other braces"))
    overridden = [name for name in SCORING_VARIABLES if name in command]
    if overridden:
        problems.append(("test_command", f"sets {overridden[0]}, which the scorer sets to keep "
                                         "the tree out of its path; put the tree on sys.path "
                                         "with pytest's -o pythonpath=. instead"))
    checkout = None
    try:
        checkout = _find_checkout(row, here, repos)
    except LookupError as err:
        problems.append(err.args[0])
    if not _COMMIT.match(row["base_commit"]):
        problems.append(("base_commit", f"{row['base_commit']!r} is not a full commit hash "
                                        "(40 or 64 lowercase hex digits)"))
    elif checkout is not None and not _commit_exists(checkout, row["base_commit"]):
        problems.append(("base_commit", f"{row['base_commit']!r} is not a commit of {checkout}"))
    return problems, {"checkout": checkout, "command": command, **lists}


def _archive_builder(checkout: Path, commit: str) -> Any:
    def build(dest: Path) -> None:
        with tempfile.TemporaryFile() as archive:
            subprocess.run(["git", "-C", str(checkout), "archive", "--format=tar", commit],
                           stdout=archive, check=True)
            archive.seek(0)
            with tarfile.open(fileobj=archive) as tar:
                tar.extractall(dest, filter="data")
    return build


def load_swebench_jsonl(path: str | Path,
                        repos: str | Path | Mapping[str, str | Path] | None = None, *,
                        test_command: str = DEFAULT_TEST_COMMAND) -> TaskSet:
    """The SWE-bench-format instances of the JSONL file ``path``, validated (see the module
    docstring); raises :class:`SWEInstanceError` listing every problem found.

    ``repos``: a mapping from the ``repo`` field (``owner/name``) to a checkout, or one folder
    that holds checkouts named ``owner__name``, ``name`` or ``owner/name`` or is itself the
    checkout; an instance's ``repo_path`` wins over both. The starting tree is
    ``git archive base_commit`` of the checkout (the checkout itself is never shown to the
    agent), the gold patch is the reference fix, and scoring resets every test file and
    applies the test patch (:func:`treeroll.envs.swe.tasks.evaluate`). No Docker: the tests
    run with treeroll's Python unless the test command says otherwise.
    """
    source = Path(path)
    if not source.is_file():
        raise FileNotFoundError(f"SWE-bench instances file {source} does not exist")
    here = source.resolve().parent
    problems: list[str] = []
    tasks: list[SWETask] = []
    seen: dict[str, int] = {}
    for lineno, raw in enumerate(source.read_bytes().splitlines(), start=1):
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as err:
            problems.append(f"{source}:{lineno}: not UTF-8 (byte {err.start + 1})")
            continue
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            problems.append(f"{source}:{lineno}: not JSON ({err.msg} at column {err.colno})")
            continue
        iid = row.get("instance_id", "?") if isinstance(row, dict) else "?"
        found, parts = _check_row(row, here, repos, test_command)
        if isinstance(iid, str) and iid in seen:
            found.append(("instance_id", f"repeats line {seen[iid]}"))
        seen.setdefault(str(iid), lineno)
        problems += [f"{source}:{lineno}: instance {iid!r}: field {name!r}: {what}"
                     for name, what in found]
        if found:
            continue
        tasks.append(SWETask(
            task_id=row["instance_id"], problem_statement=row["problem_statement"],
            fail_to_pass=tuple(parts["FAIL_TO_PASS"]),
            pass_to_pass=tuple(parts["PASS_TO_PASS"]),
            build=_archive_builder(parts["checkout"], row["base_commit"]),
            buggy_files=_patch_files(row.get("patch", "")),
            test_paths=_patch_files(row.get("test_patch", "")),
            eval_patch=row.get("test_patch", ""), reference_patch=row.get("patch", ""),
            test_command=parts["command"],
            meta={"repo": row["repo"], "base_commit": row["base_commit"],
                  "checkout": str(parts["checkout"]), "line": lineno}))
    if problems:
        raise SWEInstanceError(problems)
    if not tasks:
        raise SWEInstanceError([f"{source}: holds no instances"])
    return TaskSet(tasks)
