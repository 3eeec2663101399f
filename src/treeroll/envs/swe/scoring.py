"""Scoring a submitted tree as SWE-bench does, with nothing of the tree in the scorer's path.

:func:`evaluate` forks the tree, resets every test file (:func:`reset_test_files`) and the
repository's ``.git`` to the task's start, applies the test patch with git reading no
configuration but the pristine repository's, and runs the task's test command through
:func:`run_scored`. That run gets a folder of its own, made for it and deleted after it
(shown read-only at :data:`~treeroll.envs.swe.jail.JAIL_SCORING` in overlay mode, for that
command only: no agent command can list it): the scoring plugin under a fresh random name
(:mod:`~treeroll.envs.swe.scoring_channel`), the launcher
(:mod:`~treeroll.envs.swe.scoring_site`, as ``sitecustomize.py``, imported at interpreter
start-up before the tree is on ``sys.path``), and the list of the modules the pristine tree
holds. pytest's plugin autoload is off for the run (a ``.dist-info`` folder in the tree
declares nothing); the launcher loads site-packages' plugins by name. Bytecode is read from
and written to a cache outside the tree (``PYTHONPYCACHEPREFIX``), so a forged
``__pycache__`` entry is never loaded.

A run that never reached the plugin (pytest missing, the sandbox failing) is treeroll's
error: :class:`ScoringError`. A run the tree's code stopped or bent after the plugin loaded
(``os._exit``, a hang past the timeout, the disk quota, a patched pytest caught by the
plugin's tripwire) scores every test failed: a reward of 0 in its group, never a dropped node.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import secrets
import shlex
import shutil
import stat
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from treeroll.envs.swe.filetree import scan_tree
from treeroll.envs.swe.jail import JAIL_SCORING
from treeroll.envs.swe.pytest_report import read_channel

if TYPE_CHECKING:
    from treeroll.envs.swe.command import CommandResult
    from treeroll.envs.swe.sandbox import Sandbox
    from treeroll.envs.swe.workspace import Workspace

__all__ = ["PLAIN_GIT", "SCORING_VARIABLES", "ScoringError", "evaluate", "is_test_file",
           "reset_test_files", "run_scored", "tree_modules"]


class ScoredTask(Protocol):
    """What scoring reads of a :class:`~treeroll.envs.swe.tasks.SWETask` (declared here
    rather than imported: the tasks module imports this one)."""

    @property
    def fail_to_pass(self) -> tuple[str, ...]: ...
    @property
    def pass_to_pass(self) -> tuple[str, ...]: ...
    @property
    def test_paths(self) -> tuple[str, ...]: ...
    @property
    def eval_patch(self) -> str: ...
    @property
    def test_command(self) -> str: ...


class ScoringError(RuntimeError):
    """The tests could not be started (no pytest, the sandbox failed, the scorer's own
    launcher broke): treeroll's error, not the agent's. The node fails (the engine counts
    it under ``status.failed``); it is never a reward."""


PLAIN_GIT = {"GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": "/dev/null",
             "GIT_ATTR_NOSYSTEM": "1"}
"""Environment of the scorer's git commands: no system or user configuration (a filter the
host's ``/etc/gitconfig`` defines cannot run), only the pristine repository's."""


SCORING_VARIABLES = ("PYTHONPATH", "PYTHONPYCACHEPREFIX", "PYTHONNOUSERSITE", "PYTEST_PLUGINS",
                     "PYTEST_ADDOPTS", "PYTEST_DISABLE_PLUGIN_AUTOLOAD", "TREEROLL_SCORING")
"""Environment variables (and prefixes) a scoring run's command gets from the scorer; a task's
test command may not set them (:mod:`~treeroll.envs.swe.swebench` refuses one that does)."""


# --------------------------------------------------------------------------------------------
# Test files
# --------------------------------------------------------------------------------------------

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
    return [rel for rel, st in scan_tree(workspace.base, skip=(".git",))
            if not stat.S_ISDIR(st.st_mode)]


def _touched(workspace: Workspace) -> set[str]:
    """Paths of every entry this branch created, edited or replaced: regular files, links and
    anything else (a link named ``conftest.py`` is as much a test file as a file is)."""
    out = set(workspace.changed_files())
    for rel, st in scan_tree(workspace.upper, skip=(".git",)):
        full = workspace.upper / rel
        if stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode):
            continue  # regular files: changed_files compared them; directories: walked
        original = workspace.base / rel
        if workspace.sandbox.mode == "copy" and os.path.islink(original) and \
                os.path.islink(full) and os.readlink(original) == os.readlink(full):
            continue  # copy mode copies the pristine links too
        out.add(rel)
    return out


def reset_test_files(workspace: Workspace, task: ScoredTask) -> list[str]:
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


# --------------------------------------------------------------------------------------------
# Scoring
# --------------------------------------------------------------------------------------------

def _test_args(tests: Sequence[str]) -> str:
    files = sorted({t.split("::")[0] for t in tests})
    # pytest selects node ids directly; long lists select whole files then filter by report
    return " ".join(shlex.quote(t) for t in (tests if len(tests) <= 50 else files))


def evaluate(sandbox: Sandbox, workspace: Workspace, task: ScoredTask,
             tests: Sequence[str] | None = None, *, timeout_s: float = 120.0,
             details: dict[str, Any] | None = None) -> dict[str, bool]:
    """Run ``tests`` (default: FAIL_TO_PASS + PASS_TO_PASS) the way SWE-bench scores them, in
    a fresh copy of ``workspace``: every test file reset to the task's start
    (:func:`reset_test_files`) and ``.git`` too (the scorer never runs the tree's git
    configuration, attributes or hooks), then the test patch applied (if it does not apply,
    every test counts as failed), then the task's test command; return test id -> passed.
    ``details``, when given, receives ``incomplete``: why the tests did not finish, when the
    tree's code stopped them (every test then counts as failed). Raises
    :class:`ScoringError` only for failures of treeroll's own making."""
    selected = list(tests) if tests is not None else [*task.fail_to_pass, *task.pass_to_pass]
    fresh = workspace.fork()
    try:
        reset_test_files(fresh, task)
        fresh.restore(".git")
        if task.eval_patch:
            applied = sandbox.run(fresh, "git apply -", stdin=task.eval_patch,
                                  extra_env=PLAIN_GIT)
            if applied.returncode != 0:
                return dict.fromkeys(selected, False)
        statuses = run_scored(sandbox, fresh, task.test_command.format(
            tests=_test_args(selected)), timeout_s=timeout_s, details=details)
    finally:
        fresh.remove()
    return {t: statuses.get(t) == "PASSED" for t in selected}


@functools.lru_cache(maxsize=64)
def tree_modules(base: Path) -> dict[str, Any]:
    """What a pristine tree provides to Python: ``modules``, each module or package name
    (``name.py``, a ``name`` folder, an extension ``name.*.so``) with the folders holding it
    (relative, ``.`` for the top), and ``metadata``, its ``.dist-info`` and ``.egg-info``
    entries. The launcher finds these as before, and in no other folder of the tree; the
    tree provides no other module that the standard library or site-packages holds, and no
    other metadata. Cached per tree (pristine trees never change)."""
    modules: dict[str, set[str]] = {}
    metadata: list[str] = []
    for rel, st in scan_tree(base, skip=(".git",)):
        folder, name = os.path.split(rel)
        if name.endswith((".dist-info", ".egg-info")):
            metadata.append(rel)
        module = name if stat.S_ISDIR(st.st_mode) else \
            name.split(".")[0] if name.endswith((".py", ".so")) else ""
        if module.isidentifier():
            modules.setdefault(module, set()).add(folder or ".")
    return {"modules": {name: sorted(folders) for name, folders in sorted(modules.items())},
            "metadata": sorted(metadata)}


def _plugin_name() -> str:
    """A fresh module name for one run's scoring plugin."""
    return f"_scoring_{secrets.token_hex(8)}"


@contextlib.contextmanager
def _scoring_folder(sandbox: Sandbox, workspace: Workspace) -> Iterator[tuple[Path, str, str]]:
    """A folder for one scoring run, deleted after it: ``(host path, path the command sees,
    plugin module name)``."""
    module = _plugin_name()
    folder = Path(tempfile.mkdtemp(prefix="scoring-", dir=sandbox.root))
    try:
        here = Path(__file__).parent
        shutil.copyfile(here / "scoring_channel.py", folder / f"{module}.py")
        shutil.copyfile(here / "scoring_site.py", folder / "sitecustomize.py")
        (folder / "tree_modules.json").write_text(json.dumps(tree_modules(workspace.base)))
        for path in folder.iterdir():
            os.chmod(path, 0o644)
        os.chmod(folder, 0o755)  # read by the sandbox user, whatever the umask
        yield folder, JAIL_SCORING if sandbox.mode == "overlay" else str(folder), module
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def run_scored(sandbox: Sandbox, workspace: Workspace, command: str, *, timeout_s: float,
               details: dict[str, Any] | None = None) -> dict[str, str]:
    """Run a pytest ``command`` in ``workspace`` with the scoring plugin
    (:mod:`treeroll.envs.swe.scoring_channel`) and return test id -> ``PASSED`` /
    ``FAILED`` / ``ERROR`` / ``SKIPPED`` from its channel: a file outside the sandbox,
    written through a descriptor the command inherits, each line carrying a token read from a
    second descriptor. What the tests print is never read; lines without the token, and lines
    after the session's end, are ignored; a test passes only if every record of it passed.

    A session the tree's code kept from starting or finishing (pytest failing before the
    plugin loads, no session end, the quota, the tripwire) returns ``{}`` and says why in
    ``details["incomplete"]``: a 0. Raises :class:`ScoringError` only for what is not the
    tree's doing: the sandbox could not start the command, or it never loaded the plugin and
    exited 0 (it did not run pytest), 126 or 127 (the shell could not find or run it)."""
    token = secrets.token_hex(16)
    results_dir = sandbox.root / "results"
    results_dir.mkdir(mode=0o700, exist_ok=True)
    handle, path = tempfile.mkstemp(dir=results_dir)
    read_end, write_end = os.pipe()
    os.write(write_end, token.encode())
    os.close(write_end)
    try:
        with _scoring_folder(sandbox, workspace) as (folder, inside, module):
            result = sandbox.run(workspace, command, timeout_s=timeout_s,
                                 pass_fds=(handle, read_end), scoring=folder, extra_env={
                                     "TREEROLL_SCORING_FDS": f"{handle},{read_end}",
                                     "TREEROLL_SCORING_TREE": workspace.path,
                                     "TREEROLL_SCORING_PLUGIN": module,
                                     "PYTHONPATH": inside,
                                     "PYTEST_PLUGINS": module,
                                     "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
                                     "PYTHONPYCACHEPREFIX": f"{inside}/pycache",
                                     "PYTHONNOUSERSITE": "1"})
    finally:
        os.close(handle)
        os.close(read_end)
    try:
        text = Path(path).read_text(errors="replace")
    finally:
        os.unlink(path)
    report = read_channel(text, token)
    if report.done and not report.tampered and not result.quota_exceeded:
        return report.statuses
    if result.error or (result.returncode in COMMAND_NOT_RUN and not report.started):
        # the sandbox could not start it, or the command never ran pytest: treeroll's (the
        # task's test command's) error, not the tree's
        why = result.error or f"exit code {result.returncode}"
        raise ScoringError(f"the tests could not run ({why}): "
                           f"{result.output.strip()[-300:] or 'no output'}")
    # The command ran: whatever kept the plugin from starting or finishing (a tree that
    # makes pytest fail before its plugins load, a run ended early or bent) is the tree's
    # doing, a 0 with its reason, never a node out of the group.
    if details is not None:
        details["incomplete"] = _why_incomplete(report.tampered, result, report.started,
                                                bool(report.statuses))
    return {}


COMMAND_NOT_RUN = (0, 126, 127)
"""Exit codes of a scoring command that never loaded the plugin through no doing of the tree:
it succeeded without running pytest (0), or the shell could not find or run it (126, 127).
The task's test command is at fault (``validate_task`` refuses such a task). Any other exit
before the plugin loaded is the tree's doing (a 0)."""


def _why_incomplete(tampered: str, result: CommandResult, started: bool = True,
                    reported: bool = True) -> str:
    if tampered:
        return f"the tests changed pytest ({tampered})"
    if result.quota_exceeded:
        return "the tests exceeded the working tree's quota"
    output = result.output.strip()[-200:] or "no output"
    if not started:
        return ("pytest stopped before the scoring plugin loaded (exit code "
                f"{result.returncode}): {output}")
    return "the tests did not finish (" + (
        "timed out" if result.timed_out else f"exit code {result.returncode}") + ")" + (
        "" if reported else f" before any test was reported: {output}")
