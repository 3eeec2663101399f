"""IGRPO as treeroll defines it: expansion budget spent where it informs most (docs/methods.md).

Only IGRPO's abstract is public (budget-aware tree rollouts that allocate expansions by each
node's informativeness, progressively suppress unpromising branches, and optimise toward the
"limiting teacher distribution" the allocation induces). treeroll's definition:

* ``initial`` chains run to their end; then, in rounds, the budget of ``m`` leaves is spent
  greedily on the nodes of highest *information gain*, ``per_round`` at a time, each picked
  node getting one new continuation run to its end;
* a node's posterior over the success of continuing from it is ``Beta(1 + s, 1 + f)``, ``s``
  and ``f`` the rewarded and unrewarded leaves below it (reward > 0 counts as a success);
  the gain of one more expansion is the expected drop of that posterior's variance after one
  more outcome (closed form), times the number of leaves whose advantage depends on the node
  (the leaves below it);
* a node whose gain is below ``threshold`` is suppressed: never picked again;
  leaves (ended turns) are never picked;
* every leaf records a weight in ``leaf.info["sample_weight"]``, which the trainer multiplies
  its advantage by. ``weights="unbiased"``: the product over the leaf's ancestors of
  ``1 / (their number of children)``, normalised to mean 1 over the group: the nested average
  that treats each node's children as samples of the policy's continuations from it, so a
  prefix expanded more often than a chain sampler would does not weigh more (a chain group
  gets all 1; the estimate ignores that the expansions were chosen after seeing outcomes,
  which is treeroll's approximation). ``weights="teacher"`` (the paper's framing): all 1, so
  the update follows the tilted distribution the allocation induces.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

from treeroll.base import StrategyContext, tree_state
from treeroll.checks import checked
from treeroll.strategies.common import continue_or_open
from treeroll.tree import (
    Node,
    RolloutTree,
    leaves,
    leaves_below,
    path_to,
    trajectory_reward,
)

__all__ = ["IGRPO", "IGRPOState", "beta_gain"]


@dataclass
class IGRPOState:
    """IGRPO's state of one task's tree."""

    suppressed: set[int] = field(default_factory=set)
    """Nodes whose gain fell below the threshold: never expanded again."""


def beta_gain(successes: int, failures: int) -> float:
    """Expected drop of the variance of ``Beta(1 + successes, 1 + failures)`` after observing
    one more outcome drawn from its own predictive distribution."""
    a, b = 1.0 + successes, 1.0 + failures

    def var(x: float, y: float) -> float:
        return x * y / ((x + y) ** 2 * (x + y + 1))

    p = a / (a + b)
    return var(a, b) - (p * var(a + 1, b) + (1 - p) * var(a, b + 1))


@dataclass
class IGRPO:
    """Information-gain-guided expansion of a task's tree (treeroll's definition)."""

    m: int = checked(8, ge=1)
    """Leaves per task in all."""
    initial: int | None = checked(None, ge=1)
    """Chains started from the root (None: ``m // 2``, at least 1)."""
    per_round: int = checked(2, ge=1)
    """Nodes expanded per round (the highest gains, distinct nodes)."""
    threshold: float = checked(0.0, ge=0)
    """Nodes whose gain is below this are suppressed."""
    weights: str = checked("unbiased", choices=("unbiased", "teacher"))
    """Leaf weights: ``unbiased`` (inverse of the allocation's over-sampling) or ``teacher``
    (all 1: train toward the tilted distribution)."""

    name: ClassVar[str] = "igrpo"
    revisits_nodes: ClassVar[bool] = True

    def start(self, tree: RolloutTree, ctx: StrategyContext) -> list[Node]:
        """The first chains."""
        first = min(self.m, self.initial if self.initial is not None else max(1, self.m // 2))
        ctx.state = IGRPOState()
        return [tree.root] * first

    def gains(self, tree: RolloutTree) -> dict[int, float]:
        """Information gain of every node that may still be expanded (node id -> gain)."""
        group = leaves(tree)
        won = [trajectory_reward(leaf) > 0 for leaf in group]
        gains: dict[int, float] = {}
        below = leaves_below(tree, group)
        for node in tree.nodes:
            if node.id in below and not node.ended:
                n = len(below[node.id])
                s = sum(won[i] for i in below[node.id])
                gains[node.id] = beta_gain(s, n - s) * n
        return gains

    def step(self, tree: RolloutTree, created: list[Node], ctx: StrategyContext) -> list[Node]:
        """Continue live branches; once all have ended, expand the highest-gain nodes."""
        frontier, room = continue_or_open(tree, created, self.m)
        if frontier or room <= 0:
            return frontier
        suppressed = tree_state(ctx, IGRPOState).suppressed
        gains = self.gains(tree)
        for node_id, gain in gains.items():
            if gain < self.threshold:
                suppressed.add(node_id)
        ranked = sorted((i for i in gains if i not in suppressed), key=lambda i: (-gains[i], i))
        picks = [tree.nodes[i] for i in ranked[:min(self.per_round, room)]]
        for node in picks:
            node.note = f"IGRPO gain {gains[node.id]:.4f}"
        return picks

    def finish(self, tree: RolloutTree, ctx: StrategyContext) -> None:
        """The rollout has ended, however (schedule or budget): weigh the leaves."""
        self._weigh(tree)

    def _weigh(self, tree: RolloutTree) -> None:
        """Record each leaf's sampling weight (see the module docstring)."""
        group = leaves(tree)
        raw = np.ones(len(group))
        if self.weights == "unbiased":
            for index, leaf in enumerate(group):
                for node in path_to(leaf)[:-1]:
                    raw[index] /= len(node.children)
            raw = raw / raw.mean() if len(raw) else raw
        for leaf, value in zip(group, raw, strict=True):
            leaf.info["sample_weight"] = float(value)

    def keeps_snapshot(self, tree: RolloutTree, node: Node, ctx: StrategyContext) -> bool:
        """Any node may be expanded while leaves are left."""
        return len(leaves(tree)) < self.m
