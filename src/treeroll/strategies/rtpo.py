"""RTPO as treeroll reads it: sparse *reverse* trees (docs/methods.md).

Only RTPO's abstract is known: rollouts as sparse reverse trees, branching from the *late*
decision points of finished trajectories first, and turn-level updates in reverse temporal
order. treeroll builds the rollout half:

* ``initial`` chains run from the root to their end;
* then, round ``r = 1, 2, ...``, every chain of the first wave (in order) gets one new branch
  from its ``r``-th last decision point (the turn ``r`` steps above its leaf, i.e. the
  observation before its last ``r`` actions), continued to its end; rounds go on while the
  budget of ``m`` leaves lasts and some chain still has a decision point that far up;
* so the earliest branches sit next to the outcome, where the credit of a late mistake is
  clearest, and the tree fans out towards the root only as the budget allows.

The turn-level updates in reverse order are the trainer's ``optim.turn_order: reverse``
(:func:`treeroll.training.loss.by_turn_reversed`): each minibatch becomes one optimiser step
per turn depth, the last turns first, each on that depth's model tokens only. It is a separate
key because it composes with every strategy; RTPO as treeroll reads it is both
(``--strategy.name rtpo --optim.turn-order reverse``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from treeroll.base import StrategyContext, tree_state
from treeroll.checks import checked
from treeroll.strategies.common import continue_or_open
from treeroll.tree import Node, RolloutTree, leaves, path_to

__all__ = ["RTPO", "RTPOState"]


@dataclass
class RTPOState:
    """RTPO's state of one task's tree."""

    round: int = 0
    """Reverse rounds done."""
    first_wave: int = 0
    """Chains of the first wave (the ones later rounds branch from)."""


@dataclass
class RTPO:
    """Sparse reverse trees: chains first, then branches from their last decision points."""

    m: int = checked(8, ge=1)
    """Leaves per task in all."""
    initial: int | None = checked(None, ge=1)
    """Chains of the first wave (None: ``m // 2``, at least 1)."""

    name: ClassVar[str] = "rtpo"
    revisits_nodes: ClassVar[bool] = True

    def start(self, tree: RolloutTree, ctx: StrategyContext) -> list[Node]:
        """The first wave of chains."""
        first = min(self.m, self.initial if self.initial is not None else max(1, self.m // 2))
        ctx.state = RTPOState(first_wave=first)
        return [tree.root] * first

    def step(self, tree: RolloutTree, created: list[Node], ctx: StrategyContext) -> list[Node]:
        """Continue live branches; once all have ended, the next reverse round."""
        frontier, room = continue_or_open(tree, created, self.m)
        if frontier or room <= 0:
            return frontier
        state = tree_state(ctx, RTPOState)
        state.round += 1
        picks = self._round_picks(tree, state.round, state.first_wave)[:room]
        for node in picks:
            node.note = f"RTPO reverse round {state.round}"
        return picks

    def _round_picks(self, tree: RolloutTree, round_: int, first_wave: int) -> list[Node]:
        """The ``round_``-th last decision point of each first-wave chain that has one."""
        chains = tree.root.children[:first_wave]
        picks: list[Node] = []
        for chain in chains:
            leaf = chain
            while leaf.children:
                leaf = leaf.children[0]  # the chain's own line: each node's first child
            path = path_to(leaf)
            if round_ < len(path):
                picks.append(path[len(path) - 1 - round_])
        return picks

    def keeps_snapshot(self, tree: RolloutTree, node: Node, ctx: StrategyContext) -> bool:
        """Every node on a first-wave chain may be branched from while leaves are left."""
        return len(leaves(tree)) < self.m
