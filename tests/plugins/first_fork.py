"""A strategy in one file: the worked example of ARCHITECTURE.md, installed by
tests/test_plugin_strategy.py through one entry-point line."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from treeroll.base import StrategyContext
from treeroll.strategies.common import active_branches
from treeroll.tree import Node, RolloutTree


@dataclass
class FirstFork:
    """One first turn, then ``width`` continuations of it, each run to its end: the group
    shares its first turn."""

    width: int = 4
    """Leaves per task (branches of the first turn)."""

    name: ClassVar[str] = "first_fork"
    revisits_nodes: ClassVar[bool] = False

    def start(self, tree: RolloutTree, ctx: StrategyContext) -> list[Node]:
        """The root, once."""
        return [tree.root]

    def step(self, tree: RolloutTree, created: list[Node], ctx: StrategyContext) -> list[Node]:
        """After the first turn, ``width`` children of it; later, every live branch."""
        live = active_branches(created)
        if created and all(node.parent is tree.root for node in created):
            return [node for node in live for _ in range(self.width)]
        return live
