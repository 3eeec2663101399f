"""A process scorer for SWE trajectories (PATR's task heuristic for coding agents).

Signals read from the environment after a node's step (``node.env``, an :class:`SWEEnv`):

* ``opened``: some action so far names the file that holds the bug (or its basename);
* ``edited``: the working tree's changed files include that file;
* ``parses``: every changed ``.py`` file parses (0.5 when nothing was edited yet), checked
  inside the sandbox (:func:`parse_errors`), cached by the content of the changed files;
* ``tests``: the fraction of FAIL_TO_PASS tests that pass in a fresh copy of the tree -- run
  only when the tree differs from the pristine one, cached by the content of the changed
  files (so siblings with the same edits share one run);
* ``repeats``: the longest run of identical consecutive actions at the end of the history;
* ``format``: the share of replies that were format errors.

They are blended linearly with :class:`SWEScoreWeights`; a successful submission scores 1.0 and
a failed one 0.0. Wall time spent is accumulated in ``total_seconds`` (tests dominate it).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shlex
import time
from collections.abc import Sequence
from dataclasses import dataclass

from treeroll.base import Score
from treeroll.envs.swe.env import SWEEnv
from treeroll.envs.swe.sandbox import Sandbox, Workspace
from treeroll.envs.swe.tasks import ScoringError, evaluate
from treeroll.tree import Node, RolloutTree

__all__ = ["SWEProcessScorer", "SWEScoreWeights", "parse_errors"]

_PARSE = ("import ast, json, sys\nbroken = []\nfor path in json.loads(sys.stdin.read()):\n"
          "    try:\n        with open(path, 'rb') as handle:\n"
          "            ast.parse(handle.read())\n"
          "    except (SyntaxError, ValueError, RecursionError, MemoryError, OSError):\n"
          "        broken.append(path)\nprint(json.dumps(broken))\n")


def parse_errors(sandbox: Sandbox, workspace: Workspace, paths: list[str]) -> list[str]:
    """Which of the tree's ``.py`` files ``paths`` do not parse. Parsed inside the sandbox
    (``python -I -S``: none of the tree's code runs), under the command's limits: a file
    the agent made to exhaust a parser (a list literal of millions of items, nesting
    thousands deep) costs the host nothing; one that cannot be parsed within the limits
    counts as not parsing."""
    result = sandbox.run(workspace, f"python -I -S -c {shlex.quote(_PARSE)}",
                         stdin=json.dumps(paths))
    try:
        broken = json.loads(result.output.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return list(paths)
    if result.returncode != 0 or not isinstance(broken, list):
        return list(paths)
    return [path for path in paths if path in broken]


@dataclass(frozen=True)
class SWEScoreWeights:
    """Weights of the blended score (normalised by their sum)."""

    opened: float = 0.10
    edited: float = 0.15
    parses: float = 0.10
    tests: float = 0.45
    no_repeats: float = 0.10
    no_format_errors: float = 0.10

    def __post_init__(self) -> None:
        values = [self.opened, self.edited, self.parses, self.tests, self.no_repeats,
                  self.no_format_errors]
        if any(v < 0 for v in values) or sum(values) <= 0:
            raise ValueError("weights must be non-negative with a positive sum")


class SWEProcessScorer:
    """Scores partial SWE trajectories in ``[0, 1]``; implements ``treeroll.base.ProcessScorer``.

    ``run_tests=False`` skips the test signal (its weight then counts as 0).
    ``repeat_window``: a run of this many identical actions gives the full repeat penalty.
    """

    def __init__(self, *, weights: SWEScoreWeights | None = None, run_tests: bool = True,
                 repeat_window: int = 6, test_timeout_s: float = 60.0) -> None:
        if repeat_window < 2:
            raise ValueError("repeat_window must be >= 2")
        self.weights = weights or SWEScoreWeights()
        self.run_tests = run_tests
        self.repeat_window = repeat_window
        self.test_timeout_s = test_timeout_s
        self.total_seconds = 0.0
        """Wall time spent scoring so far."""
        self.test_runs = 0
        """Test runs made (cache misses)."""
        self._cache: dict[tuple[str, str], float] = {}
        self._parsed: dict[tuple[str, str, str], list[str]] = {}

    def __call__(self, tree: RolloutTree, nodes: Sequence[Node]) -> list[Score]:
        """One score per node, from ``node.env`` (the environment after the node's step)."""
        start = time.perf_counter()
        try:
            return [self._score_node(node) for node in nodes]
        finally:
            self.total_seconds += time.perf_counter() - start

    def _score_node(self, node: Node) -> Score:
        env = node.env
        if not isinstance(env, SWEEnv) or env.task is None or env.workspace is None:
            return Score(0.5, "no SWE environment snapshot at this node")
        return self.score_env(env)

    def score_env(self, env: SWEEnv) -> Score:
        """Score the state of ``env`` (its history, working tree and counters)."""
        assert env.task is not None and env.workspace is not None
        if env.submitted or env.success:
            return Score(1.0 if env.success else 0.0,
                         "submitted: target tests pass" if env.success
                         else "submitted: target tests fail")
        task, workspace = env.task, env.workspace
        names = {path for path in task.buggy_files} | {os.path.basename(p)
                                                       for p in task.buggy_files}
        opened = float(any(name in action for action in env.history for name in names))
        changed = workspace.changed_files()
        edited = float(bool(set(changed) & set(task.buggy_files)))
        python = [p for p in changed if p.endswith(".py")]
        digest = hashlib.sha256()
        for rel in python:
            digest.update(os.fsencode(rel) + b"\0")
            with contextlib.suppress(OSError), open(workspace.upper / rel, "rb") as handle:
                digest.update(hashlib.file_digest(handle, "sha256").digest())
        parse_key = (task.task_id, "parse", digest.hexdigest())
        if python and parse_key not in self._parsed:
            self._parsed[parse_key] = parse_errors(env.sandbox, workspace, python)
        broken = self._parsed.get(parse_key, [])
        parses = 0.5 if not python else float(not broken)
        tests = 0.0
        ran = "unchanged tree"
        if self.run_tests and python and not broken:
            key = (task.task_id, digest.hexdigest())
            if key not in self._cache:
                try:
                    results = evaluate(env.sandbox, workspace, task, task.fail_to_pass,
                                       timeout_s=self.test_timeout_s)
                except ScoringError:  # a partial state's signal: no test passes
                    results = {}
                self._cache[key] = sum(results.values()) / max(len(results), 1)
                self.test_runs += 1
            tests = self._cache[key]
            ran = f"{tests:.0%} of FAIL_TO_PASS pass"
        elif broken:
            ran = "edits do not parse"
        run = 1
        for previous, current in zip(env.history[-2::-1], env.history[::-1], strict=False):
            if previous != current:
                break
            run += 1
        repeats = min(1.0, (run - 1) / (self.repeat_window - 1)) if env.history else 0.0
        format_rate = env.format_errors / max(env.steps, 1)
        w = self.weights
        test_weight = w.tests if self.run_tests else 0.0
        total = w.opened + w.edited + w.parses + test_weight + w.no_repeats + w.no_format_errors
        value = (w.opened * opened + w.edited * edited + w.parses * parses + test_weight * tests
                 + w.no_repeats * (1 - repeats) + w.no_format_errors * (1 - format_rate)) / total
        reason = (f"opened bug file: {'yes' if opened else 'no'}; edited it: "
                  f"{'yes' if edited else 'no'}; {len(changed)} file(s) changed"
                  f"{', parse errors in ' + ', '.join(broken) if broken else ''}; {ran}; "
                  f"last action repeated {run}x; {env.format_errors} format error(s)")
        return Score(min(1.0, max(0.0, value)), reason)
