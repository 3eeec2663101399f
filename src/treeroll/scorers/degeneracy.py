"""The degeneracy scorer (``degeneracy``), for any environment.

:class:`Degeneracy` -- penalises repeated actions, revisited states and a trailing run of format
errors; reads the path only, needs no environment snapshot.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from treeroll.base import Score
from treeroll.scorers.common import clamp, parse_grid, turn_flags
from treeroll.tree import Node, RolloutTree, path_to

__all__ = ["Degeneracy"]


@dataclass
class Degeneracy:
    """Penalises degenerate behaviour; needs no environment snapshot (reads the path only).

    Three rates in ``[0, 1]``: ``repeat`` (share of the last ``window`` turns repeating the
    previous action), ``revisit`` (share of the last ``window`` turns ending in a state seen
    before on the path, when ``info["position"]`` is reported) and ``format`` (the trailing run
    of format errors over ``max_format_run``, capped at 1). The score is one minus their
    weighted mean, so 1.0 means nothing degenerate and 0.0 every signal at its worst.
    """

    window: int = 6
    """Turns looked at for repeats and revisits (PATR's Theta is 6)."""
    max_format_run: int = 3
    """A trailing run of this many format errors gives the full format penalty."""
    repeat_weight: float = 1.0
    revisit_weight: float = 1.0
    format_weight: float = 1.0

    def __post_init__(self) -> None:
        weights = (self.repeat_weight, self.revisit_weight, self.format_weight)
        if self.window < 2 or self.max_format_run < 1:
            raise ValueError("degeneracy needs window >= 2 and max_format_run >= 1")
        if min(weights) < 0 or sum(weights) <= 0:
            raise ValueError("degeneracy weights must be >= 0 with a positive sum")

    def __call__(self, tree: RolloutTree, nodes: Sequence[Node]) -> list[Score]:
        """One score per node, from its path."""
        start = _root_start_state(tree)
        return [self.score_path(path_to(node), start) for node in nodes]

    def score_path(self, path: Sequence[Node], start_state: str | None = None) -> Score:
        """The score of the partial trajectory ``path`` (root first)."""
        if len(path) < 2:
            return Score(1.0, "no action yet")
        flags = turn_flags(path, start_state)
        recent = flags.repeat[-self.window:]
        repeat = sum(recent) / len(recent)
        revisit = 0.0
        if flags.revisit is not None:
            visits = flags.revisit[-self.window:]
            revisit = sum(visits) / len(visits)
        errors = flags.trailing_format_errors
        fmt = min(1.0, errors / self.max_format_run)
        total = self.repeat_weight + self.revisit_weight + self.format_weight
        bad = (self.repeat_weight * repeat + self.revisit_weight * revisit
               + self.format_weight * fmt) / total
        reason = f"repeats {repeat:.2f}, revisits {revisit:.2f}, format-error run {errors}"
        return Score(clamp(1.0 - bad), reason)


def _root_start_state(tree: RolloutTree) -> str | None:
    grid = parse_grid(tree.root.observation_text)
    return None if grid is None else str(grid.start)
