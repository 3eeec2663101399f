"""``tree_grpo``: Tree-GRPO (docs/methods.md): M chains, then L rounds in which N
non-leaf nodes of each of the M subtrees are picked uniformly (with replacement) and continued
to the end; optionally k random leaves kept per subtree (in ``finish``, so the budget ending a
rollout early does not skip it)."""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

from treeroll.base import Budget, StrategyContext, tree_state
from treeroll.strategies.common import active_branches, by_tree
from treeroll.tree import Node, NodeStatus, RolloutTree, subtree_index

__all__ = ["TreeGRPO", "TreeGRPOState"]


@dataclass
class TreeGRPOState:
    """Tree-GRPO's state of one task's tree."""

    round: int = 0
    """Expansion rounds done (of the whole task, in synchronous rounds)."""
    root_picks: list[int] = field(default_factory=list)
    """The tree (of the M) of each root entry of the last frontier, in order."""
    root_units: list[int] | None = None
    """The units of the next frontier's root entries, when they are not ``root_picks``
    (after ``extend``, or a unit's round that picked the root); read once."""
    unit_rounds: dict[int, int] = field(default_factory=dict)
    """Expansion rounds done per tree when the engine runs the M trees as units."""


@dataclass
class TreeGRPO:
    """Tree-GRPO's random branching: group size ``m * (l * n + 1)`` before ``k`` and budget.

    Every branch belongs to one of the ``m`` trees: a chain started by a root pick joins the
    tree it was picked for (``Node.tree_index``), in its intra-tree group and as a node to
    branch from in later rounds.
    """

    m: int = 2
    """M: independent chains (trees) per task."""
    n: int = 2
    """N: nodes picked per tree in each expansion round."""
    l: int = 1  # noqa: E741 -- the paper's name
    """L: expansion rounds."""
    k: int | None = None
    """Keep only k random leaves per tree (None keeps all), however the rollout ended."""
    include_root: bool = False
    """Let the root be picked too (the released code does; it amounts to a fresh chain)."""

    name: ClassVar[str] = "tree_grpo"
    revisits_nodes: ClassVar[bool] = True

    def __post_init__(self) -> None:
        if self.m < 1 or self.n < 0 or self.l < 0:
            raise ValueError("tree_grpo needs m >= 1, n >= 0, l >= 0")
        if self.k is not None and self.k < 1:
            raise ValueError("tree_grpo.k must be >= 1 or null")

    def start(self, tree: RolloutTree, ctx: StrategyContext) -> list[Node]:
        """M chains from the root (the i-th is tree i)."""
        ctx.state = TreeGRPOState(root_picks=list(range(self.m)))
        return [tree.root] * self.m

    def units(self, tree: RolloutTree, frontier: Sequence[Node],
              ctx: StrategyContext) -> list[Hashable]:
        """Each of the M trees is a unit: tree ``i`` is expanded as soon as its own branches
        have ended (the synchronous engine waits for all M, as the released code does)."""
        state = tree_state(ctx, TreeGRPOState)
        roots = iter(state.root_units if state.root_units is not None else state.root_picks)
        state.root_units = None
        return [next(roots) if node is tree.root else subtree_index(tree, node)
                for node in frontier]

    def keeps_snapshot(self, tree: RolloutTree, node: Node, ctx: StrategyContext) -> bool:
        """A node may be picked while its tree has expansion rounds left (rounds are counted
        per tree when the engine runs units, per task in synchronous rounds)."""
        state = tree_state(ctx, TreeGRPOState)
        index = subtree_index(tree, node)
        return state.unit_rounds.get(index, state.round) < self.l

    def extend(self, tree: RolloutTree, ctx: StrategyContext, grant: Budget) -> list[Node]:
        """More budget: new chains from the root, one per granted leaf (``m`` without a leaf
        count), dealt over the M trees in turn (each joins the tree it was dealt to, as a
        root pick does); the root keeps its snapshot, the nodes of finished trees do not."""
        count = grant.leaves if grant.leaves is not None else self.m
        state = tree_state(ctx, TreeGRPOState)
        state.root_picks = [i % self.m for i in range(count)]
        state.root_units = list(state.root_picks)
        return [tree.root] * count

    def step(self, tree: RolloutTree, created: list[Node], ctx: StrategyContext) -> list[Node]:
        """Continue active branches; when all have ended, run the next expansion round
        (of the whole task, or of one of its trees when ``ctx.unit`` names it)."""
        if ctx.unit is not None:
            return self._step_unit(tree, created, ctx, int(ctx.unit))  # type: ignore[call-overload]
        # New children of the root come from the root entries of the last frontier, in order;
        # the budget may have cut the last of them.
        state = tree_state(ctx, TreeGRPOState)
        fresh = [node for node in created if node.parent is tree.root]
        for node, index in zip(fresh, state.root_picks, strict=False):
            node.tree_index = index
        state.root_picks = []
        active = active_branches(created)
        if active:
            return active
        while state.round < self.l:
            state.round += 1
            picks = self._pick(tree, ctx)
            if picks:
                return picks
        return []

    def _step_unit(self, tree: RolloutTree, created: list[Node], ctx: StrategyContext,
                   index: int) -> list[Node]:
        """Tree ``index`` alone: its rounds are counted apart and its picks drawn from a
        generator of its own, so the picks do not depend on when the other trees end."""
        for node in created:
            if node.parent is tree.root:
                node.tree_index = index
        active = active_branches(created)
        if active:
            return active
        state = tree_state(ctx, TreeGRPOState)
        rounds = state.unit_rounds
        while rounds.get(index, 0) < self.l:
            rounds[index] = rounds.get(index, 0) + 1
            rng = np.random.default_rng([ctx.seed, index, rounds[index]])
            members = by_tree(tree).get(index, [])
            picks = self._pick_from(tree, members, rng, rounds[index])
            if picks:
                state.root_units = [index] * sum(node is tree.root for node in picks)
                return picks
        return []

    def finish(self, tree: RolloutTree, ctx: StrategyContext) -> None:
        """Keep ``k`` random leaves per tree (when set), whether the schedule or the budget
        ended the rollout."""
        if self.k is None:
            return
        for members in by_tree(tree).values():
            group = [n for n in members
                     if n.is_leaf and n.status not in NodeStatus.OUT_OF_GROUP]
            if len(group) <= self.k:
                continue
            keep = set(ctx.rng.choice(len(group), size=self.k, replace=False).tolist())
            for i, leaf in enumerate(group):
                if i not in keep:
                    leaf.status, leaf.note = NodeStatus.DROPPED, f"not among the k={self.k} kept"

    def _pick(self, tree: RolloutTree, ctx: StrategyContext) -> list[Node]:
        state = tree_state(ctx, TreeGRPOState)
        picks: list[Node] = []
        root_picks: list[int] = []
        for index, members in by_tree(tree).items():
            chosen = self._pick_from(tree, members, ctx.rng, state.round)
            picks.extend(chosen)
            root_picks.extend(index for node in chosen if node is tree.root)
        state.root_picks = root_picks
        return picks

    def _pick_from(self, tree: RolloutTree, members: list[Node], rng: np.random.Generator,
                   round_: int) -> list[Node]:
        """N nodes of one tree to expand, uniformly with replacement among its non-leaf
        nodes (and the root with ``include_root``)."""
        candidates = [n for n in members if n.children and not n.ended]
        if self.include_root:
            candidates.append(tree.root)
        picks = []
        for choice in rng.integers(len(candidates), size=self.n) if candidates else []:
            node = candidates[int(choice)]
            node.note = f"picked for expansion in round {round_}"
            picks.append(node)
        return picks
