"""Helpers shared by the built-in process scorers.

:func:`clamp` keeps a score in ``[0, 1]``; :func:`turn_flags` reads a path's per-turn repeats,
revisits and format errors (shared by the heuristics and the value features); :func:`parse_grid`
reads the FrozenLake map from an observation text.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from treeroll.strategies import action_key
from treeroll.tree import Node

__all__ = ["Grid", "TurnFlags", "clamp", "parse_grid", "turn_flags"]


def clamp(value: float) -> float:
    """``value`` as a float clipped to ``[0, 1]``."""
    return min(1.0, max(0.0, float(value)))


# --------------------------------------------------------------------------------------------
# Path statistics shared by the heuristics and the value features
# --------------------------------------------------------------------------------------------


def _state_key(node: Node) -> str | None:
    """A state identity for revisit counting: the reported position, if any."""
    position = node.info.get("position")
    return None if position is None else str(tuple(position))


@dataclass(frozen=True)
class TurnFlags:
    """Per-turn flags of a path (root excluded), in path order."""

    repeat: list[bool]
    """The turn's action equals the previous turn's."""
    revisit: list[bool] | None
    """The turn ended in a state already visited on the path (start included); None when the
    environment reports no state."""
    format_error: list[bool]

    @property
    def trailing_format_errors(self) -> int:
        """Length of the run of format errors that ends the path."""
        run = 0
        for error in reversed(self.format_error):
            if not error:
                break
            run += 1
        return run


def turn_flags(path: Sequence[Node], start_state: str | None = None) -> TurnFlags:
    """The :class:`TurnFlags` of ``path`` (root first); ``start_state`` counts as visited."""
    turns = path[1:]
    keys = [action_key(n) for n in turns]
    repeat = [i > 0 and keys[i] == keys[i - 1] for i in range(len(keys))]
    states = [_state_key(n) for n in turns]
    revisit: list[bool] | None = None
    if states and all(s is not None for s in states):
        seen: set[str | None] = {start_state} if start_state is not None else set()
        revisit = []
        for state in states:
            revisit.append(state in seen)
            seen.add(state)
    errors = [bool(n.info.get("format_error", False)) for n in turns]
    return TurnFlags(repeat, revisit, errors)


# --------------------------------------------------------------------------------------------
# FrozenLake maps read from observation texts
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Grid:
    """A FrozenLake map parsed from text: rows of cells, the start and the goal cell."""

    rows: tuple[str, ...]
    start: tuple[int, int]
    goal: tuple[int, int]


_CELLS = "_OGPX\u221a"
_RLLM_ROW = re.compile(rf"^[{_CELLS}](?: +[{_CELLS}])+$")
_RAGEN_ROW = re.compile(rf"^[{_CELLS}]{{2,}}$")


def parse_grid(text: str) -> Grid | None:
    """The FrozenLake map in an observation text (the last block of grid rows), or None."""
    block: list[str] = []
    last: list[str] = []
    for line in text.splitlines():
        line = line.strip()
        if _RLLM_ROW.match(line):
            block.append(line.replace(" ", ""))
        elif _RAGEN_ROW.match(line):
            block.append(line)
        else:
            if block:
                last = block
            block = []
    if block:
        last = block
    if not last or any(len(row) != len(last) for row in last):
        return None
    start = goal = None
    rows = []
    for r, row in enumerate(last):
        for c, cell in enumerate(row):
            if cell in "PX\u221a":
                start = (r, c)
            if cell in "G\u221a":
                goal = (r, c)
        rows.append("".join("_" if cell == "P" else "O" if cell == "X" else
                            "G" if cell == "\u221a" else cell for cell in row))
    if start is None or goal is None:
        return None
    return Grid(tuple(rows), start, goal)
