"""The FrozenLake progress scorer (``frozenlake_progress``).

:class:`FrozenLakeProgress` -- shortest-path distance to the goal relative to the start's, 0 in a
hole, 1 on the goal, lowered for format errors.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from treeroll.base import Score
from treeroll.envs.frozenlake import FrozenLakeEnv, distance_to_goal, start_distance
from treeroll.scorers.common import clamp
from treeroll.tree import Node, RolloutTree, path_to

__all__ = ["FrozenLakeProgress"]


@dataclass
class FrozenLakeProgress:
    """PATR's FrozenLake heuristic: how much closer to the goal than at the start.

    With ``d`` the shortest hole-free path from the player's cell to the goal and ``d0`` the
    start's, the base score is ``0.5 + 0.5 * (d0 - d) / d0`` clipped to ``[0, 1]``: 0.5 at the
    start (or anywhere as far as it), 1.0 on the goal, 0 at twice the start's distance or in a
    hole. Each format error on the path subtracts ``format_penalty``; if the goal is farther
    than the turns left, the score is multiplied by ``out_of_reach_factor``.
    """

    format_penalty: float = 0.1
    """Subtracted per format error (invalid reply) on the path."""
    out_of_reach_factor: float = 0.5
    """Multiplier when the goal needs more moves than the episode has turns left."""

    def __post_init__(self) -> None:
        if self.format_penalty < 0 or not 0 <= self.out_of_reach_factor <= 1:
            raise ValueError("frozenlake_progress needs format_penalty >= 0 and "
                             "0 <= out_of_reach_factor <= 1")

    def __call__(self, tree: RolloutTree, nodes: Sequence[Node]) -> list[Score]:
        """One score per node, from ``node.env`` (a :class:`FrozenLakeEnv`)."""
        return [self.score_node(node) for node in nodes]

    def score_node(self, node: Node) -> Score:
        """The score of one node (ended nodes without a snapshot: 1 on success, 0 otherwise)."""
        env = node.env
        if env is None:
            if node.info.get("success"):
                return Score(1.0, "reached the goal")
            if node.terminated:
                return Score(0.0, "fell into a hole")
            return Score(0.5, "no environment snapshot at this node")
        if not isinstance(env, FrozenLakeEnv):
            raise TypeError(f"frozenlake_progress scores FrozenLake states, got "
                            f"{type(env).__name__}; use degeneracy, value or judge instead")
        if env.success:
            return Score(1.0, "reached the goal")
        distance = distance_to_goal(env)
        if distance is None:
            return Score(0.0, "fell into a hole")
        initial = max(start_distance(env) or 1, 1)
        value = 0.5 + 0.5 * (initial - distance) / initial
        reason = f"distance {distance} (start {initial})"
        errors = sum(bool(n.info.get("format_error", False)) for n in path_to(node)[1:])
        if errors:
            value -= self.format_penalty * errors
            reason += f", {errors} format error{'s' if errors > 1 else ''}"
        turns_left = env.turn_limit - env.turn
        if distance > turns_left:
            value *= self.out_of_reach_factor
            reason += f", goal out of reach in {turns_left} turns"
        return Score(clamp(value), reason)
