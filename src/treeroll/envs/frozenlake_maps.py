"""What a FrozenLake task is: a convention's settings (:class:`FrozenLakeConfig`, rLLM's and
RAGEN's), the map a seed draws (:func:`generate_map`) and its geometry
(:func:`shortest_path_length`). The environment that plays a task is
:mod:`treeroll.envs.frozenlake`."""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

__all__ = ["ACTION_NAMES", "FROZEN", "GOAL", "HOLE", "MOVES", "Cell", "Convention",
           "FrozenLakeConfig", "generate_map", "neighbour", "shortest_path_length"]

Convention = Literal["rllm", "ragen"]
Cell = tuple[int, int]

ACTION_NAMES: tuple[str, ...] = ("Left", "Down", "Right", "Up")
"""Action names in Gymnasium's FrozenLake order (index 0..3)."""

MOVES: tuple[Cell, ...] = ((0, -1), (1, 0), (0, 1), (-1, 0))
"""The ``(row, col)`` step of each action index."""

FROZEN, HOLE, GOAL = "_", "O", "G"


@dataclass(frozen=True)
class FrozenLakeConfig:
    """Everything that defines a FrozenLake convention. Build one with :meth:`rllm` or
    :meth:`ragen` (keyword overrides allowed) rather than field by field."""

    convention: Convention = "rllm"
    """Text and parsing format: ``rllm`` (triple backticks) or ``ragen`` (think/answer tags)."""
    size_min: int = 2
    """Smallest map side; the side is drawn uniformly from ``size_min..size_max`` per seed."""
    size_max: int = 9
    """Largest map side (inclusive)."""
    frozen_prob_min: float = 0.6
    """Lower end of the per-seed probability that a tile is frozen (else a hole)."""
    frozen_prob_max: float = 0.85
    """Upper end of that probability (drawn uniformly between min and max per seed)."""
    slippery: bool = False
    """Gymnasium dynamics: the intended move w.p. 1/3, else one of the two perpendicular moves."""
    max_turns: int = 18
    """Hard cap on model turns per episode (a turn with an invalid reply counts)."""
    max_actions: int | None = None
    """Cap on executed moves per episode (``None``: no cap besides the turn limit)."""
    actions_per_turn: int = 1
    """Moves executed per turn at most; further valid actions in the same reply are ignored."""
    format_penalty: float = 0.0
    """Subtracted once from a turn's reward when its reply held an invalid or no valid action."""
    turn_limit_per_size: int | None = 2
    """If set, a map of side ``n`` allows ``min(max_turns, turn_limit_per_size * n)`` turns."""

    def __post_init__(self) -> None:
        if self.convention not in ("rllm", "ragen"):
            raise ValueError(f"convention must be 'rllm' or 'ragen', got {self.convention!r}")
        if not 2 <= self.size_min <= self.size_max <= 32:
            raise ValueError("size_min and size_max must satisfy 2 <= size_min <= size_max <= 32, "
                             f"got size_min={self.size_min}, size_max={self.size_max}")
        if not 0.0 < self.frozen_prob_min <= self.frozen_prob_max <= 1.0:
            raise ValueError("frozen_prob_min and frozen_prob_max must satisfy "
                             "0 < frozen_prob_min <= frozen_prob_max <= 1, got "
                             f"{self.frozen_prob_min} and {self.frozen_prob_max}")
        if self.max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {self.max_turns}")
        if self.max_actions is not None and self.max_actions < 1:
            raise ValueError(f"max_actions must be >= 1 or None, got {self.max_actions}")
        if self.actions_per_turn < 1:
            raise ValueError(f"actions_per_turn must be >= 1, got {self.actions_per_turn}")
        if self.format_penalty < 0:
            raise ValueError("format_penalty is the amount subtracted, so it must be >= 0, "
                             f"got {self.format_penalty}")
        if self.turn_limit_per_size is not None and self.turn_limit_per_size < 1:
            raise ValueError("turn_limit_per_size must be >= 1 or None, "
                             f"got {self.turn_limit_per_size}")
        if self.convention == "rllm" and self.actions_per_turn != 1:
            raise ValueError("the rllm convention executes one action per turn; "
                             f"set actions_per_turn=1, got {self.actions_per_turn}")

    @classmethod
    def rllm(cls, **overrides: Any) -> FrozenLakeConfig:
        """rLLM's convention (PATR's benchmark): size ~ U{2..9}, frozen p ~ U(0.6, 0.85), not
        slippery, ``2 * size`` turns, one action per turn in triple backticks, no penalty."""
        fields: dict[str, Any] = dict(
            convention="rllm", size_min=2, size_max=9, frozen_prob_min=0.6,
            frozen_prob_max=0.85, slippery=False, max_actions=None, actions_per_turn=1,
            format_penalty=0.0, turn_limit_per_size=2,
        )
        fields.update(overrides)
        if "max_turns" not in fields:
            per_size = fields["turn_limit_per_size"]
            fields["max_turns"] = per_size * fields["size_max"] if per_size else 18
        return cls(**fields)

    @classmethod
    def ragen(cls, **overrides: Any) -> FrozenLakeConfig:
        """RAGEN's convention: slippery 4x4 with p = 0.8, up to 5 actions per turn, 5 turns and
        10 actions in all, -0.1 for a turn with an invalid action."""
        fields: dict[str, Any] = dict(
            convention="ragen", size_min=4, size_max=4, frozen_prob_min=0.8,
            frozen_prob_max=0.8, slippery=True, max_turns=5, max_actions=10,
            actions_per_turn=5, format_penalty=0.1, turn_limit_per_size=None,
        )
        fields.update(overrides)
        return cls(**fields)

    def turn_limit(self, size: int) -> int:
        """Turns an episode on a map of side ``size`` may last."""
        if self.turn_limit_per_size is None:
            return self.max_turns
        return min(self.max_turns, self.turn_limit_per_size * size)


def neighbour(cell: Cell, action_index: int, size: int) -> Cell:
    """The cell one deterministic move away (moves into the edge leave the player in place)."""
    d_row, d_col = MOVES[action_index]
    return (min(max(cell[0] + d_row, 0), size - 1), min(max(cell[1] + d_col, 0), size - 1))


def shortest_path_length(grid: Sequence[str], source: Cell, target: Cell) -> int | None:
    """Fewest 4-neighbour moves from ``source`` to ``target`` avoiding holes (BFS); ``None`` if
    no such path exists or ``source`` is a hole. ``grid`` rows hold ``_``, ``O`` and ``G``."""
    size = len(grid)
    if grid[source[0]][source[1]] == HOLE:
        return None
    distance = {source: 0}
    queue = deque([source])
    while queue:
        cell = queue.popleft()
        if cell == target:
            return distance[cell]
        for d_row, d_col in MOVES:
            row, col = cell[0] + d_row, cell[1] + d_col
            if 0 <= row < size and 0 <= col < size and grid[row][col] != HOLE \
                    and (row, col) not in distance:
                distance[(row, col)] = distance[cell] + 1
                queue.append((row, col))
    return None


def generate_map(config: FrozenLakeConfig, rng: np.random.Generator
                  ) -> tuple[tuple[str, ...], Cell, Cell]:
    """Draw the side and frozen probability, then maps until a hole-free path joins start and
    goal (start and goal are forced frozen, as in RAGEN's and rLLM's generators)."""
    size = int(rng.integers(config.size_min, config.size_max + 1))
    frozen_prob = float(rng.uniform(config.frozen_prob_min, config.frozen_prob_max))
    while True:
        frozen = rng.random((size, size)) < frozen_prob  # [size, size]
        start_index, goal_index = rng.choice(size * size, size=2, replace=False)
        start = (int(start_index) // size, int(start_index) % size)
        goal = (int(goal_index) // size, int(goal_index) % size)
        rows = [[FROZEN if frozen[r, c] else HOLE for c in range(size)] for r in range(size)]
        rows[start[0]][start[1]] = FROZEN
        rows[goal[0]][goal[1]] = GOAL
        grid = tuple("".join(row) for row in rows)
        if shortest_path_length(grid, start, goal) is not None:
            return grid, start, goal
