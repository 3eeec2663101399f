"""``chain``: G independent trajectories from the root (the GRPO / RLOO baseline)."""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import ClassVar

from treeroll.base import Budget, StrategyContext, tree_state
from treeroll.strategies.common import active_branches
from treeroll.tree import Node, RolloutTree

__all__ = ["Chain", "ChainState"]


@dataclass
class ChainState:
    """Chains' state of one task's tree."""

    units: int = 0
    """Trajectories numbered so far (each is its own unit)."""


@dataclass
class Chain:
    """G independent trajectories per task (GRPO's group)."""

    group_size: int = 8
    """G: trajectories per task."""

    name: ClassVar[str] = "chain"
    revisits_nodes: ClassVar[bool] = False

    def __post_init__(self) -> None:
        if self.group_size < 1:
            raise ValueError("chain.group_size must be >= 1")

    def start(self, tree: RolloutTree, ctx: StrategyContext) -> list[Node]:
        """G copies of the root."""
        return [tree.root] * self.group_size

    def step(self, tree: RolloutTree, created: list[Node], ctx: StrategyContext) -> list[Node]:
        """Continue every branch that has not ended."""
        return active_branches(created)

    def units(self, tree: RolloutTree, frontier: Sequence[Node],
              ctx: StrategyContext) -> list[Hashable]:
        """Every trajectory is its own unit: it never waits for the others."""
        if ctx.unit is not None:
            return [ctx.unit] * len(frontier)
        state = tree_state(ctx, ChainState)
        first = state.units
        state.units = first + len(frontier)
        return list(range(first, first + len(frontier)))

    def extend(self, tree: RolloutTree, ctx: StrategyContext, grant: Budget) -> list[Node]:
        """More chains from the root: one per granted leaf (``group_size`` if the grant has
        no leaf count)."""
        return [tree.root] * (grant.leaves if grant.leaves is not None else self.group_size)
