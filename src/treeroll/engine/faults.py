"""Faults of plug-ins contained per branch: an environment or process scorer that raises
marks the node it was working on ``failed`` (``NodeStatus.FAILED``, the error in
``node.note``) instead of ending the batch. Used by :mod:`treeroll.engine.loop`."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from treeroll.base import Env, ProcessScorer, Score, StepResult
from treeroll.tree import Node, NodeStatus, RolloutTree

__all__ = ["ENV_ERROR", "ContainedScorer", "contained", "describe", "fail", "safe_step",
           "timed_step"]

ENV_ERROR = "treeroll_env_error"
"""``info`` key of a step whose environment raised (the engine's own, never an env's)."""


def describe(err: Exception) -> str:
    """The error as one short line: its type and message."""
    return f"{type(err).__name__}: {err}"[:500]


def safe_step(env: Env, action: str) -> StepResult:
    """``env.step(action)``; an exception becomes a truncated step whose ``info`` holds it."""
    try:
        return env.step(action)
    except Exception as err:  # a plug-in environment's bug must not end the batch
        return "", 0.0, False, True, {ENV_ERROR: describe(err)}


def timed_step(env: Env, action: str) -> tuple[StepResult, float]:
    """:func:`safe_step` and the seconds it took (for a worker thread)."""
    tick = time.perf_counter()
    result = safe_step(env, action)
    return result, time.perf_counter() - tick


@dataclass
class ContainedScorer:
    """A process scorer whose exceptions (or wrong number of scores) mark the nodes it was
    scoring as failed instead of ending the batch; they get score 0 meanwhile."""

    scorer: ProcessScorer
    failed: dict[int, str] = field(default_factory=dict)
    """``id(node)`` -> the error, for the engine to apply after the strategy's ``step``."""

    def __call__(self, tree: RolloutTree, nodes: Sequence[Node]) -> list[Score]:
        try:
            scores = list(self.scorer(tree, nodes))
            if len(scores) != len(nodes):
                raise ValueError(f"returned {len(scores)} scores for {len(nodes)} nodes")
            return scores
        except Exception as err:  # a plug-in scorer's bug must not end the batch
            for node in nodes:
                self.failed[id(node)] = f"the process scorer raised {describe(err)}"
            return [Score(0.0, "scorer error")] * len(nodes)


def fail(node: Node, note: str) -> None:
    """Mark ``node`` failed (a leaf) or note the failure (a node with children)."""
    node.note = note
    if not node.children:
        node.status = NodeStatus.FAILED
    node.env = None


def contained(tree: RolloutTree, scorer: ProcessScorer | None, broken: set[int],
              entries: Sequence[Node]) -> list[Node]:
    """Apply a :class:`ContainedScorer`'s failures to their nodes of ``tree`` (noting them in
    ``broken``), and drop the ``entries`` that continue a failed or broken node: such a node
    is never continued."""
    if isinstance(scorer, ContainedScorer) and scorer.failed:
        for node in tree.nodes:
            if id(node) in scorer.failed:
                fail(node, scorer.failed.pop(id(node)))
                broken.add(node.id)
    return [e for e in entries if e.status != NodeStatus.FAILED and e.id not in broken]
