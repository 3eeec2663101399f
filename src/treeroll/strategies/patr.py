"""``patr``: PATR (docs/methods.md): B0 branches, advance K turns, score, expand the
top-k into M children each, let the middle survive, prune ``s < median(s) - alpha`` or Theta
repeats of one action; pruned branches stay in the group as negatives (option)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from treeroll.base import StrategyContext, tree_state
from treeroll.strategies.common import active_branches, repeated_action
from treeroll.tree import Node, NodeStatus, RolloutTree

__all__ = ["PATR", "PATRState"]


@dataclass
class PATRState:
    """PATR's state of one task's tree."""

    since_score: int = 0
    """Turns since the last scoring round (one every ``k_turns``)."""


@dataclass
class PATR:
    """Process-scorer guided Adaptive Tree Rollout (docs/methods.md).

    Every ``k_turns`` turns all active branches are scored; the ``top_k`` best expand into
    ``m`` children each (the parent is replaced by its children), branches with
    ``s < median(s) - alpha`` are pruned, the rest survive. A branch whose last ``theta``
    actions are identical is pruned at any turn. Pruned branches stay in the group as
    negatives when ``keep_pruned`` (reward = what they earned when stopped), else they are
    dropped from it. With ``use_scores=False`` (or no scorer) the scores are uniform random
    and nothing is pruned on score: the random-tree counterpart.
    """

    b0: int = 4
    """Initial branches from the task's initial state."""
    k_turns: int = 5
    """K: turns advanced between scoring rounds (5 on FrozenLake, 13 on SWE in the paper)."""
    top_k: int = 2
    """Branches expanded per scoring round."""
    m: int = 2
    """Children per expanded branch."""
    alpha: float = 0.5
    """Prune margin below the median score."""
    theta: int = 6
    """Prune a branch whose last theta actions are the same action (0 disables)."""
    keep_pruned: bool = True
    """Keep pruned branches in the group as negatives (else they are dropped)."""
    use_scores: bool = True
    """False: uniform random scores, no score pruning (the random-tree baseline)."""

    name: ClassVar[str] = "patr"
    revisits_nodes: ClassVar[bool] = False

    def __post_init__(self) -> None:
        if self.b0 < 1 or self.k_turns < 1 or self.top_k < 0 or self.m < 1:
            raise ValueError("patr needs b0 >= 1, k_turns >= 1, top_k >= 0, m >= 1")
        if self.alpha < 0:
            raise ValueError("patr.alpha must be >= 0")
        if self.theta < 0:
            raise ValueError(f"patr.theta must be >= 0 (0 disables it), got {self.theta}")

    def start(self, tree: RolloutTree, ctx: StrategyContext) -> list[Node]:
        """B0 branches from the root."""
        ctx.state = PATRState()
        return [tree.root] * self.b0

    def step(self, tree: RolloutTree, created: list[Node], ctx: StrategyContext) -> list[Node]:
        """Prune repeats; every K turns score, expand the top-k, prune the low tail."""
        active = []
        for node in active_branches(created):
            if repeated_action(node, self.theta):
                self._prune(node, f"same action {self.theta} times in a row")
            else:
                active.append(node)
        state = tree_state(ctx, PATRState)
        state.since_score += 1
        if state.since_score < self.k_turns or not active:
            return active
        state.since_score = 0
        scores = self._scores(tree, active, ctx)
        return self.select(active, scores, ctx.rng,
                           prune=self.use_scores and ctx.scorer is not None)

    def select(self, active: list[Node], scores: list[float], rng: np.random.Generator,
               *, prune: bool | None = None) -> list[Node]:
        """One scoring round over ``active`` with ``scores``: expand, survive or prune.

        ``prune`` (default ``use_scores``): whether low scores prune; off when the scores are
        random (scoring disabled or no scorer)."""
        use_prune = (self.use_scores if prune is None else prune) and len(active) > 1
        threshold = float(np.median(scores)) - self.alpha
        order = sorted(range(len(active)), key=lambda i: (-scores[i], i))
        survivors = [i for i in order if not (use_prune and scores[i] < threshold)]
        expand = set(survivors[: self.top_k])
        frontier: list[Node] = []
        for i, node in enumerate(active):
            if i in expand:
                node.note = f"expanded: top-{self.top_k} score {scores[i]:.3f}"
                frontier.extend([node] * self.m)
            elif i in survivors:
                node.note = f"kept: score {scores[i]:.3f}"
                frontier.append(node)
            else:
                self._prune(node, f"score {scores[i]:.3f} < median - alpha = {threshold:.3f}")
        return frontier

    def _scores(self, tree: RolloutTree, active: list[Node], ctx: StrategyContext) -> list[float]:
        if not self.use_scores or ctx.scorer is None:
            values = ctx.rng.random(len(active)).tolist()
            for node, value in zip(active, values, strict=True):
                node.score, node.score_reason = value, "random (scoring disabled)"
            return values
        scored = ctx.scorer(tree, active)
        for node, score in zip(active, scored, strict=True):
            node.score, node.score_reason = score.value, score.reason
        return [s.value for s in scored]

    def _prune(self, node: Node, why: str) -> None:
        node.status = NodeStatus.PRUNED if self.keep_pruned else NodeStatus.DROPPED
        node.note = "pruned: " + why
